"""The coordinator's commit queue, vnode coverage and writer handles (seed 000,
``coordinator_worker.rs``): rules the mutation run found unguarded (``commit_queue.py``,
``coverage.py``, ``handles.py``).

Most tests drive one piece directly — a :class:`CommitQueue` over a fake committer and a fake
meta store, a coverage round fed a scripted list of writer events, a writer handle whose
coordinator is a fake — so that each rule is checked where it lives, fast.
"""

from __future__ import annotations

import math
import time
import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from test_coordinator import (
    HALVES,
    SINK,
    WAIT,
    FakeCommitter,
    FixedDraw,
    leaf,
    make,
    spawn,
    start,
)

from barrierflow._sync import OneShot
from barrierflow.actors.sinks.coordinator import coverage
from barrierflow.actors.sinks.coordinator.commit_queue import (
    CommitItem,
    CommitQueue,
    RetryBackoff,
)
from barrierflow.actors.sinks.coordinator.coverage import (
    CoverageRound,
    EpochRounds,
    align_initial,
    ranges,
    realign,
    register_all,
)
from barrierflow.actors.sinks.coordinator.handles import (
    AlignInitial,
    Commit,
    Event,
    NewHandle,
    StopHandle,
    UpdateBitmap,
    WriterHandle,
    WriterRegistry,
)
from barrierflow.actors.sinks.table import (
    AlreadyCommitted,
    CommitOutcome,
    Committed,
    Failed,
    Manifest,
    RetryLater,
)
from barrierflow.channels.epoch import MAX_EPOCH
from barrierflow.channels.vnode import VnodeBitmap
from barrierflow.errors import (
    ActorGoneError,
    CoordinatorAbortedError,
    DuplicateVnodeError,
    DuplicateWriterError,
    InvalidArgumentError,
    TableCommitFailedError,
    UnexpectedWriterRequestError,
)
from barrierflow.runtime.service import ServiceContext
from barrierflow.runtime.state.state_store import StateStore

pytestmark = pytest.mark.anyio

VNODES = 8
QUARTERS = VnodeBitmap.split(4, VNODES)
HALF = [QUARTERS[0] | QUARTERS[1], QUARTERS[2] | QUARTERS[3]]


# Fakes.


class Log:
    """A logger that keeps ``(level, event, fields)`` and wakes waiters."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, str, dict[str, Any]]] = []
        self._changed = anyio.Event()

    def _add(self, level: str, event: str, fields: dict[str, Any]) -> None:
        self.entries.append((level, event, fields))
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    def warning(self, event: str, **fields: Any) -> None:
        self._add("warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._add("error", event, fields)

    def named(self, event: str) -> list[dict[str, Any]]:
        return [fields for _, name, fields in self.entries if name == event]

    async def wait_for(self, event: str, count: int) -> None:
        with anyio.fail_after(WAIT):
            while len(self.named(event)) < count:
                await self._changed.wait()


class States:
    """A meta store that records every write; ``gate`` holds committed marks back."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.gate: anyio.Event | None = None
        #: How long the last committed mark's write could take (to its effective deadline).
        self.budget = math.nan

    async def persist_pending(self, epoch: int, metadata: Any, schema_change: Any) -> None:
        self.calls.append(("pending", epoch, metadata, schema_change))

    async def commit_and_prune(self, epoch: int) -> None:
        self.budget = anyio.current_effective_deadline() - anyio.current_time()
        await anyio.lowlevel.checkpoint()
        if self.gate is not None:
            await self.gate.wait()
        self.calls.append(("committed", epoch))


def changes(manifests: Sequence[Manifest]) -> list[Any]:
    return [m.schema_change for m in manifests]


def manifests(*writers: str, epoch: int = 1, change: Any = None) -> list[Manifest]:
    return [Manifest(w, epoch, schema_change=change) for w in writers]


