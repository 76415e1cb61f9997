"""The backfill stage of :class:`~.source_backfill.SourceBackfill`: both sides read at once
(upstream preferred), the history reader task (rebuilt on rate changes, split changes and
errors; the live source's mechanism,
:class:`~barrierflow.actors.sources.split_reader.SplitReader`), the per-barrier work, and the
test for leaving the stage (see :mod:`.source_backfill`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, final

import anyio
import pyarrow as pa

from barrierflow.actors.backfill.errors import UpstreamEndedDuringSourceBackfillError
from barrierflow.actors.backfill.source_backfill_state import (
    BackfillPhase,
    SplitBackfill,
    SplitBackfills,
)
from barrierflow.actors.sources.split_log import Offset, SplitLog
from barrierflow.actors.sources.split_metrics import SplitMetrics
from barrierflow.actors.sources.split_reader import ReaderFailed, SplitReader
from barrierflow.channels.barrier import Barrier
from barrierflow.channels.channel import create_channel
from barrierflow.channels.chunk import Chunk
from barrierflow.channels.errors import ProtocolError
from barrierflow.channels.messages import Watermark
from barrierflow.channels.mutation import SourceChangeSplit
from barrierflow.channels.select import BiasedSelect, PollableReceiver
from barrierflow.runtime.actor import ActorContext
from barrierflow.runtime.metrics import REFRESH_TIMEOUT
from barrierflow.runtime.progress import Progress
from barrierflow.runtime.state.state_store import StateTable

__all__ = [
    "TABLE",
    "UPSTREAM",
    "BackfillStage",
    "Reading",
    "apply_change",
    "ask_lag",
    "committed_states",
    "put_states",
]

UPSTREAM, _BACKFILL = "upstream", "backfill"

#: Seconds between two asks of the log's lag by a backfilling actor (its progress's total).
LAG_EVERY = 1.0

#: The state table of a source backfill: split → its :class:`SplitBackfill` as JSON.
TABLE = "backfill"


@final
@dataclass(frozen=True, slots=True)
class Reading:
    """How a :class:`~.source_backfill.SourceBackfill` reads its splits' history: its
    constructor's settings, handed to its backfill stage. Frozen: the stage keeps what a
    barrier changes (the rate) in its own state, never in its actor's settings."""

    log: SplitLog
    batch_rows: int
    #: The initial rate (rows per second; ``None``: unlimited, ``0``: paused).
    rate: float | None
    #: Barrier intervals without a barrier after which the reader pauses itself.
    wait_intervals: int
    #: Reader failures in a row before the error fails the actor, and the first retry's delay.
    max_retries: int
    retry_delay: float
    clock: Callable[[], float]


def put_states(table: StateTable, states: SplitBackfills) -> None:
    """Write every split's state into the actor's state table (durable with its next
    barrier)."""
    for split, state in states.states.items():
        table.put(split, state.to_json())


async def committed_states(ctx: ActorContext) -> dict[str, SplitBackfill]:
    """Every peer's committed split states (a split migrated from a peer carries its
    state)."""
    found: dict[str, SplitBackfill] = {}
    for peer in ctx.peers:
        for split, value in (await ctx.read_table(peer, TABLE).items()).items():
            found[split] = SplitBackfill.from_json(value)
    return found


def apply_change(
    table: StateTable, states: SplitBackfills, dropped: list[str], barrier: Barrier
) -> None:
    """Record a split change: the states of the splits it kept or gained, and (for a change
    of the source's splits, not a migration between peers) no state for the dropped ones."""
    if isinstance(barrier.mutation, SourceChangeSplit):
        for split in dropped:
            table.delete(split)
    put_states(table, states)


#: What the upstream side yields when the upstream ended (the select itself would not end:
#: the reader's channel stays open while the stage runs).
_ENDED = object()


