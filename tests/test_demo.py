"""The demo: Spark Structured Streaming → bridge → 4 writers → Iceberg, verified; a driver
SIGKILLed mid-batch, between the checkpoint and Spark's commit, or mid-commit, then resumed,
still holds every row exactly once. Run as subprocesses (the demo kills its own process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from barrierflow.cli import main
from barrierflow.demo import DemoConfig
from barrierflow.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def demo(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "barrierflow",
            "demo",
            "--workdir",
            str(workdir),
            "--no-progress",
            *list(args),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
    )


@pytest.mark.spark
def test_the_demo_ends_with_a_verified_line(tmp_path: Path) -> None:
    done = demo(tmp_path / "d", "--rows", "30000", "--batches", "3")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert lines[-1] == "VERIFIED rows_in=30000 rows_out=30000 duplicates=0 epochs=3"


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize(
    ("point", "backend"),
    [("mid-batch", "asyncio"), ("after-checkpoint", "trio"), ("mid-commit", "asyncio")],
)
def test_a_driver_killed_then_resumed_still_holds_every_row_once(
    tmp_path: Path, point: str, backend: str
) -> None:
    workdir = tmp_path / "d"
    common = ["--rows", "20000", "--batches", "4", "--backend", backend]
    crashed = demo(workdir, *common, "--crash-after", "1", "--crash-point", point)
    assert crashed.returncode == -9, crashed.stdout[-2000:] + crashed.stderr[-3000:]
    assert "CRASH" in crashed.stdout
    assert "VERIFIED" not in crashed.stdout
    resumed = demo(workdir, "--resume", "--backend", backend)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    last = resumed.stdout.strip().splitlines()[-1]
    # One epoch per Spark micro-batch; on restart Spark may plan the remaining files into
    # fewer micro-batches than files, so count the batches Spark committed.
    batches = len(
        [p for p in (workdir / "spark-checkpoint" / "commits").iterdir() if p.name.isdigit()]
    )
    assert batches in (3, 4)
    assert last == f"VERIFIED rows_in=20000 rows_out=20000 duplicates=0 epochs={batches}"


def test_demo_config_refuses_bad_values(tmp_path: Path) -> None:
    for kwargs, name in (
        ({"rows": 0}, "rows"),
        ({"batches": 0}, "batches"),
        ({"rows": 3, "batches": 5}, "rows"),
        ({"crash_after": -1}, "crash_after"),
        ({"crash_point": "nowhere"}, "crash_point"),
        ({"backend": "curio"}, "backend"),
    ):
        with pytest.raises(ConfigError) as info:
            DemoConfig(workdir=tmp_path, **kwargs)  # type: ignore[arg-type]
        assert info.value.argument == name


def test_resume_without_a_previous_run_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="a previous run's state"):
        main(["demo", "--workdir", str(tmp_path / "none"), "--resume", "--no-progress"])


def test_a_malformed_spark_conf_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--conf", "novalue"]) == 2
    assert "key=value" in capsys.readouterr().err


@pytest.mark.spark
def test_a_failed_run_ends_with_a_failed_line_and_a_nonzero_exit(
    spark: object,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from barrierflow import demo as demo_module

    def fail_after_first(self: object) -> None:
        raise RuntimeError("injected: the driver's callback failed")

    monkeypatch.setattr(demo_module._Faults, "end_batch", fail_after_first)
    args = ["demo", "--workdir", str(tmp_path / "d"), "--rows", "3000", "--batches", "3"]
    assert main([*args, "--no-progress"]) == 1
    captured = capsys.readouterr()
    assert "the streaming query failed" in captured.err
    last = captured.out.strip().splitlines()[-1]
    # The first batch was delivered and committed before the callback failed.
    assert last == "FAILED rows_in=3000 rows_out=1000 duplicates=0 epochs=1"