class Committer:
    """A committer whose prepare returns ``pre_committed`` and whose commits raise while
    ``failures`` > 0, else return the next of ``outcomes`` (``None`` once they ran out: a
    committer written before outcomes existed); ``gate`` holds commits back."""

    def __init__(self, *, pre_committed: Any = "staged") -> None:
        self.pre_committed = pre_committed
        self.failures = 0
        self.outcomes: list[CommitOutcome] = []
        self.gate: anyio.Event | None = None
        self.calls: list[tuple[Any, ...]] = []

    async def recover(self, pending: Mapping[int, Any]) -> None:
        self.calls.append(("recover", dict(pending)))

    async def prepare(self, epoch: int, manifests: Sequence[Manifest]) -> Any:
        self.calls.append(("prepare", epoch, [m.writer for m in manifests], changes(manifests)))
        return self.pre_committed

    async def commit(self, epoch: int, metadata: Any) -> CommitOutcome | None:
        self.calls.append(("commit", epoch, metadata))
        if self.gate is not None:
            await self.gate.wait()
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError(f"commit of epoch {epoch} failed")
        return self.outcomes.pop(0) if self.outcomes else None

    async def abort(self, epoch: int, metadata: Any) -> None:
        self.calls.append(("abort", epoch, metadata))


def queue(
    committer: Committer,
    states: States,
    *,
    committed_epoch: int = 0,
    last_committed: int = 0,
    draw: float = 0.5,
    warn_interval: float = 60.0,
    log: Log | None = None,
    retry_timeout: float = 300.0,
    clock: Callable[[], float] = anyio.current_time,
) -> CommitQueue:
    return CommitQueue(
        committer,  # type: ignore[arg-type]
        states,  # type: ignore[arg-type]
        committed_epoch, last_committed, RetryBackoff(0.01, 60.0, FixedDraw(draw)), warn_interval,
        log or Log(), sink=SINK, retry_timeout=retry_timeout, clock=clock,
    )  # fmt: skip


def item(epoch: int, change: Mapping[str, Any] | None = None) -> CommitItem:
    return CommitItem(epoch, {"epoch": epoch}, change)


# The commit queue.


async def test_an_epoch_already_durable_is_due_at_once_and_a_later_one_waits() -> None:
    q = queue(Committer(), States(), committed_epoch=5)
    at_durable, after = item(5), item(6)
    q.push(at_durable)
    q.push(after)
    assert (list(q.prepared), list(q.pending)) == ([at_durable], [after])
    assert q.due(anyio.current_time()) is at_durable
    q.on_committed_epoch(6)
    assert (list(q.prepared), list(q.pending)) == ([at_durable, after], [])


async def test_commit_deadline_is_now_when_due_the_retry_time_after_a_failure_else_never() -> None:
    committer = Committer()
    q = queue(committer, States(), committed_epoch=1)
    assert q.deadline() == math.inf  # nothing to commit
    head = item(1)
    q.push(head)
    assert q.deadline() == -math.inf  # due now
    committer.failures = 1
    before = anyio.current_time()
    assert await q.commit(head) is False
    assert q.retry_at is not None
    # The first retry waits 10 ms times the draw (0.5), from the failure.
    assert before + 0.005 <= q.retry_at <= anyio.current_time() + 0.005
    assert q.deadline() == q.retry_at
    # Due exactly at its retry time, not a moment before.
    assert q.due(math.nextafter(q.retry_at, -math.inf)) is None
    assert q.due(q.retry_at) is head
    assert list(q.prepared) == [head]


async def test_commit_returns_whether_it_went_through() -> None:
    committer = Committer()
    states = States()
    # The sink committed epoch 3 in an earlier run.
    q = queue(committer, states, committed_epoch=4, last_committed=3)
    head = item(4)
    q.push(head)
    committer.failures = 1
    assert await q.commit(head) is False
    assert (list(q.prepared), q.last_committed, q.commits) == ([head], 3, 0)
    assert await q.commit(head) is True
    assert (list(q.prepared), q.last_committed, q.commits, q.retry_at) == ([], 4, 1, None)
    assert q.unmarked == 4


