"""Seed rules of the source backfill (``source_backfill_executor.rs``), one test per rule, each
written to fail when its rule is broken.

The actor runs here without a runtime: a stand-in context hands it barriers and records what
it emits, a stand-in store decides when an epoch is committed, and a fake clock decides how
long it has been since the last barrier. Nothing sleeps: each step waits until every task is
blocked (:func:`anyio.wait_all_tasks_blocked`) and then looks at what the actor did.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing, asynccontextmanager
from types import SimpleNamespace
from typing import Any

import anyio
import pyarrow as pa
import pytest
from _timeouts import scaled
from anyio.streams.memory import MemoryObjectSendStream
from test_source_backfill import FailingLog

from barrierflow.actors.backfill import _backfill_stage, source_backfill
from barrierflow.actors.backfill.errors import (
    UnfinishedSplitMigratedError,
    UpstreamEndedDuringSourceBackfillError,
)
from barrierflow.actors.backfill.source_backfill import TABLE, SourceBackfill
from barrierflow.actors.backfill.source_backfill_state import BackfillPhase, SplitBackfill
from barrierflow.actors.sources.split_log import OFFSET_MAJOR, OFFSET_MINOR, SPLIT_COLUMN, Offset
from barrierflow.channels import (
    Add,
    Barrier,
    BarrierKind,
    Chunk,
    EpochPair,
    Message,
    Mutation,
    Op,
    Resume,
    SourceChangeSplit,
    Split,
    Stop,
    Throttle,
)
from barrierflow.channels.vnode import VnodeBitmap, compute_vnodes
from barrierflow.errors import GraphError, InvalidArgumentError, ProtocolError
from barrierflow.runtime.progress import Progress
from barrierflow.testing import FakeClock
from barrierflow.testing.split_log import MemorySplitLog

pytestmark = pytest.mark.anyio

PAYLOAD = pa.schema([("v", pa.int64())])
ACTOR = "backfill.0"
PEER = "backfill.1"
ACTOR_ID = 7


def make_log(**splits: int) -> MemorySplitLog:
    """A log whose split ``s`` holds records 1..n (offsets ``k-0``)."""
    log = MemorySplitLog(PAYLOAD, splits=list(splits))
    for split, count in splits.items():
        if count:
            log.append(split, {"v": list(range(1, count + 1))})
    return log


class GatedLog:
    """A split log whose readers hand over one batch per permit the test gives (so the test
    decides when each history batch reaches the actor, and what the clock says then)."""

    def __init__(self, inner: MemorySplitLog) -> None:
        self.inner = inner
        self._permits = 0
        self._given = anyio.Event()

    @property
    def schema(self) -> pa.Schema:
        return self.inner.schema

    async def list_splits(self) -> list[str]:
        return await self.inner.list_splits()

    async def latest_offset(self, split: str) -> Offset | None:
        return await self.inner.latest_offset(split)

    def release(self, batches: int = 1) -> None:
        """Let ``batches`` more batches through."""
        self._permits += batches
        self._given.set()
        self._given = anyio.Event()

    async def read(
        self, start: Mapping[str, Offset | None], *, batch_rows: int = 4096
    ) -> AsyncIterator[pa.RecordBatch]:
        async with aclosing(self.inner.read(start, batch_rows=batch_rows)) as reader:  # type: ignore[type-var]
            async for batch in reader:
                while self._permits == 0:
                    await self._given.wait()
                self._permits -= 1
                yield batch


class FakeStore:
    """Each actor's state table, and what of them is committed: a reader of a peer's table
    sees only the last commit, as the seed's state store does."""

    def __init__(self) -> None:
        self.tables: dict[str, dict[str, Any]] = {}
        self.committed: dict[str, dict[str, Any]] = {}
        self.committed_epoch = 0
        #: The committed epoch each time an actor read a peer's committed states.
        self.reads: list[int] = []
        #: Every epoch an actor waited to be committed.
        self.waits: list[int] = []
        self._changed = anyio.Event()

    def commit(self, epoch: int) -> None:
        """Make every table as it is now the committed state of ``epoch``."""
        self.committed = {owner: dict(rows) for owner, rows in self.tables.items()}
        self.committed_epoch = max(self.committed_epoch, epoch)
        self._changed.set()
        self._changed = anyio.Event()

    def put(self, owner: str, split: str, state: SplitBackfill) -> None:
        self.tables.setdefault(owner, {})[split] = state.to_json()

    async def wait_committed(self, epoch: int) -> int:
        self.waits.append(epoch)
        while self.committed_epoch < epoch:
            await self._changed.wait()
        return self.committed_epoch


class _Table:
    """One actor's writable state table in a :class:`FakeStore`."""

    def __init__(self, rows: dict[str, Any]) -> None:
        self.rows = rows

    def put(self, key: str, value: Any) -> None:
        self.rows[key] = value

    def delete(self, key: str) -> None:
        self.rows.pop(key, None)

    async def items(self) -> dict[str, Any]:
        await anyio.lowlevel.checkpoint()
        return dict(self.rows)


