"""The coordinator worker's own rules, close up: recovery from the meta-store records, the
records themselves, the replies owed to writers, and the service's arguments and bookkeeping.

Complements ``test_coordinator.py`` (which drives whole runs; its fakes are reused here): these
tests call :func:`~barrierflow.actors.sinks.coordinator.recovery.recover`,
:class:`~barrierflow.actors.sinks.coordinator.meta_store.SinkStates` and
:mod:`~barrierflow.actors.sinks.coordinator.replies` directly where that states a rule
exactly, and keep each test fast.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest
from test_coordinator import (
    FULL,
    HALVES,
    SINK,
    WAIT,
    FakeCommitter,
    commit_all,
    leaf,
    make,
    meta,
    post,
    register_started,
    spawn,
    start,
    states,
)

from barrierflow._sync import OneShot
from barrierflow.actors.sinks.coordinator.commit_queue import CommitItem
from barrierflow.actors.sinks.coordinator.coordinator import Coordinator
from barrierflow.actors.sinks.coordinator.handles import (
    Commit,
    NewHandle,
    StopHandle,
    WriterHandle,
    WriterRegistry,
    take,
)
from barrierflow.actors.sinks.coordinator.meta_store import SinkState, SinkStateRecord, SinkStates
from barrierflow.actors.sinks.coordinator.recovery import Recovered, recover
from barrierflow.actors.sinks.coordinator.replies import OpenReplies, abort_run, refuse
from barrierflow.actors.sinks.errors import CommittedEpochsEndedError, SinkRecordsOrderError
from barrierflow.actors.sinks.table import Manifest, StagedFile
from barrierflow.channels.channel import create_channel
from barrierflow.channels.vnode import VnodeBitmap
from barrierflow.errors import (
    ActorGoneError,
    ChannelBrokenError,
    CoordinatorAbortedError,
    DuplicateVnodeError,
    DuplicateWriterError,
    EpochOrderError,
    InvalidArgumentError,
    SchemaChangeMismatchError,
    UnexpectedWriterRequestError,
)
from barrierflow.runtime.service import ServiceContext
from barrierflow.runtime.state.state_store import StateStore

pytestmark = pytest.mark.anyio

P, C, A = SinkState.PENDING, SinkState.COMMITTED, SinkState.ABORTED


# Recovery, against records as a list (a fake meta store: exact and fast).


class FakeStates:
    """What :func:`recover` reads and deletes: fixed records; deletions are recorded."""

    def __init__(self, records: Iterable[tuple[int, SinkState]]) -> None:
        self.records = [
            SinkStateRecord(epoch, state, {"m": epoch}, {"change": epoch} if epoch % 2 else None)
            for epoch, state in records
        ]
        self.deleted: list[int] = []

    async def list(self) -> list[SinkStateRecord]:
        return list(self.records)

    async def delete(self, epochs: Iterable[int]) -> None:
        self.deleted.extend(epochs)


class AbortFailing(FakeCommitter):
    """A committer whose abort of the epochs in ``failing`` raises (after recording it)."""

    def __init__(self, failing: set[int]) -> None:
        super().__init__()
        self.failing = failing

    async def abort(self, epoch: int, metadata: Any) -> None:
        await super().abort(epoch, metadata)
        if epoch in self.failing:
            raise RuntimeError(f"abort of {epoch} failed")


class Warnings:
    """A logger that keeps the warnings."""

    def __init__(self) -> None:
        self.warnings: list[tuple[str, dict[str, Any]]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.warnings.append((event, fields))


async def recovered_from(
    records: list[tuple[int, SinkState]], committer: FakeCommitter | None = None
) -> tuple[Recovered, FakeStates, FakeCommitter]:
    fake = FakeStates(records)
    committer = committer or FakeCommitter()
    result = await recover(SINK, fake, committer, Warnings())  # type: ignore[arg-type]
    return result, fake, committer


@pytest.mark.parametrize(
    ("records", "pending", "last_committed", "aborted", "deleted", "rewind"),
    [
        pytest.param([], [], None, [], [], None, id="nothing"),
        # The last committed record stays: it is what the next restart rewinds to.
        pytest.param([(1, C)], [], 1, [], [], 1, id="committed-kept"),
        pytest.param([(1, C), (2, C)], [], 2, [], [1], 2, id="older-committed-deleted"),
        pytest.param([(1, P)], [1], None, [], [], 1, id="pending-only"),
        pytest.param([(1, A)], [], None, [1], [1], None, id="aborted-only"),
        pytest.param([(1, P), (2, A)], [1], None, [2], [2], 1, id="pending-aborted"),
        pytest.param(
            [(1, P), (2, C), (3, P), (4, P), (5, A), (6, A)],
            [3, 4],
            2,
            [5, 6],
            [1, 5, 6],
            4,
            id="all-states",
        ),
    ],
)
async def test_recovery_commits_the_pending_after_the_last_committed_and_aborts_the_rest(
    records: list[tuple[int, SinkState]],
    pending: list[int],
    last_committed: int | None,
    aborted: list[int],
    deleted: list[int],
    rewind: int | None,
) -> None:
    result, fake, committer = await recovered_from(records)
    by_epoch = {r.epoch: r for r in fake.records}
    assert result.pending == [
        CommitItem(e, by_epoch[e].metadata, by_epoch[e].schema_change) for e in pending
    ]
    assert (result.last_committed, result.aborted, result.rewind) == (
        last_committed,
        aborted,
        rewind,
    )
    assert sorted(fake.deleted) == deleted
    # Aborted in the committer with their metadata, in epoch order, and nothing else called.
    assert committer.calls == [("abort", e, {"m": e}) for e in aborted]


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        pytest.param(
            [(1, A), (2, C)], "no aborted record before the committed epoch 2", id="aborted-first"
        ),
        pytest.param(
            [(1, P), (2, A), (3, C)],
            "no aborted record before the committed epoch 3",
            id="aborted-just-before-committed",
        ),
        pytest.param(
            [(1, A), (2, P)], "only aborted records after the pending ones", id="pending-after"
        ),
        pytest.param(
            [(1, C), (2, P), (3, A), (4, P)],
            "only aborted records after the pending ones",
            id="pending-after-aborted",
        ),
    ],
)
async def test_recovery_rejects_records_out_of_order_with_every_record(
    records: list[tuple[int, SinkState]], expected: str
) -> None:
    with pytest.raises(SinkRecordsOrderError) as info:
        await recovered_from(records)
    error = info.value
    listing = tuple((e, s.value) for e, s in records)
    assert (error.sink, error.expected, error.records) == (SINK, expected, listing)


async def test_recovery_checks_the_order_before_it_deletes_or_aborts_anything() -> None:
    committer = FakeCommitter()
    fake = FakeStates([(1, P), (2, A), (3, C), (4, A)])
    with pytest.raises(SinkRecordsOrderError):
        await recover(SINK, fake, committer, Warnings())  # type: ignore[arg-type]
    assert (fake.deleted, committer.calls) == ([], [])


async def test_recovery_goes_on_when_aborting_an_epoch_fails() -> None:
    # A failed abort leaves files the table never shows; the epoch's rows are replayed anyway.
    committer = AbortFailing({2})
    fake = FakeStates([(1, C), (2, A), (3, A)])
    log = Warnings()
    result = await recover(SINK, fake, committer, log)  # type: ignore[arg-type]
    assert committer.calls == [("abort", 2, {"m": 2}), ("abort", 3, {"m": 3})]
    assert (result.aborted, sorted(fake.deleted)) == ([2, 3], [2, 3])
    assert [event for event, _ in log.warnings] == ["abort failed"]


def test_rewind_is_the_last_pending_epoch_else_the_last_committed() -> None:
    items = [CommitItem(4, None, None), CommitItem(5, None, None)]
    assert Recovered(items, 3, []).rewind == 5
    assert Recovered([], 3, []).rewind == 3
    assert Recovered([], None, []).rewind is None


# The meta store.


def test_sink_states_have_the_persisted_names() -> None:
    assert [(s.name, s.value) for s in SinkState] == [
        ("PENDING", "pending"),
        ("COMMITTED", "committed"),
        ("ABORTED", "aborted"),
    ]


async def test_sink_states_reject_a_bad_store_or_sink(tmp_path: Path) -> None:
    store_like = object()
    with pytest.raises(InvalidArgumentError) as info:
        SinkStates(store_like, SINK)  # type: ignore[arg-type]
    assert (info.value.argument, info.value.expected, info.value.got) == (
        "store",
        "a StateStore",
        store_like,
    )
    async with await StateStore.open(tmp_path / "state.db") as store:
        for sink in ("", 3, None):
            with pytest.raises(InvalidArgumentError) as info:
                SinkStates(store, sink)  # type: ignore[arg-type]
            assert (info.value.argument, info.value.expected, info.value.got) == (
                "sink",
                "a non-empty str",
                sink,
            )


async def test_pending_records_keep_metadata_and_schema_change_per_sink(tmp_path: Path) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        ours, theirs = SinkStates(store, SINK), SinkStates(store, "other")
        await ours.persist_pending(1, {"files": ["a"]}, {"add": "c"})
        await ours.persist_pending(2, {"files": ["b"]}, None)
        await theirs.persist_pending(1, None, None)
        assert await ours.list() == [
            SinkStateRecord(1, P, {"files": ["a"]}, {"add": "c"}),
            SinkStateRecord(2, P, {"files": ["b"]}, None),
        ]
        assert await theirs.list() == [SinkStateRecord(1, P, None, None)]


async def test_a_pending_record_can_mark_the_previous_epoch_committed_in_one_transaction(
    tmp_path: Path,
) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        sink_states = SinkStates(store, SINK)
        await sink_states.persist_pending(1, {"m": 1}, None)
        await sink_states.persist_pending(2, {"m": 2}, None, committed=1)
        assert states(await sink_states.list()) == [(1, "committed"), (2, "pending")]
        await sink_states.persist_pending(3, {"m": 3}, None)
        await sink_states.commit_and_prune(2)
        assert states(await sink_states.list()) == [(2, "committed"), (3, "pending")]
        await sink_states.delete([3])
        assert states(await sink_states.list()) == [(2, "committed")]


async def test_pending_records_after_the_durable_checkpoint_read_as_aborted(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    async with await StateStore.open(path) as store:
        sink_states = SinkStates(store, SINK)
        for epoch in (1, 2, 3):
            await sink_states.persist_pending(epoch, {"m": epoch}, None)
        await sink_states.commit_and_prune(1)
        await store.commit(2)
    async with await StateStore.open(path) as store:
        assert await SinkStates(store, SINK).list() == [
            SinkStateRecord(1, C, {"m": 1}, None),
            SinkStateRecord(2, P, {"m": 2}, None),
            SinkStateRecord(3, A, {"m": 3}, None),
        ]


@pytest.mark.parametrize("argument", ["metadata", "schema_change"])
async def test_persist_pending_rejects_values_that_are_not_json_by_their_name(
    tmp_path: Path, argument: str
) -> None:
    bad = {"at": object()}
    values: dict[str, Any] = {"metadata": {"m": 1}, "schema_change": None, argument: bad}
    async with await StateStore.open(tmp_path / "state.db") as store:
        sink_states = SinkStates(store, SINK)
        with pytest.raises(InvalidArgumentError) as info:
            await sink_states.persist_pending(1, values["metadata"], values["schema_change"])
        assert (info.value.argument, info.value.expected, info.value.got) == (
            argument,
            "a JSON-serializable value",
            bad,
        )
        assert await sink_states.list() == []


# Replies owed to writers.


def commit_event(handle: WriterHandle, epoch: int = 1) -> Commit:
    return Commit(handle, epoch, meta(handle, epoch), OneShot())


def detached_handle(handle_id: int = 1) -> WriterHandle:
    return WriterHandle(make(FakeCommitter()), handle_id, FULL)


async def got(reply: OneShot[Any]) -> Any:
    """``reply``'s value (or error), failing the test instead of hanging if it never comes."""
    with anyio.fail_after(WAIT):
        return await reply.get()


