"""A biased select over named inputs: always the first ready input in priority order.

The backfills read two sides at once — the live upstream and the history they are catching up
on — and must never starve the upstream (its barriers drive checkpoints), so, like the seeds'
``select_with_strategy``, every receive polls the inputs in the order given and takes from the
first that has a message. Each side can be paused: a paused input is not read (its messages
wait in its channel, applying backpressure) until it is resumed.

Cancellation-safe: when no input is ready, the select waits on all of them at once; a message
that arrives while the caller is being cancelled is kept in the select (one per input, in
order) and is the next one returned from that input, so nothing is lost or reordered.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, Protocol, TypeVar, final, runtime_checkable

import anyio
import anyio.lowlevel

from barrierflow.channels.errors import InvalidArgumentError, UnknownInputError

__all__ = ["BiasedSelect", "PollableReceiver"]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


@runtime_checkable
class PollableReceiver(Protocol[T_co]):
    """A receive end that can also be polled (our channels and anyio's memory streams)."""

    async def receive(self) -> T_co: ...

    def receive_nowait(self) -> T_co: ...


_EMPTY: Any = object()


@final
class BiasedSelect(Generic[T]):
    """Receives from named inputs, preferring earlier ones (see the module docstring).

    Args:
        inputs: name → receiver, highest priority first.

    Raises:
        InvalidArgumentError: no inputs, a name that is not a non-empty str, or a receiver
            without ``receive()`` and ``receive_nowait()``.
    """

    def __init__(self, inputs: Mapping[str, PollableReceiver[T]]) -> None:
        if not isinstance(inputs, Mapping) or not inputs:
            raise InvalidArgumentError("inputs", "a non-empty mapping of name to receiver", inputs)
        for name, receiver in inputs.items():
            if not isinstance(name, str) or not name:
                raise InvalidArgumentError("inputs", "non-empty str names", name)
            if not isinstance(receiver, PollableReceiver):
                raise InvalidArgumentError(
                    "inputs", "receivers with receive() and receive_nowait()", receiver
                )
        self._inputs = dict(inputs)
        self._peeked: dict[str, Any] = dict.fromkeys(self._inputs, _EMPTY)
        self._paused: set[str] = set()
        self._ended: set[str] = set()
        self._changed = anyio.Event()

    def _check(self, name: str) -> str:
        if name not in self._inputs:
            raise UnknownInputError(name, list(self._inputs))
        return name

    def pause(self, name: str) -> None:
        """Stop reading ``name`` until :meth:`resume` (a waiting receive stops waiting on it).

        Raises:
            UnknownInputError: no input is named ``name``.
        """
        self._paused.add(self._check(name))
        self._wake()

    def resume(self, name: str) -> None:
        """Read ``name`` again.

        Raises:
            UnknownInputError: no input is named ``name``.
        """
        self._paused.discard(self._check(name))
        self._wake()

    def is_paused(self, name: str) -> bool:
        """Whether ``name`` is paused.

        Raises:
            UnknownInputError: no input is named ``name``.
        """
        return self._check(name) in self._paused

    def ended(self, name: str) -> bool:
        """Whether ``name`` reached its end of stream (and nothing of it is kept).

        Raises:
            UnknownInputError: no input is named ``name``.
        """
        return self._check(name) in self._ended and self._peeked[name] is _EMPTY

    def _wake(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def _poll(self) -> tuple[str, T] | None:
        for name, receiver in self._inputs.items():
            if name in self._paused:
                continue
            kept = self._peeked[name]
            if kept is not _EMPTY:
                self._peeked[name] = _EMPTY
                return name, kept
            if name in self._ended:
                continue
            try:
                return name, receiver.receive_nowait()
            except anyio.WouldBlock:
                continue
            except anyio.EndOfStream:
                self._ended.add(name)
        return None

    async def receive(self) -> tuple[str, T]:
        """The next message of the first ready, unpaused input, with that input's name.

        Cancellation: safe — a message taken while the caller is cancelled is kept for the
        next receive.

        Raises:
            anyio.EndOfStream: every input has ended (a paused input that has not ended keeps
                the select waiting).
        """
        while True:
            await anyio.lowlevel.checkpoint_if_cancelled()
            found = self._poll()
            if found is not None:
                await anyio.lowlevel.cancel_shielded_checkpoint()
                return found
            waiting = [n for n in self._inputs if n not in self._paused and n not in self._ended]
            if not waiting and len(self._ended) == len(self._inputs):
                raise anyio.EndOfStream
            await self._wait_any(waiting)

    async def _wait_any(self, names: list[str]) -> None:
        """Wait until one of ``names`` delivers (kept in ``_peeked``), ends, or the paused set
        changes."""
        changed = self._changed

        async def take(name: str, scope: anyio.CancelScope) -> None:
            try:
                self._peeked[name] = await self._inputs[name].receive()
            except anyio.EndOfStream:
                self._ended.add(name)
            scope.cancel()

        async def watch(scope: anyio.CancelScope) -> None:
            await changed.wait()
            scope.cancel()

        async with anyio.create_task_group() as tg:
            for name in names:
                tg.start_soon(take, name, tg.cancel_scope)
            tg.start_soon(watch, tg.cancel_scope)