class _CommittedTable:
    """A peer's table as of the last commit (records the committed epoch of each read)."""

    def __init__(self, store: FakeStore, owner: str) -> None:
        self.store = store
        self.owner = owner

    async def items(self) -> dict[str, Any]:
        await anyio.lowlevel.checkpoint()
        self.store.reads.append(self.store.committed_epoch)
        return dict(self.store.committed.get(self.owner, {}))


class _Log:
    def warning(self, event: str, **fields: Any) -> None:
        pass

    def info(self, event: str, **fields: Any) -> None:
        pass


class FakeContext:
    """What :meth:`SourceBackfill.run` uses of an actor context. With ``auto_commit`` each
    checkpoint barrier the actor emits commits its ``prev`` epoch at once (this actor is the
    last to collect it); without, the test commits."""

    def __init__(
        self,
        store: FakeStore,
        upstream: Any,
        *,
        peers: tuple[str, ...] = (ACTOR,),
        auto_commit: bool = True,
        barrier_interval: float = 1.0,
        inputs: dict[str, Any] | None = None,
    ) -> None:
        self.store = store
        self.inputs = {"upstream": upstream} if inputs is None else inputs
        self.actor_id = ACTOR_ID
        self.name = ACTOR
        self.peers = peers
        self.vnode_bitmap = None
        self.barrier_interval = barrier_interval
        self.finished = False
        self.log = _Log()
        self.auto_commit = auto_commit
        self.emitted: list[Message] = []
        self.progress: list[Progress] = []
        #: ``run`` returned.
        self.done = False

    def table(self, name: str) -> _Table:
        assert name == TABLE
        return _Table(self.store.tables.setdefault(self.name, {}))

    def read_table(self, owner: str, name: str) -> _CommittedTable:
        assert name == TABLE
        return _CommittedTable(self.store, owner)

    async def wait_committed(self, epoch: int) -> int:
        return await self.store.wait_committed(epoch)

    def report_progress(self, progress: Progress) -> None:
        self.progress.append(progress)

    async def emit(self, message: Message) -> None:
        await anyio.lowlevel.checkpoint()
        self.emitted.append(message)
        if isinstance(message, Barrier) and message.is_stop(self.actor_id):
            self.finished = True  # as the runtime does after a Stop naming the actor
        if self.auto_commit and isinstance(message, Barrier) and message.is_checkpoint:
            self.store.commit(message.epoch.prev)

    # What the actor emitted.

    def rows(self) -> list[tuple[str, int]]:
        """(split, offset major) of every visible row emitted, in order."""
        seen: list[tuple[str, int]] = []
        for message in self.emitted:
            if isinstance(message, Chunk):
                batch = message.compact().batch
                seen.extend(
                    zip(
                        batch.column(SPLIT_COLUMN).to_pylist(),
                        batch.column(OFFSET_MAJOR).to_pylist(),
                        strict=True,
                    )
                )
        return seen

    def barriers(self) -> list[int]:
        """The ``curr`` epochs of the barriers emitted, in order."""
        return [m.epoch.curr for m in self.emitted if isinstance(m, Barrier)]

    def rows_after_barrier(self, curr: int) -> list[tuple[str, int]]:
        """The rows emitted after the barrier whose ``curr`` epoch is ``curr``."""
        for index, message in enumerate(self.emitted):
            if isinstance(message, Barrier) and message.epoch.curr == curr:
                rest = FakeContext.__new__(FakeContext)
                rest.emitted = self.emitted[index + 1 :]
                return rest.rows()
        raise AssertionError(f"no barrier {curr} emitted")


class Upstream:
    """The live side: barriers with consecutive epochs."""

    def __init__(self, send: MemoryObjectSendStream[Message]) -> None:
        self.send = send
        self.epoch = 0

    async def barrier(
        self, mutation: Mutation | None = None, *, kind: BarrierKind = BarrierKind.CHECKPOINT
    ) -> int:
        """Send the next barrier; returns its ``curr`` epoch."""
        self.epoch += 1
        if self.epoch == 1:
            kind = BarrierKind.INITIAL
        await self.send.send(Barrier(EpochPair(self.epoch, self.epoch - 1), kind, mutation))
        return self.epoch


@asynccontextmanager
async def running(
    actor: SourceBackfill, store: FakeStore, **context: Any
) -> AsyncIterator[tuple[Upstream, FakeContext, list[Exception]]]:
    """Run ``actor`` against a stand-in context; yields the upstream, the context, and the
    error the actor failed with (empty while it runs)."""
    send, receive = anyio.create_memory_object_stream[Message](16)
    inputs = context.pop("input_names", None)
    if inputs is not None:  # the live side under another name, beside other inputs
        context["inputs"] = {name: inputs[name] or receive for name in inputs}
    ctx = FakeContext(store, receive, **context)
    failed: list[Exception] = []

    async def run() -> None:
        try:
            await actor.run(ctx)  # type: ignore[arg-type]
        except Exception as exc:  # the test asserts on it
            # The stage's task group wraps what its loop raised.
            while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
                exc = exc.exceptions[0]  # type: ignore[assignment]
            failed.append(exc)
        ctx.done = True

    with anyio.fail_after(scaled(10)):
        async with send, receive, anyio.create_task_group() as tg:
            tg.start_soon(run)
            yield Upstream(send), ctx, failed
            tg.cancel_scope.cancel()


