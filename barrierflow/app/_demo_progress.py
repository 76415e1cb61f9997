"""The demo's live progress table, and the counts it shares with the final lines.

One :class:`RunCounts` feeds both the live table and the lines printed at the end, so they
cannot disagree: every figure says whether it counts *this run* (since this process started)
or *overall* (every run of this work directory, a resumed run included), and rows are shown
against the total the run was asked for, with an estimate of the time left.

The last table is drawn from the *final* state: after ``settle`` (the demo waits there for the
sink's last commit, which lands just after Spark's last micro-batch returns — drawn before it,
the table said one epoch fewer than the lines that follow). Without a terminal (output piped
to a file, CI) a live table draws nothing until the end, so plain progress lines are written
instead, one every few seconds, and one at the end.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TextIO

__all__ = [
    "LiveProgress",
    "RunCounts",
    "batch_line",
    "job_line",
    "progress_line",
    "show_job_progress",
]

#: Seconds between two plain progress lines when there is no terminal.
PLAIN_EVERY = 5.0


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
    """Progress on ``stream`` (stderr by default), refreshed from ``counts()`` while the query
    runs: a rich live table on a terminal, else a plain :func:`progress_line` every ``every``
    seconds (and one at the end). Disabled, it does nothing.

    Use it as a context manager around the run; :meth:`refresh` redraws it from the loop that
    waits for the query. Leaving the block without an error calls ``settle()`` first, then
    draws the last table (or line) from the counts as they are then (see the module).

    Args:
        enabled: show anything at all.
        counts: the current counts.
        settle: waits until the counts are final (the last commit landed); ``None``: they are.
        stream: where to draw (default: ``sys.stderr``); a terminal gets the live table.
        every: seconds between two plain lines.
        clock: seconds, monotonic (tests pass a fake one).
    """

    def __init__(
        self,
        enabled: bool,
        counts: Callable[[], RunCounts],
        *,
        settle: Callable[[], object] | None = None,
        stream: TextIO | None = None,
        every: float = PLAIN_EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._counts = counts
        self._settle = settle
        self._stream = sys.stderr if stream is None else stream
        self._every = every
        self._clock = clock
        self._next_line: float | None = None
        self._live: Any = None
        self._plain = enabled and not _is_terminal(self._stream)
        if enabled and not self._plain:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(console=Console(file=self._stream), refresh_per_second=4)

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
        if self._live is None and not self._plain:
            return
        if exc_type is None and self._settle is not None:
            self._settle()
        if self._live is not None:
            if exc_type is None:
                self._live.update(self.render(self._counts()))
            self._live.stop()
            self._stream.write("\n")
        elif exc_type is None:
            self._write(progress_line(self._counts(), final=True))

    def refresh(self) -> None:
        """Redraw the table from the current counts (on a terminal), or write a plain line if
        ``every`` seconds passed since the last one (the first one at once)."""
        if self._live is not None:
            self._live.update(self.render(self._counts()))
        elif self._plain:
            now = self._clock()
            if self._next_line is None or now >= self._next_line:
                self._next_line = now + self._every
                self._write(progress_line(self._counts()))

    def _write(self, line: str) -> None:
        self._stream.write(line + "\n")
        self._stream.flush()

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


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty())


def progress_line(counts: RunCounts, *, final: bool = False) -> str:
    """A plain line of the live table's figures, labelled the same way: what is written
    instead of the table when there is no terminal (``final``: the last one, after the run)."""
    share = counts.rows_overall / counts.rows_asked if counts.rows_asked else 0.0
    return (
        f"{'done' if final else 'progress'}: rows {counts.rows_overall:,} of "
        f"{counts.rows_asked:,} ({share:.0%}, overall); this run {counts.batches_this_run} "
        f"micro-batches ({counts.replays_skipped} replays skipped), "
        f"{counts.rows_this_run:,} rows, {counts.rate:,.0f} rows/s, "
        f"{counts.epochs_this_run} epochs committed; elapsed {_duration(counts.seconds)}"
        + ("" if final else f"; time left (est.) {_duration(counts.seconds_left)}")
    )


def batch_line(batch_id: int, counts: RunCounts) -> str:
    """The line printed for each micro-batch when there is no live table (``--no-progress``,
    logs): the same figures, labelled the same way."""
    return (
        f"micro-batch {batch_id} in: rows {counts.rows_overall:,} of {counts.rows_asked:,} "
        f"(overall); this run {counts.batches_this_run} micro-batches, "
        f"{counts.rows_this_run:,} rows, {counts.rate:,.0f} rows/s; "
        f"time left (est.) {_duration(counts.seconds_left)}"
    )


def job_line(name: str, progress: Any) -> str:
    """One plain line of a joining job's progress (``progress``: its ``JobProgress``)."""
    return (
        f"job {name}: {progress.phase}, {progress.fraction_done:.0%} done, "
        f"{progress.rows:,} rows backfilled"
    )


async def show_job_progress(
    name: str, handle: Any, *, every: float = 0.2, stream: TextIO | None = None
) -> None:
    """Show a joining job's backfill until it is ready (``handle``: its ``JobHandle``): a live
    progress bar on a terminal, else a plain line every few seconds and one when ready —
    instead of silence until the demo's last line."""
    import anyio
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn

    out = stream or sys.stderr
    console = Console(file=out)
    if not console.is_terminal:
        last = 0.0
        while not handle.progress().ready:
            if time.monotonic() - last >= PLAIN_EVERY:
                print(job_line(name, handle.progress()), file=out, flush=True)
                last = time.monotonic()
            await anyio.sleep(every)
        print(job_line(name, handle.progress()), file=out, flush=True)
        return
    columns = (TextColumn("job {task.fields[job]}"), BarColumn(), TextColumn("{task.description}"))
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("", total=1.0, job=name)
        while True:
            progress = handle.progress()
            bar.update(
                task,
                completed=progress.fraction_done,
                description=f"{progress.phase}, {progress.rows:,} rows backfilled",
            )
            if progress.ready:
                return
            await anyio.sleep(every)
