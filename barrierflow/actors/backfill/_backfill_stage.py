"""The backfill stage of :class:`~.source_backfill.SourceBackfill`: both sides read at once
(upstream preferred), the history reader task (rebuilt on rate changes, split changes and
errors), the per-barrier work, and the test for leaving the stage (see
:mod:`.source_backfill`)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, final

import anyio
import pyarrow as pa

from barrierflow.actors.backfill.source_backfill_state import BackfillPhase, SplitBackfills
from barrierflow.actors.sources.split_log import Offset
from barrierflow.channels.barrier import Barrier
from barrierflow.channels.channel import SendChannel, create_channel
from barrierflow.channels.chunk import Chunk
from barrierflow.channels.errors import ProtocolError
from barrierflow.channels.messages import Watermark
from barrierflow.channels.select import BiasedSelect
from barrierflow.runtime.actor import ActorContext
from barrierflow.runtime.progress import Progress
from barrierflow.runtime.state.state_store import StateTable

if TYPE_CHECKING:
    from barrierflow.actors.backfill.source_backfill import SourceBackfill

__all__ = ["BackfillStage"]

UPSTREAM, _BACKFILL = "upstream", "backfill"


@final
class _ReaderFailed:
    """What a failed reader task sends instead of a batch."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


@final
class BackfillStage:
    """The backfill stage of one run: both sides, the reader task, the states."""

    def __init__(
        self,
        actor: SourceBackfill,
        ctx: ActorContext,
        table: StateTable,
        states: SplitBackfills,
        *,
        paused: bool,
    ) -> None:
        self.actor = actor
        self.ctx = ctx
        self.table = table
        self.states = states
        self.command_paused = paused
        self.self_paused = False
        self.ready_reported = False
        self.state_table_initialized = False
        self.failures = 0
        # The seed starts its "last barrier" clock when the loop starts, not at the first barrier.
        self.last_barrier = actor._clock()
        self._reader_scope: anyio.CancelScope | None = None
        self._send: SendChannel[Any] | None = None
        self._generation = 0
        #: The backfill offsets of the splits still backfilling, as of the previous barrier.
        self._offsets: dict[str, Offset | None] = {}

    async def run(self, upstream: Any) -> bool:
        """Backfill; returns whether the stage was left for forwarding (``False``: stopped)."""
        send, receive = create_channel[Any](2, name=f"{self.ctx.name} backfill reader")
        self._send = send
        select = BiasedSelect({UPSTREAM: upstream, _BACKFILL: receive})
        self.select = select
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                self._restart_reader(delay=0.0)
                # The seed's pause on startup: a job added to a paused graph (its first
                # barrier's Add carries pause=True) reads no history until a Resume.
                self._apply_pause()
                left = await self._loop(select)
                tg.cancel_scope.cancel()
            return left
        finally:
            send.close()
            receive.close()

    # The reader.

    def _restart_reader(self, delay: float) -> None:
        """Cancel the current reader; start one from the latest states (none if nothing is
        left to read, or the rate is 0). Batches of an older reader are dropped on arrival."""
        if self._reader_scope is not None:
            self._reader_scope.cancel()
            self._reader_scope = None
        self._generation += 1
        starts = self.states.unfinished()
        if not starts or self.ready_reported or self.actor._rate == 0:
            return
        scope = anyio.CancelScope()
        self._reader_scope = scope
        self._tg.start_soon(self._read, starts, self._generation, scope, delay)

    async def _read(
        self,
        starts: dict[str, Offset | None],
        generation: int,
        scope: anyio.CancelScope,
        delay: float,
    ) -> None:
        assert self._send is not None
        send = self._send
        rate = self.actor._rate
        with scope:
            if delay:
                await anyio.sleep(delay)
            try:
                reader = self.actor._log.read(starts, batch_rows=self.actor._batch_rows)
                async with contextlib.aclosing(reader) as batches:  # type: ignore[type-var]
                    async for batch in batches:
                        await send.send((generation, batch))
                        if rate:
                            await anyio.sleep(batch.num_rows / rate)
            except Exception as exc:  # a reader failure: the stage decides (rebuild or fail)
                await send.send((generation, _ReaderFailed(exc)))

    def _apply_pause(self) -> None:
        if self.command_paused or self.self_paused:
            self.select.pause(_BACKFILL)
        else:
            self.select.resume(_BACKFILL)

    # The loop.

    async def _loop(self, select: BiasedSelect[Any]) -> bool:
        while True:
            try:
                side, item = await select.receive()
            except anyio.EndOfStream:
                return False
            if side == UPSTREAM:
                if isinstance(item, Barrier):
                    if await self._on_barrier(item):
                        return not self.ctx.finished
                    if self.ctx.finished:
                        return False
                elif isinstance(item, Chunk):
                    await self._on_upstream_chunk(item)
                elif not isinstance(item, Watermark):
                    raise ProtocolError(f"source backfill: unexpected message {item!r}")
                continue
            generation, payload = item
            if generation != self._generation:
                continue  # from a reader that was replaced
            if isinstance(payload, _ReaderFailed):
                self._on_reader_failed(payload.error)
                continue
            self.failures = 0
            await self._on_backfill_batch(payload)

    async def _on_upstream_chunk(self, chunk: Chunk) -> None:
        if chunk.visibility is not None:
            chunk = chunk.compact()
        visible = self.states.on_upstream(chunk.batch)
        if visible.any():
            await self.ctx.emit(Chunk(chunk.batch, ops=chunk.ops, visibility=pa.array(visible)))

    async def _on_backfill_batch(self, batch: pa.RecordBatch) -> None:
        # The seed's self-pause: a history batch arriving more than N barrier intervals after
        # the last barrier means barriers are late (the graph is backpressured or the meta
        # service is slow); reading on would let the backfill run away from the live stream
        # and the checkpoints. This batch is still handled; the reader then waits for the next
        # barrier, which resumes it (unless a Pause command holds it).
        interval = self.ctx.barrier_interval
        waited = self.actor._clock() - self.last_barrier
        if waited > self.actor._wait_intervals * interval:
            self.self_paused = True
            self._apply_pause()
            self.ctx.log.warning(
                "source backfill paused itself: no barrier for a while", seconds=waited
            )
        visible = self.states.on_backfill(batch)
        if visible.any():
            await self.ctx.emit(Chunk(batch, visibility=pa.array(visible)))

    def _on_reader_failed(self, error: Exception) -> None:
        self.failures += 1
        if self.failures > self.actor._max_retries:
            raise error
        delay = self.actor._retry_delay * 2 ** (self.failures - 1)
        self.ctx.log.warning(
            "source backfill reader failed; rebuilding it from the latest states",
            error=repr(error),
            attempt=self.failures,
            backoff_s=delay,
        )
        self._restart_reader(delay)

    async def _on_barrier(self, barrier: Barrier) -> bool:
        """Handle one upstream barrier; returns whether the backfill stage is over."""
        ctx = self.ctx
        self.last_barrier = self.actor._clock()
        if self.self_paused:
            # A barrier came: the self-pause ends (a Pause command still holds the reader).
            self.self_paused = False
            self._apply_pause()
        if barrier.is_pause():
            self.command_paused = True
            self._apply_pause()
        elif barrier.is_resume():
            self.command_paused = False
            self._apply_pause()
        changed, rate = barrier.throttle_for(ctx.actor_id)
        if changed and rate != self.actor._rate:
            self.actor._rate = rate
            self._restart_reader(delay=0.0)
        new = barrier.new_splits(ctx.actor_id)
        await self._check_stalled()
        self.actor._put_states(self.table, self.states)
        caught_up = self.states.caught_up()
        if caught_up and not self.ready_reported:
            self.ready_reported = True
            self._restart_reader(delay=0.0)  # no reader once every split caught up
        ctx.report_progress(
            Progress(
                finished=caught_up,
                rows=self.states.consumed_rows,
                detail={s: st.phase.value for s, st in self.states.states.items()},
            )
        )
        await ctx.emit(barrier)
        if ctx.finished:
            return True
        if new is not None:
            committed = await self.actor._committed_states(ctx)
            split_changed, dropped = self.states.reassign((s.split_id for s in new), committed)
            if split_changed:
                self.actor._apply_change(self.table, self.states, dropped, barrier)
                if not self.states.caught_up():
                    self.ready_reported = False
                self._restart_reader(delay=0.0)
        if not caught_up:
            return False
        if not self.state_table_initialized:
            if barrier.is_checkpoint:
                # The seed waits for this first checkpoint's prev epoch to be committed before
                # it ever reads the peers' split states: until then it may read only what it
                # wrote itself (a peer's state, unfinished splits included, may be missing),
                # and would leave the backfill stage on a stale "all finished".
                await ctx.wait_committed(barrier.epoch.prev)
                self.state_table_initialized = True
            return False
        return await self._all_finished()

    async def _check_stalled(self) -> None:
        """Ask the log how far a split goes when its backfill did not move since the previous
        barrier: a backfill that has read everything there is stops there, even if the target
        it was given is never delivered (see :meth:`SplitBackfills.on_latest`)."""
        now = self.states.unfinished()
        for split, offset in now.items():
            if split in self._offsets and self._offsets[split] == offset:
                self.states.on_latest(split, await self.actor._log.latest_offset(split))
        self._offsets = self.states.unfinished()
        if len(self._offsets) < len(now) and not self.states.unfinished():
            self._restart_reader(delay=0.0)  # nothing left to read

    async def _all_finished(self) -> bool:
        """Every split of this actor and of every peer is FINISHED (peers' committed states;
        none at all is never finished)."""
        if not self.states.finished():
            return False
        committed = await self.actor._committed_states(self.ctx)
        return bool(committed) and all(
            state.phase is BackfillPhase.FINISHED for state in committed.values()
        )
