"""The snapshot backfill actor (after RisingWave's ``snapshot_backfill/executor.rs``): a job
added over a running materialized view (:mod:`.materialize`) sees the view's contents as of one
epoch, then every later change, each once, then the live view.

RisingWave gives the new job its own barriers, which trail the upstream's, and merges them back
when it has caught up. barrierflow has one epoch stream, so the phases happen *inside* the live
epochs — the actor passes every live barrier, and between them emits:

1. **Snapshot.** The snapshot epoch ``E`` is the view's last committed epoch when the job is
   created; the actor pins it in the view's tables (compaction keeps ``E`` and every later
   change log) and reads each of its vnodes as of ``E`` in primary-key order, in chunks of
   ``batch_rows``, while the live upstream keeps flowing. Its chunks are **dropped, not
   buffered**: the epochs they belong to are read back from the view's change log. Each live
   barrier closes an epoch that is now owed. Per-vnode progress (the last key emitted, rows)
   goes into the actor's state at every barrier: a restart resumes mid-vnode.
2. **Change log.** The owed epochs are replayed oldest first, each whole (an epoch whose live
   chunks were partly dropped is read whole — never half live, half replayed), and the allowed
   lag only shrinks (:mod:`.snapshot_progress`): at a live barrier the actor replays until no
   more than the allowed lag is owed before it passes the barrier. The change log of the epoch
   a barrier just closed is readable at once — sealed, not yet durable — so holding the barrier
   never waits for a checkpoint it holds up itself (the deadlock the seed's history fixed). A
   vnode-bitmap update in phases 1 or 2 is a :class:`~barrierflow.errors.
   VnodeUpdateDuringBackfillError`.
3. **Forward.** At the first barrier with nothing owed, the pin is released, the job reports
   itself finished, and from the epoch that barrier opens the live upstream is forwarded as is;
   vnode-bitmap updates are allowed again.

A job restarted after it finished skips straight to forwarding (its state must say every vnode
is done: else :class:`~barrierflow.errors.SnapshotBackfillStateError`). Barriers always win:
upstream messages are taken before every snapshot or change-log chunk. ``Throttle`` (rows/s; 0
pauses) and ``Pause``/``Resume`` apply to the snapshot and to the replay between barriers;
while paused the allowed lag does not shrink, and a replay a barrier waits on is never rate
limited (a barrier must not wait on the rate). Progress (rows, phase, epochs owed) is reported
with every barrier. A dropped job releases its pin with its last barrier. The upstream ending
before the job forwards is an :class:`~barrierflow.actors.backfill.errors.
UpstreamEndedDuringBackfillError` (the epochs owed would be lost, as the seed's "end of
upstream" error says); once forwarding, it ends the actor cleanly.

**A view kept on Spark's executors** (an ``aggregate`` run in Spark's tasks, whose state lives
in a shared directory, not in the driver's store) is read through the :class:`SharedViewSource`
given as ``shared=`` (declared with ``SparkBridge.shared_view(step).backfill()``). No row of it
flows on the driver, so the job **follows** the view instead of forwarding it: the snapshot
epoch is the view's last committed epoch, the owed epochs are those the view commits after it
(each read back whole from its change log once committed, never waited for), at each live
barrier every committed epoch owed is replayed, and the job never switches to forwarding; its
pin moves up to the last epoch replayed, so compaction keeps what it still has to read. It
reports itself finished once the snapshot is done and it has replayed every epoch committed so
far.

**A view that is itself still backfilling** is a safe upstream: its table holds exactly what it
has emitted, and its change log every later emission, so the new job sees the view's own output
stream — whatever its phase.

The upstream is the view (its forwarded output); ``view=`` names the Materialize actor (or its
parallel group), or another actor keeping a view (:class:`~.materialize.ViewActor`: a keyed
aggregate) — anything else is refused when the job is added
(:class:`~barrierflow.errors.NotAMaterializedViewError`). A parallel view is read by naming
its group in a list of inputs (``inputs=["view"]`` stands for ``view.0``, ``view.1``, …:
merged, barriers aligned). A
parallel backfill declared with ``parallelism=N, key=<the view's distribution key>`` reads the
vnodes its input routes to it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol, final

import anyio
import pyarrow as pa

from barrierflow.actors.backfill.errors import (
    NotAMaterializedViewError,
    SnapshotBackfillStateError,
    UpstreamEndedDuringBackfillError,
    VnodeUpdateDuringBackfillError,
)
from barrierflow.actors.backfill.materialize import VIEW_TABLE, ViewActor
from barrierflow.actors.backfill.snapshot_progress import SnapshotPhase, SnapshotProgress
from barrierflow.channels.barrier import Barrier
from barrierflow.channels.chunk import Chunk
from barrierflow.channels.errors import InvalidArgumentError, ProtocolError
from barrierflow.channels.messages import Committable, Message
from barrierflow.channels.mutation import check_rate
from barrierflow.channels.vnode import VnodeBitmap
from barrierflow.runtime.actor import ActorContext, StreamActor
from barrierflow.runtime.inputs import Messages
from barrierflow.runtime.placement import Placement
from barrierflow.runtime.progress import Progress
from barrierflow.runtime.startup import StartupContext
from barrierflow.runtime.state.state_store import StateTable

__all__ = ["SharedViewSource", "SnapshotBackfill", "ViewTable"]

#: The actor's state table.
TABLE = "snapshot_backfill"
_OP = "_op"


class ViewTable(Protocol):
    """What the actor reads of a view's table: a
    :class:`~barrierflow.runtime.state.versioned_table.VersionedTable` of the driver's store, or
    a shared view's (:class:`SharedViewSource`)."""

    @property
    def vnode_count(self) -> int:
        """The vnodes of the key space."""
        ...

    @property
    def primary_key(self) -> tuple[str, ...]:
        """The view's key columns."""
        ...

    def pin(self, reader: str, epoch: int) -> None:
        """Keep ``epoch``'s version and every later change log for ``reader``."""
        ...

    def unpin(self, reader: str) -> None:
        """Release ``reader``'s pin."""
        ...

    def epochs_after(self, epoch: int) -> list[int]:
        """The epochs after ``epoch`` whose change logs are readable, ascending."""
        ...

    async def change_log(self, epoch: int, vnodes: VnodeBitmap | None = None) -> pa.Table:
        """What ``epoch`` changed (ops in ``_op``), only ``vnodes``' rows if given."""
        ...

    async def read_vnode(
        self, vnode: int, epoch: int, *, after: Sequence[Any] | None = None
    ) -> pa.Table:
        """``vnode``'s rows as of ``epoch`` in key order (after the key ``after``)."""
        ...


