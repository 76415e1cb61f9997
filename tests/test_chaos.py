"""The crash harness: runs are killed as whole process groups at the traced event planned (or
at a moment after their start), a child that escaped its group is reported, the harness
resumes and audits, its plan follows the seed — a share of the kills at uniform random moments
of an act's calibrated duration — and ``barrierflow chaos`` exits non-zero on any finding —
plus the short harness on the real acts (Spark, Valkey), as CI runs it."""

from __future__ import annotations

import functools
import itertools
import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pyarrow as pa
import pytest
from _timeouts import scaled

from barrierflow.app._trace import TracedTable, follow_job
from barrierflow.app.chaos import harness
from barrierflow.app.chaos.acts import ACTS, Act, Target
from barrierflow.app.chaos.audit import Audit
from barrierflow.app.chaos.harness import RANDOM_WHERE, ChaosConfig, _plan
from barrierflow.app.chaos.process import KillAfter, KillAt, RunOutcome, run_until
from barrierflow.app.cli import main
from barrierflow.errors import InvalidArgumentError
from barrierflow.runtime.progress import JobProgress, Progress
from barrierflow.testing import ListTable

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import signal, subprocess, sys
from barrierflow.app._trace import trace
mode = sys.argv[1]
if mode == "orphan":
    # As PySpark's daemon: it leaves the group and exits on its own once the process that
    # holds its stdin (the JVM; here the driver) is gone.
    subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                     stdin=subprocess.PIPE, start_new_session=True)
elif mode != "exit":
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


@pytest.mark.subprocess
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


@pytest.mark.subprocess
def test_a_run_is_killed_whole_group_at_the_planned_moment_after_its_start(
    tmp_path: Path,
) -> None:
    outcome = run_until(
        child(tmp_path, "group"),
        trace=tmp_path / "t",
        log=tmp_path / "log",
        kill=KillAfter(0.5),
        timeout=scaled(60),
    )
    assert outcome.killed
    assert not outcome.timed_out
    assert outcome.returncode == -signal.SIGKILL
    assert outcome.survivors == ()
    assert 0.5 <= outcome.seconds < scaled(30)


@pytest.mark.subprocess
def test_a_helper_that_left_the_group_and_stays_is_reported_as_a_survivor_and_killed(
    tmp_path: Path,
) -> None:
    outcome = run_until(
        child(tmp_path, "escape"),
        trace=tmp_path / "t",
        log=tmp_path / "log",
        kill=KillAt("tick", occurrence=3),
        timeout=scaled(60),
        orphan_grace=0.2,  # it never exits: any grace reports it
    )
    assert outcome.killed
    assert len(outcome.survivors) == 1
    assert outcome.orphans == 0
    # Killed once reported: nothing it does reaches the run that resumes after it.
    (pid,) = outcome.survivors
    assert gone_within(pid, scaled(10))


