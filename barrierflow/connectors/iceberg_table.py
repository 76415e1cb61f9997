"""A coordinated exactly-once Apache Iceberg sink: one Iceberg snapshot per epoch.

No server: the catalog is pyiceberg's ``SqlCatalog`` on a local SQLite file and the warehouse a
local directory (:func:`open_local_catalog`). The parts:

* **Writers** are Parquet staging writers (:meth:`IcebergTable.writer`): each stages
  its rows of sink epoch *S* under ``<table>/data/.staging/<S>/w<id>/``, fsyncs them when it
  stages the epoch and sends its manifest to the coordinator.
* **The committer** (:class:`IcebergCommitter`, the coordinator's two-phase committer):
  ``prepare`` gathers every writer's files; ``commit`` moves them out of staging to
  ``<table>/data/<S>/w<id>/`` and adds them in **one** transaction that also sets the table
  property ``barrierflow.committed-epoch`` (and the snapshot summary's ``barrierflow.epoch``):
  one atomic snapshot per epoch. A commit whose epoch is not above that property is a replay
  after a crash and is skipped — the property, not the snapshot summaries, is the source of
  truth, because snapshot expiry deletes old summaries. ``abort`` deletes the epoch's files;
  ``recover`` deletes staged files no pending commit references, and files moved into the
  table that neither a pending commit nor a snapshot names (a crash between the moves and the
  catalog commit, with the meta store lost since).
* **Source positions**: the same transaction records the positions the epoch's rows reach in
  the snapshot summary (``barrierflow.positions``) and, merged, in the table property
  ``barrierflow.source-positions``; an epoch whose batches the table holds already is dropped
  instead of committed (see :mod:`barrierflow.runtime.positions`). The writers lock the data
  directory against other processes.
* **Schema change** is Iceberg schema evolution: a commit carrying
  ``{"add_columns": [{"name": ..., "type": "int64" | "double" | "string" | ...}]}`` adds the
  columns in the same transaction (:mod:`barrierflow.connectors._iceberg_schema`).
* **Maintenance**: commit latency grows with the number of snapshots and metadata files, so
  every ``expire_every`` commits the committer expires all but the last ``keep_snapshots``
  snapshots, and the table is created with ``write.metadata.delete-after-commit.enabled`` so
  old metadata files are deleted.

pyiceberg calls are blocking: they run on a worker thread, one at a time. pyiceberg is imported
when a committer or sink is first used, not when :mod:`barrierflow.actors` is imported.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any, final

import anyio
import anyio.to_thread
import pyarrow as pa

from barrierflow._extras import require
from barrierflow._fs import make_directory
from barrierflow.actors.sinks.table import StagedFile
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.connectors._file_table import EpochCommit, FileCommitter
from barrierflow.connectors._iceberg_schema import evolve, same_fields
from barrierflow.connectors._parquet_files import check_table_path
from barrierflow.connectors.errors import SinkPathError
from barrierflow.connectors.parquet_writer import ParquetStagingWriter
from barrierflow.runtime.positions import (
    merge_positions,
)

__all__ = [
    "COMMITTED_EPOCH_PROPERTY",
    "POSITIONS_PROPERTY",
    "IcebergCommitter",
    "IcebergTable",
    "open_local_catalog",
]

#: The table property holding the last committed epoch (epochs only increase).
COMMITTED_EPOCH_PROPERTY = "barrierflow.committed-epoch"
#: The table property holding the source positions the committed rows reach (JSON).
POSITIONS_PROPERTY = "barrierflow.source-positions"
_SUMMARY_EPOCH = "barrierflow.epoch"
_SUMMARY_POSITIONS = "barrierflow.positions"


def open_local_catalog(root: str | os.PathLike[str], name: str = "barrierflow") -> Any:
    """A pyiceberg ``SqlCatalog`` on ``<root>/catalog.db`` with warehouse ``<root>/warehouse``
    (blocking; both are created if missing).

    Raises:
        InvalidArgumentError: ``root`` is not a path, or ``name`` not a non-empty str.
        SinkPathError: the warehouse cannot be created or written under ``root`` (a file, under
            a file, ``/proc``, not writable).
        MissingExtraError: pyiceberg is not installed (``pip install 'barrierflow[iceberg]'``).
    """
    catalog = require("iceberg", "pyiceberg.catalog.sql")
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError("name", "a non-empty catalog name", name)
    base = Path(check_table_path(root, f"catalog {name!r}", "root")).resolve()
    got = make_directory(str(base / "warehouse"), what="a warehouse directory")
    if got is not None:
        raise SinkPathError(f"catalog {name!r}", str(base), _CATALOG_DIRECTORY, got)
    return catalog.SqlCatalog(
        name, uri=f"sqlite:///{base / 'catalog.db'}", warehouse=f"file://{base / 'warehouse'}"
    )


_CATALOG_DIRECTORY = "a catalog directory that exists (or can be created) and is writable"
#: The table property naming the columns of files without Iceberg field ids.
_NAME_MAPPING = "schema.name-mapping.default"
#: Iceberg's default metrics mode for strings: bounds truncated to 16 characters.
_STRING_BOUND = 16


def _data_file(metadata: Any, path: Path, staged: StagedFile) -> Any:
    """The Iceberg ``DataFile`` of a placed file, built from what its writer knew (rows,
    bytes, per-column null counts and bounds serialized per Iceberg type, as pyiceberg's
    ``data_file_statistics_from_parquet_metadata`` would from the footer): the commit reads
    no footer. A column of a type without JSON bounds keeps its null count only."""
    manifest = require("iceberg", "pyiceberg.manifest")
    conversions = require("iceberg", "pyiceberg.conversions")
    typedef = require("iceberg", "pyiceberg.typedef")
    truncate = require("iceberg", "pyiceberg.utils.truncate")
    types = require("iceberg", "pyiceberg.types")
    schema = metadata.schema()
    values, nulls, lower, upper = {}, {}, {}, {}
    for name, stats in staged.columns.items():
        field = schema.find_field(name)
        values[field.field_id] = staged.rows
        nulls[field.field_id] = stats.nulls
        bounded = (
            types.IntegerType, types.LongType, types.FloatType, types.DoubleType,
            types.StringType, types.BooleanType,
        )  # fmt: skip
        if stats.min is None or not isinstance(field.field_type, bounded):
            continue
        low, high = stats.min, stats.max
        if isinstance(field.field_type, types.StringType):
            low = str(low)[:_STRING_BOUND]
            high = truncate.truncate_upper_bound_text_string(str(high), _STRING_BOUND)
        lower[field.field_id] = conversions.to_bytes(field.field_type, low)
        if high is not None:  # None: no upper bound of 16 characters exists
            upper[field.field_id] = conversions.to_bytes(field.field_type, high)
    return manifest.DataFile.from_args(
        _table_format_version=metadata.format_version,
        content=manifest.DataFileContent.DATA,
        file_path=str(path),
        file_format=manifest.FileFormat.PARQUET,
        partition=typedef.Record(),
        file_size_in_bytes=staged.size,
        record_count=staged.rows,
        value_counts=values,
        null_value_counts=nulls,
        lower_bounds=lower,
        upper_bounds=upper,
        sort_order_id=None,
        spec_id=metadata.default_spec_id,
        equality_ids=None,
        key_metadata=None,
    )


def _local_path(location: str) -> Path:
    if not location.startswith("file://") and "://" in location:
        raise InvalidArgumentError("table location", "a local file:// location", location)
    return Path(location.removeprefix("file://"))


@final
class IcebergTable:
    """An Iceberg table opened for a coordinated exactly-once sink.

    Use :meth:`committer` for the :class:`~barrierflow.actors.sinks.coordinator.Coordinator` and
    :meth:`writer` for each parallel :class:`~barrierflow.actors.sinks.sink_writer.SinkWriter`.

    Args:
        catalog: a pyiceberg catalog (e.g. :func:`open_local_catalog`).
        identifier: ``"namespace.table"``; created (with its namespace) if missing.
        schema: the Arrow schema of the rows; its nullability must match the table's.

    The constructor loads (or creates) the table: catalog I/O that blocks. In a driver's sync
    code that is fine; from async code use ``await IcebergTable.open(...)``, which does it on a
    worker thread so the event loop keeps running.

    Raises:
        InvalidArgumentError: a bad identifier or schema.
        MissingExtraError: pyiceberg is not installed (``pip install 'barrierflow[iceberg]'``).
    """

    def __init__(self, catalog: Any, identifier: str, schema: pa.Schema) -> None:
        if not isinstance(identifier, str) or "." not in identifier:
            raise InvalidArgumentError("identifier", "'namespace.table'", identifier)
        if not isinstance(schema, pa.Schema):
            raise InvalidArgumentError("schema", "a pyarrow.Schema", type(schema).__name__)
        self.catalog = catalog
        self.identifier = identifier
        self.schema = schema
        self._table = self._load_or_create()
        self.location = _local_path(self._table.location())

    @classmethod
    async def open(
        cls,
        catalog: Any,
        identifier: str,
        schema: pa.Schema,
        *,
        limiter: anyio.CapacityLimiter | None = None,
    ) -> IcebergTable:
        """Load (or create) the table on a worker thread (behind ``limiter``, else anyio's
        default one); the same arguments and errors as the constructor."""
        return await anyio.to_thread.run_sync(
            functools.partial(cls, catalog, identifier, schema), limiter=limiter
        )

    def _load_or_create(self) -> Any:
        no_such_table = require("iceberg", "pyiceberg.exceptions").NoSuchTableError
        namespace = self.identifier.rsplit(".", 1)[0]
        self.catalog.create_namespace_if_not_exists(namespace)
        try:
            table = self.catalog.load_table(self.identifier)
        except no_such_table:
            table = self.catalog.create_table(
                self.identifier,
                schema=self.schema,
                properties={
                    "write.metadata.delete-after-commit.enabled": "true",
                    "write.metadata.previous-versions-max": "10",
                },
            )
        arrow = table.schema().as_arrow()
        if not same_fields(arrow, self.schema):
            raise InvalidArgumentError(
                "schema",
                f"the table's schema {arrow}",
                f"{self.schema} (names, types, nullability)",
            )
        return table

    @property
    def data_path(self) -> Path:
        """Where writers stage and the committer places data files."""
        return self.location / "data"

    def writer(self, writer_id: str, **options: Any) -> ParquetStagingWriter:
        """The staging writer of writer ``writer_id`` (``options`` go to
        :class:`~barrierflow.connectors.parquet_writer.ParquetStagingWriter`). Row groups
        default to 32 K rows: a writer gets a share of each epoch, and encoding them as they
        fill overlaps the encoding with the dataflow instead of leaving it all to staging."""
        options.setdefault("row_group_rows", 32_768)
        return ParquetStagingWriter(self.data_path, self.schema, writer_id, **options)

    def committer(self, *, keep_snapshots: int = 10, expire_every: int = 10) -> IcebergCommitter:
        """The coordinator's committer for this table (one per table and process)."""
        return IcebergCommitter(self, keep_snapshots=keep_snapshots, expire_every=expire_every)

    def table(self) -> Any:
        """The table as the catalog has it now (blocking)."""
        return self.catalog.load_table(self.identifier)


