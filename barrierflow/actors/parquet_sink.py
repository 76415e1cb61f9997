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

import json
import os
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, final

import anyio
import anyio.to_thread
import pyarrow as pa
import pyarrow.parquet as pq

from barrierflow._fs import fsync_path, write_atomically
from barrierflow.actors._dirlock import DirectoryLease, lock_directory
from barrierflow.actors.sink import CommitMetadata, PendingCommit
from barrierflow.errors import InvalidArgumentError, SinkRecoveryError
from barrierflow.runtime.positions import (
    SinkCommits,
    check_positions,
    epoch_already_held,
    merge_positions,
)

__all__ = ["ParquetFileSink"]

MANIFEST = "_manifest.json"
STAGING = ".staging"
PRECOMMITTED = "_PRECOMMITTED.json"
_FORMAT = "barrierflow-parquet-sink"
_VERSION = 1

T = TypeVar("T")


def epoch_dir_name(epoch: int) -> str:
    """The committed directory of ``epoch`` (zero-padded, so names sort by epoch)."""
    return f"epoch={epoch:020d}"


def _write_json_atomically(path: Path, value: Any) -> None:
    """Write, fsync, rename over ``path``, fsync the directory: all of it or none survives."""
    write_atomically(path, json.dumps(value, sort_keys=True).encode())


