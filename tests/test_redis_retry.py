"""The Redis split log's retry policy (issue 24, item 4): the waits are the library's one
schedule (the seed's: base^n ms capped, times full jitter, from the first delay again for each
call), the bound is time, not a count — retries go on until ``timeout`` seconds after the
first failure, the last attempt at that bound — and every failed attempt logs one warning line
with its attempt number, the wait and the error's cause. The policy runs on a fake clock (no
real waiting) and a fixed or seeded jitter draw; one test stops a real server for about a
second under a pipeline with recovery off, which must go on with every record exactly once."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pyarrow as pa
import pytest
import redis
import redis.exceptions
import structlog.testing
from _timeouts import scaled

from barrierflow.actors.sources.split_log import OFFSET_MAJOR, OFFSET_MINOR, SPLIT_COLUMN
from barrierflow.actors.sources.split_source import SplitSource
from barrierflow.channels import Chunk, Message
from barrierflow.connectors import RedisStreamLog, RetryBackoff
from barrierflow.connectors._redis_retry import call_with_retry
from barrierflow.errors import InvalidArgumentError, SplitLogUnavailableError
from barrierflow.runtime import ActorContext, Runtime, RuntimeConfig, StreamActor
from barrierflow.testing.clock import FakeClock
from barrierflow.testing.redis_server import RedisServer

pytestmark = pytest.mark.anyio

REFUSED = "Error 111 connecting to 127.0.0.1:6379. Connection refused."


class Server:
    """A fake server call: fails with a connection error until the fake clock reaches
    ``back_at`` (``None``: never), then answers ``"ok"``. Waits advance the clock."""

    def __init__(self, clock: FakeClock, back_at: float | None) -> None:
        self.clock = clock
        self.back_at = back_at
        self.attempts: list[float] = []  # when each attempt was made
        self.waits: list[float] = []

    async def call(self) -> str:
        await anyio.lowlevel.checkpoint()
        self.attempts.append(self.clock())
        if self.back_at is None or self.clock() < self.back_at:
            raise redis.exceptions.ConnectionError(REFUSED + "\nsecond line of detail")
        return "ok"

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.clock.advance(seconds)
        await anyio.lowlevel.checkpoint()


async def run(server: Server, backoff: RetryBackoff, *, closed: bool = False) -> tuple[str, bool]:
    return await call_with_retry(
        server.call,
        backoff,
        name="redis://test:1/0",
        closed=lambda: closed,
        clock=server.clock,
        sleep=server.sleep,
    )


class FixedDraw(random.Random):
    """A jitter source whose every draw is ``draw``: the waits are the schedule's delays times
    it, exact floats for a draw of 0.5."""

    def __init__(self, draw: float) -> None:
        super().__init__(0)
        self.draw = draw

    def random(self) -> float:
        return self.draw


HALF = FixedDraw(0.5)


def warnings_of(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["log_level"] == "warning"]


async def test_retries_continue_until_the_time_bound_not_a_count() -> None:
    clock = FakeClock(0.0)
    server = Server(clock, back_at=None)
    with pytest.raises(SplitLogUnavailableError) as caught:
        await run(server, RetryBackoff(initial=0.01, max_delay=2.0, timeout=30.0, rng=HALF))
    # The seed's schedule (10 ms, 100 ms, 1 s, then the 2 s cap, each times the draw of 0.5),
    # the last wait shortened so that the last attempt is at the bound.
    assert server.waits[:6] == pytest.approx([0.005, 0.05, 0.5, 1.0, 1.0, 1.0])
    assert max(server.waits) == 1.0
    assert sum(server.waits) == pytest.approx(30.0)
    assert server.attempts[-1] == pytest.approx(30.0)
    assert len(server.attempts) > 8  # the former count bound was spent in about 7 s
    assert caught.value.attempts == len(server.attempts)
    assert caught.value.elapsed == pytest.approx(30.0)
    assert isinstance(caught.value.__cause__, redis.exceptions.ConnectionError)


async def test_an_outage_shorter_than_the_bound_is_ridden_out() -> None:
    clock = FakeClock(0.0)
    server = Server(clock, back_at=29.5)
    assert await run(server, RetryBackoff(timeout=30.0)) == ("ok", True)
    assert server.attempts[-1] >= 29.5


async def test_every_failed_attempt_logs_one_warning_with_attempt_wait_and_cause() -> None:
    clock = FakeClock(0.0)
    server = Server(clock, back_at=None)
    with structlog.testing.capture_logs() as logs, pytest.raises(SplitLogUnavailableError):
        await run(server, RetryBackoff(initial=1.0, max_delay=4.0, timeout=10.0, rng=HALF))
    warned = warnings_of(logs)
    # Waits of 1 s, then 1000 s capped at 4 s, times 0.5; the last one shortened to 1.5 s:
    # six retries, then the one that gives up at the bound.
    assert server.attempts == [0.0, 0.5, 2.5, 4.5, 6.5, 8.5, 10.0]
    assert len(warned) == len(server.attempts)
    for number, (entry, wait) in enumerate(zip(warned, server.waits, strict=False), start=1):
        assert entry["attempt"] == number
        assert entry["wait"] == wait
        assert entry["log"] == "redis://test:1/0"
    assert [e.get("wait") for e in warned] == [0.5, 2.0, 2.0, 2.0, 2.0, 1.5, None]
    assert warned[-1]["attempt"] == 7
    assert warned[-1]["elapsed"] == 10.0
    assert "giving up" in warned[-1]["event"]
    for entry in warned:
        assert entry["cause"] == f"ConnectionError: {REFUSED}"  # one line, typed


async def test_a_call_that_succeeds_after_failures_logs_one_info_line_and_no_more_warnings() -> (
    None
):
    clock = FakeClock(0.0)
    server = Server(clock, back_at=0.3)
    with structlog.testing.capture_logs() as logs:
        backoff = RetryBackoff(initial=0.1, max_delay=1.0, rng=HALF)
        assert await run(server, backoff) == ("ok", True)
    # Attempts at 0 and 0.05 s fail; the one at 0.55 s answers.
    assert [e["attempt"] for e in warnings_of(logs)] == [1, 2]
    assert [e["attempts"] for e in logs if e["log_level"] == "info"] == [3]


async def test_a_retry_count_when_set_is_an_earlier_bound() -> None:
    clock = FakeClock(0.0)
    server = Server(clock, back_at=None)
    with pytest.raises(SplitLogUnavailableError) as caught:
        await run(server, RetryBackoff(initial=0.1, retries=2, timeout=30.0, rng=HALF))
    assert caught.value.attempts == 3
    assert server.waits == pytest.approx([0.05, 1.0])  # 100 ms, then 10 s capped at 2 s; halved


async def test_a_closed_log_gives_up_at_the_first_failure() -> None:
    clock = FakeClock(0.0)
    server = Server(clock, back_at=None)
    with pytest.raises(SplitLogUnavailableError) as caught:
        await run(server, RetryBackoff(), closed=True)
    assert caught.value.attempts == 1
    assert server.waits == []


def test_the_policy_waits_the_shared_schedule_shortened_to_the_bound() -> None:
    backoff = RetryBackoff(initial=0.01, max_delay=2.0, timeout=5.0, rng=HALF)
    schedule = backoff.schedule()
    assert [backoff.wait(schedule, n, 0.0) for n in (1, 2, 3, 4, 5)] == pytest.approx(
        [0.005, 0.05, 0.5, 1.0, 1.0]
    )
    assert backoff.wait(schedule, 9, 4.25) == 0.75  # 1.0 shortened to end at the bound
    assert backoff.wait(schedule, 9, 5.0) is None


async def test_the_waits_are_the_seeds_schedule_times_a_full_jitter_draw_of_rng() -> None:
    # The coordinator's schedule (barrierflow._backoff), not one of the log's own: 10^n ms
    # capped, each times one draw in [0, 1) of the policy's random source.
    clock = FakeClock(0.0)
    server = Server(clock, back_at=None)
    backoff = RetryBackoff(initial=0.01, max_delay=2.0, timeout=20.0, rng=random.Random(7))
    with pytest.raises(SplitLogUnavailableError):
        await run(server, backoff)
    draws = random.Random(7)
    unjittered = [0.01, 0.1, 1.0] + [2.0] * (len(server.waits) - 3)
    expected = [delay * draws.random() for delay in unjittered]
    assert server.waits[:-1] == pytest.approx(expected[:-1])
    assert server.waits[-1] <= expected[-1]  # shortened to the bound
    assert len(set(server.waits[3:-1])) == len(server.waits) - 4  # jittered: no two alike


async def test_each_call_starts_the_schedule_from_its_first_delay() -> None:
    # The seed's "a success starts the schedule over": a call's retries never continue where
    # an earlier call's stopped.
    clock = FakeClock(0.0)
    backoff = RetryBackoff(initial=0.01, max_delay=2.0, rng=HALF)
    first = Server(clock, back_at=0.6)
    assert await run(first, backoff) == ("ok", True)
    assert first.waits == pytest.approx([0.005, 0.05, 0.5, 1.0])
    second = Server(clock, back_at=clock() + 0.05)
    assert await run(second, backoff) == ("ok", True)
    assert second.waits == pytest.approx([0.005, 0.05])


@pytest.mark.parametrize("kwargs", [{"initial": 0.0005}, {"rng": 42}, {"rng": None}])
def test_the_policy_refuses_a_shrinking_schedule_or_a_bad_random_source(
    kwargs: dict[str, Any],
) -> None:
    # Below 1 ms, the base's number of milliseconds would make each delay shorter.
    with pytest.raises(InvalidArgumentError) as info:
        RetryBackoff(**kwargs)
    assert next(iter(kwargs)) in str(info.value.argument)


# -- a real server stopped under a running pipeline -----------------------------------------

PAYLOAD = pa.schema([("n", pa.int64())])


class Collect(StreamActor):
    """Records (split, "<ms>-<seq>") of every visible row; ``grew`` is set on each chunk."""

    def __init__(self, seen: list[tuple[str, str]], grew: list[anyio.Event]) -> None:
        self.seen = seen
        self.grew = grew

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk):
            rows = message.compact().batch
            self.seen.extend(
                (s, f"{a}-{b}")
                for s, a, b in zip(
                    rows.column(SPLIT_COLUMN).to_pylist(),
                    rows.column(OFFSET_MAJOR).to_pylist(),
                    rows.column(OFFSET_MINOR).to_pylist(),
                    strict=True,
                )
            )
            self.grew[0].set()
        await ctx.emit(message)


def append(server: RedisServer, keys: list[str], count: int) -> None:
    with server.client() as conn:
        pipe = conn.pipeline(transaction=False)
        for key in keys:
            for i in range(count):
                pipe.xadd(key, {"n": str(i)})
        pipe.execute()


def stream_ids(server: RedisServer, keys: list[str]) -> list[tuple[str, str]]:
    with server.client() as conn:
        return sorted((k, bytes(i).decode()) for k in keys for i, _ in conn.xrange(k))


@pytest.mark.redis
async def test_a_pipeline_without_recovery_survives_an_outage_shorter_than_the_bound(
    tmp_path: Path, redis_restartable: RedisServer
) -> None:
    server = redis_restartable
    keys = ["s0", "s1"]
    seen: list[tuple[str, str]] = []
    grew = [anyio.Event()]
    waited: list[float] = []
    enough_outage = anyio.Event()

    def on_retry(retry: int, wait: float, exc: BaseException) -> None:
        waited.append(wait)
        if sum(waited) >= 1.0:  # the server has been down for at least a second
            enough_outage.set()

    # Short waits, many of them: a bound of 8 retries would be spent in at most 0.4 s.
    backoff = RetryBackoff(initial=0.01, max_delay=0.05, timeout=scaled(5))

    async def wait_for(count: int) -> None:
        while len(seen) < count:
            grew[0] = anyio.Event()
            await grew[0].wait()

    await anyio.to_thread.run_sync(append, server, keys, 50)
    log = RedisStreamLog(
        server.url, payload=PAYLOAD, splits=keys, block_ms=50, backoff=backoff, on_retry=on_retry
    )
    rt = Runtime(
        RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=0.05, recovery=False)
    )
    rt.add_source("events", lambda: SplitSource(log, batch_rows=16))
    rt.add_actor("collect", lambda: Collect(seen, grew), inputs=["events"])
    with structlog.testing.capture_logs() as logs, anyio.fail_after(scaled(60)):
        async with log, rt:
            await wait_for(100)
            server.stop()
            await enough_outage.wait()
            await rt.checkpoint()  # barriers still flow while the reader retries
            await anyio.to_thread.run_sync(server.start)
            await anyio.to_thread.run_sync(append, server, keys, 30)
            await wait_for(160)
            await rt.checkpoint()
    assert sorted(seen) == await anyio.to_thread.run_sync(stream_ids, server, keys)
    assert len(seen) == len(set(seen)) == 160
    warned = [e for e in warnings_of(logs) if e.get("log") == log_name(server)]
    assert len(warned) == len(waited)
    assert all("retrying" in e["event"] for e in warned)


def log_name(server: RedisServer) -> str:
    return f"redis://{server.host}:{server.port}/0"
