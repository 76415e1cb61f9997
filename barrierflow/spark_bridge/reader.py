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
"""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
import pyarrow as pa
from anyio.abc import TaskGroup

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
        self._group: TaskGroup | None = None
        self._receive: ReceiveChannel[Chunk] | None = None

    async def __aenter__(self) -> SparkReader:
        send, receive = create_channel[Chunk](self._capacity, name="spark reader")
        group = anyio.create_task_group()
        await group.__aenter__()
        self._group, self._receive = group, receive
        group.start_soon(self._fetch, send)
        return self

    async def _fetch(self, send: SendChannel[Chunk]) -> None:
        # A consumer that left early closed the channel: the fetch stops at its next send.
        with send, contextlib.suppress(ChannelClosedError, ChannelBrokenError):
            await anyio.to_thread.run_sync(self._fetch_blocking, send)

    def _fetch_blocking(self, send: SendChannel[Chunk]) -> None:
        reader = pa.RecordBatchReader.from_stream(self._df)
        try:
            for batch in reader:
                for offset in range(0, batch.num_rows, self._chunk_rows):
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
        group, receive = self._group, self._receive
        self._group = self._receive = None
        if receive is not None:
            receive.close()  # a fetch waiting for room gets ChannelBrokenError and stops
        if group is not None:
            await group.__aexit__(exc_type, exc, tb)
