"""Calls that must be awaited: a runtime method called without ``await`` is reported, not lost.

``rt.push("events", chunk)`` without ``await`` makes a coroutine that never runs: the rows are
never sent, and Python only prints a ``RuntimeWarning`` when the coroutine is collected. The
runtime's driving methods are therefore wrapped by :func:`must_await`: each call still returns
a real coroutine (so ``await``, ``tg.start_soon(rt.checkpoint)`` and blocking portals work as
before), tagged so that when it is collected without ever having started, the call is logged
as an error naming it and kept in the runtime's :class:`UnawaitedCalls`; leaving
``async with rt:`` then fails with :class:`~barrierflow.errors.NotAwaitedError` instead of
exiting cleanly with rows missing.

(A coroutine that a task group cancels before its first step is counted too: what it was to
do did not happen either, and such an exit is already an error exit.)
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar, final

import structlog

__all__ = ["UnawaitedCalls", "must_await"]

P = ParamSpec("P")
R = TypeVar("R")


@final
class UnawaitedCalls:
    """The calls of one runtime that were never awaited, in the order they were collected."""

    __slots__ = ("calls",)

    def __init__(self) -> None:
        #: How each call read (``"rt.push('events', ...)"``).
        self.calls: list[str] = []

    def add(self, call: str) -> None:
        """Record ``call`` and log it as an error (its work never happened)."""
        self.calls.append(call)
        structlog.get_logger("barrierflow.runtime").error(
            f"{call} was never awaited: it did nothing (write `await {call}`)", call=call
        )


class _Owner(Protocol):
    @property
    def unawaited_calls(self) -> UnawaitedCalls: ...


S = TypeVar("S", bound=_Owner)


def must_await(
    method: Callable[Concatenate[S, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, R]]:
    """Wrap an ``async def`` method so that a call never awaited is recorded (see the module)."""

    def call(self: S, /, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R]:
        started = [False]

        async def awaited() -> R:
            started[0] = True
            return await method(self, *args, **kwargs)

        first = f"{args[0]!r}, ..." if args and isinstance(args[0], str) else "..." if args else ""
        coroutine = awaited()
        weakref.finalize(
            coroutine, _collected, started, f"rt.{method.__name__}({first})", self.unawaited_calls
        )
        return coroutine

    functools.update_wrapper(call, method)
    return call


def _collected(started: list[bool], call: str, ledger: UnawaitedCalls) -> None:
    if not started[0]:
        ledger.add(call)
