"""Bounded channels: how messages travel between actors, with backpressure.

A channel holds at most ``max_messages`` messages and, if ``max_rows`` is set, at most
``max_rows`` rows of chunks: a chunk takes as many row permits as it has rows, so memory stays
bounded whatever the chunk size. A chunk larger than ``max_rows`` is admitted alone, when no
other rows are buffered, rather than deadlocking. Barriers and watermarks take no row permits
but queue behind any sender already waiting, so they never overtake an earlier chunk.

The API speaks anyio's vocabulary (``send``/``send_nowait``, ``receive``/``receive_nowait``,
``clone``, ``close``/``aclose``, ``statistics()``, ``async for``):

* the receiver gets end of stream (:class:`anyio.EndOfStream`; ``async for`` just stops) once
  every sender clone is closed and the buffer is drained;
* a sender whose receivers are all gone gets :class:`~barrierflow.errors.ChannelBrokenError`;
* using an end after closing it raises :class:`~barrierflow.errors.ChannelClosedError`;
* closing the last receiver drops what is buffered.

**Scheduling.** ``send`` and ``receive`` are checkpoints (a cancellation point and a yield to
other tasks) whenever they have to wait, and otherwise once every :data:`COOPERATIVE_BUDGET`
operations on the same end — the cooperative budget that tokio uses, instead of trio's
checkpoint on every call, which costs more than the hop itself (≈ 1.6 µs for a cancellation
check alone on asyncio). A consumer thus drains what is buffered without a trip through the
event loop per message, a producer that never blocks still lets others run, and a cancelled
task notices within :data:`COOPERATIVE_BUDGET` operations. Operations are atomic either way:
one that raises a cancellation did nothing. Peers are woken only when they are parked.
"""

from __future__ import annotations

from types import TracebackType
from typing import Generic, TypeVar, final

import anyio
from anyio.lowlevel import checkpoint

from barrierflow.channels._channel_state import ChannelState, ChannelStatistics, Waiter
from barrierflow.channels.errors import (
    ChannelBrokenError,
    ChannelClosedError,
    ConfigError,
    InvalidArgumentError,
)
from barrierflow.channels.messages import message_rows

__all__ = [
    "COOPERATIVE_BUDGET",
    "ChannelStatistics",
    "SendChannel",
    "ReceiveChannel",
    "create_channel",
]

T = TypeVar("T")

#: Operations on one channel end between two forced schedule points.
COOPERATIVE_BUDGET = 64


