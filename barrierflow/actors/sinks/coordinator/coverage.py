"""Coverage rounds: collecting writers' requests until their bitmaps cover every vnode.

Every round the coordinator runs has this shape — registration at init (until the writers
cover every vnode), the initial-epoch alignment (whose answer is the maximum epoch), a
realignment after rescaling, and each epoch's commit requests (until every vnode's writer sent
its metadata). A vnode claimed twice within a round is
:class:`~barrierflow.errors.DuplicateVnodeError`. A round that stays uncovered logs, every few
seconds, which vnodes are missing and who came: a writer that never comes (a missing parallel
writer, a hash fan-out shared with other actors) would otherwise be a silent hang.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

import anyio

from barrierflow.actors.sinks.coordinator.handles import (
    AlignInitial,
    Commit,
    CommittedEpoch,
    Event,
    NewHandle,
    StopHandle,
    UpdateBitmap,
    WriterHandle,
    WriterRegistry,
    event_name,
)
from barrierflow.actors.sinks.errors import DuplicateVnodeError, UnexpectedWriterRequestError
from barrierflow.channels.vnode import VnodeBitmap

__all__ = ["CoverageRound", "EpochRounds", "align_initial", "realign", "register_all"]

R = TypeVar("R")


def ranges(vnodes: Sequence[int]) -> str:
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


class CoverageRound(Generic[R]):
    """The requests of one round, until the writers' bitmaps cover every vnode exactly once."""

    def __init__(self, sink: str, vnode_count: int, stage: str) -> None:
        self.sink = sink
        #: The round's name in logs and errors (``"registration"``, ``"epoch 7"``, ...).
        self.stage = stage
        self.covered = VnodeBitmap.empty(vnode_count)
        self.requests: list[R] = []
        self.handles: list[WriterHandle] = []

    def add(self, handle: WriterHandle, request: R) -> None:
        """Count ``handle``'s vnodes in, with its request.

        Raises:
            DuplicateVnodeError: another writer of the round already covers one of them.
        """
        overlap = self.covered & handle.bitmap
        if overlap.count():
            raise DuplicateVnodeError(self.sink, overlap.vnodes(), self.stage)
        self.covered = self.covered | handle.bitmap
        self.requests.append(request)
        self.handles.append(handle)

    @property
    def aligned(self) -> bool:
        """Whether every vnode is covered."""
        return self.covered.is_full()

    def handle_ids(self) -> set[int]:
        """The writers of the round."""
        return {handle.handle_id for handle in self.handles}

    async def next_event(
        self,
        next_event: Callable[[float], Awaitable[Event | None]],
        warn_interval: float,
        log: Any,
    ) -> Event:
        """The next writer event (``next_event(deadline)`` returns ``None`` at the deadline);
        while vnodes stay uncovered, a warning every ``warn_interval`` seconds."""
        while True:
            deadline = anyio.current_time() + warn_interval
            while anyio.current_time() < deadline:
                event = await next_event(deadline)
                if event is not None:
                    return event
            missing = (VnodeBitmap.full(self.covered.vnode_count) - self.covered).vnodes()
            log.warning(
                "waiting for writers to cover every vnode",
                stage=self.stage,
                uncovered=ranges(missing),
                uncovered_count=len(missing),
                registered=[f"{h.name} ({h.bitmap.count()} vnodes)" for h in self.handles],
            )


def _unexpected(sink: str, stage: str, expected: str, event: Event) -> UnexpectedWriterRequestError:
    """The error for ``event`` arriving when only ``expected`` may (a commit request's writer
    gets it too: it would otherwise wait for an answer until the run's abort)."""
    # Committed epochs and staged batches never reach a round (the coordinator's next_event
    # absorbs them).
    assert not isinstance(event, CommittedEpoch)
    error = UnexpectedWriterRequestError(
        sink, stage, expected, event_name(event), event.handle.handle_id,
        getattr(event, "epoch", None),
    )  # fmt: skip
    if isinstance(event, Commit):
        event.reply.fail(error)
    return error


#: Waits for the next writer event of a round (warning while vnodes stay uncovered).
NextEvent = Callable[["CoverageRound[Any]"], Awaitable[Event]]


