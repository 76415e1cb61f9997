"""The answers a coordinator owes its writers (:mod:`.handles`: each request carries a
:class:`~barrierflow._sync.OneShot` its writer waits on).

Every request the coordinator takes is tracked until answered (:class:`OpenReplies`), so that a
run that fails can fail them all with the cause: :func:`abort_run` also takes the events still
queued in the inbox (a registration in flight, a request posted meanwhile) and aborts every
writer handle. Without it a writer would wait for ever on a coordinator that is gone. Kept
apart from :mod:`.coordinator` because it is bookkeeping, not a rule of coordination.
"""

from __future__ import annotations

from typing import Any, final

import anyio

from barrierflow._sync import OneShot
from barrierflow.actors.sinks.coordinator.handles import Event, Inbound, WriterRegistry, take
from barrierflow.actors.sinks.errors import CoordinatorAbortedError
from barrierflow.channels.channel import ReceiveChannel
from barrierflow.channels.errors import BarrierflowError
from barrierflow.runtime.errors import ActorGoneError

__all__ = ["OpenReplies", "abort_run", "refuse"]


@final
class OpenReplies:
    """The replies of the writers' requests taken in this run and not answered yet."""

    __slots__ = ("_open",)

    def __init__(self) -> None:
        self._open: set[OneShot[Any]] = set()

    def __len__(self) -> int:
        """How many replies are open (answered ones are not kept: a long run holds none)."""
        return len(self._open)

    def track(self, event: Event) -> None:
        """Remember a writer's request until answered: a run that fails fails it."""
        reply = getattr(event, "reply", None)
        if reply is not None and not reply.done:
            self._open.add(reply)

    def add(self, reply: OneShot[Any]) -> None:
        """Remember ``reply`` until answered."""
        self._open.add(reply)

    def answer(self, reply: OneShot[Any], value: Any = None) -> None:
        """Deliver ``value`` to ``reply``; it is no longer open."""
        reply.set(value)
        self._open.discard(reply)

    def fail_all(self, error: BaseException) -> None:
        """Fail every open reply with ``error``."""
        for reply in self._open:
            reply.fail(error)
        self._open.clear()


def refuse(reply: OneShot[Any], error: BarrierflowError) -> BarrierflowError:
    """Fail ``reply`` with ``error`` and return the error (for the coordinator to raise)."""
    reply.fail(error)
    return error


def abort_run(
    sink: str,
    exc: BaseException,
    inbox: ReceiveChannel[Inbound],
    writers: WriterRegistry,
    replies: OpenReplies,
) -> None:
    """A run of ``sink``'s coordinator failed with ``exc``: take the events still queued (the
    run will never serve them) so that their writers are aborted too, then abort every writer
    handle and fail every open reply with a
    :class:`~barrierflow.actors.sinks.errors.CoordinatorAbortedError` (its cause: ``exc``, or
    an :class:`~barrierflow.runtime.errors.ActorGoneError` if the run was cancelled)."""
    cause = exc if isinstance(exc, Exception) else ActorGoneError(sink, "cancelled")
    error = CoordinatorAbortedError(sink, cause)
    while True:
        try:
            event = take(*inbox.receive_nowait())
        except (anyio.WouldBlock, anyio.EndOfStream):
            break
        replies.track(event)
        handle = getattr(event, "handle", None)
        if handle is not None:
            writers.handles.setdefault(handle.handle_id, handle)
    for writer in writers.handles.values():
        writer._abort(error)
    replies.fail_all(error)
