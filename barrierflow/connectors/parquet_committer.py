"""The committer of a Parquet table: every writer's files of an epoch appear in one rename.

Layout of the table directory ``path``::

    path/
      epoch=00000000000123456789/w0/part-00000.parquet   committed rows of one epoch
      epoch=00000000000123456789/_PRECOMMITTED.json       what it holds, and the positions
      .staging/00000000000123456790/w1/part-00000.parquet rows of an epoch not committed yet
      _manifest.json                                      the last committed epoch, totals

Readers never look at staged files (``pyarrow.dataset`` skips names starting with ``.`` or
``_``). The directory names carry the epoch, so a hive partitioning also yields an ``epoch``
column; epochs exceed int32, so declare its type:
``ds.dataset(path, partitioning=ds.partitioning(pa.schema([("epoch", pa.int64())]),
flavor="hive"))``.

Each writer is a :class:`~barrierflow.connectors.parquet_writer.ParquetStagingWriter`: it
stages its rows of sink epoch *S* under ``.staging/<S>/w<id>/``, fsyncs them when it stages
the epoch and sends its manifest to the coordinator, whose committer is a
:class:`ParquetCommitter` on the same directory:

* ``prepare(epoch, manifests)`` checks that every writer staged the same sink epoch and
  returns the epoch's file list (persisted as *pending* by the coordinator);
* ``commit(epoch, metadata)`` writes the epoch's record (its files, rows and source positions)
  into ``.staging/<S>/``, renames it — every writer's files at once — to ``epoch=<S>/`` (the
  atomic commit point readers see), then records the coordinator's epoch in the manifest (the
  committed marker: written to a temporary file, fsynced, renamed over the old one); a commit
  at or below the manifest's epoch, or whose directory is already in place, only completes
  the record (a replay after a crash is a no-op), and an epoch whose source batches the table
  holds already is dropped;
* ``abort(epoch, metadata)`` deletes the epoch's staged files;
* ``recover(pending)`` deletes every staged epoch no pending commit references (a writer staged
  it, but the epoch never reached the meta store, so the upstream replays its rows).

Schema changes are not supported by Parquet files: a commit request carrying one is refused.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, final

from barrierflow._fs import fsync_path
from barrierflow.actors.sinks.errors import SinkRecoveryError
from barrierflow.actors.sinks.table import SinkCommits
from barrierflow.connectors._file_table import EpochCommit, FileCommitter
from barrierflow.connectors._parquet_files import (
    StagedFiles,
    check_table_path,
    make_table_directory,
    write_json_atomically,
)
from barrierflow.connectors._staging import (
    PRECOMMITTED,
    clean_staging,
    epoch_dir_name,
    staged_dir,
)

__all__ = ["ParquetCommitter"]


@final
class ParquetCommitter(FileCommitter):
    """Commits the epochs of a coordinated Parquet sink (see the module docstring): the file
    tables' mechanics (:class:`~._file_table.FileCommitter`) around one directory rename per
    epoch.

    Args:
        path: the table directory its writers write into.

    Raises:
        InvalidArgumentError: ``path`` is not a path.
        SinkPathError: ``path`` cannot be a table directory as far as ``stat`` tells (a file,
            under a file, not writable); what only creating it tells is refused when the
            coordinator starts.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        root = check_table_path(path, "ParquetCommitter")
        super().__init__(root, str(root), evolves=False)
        # Only the manifest helpers of StagedFiles are used (no schema needed for them).
        self._files = StagedFiles(root, None, 1, "none", False)

    @property
    def path(self) -> Path:
        """The table directory."""
        return self._root

    def load(self) -> dict[str, Any]:
        """The table's manifest."""
        return self._files.read_manifest()

    def committed_in(self, state: Any) -> int:
        """The manifest's committed epoch."""
        return int(state["committed_epoch"])

    def held_in(self, state: Any, committed: int) -> dict[str, int]:
        """The manifest's positions."""
        return self._files.held_positions(state)

    def recover_table(self, keep: set[str]) -> None:
        """Create the directories (refusing a foreign or corrupt manifest early) and delete
        staged epochs no pending commit references."""
        make_table_directory(self._root, str(self._root))
        self._files.read_manifest()
        clean_staging(self._root, keep)

    def place(self, epoch: int, metadata: Mapping[str, Any]) -> list[Path]:
        """Write the epoch's record (what it holds, and from where) into its staging directory
        and rename it — every writer's files at once — to ``epoch=<S>/``: the commit point
        readers see. Already renamed (a commit cut short before its manifest): nothing to do.

        Raises:
            SinkRecoveryError: the epoch is neither staged nor committed (its files are lost).
        """
        staging_epoch = int(metadata["staging_epoch"])
        staged = staged_dir(self._root, staging_epoch)
        final = self._root / epoch_dir_name(staging_epoch)
        if final.exists():
            return []
        if not staged.exists():
            raise SinkRecoveryError(
                str(self._root),
                f"epoch {epoch} is pending with {len(metadata['paths'])} file(s), but "
                "they are neither staged nor committed",
            )
        write_json_atomically(
            staged / PRECOMMITTED,
            {"files": metadata["paths"], "rows": int(metadata["rows"])}
            | {k: metadata[k] for k in ("positions", "positions_from") if k in metadata},
        )
        os.rename(staged, final)
        fsync_path(self._root)
        return [final]

    def publish(self, state: Any, epoch: EpochCommit) -> None:
        """Record the epoch in the manifest (the committed marker: written to a temporary
        file, fsynced, renamed over the old one), with its files, rows and positions."""
        metadata = epoch.metadata
        self._files.record(
            state, epoch.epoch, len(metadata["paths"]), int(metadata["rows"]), epoch.positions
        )

    async def sink_commits(self) -> SinkCommits | None:
        """What the table holds: the manifest, plus epochs renamed after it (``None``:
        nothing committed yet)."""
        result: SinkCommits | None = await self.run(self._files.commits)
        return result
