"""Epochs: the numbers that name the slices of a stream between two barriers.

An epoch follows RisingWave's layout: the physical part is milliseconds since
2021-04-01T00:00:00Z, shifted left by :data:`EPOCH_PHYSICAL_SHIFT` (16) bits; the low 16 bits are
zero for epochs barrierflow makes. Epochs order the stream, so they must strictly increase even
when the wall clock stands still or steps back: :class:`EpochClock` guarantees that by moving
the physical part one millisecond past the previous epoch when the clock has not passed it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import final

from barrierflow.errors import EpochOrderError, InvalidArgumentError

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


def epoch_from_unix_ms(unix_ms: int) -> int:
    """The epoch whose physical time is ``unix_ms`` (milliseconds since 1970-01-01 UTC).

    Raises:
        InvalidArgumentError: ``unix_ms`` is before 2021-04-01T00:00:00Z.
    """
    if unix_ms < EPOCH_BASE_UNIX_MS:
        raise InvalidArgumentError(
            "unix_ms", f"a time at or after 2021-04-01 UTC ({EPOCH_BASE_UNIX_MS})", unix_ms
        )
    return (unix_ms - EPOCH_BASE_UNIX_MS) << EPOCH_PHYSICAL_SHIFT


def physical_time_ms(epoch: int) -> int:
    """Milliseconds since the Unix epoch at which ``epoch`` was made."""
    if epoch < 0:
        raise InvalidArgumentError("epoch", "a non-negative epoch", epoch)
    return (epoch >> EPOCH_PHYSICAL_SHIFT) + EPOCH_BASE_UNIX_MS


@final
@dataclass(frozen=True, slots=True)
class EpochPair:
    """The epoch a barrier opens (``curr``) and the one it closes (``prev``).

    Data between two barriers belongs to the ``curr`` of the barrier before it. ``prev`` is 0
    only for the very first barrier of a fresh job.

    Raises:
        EpochOrderError: ``curr`` is not greater than ``prev``.
        InvalidArgumentError: an epoch is negative or not an ``int``.
    """

    curr: int
    prev: int

    def __post_init__(self) -> None:
        for name, value in (("curr", self.curr), ("prev", self.prev)):
            if type(value) is not int or value < 0:
                raise InvalidArgumentError(f"EpochPair.{name}", "a non-negative int", value)
        if self.curr <= self.prev:
            raise EpochOrderError("EpochPair.curr", self.prev, self.curr)

    def advance(self, curr: int) -> EpochPair:
        """The pair that follows this one: ``EpochPair(curr, self.curr)``.

        Raises:
            EpochOrderError: ``curr`` is not greater than ``self.curr``.
        """
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
    """

    __slots__ = ("_clock", "_last")

    def __init__(self, last: int = 0, clock: Callable[[], float] = time.time) -> None:
        if type(last) is not int or last < 0:
            raise InvalidArgumentError("last", "a non-negative int epoch", last)
        self._last = last
        self._clock = clock

    @property
    def last(self) -> int:
        """The last epoch handed out (or the starting point)."""
        return self._last

    def next(self) -> int:
        """A new epoch, strictly greater than every epoch handed out before."""
        unix_ms = int(self._clock() * 1000)
        now = epoch_from_unix_ms(max(unix_ms, EPOCH_BASE_UNIX_MS))
        # Keep the low bits zero so physical_time_ms() stays exact for our epochs.
        floor = ((self._last >> EPOCH_PHYSICAL_SHIFT) + 1) << EPOCH_PHYSICAL_SHIFT
        self._last = max(now, floor)
        return self._last

    def next_pair(self) -> EpochPair:
        """The pair ``(next(), previous last)``: what the next barrier carries."""
        prev = self._last
        return EpochPair(self.next(), prev)
