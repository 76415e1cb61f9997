"""The driver's end of a batch source: :class:`BatchFeed` delivers numbered, atomic batches
into a running graph exactly once, across driver and runtime restarts.

The protocol (what the driver and the
:class:`~barrierflow.actors.sources.batch_source.BatchSource` actor each guarantee) is
described in :mod:`barrierflow.actors.sources.batch_source`; this module is the driver's half:
id checks, retries after graph failures, backpressure and counters.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import final

import anyio
import pyarrow as pa

from barrierflow._sync import Notifier
from barrierflow.actors.sources.batch_source import BatchEnd, BatchSource, FeedItem
from barrierflow.actors.sources.errors import BatchOrderError, FeedSharedError
from barrierflow.channels.channel import SendChannel
from barrierflow.channels.chunk import Chunk
from barrierflow.channels.errors import ChannelBrokenError, ChannelClosedError, InvalidArgumentError
from barrierflow.channels.messages import Committable
from barrierflow.channels.schema import conform_schema
from barrierflow.runtime.errors import ActorFailedError
from barrierflow.runtime.metrics import MetricFamily, counter
from barrierflow.runtime.positions import position_key
from barrierflow.runtime.runtime import Runtime

__all__ = ["BatchFeed", "BatchFeedStats"]


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
        # Notified when a source attaches or ends: a delivery waiting for a source looks again.
        self._source_changed = Notifier()
        self._source_name: str | None = None
        self._send: SendChannel[FeedItem] | None = None
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

    # The actor's side (the :class:`~barrierflow.actors.sources.batch_source.FeedEnd` its
    # source calls; not for the driver).

    @property
    def abandoned(self) -> tuple[str, int] | None:
        """``(stream, batch_id)`` of a batch whose delivery was abandoned part-way (its rows
        went downstream without their number), until a rebuilt source attaches."""
        return self._abandoned

    def attach(
        self,
        source: str,
        send: SendChannel[FeedItem],
        durable: dict[str, int],
        floor: dict[str, int],
    ) -> None:
        """The source actor ``source`` runs (called by it): deliveries go to ``send``.

        Raises:
            FeedSharedError: another source of this feed is attached.
        """
        if self._send is not None:
            raise FeedSharedError(source, self._source_name or "?")
        self._send, self._last, self._floor = send, durable, floor
        self._source_name = source
        self._unconfirmed.clear()
        self._abandoned = None  # a rebuilt graph discarded the abandoned rows
        self._source_changed.notify()

    def detach(self, send: SendChannel[FeedItem] | None) -> None:
        """The source actor ends (called by it; attached with ``send``, or before attaching:
        ``None``)."""
        if send is not None:
            if self._send is send:
                self._send = self._source_name = None
            send.close()
        # Whatever ended the source (its graph failed, most likely), a waiting delivery must
        # look at the runtime again.
        self._source_changed.notify()

    async def _channel(self, runtime: Runtime) -> SendChannel[FeedItem]:
        """The running source's channel; between a graph failure and the rebuilt source
        attaching, wait for it.

        Raises:
            ActorFailedError, NotRunningError: as ``Runtime.wait_running`` — a runtime that
                failed for good raises instead of leaving the delivery waiting for a source
                that will never come back.
        """
        while self._send is None:
            await runtime.wait_running()
            if self._send is None:
                await self._wait_for_change(runtime)
        return self._send

    async def _wait_for_change(self, runtime: Runtime) -> None:
        """Return when a source attaches or ends, or when the runtime stops (its store closes:
        the backstop for a graph that failed for good before its source ever ran)."""
        async with anyio.create_task_group() as tg:

            async def until_stopped() -> None:
                async for _ in runtime.committed_epochs():
                    pass
                tg.cancel_scope.cancel()

            tg.start_soon(until_stopped)
            await self._source_changed.wait()
            tg.cancel_scope.cancel()

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

    async def position_key(self, stream: str, runtime: Runtime) -> str:
        """The position key under which the running source reports ``stream``'s batch ids
        (``"<source actor>/<stream>"``); waits until the source of ``runtime`` runs.

        Raises:
            ActorFailedError, NotRunningError: as ``Runtime.wait_running``.
        """
        await self._channel(runtime)
        assert self._source_name is not None  # set with the channel
        return position_key(self._source_name, stream)

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

    def metric_families(self) -> list[MetricFamily]:
        """The feed's counters as metrics, labelled with its source actor."""
        labels = {"actor": self._source_name or ""}
        stats = self.stats()
        return [
            counter("barrierflow_feed_batches", "batches a feed delivered and made durable",
                    [(labels, stats.batches)]),
            counter("barrierflow_feed_replays_skipped", "replayed batches a feed recognized "
                    "and skipped", [(labels, stats.replays_skipped)]),
            counter("barrierflow_feed_rows", "rows a feed delivered", [(labels, stats.rows)]),
            counter("barrierflow_feed_retries", "deliveries retried after a graph failure",
                    [(labels, stats.retries)]),
            counter("barrierflow_feed_blocked_seconds", "seconds the driver waited for room "
                    "in the feed's channel", [(labels, stats.blocked_seconds)]),
        ]  # fmt: skip

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
        *,
        retries: int | None = None,
        committables: Sequence[Committable] = (),
    ) -> int | None:
        """Deliver batch ``batch_id`` of ``stream`` exactly once; returns the durable
        checkpoint epoch holding it, or ``None`` if it was a replay (already durable).

        ``retries`` overrides the feed's for this call (``0``: a caller that must redo work
        of its own before a batch is delivered again, such as staging it on Spark executors).
        ``committables`` travel with the batch's rows, before its end mark: work staged outside
        the graph for a sink (a batch's files staged on Spark executors), committed by the
        epoch that holds the batch.

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
        committables = tuple(committables)
        if not all(isinstance(c, Committable) for c in committables):
            raise InvalidArgumentError("committables", "a sequence of Committable", committables)
        if retries is None:
            retries = self.retries
        elif type(retries) is not int or retries < 0:
            raise InvalidArgumentError("retries", "None or an int >= 0", retries)
        # The feed reports into the runtime it delivers into (idempotent).
        runtime.metrics.add_source(f"feed:{id(self)}", self.metric_families)
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
                    epoch = await self._deliver_once(runtime, stream, batch_id, table, committables)
                except (ActorFailedError, _SourceGoneError) as exc:
                    attempt += 1
                    if attempt <= retries:
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
        self,
        runtime: Runtime,
        stream: str,
        batch_id: int,
        table: pa.Table,
        committables: tuple[Committable, ...],
    ) -> int:
        send = await self._channel(runtime)
        blocked = send.statistics().blocked_seconds
        sent = False
        try:
            for batch in table.to_batches(max_chunksize=self.chunk_rows):
                if batch.num_rows:
                    await send.send(Chunk(batch))
                    sent = True
            for committable in committables:
                await send.send(committable)
                sent = True
            await send.send(BatchEnd(stream, batch_id))
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