async def test_open_replies_fail_only_what_is_still_unanswered() -> None:
    replies = OpenReplies()
    handle = detached_handle()
    answered, failed, already = commit_event(handle), commit_event(handle), commit_event(handle)
    already.reply.set(None)  # answered before it was taken: not tracked
    for event in (answered, failed, already):
        replies.track(event)
    replies.track(NewHandle(handle))  # no reply to owe
    assert len(replies) == 2
    replies.answer(answered.reply, None)
    extra: OneShot[int] = OneShot()
    replies.add(extra)
    replies.answer(extra, 7)
    assert await got(extra) == 7
    boom = RuntimeError("boom")
    replies.fail_all(boom)
    assert await got(answered.reply) is None
    assert await got(already.reply) is None
    with pytest.raises(RuntimeError) as info:
        await got(failed.reply)
    assert info.value is boom
    # Failed once: a second failure has nothing left to fail.
    late: OneShot[None] = OneShot()
    replies.fail_all(RuntimeError("again"))
    replies.add(late)
    replies.fail_all(boom)
    with pytest.raises(RuntimeError) as info:
        await got(late)
    assert info.value is boom


async def test_refuse_fails_the_reply_with_the_error_it_returns() -> None:
    reply: OneShot[None] = OneShot()
    error = EpochOrderError("commit epoch", 2, 1)
    assert refuse(reply, error) is error
    with pytest.raises(EpochOrderError) as info:
        await got(reply)
    assert info.value is error


