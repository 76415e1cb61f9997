"""The Spark bridge: Spark micro-batches in as Arrow chunks, exactly once.

A :class:`SparkBridge` connects a Spark driver to a running barrierflow graph whose source is
a :class:`~barrierflow.actors.BatchFeed`'s source actor::

    feed = BatchFeed(SCHEMA)
    rt = Runtime(config)
    rt.add_source("events", feed.source, fanout=Fanout("hash", ("key",)))
    ...                                              # the rest of the graph
    with BlockingRuntime(rt) as handle:              # the runtime on a background thread
        bridge = SparkBridge(handle, feed)
        query = bridge.start(stream_df, checkpoint_location="ck/")   # or:
        # stream_df.writeStream.foreachBatch(bridge.callback).option(...).start()
        bridge.await_termination(query)      # a failure raises its cause, not a Py4J wall

For each micro-batch, :meth:`SparkBridge.callback` (running on Spark's callback thread):

1. checks the micro-batch's schema against the feed's, before any Spark work or any row moves
   (:class:`~barrierflow.errors.SchemaMismatchError` names both; when they differ only in a
   timestamp's time zone or an integer's width, it says which cast fixes it, or to declare
   the feed with :func:`arrow_schema_of`);
2. checks the batch id against the last durable one: Spark replays the last batch it did not
   commit after a crash — if that batch is durable here it is skipped without even being
   computed; an id that goes backwards or skips is :class:`~barrierflow.errors.BatchOrderError`;
3. converts the micro-batch with ``DataFrame.toArrow()`` and delivers it through the feed:
   chunks of ``chunk_rows`` through a bounded channel (a slow graph blocks this thread, which
   slows Spark down), then a checkpoint, returning only once the epoch that holds the rows and
   the batch id is durable. Spark then writes its own commit for the batch.

The bridge holds at most one micro-batch (the ``toArrow`` table) plus what the feed's channel
holds. Static DataFrames go through :meth:`SparkBridge.pump` the same way.

**Failures.** An error raised in the callback stops the query, and Spark hands it to the
driver as a ``StreamingQueryException`` whose text buries it under Py4J and JVM traces.
:meth:`SparkBridge.await_termination` (or :meth:`SparkBridge.unwrap` on what the driver caught
or ``query.exception()`` returned) gives back the error the callback raised — the same typed
object, kept on the Python side — or a :class:`~barrierflow.errors.SparkQueryFailedError`
naming Spark's own cause in one line (see :mod:`barrierflow.spark_bridge.failures`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, final

import pyarrow as pa

from barrierflow._extras import require
from barrierflow.actors.sources.batch_feed import BatchFeed
from barrierflow.channels.errors import InvalidArgumentError, SchemaMismatchError
from barrierflow.channels.schema import cast_fixes, check_schema, conform_schema
from barrierflow.runtime.blocking import BlockingRuntime
from barrierflow.runtime.errors import NotRunningError
from barrierflow.spark_bridge.failures import unwrap_spark_error

__all__ = ["BridgeStats", "SparkBridge", "arrow_schema_of"]


@final
@dataclass(frozen=True, slots=True)
class BridgeStats:
    """A snapshot of a bridge's counters."""

    #: Micro-batches delivered, and replays skipped.
    batches: int
    replays_skipped: int
    #: Rows delivered.
    rows: int
    #: Seconds in Spark's ``toArrow``, and in delivery (channel waits and checkpoints).
    to_arrow_seconds: float
    deliver_seconds: float


def arrow_schema_of(df: Any) -> pa.Schema:
    """The Arrow schema ``df.toArrow()`` will have (computed from Spark's schema, no job): the
    schema to declare a :class:`~barrierflow.actors.BatchFeed` with
    (``BatchFeed(arrow_schema_of(df))``). Spark's ``timestamp`` is
    ``timestamp[us, tz=UTC]``, ``timestamp_ntz`` is ``timestamp[us]``, ``int`` is ``int32``
    and ``bigint`` is ``int64``."""
    spark_types = require("spark", "pyspark.sql.pandas.types")
    schema: pa.Schema = spark_types.to_arrow_schema(df.schema, timezone="UTC")
    return schema


