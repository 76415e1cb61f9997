"""The crash half of the table conformance suite: SIGKILL a process driving a table's writer
and committer at every step of the commit protocol, recover in this process as a restarted
coordinator would, and check the rows.

``check_table(make, read, crash_steps=True)`` runs it after the in-process rules
(:mod:`.conformance`). For each scenario a child process
(:mod:`barrierflow.testing._crash_child`) builds a table with ``make``, takes its writer
``"0"`` and its committer, runs one writer's epochs and their commits over the table's
storage (stage, prepare, commit, discard, close) and kills itself with SIGKILL right after one
step. The child reports each epoch's commit metadata to this process (a line written and
fsynced to a report file) before it goes on: an epoch is *durable* — the coordinator persisted
it as pending in its meta store — exactly when this process received its metadata. Then, as a
restarted coordinator does, this process takes a new committer (``make().committer()``), calls
``recover(pending)`` with the durable epochs whose commit was not recorded, then
``commit(epoch, metadata)`` for each of them in epoch order, and checks with ``read()`` that
the rows of every durable epoch are visible exactly once and no other row of the scenario is.

Rules, one per kill point (the child was killed right after the named call returned):

* ``crash_after_open_recovers`` — after the writer's ``open`` of a second incarnation, with a
  durable pending epoch left by a first one killed after ``prepare``;
* ``crash_after_recover_recovers`` — after that second incarnation's ``recover`` and its
  commits of the pending epochs returned, their marks not recorded: committing the same epochs
  again adds nothing;
* ``crash_after_begin_recovers`` / ``crash_after_write_recovers`` /
  ``crash_after_flush_recovers`` — the open epoch's rows never appear;
* ``crash_before_checkpoint_drops_epoch`` — ``prepare`` returned but its metadata never
  reached the meta store: the epoch is not pending, ``recover`` drops what it staged and its
  rows never appear;
* ``crash_after_prepare_recovers`` — the epoch is pending: the recovery commits it;
* ``crash_after_commit_recovers`` — ``commit`` returned but the coordinator did not record
  it, so the recovery commits the epoch again: its rows appear once;
* ``crash_after_discard_recovers`` — the discarded epoch never appears;
* ``crash_after_close_recovers`` — ``close`` with an epoch staged and prepared but never
  pending made nothing visible;
* ``recover_is_idempotent`` — after each of the above, another committer recovering and
  committing the same pending epochs (a crash right after the recovery) leaves the same rows.

Decisions, and why:

* **Opt-in, by the same factory.** Crash checks run only with ``crash_steps=True`` (13 child
  processes: a few seconds; POSIX only). A child builds its own table, so ``make`` and
  ``rows`` (if given) must be importable by name — a module-level function or class, not a
  lambda, closure, bound method or anything of ``__main__`` — else InvalidArgumentError,
  before anything runs: a check that cannot run is refused, never reported as passed.
* **One writer, one committer.** The children drive writer ``"0"`` and the committer as one
  coordinator and its only writer do; what several writers of one epoch must keep is checked
  in process (``parallel_writers_commit_at_once``).
* **Storage.** ``make()`` takes no argument and must reach the same durable storage in every
  process, as it does across calls already: a fixed path, or one read from an environment
  variable. The child inherits this process's environment, working directory and
  ``sys.path`` (as ``PYTHONPATH``). All scenarios share the storage, each with its own epochs
  (above 1000, increasing from one scenario to the next, as a table's committed marker
  expects) and ids, so each rule is judged on its own ids only.
* **The meta store is this process.** Pending metadata crosses to the children and back as
  JSON, as it would through a meta store: metadata that is not JSON fails the rules that need
  it to be persisted.
* **In-memory tables.** A :class:`~barrierflow.testing.sinks.ListTable` keeps its rows in
  memory a SIGKILL frees: crash checks on one are an InvalidArgumentError, not a dozen
  predictable failures. Other in-memory tables fail the crash rules, which is the truth.
* **Deadlines.** Each child and each recovery must finish within 30 seconds times
  ``BARRIERFLOW_TEST_TIMEOUT_SCALE`` (default 1), the variable that stretches every deadline
  of a test suite on a loaded machine; past it the rule fails and the child is killed.
* **Children are forked** from one server process that imported barrierflow and the
  factory's module once (:mod:`._crash_child`): a fresh interpreter per child would spend
  about a second each importing them. Each child runs on the backend this function runs on.
  What a table imports lazily (at its first call) each child imports again: import it in the
  factory's module to pay it once.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import sniffio

from barrierflow._timeout_scale import ENV as TIMEOUT_SCALE_ENV
from barrierflow._timeout_scale import timeout_scale
from barrierflow.actors.sinks.table import CommitMetadata, Table
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.testing._crash_child import KILL_POINTS, ForkServer, resolve_name
from barrierflow.testing.sinks import ListTable

__all__ = [
    "CRASH_RULES",
    "TIMEOUT_SCALE_ENV",
    "check_crash_arguments",
    "check_crashes",
    "importable_name",
    "timeout_scale",
]

#: Each crash rule, and the kill points of the children run one after the other before
#: recovering (each child gets the epochs made durable by the ones before it).
_SCENARIOS: dict[str, tuple[str, ...]] = {
    "crash_after_open_recovers": ("prepare", "open"),
    "crash_after_recover_recovers": ("prepare", "recover"),
    "crash_after_begin_recovers": ("begin",),
    "crash_after_write_recovers": ("write",),
    "crash_after_flush_recovers": ("flush",),
    "crash_before_checkpoint_drops_epoch": ("prepare_unrecorded",),
    "crash_after_prepare_recovers": ("prepare",),
    "crash_after_commit_recovers": ("commit",),
    "crash_after_discard_recovers": ("discard",),
    "crash_after_close_recovers": ("close",),
}
assert all(point in KILL_POINTS for points in _SCENARIOS.values() for point in points)

#: Every rule the crash half reports, in order.
CRASH_RULES = (*_SCENARIOS, "recover_is_idempotent")

_DEADLINE = 30.0  # seconds, times the scale, for one child or one recovery

#: Records one rule: its name, whether it held, what was seen.
Record = Callable[[str, bool, str], None]


def importable_name(obj: object, argument: str) -> str:
    """``"module:qualname"`` by which a fresh interpreter imports ``obj``.

    Raises:
        InvalidArgumentError: ``obj`` is not reachable by that name (a lambda, a closure, a
            bound method, a ``functools.partial``, something defined in ``__main__``).
    """
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    expected = "a module-level function or class, importable by name in a child process"
    if not isinstance(module, str) or not isinstance(qualname, str):
        raise InvalidArgumentError(argument, expected, obj)
    name = f"{module}:{qualname}"
    if module == "__main__" or "<" in qualname:
        raise InvalidArgumentError(argument, expected, name)
    try:
        found = resolve_name(name)
    except (ImportError, AttributeError):
        raise InvalidArgumentError(argument, expected, name) from None
    if found is not obj:
        raise InvalidArgumentError(argument, expected, name)
    return name


def check_crash_arguments(
    make: Callable[[], Table],
    rows: Callable[[list[int]], Any] | None,
    probe: Table,
) -> tuple[str, str | None]:
    """Refuse what the crash half cannot check, before anything runs; the names to import.

    Raises:
        InvalidArgumentError: not a POSIX system (no fork), ``make`` or ``rows`` is not
            importable by name, ``probe`` is a ListTable, or the timeout scale is malformed.
    """
    if not hasattr(os, "fork"):
        raise InvalidArgumentError("crash_steps", "a POSIX system (fork, SIGKILL)", sys.platform)
    if isinstance(probe, ListTable):
        raise InvalidArgumentError(
            "make",
            "a factory of tables over durable storage for crash_steps (a ListTable keeps "
            "its rows in the process memory a SIGKILL frees)",
            type(probe).__name__,
        )
    timeout_scale()
    name = importable_name(make, "make")
    return name, None if rows is None else importable_name(rows, "rows")


async def check_crashes(
    make: Callable[[], Table],
    names: tuple[str, str | None],
    seen: Callable[[], Awaitable[list[int]]],
    record: Record,
) -> None:
    """Run every crash scenario (see the module) and ``record`` each rule of
    :data:`CRASH_RULES`. ``names`` comes from :func:`check_crash_arguments`.

    Cancellation: a running child is killed; the storage is left as a crash would leave it.
    """
    scale = timeout_scale()
    not_idempotent: list[str] = []
    with tempfile.TemporaryDirectory(prefix="barrierflow-crash-") as reports:
        server = ForkServer(Path(reports) / "server.log", _DEADLINE * scale)
        try:
            for index, (rule, points) in enumerate(_SCENARIOS.items()):
                scenario = _Scenario(rule, 1000 + 10 * index, Path(reports) / f"{index}.jsonl")
                failure = await scenario.crash(server, names, points)
                if failure is None:
                    failure, repeat = await scenario.recover(make, seen, scale)
                    if repeat:
                        not_idempotent.append(f"{rule}: {repeat}")
                record(rule, failure is None, failure or "")
        finally:
            await server.aclose()
    record("recover_is_idempotent", not not_idempotent, "; ".join(not_idempotent))


class _Scenario:
    """One crash rule: its epochs and ids, its children, its recovery."""

    def __init__(self, rule: str, base: int, report: Path) -> None:
        self.rule = rule
        self.epochs = [base + 1, base + 2, base + 3]
        self.ids = [[base + 1, base + 2], [base + 3], [base + 4, base + 5]]
        self.span = range(base + 1, base + 10)
        self.report = report
        self.pending: dict[int, CommitMetadata] = {}  # durable, commit not recorded
        self.durable: set[int] = set()  # epochs whose metadata the parent received

    async def crash(
        self, server: ForkServer, names: tuple[str, str | None], points: Sequence[str]
    ) -> str | None:
        """Run one child per kill point; what went wrong, or None."""
        for point in points:
            answer = await server.run(
                {
                    "make": names[0],
                    "rows": names[1],
                    "kill": point,
                    "epochs": self.epochs,
                    "ids": self.ids,
                    "pending": [[epoch, dict(m)] for epoch, m in sorted(self.pending.items())],
                    "report": str(self.report),
                    "backend": sniffio.current_async_library(),
                }
            )
            facts = await anyio.to_thread.run_sync(self._facts)
            if answer != -signal.SIGKILL or facts[-1:] != [{"killing": point}]:
                out = await anyio.to_thread.run_sync(self._output)
                got = f"exit code {answer}" if isinstance(answer, int) else answer
                return (
                    f"expected the child to be killed after {point}, got {got}; its output: "
                    f"{out or '(empty)'}"
                )
            committed = {f["committed"] for f in facts if "committed" in f}
            durable = {f["pending"]: f["metadata"] for f in facts if "pending" in f}
            self.durable = set(durable)
            self.pending = {
                epoch: metadata
                for epoch, metadata in sorted(durable.items())
                if epoch not in committed
            }
        return None

    def _output(self) -> str:
        out = Path(f"{self.report}.out")
        return out.read_text(errors="replace").strip()[-1500:] if out.exists() else ""

    def _facts(self) -> list[dict[str, Any]]:
        if not self.report.exists():
            return []
        return [json.loads(line) for line in self.report.read_text().splitlines() if line]

    async def recover(
        self,
        make: Callable[[], Table],
        seen: Callable[[], Awaitable[list[int]]],
        scale: float,
    ) -> tuple[str | None, str | None]:
        """Recover as a restarted coordinator would, twice; what broke the scenario's rule
        (or None), and how the second recovery changed the rows (or None)."""
        try:
            first = await self._recovered_ids(make, seen, scale)
        except Exception as error:  # the table's failure is the finding
            return f"{self._context()} raised {error!r}", None
        expected = [
            i
            for epoch, ids in zip(self.epochs, self.ids, strict=True)
            if epoch in self.durable
            for i in ids
        ]
        problem = _compare(first, expected)
        if problem is not None:
            problem = f"{self._context()} left {problem}"
        try:
            second = await self._recovered_ids(make, seen, scale)
        except Exception as error:
            return problem, f"recovering again raised {error!r}"
        if sorted(second) == sorted(first):
            return problem, None
        return problem, f"the first recovery left ids {sorted(first)}, the next {sorted(second)}"

    async def _recovered_ids(
        self,
        make: Callable[[], Table],
        seen: Callable[[], Awaitable[list[int]]],
        scale: float,
    ) -> list[int]:
        with anyio.fail_after(_DEADLINE * scale):
            committer = make().committer()
            await committer.recover(dict(self.pending))
            for epoch, metadata in sorted(self.pending.items()):
                await committer.commit(epoch, metadata)
        return [i for i in await seen() if i in self.span]

    def _context(self) -> str:
        """What happened, for a failure's detail."""
        kills = " then ".join(_SCENARIOS[self.rule])
        return (
            f"killed after {kills} (epochs {self.epochs}), recover(pending epochs "
            f"{sorted(self.pending)}) and their commits"
        )


def _compare(got: list[int], expected: list[int]) -> str | None:
    """What is wrong with the ids ``got`` if ``expected`` should be visible once each."""
    lost = sorted(set(expected) - set(got))
    duplicated = sorted({i for i in got if got.count(i) > 1})
    stray = sorted(set(got) - set(expected))
    problems = [
        f"{what} {ids}"
        for what, ids in (
            ("lost ids", lost),
            ("duplicated ids", duplicated),
            ("visible ids of epochs neither committed nor pending", stray),
        )
        if ids
    ]
    return "; ".join(problems) or None
