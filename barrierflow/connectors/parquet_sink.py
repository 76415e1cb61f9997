"""An exactly-once Parquet file sink: a directory of Parquet files, one directory per epoch.

Layout of the table directory ``path``::

    path/
      epoch=00000000000123456789/part-00000.parquet   committed rows of one epoch
      .staging/00000000000123456790/part-00000.parquet rows of an epoch not committed yet
      .staging/00000000000123456790/_PRECOMMITTED.json  its pre-commit record
      _manifest.json                                    the last committed epoch, row totals

How each phase keeps the table exact:

* **write**: batches are buffered and written as large row groups into a staged file under
  ``.staging/<epoch>/`` (rolled every ``rows_per_file`` rows). Readers never look there:
  ``pyarrow.dataset`` skips names starting with ``.`` or ``_``.
* **pre-commit**: the staged files are closed and fsynced, then a pre-commit record naming
  them is written atomically; their names and row count are the commit metadata.
* **commit**: one atomic ``rename`` moves the epoch's staging directory to ``epoch=<epoch>/``
  — readers see all of the epoch's rows or none — then the manifest records the epoch
  (written to a temporary file, fsynced, renamed over the old one). A commit of an epoch at or
  below the manifest's, or whose directory is already in place, only completes the record: a
  commit replayed after a crash is a no-op.
* **recover**: epochs renamed but not yet in the manifest are recorded (they were committed,
  which only happens after their checkpoint was durable); the staged epochs the sink's
  checkpoint lists as pre-committed are committed (the upstream will not replay their rows);
  every other staged epoch is deleted (the upstream will replay its rows).

**Source positions** (:mod:`barrierflow.runtime.positions`): the positions an epoch's rows
span are written into its pre-commit record, which is renamed into ``epoch=<epoch>/`` with the
files — the rows and their positions appear in one step — and merged into the manifest's
``positions``. A commit of an epoch whose batches the table already holds (the runtime's store
went back in time) is skipped. The table directory is locked against writers of other
processes (``.barrierflow.lock``, see :mod:`._dirlock`).

Empty epochs write nothing at all. The directory names carry the epoch, so a hive
partitioning also yields an ``epoch`` column; epochs exceed int32, so declare its type:
``ds.dataset(path, partitioning=ds.partitioning(pa.schema([("epoch", pa.int64())]),
flavor="hive"))``.

File I/O runs on a worker thread, one call at a time (a per-sink limiter and lock); a call
abandoned by cancellation (a periodic flush that overran its timeout) finishes on its thread
before the next one starts.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, final

import anyio
import anyio.to_thread
import pyarrow as pa

from barrierflow.actors.sinks.protocol import CommitMetadata, PendingCommit
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
from barrierflow.connectors._parquet_modes import CommitMode, CoordinatedWriter, SingleWriter
from barrierflow.runtime.positions import SinkCommits

__all__ = ["ParquetFileSink"]

T = TypeVar("T")


@final
class ParquetFileSink:
    """An exactly-once sink writing Parquet files into the directory ``path``.

    See the module docstring for the layout and how each phase keeps the table exact.

    Args:
        path: the table directory (created if missing). One sink writes it at a time.
        schema: the schema of every batch (and of the files).
        rows_per_file: a staged file is closed and a new one started after this many rows.
        row_group_rows: rows buffered in memory before they are written as one row group
            (also written by every flush and pre-commit).
        compression: the Parquet codec (``"snappy"``, ``"zstd"``, ``"none"``, ...).
        use_dictionary: which columns are dictionary-encoded: ``None`` (the default) for the
            string, binary and dictionary columns only — where it pays — since trying it on
            high-cardinality numeric columns costs time before falling back to plain
            encoding; ``True`` for every column (pyarrow's default), ``False`` for none, or a
            list of column names.
        writer: makes this one of the parallel writers of a coordinated sink: its files are
            staged under ``.staging/<epoch>/w<writer>/``, its pre-commit returns its
            :class:`~barrierflow.actors.sinks.table.Manifest` as JSON (files, rows, sizes),
            and commit and recovery belong to the coordinator's
            :class:`~barrierflow.connectors.parquet_committer.ParquetCommitter` (``commit_epoch``
            and ``recover`` are no-ops here).

    Raises:
        InvalidArgumentError: a bad argument (a ``compression`` pyarrow cannot write is
            refused here, not at the first write).
        SinkPathError: ``path`` cannot be a table directory as far as ``stat`` tells (a file,
            under a file, not writable); what only creating it tells (``/proc``, a read-only
            mount) is refused when the graph starts (:meth:`check_path`), before any row.
    """

    exactly_once = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        schema: pa.Schema,
        *,
        rows_per_file: int = 1_000_000,
        row_group_rows: int = 131_072,
        compression: str = "snappy",
        use_dictionary: bool | Sequence[str] | None = None,
        writer: str | None = None,
    ) -> None:
        if not isinstance(schema, pa.Schema):
            raise InvalidArgumentError("schema", "a pyarrow.Schema", type(schema).__name__)
        self._root = check_table_path(path, "ParquetFileSink")
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
        coordinated = self._files.writer_id is not None
        self._mode: CommitMode = (
            CoordinatedWriter() if coordinated else SingleWriter(self._files, self._run)
        )

    @property
    def path(self) -> Path:
        """The table directory."""
        return self._root

    @property
    def schema(self) -> pa.Schema:
        """The schema of every batch and file."""
        return self._schema

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(1)
        return await anyio.to_thread.run_sync(
            fn, *args, limiter=self._limiter, abandon_on_cancel=True
        )

    def check_path(self, sink: str) -> None:
        """Create the table and staging directories if missing (blocking: a ``stat`` and a
        ``mkdir``, once, when the graph starts — before any row flows).

        Raises:
            SinkPathError: they cannot be created or written, naming ``sink``.
        """
        make_table_directory(self._root, sink)

    async def open(self) -> None:
        """Create the table and staging directories.

        Raises:
            SinkPathError: they cannot be created or written.
        """
        await self._run(self._files.open)

    @property
    def writer(self) -> str | None:
        """This sink's writer id, if it is one writer of a coordinated sink."""
        return self._files.writer_id

    async def recover(self, pending: Sequence[PendingCommit]) -> None:
        """Record renamed epochs, commit ``pending`` ones, delete every other staged epoch
        (a no-op for a coordinated writer: its coordinator recovers).

        Raises:
            SinkRecoveryError: the manifest is unreadable, or a pending epoch with files is
                neither staged nor committed (nothing is deleted then).
        """
        await self._mode.recover(pending)

    async def begin_epoch(self, epoch: int) -> None:
        """Start staging ``epoch`` (a leftover staging directory of that number is removed)."""
        self._take_buffer()  # dropped
        await self._run(self._files.begin, epoch)

    async def write_batch(self, batch: pa.RecordBatch) -> None:
        """Buffer ``batch``; write a row group once ``row_group_rows`` are buffered."""
        with self._buffer_lock:
            self._buffer.append(batch)
            self._buffered_rows += batch.num_rows
            full = self._buffered_rows >= self._row_group_rows
        if full:
            await self.flush()

    async def flush(self) -> None:
        """Write the buffered rows into the staged file (not a commit: nothing visible)."""
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

    async def record_positions(
        self, epoch: int, start: Mapping[str, int], end: Mapping[str, int]
    ) -> None:
        """The source positions the rows of open epoch ``epoch`` span (batches after
        ``start``, up to ``end``): recorded in its pre-commit record, renamed into the table
        with the rows, and merged into the manifest at commit (see
        :mod:`barrierflow.runtime.positions`)."""
        await anyio.lowlevel.checkpoint()
        if self._files.epoch == epoch:
            self._files.positions = (dict(start), dict(end))

    async def sink_commits(self) -> SinkCommits | None:
        """What the table holds (``None``: nothing committed, or a coordinated writer, whose
        committer answers instead)."""
        return await self._mode.commits()

    async def pre_commit(self, epoch: int) -> CommitMetadata:
        """Write what is buffered, close and fsync the staged files, record the pre-commit.

        Returns:
            ``{"epoch", "files", "rows"}``: the staged file names and their row count.
        """
        await self.flush()
        return await self._run(self._files.pre_commit, epoch)

    async def commit_epoch(self, epoch: int) -> None:
        """Rename the epoch's staging directory into the table and record it (idempotent; a
        no-op for a coordinated writer: its coordinator commits)."""
        await self._mode.commit(epoch)

    async def rollback_epoch(self, epoch: int) -> None:
        """Delete what ``epoch`` staged."""
        if self._files.epoch == epoch:
            self._take_buffer()  # dropped
        await self._run(self._files.rollback, epoch)

    async def close(self) -> None:
        """Close the open staged file; a staged, uncommitted epoch stays for recovery."""
        self._take_buffer()  # dropped
        await self._run(self._files.close)

    def committed_epoch(self) -> int:
        """The last epoch recorded in the manifest (reads the file; 0 for a new table)."""
        return int(self._files.read_manifest()["committed_epoch"])

    def __repr__(self) -> str:
        return f"<ParquetFileSink {str(self._root)!r}>"
