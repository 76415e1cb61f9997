"""``barrierflow chaos``: kill live pipelines at random, resume them, and audit what they wrote.

The harness plays *rounds*. A round takes one of the demo's acts (Spark → Iceberg; a source
backfill joining live Redis streams; a snapshot backfill joining a materialized view) in a
fresh work directory, on a backend, and runs it as its own process group
(:mod:`.process`). It SIGKILLs the whole group — driver, Spark JVM, Valkey server — at a
planned moment, audits the tables as they are, restarts the act with ``--resume``, and
repeats; after the round's last kill it lets the run finish and audits again, now also for
rows lost and leftovers. Rounds go on until ``kills`` kills have landed.

An act with a choice of tables (the Spark act: Iceberg or Delta Lake) writes them in turn, one
per round of the act, starting from a table drawn from ``seed``; the report and each line name
the round's table (``spark[delta]/trio``).

A kill is planned one of two ways:

* **at a traced event** (:mod:`.acts`: an event of the run's trace, which occurrence, a short
  delay) — aimed at the steps the protocol cares about (a pre-commit, a backfill phase...);
* **at a uniform random moment** of the run — a share ``random_share`` of the kills (default
  :data:`RANDOM_SHARE`): a moment drawn uniformly over the act's *expected duration*, whatever
  the run is doing then. Traced kills land only near traced events; a window between two of
  them (a run killed after its manifest was written and before its input existed) is reached
  only this way. The expected duration of an act is measured once per session by a
  *calibration run*: the first time a random kill of the act is planned, the harness runs the
  act once from scratch without killing it (in ``calibrate-<act>``, on that round's backend),
  times it and audits it as a finished run (its findings count like a round's). The same
  duration is the window of every later run of the act, resumed runs too: a moment after a
  run has finished is reported as missed, as a traced target the run never reached is.

Everything is drawn from ``seed``: round ``r``'s act follows a seeded rotation, and its
backend, kill count and each kill's plan from generators seeded with ``(seed, r, run)`` —
whether the kill is random, and the moment as a fraction of the expected duration, from their
own generator, so that a traced plan is the same whatever ``random_share`` is. The same seed
plans the same kills; only wall-clock effects differ between two sessions: the expected
duration a random kill's fraction is scaled by, and where a kill *lands* (which is why each
kill's report says where it landed, from the run's trace). A planned kill the run finishes
without reaching is reported as missed, and ends the round.

Exit status of the command: 0 when no audit found anything, 1 otherwise. Timeouts scale with
``BARRIERFLOW_TEST_TIMEOUT_SCALE`` (as the test suite's).
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import final

from barrierflow._timeout_scale import timeout_scale
from barrierflow.app.chaos.acts import ACTS, Act
from barrierflow.app.chaos.audit import Audit
from barrierflow.app.chaos.process import KillAfter, KillAt, RunOutcome, run_until
from barrierflow.channels.errors import InvalidArgumentError

__all__ = ["ChaosConfig", "ChaosReport", "run_chaos"]

BACKENDS = ("asyncio", "trio")
REPORT = "chaos-report.json"
#: The share of kills drawn at a uniform random moment of the run when none is given: enough
#: to reach the windows no traced event marks within a short session, while most kills still
#: go where the protocol has steps to break.
RANDOM_SHARE = 0.3
#: What a random kill was aimed at, in the report.
RANDOM_WHERE = "a uniform random moment of the run"


@final
@dataclass(frozen=True, slots=True)
class ChaosConfig:
    """What the harness is asked to do (see the module).

    Raises:
        InvalidArgumentError: ``kills`` or ``max_kills_per_round`` not an int >= 1, ``seed``
            not an int, ``random_share`` not a number in 0..1, or an unknown act.
    """

    workdir: Path
    kills: int = 3
    seed: int = 0
    acts: tuple[str, ...] = ("spark", "spark-executors", "backfill", "views")
    max_kills_per_round: int = 3
    #: The share of kills planned at a uniform random moment instead of a traced event.
    random_share: float = RANDOM_SHARE
    #: Keep the work directories of rounds whose audits were clean (always kept otherwise).
    keep: bool = False
    python: str = sys.executable

    def __post_init__(self) -> None:
        for name in ("kills", "max_kills_per_round"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise InvalidArgumentError(name, "an int >= 1", value)
        if type(self.seed) is not int:
            raise InvalidArgumentError("seed", "an int", self.seed)
        share = self.random_share
        if type(share) not in (int, float) or not 0 <= share <= 1:
            raise InvalidArgumentError("random_share", "a number in 0..1", share)
        unknown = [a for a in self.acts if a not in ACTS]
        if not self.acts or unknown:
            raise InvalidArgumentError("acts", f"one or more of {sorted(ACTS)}", self.acts)


@dataclass(slots=True)
class KillReport:
    """One kill: when, where it was aimed and where it landed, and the audit after it."""

    kill: int
    round: int
    act: str
    backend: str
    run: int
    #: ``"traced"`` (at an event of the run's trace) or ``"random"`` (a uniform random moment).
    mode: str
    aimed: str
    plan: str
    landed: str
    seconds: float
    #: Processes the SIGKILL of the group took down (driver, Spark JVM, Valkey server).
    processes: int
    survivors: list[int]
    audit: str
    clean: bool
    #: The table the round writes (``""``: the act has no choice).
    table: str = ""
    #: Processes outside the group (PySpark's daemon and workers) that exited on their own
    #: after the kill, within the grace: a real crash leaves them too; not survivors.
    orphans: int = 0


@dataclass(slots=True)
class RoundReport:
    """One round: its act, its kills, how its last run ended and the final audit."""

    round: int
    act: str
    backend: str
    kills: int
    runs: int
    exit: int
    audit: str
    clean: bool
    lost: int
    duplicated: int
    foreign: int
    missed: str = ""
    findings: list[str] = field(default_factory=list)
    #: The table the round wrote (``""``: the act has no choice).
    table: str = ""


@dataclass(slots=True)
class CalibrationReport:
    """The unkilled run that measured an act's expected duration (the window of its random
    kills), audited as a finished run."""

    act: str
    backend: str
    seconds: float
    exit: int
    audit: str
    clean: bool
    findings: list[str] = field(default_factory=list)
    #: The table the run wrote (``""``: the act has no choice).
    table: str = ""


@dataclass(slots=True)
class ChaosReport:
    """Everything the harness did and found."""

    seed: int
    kills: list[KillReport] = field(default_factory=list)
    rounds: list[RoundReport] = field(default_factory=list)
    calibrations: list[CalibrationReport] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return (
            all(k.clean for k in self.kills)
            and all(r.clean for r in self.rounds)
            and all(c.clean for c in self.calibrations)
        )

    def totals(self) -> dict[str, int]:
        """Kills (random and traced), rounds, calibration runs, and the rows
        lost/duplicated/foreign over every final audit."""
        random_kills = sum(k.mode == "random" for k in self.kills)
        return {
            "kills": len(self.kills),
            "random": random_kills,
            "traced": len(self.kills) - random_kills,
            "rounds": len(self.rounds),
            "calibrations": len(self.calibrations),
            "lost": sum(r.lost for r in self.rounds),
            "duplicated": sum(r.duplicated for r in self.rounds),
            "foreign": sum(r.foreign for r in self.rounds),
            "findings": sum(not k.clean for k in self.kills)
            + sum(not r.clean for r in self.rounds)
            + sum(not c.clean for c in self.calibrations),
        }

    def write(self, path: Path) -> None:
        path.write_text(json.dumps({"totals": self.totals(), **asdict(self)}, indent=1))


def _rng(*parts: object) -> random.Random:
    """A generator seeded by a hash of ``parts`` (string seeds that share a prefix give
    correlated first draws in Python's Mersenne Twister; a hash does not)."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


@final
@dataclass(frozen=True, slots=True)
class Plan:
    """One run's kill as planned: a traced target, or a moment given as a fraction of the act's
    expected duration (known only once the act has been timed, see the module)."""

    #: The part of the pipeline aimed at, for the report (:data:`RANDOM_WHERE` if random).
    where: str
    #: The traced target, or ``None`` for a random kill.
    traced: KillAt | None = None
    #: A random kill's moment, as a fraction in ``[0, 1)`` of the expected duration.
    fraction: float = 0.0

    @property
    def mode(self) -> str:
        return "traced" if self.traced is not None else "random"

    def kill(self, expected: float) -> KillAt | KillAfter:
        """The kill itself, for a run of an act expected to last ``expected`` seconds."""
        if self.traced is not None:
            return self.traced
        return KillAfter(round(self.fraction * expected, 4))


def _plan(act: Act, random_share: float, *parts: object) -> Plan:
    """The kill of the run ``parts`` (seed, round, run): random with probability
    ``random_share``, else one of ``act``'s targets. The two draws come from two generators,
    so that the traced plan of a run does not depend on the share."""
    chooser = _rng(*parts, "random")
    if chooser.random() < random_share:
        return Plan(RANDOM_WHERE, fraction=chooser.random())
    rng = _rng(*parts)
    target = rng.choice(act.targets)
    kill = KillAt(
        target.event,
        rng.randint(1, target.occurrences),
        round(rng.uniform(0.0, target.delay), 4),
        target.detail,
    )
    return Plan(target.where, traced=kill)


def run_chaos(config: ChaosConfig, say: Callable[[str], None] = print) -> ChaosReport:
    """Play rounds until ``config.kills`` kills have landed (see the module); the report is
    also written to ``<workdir>/chaos-report.json``."""
    root = config.workdir.resolve()
    root.mkdir(parents=True, exist_ok=True)
    report = ChaosReport(config.seed)
    acts = [ACTS[name] for name in config.acts]
    offset = _rng(config.seed).randrange(len(acts))
    max_rounds = config.kills * 4 + 10  # a round ends early only when its target was missed
    #: Each act's expected duration in seconds, once a calibration run has measured it.
    expected: dict[str, float] = {}
    number = 0
    while len(report.kills) < config.kills and number < max_rounds:
        act = _with_table(acts[(offset + number) % len(acts)], config.seed, report)
        _round(config, root, report, act, number, expected, say)
        report.write(root / REPORT)
        number += 1
    totals = report.totals()
    for (name, aimed), count in summarize(report):
        say(f"{count:>5} kills  {name:<14} {aimed}")
    say(
        f"chaos: {totals['kills']} kills ({totals['random']} at random moments, "
        f"{totals['traced']} at traced events) in {totals['rounds']} rounds and "
        f"{totals['calibrations']} calibration runs (seed {config.seed}); lost "
        f"{totals['lost']}, duplicated {totals['duplicated']}, foreign {totals['foreign']}; "
        f"findings {totals['findings']} — report: {root / REPORT}"
    )
    return report


def _with_table(act: Act, seed: int, report: ChaosReport) -> Act:
    """``act`` writing the table of its next round: its tables in turn, one per round of the
    act, from one drawn from ``seed`` (``act`` itself when it has no choice)."""
    if not act.tables:
        return act
    first = _rng(seed, act.name, "table").randrange(len(act.tables))
    played = sum(r.act == act.name for r in report.rounds)
    return act.writing(act.tables[(first + played) % len(act.tables)])


def _label(act: Act, backend: str) -> str:
    """``act/backend``, with the act's table if it has one: ``spark[delta]/trio``."""
    return f"{act.name}[{act.table}]/{backend}" if act.table else f"{act.name}/{backend}"


def _round(
    config: ChaosConfig,
    root: Path,
    report: ChaosReport,
    act: Act,
    number: int,
    expected: dict[str, float],
    say: Callable[[str], None],
) -> None:
    rng = _rng(config.seed, number)
    backend = rng.choice(BACKENDS)
    left = config.kills - len(report.kills)
    planned = min(rng.randint(1, config.max_kills_per_round), left)
    workdir = root / f"round-{number:03d}-{act.name}{f'-{act.table}' if act.table else ''}"
    shutil.rmtree(workdir, ignore_errors=True)
    logs = root / "logs"
    logs.mkdir(exist_ok=True)
    landed = 0
    run = 0
    missed = ""
    clean = True
    while True:
        kill: KillAt | KillAfter | None = None
        plan: Plan | None = None
        if landed < planned:
            plan = _plan(act, config.random_share, config.seed, number, run)
            if plan.traced is None and act.name not in expected:
                expected[act.name] = _calibrate(config, root, report, act, backend, say)
            kill = plan.kill(expected.get(act.name, 0.0))
        resume = (workdir / act.manifest).exists()
        log = logs / f"round-{number:03d}-run-{run}.log"
        outcome = run_until(
            act.command(config.python, workdir, backend, resume),
            trace=logs / f"round-{number:03d}-run-{run}.trace",
            log=log,
            kill=kill,
            timeout=act.timeout * timeout_scale(),
            env=_ENV,
        )
        run += 1
        if outcome.killed and not outcome.timed_out and kill is not None and plan is not None:
            landed += 1
            audit = act.audit(workdir, complete=False)
            entry = _kill_entry(report, number, act, backend, run, plan, kill, outcome, audit)
            clean = clean and entry.clean
            orphans = f" ({entry.orphans} left it and exited)" if entry.orphans else ""
            say(
                f"kill {entry.kill:>3} round {number} {_label(act, backend)} run {run}: aimed "
                f"{entry.aimed} ({entry.plan}), landed after '{entry.landed}' at "
                f"{entry.seconds:.2f} s, {entry.processes} processes killed{orphans}; audit: "
                f"{entry.audit}"
            )
            continue
        if kill is not None and plan is not None:
            missed = f"{plan.where} ({kill.describe()})"
        audit = act.audit(workdir, complete=True)
        _ended(audit, outcome, log)
        entry_round = RoundReport(
            number, act.name, backend, landed, run, outcome.returncode, audit.summary(),
            audit.clean, audit.lost, audit.duplicated, audit.foreign, missed,
            [str(f) for f in audit.findings], act.table,
        )  # fmt: skip
        report.rounds.append(entry_round)
        say(
            f"round {number} {_label(act, backend)}: {landed} kills, {run} runs, exit "
            f"{outcome.returncode}{f', missed {missed}' if missed else ''}; final audit: "
            f"{audit.summary()}"
        )
        if audit.clean and clean and not config.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        return


#: The environment of every run (Spark on the loopback, output unbuffered for the logs).
_ENV = {"SPARK_LOCAL_IP": "127.0.0.1", "PYTHONUNBUFFERED": "1"}


def _calibrate(
    config: ChaosConfig,
    root: Path,
    report: ChaosReport,
    act: Act,
    backend: str,
    say: Callable[[str], None],
) -> float:
    """Run ``act`` once from scratch without a kill and return how long it took: the window
    its random kills are drawn in (see the module). The run is audited as a finished one."""
    workdir = root / f"calibrate-{act.name}{f'-{act.table}' if act.table else ''}"
    shutil.rmtree(workdir, ignore_errors=True)
    log = root / "logs" / f"calibrate-{act.name}.log"
    outcome = run_until(
        act.command(config.python, workdir, backend, False),
        trace=root / "logs" / f"calibrate-{act.name}.trace",
        log=log,
        kill=None,
        timeout=act.timeout * timeout_scale(),
        env=_ENV,
    )
    audit = act.audit(workdir, complete=True)
    _ended(audit, outcome, log)
    seconds = round(outcome.seconds, 3)
    entry = CalibrationReport(
        act.name, backend, seconds, outcome.returncode, audit.summary(), audit.clean,
        [str(f) for f in audit.findings], act.table,
    )  # fmt: skip
    report.calibrations.append(entry)
    say(
        f"calibration {_label(act, backend)}: an unkilled run took {seconds:.2f} s (the window "
        f"of its random kills), exit {outcome.returncode}; audit: {audit.summary()}"
    )
    if audit.clean and not config.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return seconds


def _kill_entry(
    report: ChaosReport,
    number: int,
    act: Act,
    backend: str,
    run: int,
    plan: Plan,
    kill: KillAt | KillAfter,
    outcome: RunOutcome,
    audit: Audit,
) -> KillReport:
    if outcome.survivors:
        audit.add(
            "survivors",
            f"pids {list(outcome.survivors)} outlived the SIGKILL of the group (or, having "
            "left it, the grace for orphans to exit on their own)",
        )
    entry = KillReport(
        kill=len(report.kills) + 1,
        round=number,
        act=act.name,
        backend=backend,
        run=run,
        mode=plan.mode,
        aimed=plan.where,
        plan=kill.describe(),
        landed=outcome.where,
        seconds=round(outcome.seconds, 3),
        processes=outcome.members,
        survivors=list(outcome.survivors),
        audit=audit.summary(),
        clean=audit.clean,
        table=act.table,
        orphans=outcome.orphans,
    )
    report.kills.append(entry)
    return entry


def _ended(audit: Audit, outcome: RunOutcome, log: Path) -> None:
    """Findings about how the last run of a round ended: hung, failed, left processes."""
    if outcome.timed_out:
        audit.add("hung", f"no exit after {outcome.seconds:.0f} s (last event '{outcome.where}')")
    elif outcome.returncode != 0:
        audit.add("run_failed", f"exit {outcome.returncode}: {_tail(log)}")
    if outcome.survivors:
        audit.add("left_running", f"pids {list(outcome.survivors)} after the driver exited")


def _tail(log: Path, lines: int = 3) -> str:
    try:
        text = log.read_text(errors="replace").strip().splitlines()
    except FileNotFoundError:
        return "(no output)"
    return " | ".join(text[-lines:])


def summarize(report: ChaosReport) -> Sequence[tuple[tuple[str, str], int]]:
    """Kills per act (and table: ``spark[delta]``) and part of the pipeline they were aimed
    at (random kills as one :data:`RANDOM_WHERE` line per act), in act order."""
    counts: dict[tuple[str, str], int] = {}
    for kill in report.kills:
        name = f"{kill.act}[{kill.table}]" if kill.table else kill.act
        counts[name, kill.aimed] = counts.get((name, kill.aimed), 0) + 1
    return sorted(counts.items(), key=lambda item: (item[0][0], -item[1]))