def _check_frame(df: Any, schema: pa.Schema, what: str, streaming: bool | None = None) -> None:
    """Refuse, before any Spark job, what is not a PySpark DataFrame of ``schema`` (streaming
    or static as ``streaming`` requires, if given)."""
    if not all(hasattr(df, name) for name in ("toArrow", "schema", "isStreaming")):
        raise InvalidArgumentError("df", "a PySpark 4 DataFrame", type(df).__name__)
    if streaming is True and not df.isStreaming:
        raise InvalidArgumentError("df", "a streaming DataFrame (use pump() otherwise)", df)
    if streaming is False and df.isStreaming:
        raise InvalidArgumentError("df", "a static DataFrame (use start() to stream)", df)
    got = arrow_schema_of(df)
    try:
        check_schema(got, schema, what)
    except SchemaMismatchError:
        raise SchemaMismatchError(what, schema, got, fix=_cast_fix(schema, got)) from None


#: Spark's SQL type names of the Arrow integer types it has (Spark has no unsigned ones).
_SPARK_INTEGERS = {
    pa.int8(): "tinyint",
    pa.int16(): "smallint",
    pa.int32(): "int",
    pa.int64(): "bigint",
}


def _cast_fix(want: pa.Schema, got: pa.Schema) -> str:
    """How to fix a micro-batch schema that differs from the feed's only in timestamps' time
    zones or integers' widths (the two a user meets most: Spark's ``timestamp`` carries UTC,
    its ``int`` is 32 bits): the Spark casts, and declaring the feed with
    :func:`arrow_schema_of`. ``""`` for any other difference (a name, a type that no Spark
    cast produces)."""
    if want.names != got.names:
        return ""
    casts: list[str] = []
    for wanted, have in zip(want, got, strict=True):
        if wanted.type == have.type:
            continue
        if not cast_fixes(wanted.type, have.type):
            return ""
        if pa.types.is_timestamp(wanted.type):
            if wanted.type.unit != "us" or wanted.type.tz not in (None, "UTC"):
                return ""  # Spark's timestamps are microseconds, in UTC or naive
            spark_type = "timestamp_ntz" if wanted.type.tz is None else "timestamp"
        elif wanted.type in _SPARK_INTEGERS:
            spark_type = _SPARK_INTEGERS[wanted.type]
        else:
            return ""  # Spark has no unsigned integers
        casts.append(f".withColumn({wanted.name!r}, df[{wanted.name!r}].cast({spark_type!r}))")
    return (
        f"declare the feed with BatchFeed(arrow_schema_of(df)), or cast in Spark: "
        f"df{''.join(casts)}"
    )


