"""Command actors: long-lived tasks that serve requests from an :class:`ActorRef`.

A command actor owns something exclusively (a sink connector, a coordinator's state) and
serves requests one at a time from a bounded inbox, so it needs no locks. Callers hold an
:class:`ActorRef`, which is cheap to clone:

* ``await ref.tell(request)`` — fire and forget (it waits only for room in the inbox);
  a handler error is logged by the actor, never raised to the teller;
* ``await ref.ask(request)`` — waits for the reply; a handler error is raised to the asker;
  a reply that can never come (the actor stopped, its inbox closed) is
  :class:`~barrierflow.errors.ActorGoneError` naming the actor — never a hang.

The actor's loop ends when every ref is closed (end of stream on the inbox) or when the task
serving it is cancelled; requests still queued then are answered with ``ActorGoneError``.
"""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar, final

import anyio
import structlog

from barrierflow.channels.channel import ReceiveChannel, SendChannel, create_channel
from barrierflow.errors import ActorGoneError, ChannelBrokenError, ChannelClosedError

__all__ = ["ActorRef", "CommandHandler", "open_command_actor", "serve_commands"]

Req = TypeVar("Req")
Req_contra = TypeVar("Req_contra", contravariant=True)


class CommandHandler(Protocol[Req_contra]):
    """What a command actor does with one request; the return value is the reply."""

    async def handle(self, request: Req_contra, /) -> Any: ...


class _Reply:
    __slots__ = ("done", "error", "value")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.value: Any = None
        self.error: BaseException | None = None


@final
class ActorRef(Generic[Req]):
    """A handle on a command actor's inbox. Create with :func:`open_command_actor`."""

    __slots__ = ("_name", "_send")

    def __init__(self, name: str, send: SendChannel[tuple[Req, _Reply | None]]) -> None:
        self._name = name
        self._send = send

    @property
    def name(self) -> str:
        """The actor's name."""
        return self._name

    async def tell(self, request: Req) -> None:
        """Queue ``request`` without waiting for it to be handled.

        Raises:
            ActorGoneError: the actor stopped, or this ref was closed.
        """
        await self._post(request, None)

    async def ask(self, request: Req) -> Any:
        """Queue ``request`` and wait for its reply.

        Raises:
            ActorGoneError: the actor stopped before replying, or this ref was closed.
            Exception: whatever the handler raised for this request.
        """
        reply = _Reply()
        await self._post(request, reply)
        await reply.done.wait()
        if reply.error is not None:
            raise reply.error
        return reply.value

    async def _post(self, request: Req, reply: _Reply | None) -> None:
        try:
            await self._send.send((request, reply))
        except ChannelBrokenError as exc:
            raise ActorGoneError(self._name, "its inbox is closed") from exc
        except ChannelClosedError as exc:
            raise ActorGoneError(self._name, "this handle was closed") from exc

    def clone(self) -> ActorRef[Req]:
        """Another handle on the same actor; the actor ends when every handle is closed."""
        try:
            return ActorRef(self._name, self._send.clone())
        except ChannelClosedError as exc:
            raise ActorGoneError(self._name, "this handle was closed") from exc

    def close(self) -> None:
        """Close this handle (idempotent)."""
        self._send.close()


def open_command_actor(
    name: str, capacity: int = 128
) -> tuple[ActorRef[Any], ReceiveChannel[tuple[Any, _Reply | None]]]:
    """A ref and the inbox to pass to :func:`serve_commands`."""
    send, receive = create_channel[tuple[Any, _Reply | None]](capacity, name=f"{name} inbox")
    return ActorRef(name, send), receive


async def serve_commands(
    name: str,
    handler: CommandHandler[Any],
    inbox: ReceiveChannel[tuple[Any, _Reply | None]],
) -> None:
    """Serve requests from ``inbox`` one at a time until every ref is closed.

    Cancellation: the requests still queued are answered with ``ActorGoneError``.
    """
    log = structlog.get_logger("barrierflow.actor").bind(actor=name)
    try:
        async for request, reply in inbox:
            try:
                value = await handler.handle(request)
            except Exception as exc:
                if reply is None:
                    log.warning("request failed", request=type(request).__name__, error=repr(exc))
                else:
                    reply.error = exc
                    reply.done.set()
                continue
            except BaseException:
                # Cancelled mid-request: the asker must not wait for a reply that cannot come.
                _gone(name, reply)
                raise
            if reply is not None:
                reply.value = value
                reply.done.set()
    finally:
        while True:
            try:
                _, reply = inbox.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, ChannelClosedError):
                break
            _gone(name, reply)
        inbox.close()  # later requests fail fast instead of queueing forever


def _gone(name: str, reply: _Reply | None) -> None:
    if reply is not None and not reply.done.is_set():
        reply.error = ActorGoneError(name, "it stopped before replying")
        reply.done.set()