def gone_within(pid: int, seconds: float) -> bool:
    """Whether process ``pid`` has exited, or does within ``seconds`` (its pidfd turns
    readable when it exits)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], seconds)[0])
    finally:
        os.close(fd)


@pytest.mark.subprocess
def test_a_helper_that_left_the_group_and_exits_on_its_own_is_no_survivor(
    tmp_path: Path,
) -> None:
    # PySpark's daemon and workers put themselves in their own group and exit once their JVM
    # is gone: a real crash kills the same processes as the harness does. The grace is the
    # default one (10 s, scaled): the orphan exits at once when the driver's pipe closes.
    outcome = run_until(
        child(tmp_path, "orphan"),
        trace=tmp_path / "t",
        log=tmp_path / "log",
        kill=KillAt("tick", occurrence=3),
        timeout=scaled(60),
    )
    assert outcome.killed
    assert outcome.survivors == ()
    assert outcome.orphans == 1


@pytest.mark.subprocess
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
    plans = [_plan(act, 0.0, 7, r, 0) for r in range(20)]
    assert plans == [_plan(act, 0.0, 7, r, 0) for r in range(20)]
    assert all(plan.traced is not None for plan in plans)
    assert len({plan.traced.event for plan in plans if plan.traced}) > 3  # over the targets
    # The runs of one round (resumes after a kill) draw their own targets too.
    assert len({_plan(act, 0.0, 7, 0, run) for run in range(6)}) > 3


def test_random_kills_are_the_configured_share_drawn_uniformly_over_the_expected_duration() -> None:
    act, share, expected, draws = ACTS["backfill"], 0.3, 12.0, 4000
    plans = [_plan(act, share, 11, r, run) for r in range(draws // 4) for run in range(4)]
    assert plans == [_plan(act, share, 11, r, run) for r in range(draws // 4) for run in range(4)]
    random_plans = [p for p in plans if p.traced is None]
    assert {p.mode for p in random_plans} == {"random"}
    assert {p.where for p in random_plans} == {RANDOM_WHERE}
    assert abs(len(random_plans) / draws - share) < 0.03
    moments = sorted(p.kill(expected).seconds for p in random_plans)  # type: ignore[union-attr]
    assert moments[0] >= 0.0
    assert moments[-1] < expected
    # Uniform over the whole run: the empirical distribution stays within the Kolmogorov-
    # Smirnov bound (1 %) of the uniform one on [0, expected).
    n = len(moments)
    gap = max(max((i + 1) / n - m / expected, m / expected - i / n) for i, m in enumerate(moments))
    assert gap < 1.63 / n**0.5
    # The traced plans are those of a session without random kills: a share changes which
    # kills are random, never where the others are aimed.
    runs = [(r, run) for r in range(draws // 4) for run in range(4)]
    for (r, run), plan in zip(runs, plans, strict=True):
        if plan.traced is not None:
            assert plan == _plan(act, 0.0, 11, r, run)
    assert {p.mode for p in (_plan(act, 1.0, 11, r, 0) for r in range(50))} == {"random"}


def test_bad_configs_are_refused(tmp_path: Path) -> None:
    for kwargs in (
        {"kills": 0},
        {"seed": "x"},
        {"acts": ("nope",)},
        {"max_kills_per_round": 0},
        {"random_share": 1.5},
        {"random_share": -0.1},
        {"random_share": float("nan")},
        {"random_share": "0.3"},
    ):
        with pytest.raises(InvalidArgumentError):
            ChaosConfig(tmp_path, **kwargs)  # type: ignore[arg-type]
    assert main(["chaos", "--kills", "0", "--workdir", str(tmp_path)]) == 2
    assert main(["chaos", "--random-share", "2", "--workdir", str(tmp_path)]) == 2


Kills = list[tuple[str, KillAt | KillAfter | None]]


def fake_run(
    command: list[str], *, kill: KillAt | KillAfter | None, seen: Kills | None = None, **_: object
) -> RunOutcome:
    """``run_until`` for a fake act of five steps of a second each (``done.txt`` counts them):
    killed ``kill.occurrence`` steps into the run, or in the step ``kill.seconds`` falls in,
    else run to the end — no process, no clock. Each run's directory and kill go to ``seen``."""
    if seen is not None:
        seen.append((command[-1], kill))
    workdir = Path(command[-1])
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "fake.json").write_text("{}")
    done = workdir / "done.txt"
    steps = int(done.read_text()) if done.exists() else 0
    into = kill.occurrence if isinstance(kill, KillAt) else int(kill.seconds) + 1 if kill else 0
    if kill is not None and steps + into <= 5:
        done.write_text(str(steps + into - 1))  # killed mid-step
        return RunOutcome(True, -signal.SIGKILL, into - 0.5, f"step {steps + into - 1}", 1)
    done.write_text("5")
    return RunOutcome(False, 0, 5.0 - steps, "verify", 1)


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
    assert main([*argv, "--random-share", "0"]) == (1 if findings else 0)
    report = json.loads((tmp_path / "chaos-report.json").read_text())
    assert report["totals"]["kills"] == report["totals"]["traced"] == 3
    assert all(k["landed"].startswith("step") for k in report["kills"])
    assert [r["exit"] for r in report["rounds"]] == [0] * len(report["rounds"])
    assert resumes[0] is False
    assert True in resumes
    assert report["totals"]["findings"] == (len(report["rounds"]) if findings else 0)
    assert report["calibrations"] == []  # no random kill, no calibration run


def test_an_act_with_tables_writes_them_in_turn_and_the_report_names_each_round_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = fake_act(False)
    audited: list[tuple[str, str]] = []

    def audit(workdir: Path, *, complete: bool, table: str = "none") -> Audit:
        audited.append((workdir.name, table))
        return plain.audit(workdir, complete=complete)

    act = Act("fake", (), "fake.json", plain.targets, audit, 60.0, ("iceberg", "delta"))
    monkeypatch.setitem(ACTS, "fake", act)
    asked: list[tuple[str, tuple[str, ...]]] = []

    def command(self: Act, python: str, workdir: Path, backend: str, resume: bool) -> list[str]:
        asked.append((workdir.name, () if resume else self.sizes))
        return [python, str(workdir)]

    monkeypatch.setattr(Act, "command", command)
    monkeypatch.setattr(harness, "run_until", fake_run)
    argv = ["chaos", "--acts", "fake", "--kills", "4", "--max-kills-per-round", "1"]
    assert main([*argv, "--seed", "2", "--random-share", "0", "--workdir", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "chaos-report.json").read_text())
    tables = [r["table"] for r in report["rounds"]]
    assert len(tables) >= 4
    assert set(tables) == {"iceberg", "delta"}
    assert all(a != b for a, b in itertools.pairwise(tables))  # in turn
    assert all(k["table"] == tables[k["round"]] for k in report["kills"])
    for number, table in enumerate(tables):
        workdir = f"round-{number:03d}-fake-{table}"
        # A new run asks for the round's table; the audits read it.
        assert (workdir, ("--table", table)) in asked
        assert {t for w, t in audited if w == workdir} == {table}
    assert f"round 0 fake[{tables[0]}]/" in capsys.readouterr().out