class SparkBridge:
    """Delivers Spark DataFrames into a running runtime (see the module docstring).

    Args:
        runtime: the running runtime's blocking handle (the bridge is called from Spark's
            threads, not from async code).
        feed: the feed whose source actor is in the runtime's graph.
        stream: the name under which batch ids are recorded (one per streaming query).

    Raises:
        InvalidArgumentError: a bad argument (names it).
    """

    def __init__(self, runtime: BlockingRuntime, feed: BatchFeed, *, stream: str = "spark") -> None:
        if not isinstance(runtime, BlockingRuntime):
            raise InvalidArgumentError("runtime", "a BlockingRuntime", type(runtime).__name__)
        if not isinstance(feed, BatchFeed):
            raise InvalidArgumentError("feed", "a BatchFeed", type(feed).__name__)
        if not isinstance(stream, str) or not stream:
            raise InvalidArgumentError("stream", "a non-empty str", stream)
        self.runtime = runtime
        self.feed = feed
        self.stream = stream
        self._batches = self._replays = self._rows = 0
        self._to_arrow = self._deliver = 0.0
        self._last_error: Exception | None = None

    @property
    def last_error(self) -> Exception | None:
        """The exception :meth:`callback` raised last, or ``None`` if it never raised.

        Spark reports a failed ``foreachBatch`` callback as a ``StreamingQueryException``
        whose message is the Py4J proxy's ("An exception was raised by the Python Proxy...")
        with the real error buried in a Python traceback; this is that real error (a
        :class:`~barrierflow.errors.BatchOrderError`, a ``SchemaMismatchError``, ...), for a
        driver to report. It stays set after later batches succeed.
        """
        return self._last_error

    def unwrap(self, exc: BaseException, *, query: Any = None) -> BaseException:
        """The error behind ``exc`` — what a driver caught around ``awaitTermination``, or
        what ``query.exception()`` returned: the error this bridge's callback raised (the same
        object: :attr:`last_error`) if Spark's text names its type, else a
        :class:`~barrierflow.errors.SparkQueryFailedError` with Spark's own cause in one line
        (its ``__cause__`` is ``exc``, and it names ``query``'s name or id if given); ``exc``
        itself if it is not a Spark or Py4J error.
        """
        kept = () if self._last_error is None else (self._last_error,)
        name = None if query is None else (query.name or str(query.id))
        return unwrap_spark_error(exc, kept, query=name)

    def await_termination(self, query: Any, timeout: float | None = None) -> bool:
        """``query.awaitTermination(timeout)``, with a failed query raising its cause.

        Returns:
            Whether the query has terminated (always ``True`` without a timeout).

        Raises:
            SchemaMismatchError, BatchOrderError, ActorFailedError, ...: what the bridge's
                callback raised, the same object (see :meth:`unwrap`).
            SparkQueryFailedError: the query failed otherwise; Spark's cause in one line.
        """
        try:
            done = query.awaitTermination() if timeout is None else query.awaitTermination(timeout)
        except Exception as exc:
            cause = self.unwrap(exc, query=query)
            if cause is exc:
                raise
        else:
            return done is None or bool(done)
        # Raised outside the except block: the Spark wall is not chained on as the context.
        raise cause

    def stats(self) -> BridgeStats:
        """A snapshot of the bridge's counters."""
        return BridgeStats(
            batches=self._batches,
            replays_skipped=self._replays,
            rows=self._rows,
            to_arrow_seconds=self._to_arrow,
            deliver_seconds=self._deliver,
        )

    def _check_running(self) -> None:
        if not self.runtime.running:
            raise NotRunningError(
                "the runtime behind this Spark bridge",
                "enter `with BlockingRuntime(rt):` before starting the query, and stop the "
                "query before leaving it",
            )

    def deliver(self, df: Any, batch_id: int, *, stream: str | None = None) -> int | None:
        """Deliver ``df`` as batch ``batch_id`` of ``stream`` (default: the bridge's); returns
        the durable epoch, or ``None`` for a replay that was already durable.

        Raises:
            NotRunningError: the runtime is not running.
            SchemaMismatchError: ``df``'s schema is not the feed's (nothing delivered).
            BatchOrderError: ``batch_id`` goes backwards or skips (nothing delivered).
        """
        self._check_running()
        stream = self.stream if stream is None else stream
        # The schema is checked once, here at the boundary, from Spark's own schema (no job).
        _check_frame(df, self.feed.schema, f"micro-batch {batch_id} of {stream!r}")
        started = time.perf_counter()
        table = df.toArrow()
        self._to_arrow += time.perf_counter() - started
        # One crossing into the runtime per micro-batch: the feed checks the batch id (a
        # replay is skipped there, after one toArrow it did not need) and delivers.
        return self._deliver_table(stream, batch_id, table)

    def callback(self, df: Any, batch_id: int) -> None:
        """The ``foreachBatch`` callback: ``df.writeStream.foreachBatch(bridge.callback)``.

        Raises:
            NotRunningError, SchemaMismatchError, BatchOrderError: as :meth:`deliver` (or
                whatever the graph raised); the exception is also kept as :attr:`last_error`.
        """
        try:
            self.deliver(df, batch_id)
        except Exception as exc:
            self._last_error = exc
            raise

    def _deliver_table(self, stream: str, batch_id: int, table: pa.Table) -> int | None:
        started = time.perf_counter()
        epoch = self.runtime.call(self.feed.deliver, self.runtime.runtime, stream, batch_id, table)
        self._deliver += time.perf_counter() - started
        if epoch is None:
            self._replays += 1
        else:
            self._batches += 1
            self._rows += table.num_rows
        return epoch

    def start(
        self,
        df: Any,
        checkpoint_location: str,
        *,
        trigger: str | None = None,
        available_now: bool = False,
        query_name: str | None = None,
    ) -> Any:
        """Start ``df`` (a streaming DataFrame) into the bridge; returns the StreamingQuery.

        Args:
            checkpoint_location: Spark's own checkpoint (offsets and commits); keep it with the
                runtime's state: together they make the query exactly once across restarts.
            trigger: a processing-time interval such as ``"1 second"`` (default: Spark's).
            available_now: process what is available now, in micro-batches, then stop.
            query_name: the query's name in Spark.
        """
        self._check_running()
        if not isinstance(checkpoint_location, str) or not checkpoint_location:
            raise InvalidArgumentError(
                "checkpoint_location", "a non-empty directory path", checkpoint_location
            )
        _check_frame(df, self.feed.schema, "the streaming DataFrame", streaming=True)
        writer = df.writeStream.foreachBatch(self.callback).option(
            "checkpointLocation", checkpoint_location
        )
        if query_name is not None:
            writer = writer.queryName(query_name)
        if available_now:
            writer = writer.trigger(availableNow=True)
        elif trigger is not None:
            writer = writer.trigger(processingTime=trigger)
        return writer.start()

    def pump(
        self,
        df: Any,
        *,
        stream: str = "pump",
        slice_rows: int | None = None,
        progress: bool = False,
    ) -> int:
        """Deliver a static DataFrame: one batch, or slices of ``slice_rows`` rows, each its
        own durable batch of ``stream``; returns the rows delivered now.

        A pump that crashed resumes with the slice after the last durable one when called
        again with the same ``stream`` — exact only if ``df`` yields its rows in the same order
        every time (sort it, or read files that do not change).

        Raises:
            NotRunningError, SchemaMismatchError: as :meth:`deliver`.
        """
        self._check_running()
        if slice_rows is not None and (type(slice_rows) is not int or slice_rows < 1):
            raise InvalidArgumentError("slice_rows", "None or an int >= 1", slice_rows)
        what = f"the DataFrame pumped as {stream!r}"
        _check_frame(df, self.feed.schema, what, streaming=False)
        started = time.perf_counter()
        table = conform_schema(df.toArrow(), self.feed.schema, what)
        self._to_arrow += time.perf_counter() - started
        size = slice_rows or max(table.num_rows, 1)
        slices = [table.slice(offset, size) for offset in range(0, max(table.num_rows, 1), size)]
        last = self.runtime.call(self.feed.last_batch, stream, self.runtime.runtime)
        first = self.feed.first_batch_id
        todo = [(first + i, s) for i, s in enumerate(slices) if last is None or first + i > last]
        delivered = 0
        with _Progress(progress, f"pump {stream}", table.num_rows) as advance:
            advance(table.num_rows - sum(s.num_rows for _, s in todo))
            for batch_id, piece in todo:
                self._deliver_table(stream, batch_id, piece)
                delivered += piece.num_rows
                advance(piece.num_rows)
        return delivered


class _Progress:
    """A rich progress bar over rows, or nothing."""

    def __init__(self, enabled: bool, title: str, total: int) -> None:
        self._bar: Any = None
        if enabled:
            from rich.progress import Progress

            self._bar = Progress(transient=False)
            self._task = self._bar.add_task(title, total=total)

    def __enter__(self) -> Any:
        if self._bar is None:
            return lambda rows: None
        self._bar.start()
        return lambda rows: self._bar.advance(self._task, rows)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
