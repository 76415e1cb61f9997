"""The coordinator's counters, as a frozen snapshot and as metrics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

from barrierflow.runtime.metrics import MetricFamily, counter, gauge

__all__ = ["CoordinatorStats", "coordinator_families"]


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
    #: The last epoch acknowledged to writers / committed (0 before the first).
    last_acked_epoch: int
    last_committed_epoch: int
    #: Failed commit attempts (all of them), and the backoff delays waited after the latest
    #: ones (seconds, oldest first; at most ``RECENT_DELAYS`` of them).
    commit_failures: int
    retry_delays: tuple[float, ...]
    #: Epochs aborted at recovery.
    aborted_epochs: tuple[int, ...]


def coordinator_families(
    sink: str, stats: CoordinatorStats, rows_committed: int
) -> list[MetricFamily]:
    """A coordinator's counters as metrics, labelled with its ``sink``."""
    labels = {"sink": sink}
    return [
        counter("barrierflow_sink_rows_committed", "rows the sink's commits published",
                [(labels, rows_committed)]),
        counter("barrierflow_sink_acked_epochs", "epochs acknowledged to the sink's writers "
                "(persisted as pending, or committed)", [(labels, stats.acked_epochs)]),
        counter("barrierflow_sink_committed_epochs", "epochs committed to the sink's table",
                [(labels, stats.committed_epochs)]),
        gauge("barrierflow_sink_pending_epochs", "epochs acknowledged and not yet committed",
              [(labels, max(stats.acked_epochs - stats.committed_epochs, 0))]),
        gauge("barrierflow_sink_last_committed_epoch", "the sink's last committed epoch",
              [(labels, stats.last_committed_epoch)]),
        counter("barrierflow_sink_commit_retries", "failed commit attempts (each is retried)",
                [(labels, stats.commit_failures)]),
        counter("barrierflow_sink_aborted_epochs", "epochs aborted at the coordinator's "
                "recovery", [(labels, len(stats.aborted_epochs))]),
        gauge("barrierflow_sink_writers", "writers registered with the sink's coordinator",
              [(labels, stats.writers)]),
    ]  # fmt: skip
