"""``barrierflow chaos``: kill live pipelines at random, resume them, and audit what they wrote.

The harness plays *rounds*. A round takes one of the demo's acts (Spark → Iceberg; a source
backfill joining live Redis streams; a snapshot backfill joining a materialized view) in a
fresh work directory, on a backend, and runs it as its own process group
(:mod:`.process`). It SIGKILLs the whole group — driver, Spark JVM, Valkey server — at a
planned moment (:mod:`.acts`: an event of the run's trace, which occurrence, a delay), audits
the tables as they are, restarts the act with ``--resume``, and repeats; after the round's
last kill it lets the run finish and audits again, now also for rows lost and leftovers.
Rounds go on until ``kills`` kills have landed.

Everything is drawn from ``seed``: round ``r``'s act follows a seeded rotation, and its
backend, kill count and each kill's target from a generator seeded with ``(seed, r, run)`` —
the same seed plans the same kills (where a kill *lands* still depends on timing, which is
why each kill's report says where it landed, from the run's trace). A planned target the run
finishes without reaching is reported as missed, and ends the round.

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
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.chaos.acts import ACTS, Act
from barrierflow.chaos.audit import Audit
from barrierflow.chaos.process import KillAt, RunOutcome, run_until

__all__ = ["ChaosConfig", "ChaosReport", "run_chaos"]

BACKENDS = ("asyncio", "trio")
REPORT = "chaos-report.json"


@final
@dataclass(frozen=True, slots=True)
class ChaosConfig:
    """What the harness is asked to do (see the module).

    Raises:
        InvalidArgumentError: ``kills`` or ``max_kills_per_round`` not an int >= 1, ``seed``
            not an int, or an unknown act.
    """

    workdir: Path
    kills: int = 3
    seed: int = 0
    acts: tuple[str, ...] = ("spark", "backfill", "views")
    max_kills_per_round: int = 3
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
    aimed: str
    plan: str
    landed: str
    seconds: float
    #: Processes the SIGKILL of the group took down (driver, Spark JVM, Valkey server).
    processes: int
    survivors: list[int]
    audit: str
    clean: bool


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


@dataclass(slots=True)
class ChaosReport:
    """Everything the harness did and found."""

    seed: int
    kills: list[KillReport] = field(default_factory=list)
    rounds: list[RoundReport] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return all(k.clean for k in self.kills) and all(r.clean for r in self.rounds)

    def totals(self) -> dict[str, int]:
        """Kills, rounds, and the rows lost/duplicated/foreign over every final audit."""
        return {
            "kills": len(self.kills),
            "rounds": len(self.rounds),
            "lost": sum(r.lost for r in self.rounds),
            "duplicated": sum(r.duplicated for r in self.rounds),
            "foreign": sum(r.foreign for r in self.rounds),
            "findings": sum(not k.clean for k in self.kills)
            + sum(not r.clean for r in self.rounds),
        }

    def write(self, path: Path) -> None:
        path.write_text(json.dumps({"totals": self.totals(), **asdict(self)}, indent=1))


def _rng(*parts: object) -> random.Random:
    """A generator seeded by a hash of ``parts`` (string seeds that share a prefix give
    correlated first draws in Python's Mersenne Twister; a hash does not)."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def _plan(act: Act, rng: random.Random) -> tuple[KillAt, str]:
    target = rng.choice(act.targets)
    kill = KillAt(
        target.event,
        rng.randint(1, target.occurrences),
        round(rng.uniform(0.0, target.delay), 4),
        target.detail,
    )
    return kill, target.where


def run_chaos(config: ChaosConfig, say: Callable[[str], None] = print) -> ChaosReport:
    """Play rounds until ``config.kills`` kills have landed (see the module); the report is
    also written to ``<workdir>/chaos-report.json``."""
    root = config.workdir.resolve()
    root.mkdir(parents=True, exist_ok=True)
    report = ChaosReport(config.seed)
    acts = [ACTS[name] for name in config.acts]
    offset = _rng(config.seed).randrange(len(acts))
    max_rounds = config.kills * 4 + 10  # a round ends early only when its target was missed
    number = 0
    while len(report.kills) < config.kills and number < max_rounds:
        act = acts[(offset + number) % len(acts)]
        _round(config, root, report, act, number, say)
        report.write(root / REPORT)
        number += 1
    totals = report.totals()
    for (name, aimed), count in summarize(report):
        say(f"{count:>5} kills  {name:<8} {aimed}")
    say(
        f"chaos: {totals['kills']} kills in {totals['rounds']} rounds (seed {config.seed}); "
        f"lost {totals['lost']}, duplicated {totals['duplicated']}, foreign {totals['foreign']}; "
        f"findings {totals['findings']} — report: {root / REPORT}"
    )
    return report


def _round(
    config: ChaosConfig,
    root: Path,
    report: ChaosReport,
    act: Act,
    number: int,
    say: Callable[[str], None],
) -> None:
    rng = _rng(config.seed, number)
    backend = rng.choice(BACKENDS)
    left = config.kills - len(report.kills)
    planned = min(rng.randint(1, config.max_kills_per_round), left)
    workdir = root / f"round-{number:03d}-{act.name}"
    shutil.rmtree(workdir, ignore_errors=True)
    logs = root / "logs"
    logs.mkdir(exist_ok=True)
    landed = 0
    run = 0
    missed = ""
    clean = True
    while True:
        kill: KillAt | None = None
        aimed = ""
        if landed < planned:
            kill, aimed = _plan(act, _rng(config.seed, number, run))
        resume = (workdir / act.manifest).exists()
        log = logs / f"round-{number:03d}-run-{run}.log"
        outcome = run_until(
            act.command(config.python, workdir, backend, resume),
            trace=logs / f"round-{number:03d}-run-{run}.trace",
            log=log,
            kill=kill,
            timeout=act.timeout * timeout_scale(),
            env={"SPARK_LOCAL_IP": "127.0.0.1", "PYTHONUNBUFFERED": "1"},
        )
        run += 1
        if outcome.killed and not outcome.timed_out and kill is not None:
            landed += 1
            audit = act.audit(workdir, complete=False)
            entry = _kill_entry(report, number, act, backend, run, aimed, kill, outcome, audit)
            clean = clean and entry.clean
            say(
                f"kill {entry.kill:>3} round {number} {act.name}/{backend} run {run}: aimed "
                f"{aimed} ({entry.plan}), landed after '{entry.landed}' at "
                f"{entry.seconds:.2f} s, {entry.processes} processes killed; audit: {entry.audit}"
            )
            continue
        if kill is not None:
            missed = f"{aimed} ({kill.describe()})"
        audit = act.audit(workdir, complete=True)
        _ended(audit, outcome, log)
        entry_round = RoundReport(
            number, act.name, backend, landed, run, outcome.returncode, audit.summary(),
            audit.clean, audit.lost, audit.duplicated, audit.foreign, missed,
            [str(f) for f in audit.findings],
        )  # fmt: skip
        report.rounds.append(entry_round)
        say(
            f"round {number} {act.name}/{backend}: {landed} kills, {run} runs, exit "
            f"{outcome.returncode}{f', missed {missed}' if missed else ''}; final audit: "
            f"{audit.summary()}"
        )
        if audit.clean and clean and not config.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        return


def _kill_entry(
    report: ChaosReport,
    number: int,
    act: Act,
    backend: str,
    run: int,
    aimed: str,
    kill: KillAt,
    outcome: RunOutcome,
    audit: Audit,
) -> KillReport:
    if outcome.survivors:
        audit.add("survivors", f"pids {list(outcome.survivors)} outlived the SIGKILL of the group")
    entry = KillReport(
        len(report.kills) + 1, number, act.name, backend, run, aimed, kill.describe(),
        outcome.where, round(outcome.seconds, 3), outcome.members, list(outcome.survivors),
        audit.summary(),
        audit.clean,
    )  # fmt: skip
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
    """Kills per act and part of the pipeline they were aimed at, in act order."""
    counts: dict[tuple[str, str], int] = {}
    for kill in report.kills:
        counts[kill.act, kill.aimed] = counts.get((kill.act, kill.aimed), 0) + 1
    return sorted(counts.items(), key=lambda item: (item[0][0], -item[1]))
