"""Conformance suites a user runs against their own code: does a table keep the exactly-once
commit protocol (:mod:`barrierflow.actors.sinks.table`)?

``await check_table(make, read)`` drives tables made by ``make`` (each call a new instance over
the *same* storage, as after a restart) the way the runtime does — a writer stages, the
committer prepares and commits — and checks, by what ``read()`` returns (the rows a reader of
the table sees now), each rule by name:

* ``invisible_before_commit`` — written, staged and prepared rows are not visible;
* ``commit_makes_visible`` — ``commit`` makes exactly the epoch's rows visible;
* ``replayed_commit_is_noop`` — committing the same epoch again (also by a new committer, as
  after a crash between the commit and its mark in the meta store) adds nothing;
* ``commit_after_next_begin`` — an epoch committed after the writer began the next one holds
  only its own rows (the writer keeps the epochs apart);
* ``discard_discards`` — a discarded epoch never becomes visible;
* ``parallel_writers_commit_at_once`` — two writers' manifests of one epoch are committed
  together, each writer's rows once;
* ``recover_keeps_pending`` — a new committer's ``recover`` keeps the staged files of the
  pending epochs it is given, and committing them makes their rows visible;
* ``recover_drops_the_rest`` — and every other staged epoch is gone (those are replayed by
  the upstream): a new writer staging the same epoch number again commits only its own rows;
* ``close_commits_nothing`` — closing a writer with an epoch staged makes nothing visible.

It returns a :class:`ConformanceReport` (every rule, passed or not, with what was seen);
``report.raise_for_failures()`` raises :class:`ConformanceError` naming the broken rules. The
rows are a single ``int64`` column ``id`` unless the table's schema says otherwise: then
``rows(ids)`` must build a batch of the table's schema from ids, and ``read`` return the ids
it sees (any order).

With ``crash_steps=True`` it then kills a child process driving a writer and a committer with
SIGKILL at every step and recovers in this process, adding the crash rules
(``crash_after_open_recovers``, ..., ``recover_is_idempotent``) to the same report — see
:mod:`barrierflow.testing.crash_conformance` for the rules and for what that asks of
``make``: importable by name, reaching the same durable storage in every process.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, final

import pyarrow as pa

from barrierflow.actors.sinks.table import CommitMetadata, Manifest, StagingWriter, Table
from barrierflow.channels.errors import BarrierflowError, InvalidArgumentError
from barrierflow.testing.crash_conformance import check_crash_arguments, check_crashes

__all__ = ["ConformanceError", "ConformanceReport", "RuleResult", "check_table"]

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
    """A table broke rules of the commit protocol.

    Attributes:
        failures: the broken rules, with what was seen.
    """

    def __init__(self, failures: Sequence[RuleResult]) -> None:
        self.failures = list(failures)
        lines = "; ".join(f"{r.rule}: {r.detail}" for r in self.failures)
        super().__init__(f"expected the table commit protocol to hold, got broken rules: {lines}")


async def check_table(
    make: Callable[[], Table],
    read: Read,
    *,
    rows: Callable[[list[int]], pa.RecordBatch] | None = None,
    crash_steps: bool = False,
) -> ConformanceReport:
    """Check the commit protocol of the tables ``make`` makes (see the module).

    Args:
        make: makes a new table object over the same storage at each call (as after a
            restart); the storage starts empty.
        read: the ids a reader of the table sees now (sync or async; a list or a Table).
        rows: builds a batch of the table's schema from ids, if that schema is not a single
            integer column ``id``.
        crash_steps: also SIGKILL child processes at every step and check the recovery
            (:mod:`barrierflow.testing.crash_conformance`; a few seconds).

    Returns:
        Every rule, passed or not: the in-process rules, then the crash rules if asked.

    Raises:
        InvalidArgumentError: ``make`` or ``read`` is not callable, the first table is not a
            Table, ``rows`` is needed and missing; with ``crash_steps``: ``make`` or ``rows``
            is not importable by name, the table is a ListTable (in memory), or
            ``BARRIERFLOW_TEST_TIMEOUT_SCALE`` is malformed.
    """
    if not callable(make) or not callable(read):
        raise InvalidArgumentError("make/read", "callables", (make, read))
    probe = make()
    if not isinstance(probe, Table):
        raise InvalidArgumentError(
            "make", "a factory of tables (schema, writer(id), committer())", type(probe).__name__
        )
    batch = rows or _id_rows(probe.schema)
    if type(crash_steps) is not bool:
        raise InvalidArgumentError("crash_steps", "True or False", crash_steps)
    # Refused before anything runs, so a check that cannot run is never reported as passed.
    names = check_crash_arguments(make, rows, probe) if crash_steps else None
    report = ConformanceReport()

    async def seen() -> list[int]:
        return await _ids(read)

    def check(rule: str, got: list[int], expected: list[int]) -> None:
        ok = sorted(got) == sorted(expected)
        detail = "" if ok else f"expected ids {sorted(expected)}, saw {sorted(got)}"
        report.results.append(RuleResult(rule, ok, detail))

    writer, committer = probe.writer("0"), probe.committer()

    async def staged(epoch: int, ids: list[int]) -> Manifest:
        await writer.begin(epoch)
        await writer.write(batch(ids))
        return await writer.stage(epoch)

    async def prepared(epoch: int, *manifests: Manifest) -> CommitMetadata:
        metadata = await committer.prepare(epoch, list(manifests))
        if metadata is None:
            raise InvalidArgumentError(
                f"prepare({epoch})", "commit metadata for an epoch with rows", None
            )
        return metadata

    await writer.open()
    await committer.recover({})
    await writer.begin(10)
    await writer.write(batch([1, 2]))
    await writer.flush()
    meta10 = await prepared(10, await writer.stage(10))
    check("invisible_before_commit", await seen(), [])
    await committer.commit(10, meta10)
    check("commit_makes_visible", await seen(), [1, 2])
    await committer.commit(10, meta10)
    await make().committer().commit(10, meta10)
    check("replayed_commit_is_noop", await seen(), [1, 2])

    meta20 = await prepared(20, await staged(20, [3]))
    await writer.begin(30)  # the next epoch begins before 20 is committed
    await writer.write(batch([4]))
    await committer.commit(20, meta20)
    check("commit_after_next_begin", await seen(), [1, 2, 3])
    await writer.discard(30)
    meta40 = await prepared(40, await staged(40, [5]))
    await committer.commit(40, meta40)
    check("discard_discards", await seen(), [1, 2, 3, 5])

    other = probe.writer("1")
    await other.open()
    await other.begin(45)
    await other.write(batch([9]))
    meta45 = await prepared(45, await staged(45, [10]), await other.stage(45))
    await other.close()
    await committer.commit(45, meta45)
    check("parallel_writers_commit_at_once", await seen(), [1, 2, 3, 5, 9, 10])

    # A crash: 50 prepared and pending (its checkpoint durable), 60 prepared without reaching
    # the meta store, 70 only staged. A new committer over the same storage recovers.
    meta50 = await prepared(50, await staged(50, [6]))
    await prepared(60, await staged(60, [7]))
    await writer.begin(70)
    await writer.write(batch([8]))
    await writer.flush()
    await writer.close()
    check("close_commits_nothing", await seen(), [1, 2, 3, 5, 9, 10])
    restarted = make().committer()
    await restarted.recover({50: meta50})
    await restarted.commit(50, meta50)
    after = await seen()
    check("recover_keeps_pending", [i for i in after if i == 6], [6])
    # Epochs 60 and 70 are gone: a new writer reuses 60's number for other rows (as a
    # restarted writer does for the replayed ones), and only those appear.
    again = make().writer("0")
    await again.open()
    meta60 = await prepared(60, await _staged_by(again, 60, batch([11])))
    await again.close()
    await restarted.commit(60, meta60)
    check("recover_drops_the_rest", [i for i in await seen() if i in (7, 8, 11)], [11])
    if names is not None:

        def record(rule: str, passed: bool, detail: str) -> None:
            report.results.append(RuleResult(rule, passed, detail))

        await check_crashes(make, names, seen, record)
    return report


async def _staged_by(writer: StagingWriter, epoch: int, rows: pa.RecordBatch) -> Manifest:
    await writer.begin(epoch)
    await writer.write(rows)
    return await writer.stage(epoch)


def _id_rows(schema: pa.Schema) -> Callable[[list[int]], pa.RecordBatch]:
    if schema.names != ["id"] or not pa.types.is_integer(schema.field("id").type):
        raise InvalidArgumentError(
            "rows",
            "a function building a batch of the table's schema from ids (its schema is "
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
