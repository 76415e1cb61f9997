"""The coordinator worker: exactly-once commits across the parallel writers of one sink.

After RisingWave's ``coordinator_worker.rs``. One :class:`Coordinator` per sink runs as a
runtime service (``rt.add_service(name, coordinator)``); each parallel sink writer registers
with its vnode bitmap and gets a :class:`WriterHandle`. The rules:

* **Init.** The coordinator first reads its records from the meta store (see *Recovery*), then
  waits until the registered writers' bitmaps cover every vnode — a vnode claimed twice is
  :class:`~barrierflow.errors.DuplicateVnodeError`. It starts the writers with the *rewind
  epoch* (the last epoch acknowledged to writers before a restart). Without one, it collects
  every writer's initial epoch and acknowledges the **maximum** to all.
* **Per epoch.** Commit requests are collected until their bitmaps cover every vnode exactly
  once; only the oldest pending epoch can complete; requests come only from running writers;
  the writers of an epoch must send the same schema change
  (:class:`~barrierflow.errors.SchemaChangeMismatchError` shows both).
* **Single-phase** committers commit at once. **Two-phase** committers pre-commit, the epoch is
  persisted as *pending* (metadata and schema change) in the meta store, the writers are
  acknowledged — a writer passes its checkpoint barrier only after that, so no checkpoint can
  be durable without its pending record — and the commit runs only once the runtime's committed
  epoch has reached the epoch, in epoch order. A failed commit is retried after an exponential
  backoff (10 ms doubling to 60 s, full jitter) while new requests keep being served; a commit
  running long logs a warning every 5 s.
* **Recovery.** Records are read in epoch order: the last *committed*, then a run of *pending*,
  then *aborted* ones. Aborted epochs are aborted in the committer (with their metadata) and
  their records deleted; pending ones are committed once durable; the rewind epoch is the last
  pending (else the last committed). The runtime marks pending epochs after the last durable
  checkpoint aborted before the coordinator starts.
* **Schema change.** New writers are not started while an uncommitted schema change is pending;
  they start once every pending commit has been flushed.
* **Rescaling.** Writers may join, leave (``stop``) or change bitmaps; the coordinator realigns
  until the new set covers every vnode exactly once, then starts them; a commit request during
  realignment is a :class:`~barrierflow.errors.ProtocolError`.
* **Failure.** A coordinator that fails aborts every writer handle with the cause
  (:class:`~barrierflow.errors.CoordinatorAbortedError`), then fails the graph.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, final, runtime_checkable

import anyio
import structlog

from barrierflow._taskgroups import single_error
from barrierflow.actors.sinks.errors import (
    CoordinatorAbortedError,
    DuplicateVnodeError,
    DuplicateWriterError,
    SchemaChangeMismatchError,
)
from barrierflow.actors.sinks.protocol import CommitMetadata
from barrierflow.channels.channel import ReceiveChannel, SendChannel, create_channel
from barrierflow.channels.errors import (
    BarrierflowError,
    EpochOrderError,
    InvalidArgumentError,
    ProtocolError,
)
from barrierflow.channels.vnode import DEFAULT_VNODE_COUNT, VnodeBitmap
from barrierflow.runtime.errors import ActorGoneError
from barrierflow.runtime.service import ServiceContext
from barrierflow.runtime.state.sink_states import SinkState, SinkStates

__all__ = ["CommitCoordinator", "Coordinator", "CoordinatorStats", "SchemaChange", "WriterHandle"]

#: A schema change carried by a commit request (JSON-serializable, compared for equality).
SchemaChange = Mapping[str, Any]


@runtime_checkable
class CommitCoordinator(Protocol):
    """The sink side of a coordinator: turns the writers' metadata into one commit per epoch.

    Lifecycle: ``abort`` for each aborted epoch found at recovery, then ``init`` once, then per
    epoch either ``commit_data`` (single-phase) or ``pre_commit`` and later ``commit``
    (two-phase), in epoch order. ``commit`` may be called again for the same epoch after a
    failure or a crash, so it must be idempotent.
    """

    @property
    def two_phase(self) -> bool:
        """Whether commits wait for the epoch's checkpoint to be durable."""
        ...

    async def init(self, pending: Mapping[int, CommitMetadata | None]) -> None:
        """Prepare (load the table, ...) once per coordinator run, after aborting the aborted
        epochs. ``pending`` maps the epochs that will still be committed to their metadata:
        anything staged that none of them references is garbage of epochs that never reached
        the meta store, and may be deleted."""
        ...

    async def commit_data(self, epoch: int, metadatas: Sequence[CommitMetadata]) -> None:
        """Single-phase: commit every writer's metadata of ``epoch`` now."""
        ...

    async def pre_commit(
        self, epoch: int, metadatas: Sequence[CommitMetadata], schema_change: SchemaChange | None
    ) -> CommitMetadata | None:
        """Two-phase, phase 1: what to persist for ``epoch`` (``None``: nothing to commit)."""
        ...

    async def commit(
        self, epoch: int, metadata: CommitMetadata | None, schema_change: SchemaChange | None
    ) -> None:
        """Phase 2 (or a single-phase schema change): publish ``epoch``. Idempotent."""
        ...

    async def abort(self, epoch: int, metadata: CommitMetadata | None) -> None:
        """Discard what ``epoch`` staged (its rows will be replayed). Errors are logged."""
        ...


