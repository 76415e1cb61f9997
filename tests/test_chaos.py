"""The crash harness: runs are killed as whole process groups at the traced event planned, a
child that escaped its group is reported, the harness resumes and audits, its plan follows the
seed, and ``barrierflow chaos`` exits non-zero on any finding — plus the short harness on the
real acts (Spark, Valkey), as CI runs it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pyarrow as pa
import pytest
from _timeouts import scaled

from barrierflow import InvalidArgumentError
from barrierflow._trace import TracedConnector, follow_job
from barrierflow.chaos import ChaosConfig, harness
from barrierflow.chaos.acts import ACTS, Act, Target
from barrierflow.chaos.audit import Audit
from barrierflow.chaos.harness import _plan, _rng
from barrierflow.chaos.process import KillAt, RunOutcome, run_until
from barrierflow.cli import main
from barrierflow.runtime.progress import JobProgress, Progress
from barrierflow.testing import ListSink

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import signal, subprocess, sys
from barrierflow._trace import trace
mode = sys.argv[1]
if mode != "exit":
    # A helper process, as the Spark JVM is to the driver ("escape": it leaves the group).
    subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"],
                     start_new_session=mode == "escape")
for i in range(3 if mode == "exit" else 10):
    trace("tick", i)
if mode != "exit":
    signal.pause()  # until the harness kills the group
"""


def child(tmp_path: Path, mode: str) -> list[str]:
    return [sys.executable, "-c", CHILD, mode]


def test_a_run_is_killed_whole_group_after_the_planned_event(tmp_path: Path) -> None:
    outcome = run_until(
        child(tmp_path, "group"),
        trace=tmp_path / "t",
        log=tmp_path / "log",
        kill=KillAt("tick", occurrence=5),
        timeout=scaled(60),
    )
    assert outcome.killed
    assert not outcome.timed_out
    assert outcome.returncode == -signal.SIGKILL
    assert outcome.members == 2
    assert outcome.survivors == ()
    assert outcome.where.startswith("tick ")
    assert int(outcome.where.split()[1]) >= 4


def test_a_helper_that_left_the_group_is_reported_as_a_survivor(tmp_path: Path) -> None:
    outcome = run_until(
        child(tmp_path, "escape"),
        trace=tmp_path / "t",
        log=tmp_path / "log",
        kill=KillAt("tick", occurrence=3),
        timeout=scaled(60),
    )
    try:
        assert outcome.killed
        assert len(outcome.survivors) == 1
    finally:
        for pid in outcome.survivors:
            os.kill(pid, signal.SIGKILL)


def test_a_run_that_ends_first_is_not_killed_and_a_hung_one_times_out(tmp_path: Path) -> None:
    ended = run_until(
        child(tmp_path, "exit"), trace=tmp_path / "t", log=tmp_path / "log",
        kill=KillAt("tick", occurrence=50), timeout=scaled(60),
    )  # fmt: skip
    assert not ended.killed
    assert ended.returncode == 0
    assert ended.where == "tick 2"
    hung = run_until(
        child(tmp_path, "group"), trace=tmp_path / "t", log=tmp_path / "log",
        kill=KillAt("never"), timeout=1.0,
    )  # fmt: skip
    assert hung.killed
    assert hung.timed_out


def test_the_plan_follows_the_seed() -> None:
    act = ACTS["views"]
    plans = [_plan(act, _rng(7, r, 0)) for r in range(20)]
    assert plans == [_plan(act, _rng(7, r, 0)) for r in range(20)]
    assert len({kill.event for kill, _ in plans}) > 3  # spread over the act's targets
    # The runs of one round (resumes after a kill) draw their own targets too.
    assert len({_plan(act, _rng(7, 0, run)) for run in range(6)}) > 3


def test_bad_configs_are_refused(tmp_path: Path) -> None:
    for kwargs in ({"kills": 0}, {"seed": "x"}, {"acts": ("nope",)}, {"max_kills_per_round": 0}):
        with pytest.raises(InvalidArgumentError):
            ChaosConfig(tmp_path, **kwargs)  # type: ignore[arg-type]
    assert main(["chaos", "--kills", "0", "--workdir", str(tmp_path)]) == 2


def fake_run(command: list[str], *, kill: KillAt | None, **_: object) -> RunOutcome:
    """``run_until`` for a fake act of five steps (``done.txt`` counts them): killed
    ``kill.occurrence`` steps into the run, else run to the end — no process, no clock."""
    workdir = Path(command[-1])
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "fake.json").write_text("{}")
    done = workdir / "done.txt"
    steps = int(done.read_text()) if done.exists() else 0
    if kill is not None and steps + kill.occurrence <= 5:
        done.write_text(str(steps + kill.occurrence - 1))  # killed mid-step
        return RunOutcome(True, -signal.SIGKILL, 0.1, f"step {steps + kill.occurrence - 1}", 1)
    done.write_text("5")
    return RunOutcome(False, 0, 0.1, "verify", 1)


def fake_act(findings: bool) -> Act:
    def audit(workdir: Path, *, complete: bool) -> Audit:
        result = Audit(complete)
        steps = int((workdir / "done.txt").read_text()) if (workdir / "done.txt").exists() else 0
        result.rows_in, result.rows_out = 5, steps
        if complete and (steps != 5 or findings):
            result.add("fake", f"{steps} steps")
        return result

    return Act("fake", (), "fake.json", (Target("step", "mid-step", 3, 0.01),), audit, 60.0)


