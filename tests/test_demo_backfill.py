"""The demo's second act (``barrierflow demo backfill``): a job joins a live Redis-streams
pipeline mid-run and ends with every record of every stream exactly once."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _timeouts import scaled

from barrierflow.app.demo_backfill import MANIFEST, BackfillDemoConfig, run_backfill_demo
from barrierflow.errors import ConfigError, InvalidArgumentError
from barrierflow.testing.redis_server import kill_left_behind

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
    assert last == (
        "VERIFIED streams=3 records=15000 live=15000 history=15000 duplicates=0 missing=0"
    )


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_streams_created_after_the_pipeline_started_reach_both_tables(
    tmp_path: Path, backend: str
) -> None:
    # No history: the producer creates every stream after the live source listed the log, and
    # maybe after the history job listed it too; both tables still hold every record once.
    done = _demo(
        tmp_path / "demo", "--streams", "4", "--history", "0", "--live", "20000",
        "--backend", backend,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[-1] == (
        "VERIFIED streams=4 records=80000 live=80000 history=80000 duplicates=0 missing=0"
    )
    # The check reads each table the act writes, not one of them.
    assert any(line.startswith("80,000 rows in the live job's table") for line in lines)
    assert any(line.startswith("80,000 rows in the history job's table") for line in lines)


def test_the_backfill_act_refuses_bad_sizes(tmp_path: Path) -> None:
    for field, value in (("streams", 0), ("history", -1), ("live", 10**9), ("crash_after", -1)):
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


def _demo(workdir: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "barrierflow", "demo", "backfill", "--workdir", str(workdir), *args],
        capture_output=True,
        text=True,
        timeout=scaled(timeout),
    )


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_backfill_act_killed_and_resumed_verifies_every_record_exactly_once(
    tmp_path: Path, backend: str
) -> None:
    workdir = tmp_path / "demo"
    sizes = ["--streams", "3", "--history", "3000", "--live", "4000", "--backend", backend]
    try:
        crashed = _demo(workdir, *sizes, "--crash-after", "1")
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
        crash, resume = crashed.stdout.splitlines()[-2:]
        assert crash.startswith("CRASH 1 producer rounds after the history job became durable")
        assert resume.startswith("resume with: barrierflow demo backfill --resume")
        # The server the run started outlived it (a log outlives its readers), with the
        # records appended so far on disk; the resume restarts it from them.
        left = json.loads((workdir / MANIFEST).read_text())["server_pid"]
        assert Path(f"/proc/{left}").exists()
        resumed = _demo(workdir, "--resume", "--backend", backend)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        last = resumed.stdout.splitlines()[-1]
        assert last == (
            "VERIFIED streams=3 records=21000 live=21000 history=21000 duplicates=0 missing=0"
        )
        assert not _alive(left)
    finally:
        if (workdir / MANIFEST).exists():
            pid = json.loads((workdir / MANIFEST).read_text())["server_pid"]
            kill_left_behind(pid, workdir / "valkey")


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_run_without_history_killed_and_resumed_has_every_record_in_both_tables(
    tmp_path: Path, backend: str
) -> None:
    # Issue 24's audit killed runs with no history at random moments; here the kill is at once
    # after the history job became durable (a stream created after a listing, around a kill,
    # is tested deterministically in test_split_discovery.py). Both tables are checked.
    workdir = tmp_path / "demo"
    sizes = ["--streams", "4", "--history", "0", "--live", "3000", "--backend", backend]
    try:
        crashed = _demo(workdir, *sizes, "--crash-after", "0")
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
        resumed = _demo(workdir, "--resume", "--backend", backend)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert resumed.stdout.splitlines()[-1] == (
            "VERIFIED streams=4 records=12000 live=12000 history=12000 duplicates=0 missing=0"
        )
    finally:
        if (workdir / MANIFEST).exists():
            pid = json.loads((workdir / MANIFEST).read_text())["server_pid"]
            kill_left_behind(pid, workdir / "valkey")


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def test_a_backfill_resume_refuses_other_sizes_and_a_run_never_started(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as nothing:
        run_backfill_demo(BackfillDemoConfig(tmp_path / "none", resume=True))
    assert nothing.value.argument == "resume"
    workdir = tmp_path / "demo"
    workdir.mkdir()
    (workdir / MANIFEST).write_text(
        json.dumps({"streams": 2, "history": 5, "live": 5, "redis_url": None, "server_pid": None})
    )
    with pytest.raises(ConfigError) as other:
        run_backfill_demo(BackfillDemoConfig(workdir, history=6, resume=True))
    assert (other.value.argument, other.value.got) == ("history", 6)
    refused = _demo(workdir, "--resume", "--streams", "3", timeout=60)
    assert refused.returncode == 2
    assert "streams" in refused.stderr
