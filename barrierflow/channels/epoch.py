"""Epochs: the numbers that name the slices of a stream between two barriers.

An epoch follows RisingWave's layout: the physical part is milliseconds since
2021-04-01T00:00:00Z, shifted left by :data:`EPOCH_PHYSICAL_SHIFT` (16) bits; the low 16 bits are
zero for epochs barrierflow makes. Epochs order the stream, so they must strictly increase even
when the wall clock stands still or steps back: :class:`EpochClock` guarantees that by moving
the physical part one millisecond past the previous epoch when the clock has not passed it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, final

from barrierflow.channels.errors import EpochOrderError, InvalidArgumentError

__all__ = [
    "EPOCH_BASE_UNIX_MS",
    "EPOCH_PHYSICAL_SHIFT",
    "EpochPair",
    "EpochClock",
    "epoch_from_unix_ms",
    "physical_time_ms",
]

#: 2021-04-01T00:00:00Z in milliseconds since the Unix epoch (RisingWave's epoch base).
EPOCH_BASE_UNIX_MS = 1_617_235_200_000
#: Bits below the physical milliseconds.
EPOCH_PHYSICAL_SHIFT = 16
_UNIT = 1 << EPOCH_PHYSICAL_SHIFT
#: The largest epoch: epochs are stored as signed 64-bit integers (SQLite, Arrow), so a larger
#: one would be accepted here and fail only when a checkpoint commits it.
MAX_EPOCH = (1 << 63) - 1
#: The latest wall-clock time (ms since the Unix epoch) whose epoch fits in :data:`MAX_EPOCH`.
_MAX_UNIX_MS = (MAX_EPOCH >> EPOCH_PHYSICAL_SHIFT) + EPOCH_BASE_UNIX_MS


def check_epoch(argument: str, value: Any) -> int:
    """``value`` if it is an epoch: an ``int`` (not a bool) in ``0..MAX_EPOCH``.

    Raises:
        InvalidArgumentError: it is not.
    """
    if type(value) is not int or not 0 <= value <= MAX_EPOCH:
        raise InvalidArgumentError(argument, f"an int epoch in 0..{MAX_EPOCH}", value)
    return value


def epoch_from_unix_ms(unix_ms: int) -> int:
    """The epoch whose physical time is ``unix_ms`` (milliseconds since 1970-01-01 UTC).

    Raises:
        InvalidArgumentError: ``unix_ms`` is not an ``int`` (a float or bool is refused: the
            epoch must be exact), is before 2021-04-01T00:00:00Z, or is so late that the epoch
            would not fit in 64 bits.
    """
    if type(unix_ms) is not int or not EPOCH_BASE_UNIX_MS <= unix_ms <= _MAX_UNIX_MS:
        raise InvalidArgumentError(
            "unix_ms",
            f"an int time in {EPOCH_BASE_UNIX_MS}..{_MAX_UNIX_MS} (from 2021-04-01 UTC)",
            unix_ms,
        )
    return (unix_ms - EPOCH_BASE_UNIX_MS) << EPOCH_PHYSICAL_SHIFT


def physical_time_ms(epoch: int) -> int:
    """Milliseconds since the Unix epoch at which ``epoch`` was made.

    Raises:
        InvalidArgumentError: ``epoch`` is not an int in ``0..MAX_EPOCH``.
    """
    return (check_epoch("epoch", epoch) >> EPOCH_PHYSICAL_SHIFT) + EPOCH_BASE_UNIX_MS


@final
@dataclass(frozen=True, slots=True)
class EpochPair:
    """The epoch a barrier opens (``curr``) and the one it closes (``prev``).

    Data between two barriers belongs to the ``curr`` of the barrier before it. ``prev`` is 0
    only for the very first barrier of a fresh job.

    Raises:
        EpochOrderError: ``curr`` is not greater than ``prev``.
        InvalidArgumentError: an epoch is not an ``int`` in ``0..2**63-1`` (a bool is refused).
    """

    curr: int
    prev: int

    def __post_init__(self) -> None:
        check_epoch("EpochPair.curr", self.curr)
        check_epoch("EpochPair.prev", self.prev)
        if self.curr <= self.prev:
            raise EpochOrderError("EpochPair.curr", self.prev, self.curr)

    def advance(self, curr: int) -> EpochPair:
        """The pair that follows this one: ``EpochPair(curr, self.curr)``.

        Raises:
            EpochOrderError: ``curr`` is not greater than ``self.curr``.
            InvalidArgumentError: ``curr`` is not an int epoch.
        """
        check_epoch("curr", curr)
        if curr <= self.curr:
            raise EpochOrderError("curr", self.curr, curr)
        return EpochPair(curr, self.curr)


@final
class EpochClock:
    """Hands out strictly increasing epochs from a wall clock.

    ``next()`` returns the epoch of the current time, or, if the clock has not moved past the
    last epoch handed out (a burst of barriers within one millisecond, or the clock stepping
    back), the last epoch plus one millisecond. Epochs therefore run ahead of the clock only
    while more than 1,000 are asked for in a second.

    Args:
        last: the last epoch already used (after recovery: the committed epoch); the next one
            is greater.
        clock: seconds since the Unix epoch; :func:`time.time` unless a test fakes it.

    Raises:
        InvalidArgumentError: ``last`` is not an int epoch, or ``clock`` is not callable.
    """

    __slots__ = ("_clock", "_last")

    def __init__(self, last: int = 0, clock: Callable[[], float] = time.time) -> None:
        self._last = check_epoch("last", last)
        if not callable(clock):
            raise InvalidArgumentError("clock", "a callable returning seconds", clock)
        self._clock = clock

    @property
    def last(self) -> int:
        """The last epoch handed out (or the starting point)."""
        return self._last

    def next(self) -> int:
        """A new epoch, strictly greater than every epoch handed out before.

        Raises:
            InvalidArgumentError: (argument ``clock``) the clock returned something that is not
                a finite number of seconds within the range of epochs, or the epochs ran out
                (``last`` is at the 64-bit limit). Nothing is handed out then.
        """
        seconds: object = self._clock()
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)  # NumPy's float64 is a float
            or not -math.inf < seconds < math.inf  # isfinite() overflows on a huge int
            or not -_MAX_UNIX_MS <= seconds * 1000 <= _MAX_UNIX_MS  # -huge * 1000 is -inf
        ):
            raise InvalidArgumentError(
                "clock", "a finite number of seconds since the Unix epoch", seconds
            )
        unix_ms = int(seconds * 1000)
        now = epoch_from_unix_ms(max(unix_ms, EPOCH_BASE_UNIX_MS))
        # Keep the low bits zero so physical_time_ms() stays exact for our epochs.
        floor = ((self._last >> EPOCH_PHYSICAL_SHIFT) + 1) << EPOCH_PHYSICAL_SHIFT
        if floor > MAX_EPOCH:
            raise InvalidArgumentError("clock", "room for another epoch", self._last)
        self._last = max(now, floor)
        return self._last

    def next_pair(self) -> EpochPair:
        """The pair ``(next(), previous last)``: what the next barrier carries.

        Raises:
            InvalidArgumentError: as for :meth:`next`.
        """
        prev = self._last
        return EpochPair(self.next(), prev)
