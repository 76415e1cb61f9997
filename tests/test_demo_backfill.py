"""The demo's second act (``barrierflow demo backfill``): a job joins a live Redis-streams
pipeline mid-run and ends with every record of every stream exactly once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from _timeouts import scaled

from barrierflow import InvalidArgumentError
from barrierflow.demo_backfill import BackfillDemoConfig

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_backfill_act_verifies_every_record_exactly_once(tmp_path: Path, backend: str) -> None:
    done = subprocess.run(
        [
            sys.executable, "-m", "barrierflow", "demo", "backfill", "--streams", "3",
            "--history", "3000", "--live", "2000", "--workdir", str(tmp_path / "demo"),
            "--backend", backend,
        ],
        capture_output=True,
        text=True,
        timeout=scaled(180),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.splitlines()[-1]
    assert last == "VERIFIED streams=3 records=15000 rows=15000 duplicates=0 missing=0"


def test_the_backfill_act_refuses_bad_sizes(tmp_path: Path) -> None:
    for field, value in (("streams", 0), ("history", -1), ("live", 10**9)):
        with pytest.raises(InvalidArgumentError) as bad:
            BackfillDemoConfig(tmp_path, **{field: value})  # type: ignore[arg-type]
        assert bad.value.argument == field
    done = subprocess.run(
        [sys.executable, "-m", "barrierflow", "demo", "backfill", "--streams", "0"],
        capture_output=True,
        text=True,
        timeout=scaled(60),
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert "streams" in done.stderr
