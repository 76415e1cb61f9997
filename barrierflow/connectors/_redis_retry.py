"""How a :class:`~barrierflow.connectors.redis_streams.RedisStreamLog` rides out a server that
goes away: the retry policy (:class:`RetryBackoff`) and the loop that applies it to one call.

**The bound is time, not a count.** A call that fails with a connection error is retried after
a doubling delay capped at ``max_delay`` (no jitter), for as long as ``timeout`` seconds have
not passed since its first failure; the last wait is shortened so that the last attempt is
made at that bound. Only then is it given up, raising
:class:`~barrierflow.connectors.errors.SplitLogUnavailableError`. So a server that is back
within ``timeout`` seconds is always found again, however the attempts were spaced — a retry
*count* could not promise that (the former default of 8 retries was spent in about 7 s of a
bound documented as 30 s, and a 7 s outage killed the pipeline). A count can still be set
(``retries=``) as an extra, earlier bound.

**Every failed attempt logs one warning line** (structlog, logger ``barrierflow.split_log``):
``attempt`` (1 = the first call), the ``wait`` before the next attempt, the seconds
``elapsed`` since the first failure, and the error's ``cause`` in one line; the attempt that
gives up logs ``giving up`` instead of a wait, and a call that succeeds after failures logs
one info line. An outage is visible while it lasts, not only when it ends a pipeline.

It lives apart from the log because it is policy, not protocol: the log's commands do not
depend on it. The sink coordinator's commit backoff
(:class:`barrierflow.actors.sinks.coordinator.commit_queue.RetryBackoff`) shares only the
capped doubling: it adds full jitter, has no bound (a commit is retried until it goes
through), and counts failures for the coordinator's stats.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar, final

import anyio
import structlog

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

    The wait before retry ``n`` is ``min(initial * 2**(n-1), max_delay)`` seconds, shortened
    to end exactly ``timeout`` seconds after the first failure; a failure at or past that
    moment gives up. With the defaults (50 ms doubling to 2 s, 30 s) that is about 20 retries,
    the last at 30 s. ``retries``, if set, gives up earlier, once that many retries failed.

    Raises:
        InvalidArgumentError: a delay or timeout that is not a positive finite number, or a
            retry count that is neither ``None`` nor an int >= 0.
    """

    initial: float = 0.05
    max_delay: float = 2.0
    #: An extra bound on the number of retries; ``None``: only ``timeout`` bounds them.
    retries: int | None = None
    timeout: float = 30.0

    def __post_init__(self) -> None:
        for name in ("initial", "max_delay", "timeout"):
            value = getattr(self, name)
            if type(value) not in (int, float) or not 0 < value < float("inf"):
                raise InvalidArgumentError(f"RetryBackoff.{name}", "a positive number", value)
        if self.retries is not None and (type(self.retries) is not int or self.retries < 0):
            raise InvalidArgumentError("RetryBackoff.retries", "None or an int >= 0", self.retries)

    def delay(self, retry: int) -> float:
        """The capped doubling wait before retry number ``retry`` (1-based), before the time
        bound shortens it."""
        return float(min(self.initial * 2 ** (retry - 1), self.max_delay))

    def wait(self, retry: int, elapsed: float) -> float | None:
        """The wait before retry number ``retry`` (1-based) when the last failure came
        ``elapsed`` seconds after the first one; ``None``: give up (the time bound is reached,
        or ``retries`` retries were made)."""
        remaining = self.timeout - elapsed
        if remaining <= 0 or (self.retries is not None and retry > self.retries):
            return None
        return min(self.delay(retry), remaining)


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
        backoff: the waits and the bound.
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
    while True:
        attempt += 1
        try:
            result = await call()
        except retry_on as exc:
            now = clock()
            if attempt == 1:
                first_failure = now
            elapsed = now - first_failure
            wait = None if closed() else backoff.wait(attempt, elapsed)
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
