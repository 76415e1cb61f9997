"""Two small synchronization primitives every layer uses, written once.

* :class:`OneShot` — a value or an error, set once, awaited by any number of tasks (a reply to a
  command, an in-flight barrier's completion, a coordinator's answer to a writer).
* :class:`Notifier` — "something changed, look again": waiters re-check their condition after
  every :meth:`Notifier.notify` (the committed epoch moved, a writer registered, a slot freed).

Both are anyio-only, so they work on asyncio and trio.
"""

from __future__ import annotations

from typing import Generic, TypeVar, final

import anyio

__all__ = ["Notifier", "OneShot"]

T = TypeVar("T")


@final
class OneShot(Generic[T]):
    """A value or an error delivered once; later :meth:`set` / :meth:`fail` are ignored, so
    racing producers (a reply and a shutdown) need not coordinate."""

    __slots__ = ("_done", "_error", "_value")

    def __init__(self) -> None:
        self._done = anyio.Event()
        self._value: T | None = None
        self._error: BaseException | None = None

    @property
    def done(self) -> bool:
        """Whether a value or an error was delivered."""
        return self._done.is_set()

    def set(self, value: T) -> None:
        """Deliver ``value`` (ignored if already delivered)."""
        if not self._done.is_set():
            self._value = value
            self._done.set()

    def fail(self, error: BaseException) -> None:
        """Deliver ``error``: every :meth:`get` raises it (ignored if already delivered)."""
        if not self._done.is_set():
            self._error = error
            self._done.set()

    async def get(self) -> T:
        """Wait for the delivery; return the value or raise the error.

        Cancellation: safe — nothing is consumed; a later call waits again.
        """
        await self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


@final
class Notifier:
    """Wakes every waiter on each :meth:`notify`; a waiter re-checks its own condition.

    Usage::

        while not condition():
            await notifier.wait()

    A notification is not lost between the check and the wait as long as no checkpoint lies
    between them (the loop above has none).
    """

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = anyio.Event()

    def notify(self) -> None:
        """Wake every task waiting now (tasks that wait later wait for the next one)."""
        event, self._event = self._event, anyio.Event()
        event.set()

    async def wait(self) -> None:
        """Wait for the next :meth:`notify`.

        Cancellation: safe — nothing is consumed.
        """
        await self._event.wait()
