"""A coordinated exactly-once Delta Lake table: one Delta commit per epoch, with the
``deltalake`` package (delta-rs; no Spark, no server).

The parts, shaped like :mod:`barrierflow.connectors.iceberg_table`:

* **Writers** are Parquet staging writers (:meth:`DeltaLakeTable.writer`): each stages its rows
  of sink epoch *S* under ``<table>/.staging/<S>/w<id>/``, fsyncs them when it stages the
  epoch and sends its manifest to the coordinator. Delta readers see only the files the log
  names, and ``vacuum`` skips names starting with ``.``, so staged files are invisible and
  safe.
* **The committer** (:class:`DeltaCommitter`, the coordinator's two-phase committer):
  ``prepare`` gathers every writer's files; ``commit`` moves them out of staging to
  ``<table>/<S>/w<id>/`` and adds them in **one** Delta commit (``create_write_transaction``
  with one ``add`` action per file) carrying the **application transaction**
  ``(app_id, version=epoch)``. That transaction is Delta's own idempotent-write marker and the
  source of truth for "which epoch is committed": a commit whose epoch is not above the
  table's recorded version for the app id is a replay after a crash and is skipped. It survives
  checkpoints and log cleanup (the snapshot keeps the latest ``txn`` per app id). ``abort``
  deletes the epoch's files; ``recover`` deletes staged files no pending commit references,
  and files moved into the table that neither a pending commit nor the log names (a crash
  between the moves and the Delta commit, with the meta store lost since).
* **Source positions** go into the same commit's ``commitInfo`` (custom metadata):
  ``barrierflow.positions`` (this epoch's) and ``barrierflow.source-positions`` (every position
  the table holds, merged), with ``barrierflow.app-id`` and ``barrierflow.epoch``. They are
  written atomically with the rows and the transaction. A table configuration property would
  need a second commit (delta-rs cannot change the configuration in a write transaction), so
  it could disagree with the rows after a crash. To read them, the committer finds the commit
  whose epoch is the app id's transaction version in the log's history (the newest commits
  first). Delta's log cleanup deletes commit files older than ``delta.logRetentionDuration``
  (30 days) that a checkpoint covers. If the latest commit of this app id has been deleted
  that way, the positions cannot be read, and :class:`SinkRecoveryError` says so rather than
  returning nothing.
* **Schema change**: a commit carrying ``{"add_columns": [{"name": ..., "type": "int64" |
  "double" | "string" | ...}]}`` adds nullable columns with ``alter.add_columns``. An epoch
  with no files changes the schema in the epoch's one commit, which also carries the
  transaction and positions: that commit is atomic. An epoch with files takes two commits,
  because delta-rs's ``create_write_transaction`` keeps the table's schema and cannot evolve
  it. The columns are added first, skipping any already present, and then the files with the
  transaction are added. A crash between the two leaves a table with the new nullable columns
  and no new rows. The replay then skips the columns and adds the files, so the change is
  **not atomic**, but it is idempotent and readers never see a wrong row.

deltalake calls are blocking: they run on a worker thread, one at a time. deltalake is imported
when a sink is first built (:func:`barrierflow._extras.require`), not when
:mod:`barrierflow.connectors` is imported. If it is missing, :class:`MissingExtraError` names
the ``delta`` extra.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any, final
from urllib.parse import unquote

import anyio
import anyio.lowlevel
import anyio.to_thread
import pyarrow as pa
import pyarrow.parquet as pq

from barrierflow._extras import require
from barrierflow.actors.sinks.errors import SinkRecoveryError
from barrierflow.actors.sinks.table import (
    SchemaChange,
    StagedFile,
)
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.connectors._file_table import EpochCommit, FileCommitter
from barrierflow.connectors._iceberg_schema import same_fields
from barrierflow.connectors._parquet_files import check_table_path
from barrierflow.connectors.parquet_writer import ParquetStagingWriter
from barrierflow.runtime.positions import (
    merge_positions,
)

__all__ = [
    "APP_ID_KEY",
    "EPOCH_KEY",
    "POSITIONS_KEY",
    "DeltaCommitter",
    "DeltaLakeTable",
]

#: ``commitInfo`` keys of a barrierflow commit: its app id, its epoch, this epoch's positions,
#: and every position the table holds after it (JSON).
APP_ID_KEY = "barrierflow.app-id"
EPOCH_KEY = "barrierflow.epoch"
_EPOCH_POSITIONS_KEY = "barrierflow.positions"
POSITIONS_KEY = "barrierflow.source-positions"

#: The Delta primitive type of each column type a schema change may add.
_DELTA_TYPES = {
    "int32": "integer",
    "int64": "long",
    "float": "float",
    "double": "double",
    "string": "string",
    "bool": "boolean",
}
_HISTORY_FIRST = 16  # commits read before the whole history when looking for the positions


def _deltalake() -> Any:
    return require("delta", "deltalake")


@final
class DeltaLakeTable:
    """A Delta table opened for an exactly-once sink.

    Use :meth:`committer` for the :class:`~barrierflow.actors.sinks.coordinator.Coordinator`
    and :meth:`writer` for each writer (:func:`~barrierflow.actors.add_sink` does both).

    Args:
        path: the table directory (local); the table is created if it has no Delta log.
        schema: the Arrow schema of the rows; names, types and nullability must match an
            existing table's.
        app_id: the application id of the commits' Delta transactions: one per pipeline
            writing the table (the sink's name is a good choice). Two pipelines with one app
            id would take each other's epochs for replays.

    The constructor creates or loads the table, which is blocking file I/O. From async code
    use ``await DeltaLakeTable.open(...)``, which does it on a worker thread.

    Raises:
        InvalidArgumentError: ``schema`` is not a pyarrow.Schema, differs from the table's, or
            has a type Delta stores as another (unsigned ints, large lists); ``app_id`` is not
            a non-empty str.
        SinkPathError: ``path`` cannot be a table directory (a file, under a file, not
            writable).
        MissingExtraError: deltalake is not installed (the ``delta`` extra).
    """

    def __init__(
        self, path: str | os.PathLike[str], schema: pa.Schema, *, app_id: str = "barrierflow"
    ) -> None:
        if not isinstance(schema, pa.Schema):
            raise InvalidArgumentError("schema", "a pyarrow.Schema", type(schema).__name__)
        if not isinstance(app_id, str) or not app_id:
            raise InvalidArgumentError("app_id", "a non-empty application id", app_id)
        self.path = check_table_path(path, "DeltaLakeTable").resolve()
        self.schema = schema
        self.app_id = app_id
        existed = (self.path / "_delta_log").is_dir()
        table = _deltalake().DeltaTable.create(str(self.path), schema, mode="ignore")
        found = pa.schema(table.schema().to_arrow())
        if not same_fields(found, schema):
            # A new table differs when Delta has no such type (unsigned, large lists, ...).
            expected = "the table's schema" if existed else "a schema Delta Lake stores as is:"
            raise InvalidArgumentError(
                "schema", f"{expected} {found}", f"{schema} (names, types, nullability)"
            )

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        schema: pa.Schema,
        *,
        app_id: str = "barrierflow",
        limiter: anyio.CapacityLimiter | None = None,
    ) -> DeltaLakeTable:
        """Create or load the table on a worker thread (behind ``limiter``, else anyio's
        default one). Takes the same arguments and raises the same errors as the
        constructor."""
        return await anyio.to_thread.run_sync(
            functools.partial(cls, path, schema, app_id=app_id), limiter=limiter
        )

    def writer(self, writer_id: str, **options: Any) -> ParquetStagingWriter:
        """The staging writer of writer ``writer_id``: a Parquet writer staging under the
        table directory. ``options`` go to
        :class:`~barrierflow.connectors.parquet_writer.ParquetStagingWriter`. Row groups default to
        32 K rows, as for Iceberg, so encoding overlaps the dataflow."""
        options.setdefault("row_group_rows", 32_768)
        return ParquetStagingWriter(self.path, self.schema, writer_id, **options)

    def committer(self, *, checkpoint_every: int | None = None) -> DeltaCommitter:
        """The coordinator's committer for this table (one per table and process).

        Args:
            checkpoint_every: write a Delta checkpoint every this many commits of this
                committer (``None``: delta-rs's post-commit hook follows the table's
                ``delta.checkpointInterval``, 100 by default).
        """
        return DeltaCommitter(self, checkpoint_every=checkpoint_every)

    def table(self) -> Any:
        """The ``deltalake.DeltaTable`` at its latest version (blocking)."""
        return _deltalake().DeltaTable(str(self.path))

    def read(self) -> pa.Table:
        """Every committed row, as deltalake's reader returns them (blocking)."""
        return self.table().to_pyarrow_table()

    def __repr__(self) -> str:
        return f"DeltaLakeTable({str(self.path)!r}, app_id={self.app_id!r})"


@final
class DeltaCommitter(FileCommitter):
    """The two-phase committer of a :class:`DeltaLakeTable` (see the module docstring): the
    file tables' mechanics (:class:`~._file_table.FileCommitter`) around one Delta commit per
    epoch carrying the app transaction ``(app_id, epoch)``, the positions and the schema
    change.

    Lifecycle: that of a :class:`~barrierflow.actors.sinks.table.Committer`: ``abort`` of
    aborted epochs, ``recover`` once, then ``prepare`` and ``commit`` per epoch in epoch
    order; ``commit`` may be repeated after a crash and is then
    :class:`~barrierflow.actors.sinks.table.AlreadyCommitted`. A concurrent commit that won
    the race (deltalake's ``CommitFailedError``) is
    :class:`~barrierflow.actors.sinks.table.RetryLater`; a missing table, a schema or
    protocol conflict is :class:`~barrierflow.actors.sinks.table.Failed`.
    """

    def __init__(self, sink: DeltaLakeTable, *, checkpoint_every: int | None = None) -> None:
        if checkpoint_every is not None and (
            type(checkpoint_every) is not int or checkpoint_every < 1
        ):
            raise InvalidArgumentError("checkpoint_every", "None or an int >= 1", checkpoint_every)
        super().__init__(sink.path, str(sink.path), evolves=True)
        self._sink = sink
        self._checkpoint_every = checkpoint_every
        self._table: Any = None  # the DeltaTable, loaded on the worker thread at first use
        # (committed epoch, positions held after it): read from the log once, then kept up to
        # date by this committer's own commits.
        self._held: tuple[int, dict[str, int]] | None = None

    def load(self) -> Any:
        """The table at its latest version (the one ``DeltaTable``, brought up to date)."""
        if self._table is None:
            self._table = self._sink.table()
        else:
            self._table.update_incremental()
        return self._table

    def committed_in(self, state: Any) -> int:
        """The app id's transaction version: the last committed epoch (0: none)."""
        version = state.transaction_version(self._sink.app_id)
        return 0 if version is None else int(version)

    def held_in(self, state: Any, committed: int) -> dict[str, int]:
        """The positions the table holds after epoch ``committed``: from the log's history,
        unless this committer made that commit."""
        if committed == 0:
            return {}
        if self._held is not None and self._held[0] == committed:
            return dict(self._held[1])
        for limit in (_HISTORY_FIRST, None):
            for info in state.history(limit):
                if info.get(APP_ID_KEY) == self._sink.app_id and info.get(EPOCH_KEY) == str(
                    committed
                ):
                    held = self.parse_positions(POSITIONS_KEY, info.get(POSITIONS_KEY, "{}"))
                    self._held = (committed, held)
                    return dict(held)
        raise SinkRecoveryError(
            str(self._sink.path),
            f"the Delta commit of epoch {committed} (app id {self._sink.app_id!r}) is no longer "
            "in the log, so the source positions it recorded are unknown",
        )

    def catalog_errors(
        self,
    ) -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
        """deltalake's: a lost race may pass; a missing table, a schema or protocol conflict
        not."""
        exceptions = require("delta", "deltalake.exceptions")
        permanent = (
            exceptions.TableNotFoundError,
            exceptions.SchemaMismatchError,
            exceptions.DeltaProtocolError,
        )
        return (exceptions.CommitFailedError,), permanent

    def current_files(self) -> set[Path]:
        """The data files of the table's latest version."""
        return {Path(uri).resolve() for uri in self.load().file_uris()}

    def referenced_files(self) -> set[Path]:
        """Every file an ``add`` or ``remove`` action of a commit still in the log names: a
        file a later commit removed stays for time travel until ``vacuum`` deletes it. (A
        commit file the log's cleanup deleted is older than ``delta.logRetentionDuration``,
        past the removed files' retention: ``vacuum`` may delete those anyway.)"""
        root = self._sink.path
        named: set[Path] = set()
        for commit in sorted((root / "_delta_log").glob("*.json")):
            for line in commit.read_text().splitlines():
                action = json.loads(line) if line.strip() else {}
                for kind in ("add", "remove"):
                    if isinstance(action.get(kind), dict) and "path" in action[kind]:
                        # Relative to the table, or an absolute URI (a shallow clone's).
                        path = unquote(str(action[kind]["path"])).removeprefix("file://")
                        named.add((root / path).resolve())
        return named

    def publish(self, state: Any, epoch: EpochCommit) -> None:
        """One Delta commit of the placed files with the app transaction, the positions and
        the schema change (columns first when the epoch also adds files)."""
        delta = _deltalake()
        table = state
        positions = epoch.positions
        schema_change = epoch.metadata.get("schema_change")
        actions = [self._add_action(delta, final, staged) for final, staged in epoch.placed_files()]
        merged = merge_positions(epoch.held, positions)
        info = {APP_ID_KEY: self._sink.app_id, EPOCH_KEY: str(epoch.epoch)}
        if positions:
            info[_EPOCH_POSITIONS_KEY] = json.dumps(positions, sort_keys=True)
        if merged:
            info[POSITIONS_KEY] = json.dumps(merged, sort_keys=True)
        properties = delta.CommitProperties(
            custom_metadata=info,
            app_transactions=[delta.Transaction(app_id=self._sink.app_id, version=epoch.epoch)],
        )
        if schema_change is not None:
            fields = self._new_fields(delta, table, schema_change)
            if not actions:  # the schema change is the epoch's one, atomic commit
                table.alter.add_columns(fields, commit_properties=properties)
            elif fields:  # columns first (idempotent), then the files with the transaction
                table.alter.add_columns(fields)
                table.update_incremental()
        if actions:
            table.create_write_transaction(
                actions, "append", table.schema(), commit_properties=properties
            )
        self._held = (epoch.epoch, merged)

    def after_commit(self, state: Any) -> None:
        """A Delta checkpoint every ``checkpoint_every`` commits, if set."""
        if self._checkpoint_every is not None and self.commits % self._checkpoint_every == 0:
            state.update_incremental()
            state.create_checkpoint()

    def _add_action(self, delta: Any, final: Path, staged: StagedFile | None) -> Any:
        """The Delta ``add`` action of a moved file, with the statistics deltalake's own
        writer records (``numRecords``, ``minValues``, ``maxValues``, ``nullCount``) from what
        its writer knew: no footer is read (only for a commit recorded before writers said,
        the row count is read from it)."""
        root = self._sink.path
        stat = final.stat()
        if staged is None:
            stats: dict[str, Any] = {"numRecords": pq.read_metadata(final).num_rows}
        else:
            bounded = {n: c for n, c in staged.columns.items() if c.min is not None}
            stats = {
                "numRecords": staged.rows,
                "minValues": {name: c.min for name, c in bounded.items()},
                "maxValues": {name: c.max for name, c in bounded.items()},
                "nullCount": {name: c.nulls for name, c in staged.columns.items()},
            }
        return delta.transaction.AddAction(
            path=final.relative_to(root).as_posix(),
            size=stat.st_size,
            partition_values={},
            modification_time=int(stat.st_mtime * 1000),
            data_change=True,
            stats=json.dumps(stats),
        )

    def _new_fields(self, delta: Any, table: Any, change: SchemaChange) -> list[Any]:
        """The change's columns the table does not have yet (a replay finds them added)."""
        present = set(pa.schema(table.schema().to_arrow()).names)
        return [
            delta.schema.Field(
                column["name"], delta.schema.PrimitiveType(_DELTA_TYPES[column["type"]]), True
            )
            for column in change["add_columns"]
            if column["name"] not in present
        ]
