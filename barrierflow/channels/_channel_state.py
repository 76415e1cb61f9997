"""The state one channel's ends share: the bounded buffer and its permits (one per message,
and, with ``max_rows``, one per row of a chunk), the FIFO queues of parked senders and
receivers, and the counters behind :class:`ChannelStatistics`.

Kept apart from the ends (:mod:`.channel`), which hold the scheduling rules (cooperative budget,
cancellation) on top of it.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Generic, TypeVar, final

import anyio

from barrierflow.channels.chunk import Chunk

__all__ = ["ChannelState", "ChannelStatistics", "Waiter"]

T = TypeVar("T")


@final
@dataclass(frozen=True, slots=True)
class ChannelStatistics:
    """A snapshot of a channel's counters (see :meth:`SendChannel.statistics`)."""

    #: The channel's name, as given to :func:`create_channel`.
    name: str
    #: Capacity in messages.
    max_messages: int
    #: Capacity in rows, or ``None`` when only messages are counted.
    max_rows: int | None
    #: Messages accepted since the channel was created.
    messages_sent: int
    #: Of those, how many were chunks.
    chunks_sent: int
    #: Rows (visible or not) of the accepted chunks.
    rows_sent: int
    #: Arrow buffer bytes of the accepted chunks.
    bytes_sent: int
    #: Messages buffered right now.
    buffered_messages: int
    #: Row permits held by buffered chunks right now.
    buffered_rows: int
    #: Open send ends (clones included).
    open_send_channels: int
    #: Open receive ends (clones included).
    open_receive_channels: int
    #: Senders parked right now, waiting for room.
    tasks_waiting_send: int
    #: Receivers parked right now, waiting for a message.
    tasks_waiting_receive: int
    #: Sends that had to wait for room (backpressure events).
    blocked_sends: int
    #: Total seconds senders spent parked (wall clock), the waits still going on counted up to
    #: the snapshot: a total that only grows, between two snapshots too.
    blocked_seconds: float
    #: Total seconds receivers spent parked, waiting for a message (wall clock; waits going
    #: on counted up to the snapshot, as above): the consumer's idle time on this input.
    receive_wait_seconds: float = 0.0


class Waiter:
    """A parked sender (waiting for room for ``rows`` rows) or receiver (``rows`` 0)."""

    __slots__ = ("event", "rows", "woken")

    def __init__(self, rows: int) -> None:
        self.event = anyio.Event()
        self.rows = rows
        self.woken = False


class ChannelState(Generic[T]):
    """What all the ends of one channel share: the buffer, its permits, the parked tasks and
    the counters."""

    __slots__ = (
        "blocked_seconds",
        "blocked_sends",
        "buffer",
        "buffered_rows",
        "bytes_sent",
        "chunks_sent",
        "max_messages",
        "max_rows",
        "messages_sent",
        "name",
        "open_receivers",
        "open_senders",
        "parked_receivers",
        "parked_senders",
        "receive_wait_seconds",
        "rows_sent",
        "waiting_receivers",
        "waiting_senders",
    )

    def __init__(self, name: str, max_messages: int, max_rows: int | None) -> None:
        self.name = name
        self.max_messages = max_messages
        self.max_rows = max_rows
        self.buffer: deque[T] = deque()
        self.buffered_rows = 0
        self.open_senders = 0
        self.open_receivers = 0
        # FIFO of parked senders; only the head is ever woken, so admission stays in order.
        self.waiting_senders: OrderedDict[Waiter, None] = OrderedDict()
        self.waiting_receivers: OrderedDict[Waiter, None] = OrderedDict()
        self.messages_sent = 0
        self.chunks_sent = 0
        self.rows_sent = 0
        self.bytes_sent = 0
        self.blocked_sends = 0
        # Finished waits are summed here; the ones going on are kept by when they began (a
        # wait of its own per parked task, apart from the wake-up queues, which drop a waiter
        # as soon as it is woken, before its task resumes).
        self.blocked_seconds = 0.0
        self.receive_wait_seconds = 0.0
        self.parked_senders: dict[object, float] = {}
        self.parked_receivers: dict[object, float] = {}

    def fits(self, rows: int) -> bool:
        """Whether a message of ``rows`` rows fits now (a message permit, and row permits)."""
        if len(self.buffer) >= self.max_messages:
            return False
        if rows == 0 or self.max_rows is None:
            return True
        # An oversized chunk is admitted alone rather than never.
        return self.buffered_rows + rows <= self.max_rows or self.buffered_rows == 0

    def push(self, item: T, rows: int) -> None:
        """Buffer ``item`` (taking its permits) and wake the first parked receiver."""
        self.buffer.append(item)
        self.messages_sent += 1
        if isinstance(item, Chunk):
            self.buffered_rows += rows
            self.chunks_sent += 1
            self.rows_sent += rows
            self.bytes_sent += item.nbytes
        if self.waiting_receivers:
            waiter, _ = self.waiting_receivers.popitem(last=False)
            waiter.woken = True
            waiter.event.set()

    def wake_sender(self) -> None:
        """Wake the head of the senders' queue if its message fits now."""
        if self.waiting_senders:
            head = next(iter(self.waiting_senders))
            if not head.woken and (self.open_receivers == 0 or self.fits(head.rows)):
                head.woken = True
                head.event.set()

    def park(self, sending: bool) -> object:
        """Note that a sender (``sending``) or a receiver parks now; hand the ticket it returns
        to :meth:`unpark` when the wait ends."""
        ticket = object()
        waits = self.parked_senders if sending else self.parked_receivers
        waits[ticket] = time.perf_counter()
        return ticket

    def unpark(self, ticket: object, sending: bool) -> None:
        """Add the wait of ``ticket`` (see :meth:`park`), which ends now, to its total."""
        waits = self.parked_senders if sending else self.parked_receivers
        waited = time.perf_counter() - waits.pop(ticket)
        if sending:
            self.blocked_seconds += waited
        else:
            self.receive_wait_seconds += waited

    def statistics(self, now: float | None = None) -> ChannelStatistics:
        """A snapshot of the counters, the waits going on counted up to ``now`` (a
        ``time.perf_counter()`` reading; default: the current one).

        A wait is counted as it goes, not added whole when it ends: a total that jumped by a
        long wait at its end would fall behind the time around it in between (a consumer's busy
        time, its uptime less its waits, would go down), and a counter must never go down.
        """
        at = time.perf_counter() if now is None else now
        blocked = self.blocked_seconds + sum(max(at - t, 0.0) for t in self.parked_senders.values())
        idle = self.receive_wait_seconds + sum(
            max(at - t, 0.0) for t in self.parked_receivers.values()
        )
        return ChannelStatistics(
            name=self.name,
            max_messages=self.max_messages,
            max_rows=self.max_rows,
            messages_sent=self.messages_sent,
            chunks_sent=self.chunks_sent,
            rows_sent=self.rows_sent,
            bytes_sent=self.bytes_sent,
            buffered_messages=len(self.buffer),
            buffered_rows=self.buffered_rows,
            open_send_channels=self.open_senders,
            open_receive_channels=self.open_receivers,
            tasks_waiting_send=len(self.waiting_senders),
            tasks_waiting_receive=len(self.waiting_receivers),
            blocked_sends=self.blocked_sends,
            blocked_seconds=blocked,
            receive_wait_seconds=idle,
        )
