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
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, final

import anyio
import anyio.to_thread

from barrierflow._fs import fsync_path
from barrierflow.actors.sinks.errors import SinkRecoveryError
from barrierflow.actors.sinks.table import (
    AlreadyCommitted,
    CommitMetadata,
    CommitOutcome,
    Committed,
    Manifest,
)
from barrierflow.connectors._file_table import file_commit_outcome
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
    gather_staged,
    kept_epochs,
    staged_dir,
)
from barrierflow.runtime.positions import SinkCommits

__all__ = ["ParquetCommitter"]


@final
class ParquetCommitter:
    """Commits the epochs of a coordinated Parquet sink (see the module docstring).

    Args:
        path: the table directory its writers write into.

    Raises:
        InvalidArgumentError: ``path`` is not a path.
        SinkPathError: ``path`` cannot be a table directory as far as ``stat`` tells (a file,
            under a file, not writable); what only creating it tells is refused when the
            coordinator starts.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._root = check_table_path(path, "ParquetCommitter")
        # Only the manifest helpers of StagedFiles are used (no schema needed for them).
        self._files = StagedFiles(self._root, None, 1, "none", False)
        self._limiter: anyio.CapacityLimiter | None = None

    @property
    def path(self) -> Path:
        """The table directory."""
        return self._root

    async def _run(self, fn: Any, *args: Any) -> Any:
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(1)
        return await anyio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    async def recover(self, pending: Mapping[int, CommitMetadata]) -> None:
        """Create the directories; delete staged epochs no pending commit references."""
        await self._run(self._clean_staging, kept_epochs(pending.values()))

    def _clean_staging(self, keep: set[str]) -> None:
        make_table_directory(self._root, str(self._root))
        self._files.read_manifest()  # refuse a foreign or corrupt manifest early
        clean_staging(self._root, keep)

    async def prepare(self, epoch: int, manifests: Sequence[Manifest]) -> CommitMetadata | None:
        """The epoch's files, from every writer's manifest (``None`` if nobody wrote rows).

        Raises:
            SchemaEvolutionError: a schema change (Parquet files cannot evolve).
            StagedEpochMismatchError: writers that staged different sink epochs.
        """
        await anyio.lowlevel.checkpoint()
        return gather_staged(str(self._root), epoch, manifests, evolves=False)

    async def commit(self, epoch: int, metadata: CommitMetadata) -> CommitOutcome:
        """Rename the staged epoch into the table and record ``epoch``
        (:class:`AlreadyCommitted` at or below the manifest's epoch, or when the table holds
        the epoch's batches). An epoch neither staged nor committed (its files are lost) is
        :class:`Failed`; file errors as :func:`~._file_table.file_commit_outcome` says."""
        try:
            outcome: CommitOutcome = await self._run(self._commit, epoch, dict(metadata))
        except Exception as exc:
            return file_commit_outcome(exc, self._root)
        return outcome

    def _commit(self, epoch: int, metadata: dict[str, Any]) -> CommitOutcome:
        files = self._files
        with files.lock:
            manifest = files.read_manifest()
            if epoch <= manifest["committed_epoch"]:
                return AlreadyCommitted()  # a replayed commit
            staging_epoch = int(metadata["staging_epoch"])
            staged = staged_dir(self._root, staging_epoch)
            final = self._root / epoch_dir_name(staging_epoch)
            # In place already: a commit cut short after its rename, only its record is due.
            replayed = final.exists()
            if not replayed:
                if not staged.exists():
                    raise SinkRecoveryError(
                        str(self._root),
                        f"epoch {epoch} is pending with {len(metadata['paths'])} file(s), but "
                        "they are neither staged nor committed",
                    )
                if files.skip_if_held(manifest, epoch, metadata):
                    shutil.rmtree(staged, ignore_errors=True)  # in the table already
                    return AlreadyCommitted()
                # The epoch's record travels with its files: what it holds, and from where.
                write_json_atomically(
                    staged / PRECOMMITTED,
                    {"files": metadata["paths"], "rows": int(metadata["rows"])}
                    | {k: metadata[k] for k in ("positions", "positions_from") if k in metadata},
                )
                os.rename(staged, final)  # the commit point: every writer's files at once
                fsync_path(self._root)
            files.record(
                manifest,
                epoch,
                len(metadata["paths"]),
                int(metadata["rows"]),
                metadata.get("positions"),
            )
        return AlreadyCommitted() if replayed else Committed()

    async def sink_commits(self) -> SinkCommits | None:
        """What the table holds (``None``: nothing committed yet)."""
        result: SinkCommits | None = await self._run(self._files.commits)
        return result

    async def abort(self, epoch: int, metadata: CommitMetadata | None) -> None:
        """Delete what the epoch staged."""
        if metadata is None or "staging_epoch" not in metadata:
            await anyio.lowlevel.checkpoint()
            return
        staged = staged_dir(self._root, metadata["staging_epoch"])
        await self._run(shutil.rmtree, staged, True)
