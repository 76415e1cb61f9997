"""One base for the committers of the file tables (Parquet, Iceberg, Delta).

Every file table commits an epoch the same way around its own commit point: recovery deletes
what no pending commit references, ``prepare`` gathers the writers' manifests
(:func:`~._staging.gather_staged`), ``commit`` checks the table's committed marker and the
positions it holds (a replay is :class:`~barrierflow.actors.sinks.table.AlreadyCommitted`),
puts the epoch's staged files in place, fsyncs, makes the format's one atomic commit and
times it, then drops the staging directory; ``abort`` deletes what an epoch staged unless the
table committed it after all. :class:`FileCommitter` does all of that, on a worker thread
behind a limiter of one (the calls are blocking), and classifies a failure into the
protocol's outcomes (:func:`file_commit_outcome`).

A format writes only what is its own (:class:`FileCommitter`'s abstract methods): how its
committed marker and held positions are read, and its commit — a catalog transaction
(Iceberg), a Delta log entry (Delta), a directory rename (Parquet) — plus which of its
catalog's errors may pass and which will not. Moving files out of staging one by one
(:meth:`FileCommitter.move_staged`) and deleting moved files no commit references at
recovery are for the formats whose commit names files (Iceberg, Delta); a format that
renames a whole epoch (Parquet) overrides :meth:`FileCommitter.place`.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, final

import anyio
import anyio.lowlevel
import anyio.to_thread

from barrierflow._fs import fsync_path
from barrierflow.actors.sinks.errors import PositionOverlapError, SinkRecoveryError
from barrierflow.actors.sinks.positions import epoch_already_held
from barrierflow.actors.sinks.table import (
    AlreadyCommitted,
    CommitMetadata,
    CommitOutcome,
    Committed,
    Failed,
    Manifest,
    RetryLater,
    SinkCommits,
    StagedFile,
)
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.connectors._staging import (
    clean_staging,
    delete_unreferenced_moves,
    gather_staged,
    kept_epochs,
    staged_dir,
    staged_files,
    unstaged_path,
)
from barrierflow.connectors.state_commit import commit_state, drop_state
from barrierflow.runtime.positions import check_positions

__all__ = ["RECENT_COMMITS", "EpochCommit", "FileCommitter", "file_commit_outcome"]

#: How many of the latest commit durations a file committer keeps.
RECENT_COMMITS = 1024


def file_commit_outcome(
    exc: Exception,
    root: Path,
    *,
    retryable: tuple[type[BaseException], ...] = (),
    permanent: tuple[type[BaseException], ...] = (),
) -> CommitOutcome:
    """The outcome of a file table's commit that raised ``exc``.

    * ``permanent`` (the format's: a missing table, a schema conflict), a pending epoch whose
      files are lost (:class:`~barrierflow.errors.SinkRecoveryError`), an epoch partly held
      already (:class:`~barrierflow.errors.PositionOverlapError`), a :class:`PermissionError`,
      or a :class:`FileNotFoundError` once the table's ``root`` itself is gone:
      :class:`Failed` — retrying cannot help.
    * ``retryable`` (the format's: a concurrent writer won the race), or any other
      :class:`OSError` (a full disk, an NFS hiccup): :class:`RetryLater`.

    Raises:
        Exception: ``exc`` itself, when it is none of these (the coordinator retries it as
            unclassified, and logs it so).
    """
    if isinstance(exc, (*permanent, SinkRecoveryError, PositionOverlapError, PermissionError)):
        return Failed(exc)
    if isinstance(exc, FileNotFoundError) and not root.exists():
        return Failed(exc)
    if isinstance(exc, (*retryable, OSError)):
        return RetryLater(exc)
    raise exc


@final
@dataclass(frozen=True, slots=True)
class EpochCommit:
    """What a format's commit of one epoch publishes (see :meth:`FileCommitter.publish`)."""

    #: The epoch committed (the coordinator's: the committed marker's value).
    epoch: int
    #: Where its files are now, in the table.
    placed: list[Path]
    #: Its commit metadata (``paths``, ``rows``, ``positions``, ``schema_change`` ...).
    metadata: Mapping[str, Any]
    #: The source positions the table held before it.
    held: dict[str, int]

    @property
    def positions(self) -> dict[str, int]:
        """The positions the epoch's rows reach."""
        return dict(self.metadata.get("positions", {}))

    def placed_files(self) -> list[tuple[Path, StagedFile | None]]:
        """Each placed file with what its writer knew of it (rows, bytes, column statistics;
        ``None`` for a commit recorded before writers said): for the formats that place the
        staged files one by one, in the order of the metadata's ``paths``."""
        known = staged_files(self.metadata)
        paths = self.metadata.get("paths", [])
        return [
            (path, known.get(relative)) for path, relative in zip(self.placed, paths, strict=True)
        ]


class FileCommitter(ABC):
    """The committer of a file table (see the module docstring): a
    :class:`~barrierflow.actors.sinks.table.Committer` with commit timings
    (:class:`~barrierflow.actors.sinks.table.CommitTimings`) and the positions it holds
    (:class:`~barrierflow.actors.sinks.table.HoldsCommits`).

    Args:
        root: the directory its writers stage under (``<root>/.staging/<epoch>/``) and that
            committed files are placed in.
        name: the table's name in errors (its path, or its catalog identifier).
        evolves: whether the format takes ``add_columns`` schema changes.

    Lifecycle: that of a :class:`~barrierflow.actors.sinks.table.Committer`. Every blocking
    call runs on a worker thread, one at a time (a limiter of one per committer).
    """

    #: It commits the keyed state the manifests carry with their epoch (see .state_commit).
    commits_state = True

    #: Whether the format records an epoch that adds no file (an epoch with only keyed
    #: state commits its state, and the table's marker then moves only if it does).
    publishes_empty: bool = False

    def __init__(self, root: Path, name: str, *, evolves: bool) -> None:
        self._root = root
        self._name = name
        self._evolves = evolves
        self._limiter: anyio.CapacityLimiter | None = None
        #: Seconds the latest commits took (the format's commit, not the file moves), oldest
        #: first: at most :data:`RECENT_COMMITS` of them, so a long-running sink does not grow
        #: a list for ever. ``commits`` counts every one.
        self.commit_seconds: deque[float] = deque(maxlen=RECENT_COMMITS)
        #: Commits of epochs made by this committer.
        self.commits = 0

    @property
    def root(self) -> Path:
        """The directory the table's writers stage under and its files are placed in."""
        return self._root

    # What a format writes.

    @abstractmethod
    def load(self) -> Any:
        """The table's state now, as the other hooks take it (blocking)."""

    @abstractmethod
    def committed_in(self, state: Any) -> int:
        """The last epoch ``state``'s committed marker holds (0: none)."""

    @abstractmethod
    def held_in(self, state: Any, committed: int) -> dict[str, int]:
        """The source positions the table holds after epoch ``committed`` ({} at 0).

        Raises:
            SinkRecoveryError: they cannot be read.
        """

    @abstractmethod
    def publish(self, state: Any, epoch: EpochCommit) -> None:
        """The format's one atomic commit of ``epoch``: its placed files, its schema change,
        the committed marker and its positions, merged with those the table holds."""

    def catalog_errors(
        self,
    ) -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
        """The format's errors that may pass (retryable) and that will not (permanent), for
        :func:`file_commit_outcome`; none by default."""
        return (), ()

    def recover_table(self, keep: set[str]) -> None:
        """Recovery: delete the staged epochs and the files a commit moved in that no pending
        commit (``keep``: their staging directories) and no commit of the table references
        (see :func:`~._staging.delete_unreferenced_moves`)."""
        clean_staging(self._root, keep)
        delete_unreferenced_moves(self._root, keep, self.current_files, self.referenced_files)

    def current_files(self) -> set[Path]:
        """The data files the table's current version references (resolved paths)."""
        return set()

    def referenced_files(self) -> set[Path]:
        """The data files any version the table keeps references (resolved paths)."""
        return set()

    def after_commit(self, state: Any) -> None:  # noqa: B027  (optional, not abstract)
        """Upkeep after a commit went through (snapshot expiry, a checkpoint); none by
        default."""

    # The shared mechanics.

    async def run(self, fn: Any, *args: Any) -> Any:
        """Run blocking ``fn(*args)`` on a worker thread, one call of this committer at a
        time."""
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(1)
        return await anyio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    def committed_epoch(self) -> int:
        """The table's last committed epoch (blocking; 0 for a new table)."""
        return self.committed_in(self.load())

    def parse_positions(self, key: str, text: Any) -> dict[str, int]:
        """Positions recorded as JSON under ``key`` in the table's metadata.

        Raises:
            SinkRecoveryError: they are damaged.
        """
        try:
            return check_positions(key, json.loads(text))
        except (TypeError, ValueError, InvalidArgumentError) as exc:
            raise SinkRecoveryError(self._name, f"{key} is damaged: {exc}") from exc

    async def recover(self, pending: Mapping[int, CommitMetadata]) -> None:
        """Delete what no pending commit references (:meth:`recover_table`)."""
        await self.run(self.recover_table, kept_epochs(pending.values()))

    async def prepare(self, epoch: int, manifests: Sequence[Manifest]) -> CommitMetadata | None:
        """Every writer's staged files of the epoch and its schema change (``None`` if there
        is nothing to commit).

        Raises:
            StagedEpochMismatchError: the writers staged different epochs.
            SchemaEvolutionError: a schema change for a format that does not evolve.
            InvalidArgumentError: the schema change is not an ``add_columns`` change.
        """
        await anyio.lowlevel.checkpoint()
        return gather_staged(self._name, epoch, manifests, evolves=self._evolves)

    async def commit(self, epoch: int, metadata: CommitMetadata) -> CommitOutcome:
        """Publish ``epoch``: :class:`AlreadyCommitted` when the table's committed marker
        holds it or the positions it holds cover the epoch's batches (its staged files are
        dropped), else the files are placed and the format commits them. A failure is
        classified by :func:`file_commit_outcome` with the format's :meth:`catalog_errors`."""
        try:
            outcome: CommitOutcome = await self.run(self._commit, epoch, dict(metadata))
        except Exception as exc:
            retryable, permanent = self.catalog_errors()
            return file_commit_outcome(exc, self._root, retryable=retryable, permanent=permanent)
        return outcome

    def _commit(self, epoch: int, metadata: dict[str, Any]) -> CommitOutcome:
        state = self.load()
        committed = self.committed_in(state)
        if epoch <= committed:
            self.drop_staging(metadata)  # a replayed commit
            return AlreadyCommitted()
        held = self.held_in(state, committed)
        if epoch_already_held(
            self._name,
            epoch,
            held,
            metadata.get("positions_from", {}),
            metadata.get("positions", {}),
        ):
            # The runtime's store went back in time and the upstream replayed rows this table
            # holds: drop them instead of committing them twice.
            self.abort_files(metadata)
            return AlreadyCommitted()
        # The epoch's keyed state first, then its rows (see .state_commit for why).
        commit_state(epoch, metadata.get("state", ()))
        if not (metadata.get("paths") or "schema_change" in metadata or self.publishes_empty):
            # Keyed state and no row (a step after it emitted nothing), in a format that
            # records no epoch without files: its committed epoch moves with the next epoch
            # that has rows.
            self.drop_staging(metadata)
            return Committed()
        placed = self.place(epoch, metadata)
        started = time.perf_counter()
        self.publish(state, EpochCommit(epoch, placed, metadata, held))
        self.commit_seconds.append(time.perf_counter() - started)
        self.commits += 1
        self.after_commit(state)
        self.drop_staging(metadata)
        return Committed()

    def place(self, epoch: int, metadata: Mapping[str, Any]) -> list[Path]:
        """Move the epoch's staged files into the table (unless a commit cut short moved them
        already) and fsync the directories that name them; returns where they are.

        Raises:
            SinkRecoveryError: a file is neither staged nor moved (its rows are lost).
        """
        placed = [self.move_staged(relative, epoch) for relative in metadata.get("paths", [])]
        # The new directories' entries too: the commit names files under them.
        directories = {path.parent for path in placed}
        for directory in directories | {d.parent for d in directories}:
            fsync_path(directory)
        return placed

    def move_staged(self, relative: str, epoch: int) -> Path:
        """Move one staged file into the table, unless a crashed commit moved it already."""
        staged = self._root / relative
        final = unstaged_path(self._root, relative)
        if staged.exists():
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staged, final)
        elif not final.exists():
            raise SinkRecoveryError(
                self._name, f"file {relative} of pending epoch {epoch} is neither staged nor moved"
            )
        return final

    async def abort(self, epoch: int, metadata: CommitMetadata | None) -> None:
        """Delete the epoch's staged (or already moved, never committed) files."""
        if metadata is None:
            await anyio.lowlevel.checkpoint()
            return
        await self.run(self._abort, epoch, dict(metadata))

    def _abort(self, epoch: int, metadata: dict[str, Any]) -> None:
        if epoch <= self.committed_epoch():
            return  # it was committed after all: never delete committed files
        self.abort_files(metadata)

    def abort_files(self, metadata: Mapping[str, Any]) -> None:
        """Delete an uncommitted epoch's files, staged or moved, and its staging directory."""
        for relative in metadata.get("paths", []):
            for path in (self._root / relative, unstaged_path(self._root, relative)):
                path.unlink(missing_ok=True)
        self.drop_staging(metadata)

    def drop_staging(self, metadata: Mapping[str, Any]) -> None:
        """Delete the epoch's staging directory (what is left once its files moved) and what
        its keyed state's tasks staged (committed already, or never to be)."""
        if "staging_epoch" in metadata:
            shutil.rmtree(staged_dir(self._root, metadata["staging_epoch"]), ignore_errors=True)
        drop_state(metadata.get("state", ()))

    async def sink_commits(self) -> SinkCommits | None:
        """What the table holds: its committed epoch and the positions recorded with it
        (``None``: nothing committed by barrierflow yet)."""
        result: SinkCommits | None = await self.run(self._read_commits)
        return result

    def _read_commits(self) -> SinkCommits | None:
        state = self.load()
        epoch = self.committed_in(state)
        if epoch == 0:
            return None
        return SinkCommits(self._name, epoch, self.held_in(state, epoch))
