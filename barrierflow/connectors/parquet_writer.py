"""The staging writer of every file table: Parquet files staged per writer and epoch.

:class:`ParquetStagingWriter` is what ``writer(id)`` of :class:`~.parquet_table.ParquetTable`,
:class:`~.iceberg_table.IcebergTable` and :class:`~.delta_table.DeltaLakeTable` returns. It stages
the rows of sink epoch *S* under ``<root>/.staging/<S>/w<id>/`` and never makes anything
visible: each table's committer moves the files into place.

* **write**: batches are buffered and written as large row groups into a staged file
  (rolled every ``rows_per_file`` rows). Readers never look there: ``pyarrow.dataset``,
  Iceberg and Delta skip names starting with ``.``.
* **stage**: the staged files are closed and fsynced, with the directory entries leading to
  them; the writer returns its :class:`~barrierflow.actors.sinks.table.Manifest` (paths
  relative to the root, rows and bytes per file).
* **discard**: the epoch's staged directory is deleted.
* The root directory is locked against writers of other processes (``.barrierflow.lock``, see
  :mod:`._dirlock`).

File I/O runs on a worker thread, one call at a time (a per-writer limiter and lock); a call
abandoned by cancellation (a periodic flush that overran its timeout) finishes on its thread
before the next one starts.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar, final

import anyio
import anyio.lowlevel
import anyio.to_thread
import pyarrow as pa

from barrierflow.actors.sinks.table import Manifest
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.connectors._parquet_files import (
    StagedFiles,
    check_compression,
    check_table_path,
    check_writer_id,
    dictionary_columns,
    make_table_directory,
    positive_int,
)
from barrierflow.connectors.executor_staging import ExecutorStaging

__all__ = ["WRITER_OPTIONS", "ParquetStagingWriter"]

T = TypeVar("T")

#: The options a table passes on to its writers.
WRITER_OPTIONS = ("rows_per_file", "row_group_rows", "compression", "use_dictionary")


@final
class ParquetStagingWriter:
    """Stages Parquet files under ``root`` as writer ``writer`` (see the module docstring).

    Args:
        root: the directory the table's files live under (created if missing).
        schema: the schema of every batch (and of the files).
        writer: this writer's id: its files are staged under ``.staging/<epoch>/w<writer>/``.
        rows_per_file: a staged file is closed and a new one started after this many rows.
        row_group_rows: rows buffered in memory before they are written as one row group
            (also written by every flush and stage).
        compression: the Parquet codec (``"snappy"``, ``"zstd"``, ``"none"``, ...).
        use_dictionary: which columns are dictionary-encoded: ``None`` (the default) for the
            string, binary and dictionary columns only — where it pays — since trying it on
            high-cardinality numeric columns costs time before falling back to plain
            encoding; ``True`` for every column (pyarrow's default), ``False`` for none, or a
            list of column names.

    Raises:
        InvalidArgumentError: a bad argument (a ``compression`` pyarrow cannot write is
            refused here, not at the first write).
        SinkPathError: ``root`` cannot be a table directory as far as ``stat`` tells (a file,
            under a file, not writable); what only creating it tells (``/proc``, a read-only
            mount) is refused when the graph starts (:meth:`check_path`), before any row.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        schema: pa.Schema,
        writer: str,
        *,
        rows_per_file: int = 1_000_000,
        row_group_rows: int = 131_072,
        compression: str = "snappy",
        use_dictionary: bool | Sequence[str] | None = None,
    ) -> None:
        if not isinstance(schema, pa.Schema):
            raise InvalidArgumentError("schema", "a pyarrow.Schema", type(schema).__name__)
        if writer is None:
            raise InvalidArgumentError("writer", "a non-empty alphanumeric id", writer)
        self._root = check_table_path(root, "ParquetStagingWriter", "root")
        check_compression(compression)
        self._schema = schema
        self._row_group_rows = positive_int("row_group_rows", row_group_rows)
        self._files = StagedFiles(
            self._root,
            schema,
            positive_int("rows_per_file", rows_per_file),
            compression,
            dictionary_columns(schema, use_dictionary),
            check_writer_id(writer),
        )
        self._buffer: list[pa.RecordBatch] = []
        self._buffered_rows = 0
        self._buffer_lock = threading.Lock()  # the buffer is taken on the writing thread
        self._limiter: anyio.CapacityLimiter | None = None

    @property
    def path(self) -> Path:
        """The table's root directory."""
        return self._root

    @property
    def schema(self) -> pa.Schema:
        """The schema of every batch and file."""
        return self._schema

    @property
    def writer(self) -> str:
        """This writer's id."""
        writer = self._files.writer_id
        assert writer is not None  # checked by the constructor
        return writer

    def executor_staging(self) -> ExecutorStaging:
        """What a Spark task needs to stage rows the way this writer does (its root, schema
        and file options; see :mod:`~.executor_staging`)."""
        files = self._files
        return ExecutorStaging(
            str(self._root),
            self._schema,
            files.rows_per_file,
            self._row_group_rows,
            files.compression,
            files.use_dictionary,
        )

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(1)
        return await anyio.to_thread.run_sync(
            fn, *args, limiter=self._limiter, abandon_on_cancel=True
        )

    def check_path(self, sink: str) -> None:
        """Create the root and staging directories if missing (blocking: a ``stat`` and a
        ``mkdir``, once, when the graph starts — before any row flows).

        Raises:
            SinkPathError: they cannot be created or written, naming ``sink``.
        """
        make_table_directory(self._root, sink)

    async def open(self) -> None:
        """Create the root and staging directories and lock the root against other processes.

        Raises:
            SinkPathError: they cannot be created or written.
        """
        await self._run(self._files.open)

    async def begin(self, epoch: int) -> None:
        """Start staging ``epoch`` (a leftover staging directory of that number is removed)."""
        self._take_buffer()  # dropped
        await self._run(self._files.begin, epoch)

    async def write(self, batch: pa.RecordBatch) -> None:
        """Buffer ``batch``; write a row group once ``row_group_rows`` are buffered."""
        with self._buffer_lock:
            self._buffer.append(batch)
            self._buffered_rows += batch.num_rows
            full = self._buffered_rows >= self._row_group_rows
        if full:
            await self.flush()

    async def flush(self) -> None:
        """Write the buffered rows into the staged file (nothing becomes visible)."""
        if not self._buffer:
            await anyio.lowlevel.checkpoint()
            return
        # Taken on the thread, under the files' lock: an abandoned flush still writes what it
        # took, and one cancelled before its thread started leaves the rows for the next call.
        await self._run(self._files.write_taken, self._take_buffer)

    def _take_buffer(self) -> list[pa.RecordBatch]:
        with self._buffer_lock:
            batches, self._buffer, self._buffered_rows = self._buffer, [], 0
        return batches

    async def stage(self, epoch: int) -> Manifest:
        """Write what is buffered, close and fsync the staged files; return their manifest."""
        await self.flush()
        return await self._run(self._files.stage, epoch)

    async def discard(self, epoch: int) -> None:
        """Delete what ``epoch`` staged."""
        if self._files.epoch == epoch:
            self._take_buffer()  # dropped
        await self._run(self._files.discard, epoch)

    async def close(self) -> None:
        """Close the open staged file and release the lock; staged epochs stay for the
        committer (which commits or deletes them)."""
        self._take_buffer()  # dropped
        await self._run(self._files.close)

    def __repr__(self) -> str:
        return f"<ParquetStagingWriter {str(self._root)!r} w{self.writer}>"
