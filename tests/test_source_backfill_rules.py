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
from typing import Any

import anyio
import pyarrow as pa
import pytest
from _timeouts import scaled
from anyio.streams.memory import MemoryObjectSendStream

from barrierflow.actors.backfill.errors import UnfinishedSplitMigratedError
from barrierflow.actors.backfill.source_backfill import TABLE, SourceBackfill
from barrierflow.actors.backfill.source_backfill_state import BackfillPhase, SplitBackfill
from barrierflow.actors.sources.split_log import OFFSET_MAJOR, SPLIT_COLUMN, Offset
from barrierflow.channels import (
    Add,
    Barrier,
    BarrierKind,
    Chunk,
    EpochPair,
    Message,
    Mutation,
    Resume,
    SourceChangeSplit,
    Split,
)
from barrierflow.errors import ProtocolError
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
    ) -> None:
        self.store = store
        self.inputs = {"upstream": upstream}
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
    ctx = FakeContext(store, receive, **context)
    failed: list[Exception] = []

    async def run() -> None:
        try:
            await actor.run(ctx)  # type: ignore[arg-type]
        except Exception as exc:  # the test asserts on it
            failed.append(exc)

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
