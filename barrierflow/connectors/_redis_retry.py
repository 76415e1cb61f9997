"""How a :class:`~barrierflow.connectors.redis_streams.RedisStreamLog` rides out a server that
goes away: the retry policy (:class:`RetryBackoff`) and the loop that applies it to one call.

**The waits are the library's one schedule.** A call that fails with a connection error is
retried after the seed's exponential backoff, :class:`barrierflow._backoff.RetryBackoff` —
the one the sink coordinator retries its commits with: with ``initial`` = *b* ms the n-th
retry waits *b*^n ms (10 ms, 100 ms, 1 s, ... for the default 10 ms), capped at
``max_delay``, times a uniform draw in [0, 1) (full jitter, from the policy's ``rng``). Each
call starts the schedule over (a call that went through is the seed's success). The log does
not compute delays of its own: one rule for "a remote side failed for a while", tested once;
the jitter also keeps the readers of many logs that lost one server from retrying in step.

**The bound is time, not a count.** Retries go on for as long as ``timeout`` seconds have not
passed since the call's first failure; the last wait is shortened so that the last attempt is
made at that bound. Only then is the call given up, raising
:class:`~barrierflow.connectors.errors.SplitLogUnavailableError`. So a server that is back
within ``timeout`` seconds is always found again, however the attempts were spaced — a retry
*count* could not promise that (the former default of 8 retries was spent in about 7 s of a
bound documented as 30 s, and a 7 s outage killed the pipeline). A count can still be set
(``retries=``) as an extra, earlier bound. This bound is what the policy adds to the shared
schedule: a commit is retried until it goes through, a read must give up at some point.

**Every failed attempt logs one warning line** (structlog, logger ``barrierflow.split_log``):
``attempt`` (1 = the first call), the ``wait`` before the next attempt, the seconds
``elapsed`` since the first failure, and the error's ``cause`` in one line; the attempt that
gives up logs ``giving up`` instead of a wait, and a call that succeeds after failures logs
one info line. An outage is visible while it lasts, not only when it ends a pipeline.

It lives apart from the log because it is policy, not protocol: the log's commands do not
depend on it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, final

import anyio
import structlog

from barrierflow._backoff import MILLISECOND
from barrierflow._backoff import RetryBackoff as Schedule
from barrierflow._extras import require
from barrierflow._one_line import one_line
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.connectors.errors import SplitLogUnavailableError

__all__ = ["RetryBackoff", "RetryHook", "call_with_retry", "connection_errors"]

T = TypeVar("T")


def connection_errors() -> tuple[type[BaseException], ...]:
    """What a call retries on: the server is unreachable, went away, or is still loading
    (redis-py's classes, imported here rather than at module import: the ``[redis]`` extra).

    Raises:
        MissingExtraError: redis-py is not installed.
    """
    exceptions = require("redis", "redis.exceptions")
    return (exceptions.ConnectionError, exceptions.TimeoutError, OSError)


@final
@dataclass(frozen=True, slots=True)
class RetryBackoff:
    """How long, and how often, a call is retried while the server is unreachable.

    The wait before retry ``n`` of one call is the shared schedule's (see the module): with
    ``initial`` = *b* ms, *b*^n ms capped at ``max_delay``, times a draw of ``rng`` in
    [0, 1) — shortened to end exactly ``timeout`` seconds after the call's first failure; a
    failure at or past that moment gives up. With the defaults (10 ms, 100 ms, 1 s, then at
    most 2 s; 30 s) the retries come about 1 s apart on average, the last at 30 s.
    ``retries``, if set, gives up earlier, once that many retries failed.

    Raises:
        InvalidArgumentError: a delay or timeout that is not a positive finite number, an
            ``initial`` below 1 ms (its number of milliseconds is the schedule's growth
            factor: below 1 the waits would shrink), a retry count that is neither ``None``
            nor an int >= 0, or an ``rng`` that is not a :class:`random.Random`.
    """

    initial: float = 0.01
    max_delay: float = 2.0
    #: An extra bound on the number of retries; ``None``: only ``timeout`` bounds them.
    retries: int | None = None
    timeout: float = 30.0
    #: The jitter's random source, shared by the calls (a test passes a seeded one).
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("initial", "max_delay", "timeout"):
            value = getattr(self, name)
            if type(value) not in (int, float) or not 0 < value < float("inf"):
                raise InvalidArgumentError(f"RetryBackoff.{name}", "a positive number", value)
        if self.initial < MILLISECOND:
            raise InvalidArgumentError(
                "RetryBackoff.initial", "at least 0.001 seconds (1 ms)", self.initial
            )
        if self.retries is not None and (type(self.retries) is not int or self.retries < 0):
            raise InvalidArgumentError("RetryBackoff.retries", "None or an int >= 0", self.retries)
        if not isinstance(self.rng, random.Random):
            raise InvalidArgumentError("RetryBackoff.rng", "a random.Random", self.rng)

    def schedule(self) -> Schedule:
        """The shared schedule, from its first delay, for the retries of one call (each call
        starts over; the calls share only ``rng``)."""
        return Schedule(self.initial, self.max_delay, self.rng)

    def wait(self, schedule: Schedule, retry: int, elapsed: float) -> float | None:
        """The wait before retry number ``retry`` (1-based) of the call whose retries
        ``schedule`` spaces, when the last failure came ``elapsed`` seconds after the first
        one: the schedule's next delay, shortened to end at the time bound; ``None``: give up
        (the time bound is reached, or ``retries`` retries were made; the schedule is then
        not stepped)."""
        remaining = self.timeout - elapsed
        if remaining <= 0 or (self.retries is not None and retry > self.retries):
            return None
        return min(schedule.failed(), remaining)


#: Called before each retry's wait with the retry number (1-based), the wait in seconds and
#: the connection error; runs in the reading task (it may set an event, not block).
RetryHook = Callable[[int, float, BaseException], None]


async def call_with_retry(
    call: Callable[[], Awaitable[T]],
    backoff: RetryBackoff,
    *,
    name: str,
    closed: Callable[[], bool],
    on_retry: RetryHook | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[Any]] = anyio.sleep,
) -> tuple[T, bool]:
    """Await ``call()``, calling it again after ``backoff``'s wait on a connection error.
    Returns the result and whether a retry was needed. Each failed attempt logs one warning
    (see the module).

    Args:
        call: one attempt (a fresh awaitable per call).
        backoff: the waits (a fresh schedule for this call) and the bound.
        name: the server, for the error and the log lines.
        closed: whether the log was closed meanwhile (then a failure is final at once).
        on_retry: called before each retry's wait.
        clock: seconds, monotonic (tests pass a fake one).
        sleep: waits a number of seconds (tests pass one that advances the fake clock).

    Raises:
        SplitLogUnavailableError: past the bound, or a failure after ``closed()``; the last
            connection error is its cause.

    Cancellation: a cancelled wait or attempt ends the call; nothing is retried afterwards.
    """
    log = structlog.get_logger("barrierflow.split_log").bind(log=name)
    retry_on = connection_errors()
    attempt = 0
    first_failure = 0.0
    schedule: Schedule | None = None  # made at the first failure: most calls need none
    while True:
        attempt += 1
        try:
            result = await call()
        except retry_on as exc:
            now = clock()
            if schedule is None:
                first_failure = now
                schedule = backoff.schedule()
            elapsed = now - first_failure
            wait = None if closed() else backoff.wait(schedule, attempt, elapsed)
            cause = one_line(exc)
            if wait is None:
                log.warning(
                    "split log unreachable, giving up",
                    attempt=attempt, elapsed=round(elapsed, 3), cause=cause,
                )  # fmt: skip
                raise SplitLogUnavailableError(name, attempt, elapsed) from exc
            log.warning(
                "split log unreachable, retrying",
                attempt=attempt, wait=round(wait, 3), elapsed=round(elapsed, 3), cause=cause,
            )  # fmt: skip
            if on_retry is not None:
                on_retry(attempt, wait, exc)
            await sleep(wait)
        else:
            if attempt > 1:
                log.info(
                    "split log reachable again",
                    attempts=attempt, elapsed=round(clock() - first_failure, 3),
                )  # fmt: skip
            return result, attempt > 1
