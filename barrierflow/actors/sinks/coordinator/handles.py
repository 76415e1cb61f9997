"""What writers hold: a :class:`WriterHandle` per registered writer, and the requests it sends
its coordinator through the runtime's command-actor mechanism
(:class:`~barrierflow.runtime.command.ActorRef`): ``tell`` for registrations, bitmap updates
and stops, ``ask`` for the requests a writer waits on (a commit, the initial epoch).

A request that is asked carries the :class:`~barrierflow._sync.OneShot` of its answer: the
coordinator attaches the one ``ask`` sent with it when it takes the request (see
:func:`take`), so a coverage round that answers it later holds it with the
request. A writer's commit request carries its
:class:`~barrierflow.actors.sinks.table.Manifest`, and the batches staged outside the graph
that reached it within the epoch (:mod:`barrierflow.actors.sinks.committables`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, final

from barrierflow._sync import OneShot
from barrierflow.actors.sinks.committables import StagedBatch
from barrierflow.actors.sinks.errors import DuplicateWriterError
from barrierflow.actors.sinks.table import Manifest
from barrierflow.channels.epoch import check_epoch
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.channels.vnode import VnodeBitmap
from barrierflow.runtime.errors import ActorGoneError

__all__ = ["WriterHandle", "WriterRegistry"]


# Events of the coordinator's inbox.
@dataclass(slots=True)
class NewHandle:
    handle: WriterHandle


@dataclass(slots=True)
class UpdateBitmap:
    handle: WriterHandle
    bitmap: VnodeBitmap


@dataclass(slots=True)
class StopHandle:
    handle: WriterHandle


@dataclass(slots=True)
class Commit:
    handle: WriterHandle
    epoch: int
    manifest: Manifest
    #: Batches staged outside the graph whose committables reached the writer in the epoch.
    staged: tuple[StagedBatch, ...] = ()
    reply: OneShot[None] = field(default_factory=OneShot)


@dataclass(slots=True)
class AlignInitial:
    handle: WriterHandle
    epoch: int
    reply: OneShot[int] = field(default_factory=OneShot)


@dataclass(slots=True)
class CommittedEpoch:
    epoch: int


Event = NewHandle | UpdateBitmap | StopHandle | Commit | AlignInitial | CommittedEpoch

#: What the coordinator's inbox holds: an event and, if it was asked, the reply its asker awaits.
Inbound = tuple[Event, OneShot[Any] | None]


def take(event: Event, reply: OneShot[Any] | None) -> Event:
    """``event`` as the coordinator takes it from its inbox: a request that was asked gets the
    reply its asker waits on (a told one keeps the reply nobody waits on)."""
    if reply is not None and isinstance(event, Commit | AlignInitial):
        event.reply = reply
    return event


def event_name(event: Event) -> str:
    """The request's name in errors (``"Commit"``, ``"AlignInitial"``, ...)."""
    return type(event).__name__


class CoordinatorLine(Protocol):
    """The coordinator as its writer handles reach it (a
    :class:`~barrierflow.actors.Coordinator`)."""

    @property
    def sink(self) -> str:
        """The sink's name, for messages."""
        ...

    def check_bitmap(self, bitmap: Any) -> None:
        """Refuse a bitmap the coordinator cannot use.

        Raises:
            InvalidArgumentError: not a non-empty bitmap of the coordinator's vnode count.
        """
        ...

    async def tell(self, event: Event) -> None:
        """Queue a writer's event for the coordinator's run without waiting for an answer.

        Raises:
            ActorGoneError: the coordinator stopped.
        """
        ...

    async def ask(self, event: Commit | AlignInitial) -> Any:
        """Queue a writer's request and wait for the coordinator's answer.

        Raises:
            ActorGoneError: the coordinator stopped.
            Exception: what the coordinator failed the request with.
        """
        ...


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
        coordinator: CoordinatorLine,
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
        self._started: OneShot[int | None] = OneShot()
        self._aborted: BaseException | None = None
        self._stopped = False

    def _check_open(self) -> None:
        if self._aborted is not None:
            raise self._aborted
        if self._stopped:
            raise ActorGoneError(self._coordinator.sink, "this writer handle was stopped")

    async def wait_started(self) -> int | None:
        """Wait until the coordinator starts this writer; returns the rewind epoch (the last
        epoch acknowledged before a restart), or ``None`` for a fresh start."""
        if self._aborted is not None:
            raise self._aborted  # even if it was started before the coordinator failed
        return await self._started.get()

    async def align_initial_epoch(self, epoch: int) -> int:
        """Send this writer's initial epoch; returns the one aligned across all writers."""
        check_epoch("epoch", epoch)
        self._check_open()
        aligned: int = await self._coordinator.ask(AlignInitial(self, epoch))
        return aligned

    async def commit(
        self, epoch: int, manifest: Manifest, staged: tuple[StagedBatch, ...] = ()
    ) -> None:
        """Send this writer's manifest of checkpoint ``epoch``, with the batches ``staged``
        outside the graph whose committables reached it in the epoch, and wait for the
        acknowledgement (sent once every vnode's writer sent theirs and the epoch is persisted).

        Raises:
            InvalidArgumentError: a bad epoch, ``manifest`` is not a Manifest, or ``staged``
                not a tuple of StagedBatch.
        """
        check_epoch("epoch", epoch)
        if not isinstance(manifest, Manifest):
            raise InvalidArgumentError("manifest", "a Manifest", type(manifest).__name__)
        if not isinstance(staged, tuple) or not all(isinstance(b, StagedBatch) for b in staged):
            raise InvalidArgumentError("staged", "a tuple of StagedBatch", staged)
        self._check_open()
        await self._coordinator.ask(Commit(self, epoch, manifest, staged))

    async def update_vnode_bitmap(self, bitmap: VnodeBitmap) -> None:
        """Change this writer's vnodes (rescaling); then :meth:`wait_started` again."""
        self._coordinator.check_bitmap(bitmap)
        self._check_open()
        self._started = OneShot()
        await self._coordinator.tell(UpdateBitmap(self, bitmap))

    async def stop(self) -> None:
        """Leave: the coordinator realigns the remaining writers."""
        if self._stopped or self._aborted is not None:
            return
        await self._coordinator.tell(StopHandle(self))
        self._stopped = True

    def _abort(self, error: BaseException) -> None:
        self._aborted = error
        self._started.fail(error)


class WriterRegistry:
    """The writers a coordinator knows in its current run, and which of them run."""

    def __init__(self, sink: str) -> None:
        self._sink = sink
        self.handles: dict[int, WriterHandle] = {}
        self.running: set[int] = set()

    def admit(self, handle: WriterHandle) -> None:
        """Add a registered writer.

        Raises:
            DuplicateWriterError: its writer id is another registered writer's.
        """
        if handle.writer is not None:
            for other in self.handles.values():
                if other is not handle and other.writer == handle.writer:
                    raise DuplicateWriterError(self._sink, handle.writer, other.name, handle.name)
        self.handles[handle.handle_id] = handle

    def remove(self, handle: WriterHandle) -> None:
        """Forget a writer that left."""
        self.handles.pop(handle.handle_id, None)
        self.running.discard(handle.handle_id)