@pytest.mark.parametrize("findings", [False, True])
def test_the_harness_kills_resumes_audits_and_exits_by_its_findings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, findings: bool
) -> None:
    monkeypatch.setitem(ACTS, "fake", fake_act(findings))
    resumes: list[bool] = []

    def command(self: Act, python: str, workdir: Path, backend: str, resume: bool) -> list[str]:
        resumes.append(resume)
        return [python, str(workdir)]

    monkeypatch.setattr(Act, "command", command)
    monkeypatch.setattr(harness, "run_until", fake_run)
    argv = ["chaos", "--acts", "fake", "--kills", "3", "--seed", "5", "--workdir", str(tmp_path)]
    assert main(argv) == (1 if findings else 0)
    report = json.loads((tmp_path / "chaos-report.json").read_text())
    assert report["totals"]["kills"] == 3
    assert all(k["landed"].startswith("step") for k in report["kills"])
    assert [r["exit"] for r in report["rounds"]] == [0] * len(report["rounds"])
    assert resumes[0] is False
    assert True in resumes
    assert report["totals"]["findings"] == (len(report["rounds"]) if findings else 0)


@pytest.mark.spark
@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_short_harness_on_the_real_acts_finds_nothing(tmp_path: Path) -> None:
    """``barrierflow chaos --kills 3``, one kill in each act (Spark, backfill, views)."""
    command = [sys.executable, "-m", "barrierflow", "chaos", "--kills", "3", "--seed", "16"]
    command += ["--max-kills-per-round", "1", "--workdir", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=scaled(800), cwd=ROOT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "chaos-report.json").read_text())
    totals = report["totals"]
    assert totals["kills"] == 3
    assert totals["rounds"] >= 3
    assert (totals["lost"], totals["duplicated"], totals["foreign"], totals["findings"]) == (
        0, 0, 0, 0
    )  # fmt: skip
    assert {r["act"] for r in report["rounds"]} == {"spark", "backfill", "views"}
    spark_kill = next(k for k in report["kills"] if k["act"] == "spark")
    assert spark_kill["processes"] >= 2  # the driver and the Spark JVM went down together


@pytest.fixture
def traced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """This process traces into a file (as a demo run by the harness does)."""
    from barrierflow import _trace

    path = tmp_path / "trace"
    monkeypatch.setattr(_trace, "_path", str(path))
    monkeypatch.setattr(_trace, "_fd", None)
    yield path
    if _trace._fd is not None:
        os.close(_trace._fd)


def events(path: Path) -> list[str]:
    return [" ".join(line.split()[1:]) for line in path.read_text().splitlines()]


class _Job:
    """A job handle whose backfill moves through phases as the test says."""

    def __init__(self) -> None:
        self.phases: list[dict[str, str]] = []

    def progress(self) -> JobProgress:
        detail = self.phases.pop(0) if len(self.phases) > 1 else self.phases[0]
        done = set(detail.values()) == {"finished"}
        return JobProgress("j", 1, {"backfill": Progress(done, 0, detail)}, done)


@pytest.mark.anyio
async def test_a_job_s_phases_are_traced_as_they_change_then_ready(traced: Path) -> None:
    job = _Job()
    job.phases = [
        {"a": "backfilling", "b": "backfilling"},
        {"a": "backfilling", "b": "backfilling"},
        {"a": "caching_up", "b": "backfilling"},
        {"a": "finished", "b": "finished"},
    ]
    with anyio.fail_after(scaled(10)):
        await follow_job(job, every=0)
    assert events(traced) == [
        "backfill-phase backfilling",
        "backfill-phase backfilling+caching_up",
        "backfill-phase finished",
        "job-ready",
    ]


@pytest.mark.anyio
async def test_a_traced_connector_traces_its_two_phases_and_stays_the_connector(
    traced: Path,
) -> None:
    inner = ListSink(pa.schema([("id", pa.int64())]))
    sink = TracedConnector(inner)
    await sink.open()
    await sink.recover([])
    await sink.begin_epoch(7)
    await sink.write_batch(pa.record_batch({"id": [1]}, schema=inner.schema))
    await sink.pre_commit(7)
    await sink.commit_epoch(7)
    assert events(traced) == ["pre-commit 7", "commit-begin 7", "commit-done 7"]
    assert inner.rows().column("id").to_pylist() == [1]


def traced_events(act: str, tmp_path: Path, *args: str) -> set[str]:
    """The event names a run of ``act`` traced, run as the harness runs it."""
    trace = tmp_path / "trace"
    command = [sys.executable, "-m", "barrierflow", "demo", act, "--workdir", str(tmp_path / "w")]
    env = {**os.environ, "BARRIERFLOW_CHAOS_TRACE": str(trace)}
    done = subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=scaled(180), env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {line.split()[1] for line in trace.read_text().splitlines()}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_views_act_traces_every_event_its_targets_name(tmp_path: Path, backend: str) -> None:
    seen = traced_events("views", tmp_path, *ACTS["views"].sizes, "--backend", backend)
    assert {t.event for t in ACTS["views"].targets} <= seen


@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_backfill_act_traces_every_event_its_targets_name(tmp_path: Path, backend: str) -> None:
    seen = traced_events("backfill", tmp_path, *ACTS["backfill"].sizes, "--backend", backend)
    assert {t.event for t in ACTS["backfill"].targets} <= seen