@final
class IcebergCommitter(FileCommitter):
    """The two-phase committer of an :class:`IcebergTable` (see the module docstring): the
    file tables' mechanics (:class:`~._file_table.FileCommitter`) around one catalog
    transaction per epoch.

    A concurrent writer's commit (pyiceberg's ``CommitFailedException``) or an unknown commit
    state is :class:`~barrierflow.actors.sinks.table.RetryLater`; a table dropped from the
    catalog is :class:`~barrierflow.actors.sinks.table.Failed`.
    """

    #: A snapshot may add no file: an epoch of keyed state alone still records its positions.
    publishes_empty = True

    def __init__(self, sink: IcebergTable, *, keep_snapshots: int, expire_every: int) -> None:
        for name, value in (("keep_snapshots", keep_snapshots), ("expire_every", expire_every)):
            if type(value) is not int or value < 1:
                raise InvalidArgumentError(name, "an int >= 1", value)
        super().__init__(sink.data_path, sink.identifier, evolves=True)
        self._sink = sink
        self._keep = keep_snapshots
        self._expire_every = expire_every

    def load(self) -> Any:
        """The table as the catalog has it now."""
        return self._sink.table()

    def committed_in(self, state: Any) -> int:
        """The table property's last committed epoch."""
        return int(state.properties.get(COMMITTED_EPOCH_PROPERTY, "0"))

    def held_in(self, state: Any, committed: int) -> dict[str, int]:
        """The table property's positions."""
        return self.parse_positions(
            POSITIONS_PROPERTY, state.properties.get(POSITIONS_PROPERTY, "{}")
        )

    def catalog_errors(
        self,
    ) -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
        """pyiceberg's: a lost race or an unknown commit state may pass; a missing table not."""
        exceptions = require("iceberg", "pyiceberg.exceptions")
        retryable = (exceptions.CommitFailedException, exceptions.CommitStateUnknownException)
        return retryable, (exceptions.NoSuchTableError,)

    def current_files(self) -> set[Path]:
        """The data files of the current snapshot."""
        return self._data_files(self._sink.table().inspect.files())

    def referenced_files(self) -> set[Path]:
        """The data files of every snapshot the table keeps."""
        return self._data_files(self._sink.table().inspect.all_files())

    def _data_files(self, files: pa.Table) -> set[Path]:
        return {_local_path(path).resolve() for path in files["file_path"].to_pylist()}

    def publish(self, state: Any, epoch: EpochCommit) -> None:
        """Add the placed files as one snapshot, with the schema change, the epoch property
        and the positions, in one transaction."""
        positions = epoch.positions
        schema_change = epoch.metadata.get("schema_change")
        with state.transaction() as tx:
            if schema_change is not None:
                evolve(tx, schema_change)
            summary = {_SUMMARY_EPOCH: str(epoch.epoch)}
            properties = {COMMITTED_EPOCH_PROPERTY: str(epoch.epoch)}
            if positions:
                summary[_SUMMARY_POSITIONS] = json.dumps(positions, sort_keys=True)
                properties[POSITIONS_PROPERTY] = json.dumps(
                    merge_positions(epoch.held, positions), sort_keys=True
                )
            files = epoch.placed_files()
            if any(staged is None for _, staged in files):
                # Recorded before writers said what their files hold: pyiceberg reads the
                # footers (the epoch property already rules replays out).
                tx.add_files(
                    [str(path) for path in epoch.placed],
                    snapshot_properties=summary,
                    check_duplicate_files=False,
                )
            elif files:
                if tx.table_metadata.name_mapping() is None:
                    # As add_files does: our files carry no Iceberg field ids, readers map
                    # their columns by name.
                    mapping = tx.table_metadata.schema().name_mapping.model_dump_json()
                    properties[_NAME_MAPPING] = mapping
                with tx.update_snapshot(snapshot_properties=summary).fast_append() as append:
                    for path, staged in files:
                        assert staged is not None  # checked above
                        append.append_data_file(_data_file(tx.table_metadata, path, staged))
            tx.set_properties(properties)

    def after_commit(self, state: Any) -> None:
        """Every ``expire_every`` commits, expire all but the last ``keep_snapshots``."""
        if self.commits % self._expire_every == 0:
            table = self._sink.table()
            snapshots = sorted(table.snapshots(), key=lambda s: s.timestamp_ms)
            old = [s.snapshot_id for s in snapshots[: -self._keep]]
            if old:
                table.maintenance.expire_snapshots().by_ids(old).commit()
