"""How a :class:`~barrierflow.connectors.redis_streams.RedisStreamLog` rides out a server that
goes away: the retry policy (:class:`RetryBackoff`) and the loop that applies it to one call.

A call that fails with a connection error is retried after a doubling, capped delay (no
jitter), and given up — raising
:class:`~barrierflow.connectors.errors.SplitLogUnavailableError` — once a retry count or a
time bound is spent, so a reader never hangs for ever on a server that is gone. It lives apart
from the log because it is policy, not protocol: the log's commands do not depend on it.

The sink coordinator's commit backoff
(:class:`barrierflow.actors.sinks.coordinator.commit_queue.RetryBackoff`) shares only the
capped doubling: it adds full jitter, has no bound (a commit is retried until it goes
through), and counts failures for the coordinator's stats.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar, final

import anyio
import redis.exceptions

from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.connectors.errors import SplitLogUnavailableError

__all__ = ["CONNECTION_ERRORS", "RetryBackoff", "RetryHook", "call_with_retry"]

T = TypeVar("T")

#: What a call retries on: the server is unreachable, went away, or is still loading.
CONNECTION_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)


@final
@dataclass(frozen=True, slots=True)
class RetryBackoff:
    """How a call retries while the server is unreachable.

    The n-th retry waits ``min(initial * 2**(n-1), max_delay)`` seconds. The call gives up
    (:class:`~barrierflow.connectors.errors.SplitLogUnavailableError`) when ``retries``
    retries have failed, or when the next wait would end more than ``timeout`` seconds after
    the first failure.

    Raises:
        InvalidArgumentError: a delay or timeout that is not a positive finite number, or a
            negative retry count.
    """

    initial: float = 0.05
    max_delay: float = 2.0
    retries: int = 8
    timeout: float = 30.0

    def __post_init__(self) -> None:
        for name in ("initial", "max_delay", "timeout"):
            value = getattr(self, name)
            if type(value) not in (int, float) or not 0 < value < float("inf"):
                raise InvalidArgumentError(f"RetryBackoff.{name}", "a positive number", value)
        if type(self.retries) is not int or self.retries < 0:
            raise InvalidArgumentError("RetryBackoff.retries", "an int >= 0", self.retries)

    def delay(self, retry: int) -> float:
        """The wait before retry number ``retry`` (1-based)."""
        return float(min(self.initial * 2 ** (retry - 1), self.max_delay))


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
) -> tuple[T, bool]:
    """Await ``call()``, calling it again after ``backoff``'s delay on a connection error.
    Returns the result and whether a retry was needed.

    Args:
        call: one attempt (a fresh awaitable per call).
        backoff: the delays and the bound.
        name: the server, for the error.
        closed: whether the log was closed meanwhile (then a failure is final at once).
        on_retry: called before each retry's wait.

    Raises:
        SplitLogUnavailableError: past the bound, or a failure after ``closed()``; the last
            connection error is its cause.
    """
    retry = 0
    first_failure = 0.0
    while True:
        try:
            return await call(), retry > 0
        except CONNECTION_ERRORS as exc:
            now = time.monotonic()
            if retry == 0:
                first_failure = now
            retry += 1
            delay = backoff.delay(retry)
            elapsed = now - first_failure
            if closed() or retry > backoff.retries or (elapsed + delay > backoff.timeout):
                raise SplitLogUnavailableError(name, retry, elapsed) from exc
            if on_retry is not None:
                on_retry(retry, delay, exc)
            await anyio.sleep(delay)