async def settle() -> None:
    """Let the actor (and its reader) run until all of them wait."""
    await anyio.wait_all_tasks_blocked()


# --- 1. Pause on startup -------------------------------------------------------------------------


async def test_pause_on_startup_reads_no_history_until_resumed() -> None:
    # The seed: `is_pause_on_startup` on the first barrier pauses the backfill reader before
    # the loop starts (`command_paused = true; pause_reader!()`); only a Resume restarts it.
    log = make_log(a=3)
    actor = SourceBackfill(log, splits=["a"], clock=FakeClock())
    async with running(actor, FakeStore()) as (upstream, ctx, failed):
        await upstream.barrier(Add(pause=True))
        await settle()
        for _ in range(3):  # plain barriers do not resume it
            await upstream.barrier()
            await settle()
        assert ctx.rows() == []
        assert ctx.progress[-1].rows == 0
        resumed = await upstream.barrier(Resume())
        await settle()
        assert ctx.rows_after_barrier(resumed) == [("a", 1), ("a", 2), ("a", 3)]
        assert not failed


async def test_without_pause_on_startup_history_is_read_at_once() -> None:
    # The control of the test above: the same actor, not paused, reads before any barrier.
    log = make_log(a=3)
    actor = SourceBackfill(log, splits=["a"], clock=FakeClock())
    async with running(actor, FakeStore()) as (upstream, ctx, failed):
        await upstream.barrier(Add(pause=False))
        await settle()
        assert ctx.rows() == [("a", 1), ("a", 2), ("a", 3)]
        assert not failed


# --- 2. The self-pause ---------------------------------------------------------------------------


#: The seed's ``WAIT_BARRIER_MULTIPLE_TIMES``: barrier intervals without a barrier before the
#: history reader pauses itself (the actor's default).
SEED_WAIT_BARRIER_MULTIPLE_TIMES = 5


@pytest.mark.parametrize("intervals", [None, 3], ids=["seed-default", "three"])
async def test_self_pause_after_n_barrier_intervals_without_a_barrier_and_resume_on_one(
    intervals: int | None,
) -> None:
    # The seed: a history batch that arrives more than WAIT_BARRIER_MULTIPLE_TIMES barrier
    # intervals after the last barrier pauses the reader (the batch itself is still handled),
    # so the backfill does not run away from the live stream; the next barrier resumes it.
    # The clock moves only when the test says; a barrier interval is 0.25 s here.
    n = SEED_WAIT_BARRIER_MULTIPLE_TIMES if intervals is None else intervals
    options = {} if intervals is None else {"wait_barrier_intervals": intervals}
    gated = GatedLog(make_log(a=10))
    clock = FakeClock(start=100.0)
    actor = SourceBackfill(
        gated,  # type: ignore[arg-type]
        splits=["a"],
        batch_rows=1,
        clock=clock,
        **options,  # type: ignore[arg-type]
    )
    async with running(actor, FakeStore(), barrier_interval=0.25) as (upstream, ctx, failed):
        await upstream.barrier(Add())
        await settle()
        gated.release()
        await settle()
        assert ctx.rows() == [("a", 1)]
        clock.advance(n * 0.25)  # exactly N intervals: not late yet
        gated.release(2)
        await settle()
        assert ctx.rows() == [("a", 1), ("a", 2), ("a", 3)]
        clock.advance(0.125)  # past N intervals: the next batch is handled, then the reader waits
        gated.release()
        await settle()
        assert ctx.rows() == [("a", k) for k in range(1, 5)]
        gated.release()
        await settle()
        assert ctx.rows() == [("a", k) for k in range(1, 5)]  # self-paused
        resumed = await upstream.barrier(kind=BarrierKind.BARRIER)
        await settle()
        assert ctx.rows_after_barrier(resumed) == [("a", 5)]  # the barrier resumed it
        gated.release()
        await settle()
        assert ctx.rows() == [("a", k) for k in range(1, 7)]
        assert not failed


# --- 3. Waiting for the first checkpoint before reading the peers' states ------------------------


async def test_peer_states_are_read_only_after_the_first_checkpoint_prev_epoch_is_committed() -> (
    None
):
    # The seed: once every split of the actor caught up, at the first checkpoint barrier it
    # waits until the state store's committed epoch reaches that barrier's prev epoch, and
    # only then reads the other actors' split states — before, it could read only what it
    # wrote itself and take a stale "every split finished" for the truth.
    store = FakeStore()
    store.put(PEER, "b", SplitBackfill())  # the peer's split: written, not committed yet
    actor = SourceBackfill(make_log(a=0, b=4), splits=["a"], clock=FakeClock())  # a: empty
    async with running(actor, store, peers=(ACTOR, PEER), auto_commit=False) as (
        upstream,
        ctx,
        failed,
    ):
        await upstream.barrier(Add())
        plain = await upstream.barrier(kind=BarrierKind.BARRIER)  # caught up at once
        await settle()
        assert store.waits == []  # not a checkpoint: nothing becomes committed, no wait
        first = await upstream.barrier()  # the first checkpoint
        await settle()
        assert ctx.barriers() == [1, plain, first]  # passed on, then waits
        assert store.waits == [first - 1]
        after = await upstream.barrier()
        await settle()
        assert ctx.barriers() == [1, plain, first]  # nothing passes until it is committed
        assert store.reads == []  # and no peer's state was read
        store.commit(first - 1)
        await settle()
        assert ctx.barriers() == [1, plain, first, after]
        assert store.reads
        assert all(epoch >= first - 1 for epoch in store.reads)
        # The peer's split b is not finished: the actor stays in the backfill stage.
        await upstream.barrier()
        await settle()
        assert len(ctx.progress) == 4
        assert not failed


