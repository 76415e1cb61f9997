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
import shutil
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, final
from urllib.parse import unquote

import anyio
import anyio.lowlevel
import anyio.to_thread
import pyarrow as pa
import pyarrow.parquet as pq

from barrierflow._extras import require
from barrierflow._fs import fsync_path
from barrierflow.actors.sinks.errors import SinkRecoveryError
from barrierflow.actors.sinks.positions import epoch_already_held
from barrierflow.actors.sinks.table import (
    AlreadyCommitted,
    CommitMetadata,
    CommitOutcome,
    Committed,
    Manifest,
    SchemaChange,
)
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.connectors._file_table import file_commit_outcome
from barrierflow.connectors._iceberg_schema import same_fields
from barrierflow.connectors._parquet_files import check_table_path
from barrierflow.connectors._staging import (
    clean_staging,
    delete_unreferenced_moves,
    gather_staged,
    kept_epochs,
    staged_dir,
    unstaged_path,
)
from barrierflow.connectors.parquet_writer import ParquetStagingWriter
from barrierflow.runtime.positions import (
    SinkCommits,
    check_positions,
    merge_positions,
)

__all__ = [
    "APP_ID_KEY",
    "EPOCH_KEY",
    "POSITIONS_KEY",
    "RECENT_COMMITS",
    "DeltaCommitter",
    "DeltaLakeTable",
]

