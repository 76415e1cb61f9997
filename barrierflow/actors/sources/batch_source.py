"""A source fed by numbered, atomic batches: exactly once across driver and runtime restarts.

:class:`BatchSource` is the graph's end (this module); :class:`~.batch_feed.BatchFeed` is the
driver's end (:mod:`.batch_feed`).

An external system that hands over data in numbered batches — a Spark micro-batch and its
batch id, a slice of a backfill — needs the batch's number to become durable **in the same
checkpoint** as the batch's rows: then after a crash the driver asks for the last durable
batch, and a batch replayed by the upstream is recognized and skipped, while one that never
became durable is delivered again in full. :class:`BatchFeed` is the driver's end,
:class:`BatchSource` the source actor of the graph:

* ``await feed.deliver(rt, stream, batch_id, table)`` splits ``table`` into chunks of
  ``chunk_rows`` (zero-copy slices) and sends them through the feed's bounded channel — a slow
  graph makes the driver wait, so the driver holds at most one batch plus the channel — then an
  end mark carrying ``(stream, batch_id)``, then asks for a checkpoint and returns its epoch once
  durable.
* The source actor emits the rows, and on the end mark records ``stream → batch_id`` in its
  state table. **A barrier that reaches the source while a batch is open is held back until
  the batch's end mark**, so a checkpoint always holds a batch whole or not at all: the rows and
  the number are sealed in the same epoch or in an earlier one than the checkpoint the driver
  waits for.
* The source takes deliveries once its first barrier has **completed** — every actor of the
  graph passed it — so a delivery never starts before the graph has: a sink's coordinator has
  recovered by then, and what a driver stages for the delivery (files on Spark's executors)
  cannot be deleted by that recovery.
* Batch ids of one stream must run ``last + 1``; ``last`` itself is a replay and is skipped
  (``deliver`` returns ``None``); anything else is :class:`~barrierflow.errors.BatchOrderError`,
  before any row moves. A stream with nothing durable expects ``first_batch_id`` (0).
* A delivery that fails because the graph failed (with ``recovery=True``) is retried: the
  rebuilt graph restored the last durable batch ids, so the batch is either found durable or
  delivered again whole. A delivery abandoned part-way (cancelled) fails the graph with
  :class:`~barrierflow.errors.BatchAbortedError`, so its rows never become durable without
  their number.

Streams are independent: a streaming query and a static pump can share one feed under
different stream names.

**Positions.** With every barrier it passes, the source reports its positions — position key
``"<source actor>/<stream>"`` → last batch id before the barrier — so that exactly-once sinks
record them atomically with the rows (see :mod:`barrierflow.runtime.positions`). On an empty
store whose run adopted a sink's positions (``RuntimeConfig.adopt_sink_positions``), the
source starts from them: they count as durable, and every id up to them is a replay to skip
(the upstream may start over from 0 when its own checkpoint was lost too). The adopted
positions are kept in the source's state, so a later restart still skips them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, final

import anyio
import pyarrow as pa

from barrierflow._taskgroups import single_error
from barrierflow.actors.sources.errors import BatchAbortedError, FeedBypassedError
from barrierflow.channels.barrier import Barrier
from barrierflow.channels.channel import ReceiveChannel, SendChannel, create_channel
from barrierflow.channels.chunk import Chunk
from barrierflow.channels.messages import Committable, Message
from barrierflow.runtime.actor import ActorContext, StreamActor
from barrierflow.runtime.positions import position_key
from barrierflow.runtime.state.state_store import StateTable

__all__ = ["BatchSource", "FeedEnd"]

#: The state table of a batch source: stream name → last batch id sealed with the rows.
_TABLE = "batches"
#: Stream name → the batch id adopted from a sink's storage (ids up to it are replays).
_ADOPTED = "adopted"


@final
@dataclass(frozen=True, slots=True)
class BatchEnd:
    """The end mark of one batch: after it, the batch's number is recorded."""

    stream: str
    batch_id: int


#: What travels from the feed to its source: the batch's rows and committables (and the
#: runtime's barriers), then its end mark.
FeedItem = Message | BatchEnd


class FeedEnd(Protocol):
    """The driver's end of a batch source as its source actor sees it (a
    :class:`~barrierflow.actors.sources.batch_feed.BatchFeed`): what the source reads to
    build its channel, and the calls that connect the two.

    Lifecycle: ``attach`` at most once per run of the source, after the initial barrier
    passed; ``detach`` once when the source ends, whether it attached or not.
    """

    @property
    def schema(self) -> pa.Schema:
        """The schema of every chunk of the feed."""
        ...

    @property
    def capacity(self) -> int:
        """Chunks the feed's channel holds."""
        ...

    @property
    def chunk_rows(self) -> int:
        """Rows per chunk a batch is split into."""
        ...

    @property
    def abandoned(self) -> tuple[str, int] | None:
        """``(stream, batch_id)`` of a batch its driver abandoned part-way, if any."""
        ...

    def attach(
        self,
        source: str,
        send: SendChannel[FeedItem],
        durable: dict[str, int],
        floor: dict[str, int],
    ) -> None:
        """The source ``source`` runs: deliveries go to ``send``; ``durable`` is the last
        durable batch id per stream, ``floor`` the adopted one (ids up to it are replays).

        Raises:
            FeedSharedError: another source of the same feed is attached.
        """
        ...

    def detach(self, send: SendChannel[FeedItem] | None) -> None:
        """The source ends (attached with ``send``, or before attaching: ``None``)."""
        ...


