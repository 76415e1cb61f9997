"""Spark as a reader: a table or path read by Spark, as Arrow chunks, with backpressure.

For the backfills: history that lives where Spark can read it (a table of the catalog, a
directory of Parquet, ...) is read partition by partition and handed over as
:class:`~barrierflow.channels.Chunk`\\ s through a bounded channel::

    async with SparkReader(spark.read.parquet("history/"), chunk_rows=65_536) as chunks:
        async for chunk in chunks:
            ...

Spark computes the partitions through the DataFrame's Arrow C stream (``__arrow_c_stream__``,
PySpark 4): partitions are fetched one at a time, so the driver holds one partition plus the
channel, and a slow consumer stops the fetching (the fetching thread blocks on the full
channel). The Spark calls are blocking: they run on a worker thread.

Cancellation: prompt — leaving the ``async with`` block early (a ``break``, an error, a
cancelled task) releases the caller at once, without waiting for Spark to finish the partition
it is computing: that worker thread is abandoned and finishes its current Spark call in the
background, but delivers no chunk after the block is left (the channel is closed first and the
thread checks a stop flag before each chunk), then closes the Arrow stream.
"""

from __future__ import annotations

import contextlib
import threading
from types import TracebackType
from typing import Any

import anyio
import anyio.abc
import anyio.from_thread
import anyio.to_thread
import pyarrow as pa

from barrierflow.channels.channel import ReceiveChannel, SendChannel, create_channel
from barrierflow.channels.chunk import Chunk
from barrierflow.channels.errors import ChannelBrokenError, ChannelClosedError, InvalidArgumentError

__all__ = ["SparkReader", "read_spark"]


def read_spark(
    spark: Any, source: str, *, format: str | None = None, options: dict[str, str] | None = None
) -> Any:
    """A Spark DataFrame of ``source``: a catalog table if ``format`` is ``None``, else a path
    read with that format (``"parquet"``, ``"json"``, ...)."""
    if not isinstance(source, str) or not source:
        raise InvalidArgumentError("source", "a table name or a path", source)
    if options is not None and (
        not isinstance(options, dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in options.items())
    ):
        raise InvalidArgumentError("options", "None or a dict of str to str", options)
    if format is not None and (not isinstance(format, str) or not format):
        raise InvalidArgumentError("format", "None (a table) or a format name", format)
    if format is None:
        return spark.table(source)
    return spark.read.format(format).options(**(options or {})).load(source)


class SparkReader:
    """Arrow chunks of a (static) Spark DataFrame, with backpressure (see the module).

    Args:
        df: the DataFrame to read.
        chunk_rows: rows per chunk at most (Spark's Arrow batches are sliced, not merged).
        capacity: chunks buffered between Spark and the consumer.

    Cancellation: prompt — leaving the block, or cancelling a task reading in it, returns at
    once; a Spark call in progress finishes on its abandoned thread, and no chunk is delivered
    after that (the chunks read so far are all the consumer sees).

    Raises:
        InvalidArgumentError: a bad argument (names it).
    """

    def __init__(self, df: Any, *, chunk_rows: int = 65_536, capacity: int = 4) -> None:
        for name, value in (("chunk_rows", chunk_rows), ("capacity", capacity)):
            if type(value) is not int or value < 1:
                raise InvalidArgumentError(name, "an int >= 1", value)
        if getattr(df, "isStreaming", False):
            raise InvalidArgumentError("df", "a static DataFrame", "a streaming DataFrame")
        if not hasattr(df, "__arrow_c_stream__"):
            raise InvalidArgumentError("df", "a PySpark 4 DataFrame", type(df).__name__)
        self._df = df
        self._chunk_rows = chunk_rows
        self._capacity = capacity
        self._stack: contextlib.AsyncExitStack | None = None
        self._group: anyio.abc.TaskGroup | None = None
        self._receive: ReceiveChannel[Chunk] | None = None
        # Set when the block is left: the (possibly abandoned) fetching thread sends no more.
        self._stopped = threading.Event()

    async def __aenter__(self) -> SparkReader:
        """Start fetching on a worker thread."""
        send, receive = create_channel[Chunk](self._capacity, name="spark reader")
        stopped = self._stopped = threading.Event()
        async with contextlib.AsyncExitStack() as stack:
            stack.callback(receive.close)
            group = await stack.enter_async_context(anyio.create_task_group())
            group.start_soon(self._fetch, send, stopped)
            self._stack, self._group, self._receive = stack.pop_all(), group, receive
        return self

    async def _fetch(self, send: SendChannel[Chunk], stopped: threading.Event) -> None:
        try:
            # Abandoned on cancel: a Spark call cannot be interrupted, the caller must not wait.
            await anyio.to_thread.run_sync(
                self._fetch_blocking, send, stopped, abandon_on_cancel=True
            )
        except (ChannelClosedError, ChannelBrokenError):
            pass  # the consumer left early: the fetch stopped at its next send
        except anyio.get_cancelled_exc_class():
            # Left open: a cancelled fetch is not the end of the data, and the consumer (in the
            # same cancelled scope) must see its cancellation, not a clean end of stream.
            raise
        except BaseException:
            send.close()
            raise
        send.close()

    def _fetch_blocking(self, send: SendChannel[Chunk], stopped: threading.Event) -> None:
        reader = pa.RecordBatchReader.from_stream(self._df)
        try:
            for batch in reader:
                for offset in range(0, batch.num_rows, self._chunk_rows):
                    if stopped.is_set():
                        return
                    piece = batch.slice(offset, self._chunk_rows)
                    anyio.from_thread.run(send.send, Chunk(piece))
        finally:
            reader.close()

    def __aiter__(self) -> SparkReader:
        return self

    async def __anext__(self) -> Chunk:
        if self._receive is None:
            raise InvalidArgumentError("reader", "use inside `async with SparkReader(df)`", None)
        try:
            return await self._receive.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop fetching and release the caller at once (see "Cancellation" in the module)."""
        stack, group, receive = self._stack, self._group, self._receive
        self._stack = self._group = self._receive = None
        self._stopped.set()
        if stack is None or group is None or receive is None:
            return
        # Closed first: a send waiting for room fails, and so does any later one. Cancelling
        # the group abandons a thread still inside a Spark call.
        receive.close()
        group.cancel_scope.cancel()
        # Never suppresses: the group's own scope may take the body's cancellation for its own
        # (both were cancelled), and the caller's scope must still see it.
        await stack.__aexit__(exc_type, exc, tb)
