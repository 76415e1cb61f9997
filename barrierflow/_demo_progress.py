"""The demo's live progress table, and the counts it shares with the final lines.

One :class:`RunCounts` feeds both the live table and the lines printed at the end, so they
cannot disagree: every figure says whether it counts *this run* (since this process started)
or *overall* (every run of this work directory, a resumed run included), and rows are shown
against the total the run was asked for, with an estimate of the time left.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

__all__ = ["LiveProgress", "RunCounts", "batch_line"]


@dataclass(frozen=True)
class RunCounts:
    """What the demo has done, at one moment."""

    #: Rows the run was asked to produce (its manifest).
    rows_asked: int
    #: Rows already in the table when this run started (earlier runs of a resumed demo).
    rows_before: int
    #: Rows delivered by this run, micro-batches delivered and replays skipped by this run.
    rows_this_run: int
    batches_this_run: int
    replays_skipped: int
    #: Epochs the coordinator committed in this run.
    epochs_this_run: int
    #: Seconds the Spark thread waited for room in the feed (backpressure), this run.
    blocked_seconds: float
    #: Seconds since this run started (the same clock as the final lines).
    seconds: float

    @property
    def rows_overall(self) -> int:
        """Rows in so far, over every run."""
        return self.rows_before + self.rows_this_run

    @property
    def rate(self) -> float:
        """Rows per second in this run."""
        return self.rows_this_run / self.seconds if self.seconds > 0 else 0.0

    @property
    def seconds_left(self) -> float | None:
        """An estimate of the time left at this run's rate (``None`` before any rows)."""
        if self.rate <= 0:
            return None
        return max(self.rows_asked - self.rows_overall, 0) / self.rate


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}:{secs:02d}"


class LiveProgress:
    """A rich live table on stderr, refreshed from ``counts()`` while the query runs.

    Use it as a context manager around the run; :meth:`refresh` redraws it from the loop that
    waits for the query. Disabled, it does nothing.
    """

    def __init__(self, enabled: bool, counts: Callable[[], RunCounts]) -> None:
        self._counts = counts
        self._live: Any = None
        if enabled:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(console=Console(file=sys.stderr), refresh_per_second=4)

    def __enter__(self) -> LiveProgress:
        if self._live is not None:
            self._live.start()
            self.refresh()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._live is not None:
            if exc_type is None:
                self.refresh()
            self._live.stop()
            sys.stderr.write("\n")

    def refresh(self) -> None:
        """Redraw the table from the current counts."""
        if self._live is not None:
            self._live.update(self.render(self._counts()))

    @staticmethod
    def render(counts: RunCounts) -> Any:
        """The table for ``counts``."""
        from rich.table import Table

        table = Table(title="barrierflow demo: Spark → bridge → 4 writers → Iceberg")
        table.add_column("")
        table.add_column("this run", justify="right")
        table.add_column("overall", justify="right")
        share = counts.rows_overall / counts.rows_asked if counts.rows_asked else 0.0
        table.add_row(
            "rows in",
            f"{counts.rows_this_run:,}",
            f"{counts.rows_overall:,} of {counts.rows_asked:,} ({share:.0%})",
        )
        table.add_row(
            "micro-batches",
            f"{counts.batches_this_run} ({counts.replays_skipped} replays skipped)",
            "",
        )
        table.add_row("epochs committed", str(counts.epochs_this_run), "")
        table.add_row("rows/s", f"{counts.rate:,.0f}", "")
        table.add_row("elapsed", _duration(counts.seconds), "")
        table.add_row("time left (est.)", "", _duration(counts.seconds_left))
        table.add_row("backpressure", f"{counts.blocked_seconds:.2f} s", "")
        return table


def batch_line(batch_id: int, counts: RunCounts) -> str:
    """The line printed for each micro-batch when there is no live table (``--no-progress``,
    logs): the same figures, labelled the same way."""
    return (
        f"micro-batch {batch_id} in: rows {counts.rows_overall:,} of {counts.rows_asked:,} "
        f"(overall); this run {counts.batches_this_run} micro-batches, "
        f"{counts.rows_this_run:,} rows, {counts.rate:,.0f} rows/s; "
        f"time left (est.) {_duration(counts.seconds_left)}"
    )