@final
class SendChannel(Generic[T]):
    """The sending end of a channel. Create with :func:`create_channel`; copy with :meth:`clone`."""

    __slots__ = ("_budget", "_closed", "_state")

    def __init__(self, state: ChannelState[T]) -> None:
        if not isinstance(state, ChannelState):
            raise InvalidArgumentError(
                "state", "a channel's shared state (make channels with create_channel())", state
            )
        self._state = state
        self._closed = False
        self._budget = COOPERATIVE_BUDGET
        state.open_senders += 1

    @property
    def name(self) -> str:
        """The channel's name."""
        return self._state.name

    def send_nowait(self, item: T) -> None:
        """Enqueue ``item`` if there is room now.

        Raises:
            anyio.WouldBlock: the channel is full (or another sender is already waiting).
            ChannelClosedError: this end was closed.
            ChannelBrokenError: every receiver is gone.
        """
        state = self._state
        if self._closed:
            raise ChannelClosedError(state.name, "send")
        if not state.open_receivers:
            raise ChannelBrokenError(state.name, "every receiver was closed")
        rows = message_rows(item)
        if state.waiting_senders or not state.fits(rows):
            raise anyio.WouldBlock
        state.push(item, rows)

    async def send(self, item: T) -> None:
        """Enqueue ``item``, waiting while the channel is full.

        Cancellation: atomic — if cancelled, the item was not enqueued.

        Raises:
            ChannelClosedError: this end was closed.
            ChannelBrokenError: every receiver is gone (also while waiting).
        """
        self._budget -= 1
        if self._budget <= 0:
            self._budget = COOPERATIVE_BUDGET
            await checkpoint()
        try:
            self.send_nowait(item)
            return
        except anyio.WouldBlock:
            pass
        await self._send_parked(item)

    async def _send_parked(self, item: T) -> None:
        state = self._state
        rows = message_rows(item)
        waiter = Waiter(rows)
        state.waiting_senders[waiter] = None
        state.blocked_sends += 1
        ticket = state.park(sending=True)
        try:
            while True:
                await waiter.event.wait()
                if self._closed:
                    raise ChannelClosedError(state.name, "send")
                if not state.open_receivers:
                    raise ChannelBrokenError(state.name, "every receiver was closed")
                # Only the head of the queue may enter, so admission stays first come, first
                # served (a close wakes everyone, not just the head).
                if next(iter(state.waiting_senders)) is waiter and state.fits(rows):
                    break
                waiter.event = anyio.Event()
                waiter.woken = False
            del state.waiting_senders[waiter]
            state.push(item, rows)
        finally:
            state.unpark(ticket, sending=True)
            if waiter in state.waiting_senders:
                del state.waiting_senders[waiter]
            # Pass the turn on: the next sender may fit too (or we gave up ours).
            state.wake_sender()
        self._budget = COOPERATIVE_BUDGET

    def clone(self) -> SendChannel[T]:
        """Another send end of the same channel; end of stream needs every clone closed.

        Raises:
            ChannelClosedError: this end was closed.
        """
        if self._closed:
            raise ChannelClosedError(self._state.name, "send")
        return SendChannel(self._state)

    def close(self) -> None:
        """Close this end (idempotent); the last one to close ends the stream for receivers."""
        if self._closed:
            return
        self._closed = True
        state = self._state
        state.open_senders -= 1
        # Sends parked on this end must fail now, not whenever room appears: wake them all
        # (the others re-check and park again).
        for waiter in state.waiting_senders:
            waiter.woken = True
            waiter.event.set()
        if state.open_senders == 0:
            while state.waiting_receivers:
                waiter, _ = state.waiting_receivers.popitem(last=False)
                waiter.woken = True
                waiter.event.set()

    async def aclose(self) -> None:
        """Close this end; a checkpoint, like every async method."""
        self.close()
        await checkpoint()

    def statistics(self, now: float | None = None) -> ChannelStatistics:
        """A snapshot of the channel's counters; the waits going on count up to ``now`` (a
        ``time.perf_counter()`` reading, default the current one: pass one reading to several
        channels, and to what is compared with their waits, for totals as of one instant)."""
        return self._state.statistics(now)

    def __enter__(self) -> SendChannel[T]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> SendChannel[T]:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<SendChannel {self._state.name!r}{' closed' if self._closed else ''}>"


