"""Source backfill end to end on a real server: a live split source over Redis streams feeds a
running job; a second job joins mid-run with a source backfill, while records keep arriving,
and ends up with every record of every stream exactly once, in order."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import anyio
import anyio.to_thread
import pyarrow as pa
import pytest
import redis
from _timeouts import scaled

from barrierflow.actors.backfill.source_backfill import SourceBackfill
from barrierflow.actors.sources.split_log import OFFSET_MAJOR, OFFSET_MINOR, SPLIT_COLUMN
from barrierflow.actors.sources.split_source import SplitSource
from barrierflow.channels import Chunk, Message
from barrierflow.channels.mutation import Pause
from barrierflow.connectors import RedisStreamLog
from barrierflow.runtime import ActorContext, Job, Runtime, RuntimeConfig, StreamActor
from barrierflow.testing.redis_server import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

PAYLOAD = pa.schema([("n", pa.int64())])


class Collect(StreamActor):
    """Records (split, "<ms>-<seq>") of every visible row."""

    def __init__(self, seen: list[tuple[str, str]]) -> None:
        self.seen = seen

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
        await ctx.emit(message)


def append(conn: redis.Redis, keys: list[str], count: int) -> None:
    """``count`` more records on every stream (one pipeline)."""
    pipe = conn.pipeline(transaction=False)
    for key in keys:
        for i in range(count):
            pipe.xadd(key, {"n": str(i)})
    pipe.execute()


def per_split(seen: list[tuple[str, str]]) -> dict[str, list[str]]:
    result: dict[str, list[str]] = {}
    for split, offset in seen:
        result.setdefault(split, []).append(offset)
    return result


def stream_ids(conn: redis.Redis, keys: list[str]) -> dict[str, list[str]]:
    return {k: [bytes(i).decode() for i, _ in conn.xrange(k)] for k in keys}


async def test_a_job_joining_a_live_redis_source_gets_history_and_live_records_once(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    prefix = redis_server.key_prefix()
    keys = [f"{prefix}s{i}" for i in range(3)]
    live_seen: list[tuple[str, str]] = []
    joined_seen: list[tuple[str, str]] = []
    with redis_server.client() as conn:
        await anyio.to_thread.run_sync(partial(append, conn, keys, 200))
        log = RedisStreamLog(redis_server.url, payload=PAYLOAD, splits=keys, block_ms=50)
        rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=0.05))
        rt.add_source("events", lambda: SplitSource(log, batch_rows=64))
        rt.add_actor("live", lambda: Collect(live_seen), inputs=["events"])
        with anyio.fail_after(scaled(60)):
            async with log, rt:
                while len(live_seen) < 300:  # the live job is under way
                    await rt.checkpoint()
                job = Job("history")
                job.add_actor(
                    "backfill",
                    lambda: SourceBackfill(log, batch_rows=50),
                    inputs={"upstream": "events"},
                )
                job.add_actor("collect", lambda: Collect(joined_seen), inputs=["backfill"])
                handle = await rt.add_job(job)
                # Records keep arriving while the new job catches up.
                for _ in range(3):
                    await anyio.to_thread.run_sync(partial(append, conn, keys, 50))
                    await rt.checkpoint()
                await handle.wait_ready()
                expected = await anyio.to_thread.run_sync(stream_ids, conn, keys)
                while sum(map(len, per_split(live_seen).values())) < 3 * 350:
                    await rt.checkpoint()
                for _ in range(3):  # the live source passes every backfill's stop
                    await rt.checkpoint()
    assert per_split(live_seen) == expected
    assert per_split(joined_seen) == expected


async def test_a_redis_source_reports_its_lag_per_split_behind_the_streams(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    prefix = redis_server.key_prefix()
    keys = [f"{prefix}s{i}" for i in range(3)]
    seen: list[tuple[str, str]] = []
    with redis_server.client() as conn:
        await anyio.to_thread.run_sync(partial(append, conn, keys, 100))
        log = RedisStreamLog(redis_server.url, payload=PAYLOAD, splits=keys, block_ms=50)
        rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=3600.0))
        # 64-row batches over three streams: the reader's batches mix and cut the streams.
        rt.add_source("events", lambda: SplitSource(log, batch_rows=64))
        rt.add_actor("live", lambda: Collect(seen), inputs=["events"])
        with anyio.fail_after(scaled(60)):
            async with log, rt:
                while len(seen) < 300:
                    await rt.checkpoint()
                caught_up = {f.name: f for f in await rt.metrics.snapshot()}
                await rt.mutate(Pause())
                await anyio.to_thread.run_sync(partial(append, conn, keys, 7))
                behind = {f.name: f for f in await rt.metrics.snapshot()}
    for key in keys:
        labels = {"actor": "events", "kind": "source", "split": key}
        assert caught_up["barrierflow_source_records_read"].value(**labels) == 100
        assert caught_up["barrierflow_source_lag_records"].value(**labels) == 0
        assert behind["barrierflow_source_lag_records"].value(**labels) == 7