async def test_a_commit_that_went_through_records_its_wall_clock_time_on_both_paths() -> None:
    # What barrierflow_sink_last_commit_timestamp_seconds reports: Unix time, so that an
    # alert can take time() - x; a failed attempt leaves it as it was.
    committer = Committer()
    q = queue(committer, States(), committed_epoch=4)
    head = item(4)
    q.push(head)
    committer.failures = 1
    assert await q.commit(head) is False
    assert q.last_commit_time is None
    before = time.time()
    assert await q.commit(head) is True
    assert q.last_commit_time is not None
    assert before <= q.last_commit_time <= time.time()


async def test_the_mark_left_unwritten_at_the_end_of_a_run_is_written_shielded_within_2_s() -> None:
    committer = Committer()
    states = States()
    q = queue(committer, states, committed_epoch=1)
    await q.mark_committed()  # nothing unmarked: nothing to write
    assert states.calls == []
    head = item(1)
    q.push(head)
    assert await q.commit(head) is True  # its mark writer (write_marks) is not running
    with anyio.CancelScope() as scope:
        scope.cancel()  # the run is being cancelled
        await q.mark_committed()
    assert states.calls == [("committed", 1)]
    assert 1.0 < states.budget <= 2.0 + 1e-6  # at most 2 s (the clock's rounding aside)
    assert q.unmarked is None
    assert not q.holds_through(1)


async def test_the_next_commit_waits_until_the_previous_committed_mark_is_written() -> None:
    committer = Committer()
    states = States()
    states.gate = anyio.Event()
    q = queue(committer, states, committed_epoch=2)
    first, second = item(1), item(2)
    q.push(first)
    q.push(second)
    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(q.write_marks)
            assert await q.commit(first) is True
            done = spawn(tg, lambda: q.commit(second))
            await anyio.wait_all_tasks_blocked()
            # Epoch 1's mark is not written: epoch 2's commit has not started.
            assert [c[1] for c in committer.calls if c[0] == "commit"] == [1]
            assert q.holds_through(1)
            states.gate.set()
            assert await done.wait() is True
            await anyio.wait_all_tasks_blocked()
            assert states.calls == [("committed", 1), ("committed", 2)]
            assert [c[1] for c in committer.calls if c[0] == "commit"] == [1, 2]
            assert q.unmarked is None
            assert not q.holds_through(2)
            tg.cancel_scope.cancel()


async def test_two_phase_prepares_and_persists_the_epochs_schema_change() -> None:
    committer = Committer(pre_committed={"staged": 3})
    states = States()
    q = queue(committer, states)
    change = {"add": "column"}
    await q.complete(3, manifests("1", "2", epoch=3, change=change), change)
    assert committer.calls == [("prepare", 3, ["1", "2"], [change, change])]
    assert states.calls == [("pending", 3, {"staged": 3}, change)]
    assert [(i.epoch, i.metadata, i.schema_change) for i in q.pending] == [
        (3, {"staged": 3}, change)
    ]
    assert q.has_uncommitted_schema_change()


async def test_an_epoch_with_nothing_to_commit_is_not_persisted() -> None:
    committer = Committer(pre_committed=None)
    states = States()
    q = queue(committer, states)
    await q.complete(4, manifests("1", epoch=4), None)
    assert states.calls == []
    assert [c[0] for c in committer.calls] == ["prepare"]  # and nothing committed
    assert q.is_empty()


async def test_a_long_commit_logs_a_warning_every_interval() -> None:
    committer = Committer()
    committer.gate = anyio.Event()
    log = Log()
    q = queue(committer, States(), committed_epoch=7, warn_interval=0.001, log=log)
    head = item(7)
    q.push(head)
    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            done = spawn(tg, lambda: q.commit(head))
            await log.wait_for("commit still running", 2)
            committer.gate.set()
            assert await done.wait() is True
    assert {w["epoch"] for w in log.named("commit still running")} == {7}
    assert (q.last_committed, q.commits) == (7, 1)