def _read_record(final: Path) -> dict[str, Any] | None:
    """The record an epoch directory carries (``None`` if it has none or it is unreadable)."""
    try:
        record = json.loads((final / PRECOMMITTED).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _positive_int(argument: str, value: Any) -> int:
    if type(value) is not int or value < 1:
        raise InvalidArgumentError(argument, "an int >= 1", value)
    return value


def _writer_id(writer: Any) -> str | None:
    if writer is None:
        return None
    if not isinstance(writer, str) or not writer or not writer.replace("-", "").isalnum():
        raise InvalidArgumentError("writer", "None or a non-empty alphanumeric id", writer)
    return writer


def _dictionary_columns(schema: pa.Schema, choice: Any) -> bool | list[str]:
    if choice is None:
        return [
            f.name
            for f in schema
            if pa.types.is_string(f.type)
            or pa.types.is_large_string(f.type)
            or pa.types.is_binary(f.type)
            or pa.types.is_large_binary(f.type)
            or pa.types.is_dictionary(f.type)
        ]
    if isinstance(choice, bool):
        return choice
    if isinstance(choice, str) or not isinstance(choice, Sequence):
        raise InvalidArgumentError(
            "use_dictionary", "None, a bool or a list of column names", choice
        )
    names = list(choice)
    unknown = [n for n in names if n not in schema.names]
    if unknown:
        raise InvalidArgumentError("use_dictionary", f"column names of {schema.names}", unknown)
    return names


class _Files:
    """The blocking half: every method runs on a worker thread, under one lock."""

    def __init__(
        self,
        root: Path,
        schema: pa.Schema,
        rows_per_file: int,
        compression: str,
        use_dictionary: bool | list[str],
        writer: str | None = None,
    ) -> None:
        self.root = root
        self.staging = root / STAGING
        self.writer_id = writer
        self.schema = schema
        self.rows_per_file = rows_per_file
        self.compression = compression
        self.use_dictionary = use_dictionary
        self.lock = threading.RLock()  # write_taken calls write under it
        self.writer: pq.ParquetWriter | None = None
        self.file_rows = 0
        self.epoch: int | None = None
        self.files: list[str] = []  # staged files of the open epoch
        self.rows = 0
        # Source positions of the open epoch: after the first, up to the second.
        self.positions: tuple[dict[str, int], dict[str, int]] = ({}, {})
        self.lease: DirectoryLease | None = None

    # Manifest.

    def read_manifest(self) -> dict[str, Any]:
        path = self.root / MANIFEST
        if not path.exists():
            return {
                "format": _FORMAT,
                "version": _VERSION,
                "committed_epoch": 0,
                "rows": 0,
                "files": 0,
            }
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise SinkRecoveryError(str(self.root), f"unreadable manifest: {exc}") from exc
        if not isinstance(manifest, dict) or manifest.get("format") != _FORMAT:
            raise SinkRecoveryError(str(self.root), f"{MANIFEST} is not a {_FORMAT} manifest")
        if manifest.get("version") != _VERSION:
            raise SinkRecoveryError(
                str(self.root),
                f"expected manifest version {_VERSION}, got {manifest.get('version')!r}",
            )
        for field in ("committed_epoch", "rows", "files"):
            value = manifest.get(field)
            if type(value) is not int or value < 0:
                raise SinkRecoveryError(
                    str(self.root), f"{MANIFEST}: expected {field} to be an int >= 0, got {value!r}"
                )
        return manifest

    def record(
        self,
        manifest: dict[str, Any],
        epoch: int,
        files: int,
        rows: int,
        positions: dict[str, int] | None = None,
    ) -> None:
        manifest["committed_epoch"] = epoch
        manifest["files"] += files
        manifest["rows"] += rows
        if positions:
            manifest["positions"] = merge_positions(manifest.get("positions", {}), positions)
        _write_json_atomically(self.root / MANIFEST, manifest)

    def held_positions(self, manifest: dict[str, Any]) -> dict[str, int]:
        positions = manifest.get("positions", {})
        try:
            return check_positions("positions", positions)
        except InvalidArgumentError as exc:
            raise SinkRecoveryError(str(self.root), f"{MANIFEST}: {exc}") from exc

    def commits(self) -> SinkCommits | None:
        """What the table holds: the manifest, plus epochs renamed after it (read-only)."""
        manifest = self.read_manifest()
        epoch, positions = manifest["committed_epoch"], self.held_positions(manifest)
        for directory in self.root.glob("epoch=*"):
            if not directory.name.removeprefix("epoch=").isdigit():
                continue
            # Renamed, maybe not in the manifest yet (a crash between the two): committed.
            epoch = max(epoch, int(directory.name.removeprefix("epoch=")))
            record = _read_record(directory)
            if record is not None:
                positions = merge_positions(positions, record.get("positions", {}))
        return None if epoch == 0 else SinkCommits(str(self.root), epoch, positions)

    def skip_if_held(self, manifest: dict[str, Any], epoch: int, record: dict[str, Any]) -> bool:
        """Whether the epoch's rows are already in the table (a replay after the runtime's
        store went back in time): then the commit is skipped."""
        return epoch_already_held(
            str(self.root),
            epoch,
            self.held_positions(manifest),
            record.get("positions_from", {}),
            record.get("positions", {}),
        )

    # Writing one epoch.

    def open(self) -> None:
        with self.lock:
            self.staging.mkdir(parents=True, exist_ok=True)
            if self.lease is None:
                self.lease = lock_directory(self.root, sink=str(self.root))

    def staged_dir(self, epoch: int) -> Path:
        """Where this sink stages ``epoch``: its own subdirectory when it is one writer of a
        coordinated sink, so that the epoch's directory holds every writer's files."""
        directory = self.staging / f"{epoch:020d}"
        return directory if self.writer_id is None else directory / f"w{self.writer_id}"

    def begin(self, epoch: int) -> None:
        with self.lock:
            self._close_writer()
            self.epoch, self.files, self.rows = epoch, [], 0
            self.positions = ({}, {})
            leftover = self.staged_dir(epoch)
            if leftover.exists():  # an earlier incarnation staged this epoch number
                shutil.rmtree(leftover)

    def write_taken(self, take: Callable[[], list[pa.RecordBatch]]) -> None:
        """Write what ``take`` hands over, taken under the lock: into the epoch open now."""
        with self.lock:
            batches = take()
            if batches:
                self.write(batches)

    def write(self, batches: list[pa.RecordBatch]) -> None:
        with self.lock:
            assert self.epoch is not None
            table = pa.Table.from_batches(batches, self.schema)
            offset = 0
            while offset < table.num_rows:
                if self.writer is None:
                    directory = self.staged_dir(self.epoch)
                    directory.mkdir(parents=True, exist_ok=True)
                    name = f"part-{len(self.files):05d}.parquet"
                    self.writer = pq.ParquetWriter(
                        str(directory / name),
                        self.schema,
                        compression=self.compression,
                        use_dictionary=self.use_dictionary,
                    )
                    self.files.append(name)
                    self.file_rows = 0
                take = min(table.num_rows - offset, self.rows_per_file - self.file_rows)
                self.writer.write_table(table.slice(offset, take), row_group_size=take)
                offset += take
                self.file_rows += take
                self.rows += take
                if self.file_rows >= self.rows_per_file:
                    self._close_writer()

    def _close_writer(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def pre_commit(self, epoch: int) -> dict[str, Any]:
        with self.lock:
            self._close_writer()
            metadata: dict[str, Any] = {
                "epoch": epoch,
                "files": list(self.files),
                "rows": self.rows,
            }
            start, end = self.positions
            if end:
                metadata["positions_from"], metadata["positions"] = start, end
            if self.files:
                directory = self.staged_dir(epoch)
                for name in self.files:
                    fsync_path(directory / name)
                if self.writer_id is None:
                    _write_json_atomically(directory / PRECOMMITTED, metadata)
                else:  # the coordinator's meta store records it; paths relative to the root
                    fsync_path(directory)
                    metadata["writer"] = self.writer_id
                    metadata["paths"] = [
                        str((directory / name).relative_to(self.root)) for name in self.files
                    ]
                # The directory entries leading to the files must survive a power loss too.
                parent = directory.parent
                while parent != self.root:
                    fsync_path(parent)
                    parent = parent.parent
            self.epoch, self.files, self.rows = None, [], 0
            return metadata

    def rollback(self, epoch: int) -> None:
        with self.lock:
            if self.epoch == epoch:
                self._close_writer()
                self.epoch, self.files, self.rows = None, [], 0
            shutil.rmtree(self.staged_dir(epoch), ignore_errors=True)

    # Committing.

    def commit(self, epoch: int) -> None:
        with self.lock:
            self._commit(self.read_manifest(), epoch)

    def _commit(self, manifest: dict[str, Any], epoch: int) -> None:
        staged = self.staging / f"{epoch:020d}"
        final = self.root / epoch_dir_name(epoch)
        if epoch <= manifest["committed_epoch"]:
            shutil.rmtree(staged, ignore_errors=True)  # a replayed commit: nothing to do
            return
        if staged.exists() and not final.exists():
            record = json.loads((staged / PRECOMMITTED).read_text(encoding="utf-8"))
            if self.skip_if_held(manifest, epoch, record):
                shutil.rmtree(staged, ignore_errors=True)  # its rows are in the table already
                return
            os.rename(staged, final)  # the commit point: the whole epoch appears at once
            fsync_path(self.root)
            self.record(
                manifest, epoch, len(record["files"]), record["rows"], record.get("positions")
            )
        elif final.exists():
            self._record_renamed(manifest, epoch)
        # else: an empty epoch — nothing was staged, nothing to publish.

    def _record_renamed(self, manifest: dict[str, Any], epoch: int) -> None:
        final = self.root / epoch_dir_name(epoch)
        record = json.loads((final / PRECOMMITTED).read_text(encoding="utf-8"))
        self.record(manifest, epoch, len(record["files"]), record["rows"], record.get("positions"))

    def recover(self, pending: Sequence[PendingCommit]) -> None:
        with self.lock:
            self.staging.mkdir(parents=True, exist_ok=True)
            manifest = self.read_manifest()
            # Renamed but not recorded: committed (a rename only follows a durable checkpoint).
            renamed = sorted(
                int(p.name.removeprefix("epoch="))
                for p in self.root.glob("epoch=*")
                if p.is_dir() and int(p.name.removeprefix("epoch=")) > manifest["committed_epoch"]
            )
            for epoch in renamed:
                self._record_renamed(manifest, epoch)
            durable = {p.epoch: p for p in pending}
            for epoch in sorted(durable):
                if epoch <= manifest["committed_epoch"]:
                    continue
                staged = self.staging / f"{epoch:020d}"
                files = durable[epoch].metadata.get("files", [])
                if not staged.exists() and files:
                    raise SinkRecoveryError(
                        str(self.root),
                        f"epoch {epoch} was pre-committed with {len(files)} file(s) and its "
                        "checkpoint is durable, but it is neither staged nor committed",
                    )
                self._commit(manifest, epoch)
            for staged in self.staging.iterdir():
                # Not in the checkpoint: the upstream replays these rows, so they must go.
                shutil.rmtree(staged, ignore_errors=True)

    def close(self) -> None:
        with self.lock:
            self._close_writer()
            if self.lease is not None:
                self.lease.release()
                self.lease = None


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
            staged under ``.staging/<epoch>/w<writer>/``, its pre-commit returns their paths,
            and commit and recovery belong to the coordinator's
            :class:`~barrierflow.actors.parquet_committer.ParquetCommitter` (``commit_epoch``
            and ``recover`` are no-ops here).

    Raises:
        InvalidArgumentError: a bad argument.
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
        if not isinstance(path, str | os.PathLike) or not str(path):
            raise InvalidArgumentError("path", "a directory path", path)
        if not isinstance(schema, pa.Schema):
            raise InvalidArgumentError("schema", "a pyarrow.Schema", type(schema).__name__)
        if not isinstance(compression, str):
            raise InvalidArgumentError("compression", "a Parquet codec name", compression)
        self._root = Path(path)
        self._schema = schema
        self._row_group_rows = _positive_int("row_group_rows", row_group_rows)
        self._files = _Files(
            self._root,
            schema,
            _positive_int("rows_per_file", rows_per_file),
            compression,
            _dictionary_columns(schema, use_dictionary),
            _writer_id(writer),
        )
        self._buffer: list[pa.RecordBatch] = []
        self._buffered_rows = 0
        self._buffer_lock = threading.Lock()  # the buffer is taken on the writing thread
        self._limiter: anyio.CapacityLimiter | None = None

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

    async def open(self) -> None:
        """Create the table and staging directories."""
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
        if self._files.writer_id is None:
            await self._run(self._files.recover, list(pending))

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
        if self._files.writer_id is not None:
            await anyio.lowlevel.checkpoint()
            return None
        return await self._run(self._files.commits)

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
        if self._files.writer_id is None:
            await self._run(self._files.commit, epoch)
        else:
            await anyio.lowlevel.checkpoint()

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