@final
@dataclass(frozen=True, slots=True)
class CoordinatorStats:
    """A snapshot of a coordinator's counters."""

    #: Writers registered and running now.
    writers: int
    running: int
    #: Epochs acknowledged to writers, and committed by the committer.
    acked_epochs: int
    committed_epochs: int
    #: The last epoch acknowledged to writers / committed (0 before the first).
    last_acked_epoch: int
    last_committed_epoch: int
    #: Failed commit attempts, and the backoff delays waited after them (seconds).
    commit_failures: int
    retry_delays: tuple[float, ...]
    #: Epochs aborted at recovery.
    aborted_epochs: tuple[int, ...]


class _Future:
    """A one-shot answer to a writer (a value or an error)."""

    __slots__ = ("_done", "_error", "_value")

    def __init__(self) -> None:
        self._done = anyio.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    def set(self, value: Any = None) -> None:
        if not self._done.is_set():
            self._value = value
            self._done.set()

    def fail(self, error: BaseException) -> None:
        if not self._done.is_set():
            self._error = error
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    async def get(self) -> Any:
        await self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value


# Events of the coordinator's inbox.
@dataclass(slots=True)
class _NewHandle:
    handle: WriterHandle


@dataclass(slots=True)
class _UpdateBitmap:
    handle: WriterHandle
    bitmap: VnodeBitmap


@dataclass(slots=True)
class _StopHandle:
    handle: WriterHandle


@dataclass(slots=True)
class _Commit:
    handle: WriterHandle
    epoch: int
    metadata: CommitMetadata
    schema_change: SchemaChange | None
    reply: _Future


@dataclass(slots=True)
class _AlignInitial:
    handle: WriterHandle
    epoch: int
    reply: _Future


@dataclass(slots=True)
class _CommittedEpoch:
    epoch: int


_Event = _NewHandle | _UpdateBitmap | _StopHandle | _Commit | _AlignInitial | _CommittedEpoch