# Commit outcomes.


class Clock:
    """A monotonic clock that moves only when told (the retry bound's)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def failing(cause: Exception, times: int) -> list[CommitOutcome]:
    return [RetryLater(cause) for _ in range(times)]


async def test_a_commit_the_table_says_failed_fails_at_once_naming_sink_epoch_and_cause() -> None:
    committer = Committer()
    gone = FileNotFoundError("the table's directory is gone")
    committer.outcomes = [Failed(gone)]
    q = queue(committer, States(), committed_epoch=4, retry_timeout=300.0)
    head = item(4)
    q.push(head)
    with pytest.raises(TableCommitFailedError) as info:
        await q.commit(head)
    error = info.value
    assert (error.sink, error.epoch, error.cause, error.retry_timeout) == (SINK, 4, gone, None)
    assert error.permanent
    assert error.__cause__ is gone
    assert str(error) == (
        f"sink {SINK!r}: expected the table to commit epoch 4, got a failure permanently (the "
        "table says retrying will not help): FileNotFoundError: the table's directory is gone"
    )
    # Not retried, not counted as committed: the epoch stays pending for a restart.
    assert [c[0] for c in committer.calls] == ["commit"]
    assert (q.commits, q.retry_at, list(q.prepared)) == (0, None, [head])


async def test_a_transient_failure_is_retried_within_the_bound_then_fails() -> None:
    clock = Clock()
    committer = Committer()
    busy = TimeoutError("the catalog is busy")
    committer.outcomes = failing(busy, 10)
    q = queue(committer, States(), committed_epoch=1, retry_timeout=100.0, clock=clock)
    head = item(1)
    q.push(head)
    for now in (0.0, 40.0, 99.0):  # first failure at 0: the bound runs out at 100
        clock.now = now
        assert await q.commit(head) is False
        assert q.retry_at is not None
        assert q.retry_at <= 100.0
    clock.now = 100.0
    with pytest.raises(TableCommitFailedError) as info:
        await q.commit(head)
    error = info.value
    assert (error.sink, error.epoch, error.cause) == (SINK, 1, busy)
    assert (error.retry_timeout, error.permanent) == (100, False)
    assert "after retrying for 100 s (commit_retry_timeout ran out)" in str(error)
    assert len([c for c in committer.calls if c[0] == "commit"]) == 4


async def test_the_last_retry_is_scheduled_at_the_bound_not_a_backoff_past_it() -> None:
    clock = Clock()
    committer = Committer()
    committer.outcomes = failing(TimeoutError("busy"), 2)
    # Draw 1.0: the first retry waits the full 10 ms; the bound is 5 ms.
    q = queue(committer, States(), committed_epoch=1, retry_timeout=0.005, clock=clock, draw=1.0)
    head = item(1)
    q.push(head)
    assert await q.commit(head) is False
    assert q.retry_at == 0.005


async def test_a_commit_that_recovers_within_the_bound_commits_and_the_next_epoch_starts_over() -> (
    None
):
    clock = Clock()
    committer = Committer()
    committer.outcomes = [*failing(TimeoutError("busy"), 2), Committed()]
    q = queue(committer, States(), committed_epoch=2, retry_timeout=100.0, clock=clock)
    first, second = item(1), item(2)
    q.push(first)
    q.push(second)
    assert await q.commit(first) is False
    clock.now = 99.0
    assert await q.commit(first) is False
    assert await q.commit(first) is True
    assert (q.last_committed, q.commits) == (1, 1)
    q.unmarked = None  # its mark written
    # Epoch 2 fails long after epoch 1's first failure: its own bound starts now.
    committer.outcomes = failing(TimeoutError("busy"), 1)
    clock.now = 500.0
    assert await q.commit(second) is False
    assert q.retry_at is not None
    assert 500.0 <= q.retry_at <= 600.0


async def test_an_exception_escaping_commit_is_retried_and_logged_as_unclassified() -> None:
    committer = Committer()
    committer.failures = 1
    log = Log()
    q = queue(committer, States(), committed_epoch=1, log=log)
    head = item(1)
    q.push(head)
    assert await q.commit(head) is False
    (entry,) = log.named("commit failed; retrying after backoff")
    assert entry["classified"] is False
    assert entry["error"] == repr(RuntimeError("commit of epoch 1 failed"))
    committer.outcomes = failing(TimeoutError("busy"), 1)
    q.retry_at = None
    assert await q.commit(head) is False
    assert log.named("commit failed; retrying after backoff")[1]["classified"] is True


async def test_a_replay_goes_through_and_is_counted() -> None:
    committer = Committer()
    committer.outcomes = [AlreadyCommitted(), Committed()]
    q = queue(committer, States(), committed_epoch=2)
    first, second = item(1), item(2)
    q.push(first)
    q.push(second)
    assert await q.commit(first) is True
    assert (q.replays, q.commits, q.last_committed) == (1, 1, 1)
    q.unmarked = None
    assert await q.commit(second) is True
    assert (q.replays, q.commits, q.last_committed) == (1, 2, 2)


async def test_a_commit_returning_none_is_taken_as_committed() -> None:
    committer = Committer()  # no outcomes: returns None
    q = queue(committer, States(), committed_epoch=1)
    head = item(1)
    q.push(head)
    assert await q.commit(head) is True
    assert (q.commits, q.replays, q.unmarked) == (1, 0, 1)


async def test_a_warning_each_time_the_time_spent_retrying_doubles() -> None:
    clock = Clock()
    committer = Committer()
    committer.outcomes = failing(TimeoutError("busy"), 6)
    log = Log()
    q = queue(committer, States(), committed_epoch=2, retry_timeout=100.0, clock=clock, log=log)
    first, second = item(1), item(2)
    q.push(first)
    q.push(second)
    event = "commit still failing; the pipeline fails once the retry bound runs out"
    # The first failure starts the clock; the first retry that took any time warns, then
    # each time the time spent retrying doubled since the last warning.
    for now in (0.0, 0.5, 0.75, 1.0, 1.5, 2.0):
        clock.now = now
        assert await q.commit(first) is False
    assert [w["retrying_s"] for w in log.named(event)] == [0.5, 1.0, 2.0]
    assert {w["retry_timeout_s"] for w in log.named(event)} == {100.0}
    committer.outcomes = [Committed(), *failing(TimeoutError("busy"), 2)]
    assert await q.commit(first) is True
    q.unmarked = None
    # Epoch 2's retries are timed and warned about afresh: its first retry after 0.25 s warns.
    for now in (10.0, 10.25):
        clock.now = now
        assert await q.commit(second) is False
    assert [w["retrying_s"] for w in log.named(event)][3:] == [0.25]
    assert log.named(event)[-1]["epoch"] == 2


# Coverage rounds.


class FakeCoordinator:
    """What a writer handle needs of its coordinator: asked requests are answered at once
    (a commit acknowledged, an initial epoch aligned to itself)."""

    def __init__(self, vnode_count: int = VNODES) -> None:
        self.sink = SINK
        self.vnode_count = vnode_count
        self.posted: list[Event] = []

    def check_bitmap(self, bitmap: Any) -> None:
        pass

    async def tell(self, event: Event) -> None:
        self.posted.append(event)

    async def ask(self, event: Commit | AlignInitial) -> int | None:
        self.posted.append(event)
        return event.epoch if isinstance(event, AlignInitial) else None


def writer(handle_id: int, bitmap: VnodeBitmap) -> WriterHandle:
    return WriterHandle(FakeCoordinator(), handle_id, bitmap)  # type: ignore[arg-type]


def script(events: list[Event]) -> Any:
    """A round's ``next_event`` that hands out ``events`` in order."""

    async def next_event(round_: CoverageRound[Any]) -> Event:
        return events.pop(0)

    return next_event


