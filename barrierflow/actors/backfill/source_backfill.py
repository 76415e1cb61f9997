"""The source backfill actor (after RisingWave's ``source_backfill_executor.rs``): a job added to
a running pipeline sees a live source's **history** and then its live records, each once.

The actor reads two sides at once: its input ``upstream`` (the live split source's output,
shared with every job that reads the source) and its own **backfill reader** of the same split
log, from the first record of each split. Upstream is always preferred when both are ready
(a busy source only slows the backfill; its barriers are never starved). Per split the state
machine of :mod:`.source_backfill_state` decides which side a record comes from; this module
drives it:

* **Start.** The first barrier (the job's ``Add``) passes first. The actor's splits come from
  ``Add``'s split assignment for it, else from the ``splits=`` argument, else from the log.
  States are restored from the actor's ``backfill`` table (a split without one starts
  ``BACKFILLING(None)``); for each split still backfilling, the log's latest offset becomes the
  target — ``None`` (an empty split) finishes it at once.
* **Barriers.** At each barrier: the states are put in the table (sealed with the barrier, so
  recovery resumes from them); ``Pause``/``Resume`` pause the backfill reader (upstream keeps
  flowing), ``Throttle`` rebuilds it with the new rate; progress (rows read, per-split phase) is
  reported with the barrier; a split change (``SourceChangeSplit`` trims the dropped splits'
  states, ``Update`` keeps them) applies *after* the barrier is passed, and rebuilds the reader.
* **Watermarks** from upstream are dropped while backfilling.
* **Self-pause.** A backfill batch arriving ``wait_barrier_intervals`` barrier intervals after
  the last barrier pauses the reader until the next barrier.
* **A target never delivered.** A split whose backfill did not move between two barriers is
  checked against the log's latest offset: if the backfill has read everything there is, its
  history is done (the record it waited for was deleted) and it waits for the upstream.
* **Reader errors** rebuild the reader from the latest states, after a doubling backoff, at
  most ``max_reader_retries`` times in a row (then the actor fails with the last error).
* **Ready.** As soon as every split is ``CACHING_UP`` or ``FINISHED`` the actor reports itself
  finished (``wait_ready()`` returns: a quiet split must not block it for ever) and drops its
  reader. It leaves the backfill stage only when every split of **every actor of its parallel
  group** is ``FINISHED`` — it first waits for a checkpoint holding everyone's state, then reads
  its peers' committed states (an empty set of states is never "all finished"): a split that
  migrates from a peer may still need backfilling.
* **Forwarding stage.** Afterwards it forwards the upstream as is (watermarks too) and still
  applies split changes: a new split is ``FINISHED`` (the live source has all of it), a split
  migrated from a peer must be ``FINISHED`` too.

The upstream must carry the split log's columns (``_split``, ``_offset_major``,
``_offset_minor``) — a :class:`~barrierflow.actors.sources.split_source.SplitSource` does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, final

import anyio
import numpy as np
import pyarrow as pa

from barrierflow.actors.backfill.source_backfill_state import (
    BackfillPhase,
    SplitBackfill,
    SplitBackfills,
)
from barrierflow.actors.sources.split_log import Offset, SplitLog
from barrierflow.channels.barrier import Barrier
from barrierflow.channels.channel import SendChannel, create_channel
from barrierflow.channels.chunk import Chunk
from barrierflow.channels.errors import InvalidArgumentError, ProtocolError
from barrierflow.channels.messages import Message, Watermark
from barrierflow.channels.mutation import SourceChangeSplit
from barrierflow.channels.select import BiasedSelect
from barrierflow.runtime.actor import ActorContext, StreamActor
from barrierflow.runtime.progress import Progress
from barrierflow.runtime.state.state_store import StateTable

__all__ = ["SourceBackfill"]

#: The actor's state table: split → :meth:`SplitBackfill.to_json`.
TABLE = "backfill"
_UPSTREAM, _BACKFILL = "upstream", "backfill"


@final
class _ReaderFailed:
    """What a failed reader task sends instead of a batch."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


