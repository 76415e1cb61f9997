"""The sink writer: a stream actor that drives a sink task from the barriers it reads.

This is the single-writer exactly-once path (the coordinator adds the multi-writer one). Per
*sink epoch* — the rows between two checkpoint barriers, named by the ``curr`` epoch of the
barrier that opened it:

1. **begin**: after passing the initial barrier, and after each checkpoint barrier, the writer
   begins the next sink epoch.
2. **write**: each chunk's visible rows (visibility compacted first) go to the sink task.
   The sink is append-only: a chunk with delete or update rows is refused.
3. **pre-commit**: at a checkpoint barrier ``(curr, prev)`` — before passing it on — the
   writer pre-commits the open sink epoch and records ``{epoch, checkpoint: prev, metadata}``
   in its state table. That record is sealed by the same barrier, so it becomes durable
   exactly when checkpoint ``prev`` does.
4. **commit**: a second task waits for the runtime's committed epoch to reach ``prev`` and
   only then commits the sink epoch (oldest first) and deletes its record. A crash between
   pre-commit and a durable checkpoint therefore never exposes rows that recovery replays.

On (re)start the writer hands its durable records to the sink's ``recover``: those epochs are
committed (their checkpoint is durable, the upstream will not replay them) and every other
staged epoch is rolled back (the upstream will replay it).

Failures: a failed pre-commit rolls the open epoch back and fails the writer; a failed commit
rolls back the open epoch and fails the writer, but leaves the failed epoch pre-committed —
its checkpoint is durable, so rolling it back would lose rows the upstream will never replay;
recovery commits it. The runtime's supervision or recovery takes over from there.

**Coordinated mode** (``coordinator=``, one of several parallel writers of a sink): the writer
registers its vnode bitmap (the one its hash-dispatched input gives it) with the sink's
:class:`~barrierflow.actors.sinks.coordinator.Coordinator`, waits to be started, aligns its initial
epoch on a fresh start, and at each checkpoint barrier sends its pre-commit metadata to the
coordinator and waits for the acknowledgement *before* passing the barrier — the coordinator
acknowledges once every vnode's writer reported and the epoch is recorded as pending, so no
checkpoint becomes durable without that record. Commit and recovery are the coordinator's. A
barrier carrying ``Update`` with a new bitmap for the writer re-registers it (rescaling); one
dropping it makes it leave the coordinator.

Stopping: at a ``Stop`` on a checkpoint barrier (what a graceful runtime stop sends) the
writer waits until every pre-committed epoch is committed, then the sink task flushes and
closes the connector. A ``Stop`` on a plain barrier rolls back the open epoch first.
The writer passes barriers downstream, never chunks: it is a sink.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, final

import anyio
import numpy as np

from barrierflow._taskgroups import single_error
from barrierflow.actors.sinks.coordinator import Coordinator, WriterHandle
from barrierflow.actors.sinks.errors import CoordinatorMissingError, DuplicateWriterError
from barrierflow.actors.sinks.protocol import PendingCommit, SinkConnector
from barrierflow.actors.sinks.sink_task import (
    DEFAULT_CAPACITY,
    DEFAULT_FLUSH_INTERVAL,
    SinkTaskHandle,
    SinkTaskStats,
    start_sink_task,
)
from barrierflow.channels.barrier import Barrier, BarrierKind
from barrierflow.channels.chunk import Chunk
from barrierflow.channels.errors import InvalidArgumentError, ProtocolError
from barrierflow.channels.mutation import Update
from barrierflow.channels.vnode import VnodeBitmap
from barrierflow.runtime.actor import ActorContext, StreamActor
from barrierflow.runtime.positions import SinkCommits
from barrierflow.runtime.startup import StartupContext
from barrierflow.runtime.state.state_store import StateTable

__all__ = ["SinkWriter"]


@dataclass(frozen=True, slots=True)
class _Pending:
    epoch: int  # the sink epoch
    checkpoint: int  # the checkpoint epoch whose durability allows the commit
    key: str  # its record in the state table


def _record_key(epoch: int) -> str:
    return f"{epoch:020d}"


@final
class SinkWriter(StreamActor):
    """Writes its input into a sink, exactly once if the connector is (see the module).

    Args:
        connector: the sink, or a factory called at every (re)start. Pass a factory unless the
            connector can be opened again after ``close``.
        name: the sink's name in logs, stats and errors (default: the actor's name).
        flush_interval: seconds between the sink task's periodic flushes.
        capacity: commands the sink task's inbox holds.

    Raises:
        InvalidArgumentError: ``connector`` is neither a connector nor a callable.
    """

    def __init__(
        self,
        connector: SinkConnector | Callable[[], SinkConnector],
        *,
        name: str | None = None,
        flush_interval: float = DEFAULT_FLUSH_INTERVAL,
        capacity: int = DEFAULT_CAPACITY,
        coordinator: Coordinator | None = None,
    ) -> None:
        if coordinator is not None and not isinstance(coordinator, Coordinator):
            raise InvalidArgumentError("coordinator", "None or a Coordinator", coordinator)
        if not isinstance(connector, SinkConnector) and not callable(connector):
            raise InvalidArgumentError(
                "connector", "a SinkConnector or a factory of one", type(connector).__name__
            )
        self._connector = connector
        self._name = name
        self._flush_interval = flush_interval
        self._capacity = capacity
        self._handle: SinkTaskHandle | None = None
        self._open: int | None = None
        self._pending: deque[_Pending] = deque()
        self._committed_one: anyio.Event | None = None
        self._committed_checkpoint = 0
        self._stopped = False
        self._coordinator = coordinator
        self._coordination: WriterHandle | None = None
        self._rewind: int | None = None
        self._last_checkpoint = 0
        self._prepared: SinkConnector | None = None  # made before the graph starts
        self._epoch_start: dict[str, int] = {}  # source positions where the open epoch began

    # Before the graph starts (see barrierflow.runtime.startup).

    def _connector_now(self) -> SinkConnector:
        """This incarnation's connector, made once (at the startup check, or at run)."""
        if self._prepared is None:
            self._prepared = self._make_connector()
        return self._prepared

    def check_startup(self, ctx: StartupContext) -> None:
        """Refuse a graph this writer would hang or lose rows in.

        Raises:
            CoordinatorMissingError: ``coordinator=`` is not a service of the runtime, or a
                parallel sibling (reading the same hash-dispatched input) has none while this
                writer has one.
            InvalidArgumentError: a coordinated writer whose connector has no writer id, or a
                writer id without a coordinator.
            DuplicateWriterError: a parallel sibling of the same coordinator uses this
                writer's writer id.
        """
        connector = self._connector_now()
        writer_id = getattr(connector, "writer", None)
        coordinator = self._coordinator
        if coordinator is None:
            if writer_id is not None:
                # A coordinated connector commits nothing itself: without a coordinator its
                # rows would never become visible.
                raise InvalidArgumentError(
                    f"sink writer {ctx.name!r}",
                    "coordinator= for a connector made with writer= (a parallel writer of a "
                    "coordinated sink), or a connector without writer=",
                    f"writer={writer_id!r} and no coordinator",
                )
            return
        if not any(service is coordinator for service in ctx.services.values()):
            raise CoordinatorMissingError(
                ctx.name,
                coordinator.sink,
                f"its Coordinator for sink {coordinator.sink!r} added to the runtime with "
                "rt.add_service(name, coordinator)",
                f"services {sorted(ctx.services)}",
            )
        if hasattr(connector, "writer") and writer_id is None:
            raise InvalidArgumentError(
                f"sink writer {ctx.name!r}",
                "writer=<unique id> on the connector of each parallel writer of a coordinated "
                "sink (their files are staged per writer)",
                "a connector without writer=",
            )
        for name, sibling in ctx.siblings.items():
            if not isinstance(sibling, SinkWriter):
                continue
            if sibling._coordinator is None:
                raise CoordinatorMissingError(
                    name,
                    None,
                    f"coordinator= like its parallel sibling {ctx.name!r} (sink "
                    f"{coordinator.sink!r})",
                    "no coordinator",
                )
            if sibling._coordinator is coordinator and writer_id is not None:
                other = getattr(sibling._connector_now(), "writer", None)
                if other == writer_id and name < ctx.name:
                    raise DuplicateWriterError(coordinator.sink, writer_id, name, ctx.name)

    async def sink_commits(self) -> SinkCommits | None:
        """What this writer's sink already holds (asked on an empty state store): the
        coordinator's committer answers for a coordinated sink, else the connector."""
        source: object = (
            self._connector_now() if self._coordinator is None else self._coordinator.committer
        )
        reader = getattr(source, "sink_commits", None)
        if reader is None:
            await anyio.lowlevel.checkpoint()
            return None
        commits: SinkCommits | None = await reader()
        return commits

    def stats(self) -> SinkTaskStats | None:
        """The sink task's counters, while it runs (``None`` before)."""
        return None if self._handle is None else self._handle.stats()

    @property
    def committed_checkpoint(self) -> int:
        """The checkpoint epoch up to which this writer's rows are committed to the sink
        (0 until the first commit of this incarnation)."""
        return self._committed_checkpoint

    async def wait_committed(self, checkpoint: int) -> None:
        """Wait until every row before checkpoint ``checkpoint`` (an epoch returned by
        ``Runtime.checkpoint``) is committed to the sink — visible to its readers."""
        if self._coordinator is not None:
            await self._coordinator.wait_committed(checkpoint)
            return
        while self._committed_checkpoint < checkpoint:
            if self._committed_one is None:
                await anyio.sleep(0.001)  # not started yet
                continue
            await self._committed_one.wait()

    def _make_connector(self) -> SinkConnector:
        if isinstance(self._connector, SinkConnector):
            return self._connector
        connector = self._connector()
        if not isinstance(connector, SinkConnector):
            raise InvalidArgumentError(
                "connector", "a factory returning a SinkConnector", type(connector).__name__
            )
        return connector

    async def run(self, ctx: ActorContext) -> None:
        """Recover the sink (or join its coordinator), then write every message's rows and
        follow its barriers."""
        self._open, self._pending, self._stopped = None, deque(), False
        self._committed_one = anyio.Event()
        table = ctx.table("sink")
        records = await table.items()
        self._coordination, self._rewind = None, None
        connector, self._prepared = self._connector_now(), None
        if self._coordinator is not None:
            bitmap = ctx.vnode_bitmap or VnodeBitmap.full(self._coordinator.vnode_count)
            self._coordination = await self._coordinator.register(
                bitmap, writer=getattr(connector, "writer", None), name=ctx.name
            )
            self._rewind = await self._coordination.wait_started()
        failure: BaseException | None = None
        async with anyio.create_task_group() as sink_group:
            handle = await start_sink_task(
                sink_group,
                connector,
                name=self._name or ctx.name,
                capacity=self._capacity,
                flush_interval=self._flush_interval,
            )
            self._handle = handle
            try:
                if self._coordination is None:
                    pending = sorted(records.values(), key=lambda r: r["epoch"])
                    await handle.recover(
                        [PendingCommit(r["epoch"], r["metadata"]) for r in pending]
                    )
                    for key in records:
                        table.delete(key)  # committed; the delete is durable at the next checkpoint
                with single_error():
                    async with anyio.create_task_group() as tasks:
                        if self._coordination is None:
                            tasks.start_soon(self._commit_when_durable, ctx, handle, table)
                        await self._consume(ctx, handle, table)
                        if self._stopped:
                            await self._wait_for_last_commit()
                        tasks.cancel_scope.cancel()
            except Exception as exc:
                # Let the sink task serve what is queued (a rollback) before it closes.
                failure = exc
            finally:
                handle.release()
        if failure is not None:
            raise failure

    async def _wait_for_last_commit(self) -> None:
        """At a graceful stop: wait until what was pre-committed is committed (and leave the
        coordinator), so that the rows are visible once the runtime has stopped."""
        if self._coordinator is not None:
            if self._coordination is None:
                return  # left the coordinator already (dropped by a rescale)
            await self._coordinator.wait_committed(self._last_checkpoint)
            await self._coordination.stop()
            return
        while self._pending:
            assert self._committed_one is not None
            await self._committed_one.wait()

    async def _consume(self, ctx: ActorContext, handle: SinkTaskHandle, table: StateTable) -> None:
        async for message in ctx.messages():
            if isinstance(message, Chunk):
                await self._write(ctx, handle, message)
            elif isinstance(message, Barrier):
                await self._on_barrier(ctx, handle, table, message)
            # Watermarks mean nothing to a sink.

    async def _write(self, ctx: ActorContext, handle: SinkTaskHandle, chunk: Chunk) -> None:
        if chunk.cardinality == 0:
            return
        if self._open is None:
            raise ProtocolError(
                f"sink writer {ctx.name!r}: expected a barrier to begin an epoch before rows"
            )
        chunk = chunk.compact()
        if chunk.ops is not None:
            changes = int(np.count_nonzero(chunk.ops_numpy()))  # Op.INSERT is 0
            if changes:
                raise ProtocolError(
                    f"sink writer {ctx.name!r}: expected insert-only chunks (the sink is "
                    f"append-only), got {changes} delete/update row(s)"
                )
        try:
            await handle.write_batch(chunk.batch)
        except Exception:
            await handle.rollback_epoch(self._open)
            raise

    async def _on_barrier(
        self, ctx: ActorContext, handle: SinkTaskHandle, table: StateTable, barrier: Barrier
    ) -> None:
        # Where the rows before this barrier come from (read before the barrier is passed:
        # the runtime forgets an epoch's positions once every actor collected it). Recorded
        # with the epoch's rows, so a sink can tell a replay of rows it holds even if the
        # runtime's store is lost.
        positions = ctx.positions_at(barrier)
        if (
            barrier.kind is BarrierKind.INITIAL
            and self._coordination is not None
            and self._rewind is None
        ):
            # A fresh coordinated sink: every writer starts at the same (the latest) epoch.
            await self._coordination.align_initial_epoch(barrier.epoch.curr)
        if barrier.kind is BarrierKind.CHECKPOINT and self._open is not None:
            epoch = self._open
            try:
                metadata = await handle.pre_commit(epoch, positions=(self._epoch_start, positions))
            except Exception:
                await handle.rollback_epoch(epoch)
                raise
            self._open = None
            if self._coordination is not None:
                # Acknowledged only once every writer's part of the epoch is in and recorded
                # as pending: the checkpoint cannot become durable without that record.
                await self._coordination.commit(barrier.epoch.prev, dict(metadata))
                await handle.commit_epoch(epoch)  # the sink task's bookkeeping; a no-op write
                self._last_checkpoint = barrier.epoch.prev
            else:
                key = _record_key(epoch)
                record: dict[str, Any] = {
                    "epoch": epoch,
                    "checkpoint": barrier.epoch.prev,
                    "metadata": dict(metadata),
                }
                table.put(key, record)  # sealed by this barrier: durable with its checkpoint
                self._pending.append(_Pending(epoch, barrier.epoch.prev, key))
        await ctx.emit(barrier)
        if barrier.is_stop(ctx.actor_id):
            self._stopped = True
            if self._open is not None:
                await handle.rollback_epoch(self._open)
                self._open = None
            if self._coordination is not None and isinstance(barrier.mutation, Update):
                # Dropped by a rescale: leave now, so the coordinator can realign the others
                # (waiting for a commit here would wait on that very realignment).
                await self._coordination.stop()
                self._coordination = None
            return
        bitmap = barrier.new_vnode_bitmap(ctx.actor_id)
        if self._coordination is not None and bitmap is not None:
            # Rescaled: every writer of the sink gets the same barrier, so the coordinator
            # sees every writer's new bitmap (or stop) and realigns before the next commit.
            await self._coordination.update_vnode_bitmap(bitmap)
            await self._coordination.wait_started()
        if self._open is None:
            await handle.begin_epoch(barrier.epoch.curr)
            self._open = barrier.epoch.curr
            self._epoch_start = positions

    async def _commit_when_durable(
        self, ctx: ActorContext, handle: SinkTaskHandle, table: StateTable
    ) -> None:
        async for committed in ctx.committed_epochs():
            while self._pending and self._pending[0].checkpoint <= committed:
                pending = self._pending[0]
                try:
                    await handle.commit_epoch(pending.epoch)
                except Exception:
                    # The failed epoch stays pre-committed for recovery to commit; only the
                    # open epoch, which the upstream will replay, is rolled back.
                    if self._open is not None:
                        await handle.rollback_epoch(self._open)
                    raise
                self._pending.popleft()
                table.delete(pending.key)
                self._committed_checkpoint = pending.checkpoint
                done, self._committed_one = self._committed_one, anyio.Event()
                if done is not None:
                    done.set()