class Stopped(BaseException):
    """What a cancellation looks like to ``abort_run``: not an ``Exception``."""


@pytest.mark.parametrize("cancelled", [False, True], ids=["failed", "cancelled"])
async def test_a_failed_run_aborts_registered_and_queued_writers_with_the_cause(
    cancelled: bool,
) -> None:
    registered, queued, stopping = detached_handle(1), detached_handle(2), detached_handle(3)
    writers = WriterRegistry(SINK)
    writers.admit(registered)
    replies = OpenReplies()
    taken = commit_event(registered, 1)
    replies.track(taken)
    send, receive = create_channel[Any](8, name="inbox")
    waiting = commit_event(queued, 2)
    asked: OneShot[None] = OneShot()  # the reply ``ask`` sent with ``waiting``
    await send.send((NewHandle(queued), None))
    await send.send((waiting, asked))
    await send.send((StopHandle(stopping), None))
    exc: BaseException = Stopped() if cancelled else KeyError("k")
    abort_run(SINK, exc, receive, writers, replies)
    with pytest.raises(anyio.WouldBlock):
        receive.receive_nowait()  # every queued event was taken
    assert set(writers.handles) == {1, 2, 3}
    errors = []
    assert waiting.reply is asked  # taken with the asker's reply
    for reply in (taken.reply, asked):
        with pytest.raises(CoordinatorAbortedError) as info:
            await got(reply)
        errors.append(info.value)
    for handle in (registered, queued, stopping):
        with pytest.raises(CoordinatorAbortedError) as info:
            with anyio.fail_after(WAIT):
                await handle.wait_started()
        errors.append(info.value)
    error = errors[0]
    assert all(e is error for e in errors)
    assert error.sink == SINK
    if cancelled:
        assert isinstance(error.cause, ActorGoneError)
        assert (error.cause.actor, error.cause.reason) == (SINK, "cancelled")
    else:
        assert error.cause is exc


