"""The sink writer: a stream actor that stages its input through a sink task and hands each
epoch's manifest to its sink's coordinator.

Every sink — one writer or many — is a table committed by one
:class:`~barrierflow.actors.Coordinator` (:mod:`barrierflow.actors.sinks.table`);
the writer only stages. Per *sink epoch* — the rows between two checkpoint barriers, named by
the ``curr`` epoch of the barrier that opened it:

1. **join**: before its first message the writer registers its vnodes with the coordinator (the
   bitmap its hash-dispatched input gives it; round-robin writers take an even share, a writer
   alone every vnode) and waits to be started. On a fresh start its first barrier (the initial
   one, or the ``Add`` barrier of a sink joining a running graph) aligns the initial epoch of
   every writer of the sink.
2. **begin**: after passing its first barrier, and after each checkpoint barrier, the writer
   begins the next sink epoch in its staging writer.
3. **write**: each chunk's visible rows (visibility compacted first) go to the sink task. A
   chunk with delete or update rows goes to the staging writer's ``write_changes`` when it
   takes changes (:class:`~barrierflow.actors.sinks.table.TakesChanges`), else is refused.
4. **stage**: at a checkpoint barrier ``(curr, prev)`` — before passing it on — the writer
   stages the open epoch, adds to the staging writer's manifest its vnodes and the source
   positions the epoch's rows span, and sends it to the coordinator as checkpoint ``prev``'s
   part. The coordinator acknowledges once every vnode's writer reported and the epoch is
   recorded as pending in the meta store, so no checkpoint becomes durable without that
   record; it commits the epoch into the table once the checkpoint is durable. A crash in
   between never exposes rows that recovery replays: the coordinator aborts what was not
   durable, commits what was.

Committables: a :class:`~barrierflow.channels.messages.Committable` for this writer's sink (a
micro-batch Spark tasks staged, see :mod:`barrierflow.actors.sinks.committables`) joins the
open epoch: its files exist (checked, or the epoch fails with
:class:`~barrierflow.errors.StagedFilesGoneError`) and go to the coordinator with the epoch's
manifest. One for another sink is passed on.

Failures: a failed stage discards the open epoch and fails the writer; the runtime's
supervision or recovery takes over from there. Rescaling: a barrier carrying ``Update`` with a
new bitmap for the writer re-registers it; one dropping it makes it leave the coordinator.

Stopping: at a ``Stop`` on a checkpoint barrier (what a graceful runtime stop sends), or when
its input ends (an upstream stopped alone), the writer waits until its last checkpoint is
committed, leaves the coordinator, then the sink task flushes and closes the staging writer.
A ``Stop`` on a plain barrier discards the open epoch first. The writer passes barriers
downstream, never chunks: it is a sink.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import final

import anyio
import numpy as np
import pyarrow as pa

from barrierflow.actors.sinks.committables import StagedBatch
from barrierflow.actors.sinks.coordinator.coordinator import Coordinator
from barrierflow.actors.sinks.coordinator.handles import WriterHandle
from barrierflow.actors.sinks.errors import (
    CoordinatorMissingError,
    DuplicateWriterError,
    SinkStateMismatchError,
    SinkWriterInputError,
    StagedFilesGoneError,
)
from barrierflow.actors.sinks.metrics import writer_families
from barrierflow.actors.sinks.positions import table_commits
from barrierflow.actors.sinks.sink_task import (
    DEFAULT_CAPACITY,
    DEFAULT_FLUSH_INTERVAL,
    DEFAULT_SHUTDOWN_TIMEOUT,
    SinkTaskHandle,
    SinkTaskStats,
    check_task_options,
    start_sink_task,
)
from barrierflow.actors.sinks.table import PathChecked, StagingWriter
from barrierflow.channels.barrier import Barrier
from barrierflow.channels.chunk import Chunk
from barrierflow.channels.errors import InvalidArgumentError, SchemaMismatchError
from barrierflow.channels.messages import Committable
from barrierflow.channels.mutation import Update
from barrierflow.channels.schema import conform_schema
from barrierflow.channels.vnode import VnodeBitmap
from barrierflow.runtime.actor import ActorContext, StreamActor
from barrierflow.runtime.metrics import MetricFamily
from barrierflow.runtime.placement import Placement
from barrierflow.runtime.startup import EmptyStore, StartupContext

__all__ = ["SinkWriter"]


@final
class SinkWriter(StreamActor):
    """Stages its input for its sink's coordinator to commit, exactly once (see the module).

    Args:
        writer: a factory of this writer's staging writer (``lambda: table.writer("0")``),
            called once per incarnation.
        coordinator: the sink's coordinator (a service of the runtime or job).
        writer_id: this writer's id among the sink's writers (unique: two writers with one id
            would stage over each other's files).
        name: the sink's name in logs, stats and errors (default: the actor's name).
        flush_interval: seconds between the sink task's periodic flushes.
        capacity: commands the sink task's inbox holds.

    Raises:
        InvalidArgumentError: ``writer`` is not callable; ``coordinator`` not a Coordinator;
            ``writer_id`` not a non-empty str; ``name`` not ``None`` or a non-empty str;
            ``flush_interval`` not a positive finite number; ``capacity`` not an int >= 1
            (checked here, not when the graph starts the sink task).
    """

    #: A writer takes any row; a key (add_sink's) only spreads them.
    placement = Placement.PARTITION_LOCAL

    # An incarnation's state, set by run() (read only while it runs).
    _open: int | None  # the open sink epoch
    # This incarnation's first barrier is still to come: INITIAL for a graph that starts, an
    # Add barrier for a writer whose job joined a running graph.
    _first_barrier: bool
    _epoch_start: dict[str, int]  # source positions where the open epoch began (set at begin)
    _line: WriterHandle | None  # this writer's line to the coordinator (None: it left)
    _rewind: int | None  # the rewind epoch the coordinator started it with (None: fresh)
    _last_checkpoint: int  # the last checkpoint whose manifest the coordinator acknowledged
    _staged: list[StagedBatch]  # batches staged outside the graph that joined the open epoch

    def __init__(
        self,
        writer: Callable[[], StagingWriter],
        *,
        coordinator: Coordinator,
        writer_id: str,
        name: str | None = None,
        flush_interval: float = DEFAULT_FLUSH_INTERVAL,
        capacity: int = DEFAULT_CAPACITY,
    ) -> None:
        if not callable(writer) or isinstance(writer, StagingWriter):
            raise InvalidArgumentError(
                "writer", "a factory of StagingWriters", type(writer).__name__
            )
        if not isinstance(coordinator, Coordinator):
            raise InvalidArgumentError("coordinator", "a Coordinator", coordinator)
        if not isinstance(writer_id, str) or not writer_id:
            raise InvalidArgumentError("writer_id", "a non-empty writer id", writer_id)
        check_task_options(
            "sink" if name is None else name, capacity, flush_interval, DEFAULT_SHUTDOWN_TIMEOUT
        )
        self._factory = writer
        self._coordinator = coordinator
        self._writer_id = writer_id
        self._name = name
        self._flush_interval = flush_interval
        self._capacity = capacity
        self._handle: SinkTaskHandle | None = None
        self._actor = ""  # the actor running it (set when it runs)
        self._prepared: StagingWriter | None = None  # made before the graph starts

    @property
    def coordinator(self) -> Coordinator:
        """The sink's coordinator."""
        return self._coordinator

    @property
    def writer_id(self) -> str:
        """This writer's id among the sink's writers."""
        return self._writer_id

    # Before the graph starts (see barrierflow.runtime.startup).

    def _writer_now(self) -> StagingWriter:
        """This incarnation's staging writer, made once (at the startup check, or at run)."""
        if self._prepared is None:
            writer = self._factory()
            if not isinstance(writer, StagingWriter):
                raise InvalidArgumentError(
                    "writer", "a factory returning a StagingWriter", type(writer).__name__
                )
            self._prepared = writer
        return self._prepared

    def input_schema(self) -> pa.Schema | None:
        """The sink's schema, which every batch must have: checked against the input's known
        schema before the graph starts (:mod:`barrierflow.runtime.startup`), rather than
        poisoning the first epoch."""
        schema = self._writer_now().schema
        return schema if isinstance(schema, pa.Schema) else None

    def check_startup(self, ctx: StartupContext) -> None:
        """Refuse a graph this writer would hang or lose rows in.

        Raises:
            CoordinatorMissingError: the coordinator is not a service of the runtime.
            DuplicateWriterError: a parallel sibling of the same coordinator uses this
                writer's id.
            SinkPathError: the staging writer writes under a local path that cannot be used.
        """
        writer = self._writer_now()
        if isinstance(writer, PathChecked):
            writer.check_path(self._name or ctx.name)
        coordinator = self._coordinator
        if not any(service is coordinator for service in ctx.services.values()):
            raise CoordinatorMissingError(
                ctx.name,
                coordinator.sink,
                f"its Coordinator for sink {coordinator.sink!r} added to the runtime with "
                "rt.add_service(name, coordinator)",
                f"services {sorted(ctx.services)}",
            )
        for name, sibling in ctx.siblings.items():
            if (
                isinstance(sibling, SinkWriter)
                and sibling.coordinator is coordinator
                and sibling.writer_id == self._writer_id
                and name < ctx.name
            ):
                raise DuplicateWriterError(coordinator.sink, self._writer_id, name, ctx.name)

    async def positions_held(self, store: EmptyStore) -> dict[str, int] | None:
        """The source positions this writer's table holds (asked on an empty state store;
        ``None``: it holds nothing, or cannot tell).

        Raises:
            SinkStateMismatchError: the table holds commits and ``store`` may not adopt them:
                starting would make the upstream replay rows the table has.
        """
        commits = await table_commits(self._coordinator.committer)
        if commits is None:
            return None
        if not store.adopt:
            raise SinkStateMismatchError(
                commits.sink, store.state_path, commits.epoch, commits.positions
            )
        return commits.positions

    def stats(self) -> SinkTaskStats | None:
        """The sink task's counters, while it runs (``None`` before)."""
        return None if self._handle is None else self._handle.stats()

    def metric_families(self) -> list[MetricFamily]:
        """The sink task's counters as metrics (the runtime collects them while it runs)."""
        stats = self.stats()
        return [] if stats is None else writer_families(self._coordinator.sink, self._actor, stats)

    async def wait_committed(self, checkpoint: int) -> None:
        """Wait until every row before checkpoint ``checkpoint`` (an epoch returned by
        ``Runtime.checkpoint``) is committed to the table — visible to its readers. May be
        called before the writer runs."""
        await self._coordinator.wait_committed(checkpoint)

    # Running.

    async def run(self, ctx: ActorContext) -> None:
        """Join the coordinator, then stage every message's rows and follow its barriers."""
        self._open, self._first_barrier, self._last_checkpoint = None, True, 0
        self._staged = []
        writer, self._prepared = self._writer_now(), None
        self._actor = ctx.name  # its metrics' label
        await self._join(ctx)
        failure: BaseException | None = None
        async with anyio.create_task_group() as sink_group:
            handle = await start_sink_task(
                sink_group,
                writer,
                name=self._name or ctx.name,
                capacity=self._capacity,
                flush_interval=self._flush_interval,
            )
            self._handle = handle
            try:
                await self._consume(ctx, handle)
                # A graceful end (a Stop, or the input ended): what was staged is committed
                # before the writer leaves, so the rows are visible once the runtime stopped.
                await self._finish()
            except Exception as exc:
                # Let the sink task serve what is queued (a discard) before it closes.
                failure = exc
            finally:
                handle.release()
        if failure is not None:
            raise failure

    async def _join(self, ctx: ActorContext) -> None:
        """Register this writer's vnodes and wait to be started."""
        bitmap = ctx.vnode_bitmap
        if bitmap is None:
            # Round-robin writers: a row of any vnode may reach any of them, so the vnodes are
            # only the coordinator's ledger of who must register; each takes an even share
            # (all of them, for a writer declared alone).
            shares = VnodeBitmap.split(len(ctx.peers), self._coordinator.vnode_count)
            bitmap = shares[ctx.peers.index(ctx.name)]
        self._line = await self._coordinator.register(bitmap, writer=self._writer_id, name=ctx.name)
        self._rewind = await self._line.wait_started()

    async def _finish(self) -> None:
        """Wait until the last checkpoint is committed, then leave the coordinator."""
        if self._line is None:
            return  # left already (dropped by a rescale)
        if self._last_checkpoint:  # nothing was acknowledged: nothing to wait for
            await self._coordinator.wait_committed(self._last_checkpoint)
        await self._line.stop()

    async def _consume(self, ctx: ActorContext, handle: SinkTaskHandle) -> None:
        async for message in ctx.messages(committables=True):
            if isinstance(message, Chunk):
                await self._write(ctx, handle, message)
            elif isinstance(message, Barrier):
                await self._on_barrier(ctx, handle, message)
            elif isinstance(message, Committable):
                await self._take(ctx, message)
            # Watermarks mean nothing to a sink.

    async def _take(self, ctx: ActorContext, message: Committable) -> None:
        """A committable joins the open epoch if it is for this sink; else it is passed on."""
        sink = self._coordinator.sink
        if message.sink != sink:
            await ctx.emit(message)
            return
        batch = message.payload
        if not isinstance(batch, StagedBatch):
            raise SinkWriterInputError(
                ctx.name, "committables whose payload is a StagedBatch", type(batch).__name__
            )
        # An epoch is open: a committable comes after its upstream's first barrier (the
        # runtime refuses one emitted before), and nothing follows a Stop.
        assert self._open is not None
        missing = await anyio.to_thread.run_sync(batch.missing_file)
        if missing is not None:
            raise StagedFilesGoneError(sink, batch.label, missing)
        self._staged.append(batch)

    async def _write(self, ctx: ActorContext, handle: SinkTaskHandle, chunk: Chunk) -> None:
        if chunk.cardinality == 0:
            return
        if self._open is None:
            raise SinkWriterInputError(ctx.name, "a barrier to begin an epoch before rows", "rows")
        chunk = chunk.compact()
        changes = 0 if chunk.ops is None else int(np.count_nonzero(chunk.ops_numpy()))
        # Op.INSERT is 0; a table that takes no changes (TakesChanges) is append-only.
        if changes and not handle.takes_changes:
            raise SinkWriterInputError(
                ctx.name,
                "insert-only chunks (the sink is append-only)",
                f"{changes} delete/update row(s)",
            )
        batch = _in_table_schema(chunk.batch, handle.schema)
        try:
            if changes:
                await handle.write_changes(batch, pa.array(chunk.ops_numpy()))
            else:
                await handle.write(batch)
        except Exception:
            await handle.discard(self._open)
            raise

    async def _on_barrier(
        self, ctx: ActorContext, handle: SinkTaskHandle, barrier: Barrier
    ) -> None:
        # Where the rows before this barrier come from (read before the barrier is passed:
        # the runtime forgets an epoch's positions once every actor collected it). They go in
        # the epoch's manifest, and the table records them with the rows, so it can tell a
        # replay of rows it holds even if the runtime's store is lost.
        positions = ctx.positions_at(barrier)
        line = self._line
        if self._first_barrier:
            self._first_barrier = False
            if line is not None and self._rewind is None:
                # A fresh sink: every writer starts at the same (the latest) epoch — the one
                # its first barrier opens.
                await line.align_initial_epoch(barrier.epoch.curr)
        if barrier.is_checkpoint and self._open is not None:
            epoch = self._open
            try:
                manifest = await handle.stage(epoch)
            except Exception:
                await handle.discard(epoch)
                raise
            self._open = None
            assert line is not None  # a writer that left gets no more checkpoints
            manifest = replace(
                manifest,
                vnodes=line.bitmap.runs(),
                positions=positions,
                positions_from=self._epoch_start,
            )
            # Acknowledged only once every writer's part of the epoch is in and recorded as
            # pending: the checkpoint cannot become durable without that record.
            staged, self._staged = tuple(self._staged), []
            await line.commit(barrier.epoch.prev, manifest, staged)
            self._last_checkpoint = barrier.epoch.prev
        await ctx.emit(barrier)
        if barrier.is_stop(ctx.actor_id):
            if self._open is not None:
                await handle.discard(self._open)
                self._open = None  # its committables go with it: the producer stages again
            if line is not None and isinstance(barrier.mutation, Update):
                # Dropped by a rescale: leave now, so the coordinator can realign the others
                # (waiting for a commit here would wait on that realignment).
                await line.stop()
                self._line = None
            return
        bitmap = barrier.new_vnode_bitmap(ctx.actor_id)
        if bitmap is not None and line is not None:
            # Every writer of the sink gets the same barrier, so the coordinator sees every
            # new bitmap (or stop) and realigns before the next commit.
            await line.update_vnode_bitmap(bitmap)
            await line.wait_started()
        if self._open is None:
            await handle.begin(barrier.epoch.curr)
            self._open = barrier.epoch.curr
            self._epoch_start = positions


def _in_table_schema(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` labelled with the table's ``schema`` when only nullability or metadata differ
    — an operator declares its key columns not null, a table's may be nullable — without
    copying; otherwise as it is, for the sink's own check to name the difference."""
    if batch.schema.equals(schema):
        return batch
    try:
        conform_schema(batch, schema, "batch")
    except SchemaMismatchError:
        return batch
    return pa.RecordBatch.from_arrays(batch.columns, schema=schema)