def test_random_kills_fall_within_the_duration_one_calibration_run_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(ACTS, "fake", fake_act(False))
    monkeypatch.setattr(Act, "command", lambda self, py, workdir, *_: [py, str(workdir)])
    kills: Kills = []
    monkeypatch.setattr(harness, "run_until", functools.partial(fake_run, seen=kills))
    argv = ["chaos", "--acts", "fake", "--kills", "6", "--seed", "3", "--workdir", str(tmp_path)]
    assert main([*argv, "--random-share", "0.5"]) == 0
    report = json.loads((tmp_path / "chaos-report.json").read_text())
    totals = report["totals"]
    assert totals["kills"] == 6
    assert totals["random"] == sum(k["mode"] == "random" for k in report["kills"]) > 0
    assert totals["traced"] == sum(k["mode"] == "traced" for k in report["kills"]) > 0
    assert [(c["act"], c["seconds"], c["clean"]) for c in report["calibrations"]] == [
        ("fake", 5.0, True)
    ]
    # The calibration run is the first unkilled run of the act, from scratch, before its
    # first random kill; every random kill is a moment within the 5 s it measured.
    first_random = next(i for i, (_, kill) in enumerate(kills) if isinstance(kill, KillAfter))
    calibration = next(i for i, (where, _) in enumerate(kills) if "calibrate-fake" in where)
    assert calibration < first_random
    assert kills[calibration][1] is None
    moments = [kill.seconds for _, kill in kills if isinstance(kill, KillAfter)]
    assert all(0 <= s < 5.0 for s in moments)
    assert all(k["aimed"] == RANDOM_WHERE for k in report["kills"] if k["mode"] == "random")
    out = capsys.readouterr().out
    assert f"({totals['random']} at random moments, {totals['traced']} at traced events)" in out


@pytest.mark.spark
@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_short_harness_on_the_real_acts_finds_nothing(tmp_path: Path) -> None:
    """``barrierflow chaos --kills 4``, one kill in each act (Spark through the driver and on
    the executors, backfill, views)."""
    command = [sys.executable, "-m", "barrierflow", "chaos", "--kills", "4", "--seed", "16"]
    command += ["--max-kills-per-round", "1", "--workdir", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=scaled(800), cwd=ROOT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "chaos-report.json").read_text())
    totals = report["totals"]
    assert totals["kills"] == 4
    assert totals["random"] + totals["traced"] == 4
    assert totals["rounds"] >= 4
    assert (totals["lost"], totals["duplicated"], totals["foreign"], totals["findings"]) == (
        0, 0, 0, 0
    )  # fmt: skip
    assert {r["act"] for r in report["rounds"]} == {"spark", "spark-executors", "backfill", "views"}
    spark_kill = next(k for k in report["kills"] if k["act"] == "spark")
    assert spark_kill["processes"] >= 2  # the driver and the Spark JVM went down together


@pytest.fixture
def traced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """This process traces into a file (as a demo run by the harness does)."""
    from barrierflow.app import _trace

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
async def test_a_traced_table_traces_its_commit_steps_and_stays_the_table(
    traced: Path,
) -> None:
    inner = ListTable(pa.schema([("id", pa.int64())]))
    table = TracedTable(inner)
    writer, committer = table.writer("0"), table.committer()
    await writer.open()
    await committer.recover({})
    await writer.begin(7)
    await writer.write(pa.record_batch({"id": [1]}, schema=inner.schema))
    metadata = await committer.prepare(7, [await writer.stage(7)])
    assert metadata is not None
    await committer.commit(7, metadata)
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
@pytest.mark.subprocess
def test_the_views_act_traces_every_event_its_targets_name(tmp_path: Path, backend: str) -> None:
    seen = traced_events("views", tmp_path, *ACTS["views"].sizes, "--backend", backend)
    assert {t.event for t in ACTS["views"].targets} <= seen


@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_backfill_act_traces_every_event_its_targets_name(tmp_path: Path, backend: str) -> None:
    seen = traced_events("backfill", tmp_path, *ACTS["backfill"].sizes, "--backend", backend)
    assert {t.event for t in ACTS["backfill"].targets} <= seen
