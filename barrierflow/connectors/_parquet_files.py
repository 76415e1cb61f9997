"""The blocking half of the Parquet tables: a table directory's files.

Everything here runs on a worker thread, one call at a time, under :attr:`StagedFiles.lock`:
a writer's staged files of the open epoch and the manifest describing them, the table's
``_manifest.json`` (its committed marker), and the directory lock.
:class:`~.parquet_writer.ParquetStagingWriter` is the async staging writer around it;
:class:`~.parquet_committer.ParquetCommitter` commits through its manifest helpers. The layout
and the rules are in :mod:`.parquet_committer`'s docstring.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from barrierflow._fs import directory_problem, fsync_path, make_directory, write_atomically
from barrierflow.actors.sinks.errors import SinkRecoveryError
from barrierflow.actors.sinks.positions import epoch_already_held
from barrierflow.actors.sinks.table import ColumnStats, Manifest, SinkCommits, StagedFile
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.connectors._dirlock import DirectoryLease, lock_directory
from barrierflow.connectors._staging import (
    MANIFEST,
    PRECOMMITTED,
    STAGING,
    staged_name,
)
from barrierflow.connectors.errors import SinkPathError
from barrierflow.runtime.positions import check_positions, merge_positions

_FORMAT = "barrierflow-parquet-sink"
_VERSION = 1


def write_json_atomically(path: Path, value: Any) -> None:
    """Write, fsync, rename over ``path``, fsync the directory: all of it or none survives."""
    write_atomically(path, json.dumps(value, sort_keys=True).encode())


def _read_record(final: Path) -> dict[str, Any] | None:
    """The record an epoch directory carries (``None`` if it has none or it is unreadable)."""
    try:
        record = json.loads((final / PRECOMMITTED).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


#: What a file sink's table directory must be (the words of every :class:`SinkPathError`).
TABLE_DIRECTORY = "a table directory that exists (or can be created) and is writable"

_CODECS = ("none", "snappy", "gzip", "brotli", "lz4", "lz4_raw", "zstd")


def check_compression(value: Any) -> str:
    """``value`` if it names a Parquet codec this pyarrow can write (checked when the sink is
    made: pyarrow would refuse it only at the first write, inside a running graph)."""
    if not isinstance(value, str) or value.lower() not in _CODECS:
        raise InvalidArgumentError("compression", f"a Parquet codec, one of {_CODECS}", value)
    if value.lower() != "none" and not pa.Codec.is_available(value.lower()):
        raise InvalidArgumentError("compression", "a codec built into this pyarrow", value)
    return value


def check_table_path(path: Any, kind: str, argument: str = "path") -> Path:
    """``path`` as a :class:`Path`, if it can be a table directory as far as ``stat`` tells
    (it is not a file, not under a file, and it or its nearest existing parent is writable).

    Raises:
        InvalidArgumentError: ``path`` is not a non-empty str or ``os.PathLike[str]``
            (named ``argument``).
        SinkPathError: ``path`` cannot be a table directory (``sink`` is ``kind``: the sink
            has no name yet).
    """
    value: object = path
    if isinstance(path, os.PathLike):
        value = os.fspath(path)
    if not isinstance(value, str) or not value or "\x00" in value:
        raise InvalidArgumentError(argument, "a directory path (a str or os.PathLike[str])", path)
    real = os.path.realpath(value)
    got = directory_problem(real)
    if got is not None:
        raise SinkPathError(kind, real, TABLE_DIRECTORY, got)
    return Path(value)


def make_table_directory(root: Path, sink: str) -> None:
    """Create the table directory and its staging directory (``mkdir -p``), blocking.

    Raises:
        SinkPathError: either cannot be created or written (under a file, in ``/proc``, a
            read-only place).
    """
    real = os.path.realpath(root)
    got = make_directory(os.path.join(real, STAGING), what="a directory")
    if got is not None:
        raise SinkPathError(sink, real, TABLE_DIRECTORY, got)


def positive_int(argument: str, value: Any) -> int:
    if type(value) is not int or value < 1:
        raise InvalidArgumentError(argument, "an int >= 1", value)
    return value


def check_writer_id(writer: Any) -> str | None:
    if writer is None:
        return None
    if not isinstance(writer, str) or not writer or not writer.replace("-", "").isalnum():
        raise InvalidArgumentError("writer", "None or a non-empty alphanumeric id", writer)
    return writer


def dictionary_columns(schema: pa.Schema, choice: Any) -> bool | list[str]:
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


def column_stats(footer: pq.FileMetaData, schema: pa.Schema) -> dict[str, ColumnStats]:
    """Each top-level column's statistics in a Parquet file, from the footer its writer just
    wrote (``metadata_collector``): null counts summed over the row groups, bounds the least
    and greatest of theirs — for the columns whose values have a JSON form (integers, floats,
    strings, booleans); the others keep their null count. One pass over the row groups (a
    handful per file), no data read. A column some row group wrote no statistics for is left
    out: nothing known is better than a wrong bound."""
    leaves = {footer.schema.column(i).path: i for i in range(footer.num_columns)}
    stats: dict[str, ColumnStats] = {}
    for field in schema:
        index = leaves.get(field.name)  # a nested column's leaves have dotted paths: skipped
        if index is None:
            continue
        bounded = _has_json_bounds(field.type)
        nulls, low, high = 0, None, None
        for group in range(footer.num_row_groups):
            chunk = footer.row_group(group).column(index).statistics
            if chunk is None or not chunk.has_null_count:
                break
            nulls += chunk.null_count
            if bounded and chunk.has_min_max:
                low = chunk.min if low is None else min(low, chunk.min)
                high = chunk.max if high is None else max(high, chunk.max)
        else:
            try:
                stats[field.name] = ColumnStats(nulls, low, high)
            except InvalidArgumentError:  # an infinite float bound has no JSON form
                stats[field.name] = ColumnStats(nulls)
    return stats


def _has_json_bounds(type_: pa.DataType) -> bool:
    """Whether a column of ``type_`` has bounds with a JSON form."""
    return bool(
        pa.types.is_integer(type_)
        or pa.types.is_floating(type_)
        or pa.types.is_string(type_)
        or pa.types.is_large_string(type_)
        or pa.types.is_boolean(type_)
    )


class StagedFiles:
    """The blocking half: every method runs on a worker thread, under one lock."""

    def __init__(
        self,
        root: Path,
        schema: pa.Schema,
        rows_per_file: int,
        compression: str,
        use_dictionary: bool | list[str],
        writer: str | None = None,
        directory: Path | None = None,
    ) -> None:
        self.root = root
        self.staging = root / STAGING
        self.writer_id = writer
        self.directory = directory  # where a Spark task attempt stages (see executor_staging)
        self.schema = schema
        self.rows_per_file = rows_per_file
        self.compression = compression
        self.use_dictionary = use_dictionary
        self.lock = threading.RLock()  # write_taken calls write under it
        self.writer: pq.ParquetWriter | None = None
        self.file_rows = 0
        self.epoch: int | None = None
        self.files: list[str] = []  # staged files of the open epoch
        self.rows_each: list[int] = []  # and the rows of each
        self.stats_each: list[dict[str, ColumnStats]] = []  # and the statistics of each closed
        self._footers: list[pq.FileMetaData] = []  # what the writer of the last file wrote
        self.rows = 0
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
        write_json_atomically(self.root / MANIFEST, manifest)

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
            make_table_directory(self.root, str(self.root))
            if self.lease is None:
                self.lease = lock_directory(self.root, sink=str(self.root))

    def staged_dir(self, epoch: int) -> Path:
        """Where this sink stages ``epoch``: its own subdirectory when it is one writer of a
        coordinated sink, so that the epoch's directory holds every writer's files; a task
        attempt's own directory when it was given one."""
        if self.directory is not None:
            return self.directory
        directory = self.staging / staged_name(epoch)
        return directory if self.writer_id is None else directory / f"w{self.writer_id}"

    def begin(self, epoch: int) -> None:
        with self.lock:
            self._close_writer()
            self.epoch, self.files, self.rows_each, self.rows = epoch, [], [], 0
            self.stats_each = []
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
                        # The footer it writes, handed back on close: each file's statistics
                        # come from it, so the committer reads no footer.
                        metadata_collector=self._footers,
                    )
                    self.files.append(name)
                    self.rows_each.append(0)
                    self.file_rows = 0
                take = min(table.num_rows - offset, self.rows_per_file - self.file_rows)
                self.writer.write_table(table.slice(offset, take), row_group_size=take)
                offset += take
                self.file_rows += take
                self.rows_each[-1] += take
                self.rows += take
                if self.file_rows >= self.rows_per_file:
                    self._close_writer()

    def _close_writer(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.stats_each.append(column_stats(self._footers.pop(), self.schema))
            self.writer = None

    def stage(self, epoch: int) -> Manifest:
        """Close and fsync the open epoch's files (and the directories leading to them);
        return the writer's manifest of them."""
        assert self.writer_id is not None  # only a writer stages
        with self.lock:
            self._close_writer()
            directory = self.staged_dir(epoch)
            if self.files:
                for name in self.files:
                    fsync_path(directory / name)
                fsync_path(directory)
                # The directory entries leading to the files must survive a power loss too.
                parent = directory.parent
                while parent != self.root:
                    fsync_path(parent)
                    parent = parent.parent
            manifest = Manifest(
                self.writer_id,
                epoch,
                tuple(
                    StagedFile(
                        str((directory / name).relative_to(self.root)),
                        rows,
                        (directory / name).stat().st_size,
                        stats,
                    )
                    for name, rows, stats in zip(
                        self.files, self.rows_each, self.stats_each, strict=True
                    )
                ),
            )
            self.epoch, self.files, self.rows_each, self.rows = None, [], [], 0
            self.stats_each = []
            return manifest

    def discard(self, epoch: int) -> None:
        with self.lock:
            if self.epoch == epoch:
                self._close_writer()
                self.epoch, self.files, self.rows_each, self.rows = None, [], [], 0
                self.stats_each = []
            shutil.rmtree(self.staged_dir(epoch), ignore_errors=True)

    def close(self) -> None:
        with self.lock:
            self._close_writer()
            if self.lease is not None:
                self.lease.release()
                self.lease = None