@final
class ReceiveChannel(Generic[T]):
    """The receiving end of a channel. Iterate it with ``async for`` until end of stream."""

    __slots__ = ("_budget", "_closed", "_state")

    def __init__(self, state: ChannelState[T]) -> None:
        if not isinstance(state, ChannelState):
            raise InvalidArgumentError(
                "state", "a channel's shared state (make channels with create_channel())", state
            )
        self._state = state
        self._closed = False
        self._budget = COOPERATIVE_BUDGET
        state.open_receivers += 1

    @property
    def name(self) -> str:
        """The channel's name."""
        return self._state.name

    def receive_nowait(self) -> T:
        """Take the next message if one is buffered.

        Raises:
            anyio.WouldBlock: nothing is buffered and a sender is still open.
            anyio.EndOfStream: nothing is buffered and every sender is closed.
            ChannelClosedError: this end was closed.
        """
        state = self._state
        if self._closed:
            raise ChannelClosedError(state.name, "receive")
        if state.buffer:
            item = state.buffer.popleft()
            rows = message_rows(item)
            if rows:
                state.buffered_rows -= rows
            if state.waiting_senders:
                state.wake_sender()
            return item
        if not state.open_senders:
            raise anyio.EndOfStream
        raise anyio.WouldBlock

    async def receive(self) -> T:
        """Take the next message, waiting for one.

        Cancellation: atomic — if cancelled, no message was taken.

        Raises:
            anyio.EndOfStream: every sender is closed and the buffer is drained.
            ChannelClosedError: this end was closed.
        """
        self._budget -= 1
        if self._budget <= 0:
            self._budget = COOPERATIVE_BUDGET
            await checkpoint()
        try:
            return self.receive_nowait()
        except anyio.WouldBlock:
            pass
        state = self._state
        ticket = state.park(sending=False)
        try:
            return await self._receive_parked(state)
        finally:
            state.unpark(ticket, sending=False)

    async def _receive_parked(self, state: ChannelState[T]) -> T:
        while True:
            waiter = Waiter(0)
            state.waiting_receivers[waiter] = None
            try:
                await waiter.event.wait()
            except BaseException:
                state.waiting_receivers.pop(waiter, None)
                # We were handed a wake-up we cannot use: hand it to the next receiver.
                if waiter.woken and state.buffer and state.waiting_receivers:
                    other, _ = state.waiting_receivers.popitem(last=False)
                    other.woken = True
                    other.event.set()
                raise
            self._budget = COOPERATIVE_BUDGET
            try:
                return self.receive_nowait()
            except anyio.WouldBlock:
                continue  # another receiver took it first; wait again

    def clone(self) -> ReceiveChannel[T]:
        """Another receive end; each message goes to exactly one of the clones.

        Raises:
            ChannelClosedError: this end was closed.
        """
        if self._closed:
            raise ChannelClosedError(self._state.name, "receive")
        return ReceiveChannel(self._state)

    def close(self) -> None:
        """Close this end (idempotent); when the last receiver closes, buffered messages are
        dropped and senders get :class:`ChannelBrokenError`."""
        if self._closed:
            return
        self._closed = True
        state = self._state
        state.open_receivers -= 1
        if state.open_receivers == 0:
            state.buffer.clear()
            state.buffered_rows = 0
            for waiter in state.waiting_senders:
                waiter.woken = True
                waiter.event.set()

    async def aclose(self) -> None:
        """Close this end; a checkpoint, like every async method."""
        self.close()
        await checkpoint()

    def statistics(self, now: float | None = None) -> ChannelStatistics:
        """A snapshot of the channel's counters; the waits going on count up to ``now`` (a
        ``time.perf_counter()`` reading, default the current one: pass one reading to several
        channels, and to what is compared with their waits, for totals as of one instant)."""
        return self._state.statistics(now)

    def __aiter__(self) -> ReceiveChannel[T]:
        return self

    async def __anext__(self) -> T:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    def __enter__(self) -> ReceiveChannel[T]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> ReceiveChannel[T]:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ReceiveChannel {self._state.name!r}{' closed' if self._closed else ''}>"


class create_channel(tuple[SendChannel[T], ReceiveChannel[T]]):  # noqa: N801 - reads as a function
    """Create a bounded channel and return its ``(send, receive)`` ends.

    Parametrize it for typing like anyio's stream factory: ``create_channel[Message](16)``.

    Args:
        max_messages: capacity in messages (every message counts, barriers included).
        max_rows: optional capacity in rows of chunks; ``None`` counts messages only.
        name: shown in statistics, errors and logs.

    Raises:
        ConfigError: a capacity is not an int ≥ 1, or ``name`` is not a string.
    """

    def __new__(  # type: ignore[misc]
        cls, max_messages: int, max_rows: int | None = None, *, name: str = "channel"
    ) -> tuple[SendChannel[T], ReceiveChannel[T]]:
        if type(max_messages) is not int or max_messages < 1:
            raise ConfigError("max_messages", "an int >= 1", max_messages)
        if max_rows is not None and (type(max_rows) is not int or max_rows < 1):
            raise ConfigError("max_rows", "None or an int >= 1", max_rows)
        if not isinstance(name, str):
            raise ConfigError("name", "a str", name)
        state: ChannelState[T] = ChannelState(name, max_messages, max_rows)
        return SendChannel(state), ReceiveChannel(state)
