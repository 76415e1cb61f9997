"""The reader task of an actor that reads a :class:`~.split_log.SplitLog` beside its own loop:
the live split source (:mod:`.split_source`) and the source backfill's history stage
(:mod:`barrierflow.actors.backfill._backfill_stage`) both run one.

A reader follows the log from given positions in a task of the actor's task group and hands
each batch to the actor's loop through a channel, tagged with its *generation*; after a batch
it sleeps ``rows / rate`` seconds when a rate is set. At most one reader runs: the actor stops
it (a barrier changed the splits, the rate, the pause) and starts another from the positions
it emitted up to. A stopped reader may already have handed over a batch, or be blocked handing
one over; the loop tells those apart by their generation (:meth:`SplitReader.is_current`) and
drops them, so nothing read under the old settings is emitted after the barrier that changed
them. Cancelling the reader closes the log's iterator (``aclosing``), so its connection or
cursor is released at once.

One copy of this mechanism, because the two actors differ only in what they add around it:
the live source waits before a hand-over while barriers are late (``before_send``), the
backfill starts a rebuilt reader after a backoff (``delay``) and turns a read error into an
item for its loop (``report_failures``) so that it can retry instead of failing.

A runtime mechanism, not an API for connector authors: the package does not export it. It is
a module without a leading underscore only because the backfill package imports it too (the
layout test keeps private modules private to their package).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, final

import anyio
import pyarrow as pa
from anyio.abc import TaskGroup

from barrierflow.actors.sources.split_log import Offset, SplitLog

__all__ = ["ReaderBatch", "ReaderFailed", "SplitReader"]


@final
@dataclass(frozen=True, slots=True)
class ReaderBatch:
    """A batch a reader read, tagged with the reader's generation."""

    generation: int
    batch: pa.RecordBatch


@final
@dataclass(frozen=True, slots=True)
class ReaderFailed:
    """What a reader that reports its failures sends instead of a batch when the log's read
    raised; it then ends."""

    generation: int
    error: Exception


@final
class SplitReader:
    """Starts and stops the one reader task of an actor (see the module).

    Args:
        log: the split log to read.
        batch_rows: rows per batch, at most.
        send: hands one item (a :class:`ReaderBatch` or :class:`ReaderFailed`) to the actor's
            loop; it blocks while the loop does not take it (the channel bounds what a reader
            reads ahead).
        sleep: waits a number of seconds (the rate's and the delay's; the caller may pass its
            own, a test one that records the waits).
        before_send: awaited before each hand-over (the live source holds a batch there
            while barriers are late).
        report_failures: whether a failed read is sent as a :class:`ReaderFailed` (the loop
            decides what to do) instead of raised in the task group (failing the actor).
    """

    def __init__(
        self,
        log: SplitLog,
        batch_rows: int,
        send: Callable[[Any], Awaitable[None]],
        *,
        sleep: Callable[[float], Awaitable[Any]] = anyio.sleep,
        before_send: Callable[[], Awaitable[None]] | None = None,
        report_failures: bool = False,
    ) -> None:
        self._log = log
        self._batch_rows = batch_rows
        self._send = send
        self._sleep = sleep
        self._before_send = before_send
        self._report_failures = report_failures
        self._generation = 0
        self._scope: anyio.CancelScope | None = None

    @property
    def generation(self) -> int:
        """The current reader's generation (the one a started reader tags its items with);
        it changes at every :meth:`stop`."""
        return self._generation

    @property
    def running(self) -> bool:
        """Whether a reader was started and not stopped since (it may have ended)."""
        return self._scope is not None

    def is_current(self, item: ReaderBatch | ReaderFailed) -> bool:
        """Whether ``item`` comes from the current reader (else it is dropped: its reader was
        stopped after reading it)."""
        return item.generation == self._generation

    def stop(self) -> None:
        """Cancel the reader, if one runs; anything it handed over is no longer current."""
        self._generation += 1
        if self._scope is not None:
            self._scope.cancel()
            self._scope = None

    def start(
        self,
        task_group: TaskGroup,
        starts: Mapping[str, Offset | None],
        rate: float | None,
        *,
        delay: float = 0.0,
    ) -> None:
        """Stop the current reader and start one in ``task_group`` that reads from ``starts``
        (split → the offset to read after, ``None``: the first record) after ``delay``
        seconds, sleeping ``rows / rate`` seconds after each batch (no sleep when ``rate`` is
        ``None``; the caller starts no reader at a rate of 0)."""
        self.stop()
        scope = anyio.CancelScope()
        self._scope = scope
        task_group.start_soon(self._read, scope, self._generation, dict(starts), rate, delay)

    async def _read(
        self,
        scope: anyio.CancelScope,
        generation: int,
        starts: dict[str, Offset | None],
        rate: float | None,
        delay: float,
    ) -> None:
        with scope:
            if delay:
                await self._sleep(delay)
            try:
                reader = self._log.read(starts, batch_rows=self._batch_rows)
                async with contextlib.aclosing(reader) as batches:  # type: ignore[type-var]
                    async for batch in batches:
                        if self._before_send is not None:
                            await self._before_send()
                        await self._send(ReaderBatch(generation, batch))
                        if rate:
                            await self._sleep(batch.num_rows / rate)
            except Exception as exc:
                if not self._report_failures:
                    raise
                await self._send(ReaderFailed(generation, exc))