def commit_request(handle: WriterHandle, epoch: int) -> Commit:
    return Commit(handle, epoch, Manifest(str(handle.handle_id), epoch), OneShot())


async def test_a_vnode_claimed_twice_names_the_sink_the_vnodes_and_the_round() -> None:
    first, second = writer(1, HALF[0]), writer(2, QUARTERS[1])
    overlap = QUARTERS[1].vnodes()
    failures: list[DuplicateVnodeError] = []

    with pytest.raises(DuplicateVnodeError) as registration:
        await register_all(
            SINK, VNODES, script([NewHandle(first), NewHandle(second)]), WriterRegistry(SINK)
        )
    failures.append(registration.value)

    with pytest.raises(DuplicateVnodeError) as alignment:
        aligning: list[Event] = [
            AlignInitial(first, 1, OneShot()),
            AlignInitial(second, 1, OneShot()),
        ]
        await align_initial(SINK, VNODES, script(aligning))
    failures.append(alignment.value)

    writers = WriterRegistry(SINK)
    writers.admit(first)
    with pytest.raises(DuplicateVnodeError) as realignment:
        await realign(SINK, VNODES, script([NewHandle(second)]), writers, [first])
    failures.append(realignment.value)

    rounds = EpochRounds(SINK, VNODES)
    assert rounds.add(commit_request(first, 7)) == []
    with pytest.raises(DuplicateVnodeError) as epoch:
        rounds.add(commit_request(second, 7))
    failures.append(epoch.value)

    assert [(f.sink, f.vnodes, f.stage) for f in failures] == [
        (SINK, overlap, "registration"),
        (SINK, overlap, "initial epoch alignment"),
        (SINK, overlap, "realignment"),
        (SINK, overlap, "epoch 7"),
    ]