#: How many of the latest commit durations a :class:`DeltaCommitter` keeps.
RECENT_COMMITS = 1024
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
class DeltaCommitter:
    """The two-phase committer of a :class:`DeltaLakeTable` (see the module docstring).

    Lifecycle: that of a :class:`~barrierflow.actors.sinks.table.Committer`: ``abort`` of
    aborted epochs, ``recover`` once, then ``prepare`` and ``commit`` per epoch in epoch
    order; ``commit`` may be repeated after a crash and is then a no-op.
    """

    def __init__(self, sink: DeltaLakeTable, *, checkpoint_every: int | None = None) -> None:
        if checkpoint_every is not None and (
            type(checkpoint_every) is not int or checkpoint_every < 1
        ):
            raise InvalidArgumentError("checkpoint_every", "None or an int >= 1", checkpoint_every)
        self._sink = sink
        self._checkpoint_every = checkpoint_every
        self._limiter: anyio.CapacityLimiter | None = None
        self._table: Any = None  # the DeltaTable, loaded on the worker thread at first use
        # (committed epoch, positions held after it): read from the log once, then kept up to
        # date by this committer's own commits.
        self._held: tuple[int, dict[str, int]] | None = None
        #: Seconds the latest Delta commits took (the commits, not the file moves), oldest
        #: first: at most :data:`RECENT_COMMITS` of them. ``commits`` counts every one.
        self.commit_seconds: deque[float] = deque(maxlen=RECENT_COMMITS)
        #: Delta commits of epochs made by this committer.
        self.commits = 0

    async def _run(self, fn: Any, *args: Any) -> Any:
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(1)
        return await anyio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    def _latest(self) -> Any:
        """The table at its latest version (blocking, on the committer's thread)."""
        if self._table is None:
            self._table = self._sink.table()
        else:
            self._table.update_incremental()
        return self._table

    def _committed(self, table: Any) -> int:
        version = table.transaction_version(self._sink.app_id)
        return 0 if version is None else int(version)

    def committed_epoch(self) -> int:
        """The app id's transaction version: the last committed epoch (blocking; 0 for a
        table this app id never committed to)."""
        return self._committed(self._sink.table())

    async def recover(self, pending: Mapping[int, CommitMetadata]) -> None:
        """Delete staged epochs that no pending commit references, and the files a commit
        moved into the table that no pending commit and no commit in the log references (a
        crash between the moves and the Delta commit, its meta store lost since: see
        :func:`~._staging.delete_unreferenced_moves`)."""
        await self._run(self._recover, kept_epochs(pending.values()))

    def _recover(self, keep: set[str]) -> None:
        root = self._sink.path
        clean_staging(root, keep)
        delete_unreferenced_moves(
            root,
            keep,
            lambda: {Path(uri).resolve() for uri in self._latest().file_uris()},
            self._logged_files,
        )

    def _logged_files(self) -> set[Path]:
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

    async def prepare(self, epoch: int, manifests: Sequence[Manifest]) -> CommitMetadata | None:
        """Every writer's staged files of the epoch and its schema change (``None`` if there
        is nothing to commit).

        Raises:
            StagedEpochMismatchError: the writers staged different epochs.
            InvalidArgumentError: the schema change is not an ``add_columns`` change.
        """
        await anyio.lowlevel.checkpoint()
        return gather_staged(str(self._sink.path), epoch, manifests, evolves=True)

    async def commit(self, epoch: int, metadata: CommitMetadata) -> CommitOutcome:
        """Move the epoch's files out of staging and add them in one Delta commit carrying
        the app transaction ``(app_id, epoch)``, the positions and the schema change
        (:class:`AlreadyCommitted` if the table has the transaction already, or its positions
        hold the epoch's batches).

        A concurrent commit that won the race (deltalake's ``CommitFailedError``) is
        :class:`RetryLater`; a missing table, a schema or protocol conflict, a file of the
        epoch neither staged nor moved, damaged positions or an epoch whose source batches
        are partly held already are :class:`Failed`; file errors as
        :func:`~._file_table.file_commit_outcome` says.
        """
        exceptions = require("delta", "deltalake.exceptions")
        try:
            outcome: CommitOutcome = await self._run(self._commit, epoch, dict(metadata))
        except Exception as exc:
            return file_commit_outcome(
                exc,
                self._sink.path,
                retryable=(exceptions.CommitFailedError,),
                permanent=(
                    exceptions.TableNotFoundError,
                    exceptions.SchemaMismatchError,
                    exceptions.DeltaProtocolError,
                ),
            )
        return outcome

    def _commit(self, epoch: int, metadata: dict[str, Any]) -> CommitOutcome:
        delta = _deltalake()
        table = self._latest()
        committed = self._committed(table)
        if epoch <= committed:
            self._drop_staging(metadata)  # a replayed commit
            return AlreadyCommitted()
        paths = metadata.get("paths", [])
        schema_change = metadata.get("schema_change")
        if not paths and schema_change is None:
            return Committed()  # nothing to publish
        held = self._held_positions(table, committed)
        positions = metadata.get("positions", {})
        if epoch_already_held(
            str(self._sink.path), epoch, held, metadata.get("positions_from", {}), positions
        ):
            # The runtime's store went back in time and the upstream replayed rows this table
            # holds: drop them instead of committing them twice.
            self._abort_files(metadata)
            return AlreadyCommitted()
        finals = [self._move(relative, epoch) for relative in paths]
        # The new directories' entries too: the commit names files under them.
        directories = {final.parent for final in finals}
        for directory in directories | {d.parent for d in directories}:
            fsync_path(directory)
        actions = [self._add_action(delta, final) for final in finals]
        merged = merge_positions(held, positions)
        info = {APP_ID_KEY: self._sink.app_id, EPOCH_KEY: str(epoch)}
        if positions:
            info[_EPOCH_POSITIONS_KEY] = json.dumps(positions, sort_keys=True)
        if merged:
            info[POSITIONS_KEY] = json.dumps(merged, sort_keys=True)
        properties = delta.CommitProperties(
            custom_metadata=info,
            app_transactions=[delta.Transaction(app_id=self._sink.app_id, version=epoch)],
        )
        started = time.perf_counter()
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
        self.commit_seconds.append(time.perf_counter() - started)
        self.commits += 1
        self._held = (epoch, merged)
        if self._checkpoint_every is not None and self.commits % self._checkpoint_every == 0:
            table.update_incremental()
            table.create_checkpoint()
        self._drop_staging(metadata)
        return Committed()

    def _move(self, relative: str, epoch: int) -> Path:
        """Move one staged file into the table, unless a crashed commit moved it already."""
        root = self._sink.path
        staged = root / relative
        final = unstaged_path(root, relative)
        if staged.exists():
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staged, final)
        elif not final.exists():
            raise SinkRecoveryError(
                str(root), f"file {relative} of pending epoch {epoch} is neither staged nor moved"
            )
        return final

    def _add_action(self, delta: Any, final: Path) -> Any:
        """The Delta ``add`` action of a moved file (its row count read from its footer)."""
        root = self._sink.path
        stat = final.stat()
        rows = pq.read_metadata(final).num_rows
        return delta.transaction.AddAction(
            path=final.relative_to(root).as_posix(),
            size=stat.st_size,
            partition_values={},
            modification_time=int(stat.st_mtime * 1000),
            data_change=True,
            stats=json.dumps({"numRecords": rows}),
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

    def _held_positions(self, table: Any, committed: int) -> dict[str, int]:
        """The positions the table holds after epoch ``committed`` (from the log's history,
        unless this committer made that commit)."""
        if committed == 0:
            return {}
        if self._held is not None and self._held[0] == committed:
            return dict(self._held[1])
        for limit in (_HISTORY_FIRST, None):
            for info in table.history(limit):
                if info.get(APP_ID_KEY) == self._sink.app_id and info.get(EPOCH_KEY) == str(
                    committed
                ):
                    held = self._parse_positions(info.get(POSITIONS_KEY, "{}"))
                    self._held = (committed, held)
                    return dict(held)
        raise SinkRecoveryError(
            str(self._sink.path),
            f"the Delta commit of epoch {committed} (app id {self._sink.app_id!r}) is no longer "
            "in the log, so the source positions it recorded are unknown",
        )

    def _parse_positions(self, text: Any) -> dict[str, int]:
        try:
            return check_positions(POSITIONS_KEY, json.loads(text))
        except (TypeError, ValueError, InvalidArgumentError) as exc:
            raise SinkRecoveryError(
                str(self._sink.path), f"commit metadata {POSITIONS_KEY} is damaged: {exc}"
            ) from exc

    async def sink_commits(self) -> SinkCommits | None:
        """What the table holds: the app id's committed epoch and the recorded positions
        (``None``: no commit by this app id yet)."""
        result: SinkCommits | None = await self._run(self._read_commits)
        return result

    def _read_commits(self) -> SinkCommits | None:
        table = self._latest()
        epoch = self._committed(table)
        if epoch == 0:
            return None
        return SinkCommits(str(self._sink.path), epoch, self._held_positions(table, epoch))

    async def abort(self, epoch: int, metadata: CommitMetadata | None) -> None:
        """Delete the epoch's staged (or already moved, never committed) files."""
        if metadata is None:
            await anyio.lowlevel.checkpoint()
            return
        await self._run(self._abort, epoch, dict(metadata))

    def _abort(self, epoch: int, metadata: dict[str, Any]) -> None:
        if epoch <= self._committed(self._latest()):
            return  # it was committed after all: never delete committed files
        self._abort_files(metadata)

    def _abort_files(self, metadata: Mapping[str, Any]) -> None:
        root = self._sink.path
        for relative in metadata.get("paths", []):
            for path in (root / relative, unstaged_path(root, relative)):
                path.unlink(missing_ok=True)
        self._drop_staging(metadata)

    def _drop_staging(self, metadata: Mapping[str, Any] | None) -> None:
        if metadata is not None and "staging_epoch" in metadata:
            shutil.rmtree(
                staged_dir(self._sink.path, metadata["staging_epoch"]), ignore_errors=True
            )