async def register_all(
    sink: str, vnode_count: int, next_event: NextEvent, writers: WriterRegistry
) -> set[int]:
    """Init: admit registering writers until they cover every vnode; returns their ids.

    Raises:
        UnexpectedWriterRequestError: any other request arrived.
    """
    round_: CoverageRound[None] = CoverageRound(sink, vnode_count, "registration")
    while not round_.aligned:
        event = await next_event(round_)
        if not isinstance(event, NewHandle):
            # The seed's wait_init_handles: "expect new handle during init, but got ...".
            raise _unexpected(sink, "init", "writers to register", event)
        writers.admit(event.handle)
        round_.add(event.handle, None)
    return round_.handle_ids()


async def realign(
    sink: str,
    vnode_count: int,
    next_event: NextEvent,
    writers: WriterRegistry,
    altered: list[WriterHandle],
) -> set[int]:
    """Rescaling: until every remaining writer re-sent its bitmap or left, and the new set
    covers every vnode, nobody runs; returns the new set's ids.

    Raises:
        UnexpectedWriterRequestError: a commit request or an initial epoch arrived (a commit
            request's writer gets the error too).
    """
    round_: CoverageRound[None] = CoverageRound(sink, vnode_count, "realignment")
    for handle in altered:
        writers.admit(handle)
        round_.add(handle, None)
    remaining = {i for i in writers.handles if i not in round_.handle_ids()}
    writers.running.clear()
    while remaining or not round_.aligned:
        event = await next_event(round_)
        if isinstance(event, NewHandle):
            writers.admit(event.handle)
            round_.add(event.handle, None)
        elif isinstance(event, UpdateBitmap):
            remaining.discard(event.handle.handle_id)
            event.handle.bitmap = event.bitmap
            round_.add(event.handle, None)
        elif isinstance(event, StopHandle):
            remaining.discard(event.handle.handle_id)
            writers.remove(event.handle)
        elif isinstance(event, Commit | AlignInitial):
            error = UnexpectedWriterRequestError(
                sink, "realignment", "no commit or initial epoch", event_name(event),
                event.handle.handle_id, event.epoch,
            )  # fmt: skip
            if isinstance(event, Commit):
                event.reply.fail(error)
            raise error
    return round_.handle_ids()


async def align_initial(sink: str, vnode_count: int, next_event: NextEvent) -> list[AlignInitial]:
    """A fresh start: collect every started writer's initial epoch until they cover every
    vnode; the caller answers them all with the maximum.

    Raises:
        UnexpectedWriterRequestError: any other request arrived.
    """
    round_: CoverageRound[AlignInitial] = CoverageRound(
        sink, vnode_count, "initial epoch alignment"
    )
    while not round_.aligned:
        event = await next_event(round_)
        if not isinstance(event, AlignInitial):
            # The seed's handle_init_requests_impl: "expect AlignInitialEpoch but got ...".
            raise _unexpected(
                sink, "initial epoch alignment", "AlignInitial from every writer", event
            )
        round_.add(event.handle, event)
    return round_.requests


class EpochRounds:
    """Per epoch, the commit requests until their bitmaps cover every vnode exactly once.
    Only the oldest open epoch may complete; a newer complete one waits its turn."""

    def __init__(self, sink: str, vnode_count: int) -> None:
        self._sink = sink
        self._vnode_count = vnode_count
        self._epochs: dict[int, CoverageRound[Commit]] = {}

    def add(self, request: Commit) -> list[tuple[int, list[Commit]]]:
        """Count ``request`` in; returns the epochs it completed, oldest first, with their
        requests.

        Raises:
            DuplicateVnodeError: another writer already sent one of its vnodes for the epoch.
        """
        round_ = self._epochs.get(request.epoch)
        if round_ is None:
            round_ = self._epochs[request.epoch] = CoverageRound(
                self._sink, self._vnode_count, f"epoch {request.epoch}"
            )
        round_.add(request.handle, request)
        completed: list[tuple[int, list[Commit]]] = []
        while self._epochs and self._epochs[min(self._epochs)].aligned:
            oldest = min(self._epochs)
            completed.append((oldest, self._epochs.pop(oldest).requests))
        return completed