def _stop(handle: WriterHandle) -> Event:
    return StopHandle(handle)


def _commit(handle: WriterHandle) -> Event:
    return commit_request(handle, 5)


def _align(handle: WriterHandle) -> Event:
    return AlignInitial(handle, 6, OneShot())


def _new(handle: WriterHandle) -> Event:
    return NewHandle(handle)


@pytest.mark.parametrize(
    ("entry", "make_event", "expected"),
    [
        ("register_all", _stop, ("init", "writers to register", "StopHandle", None)),
        ("register_all", _commit, ("init", "writers to register", "Commit", 5)),
        ("register_all", _align, ("init", "writers to register", "AlignInitial", 6)),
        (
            "align_initial",
            _commit,
            ("initial epoch alignment", "AlignInitial from every writer", "Commit", 5),
        ),
        (
            "align_initial",
            _new,
            ("initial epoch alignment", "AlignInitial from every writer", "NewHandle", None),
        ),
        ("realign", _commit, ("realignment", "no commit or initial epoch", "Commit", 5)),
        ("realign", _align, ("realignment", "no commit or initial epoch", "AlignInitial", 6)),
    ],
)
async def test_an_unexpected_request_in_a_round_names_the_round_what_was_expected_and_what_came(
    entry: str, make_event: Any, expected: tuple[str, str, str, int | None]
) -> None:
    handle = writer(3, HALF[0])
    event = make_event(handle)
    next_event = script([event])
    with pytest.raises(UnexpectedWriterRequestError) as raised:
        if entry == "register_all":
            await register_all(SINK, VNODES, next_event, WriterRegistry(SINK))
        elif entry == "align_initial":
            await align_initial(SINK, VNODES, next_event)
        else:
            writers = WriterRegistry(SINK)
            writers.admit(handle)
            await realign(SINK, VNODES, next_event, writers, [])
    error = raised.value
    stage, wanted, request, epoch = expected
    assert (error.sink, error.stage, error.expected, error.request, error.writer, error.epoch) == (
        SINK, stage, wanted, request, 3, epoch,
    )  # fmt: skip
    if isinstance(event, Commit):
        # The commit request's writer learns it too, instead of waiting for the run's abort.
        with pytest.raises(UnexpectedWriterRequestError) as answered:
            await event.reply.get()
        assert answered.value is error


