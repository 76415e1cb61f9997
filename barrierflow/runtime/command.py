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

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, final

import anyio
import structlog

from barrierflow._sync import OneShot
from barrierflow.channels.channel import ReceiveChannel, SendChannel, create_channel
from barrierflow.channels.errors import ChannelBrokenError, ChannelClosedError, InvalidArgumentError
from barrierflow.runtime.config import check_seconds
from barrierflow.runtime.errors import ActorGoneError

__all__ = [
    "ActorRef",
    "CommandHandler",
    "Finish",
    "Ticker",
    "open_command_actor",
    "serve_commands",
]

Req = TypeVar("Req")
Req_contra = TypeVar("Req_contra", contravariant=True)


class CommandHandler(Protocol[Req_contra]):
    """What a command actor does with one request; the return value is the reply."""

    async def handle(self, request: Req_contra, /) -> Any: ...


#: The answer to one ``ask``: the shared one-shot of :mod:`barrierflow._sync`.
_Reply = OneShot[Any]


@final
class ActorRef(Generic[Req]):
    """A handle on a command actor's inbox. Create with :func:`open_command_actor`.

    Raises:
        InvalidArgumentError: ``name`` is not a non-empty str or ``send`` not a SendChannel.
    """

    __slots__ = ("_name", "_send")

    def __init__(self, name: str, send: SendChannel[tuple[Req, _Reply | None]]) -> None:
        _check_name(name)
        if not isinstance(send, SendChannel):
            raise InvalidArgumentError("send", "the SendChannel of an inbox", send)
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
        reply: _Reply = OneShot()
        await self._post(request, reply)
        return await reply.get()

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


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError("name", "a non-empty actor name", name)


def open_command_actor(
    name: str, capacity: int = 128
) -> tuple[ActorRef[Any], ReceiveChannel[tuple[Any, _Reply | None]]]:
    """A ref and the inbox to pass to :func:`serve_commands`.

    Raises:
        InvalidArgumentError: ``name`` is not a non-empty str.
        ConfigError: ``capacity`` is not an int >= 1.
    """
    _check_name(name)
    send, receive = create_channel[tuple[Any, _Reply | None]](capacity, name=f"{name} inbox")
    return ActorRef(name, send), receive


@final
class Finish:
    """Returned by a handler to reply with ``value`` and then stop serving: the inbox is
    closed and the requests still queued are answered with ``ActorGoneError``."""

    __slots__ = ("value",)

    def __init__(self, value: Any = None) -> None:
        self.value = value


@final
@dataclass(frozen=True, slots=True)
class Ticker:
    """A periodic hook run between requests, never concurrently with one.

    The first tick comes one ``interval`` after serving starts (there is no immediate tick).
    Ticks missed while a request ran are skipped, not bursted: a late tick runs once, as soon
    as the running request is done, and the next one is due at the next multiple of
    ``interval`` on the original schedule. A due tick runs before a queued request, so a busy
    inbox cannot starve it.
    """

    interval: float
    tick: Callable[[], Awaitable[None]]

    def __post_init__(self) -> None:
        if not callable(self.tick):
            raise InvalidArgumentError("tick", "an async callable", self.tick)
        check_seconds("interval", self.interval, InvalidArgumentError)


async def serve_commands(
    name: str,
    handler: CommandHandler[Any],
    inbox: ReceiveChannel[tuple[Any, _Reply | None]],
    *,
    ticker: Ticker | None = None,
    on_end: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Serve requests from ``inbox`` one at a time until every ref is closed or the handler
    returns :class:`Finish`; run ``ticker`` between requests.

    ``on_end`` runs once when the inbox ends because every ref was closed (not after
    ``Finish``, not on cancellation).

    Cancellation: the requests still queued are answered with ``ActorGoneError``.

    Raises:
        InvalidArgumentError: (before serving anything) ``name`` is not a non-empty str,
            ``handler`` has no ``handle()``, ``inbox`` is not a ReceiveChannel, ``ticker`` is
            neither ``None`` nor a Ticker, or ``on_end`` neither ``None`` nor callable.
    """
    _check_name(name)
    for argument, value, ok in (
        ("handler", handler, callable(getattr(handler, "handle", None))),
        ("inbox", inbox, isinstance(inbox, ReceiveChannel)),
        ("ticker", ticker, ticker is None or isinstance(ticker, Ticker)),
        ("on_end", on_end, on_end is None or callable(on_end)),
    ):
        if not ok:
            raise InvalidArgumentError(argument, f"a valid {argument} (see serve_commands)", value)
    log = structlog.get_logger("barrierflow.actor").bind(actor=name)
    next_tick = math.inf if ticker is None else anyio.current_time() + ticker.interval
    try:
        while True:
            if ticker is not None and anyio.current_time() >= next_tick:
                await ticker.tick()
                late = anyio.current_time() - next_tick
                next_tick += (math.floor(late / ticker.interval) + 1) * ticker.interval
                continue
            received: tuple[Any, _Reply | None] | None = None
            try:
                with anyio.move_on_after(next_tick - anyio.current_time()):
                    received = await inbox.receive()  # atomic: a timeout takes nothing
            except anyio.EndOfStream:
                if on_end is not None:
                    await on_end()
                return
            if received is not None and await _serve_one(name, log, handler, *received):
                return
    finally:
        while True:
            try:
                _, reply = inbox.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, ChannelClosedError):
                break
            _gone(name, reply)
        inbox.close()  # later requests fail fast instead of queueing forever


async def _serve_one(
    name: str, log: Any, handler: CommandHandler[Any], request: Any, reply: _Reply | None
) -> bool:
    """Handle one request and answer it; True if the handler asked to stop serving."""
    try:
        value = await handler.handle(request)
    except Exception as exc:
        if reply is None:
            log.warning("request failed", request=type(request).__name__, error=repr(exc))
        else:
            reply.fail(exc)
        return False
    except BaseException:
        # Cancelled mid-request: the asker must not wait for a reply that cannot come.
        _gone(name, reply)
        raise
    finish = isinstance(value, Finish)
    if reply is not None:
        reply.set(value.value if finish else value)
    return finish


def _gone(name: str, reply: _Reply | None) -> None:
    if reply is not None:
        reply.fail(ActorGoneError(name, "it stopped before replying"))  # ignored if answered
