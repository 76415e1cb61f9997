"""The live split source (after RisingWave's ``source_executor.rs``): reads its splits of a
:class:`~barrierflow.actors.sources.split_log.SplitLog` and emits their records as chunks
between the barriers it receives. Its output is shared by every job that reads it (a job added
with ``rt.add_job`` sees the records after its ``Add`` barrier).

Declare it with a factory: ``rt.add_source("events", lambda: SplitSource(log))``.

The rules, each tested by name in ``tests/test_split_source.py`` (rule 10, and the explicit
splits of rule 1, in ``tests/test_split_discovery.py``):

1. **Assignment.** On its first barrier the source takes its splits from the ``Add`` mutation
   (``barrier.initial_splits(actor_id)``) if it names this actor; else from the assignment a
   split change made durable (rule 5); else, *explicit splits*, from the constructor's
   ``splits=`` — or, with neither ``splits=`` nor ``pattern=``, from the log's
   :attr:`~barrierflow.actors.sources.split_log.DeclaredSplits.declared_splits` if it was
   declared with a list (a :class:`~barrierflow.connectors.RedisStreamLog` given ``splits=``);
   else, *discovery*, every split the log lists (that matches ``pattern=``, an
   :func:`fnmatch.fnmatchcase` glob). A ``Split.offset`` int ``n`` means "start after
   ``Offset(n)``" (``-1`` or ``None``: from the first record); the actor's own committed offset
   of the split wins over it. An explicit split the log does not have is
   :class:`~barrierflow.actors.sources.errors.UnknownSplitError` naming it and the log's
   splits (a typo must not read nothing for ever), unless ``wait_for_splits=True``: then it is
   read once it appears (rule 10).
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
10. **Discovery.** A source that discovers (rule 1), or that waits for explicit splits not
    created yet, lists the log at its first barrier and then every ``discover_every`` barriers
    (not at every one: listing a Redis log is a ``SCAN`` of the key space). What the listing
    changes is applied at that barrier as a split change (rule 5): a new split starts from its
    first record — every record it ever had is read, since none was read before — and the
    new assignment is put in ``"assignment"`` before the barrier is passed. A discovering
    source follows the log: a split that is no longer listed (a deleted stream) is dropped
    with its offset. A listing that finds no split to read logs one warning per run, naming
    the pattern and the log, and ``barrierflow_source_splits`` shows 0: a pattern that matches
    nothing must not read nothing in silence. A waiting source only adds the splits it waits
    for. ``Add``'s assignment or a split change by mutation ends discovery for good (the table
    ``"discovery"`` records who wrote the assignment, so a restart keeps it): whoever assigns
    splits by mutation also decides which ones exist, as RisingWave's source manager does.

    *Why the actor discovers, not the runtime.* RisingWave's source manager lists the
    splits and injects a ``SourceChangeSplit`` barrier; barrierflow has no source manager and
    a source is one actor, so the actor does the same at a barrier it receives: the outcome —
    a new split assigned at a barrier, durable with it, read from its first record — is the
    same, and needs no barrier of its own. A job joining the source
    (:class:`~barrierflow.actors.SourceBackfill`) sees such a split in the records
    after the barrier, and adopts it as finished: a split it did not list had no history
    before the live source started it.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import final

import anyio
import pyarrow as pa
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from barrierflow._sync import Notifier
from barrierflow._taskgroups import single_error
from barrierflow.actors.sources._split_positions import (
    Positions,
    check_splits,
    start_of,
)
from barrierflow.actors.sources.errors import UnknownSplitError
from barrierflow.actors.sources.split_log import DeclaredSplits, Offset, SplitLog, split_ends
from barrierflow.actors.sources.split_metrics import SplitMetrics
from barrierflow.actors.sources.split_reader import ReaderBatch, SplitReader
from barrierflow.channels.barrier import Barrier
from barrierflow.channels.chunk import Chunk
from barrierflow.channels.errors import InvalidArgumentError, ProtocolError
from barrierflow.channels.messages import Message
from barrierflow.channels.mutation import Split
from barrierflow.runtime.actor import ActorContext, StreamActor
from barrierflow.runtime.metrics import MetricFamily, gauge
from barrierflow.runtime.state.state_store import StateTable

__all__ = ["SplitSource"]

#: Split → ``str(offset)`` of the last record emitted.
OFFSETS_TABLE = "offsets"
#: Split → start offset text (``""``: the first record), written by split changes.
ASSIGNMENT_TABLE = "assignment"
#: Who wrote the assignment: key :data:`ASSIGNED_BY` → ``"mutation"`` or ``"discovery"``.
DISCOVERY_TABLE = "discovery"
ASSIGNED_BY = "assigned_by"

_WAIT_HINT = "or SplitSource(..., wait_for_splits=True) to read it once it is created"


#: A reader batch, tagged with the reader that read it (older readers' are dropped).
_Batch = ReaderBatch

#: What reaches the actor's loop: a batch, an inbox message, or ``None`` (the inbox ended).
_Item = _Batch | Message | None


@final
class SplitSource(StreamActor):
    """Reads its splits of ``log`` and emits their records between barriers (see the module).

    Args:
        log: the split log.
        splits: explicit splits to read when the ``Add`` barrier assigns none (names, or
            :class:`~barrierflow.channels.mutation.Split` with a start offset); ``None``:
            the log's declared splits if it has any, else discovery of every split the log
            lists (rules 1 and 10).
        pattern: with ``splits=None``, discover only the splits whose name matches this
            :func:`fnmatch.fnmatchcase` glob (``"events-*"``); ``None``: every split.
        wait_for_splits: an explicit split the log does not have yet is read once it appears,
            instead of failing the actor with ``UnknownSplitError``.
        discover_every: list the log every this many barriers while discovering or waiting.
        batch_rows: rows per reader batch (and so per chunk), at most.
        wait_barrier_intervals: barrier intervals without a barrier after which the reader
            pauses itself until the next one.

    Raises:
        InvalidArgumentError: ``log`` is not a SplitLog; ``splits`` is not ``None`` or a list or
            tuple of distinct split names / Splits; ``pattern`` is not ``None`` or a non-empty
            str, or is given with ``splits``; ``wait_for_splits`` is not a bool, or is ``True``
            for a source with no explicit splits; ``discover_every``, ``batch_rows`` or
            ``wait_barrier_intervals`` is not an int >= 1.
    """

    def __init__(
        self,
        log: SplitLog,
        *,
        splits: Sequence[str | Split] | None = None,
        pattern: str | None = None,
        wait_for_splits: bool = False,
        discover_every: int = 3,
        batch_rows: int = 4096,
        wait_barrier_intervals: int = 5,
    ) -> None:
        if not isinstance(log, SplitLog):
            raise InvalidArgumentError("log", "a SplitLog", type(log).__name__)
        for name, value in (
            ("batch_rows", batch_rows),
            ("wait_barrier_intervals", wait_barrier_intervals),
            ("discover_every", discover_every),
        ):
            if type(value) is not int or value < 1:
                raise InvalidArgumentError(name, "an int >= 1", value)
        named = None if splits is None else check_splits(splits)
        if pattern is not None:
            if not isinstance(pattern, str) or not pattern:
                raise InvalidArgumentError("pattern", "None or a non-empty glob", pattern)
            if named is not None:
                raise InvalidArgumentError(
                    "pattern", "None when splits= names the splits (one or the other)", pattern
                )
        declared = log.declared_splits if isinstance(log, DeclaredSplits) else None
        explicit: dict[str, Offset | None] | None = None
        if named is not None:
            explicit = {s.split_id: start_of(s) for s in named}
        elif declared is not None and pattern is None:
            explicit = dict.fromkeys(declared)
        if type(wait_for_splits) is not bool:
            raise InvalidArgumentError("wait_for_splits", "a bool", wait_for_splits)
        if wait_for_splits and explicit is None:
            raise InvalidArgumentError(
                "wait_for_splits",
                "False for a source that discovers its splits (True needs splits= or a log "
                "declared with splits)",
                wait_for_splits,
            )
        self._settings = _Settings(
            log=log,
            explicit=explicit,
            pattern=pattern,
            wait_for_splits=wait_for_splits,
            discover_every=discover_every,
            batch_rows=batch_rows,
            wait_intervals=wait_barrier_intervals,
            metrics=SplitMetrics(log, "source"),
        )
        self._reading: _Reading | None = None

    def output_schema(self) -> pa.Schema:
        """The log's schema (payload, split and offset columns): every chunk has it
        (checked against the readers at start, see :mod:`barrierflow.runtime.startup`)."""
        return self._settings.log.schema

    def metric_families(self) -> list[MetricFamily]:
        """Records read and lag per split (see :mod:`~.split_metrics`), and
        ``barrierflow_source_splits``: how many splits the source reads (from its first
        barrier on) — 0 is what to alert on: a discovery ``pattern=`` (the source's or the
        log's) that matches nothing reads nothing, and the run ends without an error."""
        reading = self._reading
        if reading is None:
            return []
        name = reading.ctx.name
        families = self._settings.metrics.families(name)
        if reading.positions is not None:
            families.append(
                gauge(
                    "barrierflow_source_splits",
                    "splits a split source reads (0: none assigned or found by its listing)",
                    [({"actor": name, "kind": "source"}, len(reading.positions))],
                )
            )
        return families

    async def refresh_metrics(self) -> None:
        """Ask the log how far behind each split's position is."""
        if self._reading is not None and self._reading.positions:
            await self._settings.metrics.refresh(dict(self._reading.positions))

    async def run(self, ctx: ActorContext) -> None:
        """Pass the first barrier with the assignment taken, then read and emit until a Stop
        (see the module).

        Raises:
            UnknownSplitError: an assigned split the log does not have.
            OffsetTrimmedError: a split's records after its offset were trimmed.
            ProtocolError: a chunk arrived in the source's inbox.
        """
        send, receive = anyio.create_memory_object_stream[_Item](0)
        reading = self._reading = _Reading(self._settings, ctx, send)
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
@dataclass(frozen=True, slots=True)
class _Settings:
    """What a split source was built with (see its constructor), handed to each run."""

    log: SplitLog
    #: The explicit splits and their starts (``None``: the source discovers).
    explicit: Mapping[str, Offset | None] | None
    pattern: str | None
    wait_for_splits: bool
    discover_every: int
    batch_rows: int
    wait_intervals: int
    #: Records read and lag per split, which the actor reports.
    metrics: SplitMetrics


@final
class _Reading:
    """One run of a split source: positions, pause/rate settings, discovery, the reader task."""

    def __init__(
        self, settings: _Settings, ctx: ActorContext, send: MemoryObjectSendStream[_Item]
    ) -> None:
        self.settings = settings
        self.ctx = ctx
        self.offsets: StateTable = ctx.table(OFFSETS_TABLE)
        self.assignment: StateTable = ctx.table(ASSIGNMENT_TABLE)
        self.discovery: StateTable = ctx.table(DISCOVERY_TABLE)
        self.committed: dict[str, Offset] = {}
        self.committed_assignment: dict[str, Offset | None] = {}
        #: Whether a mutation assigned the splits (``Add`` or a split change): no discovery.
        self.by_mutation = False
        #: Explicit splits the log does not have yet (``wait_for_splits=True``), with starts.
        self.pending: dict[str, Offset | None] = {}
        self.barriers_since_listing = 0
        #: Whether a listing found no split and said so (once per run).
        self.warned_nothing_found = False
        self.positions: Positions | None = None  # None until the first barrier
        self.paused = False
        self.rate: float | None = None
        self.reader = SplitReader(
            settings.log, settings.batch_rows, send.send, before_send=self.wait_for_barrier_if_late
        )
        self.task_group: TaskGroup | None = None
        self.last_barrier = anyio.current_time()
        self.barrier_passed = Notifier()

    async def restore(self) -> None:
        """Load the committed offsets and assignment, and who wrote the assignment."""
        self.committed = {
            str(k): Offset.parse(str(v)) for k, v in (await self.offsets.items()).items()
        }
        self.committed_assignment = {
            str(k): Offset.parse(str(v)) if v else None
            for k, v in (await self.assignment.items()).items()
        }
        written_by = (await self.discovery.items()).get(ASSIGNED_BY)
        # An assignment from before discovery existed was written by a mutation.
        self.by_mutation = bool(self.committed_assignment) and written_by != "discovery"

    async def loop(self, receive: MemoryObjectReceiveStream[_Item]) -> None:
        """Emit batches of the current reader and handle inbox messages, until a Stop or the
        inbox's end."""
        async for item in receive:
            if item is None:
                return
            if isinstance(item, ReaderBatch):
                if self.reader.is_current(item):
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
        ends = split_ends(batch)
        self.positions.update((split, offset) for split, (offset, _) in ends.items())
        self.settings.metrics.count(ends)

    # Barriers.

    async def on_barrier(self, barrier: Barrier) -> None:
        """Apply the barrier's mutation or what discovery found, put the offsets, pass it on
        (see the module)."""
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
            elif self.discovering() and not barrier.is_stop(actor_id):
                changed = await self.discover_if_due()
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
        self.barrier_passed.notify()

    async def assign_first(self, barrier: Barrier) -> None:
        """Rule 1: the splits of the first barrier's ``Add``, else of an assignment a mutation
        made durable, else the explicit splits, else the log's (discovery); committed offsets
        win."""
        given = barrier.initial_splits(self.ctx.actor_id)
        starts: dict[str, Offset | None]
        if given is not None:
            starts = {s.split_id: start_of(s) for s in given}
            await self.check_known(starts)
            self.write_assignment(starts, by_mutation=True)
        elif self.by_mutation:
            starts = dict(self.committed_assignment)
            await self.check_known(starts)
        else:
            starts = await self.listed_starts(first=True)
        self.positions = {s: self.committed.get(s, start) for s, start in starts.items()}

    async def listed_starts(self, *, first: bool) -> dict[str, Offset | None]:
        """Rules 1 and 10: the splits to read as the log lists them now — the explicit ones
        it has (the others wait, or fail the actor), or every one it lists that matches."""
        self.barriers_since_listing = 0
        known = await self.settings.log.list_splits()
        explicit = self.settings.explicit
        if explicit is not None:
            # Explicit splits are only ever added: once read, a split stays assigned.
            listed = set(known)
            candidates = explicit if first else self.pending
            missing = [s for s in candidates if s not in listed]
            if missing and not self.settings.wait_for_splits:
                raise UnknownSplitError(missing[0], known, _WAIT_HINT)
            self.pending = {s: explicit[s] for s in missing}
            starts = {s: start for s, start in explicit.items() if s not in self.pending}
        else:
            pattern = self.settings.pattern
            starts = {s: None for s in known if pattern is None or fnmatch.fnmatchcase(s, pattern)}
            if not starts:
                self.warn_nothing_found(len(known))
            if first:
                # Following the log: a split it no longer has (a deleted stream) is dropped;
                # if it comes back, it is a new one, read from its first record.
                for split in set(self.committed) - set(starts):
                    self.offsets.delete(split)
                    del self.committed[split]
        # The assignment a listing changed is durable with the barrier (the explicit splits
        # of a source that does not wait never change: nothing to write).
        listing_assigns = explicit is None or self.settings.wait_for_splits
        if listing_assigns and starts != self.committed_assignment:
            self.write_assignment(starts, by_mutation=False)
        return starts

    def warn_nothing_found(self, listed: int) -> None:
        """Rule 10: a discovery listing found no split to read. Warn once per run (not at
        every listing): a pattern that matches nothing — the source's ``pattern=`` or the
        log's — would otherwise read 0 rows and end cleanly, in silence."""
        if self.warned_nothing_found:
            return
        self.warned_nothing_found = True
        self.ctx.log.warning(
            "split source: the log lists no split to read; reading nothing until one appears",
            pattern=self.settings.pattern,
            log=repr(self.settings.log),
            listed=listed,
            discover_every=self.settings.discover_every,
        )

    def discovering(self) -> bool:
        """Whether the source lists the log at barriers: it discovers, or waits for splits."""
        if self.by_mutation:
            return False
        return self.settings.explicit is None or bool(self.pending)

    async def discover_if_due(self) -> bool:
        """Rule 10: every ``discover_every`` barriers, apply what the log's listing changed;
        returns whether the assignment changed (the reader is then rebuilt)."""
        self.barriers_since_listing += 1
        if self.barriers_since_listing < self.settings.discover_every:
            return False
        assert self.positions is not None
        starts = await self.listed_starts(first=False)
        added = sorted(set(starts) - set(self.positions))
        dropped = sorted(set(self.positions) - set(starts))
        if not added and not dropped:
            return False
        for split in dropped:
            self.offsets.delete(split)
        self.positions = {s: self.positions.get(s, start) for s, start in starts.items()}
        self.ctx.log.info("split source: the log's splits changed", added=added, dropped=dropped)
        return True

    async def change_splits(self, new: Sequence[Split]) -> None:
        """Rule 5: kept splits keep their positions, new ones start from their offset, dropped
        ones lose their state entry; the assignment is made durable with this barrier (and
        discovery ends: the mutation's author assigns the splits from now on)."""
        assert self.positions is not None
        starts = {s.split_id: start_of(s) for s in new}
        await self.check_known(starts)
        for split in set(self.positions) - set(starts):
            self.offsets.delete(split)
        self.positions = {s: self.positions.get(s, start) for s, start in starts.items()}
        # ``pending`` (splits still awaited) needs no reset: ``discovering()`` is false from
        # now on, so nothing lists the log or reads it again.
        self.write_assignment(starts, by_mutation=True)

    async def check_known(self, splits: Mapping[str, object]) -> None:
        """Raises UnknownSplitError for a split the log does not have."""
        if not splits:
            return
        known = await self.settings.log.list_splits()
        missing = sorted(set(splits) - set(known))
        if missing:
            raise UnknownSplitError(missing[0], known)

    def write_assignment(self, starts: Mapping[str, Offset | None], *, by_mutation: bool) -> None:
        """Replace the durable assignment with ``starts``, and record who wrote it (both
        sealed with the next barrier)."""
        for split in set(self.committed_assignment) - set(starts):
            self.assignment.delete(split)
        for split, start in starts.items():
            self.assignment.put(split, "" if start is None else str(start))
        self.committed_assignment = dict(starts)
        self.by_mutation = by_mutation
        self.discovery.put(ASSIGNED_BY, "mutation" if by_mutation else "discovery")

    def put_offsets(self) -> None:
        """Rule 2: the last offset emitted of each split, sealed with the next barrier."""
        assert self.positions is not None
        for split, offset in self.positions.items():
            if offset is not None:
                self.offsets.put(split, str(offset))

    # The reader (the mechanism is :class:`~.split_reader.SplitReader`'s).

    @property
    def generation(self) -> int:
        """The current reader's generation: batches tagged with another are dropped."""
        return self.reader.generation

    def stop_reader(self) -> None:
        """Cancel the reader; a batch it already handed over is dropped (its generation is
        old), and the next reader starts after the last offset emitted."""
        self.reader.stop()

    def start_reader(self) -> None:
        """Start a reader from the positions, unless one runs, the source is paused (by
        ``Pause`` or a rate of 0), or it has no split (rule 4: it sleeps ``rows / rate``
        seconds after each batch; rule 6: it waits while barriers are late)."""
        if self.reader.running or self.paused or self.rate == 0 or not self.positions:
            return
        assert self.task_group is not None
        self.reader.start(self.task_group, self.positions, self.rate)

    async def wait_for_barrier_if_late(self) -> None:
        """Rule 6: too long without a barrier, wait for the next one before emitting more."""
        limit = self.settings.wait_intervals * self.ctx.barrier_interval
        if anyio.current_time() - self.last_barrier < limit:
            return
        self.ctx.log.warning("split source paused itself: no barrier for a while", seconds=limit)
        # A reader that wakes up late (``limit`` past the barrier that woke it) waits again.
        while anyio.current_time() - self.last_barrier >= limit:
            await self.barrier_passed.wait()
