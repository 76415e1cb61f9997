"""The sink writer: a stream actor that drives a sink task from the barriers it reads.

This is the single-writer exactly-once path (the coordinator adds the multi-writer one). Per
*sink epoch* — the rows between two checkpoint barriers, named by the ``curr`` epoch of the
barrier that opened it:

1. **begin**: after passing its first barrier (the initial one, or the ``Add`` barrier of a
   sink joining a running graph), and after each checkpoint barrier, the writer
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

Stopping: at a ``Stop`` on a checkpoint barrier (what a graceful runtime stop sends), or when
its input ends (an upstream stopped alone), the writer waits until every pre-committed epoch
is committed, then the sink task flushes and closes the connector. A ``Stop`` on a plain
barrier rolls back the open epoch first.
The writer passes barriers downstream, never chunks: it is a sink.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import final

import anyio
import numpy as np
import pyarrow as pa

from barrierflow._taskgroups import single_error
from barrierflow.actors.sinks.coordinator import Coordinator
from barrierflow.actors.sinks.errors import (
    CoordinatorMissingError,
    DuplicateWriterError,
    SinkWriterInputError,
)
from barrierflow.actors.sinks.protocol import PathChecked, SinkConnector
from barrierflow.actors.sinks.sink_task import (
    DEFAULT_CAPACITY,
    DEFAULT_FLUSH_INTERVAL,
    DEFAULT_SHUTDOWN_TIMEOUT,
    SinkTaskHandle,
    SinkTaskStats,
    check_task_options,
    start_sink_task,
)
from barrierflow.actors.sinks.writer_modes import CoordinatedCommits, LocalCommits, WriterMode
from barrierflow.channels.barrier import Barrier
from barrierflow.channels.chunk import Chunk
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.runtime.actor import ActorContext, StreamActor
from barrierflow.runtime.positions import SinkCommits
from barrierflow.runtime.startup import StartupContext
from barrierflow.runtime.state.state_store import StateTable

__all__ = ["SinkWriter"]


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
        InvalidArgumentError: ``connector`` is neither a connector nor a callable; ``name``
            is not ``None`` or a non-empty str; ``flush_interval`` is not a positive finite
            number; ``capacity`` is not an int >= 1 (checked here, not when the graph starts
            the sink task).
    """

    # An incarnation's state, set by run() (read only while it runs).
    _open: int | None  # the open sink epoch
    # This incarnation's first barrier is still to come: INITIAL for a graph that starts, an
    # Add barrier for a writer whose job joined a running graph.
    _first_barrier: bool
    _epoch_start: dict[str, int]  # source positions where the open epoch began (set at begin)

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
        check_task_options(
            "sink" if name is None else name, capacity, flush_interval, DEFAULT_SHUTDOWN_TIMEOUT
        )
        self._connector = connector
        self._name = name
        self._flush_interval = flush_interval
        self._capacity = capacity
        self._handle: SinkTaskHandle | None = None
        self._coordinator = coordinator
        self._local = LocalCommits(lambda: self._open)
        self._mode: WriterMode = (
            self._local if coordinator is None else CoordinatedCommits(coordinator)
        )
        self._prepared: SinkConnector | None = None  # made before the graph starts

    # Before the graph starts (see barrierflow.runtime.startup).

    def _connector_now(self) -> SinkConnector:
        """This incarnation's connector, made once (at the startup check, or at run)."""
        if self._prepared is None:
            self._prepared = self._make_connector()
        return self._prepared

    def input_schema(self) -> pa.Schema | None:
        """The sink's schema, which every batch must have: checked against the input's known
        schema before the graph starts (:mod:`barrierflow.runtime.startup`), rather than
        poisoning the first epoch."""
        schema = self._connector_now().schema
        return schema if isinstance(schema, pa.Schema) else None

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
            SinkPathError: the connector writes under a local path that cannot be used.
        """
        connector = self._connector_now()
        if isinstance(connector, PathChecked):
            connector.check_path(self._name or ctx.name)
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
        return self._local.committed_checkpoint

    async def wait_committed(self, checkpoint: int) -> None:
        """Wait until every row before checkpoint ``checkpoint`` (an epoch returned by
        ``Runtime.checkpoint``) is committed to the sink — visible to its readers. May be
        called before the writer runs."""
        await self._mode.wait_committed(checkpoint)

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
        self._open, self._first_barrier = None, True
        table = ctx.table("sink")
        records = await table.items()
        connector, self._prepared = self._connector_now(), None
        await self._mode.join(ctx, connector)
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
                await self._mode.recover(handle, table, records)
                with single_error():
                    async with anyio.create_task_group() as tasks:
                        tasks.start_soon(self._mode.background, ctx, handle, table)
                        await self._consume(ctx, handle, table)
                        # A graceful end (a Stop, or the input ended): what was pre-committed
                        # is committed before the writer leaves, so the rows are visible once
                        # the runtime stopped.
                        await self._mode.finish()
                        tasks.cancel_scope.cancel()
            except Exception as exc:
                # Let the sink task serve what is queued (a rollback) before it closes.
                failure = exc
            finally:
                handle.release()
        if failure is not None:
            raise failure

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
            raise SinkWriterInputError(ctx.name, "a barrier to begin an epoch before rows", "rows")
        chunk = chunk.compact()
        if chunk.ops is not None:
            changes = int(np.count_nonzero(chunk.ops_numpy()))  # Op.INSERT is 0
            if changes:
                raise SinkWriterInputError(
                    ctx.name,
                    "insert-only chunks (the sink is append-only)",
                    f"{changes} delete/update row(s)",
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
        if self._first_barrier:
            self._first_barrier = False
            await self._mode.on_first_barrier(barrier)
        if barrier.is_checkpoint and self._open is not None:
            epoch = self._open
            try:
                metadata = await handle.pre_commit(epoch, positions=(self._epoch_start, positions))
            except Exception:
                await handle.rollback_epoch(epoch)
                raise
            self._open = None
            await self._mode.on_checkpoint(handle, table, epoch, barrier.epoch.prev, metadata)
        await ctx.emit(barrier)
        if barrier.is_stop(ctx.actor_id):
            if self._open is not None:
                await handle.rollback_epoch(self._open)
                self._open = None
            await self._mode.on_stop(barrier)
            return
        bitmap = barrier.new_vnode_bitmap(ctx.actor_id)
        if bitmap is not None:
            await self._mode.on_rescale(bitmap)
        if self._open is None:
            await handle.begin_epoch(barrier.epoch.curr)
            self._open = barrier.epoch.curr
            self._epoch_start = positions
