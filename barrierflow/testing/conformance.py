"""Conformance suites a user runs against their own code: does a sink connector keep the
exactly-once contract (:mod:`barrierflow.actors.sinks.protocol`)?

``await check_sink_connector(factory, read)`` drives connectors made by ``factory`` (each call
a new instance over the *same* storage, as after a restart) through the two-phase lifecycle
and checks, by what ``read()`` returns (the rows a reader of the sink sees now), each rule by
name:

* ``invisible_before_commit`` — written and pre-committed rows are not visible;
* ``commit_makes_visible`` — ``commit_epoch`` makes exactly the epoch's rows visible;
* ``replayed_commit_is_noop`` — committing the same epoch again adds nothing;
* ``commit_after_next_begin`` — a pre-committed epoch committed after the next epoch began
  holds only its own rows (the connector keeps them apart);
* ``rollback_discards`` — a rolled back epoch never becomes visible;
* ``recover_commits_pending`` — a new connector's ``recover`` commits the pre-committed epochs
  it is given (their rows are never replayed);
* ``recover_drops_the_rest`` — and drops every other staged or pre-committed epoch (those are
  replayed by the upstream);
* ``close_commits_nothing`` — closing with an epoch pre-committed makes nothing visible.

It returns a :class:`ConformanceReport` (every rule, passed or not, with what was seen);
``report.raise_for_failures()`` raises :class:`ConformanceError` naming the broken rules. The
rows are a single ``int64`` column ``id`` unless the connector's schema says otherwise: then
``rows(ids)`` must build a batch of the connector's schema from ids, and ``read`` return the
ids it sees (any order).

With ``crash_steps=True`` it then kills a child process driving a connector with SIGKILL at
every step of the lifecycle and recovers in this process, adding the crash rules
(``crash_after_pre_commit_recovers``, ..., ``recover_is_idempotent``) to the same report —
see :mod:`barrierflow.testing.crash_conformance` for the rules and for what that asks of
``factory``: importable by name, reaching the same durable storage in every process.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, final

import pyarrow as pa

from barrierflow.actors.sinks.protocol import PendingCommit, SinkConnector
from barrierflow.channels.errors import BarrierflowError, InvalidArgumentError
from barrierflow.testing.crash_conformance import check_crash_arguments, check_crashes

__all__ = ["ConformanceError", "ConformanceReport", "RuleResult", "check_sink_connector"]

#: What ``read`` returns: the ids a reader of the sink sees now (a list, or a pyarrow Table
#: with an ``id`` column).
Read = Callable[[], Awaitable[Any] | Any]


@final
@dataclass(frozen=True, slots=True)
class RuleResult:
    """One rule of the contract: whether it held, and what was seen."""

    rule: str
    passed: bool
    detail: str = ""


@final
@dataclass(slots=True)
class ConformanceReport:
    """Every rule checked, in order."""

    results: list[RuleResult] = field(default_factory=list)

    @property
    def failures(self) -> list[RuleResult]:
        return [r for r in self.results if not r.passed]

    @property
    def passed(self) -> bool:
        return not self.failures

    def raise_for_failures(self) -> None:
        """Raise :class:`ConformanceError` if a rule was broken."""
        if self.failures:
            raise ConformanceError(self.failures)


class ConformanceError(BarrierflowError, AssertionError):
    """A connector broke rules of the contract.

    Attributes:
        failures: the broken rules, with what was seen.
    """

    def __init__(self, failures: Sequence[RuleResult]) -> None:
        self.failures = list(failures)
        lines = "; ".join(f"{r.rule}: {r.detail}" for r in self.failures)
        super().__init__(f"expected the sink connector contract to hold, got broken rules: {lines}")


async def check_sink_connector(
    factory: Callable[[], SinkConnector],
    read: Read,
    *,
    rows: Callable[[list[int]], pa.RecordBatch] | None = None,
    crash_steps: bool = False,
) -> ConformanceReport:
    """Check the exactly-once contract of the connectors ``factory`` makes (see the module).

    Args:
        factory: makes a new connector over the same storage at each call (as after a
            restart); the storage starts empty.
        read: the ids a reader of the sink sees now (sync or async; a list or a Table).
        rows: builds a batch of the connector's schema from ids, if that schema is not a
            single integer column ``id``.
        crash_steps: also SIGKILL child processes at every lifecycle step and check the
            recovery (:mod:`barrierflow.testing.crash_conformance`; a few seconds).

    Returns:
        Every rule, passed or not: the 8 in-process rules, then the crash rules if asked.

    Raises:
        InvalidArgumentError: ``factory`` or ``read`` is not callable, the first connector
            is not a SinkConnector or not exactly-once, ``rows`` is needed and missing; with
            ``crash_steps``: ``factory`` or ``rows`` is not importable by name, the connector
            is a ListSink (in memory), or ``BARRIERFLOW_TEST_TIMEOUT_SCALE`` is malformed.
    """
    if not callable(factory) or not callable(read):
        raise InvalidArgumentError("factory/read", "callables", (factory, read))
    probe = factory()
    if not isinstance(probe, SinkConnector) or not probe.exactly_once:
        raise InvalidArgumentError(
            "factory", "a factory of exactly-once SinkConnectors", type(probe).__name__
        )
    make = rows or _id_rows(probe.schema)
    if type(crash_steps) is not bool:
        raise InvalidArgumentError("crash_steps", "True or False", crash_steps)
    # Refused before anything runs, so a check that cannot run is never reported as passed.
    names = check_crash_arguments(factory, rows, probe) if crash_steps else None
    report = ConformanceReport()

    async def seen() -> list[int]:
        return await _ids(read)

    def check(rule: str, got: list[int], expected: list[int]) -> None:
        ok = sorted(got) == sorted(expected)
        detail = "" if ok else f"expected ids {sorted(expected)}, saw {sorted(got)}"
        report.results.append(RuleResult(rule, ok, detail))

    sink = probe
    await sink.open()
    await sink.recover([])
    await sink.begin_epoch(10)
    await sink.write_batch(make([1, 2]))
    await sink.flush()
    meta10 = await sink.pre_commit(10)
    check("invisible_before_commit", await seen(), [])
    await sink.commit_epoch(10)
    check("commit_makes_visible", await seen(), [1, 2])
    await sink.commit_epoch(10)
    check("replayed_commit_is_noop", await seen(), [1, 2])

    await sink.begin_epoch(20)
    await sink.write_batch(make([3]))
    await sink.pre_commit(20)
    await sink.begin_epoch(30)  # the next epoch begins before 20 is committed
    await sink.write_batch(make([4]))
    await sink.commit_epoch(20)
    check("commit_after_next_begin", await seen(), [1, 2, 3])
    await sink.rollback_epoch(30)
    await sink.begin_epoch(40)
    await sink.write_batch(make([5]))
    await sink.pre_commit(40)
    await sink.commit_epoch(40)
    check("rollback_discards", await seen(), [1, 2, 3, 5])

    # A crash: 50 pre-committed with its checkpoint durable, 60 pre-committed without, 70 only
    # staged. A new connector over the same storage recovers.
    await sink.begin_epoch(50)
    await sink.write_batch(make([6]))
    meta50 = await sink.pre_commit(50)
    await sink.begin_epoch(60)
    await sink.write_batch(make([7]))
    await sink.pre_commit(60)
    await sink.begin_epoch(70)
    await sink.write_batch(make([8]))
    await sink.flush()
    await sink.close()
    check("close_commits_nothing", await seen(), [1, 2, 3, 5])
    recovered = factory()
    await recovered.open()
    await recovered.recover([PendingCommit(10, meta10), PendingCommit(50, meta50)])
    after = await seen()
    check("recover_commits_pending", [i for i in after if i == 6], [6])
    check("recover_drops_the_rest", [i for i in after if i in (7, 8)], [])
    await recovered.close()
    if names is not None:

        def record(rule: str, passed: bool, detail: str) -> None:
            report.results.append(RuleResult(rule, passed, detail))

        await check_crashes(factory, names, seen, record)
    return report


def _id_rows(schema: pa.Schema) -> Callable[[list[int]], pa.RecordBatch]:
    if schema.names != ["id"] or not pa.types.is_integer(schema.field("id").type):
        raise InvalidArgumentError(
            "rows",
            "a function building a batch of the connector's schema from ids (its schema is "
            "not a single integer column id)",
            schema,
        )
    return lambda ids: pa.record_batch([pa.array(ids, schema.field("id").type)], schema=schema)


async def _ids(read: Read) -> list[int]:
    found = read()
    if isinstance(found, Awaitable):
        found = await found
    if isinstance(found, pa.Table):
        return [int(i) for i in found.column("id").to_pylist()]
    return [int(i) for i in found]