class BatchSource(StreamActor):
    """The source actor of a :class:`BatchFeed` (see the module docstring). Create it through
    ``feed.source``; chunks pushed into its inbox with ``rt.push`` are refused."""

    def __init__(self, feed: FeedEnd) -> None:
        self._feed = feed

    def output_schema(self) -> pa.Schema:
        """The feed's schema: every chunk has it (checked against the readers at start)."""
        return self._feed.schema

    async def run(self, ctx: ActorContext) -> None:
        """Restore the durable batch ids, pass the initial barrier, then attach to the feed and
        emit its batches (see the module).

        Raises:
            FeedSharedError: another source of the same feed is running.
            FeedBypassedError: a chunk was pushed into the source's inbox.
            BatchAbortedError: a barrier met a batch its driver abandoned part-way.
        """
        try:
            await self._run(ctx)
        finally:
            # However it ended (before attaching too), a delivery waiting for this source must
            # look at the runtime again.
            self._feed.detach(None)

    async def _run(self, ctx: ActorContext) -> None:
        table = ctx.table(_TABLE)
        adopted_table = ctx.table(_ADOPTED)
        durable = {str(k): int(v) for k, v in (await table.items()).items()}
        floor = {str(k): int(v) for k, v in (await adopted_table.items()).items()}
        prefix = position_key(ctx.name, "")
        if not durable and ctx.adopted_positions:
            # A run on an empty store that adopted a sink's positions: the batches up to them
            # are in the sink already, so they count as durable here (and become so with the
            # first checkpoint), and any id up to them is a replay to skip.
            for key, batch_id in ctx.adopted_positions.items():
                if key.startswith(prefix):
                    stream = key.removeprefix(prefix)
                    durable[stream] = floor[stream] = batch_id
                    table.put(stream, batch_id)
                    adopted_table.put(stream, batch_id)
        positions = {position_key(ctx.name, s): b for s, b in durable.items()}
        # The initial barrier first: no row may reach downstream before it.
        first: Barrier | None = None
        async for message in ctx.messages():
            if isinstance(message, Barrier):
                ctx.report_positions(message, positions)
                first = message
            await ctx.emit(message)
            if first is not None or ctx.finished:
                break
        if ctx.finished or first is None:
            return
        # Deliveries start once the whole graph has started: a sink's coordinator has then
        # recovered (its writers pass their first barrier only once it started them), so what
        # a driver stages for a delivery — files on Spark's executors — cannot be deleted by
        # that recovery before its committable arrives.
        await ctx.wait_completed(first)
        feed = self._feed
        send, receive = create_channel[FeedItem](
            feed.capacity, feed.capacity * feed.chunk_rows, name=f"{ctx.name} feed"
        )
        try:
            with single_error():
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._forward_inbox, ctx, send.clone())
                    feed.attach(ctx.name, send, dict(durable), floor)
                    await self._emit(ctx, feed, receive, table, positions)
                    tg.cancel_scope.cancel()
        finally:
            feed.detach(send)
            receive.close()

    @staticmethod
    async def _forward_inbox(ctx: ActorContext, send: SendChannel[FeedItem]) -> None:
        """Barriers from the runtime join the feed's rows in one ordered stream.

        This hop is kept on purpose (one channel send per barrier, a few microseconds): the
        driver puts a batch's end mark into the feed *before* it asks for the checkpoint that
        must hold the batch, so in one FIFO stream that checkpoint's barrier always comes after
        the end mark. Reading the inbox and the feed side by side (a select) would let the
        barrier overtake a batch still queued in the feed, and the checkpoint the driver waits
        for would not hold it: Spark would then commit a micro-batch the runtime has not made
        durable."""
        with send:
            async for message in ctx.messages():
                if isinstance(message, Chunk):
                    raise FeedBypassedError(ctx.name, message.num_rows)
                await send.send(message)

    @staticmethod
    async def _emit(
        ctx: ActorContext,
        feed: FeedEnd,
        receive: ReceiveChannel[FeedItem],
        table: StateTable,
        positions: dict[str, int],
    ) -> None:
        open_batch = False
        held: list[Message] = []
        async for item in receive:
            if isinstance(item, Chunk | Committable):
                # A committable (work staged outside the graph for a sink) travels with its
                # batch's rows: in the epoch that holds the batch.
                open_batch = True
                await ctx.emit(item)
            elif isinstance(item, BatchEnd):
                table.put(item.stream, item.batch_id)
                positions[position_key(ctx.name, item.stream)] = item.batch_id
                open_batch = False
                for message in held:
                    await BatchSource._pass(ctx, message, positions)
                held.clear()
            elif open_batch:
                abandoned = feed.abandoned
                if abandoned is not None:
                    raise BatchAbortedError(*abandoned)
                held.append(item)  # a barrier waits for the open batch's end mark
            else:
                await BatchSource._pass(ctx, item, positions)
            if ctx.finished:
                return

    @staticmethod
    async def _pass(ctx: ActorContext, message: Message, positions: dict[str, int]) -> None:
        """Pass a barrier (or watermark) on, reporting the positions its epoch reaches."""
        if isinstance(message, Barrier):
            ctx.report_positions(message, positions)
        await ctx.emit(message)
