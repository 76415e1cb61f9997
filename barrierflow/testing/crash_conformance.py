"""The crash half of the sink connector conformance suite: SIGKILL a process driving the
connector at every step of its lifecycle, recover in this process, and check the rows.

``check_sink_connector(factory, read, crash_steps=True)`` runs it after the in-process rules
(:mod:`.conformance`). For each scenario a child process
(:mod:`barrierflow.testing._crash_child`) builds a connector with ``factory``, runs the
two-phase lifecycle over the factory's storage and kills itself with SIGKILL right after one
step. The child reports each pre-commit's metadata to this process (a line written and
fsynced to a report file) before it goes on: an epoch is *durable* — its checkpoint reached
the runtime's store — exactly when this process received its metadata. Then, as a restarted
runtime would, this process makes a new connector, calls ``open()`` and ``recover(pending)``
with the durable epochs whose commit was not recorded, and checks with ``read()`` that the
rows of every durable epoch are visible exactly once and no row of any other epoch is.

Rules, one per kill point (the connector was killed right after the named call returned):

* ``crash_after_open_recovers`` — after ``open`` of a second incarnation, with a durable
  pre-committed epoch left by a first one killed after ``pre_commit``;
* ``crash_after_recover_recovers`` — after ``recover`` of that second incarnation returned:
  recovering the same epochs again commits nothing twice;
* ``crash_after_begin_epoch_recovers`` / ``crash_after_write_batch_recovers`` /
  ``crash_after_flush_recovers`` — the open epoch's rows never appear;
* ``crash_before_checkpoint_drops_epoch`` — ``pre_commit`` returned but its checkpoint is not
  durable: the epoch is not passed to ``recover`` and must not appear;
* ``crash_after_pre_commit_recovers`` — the checkpoint is durable: ``recover`` commits it;
* ``crash_after_commit_recovers`` — ``commit_epoch`` returned but the runtime did not record
  it, so ``recover`` gets the epoch again: its rows appear once;
* ``crash_after_rollback_recovers`` — the rolled back epoch never appears;
* ``crash_after_close_recovers`` — ``close`` with an epoch pre-committed whose checkpoint is
  not durable committed nothing;
* ``recover_is_idempotent`` — after each of the above, another connector recovering the same
  epochs (a crash right after recover) leaves the same rows.

Decisions, and why:

* **Opt-in, by the same factory.** Crash checks run only with ``crash_steps=True`` (13 child
  processes: a few seconds; POSIX only). A child builds its own connector, so ``factory`` and
  ``rows`` (if given) must be importable by name — a module-level function or class, not a
  lambda, closure, bound method or anything of ``__main__`` — else InvalidArgumentError,
  before anything runs: a check that cannot run is refused, never reported as passed.
* **Storage.** ``factory()`` takes no argument and must reach the same durable storage in
  every process, as it does across calls already: a fixed path, or one read from an
  environment variable. The child inherits this process's environment, working directory and
  ``sys.path`` (as ``PYTHONPATH``). The storage starts empty and all scenarios share it, each
  with its own epochs (above 1000) and ids, so each rule is judged on its own ids only.
* **In-memory connectors.** A :class:`~barrierflow.testing.sinks.ListSink` keeps its rows in
  memory a SIGKILL frees: crash checks on one are an InvalidArgumentError, not a dozen
  predictable failures. Other in-memory connectors fail the crash rules, which is the truth.
* **Deadlines.** Each child and each recovery must finish within 30 seconds times
  ``BARRIERFLOW_TEST_TIMEOUT_SCALE`` (default 1), the variable that stretches every deadline
  of a test suite on a loaded machine; past it the rule fails and the child is killed.
* **Children are forked** from one server process that imported barrierflow and the
  factory's module once (:mod:`._crash_child`): a fresh interpreter per child would spend
  about a second each importing them. Each child runs on the backend this function runs on.
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
from barrierflow.actors.sinks.protocol import PendingCommit, SinkConnector
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.testing._crash_child import KILL_POINTS, ForkServer, resolve_name
from barrierflow.testing.sinks import ListSink

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
    "crash_after_open_recovers": ("pre_commit", "open"),
    "crash_after_recover_recovers": ("pre_commit", "recover"),
    "crash_after_begin_epoch_recovers": ("begin_epoch",),
    "crash_after_write_batch_recovers": ("write_batch",),
    "crash_after_flush_recovers": ("flush",),
    "crash_before_checkpoint_drops_epoch": ("pre_commit_unrecorded",),
    "crash_after_pre_commit_recovers": ("pre_commit",),
    "crash_after_commit_recovers": ("commit_epoch",),
    "crash_after_rollback_recovers": ("rollback_epoch",),
    "crash_after_close_recovers": ("close",),
}
assert all(point in KILL_POINTS for points in _SCENARIOS.values() for point in points)

#: Every rule the crash half reports, in order.
CRASH_RULES = (*_SCENARIOS, "recover_is_idempotent")

#: The variable multiplying the deadlines (a positive number, default 1).

_DEADLINE = 30.0  # seconds, times the scale, for one child or one recovery
_CLOSE_DEADLINE = 5.0

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
    factory: Callable[[], SinkConnector],
    rows: Callable[[list[int]], Any] | None,
    probe: SinkConnector,
) -> tuple[str, str | None]:
    """Refuse what the crash half cannot check, before anything runs; the names to import.

    Raises:
        InvalidArgumentError: not a POSIX system (no fork), ``factory`` or ``rows`` is not
            importable by name, ``probe`` is a ListSink, or the timeout scale is malformed.
    """
    if not hasattr(os, "fork"):
        raise InvalidArgumentError("crash_steps", "a POSIX system (fork, SIGKILL)", sys.platform)
    if isinstance(probe, ListSink):
        raise InvalidArgumentError(
            "factory",
            "a factory of connectors over durable storage for crash_steps (a ListSink keeps "
            "its rows in the process memory a SIGKILL frees)",
            type(probe).__name__,
        )
    timeout_scale()
    names = importable_name(factory, "factory")
    return names, None if rows is None else importable_name(rows, "rows")


async def check_crashes(
    factory: Callable[[], SinkConnector],
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
                    failure, repeat = await scenario.recover(factory, seen, scale)
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
        self.pending: list[PendingCommit] = []
        self.durable: set[int] = set()  # epochs whose checkpoint the parent received

    async def crash(
        self, server: ForkServer, names: tuple[str, str | None], points: Sequence[str]
    ) -> str | None:
        """Run one child per kill point; what went wrong, or None."""
        for point in points:
            answer = await server.run(
                {
                    "factory": names[0],
                    "rows": names[1],
                    "kill": point,
                    "epochs": self.epochs,
                    "ids": self.ids,
                    "pending": [[p.epoch, dict(p.metadata)] for p in self.pending],
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
            pre_committed = {f["pre_committed"]: f["metadata"] for f in facts if "metadata" in f}
            self.durable = set(pre_committed)
            self.pending = [
                PendingCommit(epoch, metadata)
                for epoch, metadata in sorted(pre_committed.items())
                if epoch not in committed
            ]
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
        factory: Callable[[], SinkConnector],
        seen: Callable[[], Awaitable[list[int]]],
        scale: float,
    ) -> tuple[str | None, str | None]:
        """Recover as a restarted runtime would, twice; what broke the scenario's rule (or
        None), and how the second recovery changed the rows (or None)."""
        try:
            first = await self._recovered_ids(factory, seen, scale)
        except Exception as error:  # the connector's failure is the finding
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
            second = await self._recovered_ids(factory, seen, scale)
        except Exception as error:
            return problem, f"recovering again raised {error!r}"
        if sorted(second) == sorted(first):
            return problem, None
        return problem, f"the first recovery left ids {sorted(first)}, the next {sorted(second)}"

    async def _recovered_ids(
        self,
        factory: Callable[[], SinkConnector],
        seen: Callable[[], Awaitable[list[int]]],
        scale: float,
    ) -> list[int]:
        sink = factory()
        try:
            with anyio.fail_after(_DEADLINE * scale):
                await sink.open()
                await sink.recover(self.pending)
        finally:
            with anyio.move_on_after(_CLOSE_DEADLINE * scale, shield=True):
                await sink.close()
        return [i for i in await seen() if i in self.span]

    def _context(self) -> str:
        """What happened, for a failure's detail."""
        kills = " then ".join(_SCENARIOS[self.rule])
        pending = [p.epoch for p in self.pending]
        return f"killed after {kills} (epochs {self.epochs}), recover(pending epochs {pending})"


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
