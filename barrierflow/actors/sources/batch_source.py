"""A source fed by numbered, atomic batches: exactly once across driver and runtime restarts.

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

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import final

import anyio
import pyarrow as pa

from barrierflow._taskgroups import single_error
from barrierflow.actors.sources.errors import BatchAbortedError, BatchOrderError
from barrierflow.channels.barrier import Barrier
from barrierflow.channels.channel import ReceiveChannel, SendChannel, create_channel
from barrierflow.channels.chunk import Chunk
from barrierflow.channels.errors import (
    ChannelBrokenError,
    ChannelClosedError,
    InvalidArgumentError,
    ProtocolError,
)
from barrierflow.channels.messages import Message
from barrierflow.channels.schema import conform_schema
from barrierflow.runtime.actor import ActorContext, StreamActor
from barrierflow.runtime.errors import ActorFailedError
from barrierflow.runtime.positions import position_key
from barrierflow.runtime.runtime import Runtime
from barrierflow.runtime.state.state_store import StateTable

__all__ = ["BatchFeed", "BatchFeedStats", "BatchSource"]

#: Seconds between looks at the runtime while a delivery waits for its source to come back.
_REATTACH_POLL = 0.05
#: The state table of a batch source: stream name → last batch id sealed with the rows.
_TABLE = "batches"
#: Stream name → the batch id adopted from a sink's storage (ids up to it are replays).
_ADOPTED = "adopted"


@final
@dataclass(frozen=True, slots=True)
class _End:
    """The end mark of one batch: after it, the batch's number is recorded."""

    stream: str
    batch_id: int


_Item = Message | _End


@final
@dataclass(frozen=True, slots=True)
class BatchFeedStats:
    """A snapshot of a feed's counters."""

    #: Batches delivered and made durable, and replays recognized and skipped.
    batches: int
    replays_skipped: int
    #: Rows delivered, and deliveries retried after a graph failure.
    rows: int
    retries: int
    #: Seconds the driver waited for room in the feed's channel (backpressure).
    blocked_seconds: float
    #: Seconds spent waiting for checkpoints to become durable.
    checkpoint_seconds: float


