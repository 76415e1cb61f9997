"""The library's one retry schedule: the seed's exponential backoff with full jitter.

The seed (RisingWave) retries a failed sink commit with tokio-retry's
``ExponentialBackoff::from_millis(base).max_delay(max)`` mapped through ``jitter``: with a base
of *b* ms the n-th retry (n = 1, 2, ...) waits *b*^n ms — for the default 10 ms that is
10 ms, 100 ms, 1 s, 10 s, ... (base^n, **not** a doubling) — capped at ``max``, times one
uniform draw in [0, 1) (*full* jitter: the wait is anywhere between 0 and the capped delay).
A success starts the schedule over.

Why the seed's and not another: the sink coordinator must behave as the seed does (its tests
compare the delays with tokio-retry's), and a second schedule elsewhere in the library — the
Redis split log had a capped doubling without jitter — would be a second rule to learn, test
and tune for the same situation (a remote side that fails for a while). Full jitter also
spreads the retries of many clients that failed together, which a fixed schedule does not.
Policies that need more (the Redis log's bound on the total time) wrap this class rather than
computing their own delays (:mod:`barrierflow.connectors._redis_retry`).
"""

from __future__ import annotations

import random
from collections import deque

__all__ = ["MILLISECOND", "RECENT_DELAYS", "RetryBackoff"]

#: One millisecond: the unit of the seed's backoff (tokio-retry's ``from_millis``).
MILLISECOND = 0.001

#: How many of the latest retry delays a backoff keeps for its owner's stats: a sink whose
#: commits fail for days must not grow a list for ever.
RECENT_DELAYS = 64


class RetryBackoff:
    """The seed's retry schedule (see the module), and the counters its owner reports.

    With ``base_delay`` = *b* ms, the n-th retry (n = 1, 2, ...) since the last success waits
    *b*^n ms — 10 ms, 100 ms, 1 s, 10 s, ... for 10 ms — capped at ``max_delay``, times one
    uniform draw in [0, 1) (full jitter). A success starts the schedule over. Every failure
    is counted; only the latest :data:`RECENT_DELAYS` delays are kept.

    Args:
        base_delay: the first delay, in seconds (at least 1 ms: its number of milliseconds is
            the growth factor; the caller checks it).
        max_delay: the cap, in seconds.
        rng: the jitter's random source (a test passes a seeded one, or one whose draw is
            fixed).
    """

    def __init__(self, base_delay: float, max_delay: float, rng: random.Random) -> None:
        self._base_ms = base_delay / MILLISECOND
        self._max = max_delay
        self._rng = rng
        self._current_ms = self._base_ms
        #: Failures since this backoff was made (a success does not reset it).
        self.failures = 0
        #: The latest backoff delays waited (seconds), oldest first.
        self.recent: deque[float] = deque(maxlen=RECENT_DELAYS)

    def next_delay(self) -> float:
        """The un-jittered delay of the next retry (seconds), and step the schedule."""
        delay = min(self._max, self._current_ms * MILLISECOND)
        # Saturate like tokio-retry's checked multiplication: once past the cap it stays there.
        if self._current_ms * MILLISECOND < self._max:
            self._current_ms *= self._base_ms
        return delay

    def failed(self) -> float:
        """An attempt failed: returns the (jittered) delay before its retry."""
        self.failures += 1
        jittered = self.next_delay() * self._rng.random()  # full jitter, as the seed's backoff
        self.recent.append(jittered)
        return jittered

    def succeeded(self) -> None:
        """An attempt went through: the next failure waits the first delay again."""
        self._current_ms = self._base_ms