async def test_realignment_admits_joining_writers_and_waits_for_every_remaining_one() -> None:
    staying, leaving = writer(1, HALF[0]), writer(2, HALF[1])
    joining = writer(3, QUARTERS[3])
    writers = WriterRegistry(SINK)
    for handle in (staying, leaving):
        writers.admit(handle)
        writers.running.add(handle.handle_id)
    events: list[Event] = [
        NewHandle(joining),
        StopHandle(leaving),
        UpdateBitmap(staying, QUARTERS[0] | QUARTERS[1] | QUARTERS[2]),
    ]
    running = await realign(SINK, VNODES, script(events), writers, [])
    assert running == {1, 3}
    assert events == []  # it waited for the remaining writer's new bitmap
    assert writers.handles == {1: staying, 3: joining}
    assert writers.running == set()
    assert staying.bitmap == QUARTERS[0] | QUARTERS[1] | QUARTERS[2]


def test_uncovered_vnodes_are_shown_as_ranges_the_first_16_runs() -> None:
    assert ranges([]) == ""
    assert ranges([5]) == "5"
    assert ranges([0, 1, 2, 7, 9, 10]) == "0-2, 7, 9-10"
    sixteen = list(range(0, 32, 2))
    assert ranges(sixteen) == ", ".join(str(v) for v in sixteen)
    assert ranges([*sixteen, 40]) == ", ".join(str(v) for v in sixteen) + ", ... (1 more runs)"
    assert ranges([*sixteen, 40, 41, 50]) == (
        ", ".join(str(v) for v in sixteen) + ", ... (2 more runs)"
    )


async def test_an_uncovered_round_warns_once_its_interval_is_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A clock that stands still except when the fake inbox says the deadline passed.
    now = [100.0]
    monkeypatch.setattr(coverage, "anyio", types.SimpleNamespace(current_time=lambda: now[0]))
    round_: CoverageRound[None] = CoverageRound(SINK, VNODES, "registration")
    round_.add(writer(1, HALF[0]), None)
    log = Log()
    late = NewHandle(writer(2, HALF[1]))
    calls: list[tuple[float, int]] = []

    async def next_event(deadline: float) -> Event | None:
        calls.append((deadline, len(log.entries)))
        if len(calls) == 1:
            now[0] = deadline  # nothing came until the deadline, exactly
            return None
        return late

    assert await round_.next_event(next_event, 5.0, log) is late
    # The warning came at the deadline, before waiting again (with a new deadline).
    assert calls == [(105.0, 0), (110.0, 1)]
    [warning] = log.named("waiting for writers to cover every vnode")
    assert (warning["stage"], warning["uncovered"], warning["uncovered_count"]) == (
        "registration", "4-7", 4,
    )  # fmt: skip