# --- 4. A migrated unfinished split in the forwarding stage --------------------------------------


async def test_forwarding_stage_refuses_a_migrated_split_that_is_not_finished() -> None:
    # The seed: in the forwarding stage a split migrated from another actor must be Finished
    # ("Unexpected backfill state"): this stage reads no history, so adopting an unfinished
    # split would skip what is left of its history.
    store = FakeStore()
    store.put(PEER, "m", SplitBackfill(BackfillPhase.FINISHED))
    actor = SourceBackfill(make_log(a=0, m=4, n=2), splits=["a"], clock=FakeClock())
    async with running(actor, store, peers=(ACTOR, PEER)) as (upstream, ctx, failed):
        await upstream.barrier(Add())
        await upstream.barrier()  # caught up; waits for this checkpoint (auto-committed)
        await upstream.barrier()  # every committed state FINISHED: forwarding from here
        await settle()
        reports = len(ctx.progress)
        await upstream.barrier()
        await settle()
        assert len(ctx.progress) == reports  # forwarding: no more progress reports
        # A split new to the job (no state) is FINISHED and forwarded: no error.
        await upstream.barrier(SourceChangeSplit({ACTOR_ID: (Split("a"), Split("n"))}))
        await settle()
        assert not failed
        # Now m is committed unfinished at the peer, and migrates here.
        offset = Offset(2)
        store.put(PEER, "m", SplitBackfill(BackfillPhase.CACHING_UP, offset, 2, Offset(4)))
        await upstream.barrier()  # commits it
        moved = await upstream.barrier(
            SourceChangeSplit({ACTOR_ID: (Split("a"), Split("n"), Split("m"))})
        )
        await settle()
        assert ctx.barriers()[-1] == moved  # the barrier is passed first, as in the seed
    [error] = failed
    assert isinstance(error, UnfinishedSplitMigratedError)
    assert isinstance(error, ProtocolError)
    assert (error.actor, error.split, error.phase) == (ACTOR, "m", "caching_up")
    assert "expected split 'm'" in str(error)
    assert "to be finished, got one in phase caching_up" in str(error)


# --- 5. Exactly once across both sides ------------------------------------------------------------


def live_rows(split: str, *majors: int) -> pa.RecordBatch:
    """Rows of ``split`` at offsets ``<major>-0``, as the live source emits them."""
    return pa.record_batch(
        {
            SPLIT_COLUMN: pa.array([split] * len(majors), pa.string()),
            OFFSET_MAJOR: pa.array(majors, pa.int64()),
            OFFSET_MINOR: pa.array([0] * len(majors), pa.int64()),
            "v": pa.array(majors, pa.int64()),
        }
    )


async def test_history_rows_past_the_target_are_left_to_the_upstream() -> None:
    # The seed: a backfill row at or past the target is the last one it emits; the rest of
    # the chunk is invisible (Note2), the upstream delivers those records.
    log = make_log(a=5)
    actor = SourceBackfill(log, splits=["a"], batch_rows=10, clock=FakeClock())
    async with running(actor, FakeStore()) as (upstream, ctx, failed):
        await upstream.barrier(Add(pause=True))
        await settle()
        await upstream.send.send(Chunk(live_rows("a", 1, 2, 3)))  # the target moves down to 3
        await settle()
        await upstream.barrier(Resume())
        await settle()
        assert ctx.rows() == [("a", 1), ("a", 2), ("a", 3)]  # one history batch of 1..5
        await upstream.send.send(Chunk(live_rows("a", 4, 5)))
        await settle()
        assert ctx.rows() == [("a", k) for k in range(1, 6)]
        assert not failed


async def test_rows_the_upstream_hid_are_not_records_and_ops_pass_through() -> None:
    # An upstream chunk's visibility hides rows: they are neither emitted nor applied; the
    # visible rows keep their ops.
    actor = SourceBackfill(make_log(a=0), splits=["a"], clock=FakeClock())  # a: finished at once
    async with running(actor, FakeStore()) as (upstream, ctx, failed):
        await upstream.barrier(Add())
        await settle()
        ops = [Op.INSERT, Op.INSERT, Op.DELETE]
        hidden = [True, False, True]
        await upstream.send.send(Chunk(live_rows("a", 1, 2, 3), ops=ops, visibility=hidden))
        await settle()
        [chunk] = [m for m in ctx.emitted if isinstance(m, Chunk)]
        compact = chunk.compact()
        assert compact.batch.column(OFFSET_MAJOR).to_pylist() == [1, 3]
        assert compact.ops is not None
        assert compact.ops.to_pylist() == [Op.INSERT, Op.DELETE]
        assert not failed