class BatchFeed:
    """The driver's end of a :class:`BatchSource` (see the module docstring).

    Args:
        schema: the schema of the rows the source emits.
        chunk_rows: rows per chunk a batch is split into.
        capacity: chunks the feed's channel holds (it also holds at most
            ``capacity * chunk_rows`` rows).
        first_batch_id: the id a stream with nothing durable must start with.
        retries: deliveries of one batch retried after graph failures before giving up.

    Raises:
        InvalidArgumentError: a bad argument (names it).
    """

    def __init__(
        self,
        schema: pa.Schema,
        *,
        chunk_rows: int = 65_536,
        capacity: int = 8,
        first_batch_id: int = 0,
        retries: int = 3,
    ) -> None:
        if not isinstance(schema, pa.Schema):
            raise InvalidArgumentError("schema", "a pyarrow Schema", type(schema).__name__)
        for name, value, low in (
            ("chunk_rows", chunk_rows, 1),
            ("capacity", capacity, 1),
            ("first_batch_id", first_batch_id, 0),
            ("retries", retries, 0),
        ):
            if type(value) is not int or value < low:
                raise InvalidArgumentError(name, f"an int >= {low}", value)
        self.schema = schema
        self.chunk_rows = chunk_rows
        self.capacity = capacity
        self.first_batch_id = first_batch_id
        self.retries = retries
        self._attached: anyio.Event | None = None
        self._send: SendChannel[_Item] | None = None
        # Per stream, the last batch whose end mark went to the running source (restored from
        # the last checkpoint at attach); streams whose last batch is not yet known durable.
        self._last: dict[str, int] = {}
        self._floor: dict[str, int] = {}  # adopted from a sink: ids up to it are replays
        self._unconfirmed: set[str] = set()
        self._lock: anyio.Lock | None = None
        self._abandoned: tuple[str, int] | None = None
        self._batches = self._replays = self._rows = self._retries = 0
        self._blocked = self._checkpointing = 0.0

    def source(self) -> BatchSource:
        """A new source actor for this feed: pass ``feed.source`` as the factory of
        ``rt.add_source(name, feed.source)``."""
        return BatchSource(self)

    # The actor's side.

    def _attach(
        self, send: SendChannel[_Item], durable: dict[str, int], floor: dict[str, int]
    ) -> None:
        if self._send is not None:
            raise ProtocolError(
                "a BatchFeed feeds one source actor: expected one `rt.add_source(name, "
                "feed.source)` per feed, but a second source attached while the first runs"
            )
        self._send, self._last, self._floor = send, durable, floor
        self._unconfirmed.clear()
        self._abandoned = None  # a rebuilt graph discarded the abandoned rows
        if self._attached is None:
            self._attached = anyio.Event()
        self._attached.set()

    def _detach(self, send: SendChannel[_Item]) -> None:
        if self._send is send:
            self._send = None
            self._attached = None
        send.close()

    async def _channel(self, runtime: Runtime) -> SendChannel[_Item]:
        while self._send is None:
            if self._attached is None:
                self._attached = anyio.Event()
            # Between a graph failure and the rebuilt source attaching, look at the runtime
            # now and then: a runtime that failed for good raises instead of leaving a
            # driver's delivery waiting for a source that will never come back.
            await runtime.wait_running()
            with anyio.move_on_after(_REATTACH_POLL):
                await self._attached.wait()
        return self._send

    # The driver's side.

    async def last_batch(self, stream: str, runtime: Runtime) -> int | None:
        """The last batch id of ``stream`` that is durable (``None``: none yet); waits until
        the source of ``runtime`` runs.

        Raises:
            ActorFailedError, NotRunningError: as ``Runtime.wait_running``.
        """
        await self._channel(runtime)
        last = self._last.get(stream)
        if last is not None and stream in self._unconfirmed:
            last = last - 1 if last > self.first_batch_id else None
        return last

    def stats(self) -> BatchFeedStats:
        """A snapshot of the feed's counters."""
        return BatchFeedStats(
            batches=self._batches,
            replays_skipped=self._replays,
            rows=self._rows,
            retries=self._retries,
            blocked_seconds=self._blocked,
            checkpoint_seconds=self._checkpointing,
        )

    def check_batch(self, stream: str, batch_id: int) -> bool:
        """Whether ``batch_id`` is new for ``stream`` (``False``: a replay of the last durable
        batch), judged on the durable ids the running source restored.

        Raises:
            BatchOrderError: the id goes backwards or skips ahead.
        """
        if not isinstance(stream, str) or not stream:
            raise InvalidArgumentError("stream", "a non-empty str", stream)
        if type(batch_id) is not int or batch_id < 0:
            raise InvalidArgumentError("batch_id", "a non-negative int", batch_id)
        last = self._last.get(stream)
        if last is not None and batch_id == last:
            return False
        floor = self._floor.get(stream)
        if floor is not None and batch_id <= floor:
            return False  # held by the sink whose positions this run adopted
        expected = self.first_batch_id if last is None else last + 1
        if batch_id != expected:
            raise BatchOrderError(stream, last, batch_id, expected)
        return True

    async def deliver(
        self,
        runtime: Runtime,
        stream: str,
        batch_id: int,
        data: pa.Table | pa.RecordBatch | Sequence[pa.RecordBatch],
    ) -> int | None:
        """Deliver batch ``batch_id`` of ``stream`` exactly once; returns the durable
        checkpoint epoch holding it, or ``None`` if it was a replay (already durable).

        Raises:
            SchemaMismatchError: ``data`` does not have the feed's schema (nothing delivered).
            BatchOrderError: ``batch_id`` goes backwards or skips (nothing delivered).
            ActorFailedError: the graph failed more than ``retries`` times during delivery,
                or failed and the runtime has no recovery.
        """
        if not isinstance(runtime, Runtime):
            raise InvalidArgumentError("runtime", "a Runtime", type(runtime).__name__)
        if isinstance(data, Sequence) and not isinstance(data, pa.Table | pa.RecordBatch):
            if not all(isinstance(b, pa.RecordBatch) for b in data):
                raise InvalidArgumentError("data", "a Table, RecordBatch or RecordBatches", data)
            data = pa.Table.from_batches(list(data), schema=self.schema)
        table = conform_schema(data, self.schema, f"batch {batch_id} of stream {stream!r}")
        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:  # one batch at a time: batches of a feed never interleave
            attempt = 0
            while True:
                try:
                    if self._abandoned is not None:
                        # Rows of an abandoned batch are downstream: fail the graph before
                        # anything else is sent, so recovery discards them.
                        await runtime.checkpoint()
                    await self._channel(runtime)
                    if not self.check_batch(stream, batch_id):
                        if stream in self._unconfirmed:
                            # Sent by an earlier, abandoned call: make it durable first.
                            await runtime.checkpoint()
                            self._unconfirmed.discard(stream)
                        self._replays += 1
                        return None
                    epoch = await self._deliver_once(runtime, stream, batch_id, table)
                except (ActorFailedError, _SourceGoneError) as exc:
                    attempt += 1
                    if attempt <= self.retries:
                        self._retries += 1
                        continue
                    if isinstance(exc, _SourceGoneError) and exc.__cause__ is not None:
                        raise exc.__cause__ from exc  # the source's channel error
                    raise
                self._unconfirmed.discard(stream)
                self._batches += 1
                self._rows += table.num_rows
                return epoch

    async def _deliver_once(
        self, runtime: Runtime, stream: str, batch_id: int, table: pa.Table
    ) -> int:
        send = await self._channel(runtime)
        blocked = send.statistics().blocked_seconds
        sent = False
        try:
            for batch in table.to_batches(max_chunksize=self.chunk_rows):
                if batch.num_rows:
                    await send.send(Chunk(batch))
                    sent = True
            await send.send(_End(stream, batch_id))
            self._last[stream] = batch_id
            self._unconfirmed.add(stream)
        except (ChannelClosedError, ChannelBrokenError) as exc:
            # The source went away with its graph: the rebuilt one will attach again.
            raise _SourceGoneError from exc
        except BaseException:
            if sent:
                # Rows of this batch went downstream without their number: the source fails
                # the graph at its next barrier, so recovery discards them.
                self._abandoned = (stream, batch_id)
            raise
        finally:
            self._blocked += send.statistics().blocked_seconds - blocked
        started = time.perf_counter()
        epoch = await runtime.checkpoint()
        self._checkpointing += time.perf_counter() - started
        return epoch