async def test_abort_run_stops_at_a_closed_inbox() -> None:
    send, receive = create_channel[Any](8, name="inbox")
    handle = detached_handle()
    await send.send((NewHandle(handle), None))
    send.close()
    writers = WriterRegistry(SINK)
    abort_run(SINK, KeyError("k"), receive, writers, OpenReplies())
    assert list(writers.handles) == [handle.handle_id]
    with anyio.fail_after(WAIT), pytest.raises(CoordinatorAbortedError):
        await handle.wait_started()


# The service's arguments.


@pytest.mark.parametrize(
    ("kwargs", "argument", "expected"),
    [
        ({"sink": None}, "sink", "a non-empty str"),
        ({"base_delay": -0.5}, "base_delay", "a finite number of seconds > 0"),
        ({"max_delay": 0}, "max_delay", "a finite number of seconds > 0"),
        ({"max_delay": True}, "max_delay", "a finite number of seconds > 0"),
        ({"max_delay": math.inf}, "max_delay", "a finite number of seconds > 0"),
        ({"warn_interval": 0.0}, "warn_interval", "a finite number of seconds > 0"),
        ({"warn_interval": None}, "warn_interval", "a finite number of seconds > 0"),
        ({"base_delay": 0.000999}, "base_delay", "at least 0.001 seconds (1 ms)"),
        ({"vnode_count": 1 << 15 | 1}, "vnode_count", "an int in 1..32768"),
        ({"vnode_count": -1}, "vnode_count", "an int in 1..32768"),
        ({"vnode_count": True}, "vnode_count", "an int in 1..32768"),
        ({"rng": random}, "rng", "None or a random.Random"),
    ],
)
def test_coordinator_rejects_each_bad_argument_by_name(
    kwargs: dict[str, Any], argument: str, expected: str
) -> None:
    arguments: dict[str, Any] = {"sink": SINK, "committer": FakeCommitter()}
    arguments.update(kwargs)
    sink, committer = arguments.pop("sink"), arguments.pop("committer")
    with pytest.raises(InvalidArgumentError) as info:
        Coordinator(sink, committer, **arguments)
    assert (info.value.argument, info.value.expected) == (argument, expected)
    assert info.value.got is kwargs[argument]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"vnode_count": 1},
        {"vnode_count": 1 << 15},
        {"base_delay": 0.001, "max_delay": 1, "warn_interval": 2},
        {"rng": None},
    ],
)
def test_coordinator_accepts_the_bounds_of_its_arguments(kwargs: dict[str, Any]) -> None:
    coordinator = Coordinator(SINK, FakeCommitter(), **kwargs)
    assert coordinator.vnode_count == kwargs.get("vnode_count", 256)


@pytest.mark.parametrize("argument", ["writer", "name"])
@pytest.mark.parametrize("bad", ["", 3, b"w"])
async def test_register_rejects_a_writer_id_or_name_that_is_not_a_non_empty_str(
    tmp_path: Path, argument: str, bad: Any
) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        coordinator = make(FakeCommitter())
        async with anyio.create_task_group() as tg:
            start(tg, coordinator, ServiceContext(SINK, store))
            with pytest.raises(InvalidArgumentError) as info:
                await coordinator.register(FULL, **{argument: bad})
            assert (info.value.argument, info.value.expected, info.value.got) == (
                argument,
                "None or a non-empty str",
                bad,
            )
            tg.cancel_scope.cancel()


async def test_register_rejects_an_empty_bitmap_showing_it() -> None:
    coordinator = make(FakeCommitter())
    empty = VnodeBitmap.empty()
    with pytest.raises(InvalidArgumentError) as info:
        await coordinator.register(empty)
    assert (info.value.argument, info.value.expected, info.value.got) == (
        "bitmap",
        "a bitmap with at least one vnode",
        empty,
    )


async def test_handles_are_numbered_in_registration_order_and_keep_their_ids(
    tmp_path: Path,
) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        coordinator = make(FakeCommitter())
        async with anyio.create_task_group() as tg:
            start(tg, coordinator, ServiceContext(SINK, store))
            first = await coordinator.register(HALVES[0], writer="w-a", name="actor-a")
            second = await coordinator.register(HALVES[1])
            assert (first.handle_id, second.handle_id) == (1, 2)
            assert (first.writer, first.name, second.writer, second.name) == (
                "w-a",
                "actor-a",
                None,
                "writer 2",
            )
            assert [first.bitmap, second.bitmap] == list(HALVES)
            tg.cancel_scope.cancel()