async def test_a_restarted_actor_resumes_from_its_committed_state() -> None:
    # The seed: the states are persisted at every barrier and recovered from the state table
    # at the first barrier; the backfill resumes after the offset it last emitted.
    store = FakeStore()
    store.put(ACTOR, "a", SplitBackfill(BackfillPhase.BACKFILLING, Offset(2), 2, Offset(5)))
    actor = SourceBackfill(make_log(a=5), splits=["a"], clock=FakeClock())
    async with running(actor, store) as (upstream, ctx, failed):
        await upstream.barrier(Add())
        await settle()
        assert ctx.rows() == [("a", 3), ("a", 4), ("a", 5)]
        await upstream.barrier()
        await settle()
        assert ctx.progress[-1].rows == 5
        assert ctx.progress[-1].detail == {"a": "caching_up"}
        assert not failed


async def test_history_a_replaced_reader_had_read_ahead_is_dropped() -> None:
    # A reader is rebuilt (here by a split change) while the batches it read ahead still wait
    # in its channel (the backfill is paused): they must not be applied, or the new reader's
    # batches would emit the same records again.
    log = make_log(a=6, b=0)
    actor = SourceBackfill(log, splits=["a"], batch_rows=1, clock=FakeClock())
    async with running(actor, FakeStore()) as (upstream, ctx, failed):
        await upstream.barrier(Add(pause=True))
        await settle()
        await settle()  # the reader read ahead into its channel
        await upstream.barrier(SourceChangeSplit({ACTOR_ID: (Split("a"), Split("b"))}))
        await settle()
        await upstream.barrier(Resume())
        await settle()
        assert ctx.rows() == [("a", k) for k in range(1, 7)]
        assert not failed


class CountingLog(GatedLog):
    """A split log that counts the batches its readers took from it (no gate)."""

    def __init__(self, inner: MemorySplitLog) -> None:
        super().__init__(inner)
        self.taken = 0

    async def read(
        self, start: Mapping[str, Offset | None], *, batch_rows: int = 4096
    ) -> AsyncIterator[pa.RecordBatch]:
        async with aclosing(self.inner.read(start, batch_rows=batch_rows)) as reader:  # type: ignore[type-var]
            async for batch in reader:
                self.taken += 1
                yield batch


async def test_a_paused_backfill_reads_only_a_bounded_way_ahead() -> None:
    # Paused, the reader stops taking history from the log once its channel is full (two
    # batches, and the one it waits to send): a paused job does not buffer the whole log.
    log = CountingLog(make_log(a=10))
    actor = SourceBackfill(log, splits=["a"], batch_rows=1, clock=FakeClock())  # type: ignore[arg-type]
    async with running(actor, FakeStore()) as (upstream, ctx, failed):
        await upstream.barrier(Add(pause=True))
        await settle()
        assert 1 <= log.taken <= 3
        assert ctx.rows() == []
        assert not failed


# --- 6. Throttle, reader retries -----------------------------------------------------------------