@final
class SourceBackfill(StreamActor):
    """Backfills a split log's history into a job, then forwards the live source (see the
    module).

    Args:
        log: the split log the live source reads.
        splits: the splits this actor owns when no ``Add`` assignment names them (default: all
            of the log's).
        batch_rows: rows per batch of the backfill reader.
        rate_limit: rows per second of the backfill reader (``None``: unlimited; 0: paused).
        wait_barrier_intervals: barrier intervals without a barrier after which the reader
            pauses itself.
        max_reader_retries: reader failures in a row before the actor fails.
        retry_delay: the first backoff delay after a reader failure (doubling).

    Raises:
        InvalidArgumentError: a bad argument.
    """

    aligned_inputs = False
    backfills = True

    def __init__(
        self,
        log: SplitLog,
        *,
        splits: Sequence[str] | None = None,
        batch_rows: int = 4096,
        rate_limit: float | None = None,
        wait_barrier_intervals: int = 5,
        max_reader_retries: int = 5,
        retry_delay: float = 0.05,
    ) -> None:
        if not isinstance(log, SplitLog):
            raise InvalidArgumentError("log", "a SplitLog", type(log).__name__)
        if splits is not None and (
            isinstance(splits, str) or not all(isinstance(s, str) and s for s in splits)
        ):
            raise InvalidArgumentError("splits", "None or a sequence of split names", splits)
        for name, value in (
            ("batch_rows", batch_rows),
            ("wait_barrier_intervals", wait_barrier_intervals),
            ("max_reader_retries", max_reader_retries),
        ):
            if type(value) is not int or value < 1:
                raise InvalidArgumentError(name, "a positive int", value)
        _check_rate(rate_limit)
        if isinstance(retry_delay, bool) or not isinstance(retry_delay, int | float):
            raise InvalidArgumentError("retry_delay", "seconds (a number > 0)", retry_delay)
        if not 0 < retry_delay < 3600:
            raise InvalidArgumentError("retry_delay", "seconds in (0, 3600)", retry_delay)
        self._log = log
        self._splits = None if splits is None else list(splits)
        self._batch_rows = batch_rows
        self._rate = rate_limit
        self._wait_intervals = wait_barrier_intervals
        self._max_retries = max_reader_retries
        self._retry_delay = float(retry_delay)

    # The run.

    async def run(self, ctx: ActorContext) -> None:
        """Pass the first barrier, backfill until every split of every peer finished, then
        forward the upstream (see the module)."""
        upstream = (
            ctx.inputs[_UPSTREAM] if _UPSTREAM in ctx.inputs else next(iter(ctx.inputs.values()))
        )
        first = await upstream.receive()
        if not isinstance(first, Barrier):
            raise ProtocolError(
                f"source backfill {ctx.name}: expected a barrier first, got {first!r}"
            )
        table = ctx.table(TABLE)
        committed = {k: SplitBackfill.from_json(v) for k, v in (await table.items()).items()}
        owned = first.initial_splits(ctx.actor_id)
        names = (
            [s.split_id for s in owned]
            if owned is not None
            else self._splits
            if self._splits is not None
            else await self._log.list_splits()
        )
        states = SplitBackfills({s: committed.get(s, SplitBackfill()) for s in names})
        for split in states.unfinished():
            states.set_target(split, await self._log.latest_offset(split))
        self._put_states(table, states)
        await ctx.emit(first)
        if ctx.finished:
            return
        stage = _BackfillStage(self, ctx, table, states, paused=first.is_pause_on_startup())
        left = await stage.run(upstream)
        if left:
            await self._forward(ctx, table, stage.states, upstream)

    @staticmethod
    def _put_states(table: StateTable, states: SplitBackfills) -> None:
        for split, state in states.states.items():
            table.put(split, state.to_json())

    async def _forward(
        self, ctx: ActorContext, table: StateTable, states: SplitBackfills, upstream: Any
    ) -> None:
        """The forwarding stage: the upstream as it is, split changes still applied."""
        self._put_states(table, states)  # FINISHED everywhere, durable with the next barrier
        while not ctx.finished:
            try:
                message: Message = await upstream.receive()
            except anyio.EndOfStream:
                return
            if not isinstance(message, Barrier):
                await ctx.emit(message)
                continue
            await ctx.emit(message)
            new = message.new_splits(ctx.actor_id)
            if new is not None and not ctx.finished:
                committed = await self._committed_states(ctx)
                for split in (s.split_id for s in new):
                    state = committed.get(split)
                    if state is not None and state.phase is not BackfillPhase.FINISHED:
                        raise ProtocolError(
                            f"source backfill {ctx.name}: expected split {split!r} migrated "
                            f"after the backfill stage to be finished, got {state.phase.value}"
                        )
                changed, dropped = states.reassign((s.split_id for s in new), committed)
                if changed:
                    self._apply_change(table, states, dropped, message)

    async def _committed_states(self, ctx: ActorContext) -> dict[str, SplitBackfill]:
        """Every peer's committed split states (a split migrated from a peer carries its
        state)."""
        found: dict[str, SplitBackfill] = {}
        for peer in ctx.peers:
            for split, value in (await ctx.read_table(peer, TABLE).items()).items():
                found[split] = SplitBackfill.from_json(value)
        return found

    def _apply_change(
        self, table: StateTable, states: SplitBackfills, dropped: list[str], barrier: Barrier
    ) -> None:
        if isinstance(barrier.mutation, SourceChangeSplit):
            for split in dropped:
                table.delete(split)
        self._put_states(table, states)


def _check_rate(rate: object) -> None:
    if rate is not None and (
        isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate < np.inf
    ):
        raise InvalidArgumentError("rate_limit", "None or a finite rate >= 0 (rows/s)", rate)


@final
class _BackfillStage:
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
        self.last_barrier = anyio.current_time()
        self._reader_scope: anyio.CancelScope | None = None
        self._send: SendChannel[Any] | None = None
        self._generation = 0
        #: The backfill offsets of the splits still backfilling, as of the previous barrier.
        self._offsets: dict[str, Offset | None] = {}

    async def run(self, upstream: Any) -> bool:
        """Backfill; returns whether the stage was left for forwarding (``False``: stopped)."""
        send, receive = create_channel[Any](2, name=f"{self.ctx.name} backfill reader")
        self._send = send
        select = BiasedSelect({_UPSTREAM: upstream, _BACKFILL: receive})
        self.select = select
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                self._restart_reader(delay=0.0)
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
            if side == _UPSTREAM:
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
        interval = self.ctx.barrier_interval
        if anyio.current_time() - self.last_barrier > self.actor._wait_intervals * interval:
            self.self_paused = True  # barriers are late: read no further until the next one
            self._apply_pause()
            self.ctx.log.warning("source backfill paused itself: no barrier for a while")
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
        self.last_barrier = anyio.current_time()
        if self.self_paused:
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
        SourceBackfill._put_states(self.table, self.states)
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
                # Every peer's state, as of this checkpoint, must be readable before their
                # committed states can tell whether the whole job finished.
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