async def test_a_registration_waiting_on_a_full_inbox_when_the_run_stops_is_actor_gone(
    tmp_path: Path,
) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        committer = FakeCommitter()
        coordinator = make(committer)
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            a, b = await register_started(coordinator, HALVES)
            await commit_all([a, b], 1)
            await anyio.wait_all_tasks_blocked()  # every committed epoch taken in
            committer.gate = anyio.Event()  # the coordinator is busy in epoch 1's commit
            await store.commit(1)
            await committer.wait_for(lambda: committer.epochs("commit") == [1])
            with anyio.fail_after(WAIT):
                queued = [await coordinator.register(FULL) for _ in range(1024)]
            blocked = spawn(tg, lambda: coordinator.register(FULL))
            await anyio.wait_all_tasks_blocked()
            await run.stop()
            error = await blocked.wait_error()
            assert isinstance(error, ActorGoneError)
            assert (error.actor, error.reason) == (f"{SINK}.coordinator", "its inbox is closed")
            # The cause names the coordinator's inbox.
            cause = error.__cause__
            assert isinstance(cause, ChannelBrokenError)
            assert cause.channel == f"{SINK}.coordinator inbox"
            # The registrations that were queued are aborted, not left waiting.
            with anyio.fail_after(WAIT), pytest.raises(CoordinatorAbortedError):
                await queued[-1].wait_started()


async def test_is_committed_holds_exactly_through_the_last_committed_epoch(
    tmp_path: Path,
) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        committer = FakeCommitter()
        coordinator = make(committer)
        assert not coordinator.is_committed(0)  # no run yet
        async with anyio.create_task_group() as tg:
            start(tg, coordinator, ServiceContext(SINK, store))
            handles = await register_started(coordinator, HALVES)
            assert not coordinator.is_committed(1)
            await commit_all(handles, 1)
            await commit_all(handles, 2)
            assert not coordinator.is_committed(1)  # acked, not committed
            await store.commit(1)
            with anyio.fail_after(WAIT):
                await coordinator.wait_committed(1)
            assert [coordinator.is_committed(e) for e in (0, 1, 2, 3)] == [True, True, False, False]
            await store.commit(2)
            with anyio.fail_after(WAIT):
                await coordinator.wait_committed(2)
            assert [coordinator.is_committed(e) for e in (1, 2, 3)] == [True, True, False]
            tg.cancel_scope.cancel()


async def test_stats_start_at_zero_before_and_at_the_start_of_a_run(tmp_path: Path) -> None:
    coordinator = make(FakeCommitter())
    before = coordinator.stats()
    assert (
        before.writers,
        before.running,
        before.acked_epochs,
        before.committed_epochs,
        before.last_acked_epoch,
        before.last_committed_epoch,
        before.commit_failures,
        before.retry_delays,
        before.aborted_epochs,
        before.last_commit_time,
        before.pending_epochs,
        before.rows_committed,
        before.commit_replays,
    ) == (0, 0, 0, 0, 0, 0, 0, (), (), None, 0, 0, 0)
    async with (
        await StateStore.open(tmp_path / "state.db") as store,
        anyio.create_task_group() as tg,
    ):
        start(tg, coordinator, ServiceContext(SINK, store))
        await register_started(coordinator, [FULL])
        fresh = coordinator.stats()
        assert (fresh.writers, fresh.running) == (1, 1)
        assert (
            fresh.acked_epochs,
            fresh.committed_epochs,
            fresh.last_acked_epoch,
            fresh.last_committed_epoch,
            fresh.last_commit_time,
            fresh.pending_epochs,
            fresh.rows_committed,
            fresh.commit_replays,
        ) == (0, 0, 0, 0, None, 0, 0, 0)
        tg.cancel_scope.cancel()


def test_an_asked_request_gets_the_askers_reply_and_a_told_one_keeps_its_own() -> None:
    handle = detached_handle()
    asked, asker = commit_event(handle, 1), OneShot[None]()
    assert take(asked, asker) is asked
    assert asked.reply is asker  # the coordinator's answer reaches whoever waits on it
    told = commit_event(handle, 2)
    own = told.reply
    assert take(told, None) is told
    assert told.reply is own  # answered into the reply nobody waits on, never into None


async def test_answered_replies_are_not_kept() -> None:
    replies = OpenReplies()
    handle = detached_handle()
    events = [commit_event(handle, epoch) for epoch in range(3)]
    for event in events:
        replies.track(event)
    assert len(replies) == 3
    for event in events:
        replies.answer(event.reply)
    assert len(replies) == 0
    extra: OneShot[None] = OneShot()
    replies.add(extra)
    replies.fail_all(RuntimeError("boom"))
    assert len(replies) == 0