# Writer handles.


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda h: h.align_initial_epoch(-1), ("epoch", f"an int epoch in 0..{MAX_EPOCH}", -1)),
        (lambda h: h.align_initial_epoch(1.0), ("epoch", f"an int epoch in 0..{MAX_EPOCH}", 1.0)),
        (
            lambda h: h.commit(-1, Manifest("1", 1)),
            ("epoch", f"an int epoch in 0..{MAX_EPOCH}", -1),
        ),
        (
            lambda h: h.commit(True, Manifest("1", 1)),
            ("epoch", f"an int epoch in 0..{MAX_EPOCH}", True),
        ),
        (lambda h: h.commit(1, {}), ("manifest", "a Manifest", "dict")),
        (lambda h: h.commit(1, [("w", 1)]), ("manifest", "a Manifest", "list")),
        (lambda h: h.commit(1, None), ("manifest", "a Manifest", "NoneType")),
    ],
)
async def test_a_bad_argument_to_a_writer_handle_names_it_and_what_was_expected(
    call: Any, expected: tuple[str, str, Any]
) -> None:
    fake = FakeCoordinator()
    handle = WriterHandle(fake, 1, HALF[0])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError) as raised:
        await call(handle)
    assert (raised.value.argument, raised.value.expected, raised.value.got) == expected
    assert type(raised.value.got) is type(expected[2])
    assert fake.posted == []  # nothing reached the coordinator


async def test_epoch_zero_is_a_valid_epoch() -> None:
    fake = FakeCoordinator()
    handle = WriterHandle(fake, 1, HALF[0])  # type: ignore[arg-type]
    assert await handle.align_initial_epoch(0) == 0
    await handle.commit(0, Manifest("1", 0))
    assert [(type(e).__name__, getattr(e, "epoch", None)) for e in fake.posted] == [
        ("AlignInitial", 0),
        ("Commit", 0),
    ]


async def test_a_stopped_handle_is_gone_for_its_sink() -> None:
    fake = FakeCoordinator()
    handle = WriterHandle(fake, 1, HALF[0])  # type: ignore[arg-type]
    await handle.stop()
    await handle.stop()  # once is enough
    assert [type(e).__name__ for e in fake.posted] == ["StopHandle"]
    with pytest.raises(ActorGoneError) as raised:
        await handle.commit(1, Manifest("1", 1))
    assert (raised.value.actor, raised.value.reason) == (SINK, "this writer handle was stopped")


async def test_a_writer_waiting_to_start_learns_why_its_coordinator_failed(tmp_path: Path) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        coordinator = make(FakeCommitter())
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            first = await coordinator.register(HALVES[0])
            waiting = spawn(tg, first.wait_started)
            await anyio.wait_all_tasks_blocked()
            await coordinator.register(HALVES[0])  # the same vnodes again: the run fails
            cause = await run.failure()
            error = await waiting.wait_error()
        assert isinstance(cause, DuplicateVnodeError)
        assert isinstance(error, CoordinatorAbortedError)
        assert (error.sink, leaf(error.cause)) == (SINK, cause)


async def test_two_writers_with_one_writer_id_is_a_duplicate_writer_error() -> None:
    writers = WriterRegistry(SINK)
    first = WriterHandle(FakeCoordinator(), 1, HALF[0], "w-0", "writer a")  # type: ignore[arg-type]
    again = WriterHandle(FakeCoordinator(), 2, HALF[1], "w-0", "writer b")  # type: ignore[arg-type]
    other = WriterHandle(FakeCoordinator(), 3, HALF[1], "w-1", "writer c")  # type: ignore[arg-type]
    writers.admit(first)
    writers.admit(first)  # the same handle again (a realignment) is no duplicate
    writers.admit(other)
    with pytest.raises(DuplicateWriterError) as raised:
        writers.admit(again)
    error = raised.value
    assert (error.sink, error.writer, error.first, error.second) == (
        SINK, "w-0", "writer a", "writer b",
    )  # fmt: skip
    assert writers.handles == {1: first, 3: other}


async def test_a_writer_registry_forgets_a_writer_that_left() -> None:
    writers = WriterRegistry(SINK)
    staying, leaving = writer(1, HALF[0]), writer(2, HALF[1])
    for handle in (staying, leaving):
        writers.admit(handle)
        writers.running.add(handle.handle_id)
    writers.remove(leaving)
    writers.remove(leaving)  # a writer never admitted (or gone already): nothing to forget
    assert (writers.handles, writers.running) == ({1: staying}, {1})
