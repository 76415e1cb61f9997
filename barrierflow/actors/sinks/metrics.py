"""What the parts of a sink report as metrics: its coordinator's epochs and commits, and
each writer's sink task (see :mod:`barrierflow.runtime.metrics`; the runtime collects them,
and the README's "Watching a pipeline" lists them). Kept apart from the parts themselves:
it is reporting, not a rule of committing."""

from __future__ import annotations

from collections import deque
from typing import Protocol, final

from barrierflow.actors.sinks._sink_commands import SinkTaskStats
from barrierflow.runtime.metrics import Histogram, MetricFamily, MetricsRegistry, counter, gauge

__all__ = ["DurableMarks", "commit_histograms", "coordinator_families", "writer_families"]


class CoordinatorCounts(Protocol):
    """What the coordinator's metrics read of its stats (a ``CoordinatorStats``; named by its
    fields so that this module needs nothing of the coordinator package)."""

    @property
    def writers(self) -> int: ...
    @property
    def acked_epochs(self) -> int: ...
    @property
    def committed_epochs(self) -> int: ...
    @property
    def pending_epochs(self) -> int: ...
    @property
    def last_committed_epoch(self) -> int: ...
    @property
    def commit_failures(self) -> int: ...
    @property
    def commit_replays(self) -> int: ...
    @property
    def aborted_epochs(self) -> tuple[int, ...]: ...
    @property
    def rows_committed(self) -> int: ...
    @property
    def last_commit_time(self) -> float | None: ...


def coordinator_families(sink: str, stats: CoordinatorCounts) -> list[MetricFamily]:
    """A coordinator's counters as metrics, labelled with its ``sink``."""
    labels = {"sink": sink}
    return [
        counter("barrierflow_sink_rows_committed", "rows the sink's commits published",
                [(labels, stats.rows_committed)]),
        counter("barrierflow_sink_acked_epochs", "epochs acknowledged to the sink's writers "
                "(persisted as pending, or committed)", [(labels, stats.acked_epochs)]),
        counter("barrierflow_sink_committed_epochs", "epochs committed to the sink's table",
                [(labels, stats.committed_epochs)]),
        # Not acked less committed: an empty epoch is acknowledged and has nothing to commit.
        gauge("barrierflow_sink_pending_epochs", "epochs acknowledged whose commit is still "
              "to go through", [(labels, stats.pending_epochs)]),
        gauge("barrierflow_sink_last_committed_epoch", "the sink's last committed epoch",
              [(labels, stats.last_committed_epoch)]),
        # No sample before the sink's first commit (of this run): 0 would read as a commit in
        # 1970, and an alert on ``time() - x`` would fire on every start.
        gauge("barrierflow_sink_last_commit_timestamp_seconds", "Unix time the sink's last "
              "commit went through", [] if stats.last_commit_time is None
              else [(labels, stats.last_commit_time)]),
        counter("barrierflow_sink_commit_retries", "failed commit attempts (each is retried)",
                [(labels, stats.commit_failures)]),
        counter("barrierflow_sink_commit_replays", "commits that found their epoch committed "
                "already (a replay)", [(labels, stats.commit_replays)]),
        counter("barrierflow_sink_aborted_epochs", "epochs aborted at the coordinator's "
                "recovery", [(labels, len(stats.aborted_epochs))]),
        gauge("barrierflow_sink_writers", "writers registered with the sink's coordinator",
              [(labels, stats.writers)]),
    ]  # fmt: skip


def writer_families(sink: str, actor: str, stats: SinkTaskStats) -> list[MetricFamily]:
    """A sink writer's sink task counters as metrics, labelled with its ``sink`` and
    ``actor``."""
    labels = {"sink": sink, "actor": actor}
    return [
        counter("barrierflow_sink_rows_written", "rows a sink writer staged",
                [(labels, stats.rows_written)]),
        counter("barrierflow_sink_poisoned_epochs", "epochs a failed write poisoned",
                [(labels, stats.write_errors)]),
        counter("barrierflow_sink_staged_epochs", "epochs a sink writer staged",
                [(labels, stats.staged_epochs)]),
        counter("barrierflow_sink_flush_errors", "periodic flushes that failed or "
                "overran their timeout", [(labels, stats.flush_errors + stats.stuck_flushes)]),
    ]  # fmt: skip


def commit_histograms(registry: MetricsRegistry) -> tuple[Histogram, Histogram]:
    """The histograms a coordinator observes its commits into, labelled with the sink: how long
    one commit of the table took, and how long after the epoch's checkpoint was durable it
    landed (the last stage of a barrier's latency)."""
    seconds = registry.histogram(
        "barrierflow_sink_commit_seconds", "seconds one commit of the sink's table took", ("sink",)
    )
    latency = registry.histogram(
        "barrierflow_sink_commit_latency_seconds",
        "seconds from an epoch's checkpoint being durable until the sink committed it",
        ("sink",),
    )
    return seconds, latency


@final
class DurableMarks:
    """When the runtime's committed epoch reached each value (a coordinator notes them as they
    come), to tell how long after its checkpoint became durable an epoch was committed."""

    def __init__(self) -> None:
        self._marks: deque[tuple[int, float]] = deque()

    def add(self, epoch: int, at: float) -> None:
        """The committed epoch reached ``epoch`` at time ``at``."""
        self._marks.append((epoch, at))

    def since(self, epoch: int) -> float | None:
        """When ``epoch`` became durable: the first mark at or past it (``None``: not seen).
        Marks of older epochs are forgotten (epochs commit in order)."""
        marks = self._marks
        while marks and marks[0][0] < epoch:
            marks.popleft()
        return marks[0][1] if marks else None
