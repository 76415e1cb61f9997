"""The two ways a :class:`~barrierflow.connectors.ParquetFileSink` commits, one strategy each.

* :class:`SingleWriter` — the sink is the table's only writer: it commits and recovers its own
  epochs (renames staged directories into the table, records them in the manifest).
* :class:`CoordinatedWriter` — one of a coordinated sink's parallel writers (``writer=``): it
  only stages; commit and recovery belong to the coordinator's
  :class:`~barrierflow.connectors.parquet_committer.ParquetCommitter`, so both are no-ops here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar, final

import anyio.lowlevel

from barrierflow.actors.sinks.protocol import PendingCommit
from barrierflow.connectors._parquet_files import StagedFiles
from barrierflow.runtime.positions import SinkCommits

__all__ = ["CommitMode", "CoordinatedWriter", "SingleWriter"]

T = TypeVar("T")
#: Runs a blocking call of the files on the sink's worker thread.
Run = Callable[..., Awaitable[Any]]


class CommitMode(Protocol):
    async def recover(self, pending: Sequence[PendingCommit]) -> None: ...

    async def commit(self, epoch: int) -> None: ...

    async def commits(self) -> SinkCommits | None: ...


@final
class SingleWriter:
    """The table's only writer: commits and recovers its own epochs."""

    def __init__(self, files: StagedFiles, run: Run) -> None:
        self._files = files
        self._run = run

    async def recover(self, pending: Sequence[PendingCommit]) -> None:
        """Record renamed epochs, commit ``pending``, delete every other staged epoch."""
        await self._run(self._files.recover, list(pending))

    async def commit(self, epoch: int) -> None:
        """Rename the staged epoch into the table and record it (idempotent)."""
        await self._run(self._files.commit, epoch)

    async def commits(self) -> SinkCommits | None:
        """What the table holds (``None``: nothing committed)."""
        commits: SinkCommits | None = await self._run(self._files.commits)
        return commits


@final
class CoordinatedWriter:
    """One parallel writer of a coordinated sink: its committer commits and recovers."""

    async def recover(self, pending: Sequence[PendingCommit]) -> None:
        await anyio.lowlevel.checkpoint()

    async def commit(self, epoch: int) -> None:
        await anyio.lowlevel.checkpoint()

    async def commits(self) -> SinkCommits | None:
        """``None``: the coordinator's committer answers for the table."""
        await anyio.lowlevel.checkpoint()
        return None