# Errors name the sink they come from.


async def test_a_writer_that_stops_during_realignment_before_it_starts_is_an_unexpected_request(
    tmp_path: Path,
) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        coordinator = make(FakeCommitter())
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            a, b = await register_started(coordinator, HALVES)
            await commit_all([a, b], 1)
            thirds = VnodeBitmap.split(3)
            c = await coordinator.register(thirds[2])
            await a.update_vnode_bitmap(thirds[0])
            await c.stop()  # joined the realignment round, then left before it was started
            await b.update_vnode_bitmap(thirds[1])
            error = await run.failure()
        assert isinstance(error, UnexpectedWriterRequestError)
        assert (error.sink, error.stage, error.expected, error.request, error.writer) == (
            SINK,
            "start",
            f"writer {c.handle_id} registered",
            "StopHandle",
            c.handle_id,
        )
        assert error.epoch is None


async def test_errors_of_initial_epoch_alignment_name_the_sink(tmp_path: Path) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        coordinator = make(FakeCommitter())
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            a, b = [await coordinator.register(h) for h in HALVES]
            with anyio.fail_after(WAIT):
                await a.wait_started()
            sent = spawn(tg, lambda: b.commit(3, meta(b, 3)))
            error = await run.failure()
        assert isinstance(error, UnexpectedWriterRequestError)
        assert (error.sink, error.stage) == (SINK, "initial epoch alignment")
        assert await sent.wait_error() is error


async def test_a_schema_change_mismatch_names_the_sink(tmp_path: Path) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        coordinator = make(FakeCommitter())
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            a, b = await register_started(coordinator, HALVES)
            await post(tg, a, 1, {"add": "x"})
            await post(tg, b, 1, {"add": "y"})
            error = await run.failure()
        assert isinstance(error, SchemaChangeMismatchError)
        assert (error.sink, error.epoch, error.first, error.other) == (
            SINK,
            1,
            {"add": "x"},
            {"add": "y"},
        )


async def test_a_commit_from_a_writer_not_running_names_the_sink_and_who_may_commit(
    tmp_path: Path,
) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        coordinator = make(FakeCommitter())
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            a, b = await register_started(coordinator, HALVES)
            late = await coordinator.register(FULL)
            error = await (await post(tg, late, 1)).wait_error()
            assert leaf(await run.failure()) is error
        assert isinstance(error, UnexpectedWriterRequestError)
        assert (
            error.sink,
            error.stage,
            error.expected,
            error.request,
            error.writer,
            error.epoch,
        ) == (
            SINK,
            "running",
            f"commit requests from running writers {[a.handle_id, b.handle_id]}",
            "Commit",
            late.handle_id,
            1,
        )


class NoEpochs:
    """A committed-epoch stream that ends at once."""

    def __aiter__(self) -> NoEpochs:
        return self

    async def __anext__(self) -> int:
        raise StopAsyncIteration


async def test_committed_epochs_ending_before_the_first_is_an_error_naming_none(
    tmp_path: Path,
) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        ctx = ServiceContext(SINK, store)
        ctx.committed_epochs = NoEpochs  # type: ignore[method-assign,assignment]
        coordinator = make(FakeCommitter())
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ctx)
            error = await run.failure()
        assert isinstance(error, CommittedEpochsEndedError)
        assert (error.sink, error.last_epoch, error.waiting) == (SINK, None, ())


async def test_a_writer_sending_an_epoch_twice_is_a_duplicate_vnode_error_of_that_epoch(
    tmp_path: Path,
) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        coordinator = make(FakeCommitter())
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            a, _ = await register_started(coordinator, HALVES)
            await post(tg, a, 1)
            await post(tg, a, 1)
            error = await run.failure()
        assert isinstance(error, DuplicateVnodeError)
        assert (error.sink, error.vnodes, error.stage) == (SINK, list(range(128)), "epoch 1")


async def test_errors_of_realignment_name_the_sink(tmp_path: Path) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        coordinator = make(FakeCommitter())
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            a, b = await register_started(coordinator, HALVES)
            await a.update_vnode_bitmap(FULL)
            await b.update_vnode_bitmap(HALVES[1])
            error = await run.failure()
        assert isinstance(error, DuplicateVnodeError)
        assert (error.sink, error.stage) == (SINK, "realignment")


async def test_an_initial_epoch_after_init_says_it_is_only_taken_during_init(
    tmp_path: Path,
) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        coordinator = make(FakeCommitter())
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            (handle,) = await register_started(coordinator, [FULL])
            spawn(tg, lambda: handle.align_initial_epoch(9))
            error = await run.failure()
        assert isinstance(error, UnexpectedWriterRequestError)
        assert (
            error.sink,
            error.stage,
            error.expected,
            error.request,
            error.writer,
            error.epoch,
        ) == (SINK, "running", "AlignInitial only during init", "AlignInitial", handle.handle_id, 9)


