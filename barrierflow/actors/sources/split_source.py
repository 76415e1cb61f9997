"""The live split source (after RisingWave's ``source_executor.rs``): reads its splits of a
:class:`~barrierflow.actors.sources.split_log.SplitLog` and emits their records as chunks
between the barriers it receives. Its output is shared by every job that reads it (a job added
with ``rt.add_job`` sees the records after its ``Add`` barrier).

Declare it with a factory: ``rt.add_source("events", lambda: SplitSource(log))``.

The rules, each tested by name in ``tests/test_split_source.py``:

1. **Assignment.** On its first barrier the source takes its splits from the ``Add`` mutation
   (``barrier.initial_splits(actor_id)``) if it names this actor; else from the assignment a
   split change made durable (rule 5); else from the constructor's ``splits=``; else every
   split the log lists. A ``Split.offset`` int ``n`` means "start after ``Offset(n)``" (``-1``
   or ``None``: from the first record); the actor's own committed offset of the split wins
   over it. An assigned split the log does not have is :class:`~barrierflow.actors.sources.
   errors.UnknownSplitError` (rule 9).
2. **Offsets in state.** State table ``"offsets"``: split → ``str(offset)`` of the last record
   emitted. The current offsets are put before each barrier is passed, so they are sealed with
   it: a restart (recovery, or a new run on the same store) reads each split from after its
   committed offset — nothing emitted twice within what was committed, nothing skipped.
3. **Rows.** Each reader batch becomes one insert-only :class:`~barrierflow.channels.chunk.
   Chunk`, the batch as is (payload, then the split and offset columns); the offsets to keep
   are taken per split with NumPy (no Python loop per row; see
   :mod:`~barrierflow.actors.sources._split_positions`). The reader hands its batches over
   unbuffered: while the output is blocked, it holds at most one batch read ahead.
4. **Pause, Resume, Throttle.** ``Pause`` stops the reader (barriers still flow), ``Resume``
   starts it again, ``Add(pause=True)`` starts paused. ``Throttle`` sets the reader's rate in
   rows per second: after handing over ``n`` rows the reader sleeps ``n / rate`` seconds;
   ``0`` pauses, ``None`` is unlimited. A change takes effect at the barrier carrying it: no
   row read under the old setting is emitted after it.
5. **Split changes.** A barrier with ``new_splits(actor_id)`` (``SourceChangeSplit`` or
   ``Update``) changes the assignment for the rows *after* it: kept splits keep their offsets,
   new ones start from their ``Split.offset`` (or the first record), dropped ones stop and
   their ``"offsets"`` entry is deleted. The new assignment is put in the state table
   ``"assignment"`` (split → start offset text, ``""`` for the first record) before the
   barrier is passed, so it is durable with the barrier's checkpoint and a restart keeps it.
   The reader is rebuilt.
6. **Self-pause.** When ``wait_barrier_intervals * ctx.barrier_interval`` seconds
   (:func:`anyio.current_time`) pass without a barrier, the reader holds its next batch until
   the next barrier arrives: a stuck barrier path cannot let one epoch grow without bound.
7. **Stop.** A ``Stop`` barrier for this actor is passed on, then the reader is closed and the
   actor finishes.
8. **Shared.** The output is an ordinary actor output: every job reading the source sees the
   same chunks from the barrier it joined at.
9. **Bad input.** Constructor arguments are checked (:class:`~barrierflow.channels.errors.
   InvalidArgumentError`); an unknown split fails the actor with ``UnknownSplitError``; a
   chunk pushed into the source's inbox fails it with a
   :class:`~barrierflow.channels.errors.ProtocolError` (its rows would carry no offset).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import final

import anyio
import pyarrow as pa
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from barrierflow._taskgroups import single_error
from barrierflow.actors.sources._split_positions import (
    Positions,
    check_splits,
    last_offsets,
    start_of,
)
from barrierflow.actors.sources.errors import UnknownSplitError
from barrierflow.actors.sources.split_log import Offset, SplitLog
from barrierflow.channels.barrier import Barrier
from barrierflow.channels.chunk import Chunk
from barrierflow.channels.errors import InvalidArgumentError, ProtocolError
from barrierflow.channels.messages import Message
from barrierflow.channels.mutation import Split
from barrierflow.runtime.actor import ActorContext, StreamActor
from barrierflow.runtime.state.state_store import StateTable

__all__ = ["SplitSource"]

#: Split → ``str(offset)`` of the last record emitted.
OFFSETS_TABLE = "offsets"
#: Split → start offset text (``""``: the first record), written by split changes.
ASSIGNMENT_TABLE = "assignment"


@final
@dataclass(frozen=True, slots=True)
class _Batch:
    """A reader batch, tagged with the reader that read it (older readers' are dropped)."""

    generation: int
    batch: pa.RecordBatch


#: What reaches the actor's loop: a batch, an inbox message, or ``None`` (the inbox ended).
_Item = _Batch | Message | None


@final
class SplitSource(StreamActor):
    """Reads its splits of ``log`` and emits their records between barriers (see the module).

    Args:
        log: the split log.
        splits: the splits to read when the ``Add`` barrier assigns none (names, or
            :class:`~barrierflow.channels.mutation.Split` with a start offset); ``None``:
            every split the log lists.
        batch_rows: rows per reader batch (and so per chunk), at most.
        wait_barrier_intervals: barrier intervals without a barrier after which the reader
            pauses itself until the next one.

    Raises:
        InvalidArgumentError: ``log`` is not a SplitLog; ``splits`` is not ``None`` or a list or
            tuple of distinct split names / Splits; ``batch_rows`` or ``wait_barrier_intervals``
            is not an int >= 1.
    """

    def __init__(
        self,
        log: SplitLog,
        *,
        splits: Sequence[str | Split] | None = None,
        batch_rows: int = 4096,
        wait_barrier_intervals: int = 5,
    ) -> None:
        if not isinstance(log, SplitLog):
            raise InvalidArgumentError("log", "a SplitLog", type(log).__name__)
        for name, value in (
            ("batch_rows", batch_rows),
            ("wait_barrier_intervals", wait_barrier_intervals),
        ):
            if type(value) is not int or value < 1:
                raise InvalidArgumentError(name, "an int >= 1", value)
        self._log = log
        self._splits = None if splits is None else check_splits(splits)
        self._batch_rows = batch_rows
        self._wait_intervals = wait_barrier_intervals

    async def run(self, ctx: ActorContext) -> None:
        """Pass the first barrier with the assignment taken, then read and emit until a Stop
        (see the module).

        Raises:
            UnknownSplitError: an assigned split the log does not have.
            OffsetTrimmedError: a split's records after its offset were trimmed.
            ProtocolError: a chunk arrived in the source's inbox.
        """
        send, receive = anyio.create_memory_object_stream[_Item](0)
        reading = _Reading(self, ctx, send)
        await reading.restore()
        try:
            with single_error():
                async with anyio.create_task_group() as tg:
                    reading.task_group = tg
                    tg.start_soon(_forward_inbox, ctx, send.clone())
                    await reading.loop(receive)
                    tg.cancel_scope.cancel()
        finally:
            send.close()
            receive.close()


async def _forward_inbox(ctx: ActorContext, send: MemoryObjectSendStream[_Item]) -> None:
    """The inbox (barriers, watermarks) joins the reader's batches in one ordered stream;
    ``None`` marks its end."""
    with send:
        async for message in ctx.messages():
            if isinstance(message, Chunk):
                raise ProtocolError(
                    f"split source {ctx.name!r}: expected only barriers in its inbox (rows come "
                    f"from its split log), got a chunk of {message.num_rows} rows"
                )
            await send.send(message)
        await send.send(None)


@final
class _Reading:
    """One run of a split source: positions, pause/rate settings, the reader task."""

    def __init__(
        self, actor: SplitSource, ctx: ActorContext, send: MemoryObjectSendStream[_Item]
    ) -> None:
        self.actor = actor
        self.ctx = ctx
        self.send = send
        self.offsets: StateTable = ctx.table(OFFSETS_TABLE)
        self.assignment: StateTable = ctx.table(ASSIGNMENT_TABLE)
        self.committed: dict[str, Offset] = {}
        self.committed_assignment: dict[str, Offset | None] = {}
        self.positions: Positions | None = None  # None until the first barrier
        self.paused = False
        self.rate: float | None = None
        self.generation = 0
        self.scope: anyio.CancelScope | None = None
        self.task_group: TaskGroup | None = None
        self.last_barrier = anyio.current_time()
        self.barrier_seen = anyio.Event()

    async def restore(self) -> None:
        """Load the committed offsets and assignment."""
        self.committed = {
            str(k): Offset.parse(str(v)) for k, v in (await self.offsets.items()).items()
        }
        self.committed_assignment = {
            str(k): Offset.parse(str(v)) if v else None
            for k, v in (await self.assignment.items()).items()
        }

    async def loop(self, receive: MemoryObjectReceiveStream[_Item]) -> None:
        """Emit batches of the current reader and handle inbox messages, until a Stop or the
        inbox's end."""
        async for item in receive:
            if item is None:
                return
            if isinstance(item, _Batch):
                if item.generation == self.generation:
                    await self.emit_batch(item.batch)
            elif isinstance(item, Barrier):
                await self.on_barrier(item)
                if self.ctx.finished:
                    return
                self.start_reader()
            else:
                await self.ctx.emit(item)  # a watermark

    async def emit_batch(self, batch: pa.RecordBatch) -> None:
        """Emit ``batch`` as one chunk and advance its splits' positions."""
        if batch.num_rows == 0:
            return
        await self.ctx.emit(Chunk(batch))
        assert self.positions is not None
        self.positions.update(last_offsets(batch))

    # Barriers.

    async def on_barrier(self, barrier: Barrier) -> None:
        """Apply the barrier's mutation, put the offsets, pass it on (see the module)."""
        actor_id = self.ctx.actor_id
        changed = False
        if self.positions is None:  # no reader runs before the first barrier: none to stop
            await self.assign_first(barrier)
            self.paused = barrier.is_pause_on_startup()
        else:
            new = barrier.new_splits(actor_id)
            if new is not None:
                await self.change_splits(new)
                changed = True
        if barrier.is_pause() or barrier.is_resume():
            self.paused = barrier.is_pause()
            changed = True
        rate_changed, rate = barrier.throttle_for(actor_id)
        if rate_changed:
            self.rate = rate
            changed = True
        if changed or barrier.is_stop(actor_id):
            self.stop_reader()  # nothing read under the old settings goes after the barrier
        self.put_offsets()
        await self.ctx.emit(barrier)
        self.last_barrier = anyio.current_time()
        self.barrier_seen.set()
        self.barrier_seen = anyio.Event()

    async def assign_first(self, barrier: Barrier) -> None:
        """Rule 1: the splits of the first barrier's ``Add``, else of the durable assignment,
        else of the constructor, else the log's; committed offsets win."""
        given = barrier.initial_splits(self.ctx.actor_id)
        starts: dict[str, Offset | None]
        if given is not None:
            starts = {s.split_id: start_of(s) for s in given}
            self.write_assignment(starts)
        elif self.committed_assignment:
            starts = dict(self.committed_assignment)
        elif self.actor._splits is not None:
            starts = {s.split_id: start_of(s) for s in self.actor._splits}
        else:
            starts = dict.fromkeys(await self.actor._log.list_splits())
        await self.check_known(starts)
        self.positions = {s: self.committed.get(s, start) for s, start in starts.items()}

    async def change_splits(self, new: Sequence[Split]) -> None:
        """Rule 5: kept splits keep their positions, new ones start from their offset, dropped
        ones lose their state entry; the assignment is made durable with this barrier."""
        assert self.positions is not None
        starts = {s.split_id: start_of(s) for s in new}
        await self.check_known(starts)
        for split in set(self.positions) - set(starts):
            self.offsets.delete(split)
        self.positions = {s: self.positions.get(s, start) for s, start in starts.items()}
        self.write_assignment(starts)

    async def check_known(self, splits: Mapping[str, object]) -> None:
        """Raises UnknownSplitError for a split the log does not have."""
        if not splits:
            return
        known = await self.actor._log.list_splits()
        missing = sorted(set(splits) - set(known))
        if missing:
            raise UnknownSplitError(missing[0], known)

    def write_assignment(self, starts: Mapping[str, Offset | None]) -> None:
        """Replace the durable assignment with ``starts`` (sealed with the next barrier)."""
        for split in set(self.committed_assignment) - set(starts):
            self.assignment.delete(split)
        for split, start in starts.items():
            self.assignment.put(split, "" if start is None else str(start))
        self.committed_assignment = dict(starts)

    def put_offsets(self) -> None:
        """Rule 2: the last offset emitted of each split, sealed with the next barrier."""
        assert self.positions is not None
        for split, offset in self.positions.items():
            if offset is not None:
                self.offsets.put(split, str(offset))

    # The reader.

    def stop_reader(self) -> None:
        """Cancel the reader; a batch it already handed over is dropped (its generation is
        old), and the next reader starts after the last offset emitted."""
        self.generation += 1
        if self.scope is not None:
            self.scope.cancel()
            self.scope = None

    def start_reader(self) -> None:
        """Start a reader from the positions, unless one runs, the source is paused (by
        ``Pause`` or a rate of 0), or it has no split."""
        if self.scope is not None or self.paused or self.rate == 0 or not self.positions:
            return
        assert self.task_group is not None
        scope = anyio.CancelScope()
        self.scope = scope
        self.task_group.start_soon(
            self.read, scope, self.generation, dict(self.positions), self.rate, self.send.clone()
        )

    async def read(
        self,
        scope: anyio.CancelScope,
        generation: int,
        start: Positions,
        rate: float | None,
        send: MemoryObjectSendStream[_Item],
    ) -> None:
        """Follow the log from ``start``, handing each batch to the loop (rules 4 and 6)."""
        with scope, send:
            reader = self.actor._log.read(start, batch_rows=self.actor._batch_rows)
            async with contextlib.aclosing(reader) as batches:  # type: ignore[type-var]
                async for batch in batches:
                    await self.wait_for_barrier_if_late()
                    await send.send(_Batch(generation, batch))
                    if rate:
                        await anyio.sleep(batch.num_rows / rate)

    async def wait_for_barrier_if_late(self) -> None:
        """Rule 6: too long without a barrier, wait for the next one before emitting more."""
        limit = self.actor._wait_intervals * self.ctx.barrier_interval
        if anyio.current_time() - self.last_barrier < limit:
            return
        self.ctx.log.warning("split source paused itself: no barrier for a while", seconds=limit)
        # A reader that wakes up late (``limit`` past the barrier that woke it) waits again.
        while anyio.current_time() - self.last_barrier >= limit:
            await self.barrier_seen.wait()