class SharedViewSource(Protocol):
    """A view kept outside the driver's store, which no row of flows on the driver: the job
    follows its committed epochs (see the module)."""

    def tables(self) -> list[ViewTable]:
        """The view's tables (one per parallel member, or one)."""
        ...

    def committed_epoch(self) -> int:
        """The view's last committed epoch (0: none yet)."""
        ...


@final
class SnapshotBackfill(StreamActor):
    """Backfills a materialized view's snapshot and change log into a job, then forwards the
    view (see the module).

    Args:
        view: the Materialize actor (or parallel group) whose output is this actor's input.
        batch_rows: rows per emitted chunk.
        rate_limit: rows per second of snapshot and change-log chunks (``None``: unlimited;
            0: paused).
        shared: where the view is kept when not in the driver's store (an aggregate run in
            Spark's tasks: ``SparkBridge.shared_view(step)``); the job then follows it (see
            the module). Declare such a job with ``SparkBridge.shared_view(step).backfill()``.

    Raises:
        InvalidArgumentError: a bad argument.
    """

    #: Rows by key: parallel instances are hash-dispatched by the key add_actor names.
    placement = Placement.KEYED

    backfills = True

    # The rows being emitted: a vnode's snapshot, or an epoch's change log (set by _load).
    _rows: pa.Table
    _rows_of: tuple[str, int] | None = None
    _position: int

    def __init__(
        self,
        view: str,
        *,
        batch_rows: int = 4096,
        rate_limit: float | None = None,
        shared: SharedViewSource | None = None,
    ) -> None:
        if not isinstance(view, str) or not view:
            raise InvalidArgumentError("view", "the name of a Materialize actor", view)
        if shared is not None and not (
            callable(getattr(shared, "tables", None))
            and callable(getattr(shared, "committed_epoch", None))
        ):
            raise InvalidArgumentError(
                "shared", "None or a shared view (SparkBridge.shared_view(step))", shared
            )
        self.shared = shared
        if type(batch_rows) is not int or batch_rows < 1:
            raise InvalidArgumentError("batch_rows", "a positive int", batch_rows)
        check_rate("rate_limit", rate_limit)
        self.view = view
        self._batch_rows = batch_rows
        self._rate = rate_limit

    def check_startup(self, ctx: StartupContext) -> None:
        """Refuse a view that is not a materialized view, before the job is added.

        Raises:
            NotAMaterializedViewError: no actor (or parallel group) of that name keeps one.
        """
        # The view, or its parallel group's members (``view.0``, ``view.1``, …: not a step
        # named after it, such as ``view.changelog_rows``).
        members = [
            actor
            for name, actor in ctx.graph.items()
            if name == self.view
            or (name.rpartition(".")[0] == self.view and name.rpartition(".")[2].isdigit())
        ]
        if not members or not all(isinstance(actor, ViewActor) for actor in members):
            raise NotAMaterializedViewError(self.view, VIEW_TABLE)

    # The run.

    async def run(self, ctx: ActorContext) -> None:
        """Pass the first barrier, backfill, then forward (see the module)."""
        upstream = ctx.messages()
        first = await upstream.receive()
        if not isinstance(first, Barrier):
            raise ProtocolError(f"snapshot backfill {ctx.name}: expected a barrier first")
        shared = self.shared
        views: list[ViewTable] = []
        views += ctx.read_view(self.view, VIEW_TABLE) if shared is None else shared.tables()
        if not views:
            raise NotAMaterializedViewError(self.view, VIEW_TABLE)
        self._views = views
        bitmap = self._mask = ctx.vnode_bitmap
        vnodes = range(views[0].vnode_count) if bitmap is None else bitmap.vnodes()
        table = ctx.table(TABLE)
        saved = await table.items()
        progress = SnapshotProgress.restore(saved, vnodes)
        if progress is None:
            start = ctx.committed_epoch if shared is None else shared.committed_epoch()
            progress = SnapshotProgress.new(start, vnodes)
        elif progress.phase is SnapshotPhase.FORWARD:
            undone = progress.unfinished_vnodes()
            if undone:
                raise SnapshotBackfillStateError(
                    ctx.name, "every vnode's snapshot done in a finished job", f"vnodes {undone}"
                )
        progress.follow = shared is not None
        self.progress = progress
        if progress.phase is not SnapshotPhase.FORWARD:
            for view in views:
                view.pin(ctx.name, progress.snapshot_epoch)
            progress.pending = self._owed_after(progress.replayed, first.epoch.prev)
            if progress.phase is SnapshotPhase.CHANGE_LOG:
                progress.start_change_log()
            self._paused = first.is_pause_on_startup()
            self._next_emit = anyio.current_time()  # the first chunk may go at once
        await self._pass(ctx, table, first)
        if progress.phase is not SnapshotPhase.FORWARD:
            await self._backfill(ctx, table, upstream)
        if not ctx.finished:
            await self._forward(ctx, upstream)

    def _owed_after(self, epoch: int, closed: int) -> list[int]:
        """Epochs after ``epoch`` up to ``closed`` the view wrote (plus ``closed`` itself); of
        a followed view, every epoch after ``epoch`` it committed."""
        written = {e for view in self._views for e in view.epochs_after(epoch)}
        if self.progress.follow:
            return sorted(written)
        return sorted(e for e in written | {closed} if epoch < e <= closed)

    # Phases 1 and 2.

    async def _backfill(self, ctx: ActorContext, table: StateTable, upstream: Any) -> None:
        progress = self.progress
        while progress.phase is not SnapshotPhase.FORWARD and not ctx.finished:
            try:
                message = upstream.receive_nowait()
            except anyio.EndOfStream:
                raise self._ended(ctx) from None
            if message is not None:
                await self._on_upstream(ctx, table, message)
                continue
            wait = self._wait_before_emitting()
            if wait is None:
                chunk = await self._next_chunk()
                if chunk is not None:
                    await ctx.emit(chunk)
                    continue
                # Nothing to do until the next barrier: wait for a message (no deadline).
            message = await self._receive_within(ctx, upstream, wait)
            if message is not None:  # only the wait is limited: never a barrier's handling
                await self._on_upstream(ctx, table, message)

    async def _receive_within(
        self, ctx: ActorContext, upstream: Messages, wait: float | None
    ) -> Message | None:
        """The next upstream message if one comes within ``wait`` seconds (``None``: no
        deadline), else ``None``."""
        with anyio.move_on_after(wait):
            try:
                return await upstream.receive()
            except anyio.EndOfStream:
                raise self._ended(ctx) from None
        return None

    def _ended(self, ctx: ActorContext) -> UpstreamEndedDuringBackfillError:
        """The upstream ended while backfilling (the loop stops at a stop barrier, so this is
        the input's end): a typed error, not a silent end — the chunks dropped for the epochs
        still owed would be lost (the seed's ``anyhow!("end of upstream")``)."""
        progress = self.progress
        return UpstreamEndedDuringBackfillError(
            ctx.name, progress.phase.value, list(progress.pending), progress.unfinished_vnodes()
        )

    def _wait_before_emitting(self) -> float | None:
        """Seconds to wait before the next chunk may go (``None``: now)."""
        if self._paused or self._rate == 0:
            return math.inf
        if self._rate is None:
            return None
        wait = self._next_emit - anyio.current_time()
        return None if wait <= 0 else wait

    async def _next_chunk(self, *, forced: bool = False) -> Chunk | None:
        """The next snapshot or change-log chunk (``None``: nothing left before the next
        barrier); updates the progress as if it was emitted."""
        progress = self.progress
        if progress.phase is SnapshotPhase.SNAPSHOT:
            chunk = await self._next_snapshot_chunk()
            if chunk is not None:
                return chunk  # else the snapshot is done: on to the change log
        while progress.pending:
            epoch = progress.pending[0]
            if self._rows_of != ("log", epoch):
                parts = [await view.change_log(epoch, self._mask) for view in self._views]
                self._load(pa.concat_tables(parts), ("log", epoch), progress.log_offset)
            rows = self._slice(self._batch_rows)
            progress.log_emitted(rows.num_rows)
            if self._exhausted():  # its last rows go now: a barrier waits on no more of it
                progress.epoch_replayed()
            if rows.num_rows:
                if not forced:  # a replay a barrier waits on uses none of the rate
                    self._rate_used(rows.num_rows)
                ops = rows.column(_OP)
                return Chunk(rows.drop_columns([_OP]).combine_chunks().to_batches()[0], ops)
        return None

    async def _next_snapshot_chunk(self) -> Chunk | None:
        """Up to ``batch_rows`` snapshot rows, from as many vnodes (in order) as it takes; a
        vnode is done once its last row goes (each vnode is read once, from where it got)."""
        progress = self.progress
        key = self._views[0].primary_key
        parts: list[pa.Table] = []
        wanted = self._batch_rows
        for vnode in progress.unfinished_vnodes():
            if self._rows_of != ("vnode", vnode):
                after = progress.vnodes[vnode].after
                read = [
                    await view.read_vnode(vnode, progress.snapshot_epoch, after=after)
                    for view in self._views
                ]
                self._load(pa.concat_tables(read), ("vnode", vnode), 0)
            rows = self._slice(wanted)
            if rows.num_rows:
                last = [rows.column(c)[rows.num_rows - 1].as_py() for c in key]
                progress.emitted(vnode, last, rows.num_rows)
                parts.append(rows)
                wanted -= rows.num_rows
            if self._exhausted():
                progress.vnode_done(vnode)
            if wanted == 0:
                break
        if not parts:
            progress.start_change_log()
            return None
        rows = pa.concat_tables(parts)
        self._rate_used(rows.num_rows)
        return Chunk(rows.combine_chunks().to_batches()[0])

    def _load(self, rows: pa.Table, of: tuple[str, int], position: int) -> None:
        self._rows, self._rows_of, self._position = rows, of, position

    def _slice(self, most: int) -> pa.Table:
        """The next ``most`` rows loaded (fewer at their end, none past it)."""
        rows = self._rows.slice(self._position, most)
        self._position += rows.num_rows
        return rows

    def _exhausted(self) -> bool:
        left: int = self._rows.num_rows - self._position
        return left <= 0

    def _rate_used(self, rows: int) -> None:
        if self._rate:
            start = max(self._next_emit, anyio.current_time())
            self._next_emit = start + rows / self._rate

    async def _on_upstream(self, ctx: ActorContext, table: StateTable, message: Message) -> None:
        """While backfilling: a barrier is passed (after what the lag rule asks); chunks and
        watermarks are dropped (their epochs are read back from the change log); a committable
        (work staged for a sink downstream, polled here) is passed on as it is."""
        if isinstance(message, Committable):
            await ctx.emit(message)
            return
        if not isinstance(message, Barrier):
            return
        progress = self.progress
        if message.new_vnode_bitmap(ctx.actor_id) is not None:
            raise VnodeUpdateDuringBackfillError(ctx.name, progress.phase.value)
        if message.is_pause() or message.is_resume():
            self._paused = message.is_pause()
        changed, rate = message.throttle_for(ctx.actor_id)
        if changed:
            self._rate = rate
        if progress.follow:
            # What the view committed since: owed (the live barrier's epoch is not its own).
            known = progress.pending[-1] if progress.pending else progress.replayed
            for epoch in self._owed_after(known, known):
                progress.on_closed(epoch)
        else:
            progress.on_closed(message.epoch.prev)
        if not self._paused:
            while progress.must_replay():
                chunk = await self._next_chunk(forced=True)
                if chunk is not None:
                    await ctx.emit(chunk)
            progress.after_barrier()
        if progress.phase is SnapshotPhase.FORWARD or message.is_stop(ctx.actor_id):
            for view in self._views:
                view.unpin(ctx.name)
        elif progress.follow:
            for view in self._views:  # compaction may fold what it has replayed
                view.pin(ctx.name, progress.replayed)
        await self._pass(ctx, table, message)

    async def _pass(self, ctx: ActorContext, table: StateTable, barrier: Barrier) -> None:
        """Save the progress (sealed with the barrier), report it, pass the barrier."""
        progress = self.progress
        for key, value in progress.rows_to_save().items():
            table.put(key, value)
        done = progress.phase is SnapshotPhase.FORWARD or (
            progress.follow and progress.phase is SnapshotPhase.CHANGE_LOG and not progress.owed
        )
        ctx.report_progress(
            Progress(
                finished=done,
                rows=progress.rows,
                detail={
                    "phase": progress.phase.value,
                    "snapshot_epoch": progress.snapshot_epoch,
                    "epochs_owed": progress.owed,
                    "vnodes_left": len(progress.unfinished_vnodes()),
                    "vnodes_total": len(progress.vnodes),
                },
            )
        )
        await ctx.emit(barrier)

    # Phase 3.

    async def _forward(self, ctx: ActorContext, upstream: Any) -> None:
        """Forward the upstream as is until a stop barrier or its end: nothing is owed any
        more, so its end is a clean end (unlike while backfilling)."""
        while not ctx.finished:
            try:
                message = await upstream.receive()
            except anyio.EndOfStream:
                return
            await ctx.emit(message)
