"""The demo pipeline verifies itself; the CLI reports it on its last line."""

from __future__ import annotations

import pytest

from barrierflow import ConfigError
from barrierflow.cli import main
from barrierflow.demo import run_demo


@pytest.mark.anyio
async def test_demo_pipeline_delivers_every_row_and_barrier_once() -> None:
    result = await run_demo(rows=50_000, chunk_rows=1_000, chunks_per_epoch=5)
    assert result.verified
    assert result.rows_out == 50_000
    assert result.duplicates == 0
    assert result.barriers_out == result.epochs == 11
    assert result.summary_line() == "VERIFIED rows_in=50000 rows_out=50000 duplicates=0 epochs=11"


@pytest.mark.anyio
async def test_demo_rejects_bad_sizes() -> None:
    with pytest.raises(ConfigError) as info:
        await run_demo(rows=0)
    assert info.value.argument == "rows"


def test_cli_demo_ends_with_verified_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--rows", "20000", "--chunk-rows", "500"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == "VERIFIED rows_in=20000 rows_out=20000 duplicates=0 epochs=3"
    assert any("[asyncio]" in line for line in lines)
    assert any("[trio" in line for line in lines)