@final
class _EndMarked:
    """The upstream receiver, with its end turned into the :data:`_ENDED` message: the stage
    must see the upstream end while its reader still has history to give (it fails at the
    first one, so no receive follows)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except anyio.EndOfStream:
            return _ENDED

    def receive_nowait(self) -> Any:
        try:
            return self._inner.receive_nowait()
        except anyio.EndOfStream:
            return _ENDED


async def ask_lag(metrics: SplitMetrics, states: SplitBackfills) -> int | None:
    """Ask the log how many records each split still backfilling has ahead of it (a split
    past its history lags 0) into ``metrics``; returns their sum, ``None`` when the log
    cannot tell for one of them."""
    backfilling = states.unfinished()
    await metrics.refresh(backfilling, frozenset(states.states).difference(backfilling))
    lags = [metrics.lag(split) for split in backfilling]
    known = [lag for lag in lags if lag is not None]
    return sum(known) if len(known) == len(lags) else None


@final
class BackfillStage:
    """The backfill stage of one run: both sides, the reader task, the states."""

    def __init__(
        self,
        reading: Reading,
        ctx: ActorContext,
        table: StateTable,
        states: SplitBackfills,
        *,
        paused: bool,
        metrics: SplitMetrics,
    ) -> None:
        self.reading = reading
        self.metrics = metrics
        #: The rows the history held in all, as of the last lag refresh (``None``: unknown).
        self._total: int | None = None
        self._refreshing = False
        #: When the last ask of the log's lag started (``None``: never).
        self._asked_at: float | None = None
        self.ctx = ctx
        self.table = table
        self.states = states
        self.command_paused = paused
        self.self_paused = False
        self.state_table_initialized = False
        self.failures = 0
        #: The reader's rate (rows per second; ``None``: unlimited, ``0``: no reader): a
        #: Throttle barrier sets it for the rest of the run.
        self.rate = reading.rate
        # The seed starts its "last barrier" clock when the loop starts, not at the first barrier.
        self.last_barrier = reading.clock()
        #: The backfill offsets of the splits still backfilling, as of the previous barrier.
        self._offsets: dict[str, Offset | None] = {}

    async def run(self, upstream: Any) -> bool:
        """Backfill; returns whether the stage was left for forwarding (``False``: stopped)."""
        send, receive = create_channel[Any](2, name=f"{self.ctx.name} backfill reader")
        # The module's ``anyio.sleep``, looked up now: a test replaces this module's ``anyio``
        # to record the reader's waits (the rate's, and the backoff before a rebuild).
        self._reader = SplitReader(
            self.reading.log,
            self.reading.batch_rows,
            send.send,
            sleep=anyio.sleep,
            report_failures=True,
        )
        inputs: dict[str, PollableReceiver[Any]] = {
            UPSTREAM: _EndMarked(upstream),
            _BACKFILL: receive,
        }
        select: BiasedSelect[Any] = BiasedSelect(inputs)
        self.select = select
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                self._restart_reader()
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

    def _restart_reader(self, delay: float = 0.0) -> None:
        """Cancel the current reader; start one from the latest states, after ``delay``
        seconds (none if nothing is left to read, or the rate is 0). Batches of an older reader
        are dropped on arrival."""
        self._reader.stop()
        starts = self.states.unfinished()
        if not starts or self.rate == 0:
            return
        self._reader.start(self._tg, starts, self.rate, delay=delay)

    def _apply_pause(self) -> None:
        if self.command_paused or self.self_paused:
            self.select.pause(_BACKFILL)
        else:
            self.select.resume(_BACKFILL)

    # The loop.

    async def _loop(self, select: BiasedSelect[Any]) -> bool:
        # No EndOfStream to catch: the reader's channel stays open until the loop is left,
        # and the upstream's end arrives as one _ENDED message (a typed error, not a hang).
        while True:
            side, item = await select.receive()
            if side == UPSTREAM:
                if isinstance(item, Barrier):
                    if await self._on_barrier(item):
                        return not self.ctx.finished
                elif isinstance(item, Chunk):
                    await self._on_upstream_chunk(item)
                elif item is _ENDED:
                    unfinished = sorted(
                        split for split, state in self.states.states.items()
                        if state.phase is not BackfillPhase.FINISHED
                    )  # fmt: skip
                    raise UpstreamEndedDuringSourceBackfillError(self.ctx.name, unfinished)
                elif not isinstance(item, Watermark):
                    raise ProtocolError(
                        f"source backfill {self.ctx.name}: expected a barrier, a chunk or a "
                        f"watermark from the upstream, got {item!r}"
                    )
                continue
            if not self._reader.is_current(item):
                continue  # from a reader that was replaced
            if isinstance(item, ReaderFailed):
                self._on_reader_failed(item.error)
                continue
            self.failures = 0
            await self._on_backfill_batch(item.batch)

    async def _on_upstream_chunk(self, chunk: Chunk) -> None:
        chunk = chunk.compact()  # rows the upstream hid are not records of the split
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
        waited = self.reading.clock() - self.last_barrier
        if waited > self.reading.wait_intervals * interval:
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
        if self.failures > self.reading.max_retries:
            raise error
        delay = self.reading.retry_delay * 2 ** (self.failures - 1)
        self.ctx.log.warning(
            "source backfill reader failed; rebuilding it from the latest states",
            error=repr(error),
            attempt=self.failures,
            backoff_s=delay,
        )
        self._restart_reader(delay)

    async def _on_barrier(self, barrier: Barrier) -> bool:
        """Handle one upstream barrier; returns whether the backfill stage is over (every split
        of every peer finished, or the actor finished with this barrier)."""
        ctx = self.ctx
        self.last_barrier = self.reading.clock()
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
        if changed and rate != self.rate:
            self.rate = rate
            self._restart_reader()
        new = barrier.new_splits(ctx.actor_id)
        await self._check_stalled()
        put_states(self.table, self.states)
        caught_up = self.states.caught_up()
        if caught_up:
            self._restart_reader()  # no reader once every split caught up: none is started
        rows = self.states.consumed_rows
        ctx.report_progress(
            Progress(
                finished=caught_up,
                rows=rows,
                detail={s: st.phase.value for s, st in self.states.states.items()},
                total=None if self._total is None else max(self._total, rows),
            )
        )
        if not caught_up:
            self._refresh_lag()
        await ctx.emit(barrier)
        if ctx.finished:
            return True
        if new is not None:
            committed = await committed_states(ctx)
            split_changed, dropped = self.states.reassign((s.split_id for s in new), committed)
            if split_changed:
                apply_change(self.table, self.states, dropped, barrier)
                self._restart_reader()
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

    def _refresh_lag(self) -> None:
        """Ask the log, beside the loop (never on the barrier's path), how many records each
        split still backfilling has ahead of it: the split's lag metric, and the total the
        next progress report gives (rows read then plus those records). One ask at a time,
        at most one every :data:`LAG_EVERY` seconds (asking at every barrier slowed a Redis
        backfill by a fifth), each within :data:`~barrierflow.runtime.metrics.
        REFRESH_TIMEOUT` seconds; a failure leaves the total unknown (the reader reports the
        log's real errors)."""
        now = self.reading.clock()
        if self._refreshing or (self._asked_at is not None and now - self._asked_at < LAG_EVERY):
            return
        self._refreshing = True
        self._asked_at = now

        async def refresh() -> None:
            rows = self.states.consumed_rows
            try:
                with anyio.move_on_after(REFRESH_TIMEOUT):
                    ahead = await ask_lag(self.metrics, self.states)
                    self._total = None if ahead is None else rows + ahead
            except Exception as exc:
                self._total = None
                self.ctx.log.debug("source backfill: the log's lag is unknown", error=repr(exc))
            finally:
                self._refreshing = False

        self._tg.start_soon(refresh)

    async def _check_stalled(self) -> None:
        """Ask the log how far a split goes when its backfill did not move since the previous
        barrier: a backfill that has read everything there is stops there, even if the target
        it was given is never delivered (see :meth:`SplitBackfills.on_latest`)."""
        for split, offset in self.states.unfinished().items():
            if split in self._offsets and self._offsets[split] == offset:
                self.states.on_latest(split, await self.reading.log.latest_offset(split))
        # A split it stopped is caught up: the barrier drops the reader once every split is.
        self._offsets = self.states.unfinished()

    async def _all_finished(self) -> bool:
        """Every split of this actor and of every peer is FINISHED (peers' committed states;
        none at all is never finished)."""
        if not self.states.finished():
            return False
        committed = await committed_states(self.ctx)
        return bool(committed) and all(
            state.phase is BackfillPhase.FINISHED for state in committed.values()
        )