class _Sleeps:
    """Stands in for ``anyio`` in the backfill stage: records every sleep, returns at once."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(anyio, name)

    async def sleep(self, delay: float) -> None:
        self.delays.append(delay)
        await anyio.lowlevel.checkpoint()


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> _Sleeps:
    fake = _Sleeps()
    monkeypatch.setattr(_backfill_stage, "anyio", fake)
    return fake


async def test_throttle_to_zero_stops_the_reader_and_none_resumes_it(sleeps: _Sleeps) -> None:
    gated = GatedLog(make_log(a=6))
    actor = SourceBackfill(gated, splits=["a"], batch_rows=2, clock=FakeClock())  # type: ignore[arg-type]
    async with running(actor, FakeStore()) as (upstream, ctx, failed):
        await upstream.barrier(Add())
        await settle()
        gated.release()
        await settle()
        assert ctx.rows() == [("a", 1), ("a", 2)]
        await upstream.barrier(Throttle({ACTOR_ID: 0}))
        await settle()
        gated.release(5)
        await settle()
        assert ctx.rows() == [("a", 1), ("a", 2)]  # no reader at rate 0
        await upstream.barrier(Throttle({ACTOR_ID: None}))
        await settle()
        assert ctx.rows() == [("a", k) for k in range(1, 7)]  # resumed after 2, at once
        assert sleeps.delays == []
        assert not failed


async def test_a_rate_limit_spaces_history_batches_by_rows_over_rate(sleeps: _Sleeps) -> None:
    # The seed's rate limit: rows per second of the backfill reader; a Throttle rebuilds the
    # reader with the new rate, from the latest states and without delay; a barrier without
    # one keeps the rate.
    gated = GatedLog(make_log(a=6))
    actor = SourceBackfill(
        gated,  # type: ignore[arg-type]
        splits=["a"],
        batch_rows=2,
        rate_limit=0,
        clock=FakeClock(),
    )
    async with running(actor, FakeStore()) as (upstream, ctx, failed):
        await upstream.barrier(Add())
        await settle()
        await upstream.barrier(Throttle({ACTOR_ID: 4.0}))
        await settle()
        gated.release()
        await settle()
        await upstream.barrier()
        await settle()
        gated.release(2)
        await settle()
        assert ctx.rows() == [("a", k) for k in range(1, 7)]
        assert sleeps.delays == [0.5, 0.5, 0.5]  # 2 rows at 4 rows/s after each batch
        assert not failed


async def test_reader_failures_back_off_doubling_and_count_only_in_a_row(sleeps: _Sleeps) -> None:
    # A failed reader is rebuilt from the latest states after retry_delay, doubling with each
    # failure in a row; a delivered batch resets the count, so max_reader_retries bounds only
    # failures in a row.
    at_once = FailingLog(make_log(a=4), failures=3, at_once=True)
    actor = SourceBackfill(
        at_once,  # type: ignore[arg-type]
        splits=["a"],
        retry_delay=0.01,
        max_reader_retries=3,
        clock=FakeClock(),
    )
    async with running(actor, FakeStore()) as (upstream, ctx, failed):
        await upstream.barrier(Add())
        await settle()
        assert ctx.rows() == [("a", k) for k in range(1, 5)]
        assert sleeps.delays == [0.01, 0.02, 0.04]
        assert not failed
    sleeps.delays.clear()
    after_a_batch = FailingLog(make_log(a=8), failures=3)
    actor = SourceBackfill(
        after_a_batch,  # type: ignore[arg-type]
        splits=["a"],
        batch_rows=2,
        retry_delay=0.01,
        max_reader_retries=1,
        clock=FakeClock(),
    )
    async with running(actor, FakeStore()) as (upstream, ctx, failed):
        await upstream.barrier(Add())
        await settle()
        assert ctx.rows() == [("a", k) for k in range(1, 9)]
        assert sleeps.delays == [0.01, 0.01, 0.01]
        assert after_a_batch.reads == 4
        assert not failed


# --- 7. Caught up, a target never delivered, stop -----------------------------------------------


async def test_once_every_split_caught_up_the_reader_is_dropped() -> None:
    # The seed drops its backfill readers at the barrier where every split is caught up: the
    # history appended afterwards is the upstream's to deliver, and is not read.
    gated = GatedLog(make_log(a=3))
    actor = SourceBackfill(gated, splits=["a"], batch_rows=3, clock=FakeClock())  # type: ignore[arg-type]
    async with running(actor, FakeStore()) as (upstream, ctx, failed):
        await upstream.barrier(Add())
        await settle()
        gated.release()
        await settle()
        await upstream.barrier()  # a: caching up at 3, the reader is dropped
        await settle()
        gated.inner.append("a", {"v": [4, 5, 6]})
        gated.release(5)
        await settle()
        await upstream.barrier()
        await settle()
        assert ctx.progress[-1].rows == 3
        assert ctx.progress[-1].finished
        assert ctx.rows() == [("a", 1), ("a", 2), ("a", 3)]
        assert not failed


async def test_a_stalled_backfill_whose_remaining_records_were_deleted_stops() -> None:
    # The backfill read 1..4 and then did not move for a barrier; the record it waits for (5,
    # its target) was deleted meanwhile: the log's latest offset says it read everything.
    gated = GatedLog(make_log(a=5))
    actor = SourceBackfill(gated, splits=["a"], batch_rows=2, clock=FakeClock())  # type: ignore[arg-type]
    async with running(actor, FakeStore()) as (upstream, ctx, failed):
        await upstream.barrier(Add())
        await settle()
        gated.release(2)
        await settle()
        await upstream.barrier()  # moved: 4, the log still has 5
        await settle()
        assert ctx.progress[-1].detail == {"a": "backfilling"}
        gated.inner.delete("a", Offset(5))
        await upstream.barrier()  # did not move: asks the log
        await settle()
        assert ctx.progress[-1].detail == {"a": "caching_up"}
        assert ctx.rows() == [("a", k) for k in range(1, 5)]
        assert not failed


@pytest.mark.parametrize("at", ["first", "backfilling"])
async def test_a_stop_barrier_ends_the_actor(at: str) -> None:
    actor = SourceBackfill(make_log(a=3), splits=["a"], rate_limit=0, clock=FakeClock())
    async with running(actor, FakeStore()) as (upstream, ctx, failed):
        if at == "first":
            await upstream.barrier(Stop({ACTOR_ID}))
            await settle()
        else:
            await upstream.barrier(Add())
            await settle()
            await upstream.barrier(Stop({ACTOR_ID}))
        await settle()
        assert ctx.done
        assert isinstance(ctx.emitted[-1], Barrier)
        assert ctx.emitted[-1].is_stop(ACTOR_ID)
        assert not failed


async def test_the_upstream_ending_during_the_backfill_stage_fails_naming_the_splits() -> None:
    # No barrier can come after the upstream's end: the history still owed could never be
    # checkpointed or handed over. Before, the stage waited on its reader for ever.
    actor = SourceBackfill(make_log(a=3, b=2), splits=["a", "b"], rate_limit=0, clock=FakeClock())
    async with running(actor, FakeStore()) as (upstream, ctx, failed):
        await upstream.barrier(Add())
        await settle()
        await upstream.send.aclose()
        await settle()
        assert ctx.done
        assert len(failed) == 1
        error = failed[0]
        assert isinstance(error, UpstreamEndedDuringSourceBackfillError)
        assert (error.actor, error.splits) == (ctx.name, ["a", "b"])


# --- 8. Inputs and protocol errors ---------------------------------------------------------------


@pytest.mark.parametrize(
    "names", [("live",), ("other", "upstream"), ("upstream", "other")], ids=str
)
async def test_the_live_side_is_the_input_named_upstream_or_the_only_one(
    names: tuple[str, ...],
) -> None:
    other_send, other = anyio.create_memory_object_stream[Message](4)
    await other_send.send(Chunk(live_rows("a", 1)))  # never to be read
    live = "upstream" if "upstream" in names else names[0]
    inputs = {name: None if name == live else other for name in names}
    actor = SourceBackfill(make_log(a=2), splits=["a"], clock=FakeClock())
    async with (
        other_send,
        other,
        running(actor, FakeStore(), input_names=inputs) as (
            upstream,
            ctx,
            failed,
        ),
    ):
        await upstream.barrier(Add())
        await settle()
        assert ctx.rows() == [("a", 1), ("a", 2)]
        assert not failed


async def test_a_first_message_that_is_not_a_barrier_is_a_protocol_error() -> None:
    actor = SourceBackfill(make_log(a=2), splits=["a"], clock=FakeClock())
    chunk = Chunk(live_rows("a", 1))
    async with running(actor, FakeStore()) as (upstream, _, failed):
        await upstream.send.send(chunk)
        await settle()
    [error] = failed
    assert type(error) is ProtocolError
    assert str(error) == f"source backfill {ACTOR}: expected a barrier first, got {chunk!r}"


async def test_an_upstream_item_that_is_not_a_message_is_a_protocol_error() -> None:
    actor = SourceBackfill(make_log(a=2), splits=["a"], rate_limit=0, clock=FakeClock())
    async with running(actor, FakeStore()) as (upstream, _, failed):
        await upstream.barrier(Add())
        await settle()
        await upstream.send.send("not a message")  # type: ignore[arg-type]
        await settle()
    [error] = failed
    assert type(error) is ProtocolError
    assert str(error) == (
        f"source backfill {ACTOR}: expected a barrier, a chunk or a watermark from the "
        "upstream, got 'not a message'"
    )


@pytest.mark.parametrize(
    ("peers", "key", "got"),
    [
        ((ACTOR,), None, None),
        ((ACTOR, PEER), (SPLIT_COLUMN,), None),
        ((ACTOR,), (SPLIT_COLUMN,), None),
        ((ACTOR, PEER), None, "a round-robin input"),
        ((ACTOR, PEER), ("v",), ["v"]),
        ((ACTOR,), ("v", SPLIT_COLUMN), ["v", SPLIT_COLUMN]),
    ],
)
def test_check_startup_refuses_an_input_not_keyed_by_split(
    peers: tuple[str, ...], key: tuple[str, ...] | None, got: object
) -> None:
    ctx = SimpleNamespace(name=ACTOR, peers=peers, input_key=key)
    actor = SourceBackfill(make_log(a=1))
    if got is None:
        actor.check_startup(ctx)  # type: ignore[arg-type]
        return
    with pytest.raises(GraphError) as refused:
        actor.check_startup(ctx)  # type: ignore[arg-type]
    assert (refused.value.argument, refused.value.expected, refused.value.got) == (
        "key",
        f"['_split'] for the parallel source backfill {ACTOR} (each split's records must "
        "reach one actor)",
        got,
    )


@pytest.mark.parametrize("vnode_count", [16, 4096])
async def test_a_parallel_actor_owns_the_splits_its_input_routes_to(vnode_count: int) -> None:
    splits = [f"s{i}" for i in range(12)]
    names = pa.table({SPLIT_COLUMN: splits})
    vnodes = compute_vnodes(names, [SPLIT_COLUMN], vnode_count)
    owned = []
    for bitmap in VnodeBitmap.split(2, vnode_count):
        ctx = SimpleNamespace(vnode_bitmap=bitmap)
        mine = await _routed_here_of(ctx, splits)
        assert mine == [s for s, v in zip(splits, vnodes, strict=True) if bitmap.mask[v]]
        owned.append(mine)
    assert sorted(owned[0] + owned[1]) == sorted(splits)
    assert owned[0]
    assert owned[1]


async def _routed_here_of(ctx: Any, splits: list[str]) -> list[str]:
    await anyio.lowlevel.checkpoint()
    return source_backfill._routed_here(ctx, splits)


async def test_the_first_barriers_assignment_names_the_splits_before_the_argument() -> None:
    # The seed takes the actor's splits from the first barrier's split assignment.
    actor = SourceBackfill(make_log(a=2, b=3), splits=["a"], clock=FakeClock())
    async with running(actor, FakeStore()) as (upstream, ctx, failed):
        await upstream.barrier(Add(splits={ACTOR_ID: (Split("b"),)}))
        await settle()
        assert ctx.rows() == [("b", 1), ("b", 2), ("b", 3)]
        await upstream.barrier()
        await settle()
        assert ctx.progress[-1].detail == {"b": "caching_up"}
        assert not failed


class RecordingFailingLog(FailingLog):
    """A :class:`FailingLog` that records the batch size each read asked for."""

    def __init__(self, inner: MemorySplitLog, failures: int) -> None:
        super().__init__(inner, failures, at_once=True)
        self.batch_rows: list[int] = []

    async def read(self, start: dict[str, Offset | None], *, batch_rows: int = 4096):  # type: ignore[no-untyped-def]
        self.batch_rows.append(batch_rows)
        async for batch in super().read(start, batch_rows=batch_rows):
            yield batch


async def test_the_defaults_are_the_documented_ones(sleeps: _Sleeps) -> None:
    # batch_rows=4096, max_reader_retries=5, retry_delay=0.05 (doubling).
    log = RecordingFailingLog(make_log(a=2), failures=100)
    actor = SourceBackfill(log, splits=["a"], clock=FakeClock())  # type: ignore[arg-type]
    async with running(actor, FakeStore()) as (upstream, _, failed):
        await upstream.barrier(Add())
        await settle()
    assert log.reads == 6
    assert log.batch_rows == [4096] * 6
    assert sleeps.delays == [0.05, 0.1, 0.2, 0.4, 0.8]
    [error] = failed
    assert isinstance(error, ConnectionError)


_LOG = make_log(a=1)


@pytest.mark.parametrize(
    ("arguments", "argument", "expected", "got"),
    [
        ({"log": "redis://"}, "log", "a SplitLog", "str"),
        ({"splits": "a"}, "splits", "None or a sequence of split names", "a"),
        ({"splits": ["a", ""]}, "splits", "None or a sequence of split names", ["a", ""]),
        ({"splits": [1]}, "splits", "None or a sequence of split names", [1]),
        ({"batch_rows": 0}, "batch_rows", "a positive int", 0),
        ({"batch_rows": 2.0}, "batch_rows", "a positive int", 2.0),
        ({"wait_barrier_intervals": 0}, "wait_barrier_intervals", "a positive int", 0),
        ({"max_reader_retries": 0}, "max_reader_retries", "a positive int", 0),
        ({"max_reader_retries": True}, "max_reader_retries", "a positive int", True),
        ({"retry_delay": "1"}, "retry_delay", "seconds (a number > 0)", "1"),
        ({"retry_delay": True}, "retry_delay", "seconds (a number > 0)", True),
        ({"retry_delay": 0}, "retry_delay", "seconds in (0, 3600)", 0),
        ({"retry_delay": 3600}, "retry_delay", "seconds in (0, 3600)", 3600),
        ({"clock": 5}, "clock", "None or a callable returning seconds", 5),
    ],
    ids=lambda value: value if isinstance(value, str) and value.isidentifier() else None,
)
def test_bad_arguments_are_refused_with_what_was_expected_and_what_came(
    arguments: dict[str, object], argument: str, expected: str, got: object
) -> None:
    with pytest.raises(InvalidArgumentError) as bad:
        SourceBackfill(**{"log": _LOG, **arguments})  # type: ignore[arg-type]
    assert (bad.value.argument, bad.value.expected, bad.value.got) == (argument, expected, got)


async def test_good_arguments_at_their_bounds_are_accepted(sleeps: _Sleeps) -> None:
    # Accepted means taken as given: the smallest batch and retry count and the longest first
    # backoff are the ones the reader uses, and an empty split list or a rate of 0 reads
    # nothing (a wait of one interval is taken too; its effect has its own test).
    async def run(actor: SourceBackfill) -> list[Exception]:
        async with running(actor, FakeStore()) as (upstream, _, failed):
            await upstream.barrier(Add())
            await settle()
        return failed

    log = RecordingFailingLog(make_log(a=2), failures=100)
    bounds = SourceBackfill(
        log,  # type: ignore[arg-type]
        splits=("a",),
        batch_rows=1,
        wait_barrier_intervals=1,
        max_reader_retries=1,
        retry_delay=3599.5,
        clock=FakeClock(),
    )
    assert [type(error) for error in await run(bounds)] == [ConnectionError]
    assert log.batch_rows == [1, 1]  # the first read and its one retry
    assert sleeps.delays == [3599.5]
    nothing: list[dict[str, Any]] = [{"splits": []}, {"splits": ["a"], "rate_limit": 0}]
    for kwargs in nothing:
        log = RecordingFailingLog(make_log(a=2), failures=100)
        actor = SourceBackfill(log, clock=FakeClock(), **kwargs)  # type: ignore[arg-type]
        assert await run(actor) == []
        assert log.reads == 0