async def test_a_restart_reports_the_last_committed_epoch_at_once(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    async with await StateStore.open(path) as store:
        sink_states = SinkStates(store, SINK)
        await sink_states.persist_pending(4, {"m": 4}, None)
        await sink_states.commit_and_prune(4)
        await store.commit(4)
    async with await StateStore.open(path) as store:
        coordinator = make(FakeCommitter())
        async with anyio.create_task_group() as tg:
            start(tg, coordinator, ServiceContext(SINK, store))
            handles = [await coordinator.register(b) for b in HALVES]
            with anyio.fail_after(WAIT):
                assert [await h.wait_started() for h in handles] == [4, 4]
            stats = coordinator.stats()
            assert (stats.last_acked_epoch, stats.last_committed_epoch) == (4, 4)
            assert coordinator.is_committed(4)
            tg.cancel_scope.cancel()


async def test_a_restart_goes_on_when_aborting_a_stale_epoch_fails(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    async with await StateStore.open(path) as store:
        sink_states = SinkStates(store, SINK)
        await sink_states.persist_pending(1, {"m": 1}, None)
        await sink_states.persist_pending(2, {"m": 2}, None)
        await store.commit(1)
    committer = AbortFailing({2})
    async with await StateStore.open(path) as store:
        coordinator = make(committer)
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            handles = [await coordinator.register(b) for b in HALVES]
            with anyio.fail_after(WAIT):
                assert [await h.wait_started() for h in handles] == [1, 1]
            assert committer.calls[0] == ("abort", 2, {"m": 2})
            assert coordinator.stats().aborted_epochs == (2,)
            assert not run.ended.is_set()
            tg.cancel_scope.cancel()


async def test_a_commit_whose_mark_was_cut_off_by_the_stop_is_marked_before_the_run_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marking = anyio.Event()
    never = anyio.Event()
    calls: list[int] = []
    original = SinkStates.commit_and_prune

    async def stuck_once(self: SinkStates, epoch: int) -> None:
        calls.append(epoch)
        if len(calls) == 1:
            marking.set()
            await never.wait()  # the mark's writer is cancelled here
        await original(self, epoch)

    monkeypatch.setattr(SinkStates, "commit_and_prune", stuck_once)
    async with await StateStore.open(tmp_path / "state.db") as store:
        committer = FakeCommitter()
        coordinator = make(committer)
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            handles = await register_started(coordinator, HALVES)
            await commit_all(handles, 1)
            await store.commit(1)
            with anyio.fail_after(WAIT):
                await marking.wait()
            assert committer.committed == [1]
            await run.stop()
        assert calls == [1, 1]
        assert states(await SinkStates(store, SINK).list()) == [(1, "committed")]


async def test_the_inbox_holds_1024_events_then_writers_wait(tmp_path: Path) -> None:
    # Bounded: a coordinator that is busy (here in a slow commit) slows its writers down
    # instead of queueing their requests without limit.
    async with await StateStore.open(tmp_path / "state.db") as store:
        committer = FakeCommitter()
        coordinator = make(committer)
        async with anyio.create_task_group() as tg:
            start(tg, coordinator, ServiceContext(SINK, store))
            a, b = await register_started(coordinator, HALVES)
            await commit_all([a, b], 1)
            await anyio.wait_all_tasks_blocked()  # every committed epoch taken in
            committer.gate = anyio.Event()
            await store.commit(1)
            await committer.wait_for(lambda: committer.epochs("commit") == [1])
            with anyio.fail_after(WAIT):
                for _ in range(1024):
                    await coordinator.register(FULL)
            blocked = spawn(tg, lambda: coordinator.register(FULL))
            await anyio.wait_all_tasks_blocked()
            assert not blocked.done.is_set()
            committer.gate.set()
            await blocked.wait()
            tg.cancel_scope.cancel()


async def test_records_out_of_order_fail_the_run_naming_the_sink(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    async with await StateStore.open(path) as store:
        sink_states = SinkStates(store, SINK)
        await sink_states.persist_pending(1, {"m": 1}, None)
    async with await StateStore.open(path) as store:  # epoch 1 not durable: aborted
        sink_states = SinkStates(store, SINK)
        await sink_states.persist_pending(2, {"m": 2}, None)
        coordinator = make(FakeCommitter())
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            error = await run.failure()
        assert isinstance(error, SinkRecordsOrderError)
        assert (error.sink, error.expected, error.records) == (
            SINK,
            "only aborted records after the pending ones",
            ((1, "aborted"), (2, "pending")),
        )


def test_defaults_are_the_seeds_10_ms_backoff_capped_at_60_s_and_5_s_warnings() -> None:
    coordinator = Coordinator(SINK, FakeCommitter())
    assert (coordinator.base_delay, coordinator.max_delay, coordinator.warn_interval) == (
        0.01,
        60.0,
        5.0,
    )
    assert coordinator.vnode_count == 256
    assert coordinator.commit_retry_timeout == 300.0  # ours: the seed retries for ever
    given = Coordinator(SINK, FakeCommitter(), base_delay=2, max_delay=3, warn_interval=4)
    assert (given.base_delay, given.max_delay, given.warn_interval) == (2.0, 3.0, 4.0)


async def test_two_writers_with_one_writer_id_are_a_duplicate_writer_error(
    tmp_path: Path,
) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        coordinator = make(FakeCommitter())
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            await coordinator.register(HALVES[0], writer="w", name="first")
            await coordinator.register(HALVES[1], writer="w", name="second")
            error = await run.failure()
        assert isinstance(error, DuplicateWriterError)
        assert (error.sink, error.writer, error.first, error.second) == (
            SINK,
            "w",
            "first",
            "second",
        )


# Metrics.


class RowsCommitter(FakeCommitter):
    """Prepares metadata that claims rows of its own (the coordinator counts the manifests')."""

    async def prepare(self, epoch: int, manifests: Any) -> Any:
        metadata = await super().prepare(epoch, manifests)
        return {**metadata, "rows": 999}


def with_rows(handle: Any, epoch: int) -> Manifest:
    """``handle``'s manifest of ``epoch``: one staged file of ``10 * epoch`` rows."""
    staged = (StagedFile(f"{handle.handle_id}-{epoch}.parquet", 10 * epoch, 1),)
    return Manifest(str(handle.handle_id), epoch, files=staged)


async def test_the_coordinator_reports_its_epochs_rows_and_commit_latencies(
    tmp_path: Path,
) -> None:
    from barrierflow.runtime.metrics import MetricsRegistry

    registry = MetricsRegistry()
    async with await StateStore.open(tmp_path / "state.db") as store:
        committer = RowsCommitter()
        coordinator = make(committer)
        before = {f.name: f for f in coordinator.metric_families()}
        assert before["barrierflow_sink_rows_committed"].value(sink=SINK) == 0
        async with anyio.create_task_group() as tg:
            start(tg, coordinator, ServiceContext(SINK, store, metrics=registry))
            handles = await register_started(coordinator, HALVES)
            for epoch in (1, 2, 3):
                with anyio.fail_after(WAIT):
                    async with anyio.create_task_group() as writers:
                        for handle in handles:
                            writers.start_soon(handle.commit, epoch, with_rows(handle, epoch))
            await store.commit(1)
            with anyio.fail_after(WAIT):
                await coordinator.wait_committed(1)
            await store.commit(2)
            with anyio.fail_after(WAIT):
                await coordinator.wait_committed(2)
            families = {f.name: f for f in coordinator.metric_families()}
            tg.cancel_scope.cancel()
    value = {name: f.value(sink=SINK) for name, f in families.items()}
    # Two writers' manifests of epochs 1 and 2, not 3 (not durable), not the metadata's.
    assert value["barrierflow_sink_rows_committed"] == 2 * (10 + 20)
    assert value["barrierflow_sink_acked_epochs"] == 3
    assert value["barrierflow_sink_committed_epochs"] == 2
    assert value["barrierflow_sink_pending_epochs"] == 1
    assert value["barrierflow_sink_last_committed_epoch"] == 2
    assert value["barrierflow_sink_commit_retries"] == 0
    assert value["barrierflow_sink_aborted_epochs"] == 0
    assert value["barrierflow_sink_writers"] == 2
    histograms = {f.name: f for f in registry.collect()}
    for name in ("barrierflow_sink_commit_seconds", "barrierflow_sink_commit_latency_seconds"):
        counts = [(s.labels, s.value) for s in histograms[name].samples if s.suffix == "_count"]
        assert counts == [((("sink", SINK),), 2)], name  # one per commit that went through
        (total,) = [s.value for s in histograms[name].samples if s.suffix == "_sum"]
        assert 0 <= total < WAIT


async def test_a_pending_epoch_recovered_counts_the_rows_its_metadata_records() -> None:
    fake = FakeStates([(1, SinkState.PENDING), (2, SinkState.PENDING), (3, SinkState.PENDING)])
    fake.records[0] = replace(fake.records[0], metadata={"rows": 7})
    fake.records[1] = replace(fake.records[1], metadata={"rows": "7"})  # not a count: none
    result = await recover(SINK, fake, FakeCommitter(), Warnings())  # type: ignore[arg-type]
    assert [item.rows for item in result.pending] == [7, 0, 0]


def test_durable_marks_give_the_first_mark_at_or_past_an_epoch() -> None:
    from barrierflow.actors.sinks.metrics import DurableMarks

    marks = DurableMarks()
    assert marks.since(1) is None
    marks.add(0, 1.0)
    marks.add(3, 5.0)
    marks.add(7, 9.0)
    assert marks.since(2) == 5.0  # epoch 2 became durable with the mark of 3
    assert marks.since(3) == 5.0
    assert marks.since(4) == 9.0
    assert marks.since(1) == 9.0  # older marks are forgotten: epochs commit in order
    assert marks.since(8) is None
