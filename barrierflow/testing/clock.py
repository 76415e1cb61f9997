"""A fake wall clock for tests that must not sleep."""

from __future__ import annotations

from typing import final

from barrierflow.channels.errors import InvalidArgumentError


@final
class FakeClock:
    """Seconds since the Unix epoch, advanced only by :meth:`advance` or :meth:`set`.

    Call the instance to read it, so it can stand in for :func:`time.time`. Every time and
    duration must be a finite number (a bool, NaN or infinity is refused).

    Raises:
        InvalidArgumentError: ``start`` is not a finite number.
    """

    __slots__ = ("_now",)

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = _finite("start", start)

    def __call__(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move forward by ``seconds`` (≥ 0).

        Raises:
            InvalidArgumentError: ``seconds`` is not a finite number ≥ 0.
        """
        if _finite("seconds", seconds) < 0:
            raise InvalidArgumentError("seconds", "a non-negative duration", seconds)
        self._now = _finite("seconds", self._now + seconds)

    def set(self, now: float) -> None:
        """Jump to ``now``, backwards included (clocks do step back).

        Raises:
            InvalidArgumentError: ``now`` is not a finite number.
        """
        self._now = _finite("now", now)


def _finite(argument: str, value: object) -> float:
    # Compared, not math.isfinite(): that raises OverflowError on a huge int.
    if isinstance(value, bool) or not isinstance(value, int | float) or not -_MAX < value < _MAX:
        raise InvalidArgumentError(argument, "a finite number of seconds", value)
    return float(value)


_MAX = 1e300  # far beyond any clock, and float() of it cannot overflow