@final
class WriterHandle:
    """A parallel sink writer's line to its coordinator. Create with
    :meth:`Coordinator.register`.

    Order of use: :meth:`wait_started` (which returns the rewind epoch), then — if that was
    ``None`` — :meth:`align_initial_epoch` once; then :meth:`commit` per checkpoint, in
    increasing epochs. After :meth:`update_vnode_bitmap`, wait to be started again. Every
    method raises :class:`~barrierflow.errors.CoordinatorAbortedError` once the coordinator
    failed.
    """

    def __init__(
        self,
        coordinator: Coordinator,
        handle_id: int,
        bitmap: VnodeBitmap,
        writer: str | None = None,
        name: str | None = None,
    ) -> None:
        self._coordinator = coordinator
        self.handle_id = handle_id
        self.bitmap = bitmap
        #: The writer id its connector stages under (unique per sink), if it has one.
        self.writer = writer
        #: Who registered (the writer actor's name), for messages.
        self.name = name or f"writer {handle_id}"
        self._started = _Future()
        self._aborted: BaseException | None = None
        self._stopped = False

    async def _post(self, event: _Event) -> None:
        if self._aborted is not None:
            raise self._aborted
        if self._stopped:
            raise ActorGoneError(self._coordinator.sink, "this writer handle was stopped")
        await self._coordinator._post(event)

    async def _answer(self, future: _Future) -> Any:
        return await future.get()

    async def wait_started(self) -> int | None:
        """Wait until the coordinator starts this writer; returns the rewind epoch (the last
        epoch acknowledged before a restart), or ``None`` for a fresh start."""
        if self._aborted is not None:
            raise self._aborted  # even if it was started before the coordinator failed
        rewind: int | None = await self._answer(self._started)
        return rewind

    async def align_initial_epoch(self, epoch: int) -> int:
        """Send this writer's initial epoch; returns the one aligned across all writers."""
        _check_epoch(epoch)
        reply = _Future()
        await self._post(_AlignInitial(self, epoch, reply))
        aligned: int = await self._answer(reply)
        return aligned

    async def commit(
        self,
        epoch: int,
        metadata: CommitMetadata,
        schema_change: SchemaChange | None = None,
    ) -> None:
        """Send this writer's metadata of ``epoch`` and wait for the acknowledgement (sent once
        every vnode's writer sent theirs and the epoch is persisted or committed).

        Raises:
            InvalidArgumentError: a bad epoch, empty metadata or a schema change that is not a
                mapping.
        """
        _check_epoch(epoch)
        if not isinstance(metadata, Mapping) or not metadata:
            raise InvalidArgumentError("metadata", "a non-empty mapping", metadata)
        if schema_change is not None and not isinstance(schema_change, Mapping):
            raise InvalidArgumentError("schema_change", "None or a mapping", schema_change)
        reply = _Future()
        await self._post(_Commit(self, epoch, metadata, schema_change, reply))
        await self._answer(reply)

    async def update_vnode_bitmap(self, bitmap: VnodeBitmap) -> None:
        """Change this writer's vnodes (rescaling); then :meth:`wait_started` again."""
        self._coordinator._check_bitmap(bitmap)
        self._started = _Future()
        await self._post(_UpdateBitmap(self, bitmap))

    async def stop(self) -> None:
        """Leave: the coordinator realigns the remaining writers."""
        if self._stopped or self._aborted is not None:
            return
        await self._post(_StopHandle(self))
        self._stopped = True

    def _abort(self, error: BaseException) -> None:
        self._aborted = error
        self._started.fail(error)


def _ranges(vnodes: Sequence[int]) -> str:
    """``[0, 1, 2, 7]`` as ``"0-2, 7"`` (the first 16 runs)."""
    runs: list[str] = []
    start = previous = None
    for vnode in [*vnodes, None]:
        if vnode is not None and previous is not None and vnode == previous + 1:
            previous = vnode
            continue
        if start is not None:
            runs.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = vnode
    more = f", ... ({len(runs) - 16} more runs)" if len(runs) > 16 else ""
    return ", ".join(runs[:16]) + more


def _check_epoch(epoch: Any) -> None:
    if type(epoch) is not int or epoch < 0:
        raise InvalidArgumentError("epoch", "a non-negative int", epoch)


class _Aligning:
    """Requests of one round (init, an epoch, a realignment) until every vnode is covered."""

    def __init__(self, sink: str, vnode_count: int, stage: str) -> None:
        self.sink = sink
        self.stage = stage
        self.covered = VnodeBitmap.empty(vnode_count)
        self.requests: list[Any] = []
        self.handles: list[WriterHandle] = []

    def add(self, handle: WriterHandle, request: Any) -> None:
        overlap = self.covered & handle.bitmap
        if overlap.count():
            raise DuplicateVnodeError(self.sink, overlap.vnodes(), self.stage)
        self.covered = self.covered | handle.bitmap
        self.requests.append(request)
        self.handles.append(handle)

    @property
    def aligned(self) -> bool:
        return self.covered.is_full()


@dataclass
class _Item:
    epoch: int
    metadata: CommitMetadata | None
    schema_change: SchemaChange | None


@dataclass
class _TwoPhase:
    """Epochs waiting for durability (``pending``) and for their commit (``prepared``)."""

    states: SinkStates
    committed_epoch: int
    last_committed: int
    pending: deque[_Item] = field(default_factory=deque)
    prepared: deque[_Item] = field(default_factory=deque)
    retry_at: float | None = None
    retries: int = 0

    def push(self, item: _Item) -> None:
        if item.epoch > self.committed_epoch:
            self.pending.append(item)
        else:
            self.prepared.append(item)

    def on_committed_epoch(self, epoch: int) -> None:
        self.committed_epoch = max(self.committed_epoch, epoch)
        while self.pending and self.pending[0].epoch <= self.committed_epoch:
            self.prepared.append(self.pending.popleft())

    def due(self, now: float) -> _Item | None:
        if not self.prepared or (self.retry_at is not None and now < self.retry_at):
            return None
        return self.prepared[0]

    def deadline(self) -> float:
        if not self.prepared:
            return math.inf
        return -math.inf if self.retry_at is None else self.retry_at

    def is_empty(self) -> bool:
        return not self.pending and not self.prepared

    def has_uncommitted_schema_change(self) -> bool:
        return any(item.schema_change is not None for item in (*self.prepared, *self.pending))


