"""The split-log conformance suite: the in-memory log and the Redis Streams log keep the
contract; a log that breaks a rule is reported by the rule's name."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from functools import partial

import anyio.to_thread
import pyarrow as pa
import pytest
import redis

from barrierflow.actors.sources.split_log import Offset
from barrierflow.connectors import RedisStreamLog
from barrierflow.errors import InvalidArgumentError
from barrierflow.testing.redis_server import RedisServer
from barrierflow.testing.split_conformance import check_split_reader
from barrierflow.testing.split_log import MemorySplitLog

pytestmark = pytest.mark.anyio

PAYLOAD = pa.schema([("n", pa.int64())])


def append_to(log: MemorySplitLog, split: str, count: int) -> list[Offset]:
    return log.append(split, {"n": list(range(count))})


async def test_the_memory_split_log_keeps_the_contract() -> None:
    log = MemorySplitLog(PAYLOAD, splits=["a", "b"])
    report = await check_split_reader(log, partial(append_to, log), splits=("a", "b"))
    report.raise_for_failures()
    assert len(report.results) == 9


@pytest.mark.redis
async def test_the_redis_streams_log_keeps_the_contract(redis_server: RedisServer) -> None:
    prefix = redis_server.key_prefix()
    conn = redis.Redis(host=redis_server.host, port=redis_server.port, protocol=2)
    keys = (f"{prefix}a", f"{prefix}b")

    def add(key: str, count: int) -> list[Offset]:
        ids = [conn.xadd(key, {"n": i}) for i in range(count)]
        return [Offset(*(int(x) for x in bytes(i).decode().split("-"))) for i in ids]  # type: ignore[arg-type]

    async def append(split: str, count: int) -> list[Offset]:
        return await anyio.to_thread.run_sync(add, split, count)

    for key in keys:  # empty streams that exist (XGROUP CREATE ... MKSTREAM)
        conn.xgroup_create(key, "conformance", id="0", mkstream=True)
    try:
        async with RedisStreamLog(
            redis_server.url, splits=list(keys), payload=PAYLOAD, block_ms=50
        ) as log:
            report = await check_split_reader(log, append, splits=keys)
    finally:
        conn.close()
    report.raise_for_failures()
    assert len(report.results) == 9  # every rule checked, as for the memory log


class Inclusive:
    """A log whose reader starts *at* the start offset (the classic off-by-one)."""

    def __init__(self, inner: MemorySplitLog) -> None:
        self.inner = inner
        self.schema = inner.schema

    async def list_splits(self) -> list[str]:
        return await self.inner.list_splits()

    async def latest_offset(self, split: str) -> Offset | None:
        return await self.inner.latest_offset(split)

    def read(
        self, start: Mapping[str, Offset | None], *, batch_rows: int = 4096
    ) -> AsyncIterator[pa.RecordBatch]:
        earlier = {s: _before(o) for s, o in start.items()}
        return self.inner.read(earlier, batch_rows=batch_rows)


def _before(offset: Offset | None) -> Offset | None:
    if offset is None or offset.major <= 1:
        return None
    return Offset(offset.major - 1, offset.minor)


async def test_an_inclusive_reader_breaks_the_exclusive_start_rule() -> None:
    inner = MemorySplitLog(PAYLOAD, splits=["a", "b"])
    report = await check_split_reader(
        Inclusive(inner), partial(append_to, inner), splits=("a", "b"), wait_seconds=1
    )
    assert [r.rule for r in report.failures] == ["read_after_an_offset_is_exclusive"]


async def test_bad_input_is_refused() -> None:
    log = MemorySplitLog(PAYLOAD, splits=["a"])
    with pytest.raises(InvalidArgumentError) as not_a_log:
        await check_split_reader(object(), list, splits=("a", "b"))  # type: ignore[arg-type]
    assert not_a_log.value.argument == "log"
    with pytest.raises(InvalidArgumentError) as splits:
        await check_split_reader(log, list, splits=("a",))  # type: ignore[arg-type]
    assert splits.value.argument == "splits"
