"""The coordinator's counters, as a frozen snapshot."""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

__all__ = ["CoordinatorStats"]


@final
@dataclass(frozen=True, slots=True)
class CoordinatorStats:
    """A snapshot of a coordinator's counters (of its current run)."""

    #: Writers registered and running now.
    writers: int
    running: int
    #: Epochs acknowledged to writers, and committed by the committer.
    acked_epochs: int
    committed_epochs: int
    #: Epochs acknowledged whose commit is still to go through now (an empty epoch, with
    #: nothing to commit, is acknowledged and never committed: it is not pending).
    pending_epochs: int
    #: The last epoch acknowledged to writers / committed (0 before the first).
    last_acked_epoch: int
    last_committed_epoch: int
    #: Failed commit attempts (all of them), and the backoff delays waited after the latest
    #: ones (seconds, oldest first; at most ``RECENT_DELAYS`` of them).
    commit_failures: int
    retry_delays: tuple[float, ...]
    #: Commits that found their epoch committed already (the table's marker: a replay after a
    #: crash or a lost reply), counted among ``committed_epochs``.
    commit_replays: int
    #: Epochs aborted at recovery.
    aborted_epochs: tuple[int, ...]
    #: Rows the commits of this run published (the writers' manifests' rows).
    rows_committed: int = 0
    #: When the last commit of this run went through (Unix seconds; ``None`` before the first).
    last_commit_time: float | None = None
