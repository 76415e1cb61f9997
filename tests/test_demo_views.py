"""The demo's third act (``barrierflow demo views``): a job joins a running materialized view
with a snapshot backfill and its copy replays to the view's history — also across a crash."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from _timeouts import scaled

from barrierflow.app._demo_views_graph import WITH_OPS, check_changes
from barrierflow.app.demo_views import ViewsDemoConfig, run_views_demo
from barrierflow.errors import ConfigError, InvalidArgumentError

pytestmark = pytest.mark.slow

SIZES = ["--batches", "15", "--rows", "60000", "--keys", "500"]


def demo(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "barrierflow", "demo", "views", "--workdir", str(workdir), *args],
        capture_output=True,
        text=True,
        timeout=scaled(180),
    )


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.subprocess
def test_the_views_act_killed_mid_backfill_and_resumed_replays_to_the_view(
    tmp_path: Path, backend: str
) -> None:
    crashed = demo(tmp_path, *SIZES, "--backend", backend, "--crash-after", "0")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    crash, resume = crashed.stdout.splitlines()[-2:]
    assert crash.startswith("CRASH 0 batches after the copy job became durable")
    assert resume.startswith("resume with: barrierflow demo views --resume")
    resumed = demo(tmp_path, "--resume", "--backend", backend)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    last = resumed.stdout.splitlines()[-1]
    assert last.startswith("VERIFIED keys=500 changes=")
    assert last.endswith(" broken=0 wrong=0")


@pytest.mark.subprocess
def test_the_views_act_verifies_in_one_run(tmp_path: Path) -> None:
    done = demo(tmp_path, *SIZES)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1].startswith("VERIFIED keys=500 changes=")


def test_the_check_finds_a_change_missing_or_twice() -> None:
    # key 1: insert 5, update 5 -> 9; key 2: insert 3.
    rows = [(1, 5, 0), (2, 3, 0), (1, 5, 2), (1, 9, 3)]
    table = pa.table({n: [r[i] for r in rows] for i, n in enumerate(WITH_OPS.names)}, WITH_OPS)
    expected = {1: 9, 2: 3}
    assert check_changes(table, expected).verified
    twice = pa.concat_tables([table, table.slice(2, 2)])
    assert check_changes(twice, expected).broken == 1  # retracts 5, which key 1 no longer has
    missing = pa.concat_tables([table.slice(0, 2), table.slice(3)])
    assert check_changes(missing, expected).broken == 1


def test_bad_sizes_and_a_resume_of_nothing_are_refused(tmp_path: Path) -> None:
    for field, value in (("batches", 0), ("rows", -1), ("keys", 10**9), ("crash_after", -2)):
        with pytest.raises(InvalidArgumentError) as bad:
            ViewsDemoConfig(tmp_path, **{field: value})  # type: ignore[arg-type]
        assert bad.value.argument == field
    with pytest.raises(ConfigError) as uneven:
        run_views_demo(ViewsDemoConfig(tmp_path / "x", batches=7, rows=100))
    assert uneven.value.argument == "rows"
    with pytest.raises(ConfigError) as nothing:
        run_views_demo(ViewsDemoConfig(tmp_path / "none", resume=True))
    assert nothing.value.argument == "resume"