@final
class Coordinator:
    """The coordinator worker of one sink (see the module docstring). A runtime service.

    Args:
        sink: the sink's name (also its key in the meta store).
        committer: the sink side that commits.
        vnode_count: vnodes the writers' bitmaps partition.
        base_delay, max_delay: the retry backoff (doubling, full jitter).
        warn_interval: seconds between warnings while one commit runs.
        rng: the jitter's random source (a test may pass a seeded one).
    """

    def __init__(
        self,
        sink: str,
        committer: CommitCoordinator,
        *,
        vnode_count: int = DEFAULT_VNODE_COUNT,
        base_delay: float = 0.01,
        max_delay: float = 60.0,
        warn_interval: float = 5.0,
        rng: random.Random | None = None,
    ) -> None:
        if not isinstance(sink, str) or not sink:
            raise InvalidArgumentError("sink", "a non-empty str", sink)
        if not isinstance(committer, CommitCoordinator):
            raise InvalidArgumentError("committer", "a CommitCoordinator", committer)
        for name, value in (
            ("base_delay", base_delay),
            ("max_delay", max_delay),
            ("warn_interval", warn_interval),
        ):
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not 0 < value < math.inf
            ):
                raise InvalidArgumentError(name, "a positive finite number of seconds", value)
        if type(vnode_count) is not int or not 1 <= vnode_count <= 1 << 15:
            raise InvalidArgumentError("vnode_count", "an int in 1..32768", vnode_count)
        if rng is not None and not isinstance(rng, random.Random):
            raise InvalidArgumentError("rng", "None or a random.Random", rng)
        self.sink = sink
        self._committer = committer
        self._vnode_count = vnode_count
        self._base_delay = float(base_delay)
        self._max_delay = float(max_delay)
        self._warn_interval = float(warn_interval)
        self._rng = rng or random.Random()
        self._log = structlog.get_logger("barrierflow.coordinator").bind(sink=sink)
        self._ready: anyio.Event | None = None  # created on first use, in async context
        self._inbox: SendChannel[_Event] | None = None
        self._next_id = 0
        self._reset_run_state()

    @property
    def vnode_count(self) -> int:
        """Vnodes the writers' bitmaps partition."""
        return self._vnode_count

    @property
    def committer(self) -> CommitCoordinator:
        """The sink side that commits."""
        return self._committer

    def _reset_run_state(self) -> None:
        self._handles: dict[int, WriterHandle] = {}
        self._running: set[int] = set()
        self._last_acked: int | None = None
        self._acked = 0
        self._committed = 0
        self._last_committed = 0
        self._failures = 0
        self._delays: list[float] = []
        self._aborted: list[int] = []
        self._open_replies: set[_Future] = set()
        self._progress: anyio.Event | None = None
        self._state_waiting: set[int] | None = None  # writers waiting for a flushed schema change
        self._two_phase: _TwoPhase | None = None
        self._unmarked_commits: list[int] = []  # committed, mark not written yet

    # The writers' side.

    def _check_bitmap(self, bitmap: Any) -> None:
        if not isinstance(bitmap, VnodeBitmap):
            raise InvalidArgumentError("bitmap", "a VnodeBitmap", type(bitmap).__name__)
        if bitmap.vnode_count != self._vnode_count:
            raise InvalidArgumentError(
                "bitmap", f"a bitmap of {self._vnode_count} vnodes", f"{bitmap.vnode_count} vnodes"
            )
        if not bitmap.count():
            raise InvalidArgumentError("bitmap", "a bitmap with at least one vnode", bitmap)

    async def register(
        self, bitmap: VnodeBitmap, *, writer: str | None = None, name: str | None = None
    ) -> WriterHandle:
        """Register a writer owning ``bitmap``; waits until the coordinator runs.

        Args:
            bitmap: the vnodes the writer owns.
            writer: the writer id its connector stages files under; two running writers of
                one sink with the same id would overwrite each other's files, so the
                coordinator fails with :class:`~barrierflow.errors.DuplicateWriterError`.
            name: who registers (the writer actor's name), for logs and errors.

        Raises:
            InvalidArgumentError: the bitmap is not a non-empty bitmap of ``vnode_count``
                vnodes, or ``writer``/``name`` is not ``None`` or a non-empty str.
        """
        self._check_bitmap(bitmap)
        for argument, value in (("writer", writer), ("name", name)):
            if value is not None and (not isinstance(value, str) or not value):
                raise InvalidArgumentError(argument, "None or a non-empty str", value)
        self._next_id += 1
        handle = WriterHandle(self, self._next_id, bitmap, writer, name)
        await self._post(_NewHandle(handle))
        return handle

    async def _post(self, event: _Event) -> None:
        while self._inbox is None:
            if self._ready is None:
                self._ready = anyio.Event()
            await self._ready.wait()
        try:
            await self._inbox.send(event)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
            raise ActorGoneError(self.sink, "its coordinator stopped") from exc

    def is_committed(self, epoch: int) -> bool:
        """Whether every epoch up to ``epoch`` was acknowledged and committed in this run."""
        if self._last_acked is None or epoch > self._last_acked:
            return False
        two_phase = self._two_phase
        if two_phase is None:
            return False
        return not any(item.epoch <= epoch for item in (*two_phase.prepared, *two_phase.pending))

    async def wait_committed(self, epoch: int) -> None:
        """Wait until every epoch up to ``epoch`` is committed (what a writer waits for before
        it leaves at a graceful stop, so the last epoch is visible when the runtime stops)."""
        while not self.is_committed(epoch):
            if self._progress is None:
                self._progress = anyio.Event()
            await self._progress.wait()

    def _made_progress(self) -> None:
        progress, self._progress = self._progress, None
        if progress is not None:
            progress.set()

    def stats(self) -> CoordinatorStats:
        """A snapshot of the counters of the current run."""
        return CoordinatorStats(
            writers=len(self._handles),
            running=len(self._running),
            acked_epochs=self._acked,
            committed_epochs=self._committed,
            last_acked_epoch=self._last_acked or 0,
            last_committed_epoch=self._last_committed,
            commit_failures=self._failures,
            retry_delays=tuple(self._delays),
            aborted_epochs=tuple(self._aborted),
        )

    # The service.

    async def run(self, ctx: ServiceContext) -> None:
        """Coordinate until cancelled; on failure abort every writer handle, then raise."""
        self._reset_run_state()
        send, receive = create_channel[_Event](1024, name=f"{self.sink} coordinator")
        self._inbox = send
        if self._ready is None:
            self._ready = anyio.Event()
        self._ready.set()
        self._ready = None  # the next run makes a fresh one
        try:
            with single_error():
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._follow_committed_epochs, ctx, send.clone())
                    await self._coordinate(ctx, receive)
        except BaseException as exc:
            cause = exc if isinstance(exc, Exception) else ActorGoneError(self.sink, "cancelled")
            error = CoordinatorAbortedError(self.sink, cause)
            self._drain(receive)
            for handle in self._handles.values():
                handle._abort(error)
            self._fail_pending(error)
            raise
        finally:
            self._inbox = None
            send.close()
            await self._mark_committed()
            receive.close()

    async def _follow_committed_epochs(
        self, ctx: ServiceContext, send: SendChannel[_Event]
    ) -> None:
        with send:
            async for epoch in ctx.committed_epochs():
                await send.send(_CommittedEpoch(epoch))

    def _drain(self, inbox: ReceiveChannel[_Event]) -> None:
        """Take the events still queued (a failed run will never serve them), so that their
        writers are aborted too: a registration in flight, a request posted meanwhile."""
        while True:
            try:
                event = inbox.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream):
                return
            self._track(event)
            handle = getattr(event, "handle", None)
            if handle is not None:
                self._handles.setdefault(handle.handle_id, handle)

    def _track(self, event: _Event) -> None:
        """Remember a writer's request until answered: a run that fails fails it."""
        reply = getattr(event, "reply", None)
        if reply is not None and not reply.done:
            self._open_replies.add(reply)

    def _fail_pending(self, error: BaseException) -> None:
        for future in self._open_replies:
            future.fail(error)
        self._open_replies.clear()

    def _answer(self, reply: _Future, value: Any = None) -> None:
        reply.set(value)
        self._open_replies.discard(reply)

    async def _coordinate(self, ctx: ServiceContext, inbox: ReceiveChannel[_Event]) -> None:
        self._inbox_rx = inbox
        states = ctx.store.sink_states(self.sink)
        two_phase = await self._recover(ctx, states)
        self._two_phase = two_phase
        await self._committer.init(
            {item.epoch: item.metadata for item in (*two_phase.prepared, *two_phase.pending)}
        )
        running = await self._wait_init_handles()
        await self._try_start(running)
        epochs: dict[int, _Aligning] = {}
        new_handles: list[WriterHandle] = []
        while True:
            if self._state_waiting is not None and two_phase.is_empty():
                waiting, self._state_waiting = self._state_waiting, None
                await self._start(waiting)
            item = two_phase.due(anyio.current_time())
            if item is not None:
                await self._commit_prepared(item)
                continue
            event = await self._next_event(two_phase.deadline())
            if event is None:
                continue  # a retry is due
            if isinstance(event, _NewHandle):
                new_handles.append(event.handle)
            elif isinstance(event, _UpdateBitmap):
                event.handle.bitmap = event.bitmap
                running = await self._realign([*new_handles, event.handle])
                new_handles = []
                await self._try_start(running)
            elif isinstance(event, _StopHandle):
                self._remove(event.handle)
                running = await self._realign(new_handles)
                new_handles = []
                await self._try_start(running)
            elif isinstance(event, _AlignInitial):
                raise ProtocolError(
                    f"sink {self.sink!r}: expected AlignInitialEpoch only during init, got one "
                    f"from writer {event.handle.handle_id} for epoch {event.epoch}"
                )
            elif isinstance(event, _Commit):
                await self._on_commit_request(event, epochs)

    async def _next_event(self, deadline: float) -> _Event | None:
        """The next writer event; committed epochs are absorbed on the way. ``None`` once the
        deadline (a due retry) passed."""
        while True:
            event: _Event | None = None
            with anyio.move_on_after(deadline - anyio.current_time()):
                event = await self._inbox_rx.receive()
            if event is None:
                return None
            if isinstance(event, _CommittedEpoch):
                assert self._two_phase is not None
                self._two_phase.on_committed_epoch(event.epoch)
                return None  # re-evaluate what is due
            self._track(event)
            return event

    # Recovery and init.

    async def _recover(self, ctx: ServiceContext, states: SinkStates) -> _TwoPhase:
        records = await states.list()
        index = 0
        last_committed: int | None = None
        committed = [i for i, r in enumerate(records) if r.state is SinkState.COMMITTED]
        if committed:
            # Commits run in epoch order, so a committed mark covers every record before it:
            # pending ones there were committed too, only their marks were never written (a
            # mark rides on the next pending record; epochs committed back to back leave all
            # but the last unmarked).
            index = committed[-1] + 1
            last_committed = records[index - 1].epoch
            stale = [r.epoch for r in records[: index - 1]]
            if any(records[i].state is SinkState.ABORTED for i in range(index - 1)):
                raise ProtocolError(
                    f"sink {self.sink!r}: expected no aborted record before the committed epoch "
                    f"{last_committed}, got {[(r.epoch, r.state.value) for r in records]}"
                )
            await states.delete(stale)
        pending: list[_Item] = []
        while index < len(records) and records[index].state is SinkState.PENDING:
            r = records[index]
            pending.append(_Item(r.epoch, r.metadata, r.schema_change))
            index += 1
        aborted: list[int] = []
        for record in records[index:]:
            if record.state is not SinkState.ABORTED:
                raise ProtocolError(
                    f"sink {self.sink!r}: expected only aborted records after the pending ones, "
                    f"got {record.state.value} epoch {record.epoch}"
                )
            try:
                await self._committer.abort(record.epoch, record.metadata)
            except Exception as exc:
                self._log.warning("abort failed", epoch=record.epoch, error=repr(exc))
            aborted.append(record.epoch)
        await states.delete(aborted)
        self._aborted = aborted
        self._last_acked = pending[-1].epoch if pending else last_committed
        self._last_committed = last_committed or 0
        two_phase = _TwoPhase(states, ctx.committed_epoch, last_committed or 0)
        for item in pending:
            two_phase.push(item)
        return two_phase

    async def _wait_init_handles(self) -> set[int]:
        round_ = _Aligning(self.sink, self._vnode_count, "registration")
        while not round_.aligned:
            event = await self._next_registration_event(round_)
            if not isinstance(event, _NewHandle):
                raise ProtocolError(
                    f"sink {self.sink!r}: expected writers to register during init, got "
                    f"{type(event).__name__.strip('_')}"
                )
            self._admit(event.handle)
            round_.add(event.handle, None)
        return {h.handle_id for h in round_.handles}

    def _admit(self, handle: WriterHandle) -> None:
        """Add a registered writer; its writer id must not be another running writer's."""
        if handle.writer is not None:
            for other in self._handles.values():
                if other is not handle and other.writer == handle.writer:
                    raise DuplicateWriterError(self.sink, handle.writer, other.name, handle.name)
        self._handles[handle.handle_id] = handle

    async def _next_registration_event(self, round_: _Aligning) -> _Event:
        """The next writer event of a registration round; while vnodes stay uncovered, log
        every ``warn_interval`` seconds which are missing and who registered — a writer that
        never comes (a missing parallel writer, a hash fan-out shared with other actors)
        would otherwise be a silent hang."""
        while True:
            deadline = anyio.current_time() + self._warn_interval
            while anyio.current_time() < deadline:
                event = await self._next_event(deadline)
                if event is not None:
                    return event
            missing = (VnodeBitmap.full(self._vnode_count) - round_.covered).vnodes()
            self._log.warning(
                "waiting for writers to cover every vnode",
                stage=round_.stage,
                uncovered=_ranges(missing),
                uncovered_count=len(missing),
                registered=[f"{h.name} ({h.bitmap.count()} vnodes)" for h in round_.handles],
            )

    async def _realign(self, altered: list[WriterHandle]) -> set[int]:
        round_ = _Aligning(self.sink, self._vnode_count, "realignment")
        for handle in altered:
            self._admit(handle)
            round_.add(handle, None)
        remaining = {i for i in self._handles if i not in {h.handle_id for h in altered}}
        self._running.clear()
        while remaining or not round_.aligned:
            event = await self._next_registration_event(round_)
            if isinstance(event, _NewHandle):
                self._admit(event.handle)
                round_.add(event.handle, None)
            elif isinstance(event, _UpdateBitmap):
                remaining.discard(event.handle.handle_id)
                event.handle.bitmap = event.bitmap
                round_.add(event.handle, None)
            elif isinstance(event, _StopHandle):
                remaining.discard(event.handle.handle_id)
                self._remove(event.handle)
            elif isinstance(event, _Commit):
                error = ProtocolError(
                    f"sink {self.sink!r}: expected no commit request during realignment, got "
                    f"epoch {event.epoch} from writer {event.handle.handle_id}"
                )
                event.reply.fail(error)
                raise error
            else:
                raise ProtocolError(
                    f"sink {self.sink!r}: expected no AlignInitialEpoch during realignment"
                )
        return {h.handle_id for h in round_.handles}

    def _remove(self, handle: WriterHandle) -> None:
        self._handles.pop(handle.handle_id, None)
        self._running.discard(handle.handle_id)

    async def _try_start(self, handles: set[int]) -> None:
        assert self._two_phase is not None
        if self._two_phase.has_uncommitted_schema_change():
            # New writers must load the new schema: wait until every pending commit flushed.
            self._state_waiting = set(handles)
        else:
            await self._start(handles)

    async def _start(self, handles: set[int]) -> None:
        rewind = self._last_acked
        for handle_id in handles:
            handle = self._handles.get(handle_id)
            if handle is None:
                raise ProtocolError(f"sink {self.sink!r}: writer {handle_id} vanished before start")
            handle._started.set(rewind)
            self._running.add(handle_id)
        if rewind is not None:
            return
        round_ = _Aligning(self.sink, self._vnode_count, "initial epoch alignment")
        while not round_.aligned:
            event = await self._next_registration_event(round_)
            if not isinstance(event, _AlignInitial):
                raise ProtocolError(
                    f"sink {self.sink!r}: expected AlignInitialEpoch from every writer, got "
                    f"{type(event).__name__.strip('_')}"
                )
            self._open_replies.add(event.reply)
            round_.add(event.handle, event)
        aligned = max(request.epoch for request in round_.requests)
        for request in round_.requests:
            self._answer(request.reply, aligned)

    # Per epoch.

    async def _on_commit_request(self, event: _Commit, epochs: dict[int, _Aligning]) -> None:
        handle_id = event.handle.handle_id
        if handle_id not in self._running:
            error: BarrierflowError = ProtocolError(
                f"sink {self.sink!r}: expected commit requests from running writers "
                f"{sorted(self._running)}, got one from writer {handle_id} (epoch {event.epoch})"
            )
            event.reply.fail(error)
            raise error
        if self._last_acked is not None and event.epoch <= self._last_acked:
            error = EpochOrderError(
                f"commit epoch of writer {handle_id}", self._last_acked, event.epoch
            )
            event.reply.fail(error)
            raise error
        round_ = epochs.get(event.epoch)
        if round_ is None:
            round_ = epochs[event.epoch] = _Aligning(
                self.sink, self._vnode_count, f"epoch {event.epoch}"
            )
        self._open_replies.add(event.reply)
        round_.add(event.handle, event)
        # Only the oldest epoch may complete; a newer one that is complete waits its turn.
        while epochs and epochs[min(epochs)].aligned:
            oldest = min(epochs)
            await self._complete_epoch(oldest, epochs.pop(oldest).requests)

    async def _complete_epoch(self, oldest: int, requests: list[_Commit]) -> None:
        change = requests[0].schema_change
        for request in requests[1:]:
            if request.schema_change != change:
                raise SchemaChangeMismatchError(self.sink, oldest, change, request.schema_change)
        metadatas = [request.metadata for request in requests]
        assert self._two_phase is not None
        if not self._committer.two_phase:
            await self._with_warnings(oldest, self._committer.commit_data(oldest, metadatas))
            self._committed += 1
            self._last_committed = oldest
            if change is not None:
                await self._persist_pending(oldest, None, change)
                self._two_phase.push(_Item(oldest, None, change))
        else:
            metadata = await self._committer.pre_commit(oldest, metadatas, change)
            if metadata is not None or change is not None:
                await self._persist_pending(oldest, metadata, change)
                self._two_phase.push(_Item(oldest, metadata, change))
        for request in requests:
            self._answer(request.reply)
        self._acked += 1
        self._last_acked = oldest
        self._made_progress()

    async def _commit_prepared(self, item: _Item) -> None:
        two_phase = self._two_phase
        assert two_phase is not None
        try:
            await self._with_warnings(
                item.epoch, self._committer.commit(item.epoch, item.metadata, item.schema_change)
            )
        except Exception as exc:
            self._failures += 1
            delay = min(self._max_delay, self._base_delay * 2**two_phase.retries)
            jittered = delay * self._rng.random()  # full jitter, as the seed's backoff
            two_phase.retries += 1
            two_phase.retry_at = anyio.current_time() + jittered
            self._delays.append(jittered)
            self._log.error(
                "commit failed; retrying after backoff",
                epoch=item.epoch,
                error=repr(exc),
                backoff_s=round(jittered, 4),
            )
            return
        two_phase.prepared.popleft()
        two_phase.retry_at = None
        two_phase.retries = 0
        # The committed mark rides on the next pending record's transaction (one fsync per
        # epoch, not two). A mark lost in a crash only makes recovery commit the epoch again,
        # which every committer skips (commits are idempotent).
        self._unmarked_commits.append(item.epoch)
        two_phase.last_committed = item.epoch
        self._committed += 1
        self._last_committed = item.epoch
        self._made_progress()

    async def _persist_pending(
        self, epoch: int, metadata: CommitMetadata | None, change: SchemaChange | None
    ) -> None:
        assert self._two_phase is not None
        marks, self._unmarked_commits = self._unmarked_commits, []
        states = self._two_phase.states
        await states.persist_pending(
            epoch, metadata, change, committed=marks[-1] if marks else None
        )
        await self._delete_covered(states, marks)

    async def _delete_covered(self, states: SinkStates, marks: list[int]) -> None:
        """Epochs committed back to back get one mark, the last one's (pruning only deletes
        *committed* records): delete the records of the others, which it covers."""
        if len(marks) > 1:
            await states.delete(marks[:-1])

    async def _mark_committed(self) -> None:
        """Write a committed mark that no pending record carried yet (at the end of a run)."""
        marks, self._unmarked_commits = self._unmarked_commits, []
        if marks and self._two_phase is not None:
            with anyio.move_on_after(2, shield=True):
                await self._two_phase.states.commit_and_prune(marks[-1])
                await self._delete_covered(self._two_phase.states, marks)

    async def _with_warnings(self, epoch: int, commit: Any) -> None:
        started = anyio.current_time()

        async def warn() -> None:
            while True:
                await anyio.sleep(self._warn_interval)
                self._log.warning(
                    "commit still running", epoch=epoch, elapsed_s=anyio.current_time() - started
                )

        error: Exception | None = None
        with single_error():
            async with anyio.create_task_group() as tg:
                tg.start_soon(warn)
                try:
                    await commit
                except Exception as exc:
                    # Raised below, as itself: inside the group it would be wrapped, and
                    # grouped with a cancellation of the run arriving meanwhile.
                    error = exc
                finally:
                    tg.cancel_scope.cancel()
        if error is not None:
            raise error