class _SourceGoneError(Exception):
    """The feed's channel closed under a delivery: its graph failed."""


class BatchSource(StreamActor):
    """The source actor of a :class:`BatchFeed` (see the module docstring). Create it through
    ``feed.source``; chunks pushed into its inbox with ``rt.push`` are refused."""

    def __init__(self, feed: BatchFeed) -> None:
        self._feed = feed

    async def run(self, ctx: ActorContext) -> None:
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
        async for message in ctx.messages():
            if isinstance(message, Barrier):
                ctx.report_positions(message, positions)
            await ctx.emit(message)
            if isinstance(message, Barrier) or ctx.finished:
                break
        if ctx.finished:
            return
        feed = self._feed
        send, receive = create_channel[_Item](
            feed.capacity, feed.capacity * feed.chunk_rows, name=f"{ctx.name} feed"
        )
        try:
            with single_error():
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._forward_inbox, ctx, send.clone())
                    feed._attach(send, dict(durable), floor)
                    await self._emit(ctx, feed, receive, table, positions)
                    tg.cancel_scope.cancel()
        finally:
            feed._detach(send)
            receive.close()

    @staticmethod
    async def _forward_inbox(ctx: ActorContext, send: SendChannel[_Item]) -> None:
        """Barriers from the runtime join the feed's rows in one ordered stream."""
        with send:
            async for message in ctx.messages():
                if isinstance(message, Chunk):
                    raise ProtocolError(
                        f"a chunk was pushed into batch source {ctx.name!r}: deliver rows "
                        "through its BatchFeed, expected barriers only in its inbox"
                    )
                await send.send(message)

    @staticmethod
    async def _emit(
        ctx: ActorContext,
        feed: BatchFeed,
        receive: ReceiveChannel[_Item],
        table: StateTable,
        positions: dict[str, int],
    ) -> None:
        open_batch = False
        held: list[Message] = []
        async for item in receive:
            if isinstance(item, Chunk):
                open_batch = True
                await ctx.emit(item)
            elif isinstance(item, _End):
                table.put(item.stream, item.batch_id)
                positions[position_key(ctx.name, item.stream)] = item.batch_id
                open_batch = False
                for message in held:
                    await BatchSource._pass(ctx, message, positions)
                held.clear()
            elif open_batch:
                abandoned = feed._abandoned
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
