"""A fake wall clock for tests that must not sleep."""

from __future__ import annotations

from typing import final

from barrierflow.errors import InvalidArgumentError


@final
class FakeClock:
    """Seconds since the Unix epoch, advanced only by :meth:`advance` or :meth:`set`.

    Call the instance to read it, so it can stand in for :func:`time.time`.
    """

    __slots__ = ("_now",)

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = float(start)

    def __call__(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move forward by ``seconds`` (≥ 0)."""
        if seconds < 0:
            raise InvalidArgumentError("seconds", "a non-negative duration", seconds)
        self._now += seconds

    def set(self, now: float) -> None:
        """Jump to ``now``, backwards included (clocks do step back)."""
        self._now = float(now)
