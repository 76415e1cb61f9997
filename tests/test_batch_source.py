"""The batch source and its feed: numbered batches exactly once, whole in every checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import anyio
import anyio.lowlevel
import hypothesis.strategies as st
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from _timeouts import scaled
from hypothesis import given, settings

from barrierflow.actors import BatchFeed, add_sink
from barrierflow.channels import Barrier, Chunk, Message
from barrierflow.channels.schema import conform_schema
from barrierflow.connectors import ParquetTable
from barrierflow.errors import (
    ActorFailedError,
    BatchAbortedError,
    BatchOrderError,
    FeedBypassedError,
    FeedSharedError,
    InvalidArgumentError,
    NotRunningError,
    ProtocolError,
    SchemaMismatchError,
)
from barrierflow.runtime import (
    ActorContext,
    BlockingRuntime,
    Runtime,
    RuntimeConfig,
    StreamActor,
)

SCHEMA = pa.schema([("id", pa.int64())])


def rows(start: int, count: int) -> pa.Table:
    return pa.table({"id": pa.array(range(start, start + count), pa.int64())})


def committed_ids(table: Path) -> list[int]:
    if not table.exists():
        return []
    return sorted(ds.dataset(table, SCHEMA, format="parquet").to_table()["id"].to_pylist())


def build(
    tmp_path: Path, feed: BatchFeed, *, recovery: bool = False, interval: float = 3600.0
) -> Runtime:
    config = RuntimeConfig(
        state_path=tmp_path / "state.db",
        barrier_interval=interval,
        recovery=recovery,
        max_restarts=10,
        restart_backoff=0.001,
    )
    rt = Runtime(config)
    rt.add_source("src", feed.source)
    add_sink(rt, "sink", ParquetTable(tmp_path / "table", SCHEMA), input="src")
    return rt


@pytest.mark.anyio
async def test_each_batch_is_delivered_once_and_its_id_survives_a_restart(tmp_path: Path) -> None:
    feed = BatchFeed(SCHEMA, chunk_rows=7)
    async with build(tmp_path, feed) as rt:
        assert await feed.last_batch("q", rt) is None
        for batch in range(3):
            epoch = await feed.deliver(rt, "q", batch, rows(batch * 50, 50))
            assert epoch is not None
            assert rt.committed_epoch >= epoch
        assert await feed.last_batch("q", rt) == 2
    assert committed_ids(tmp_path / "table") == list(range(150))
    assert feed.stats().batches == 3
    assert feed.stats().rows == 150
    # A new driver and runtime: the durable id was restored from the checkpoint.
    feed = BatchFeed(SCHEMA)
    async with build(tmp_path, feed) as rt:
        assert await feed.last_batch("q", rt) == 2
        assert await feed.deliver(rt, "q", 2, rows(100, 50)) is None  # Spark's replay
        assert await feed.deliver(rt, "q", 3, rows(150, 10)) is not None
    assert committed_ids(tmp_path / "table") == list(range(160))
    assert feed.stats().replays_skipped == 1


@pytest.mark.anyio
async def test_batch_ids_that_go_backwards_or_skip_are_refused_before_any_row(
    tmp_path: Path,
) -> None:
    feed = BatchFeed(SCHEMA)
    async with build(tmp_path, feed) as rt:
        with pytest.raises(BatchOrderError) as info:
            await feed.deliver(rt, "q", 1, rows(0, 5))
        assert (info.value.stream, info.value.last, info.value.batch_id) == ("q", None, 1)
        await feed.deliver(rt, "q", 0, rows(0, 5))
        await feed.deliver(rt, "q", 1, rows(5, 5))
        with pytest.raises(BatchOrderError) as info:  # goes backwards
            await feed.deliver(rt, "q", 0, rows(100, 5))
        assert (info.value.last, info.value.batch_id) == (1, 0)
        with pytest.raises(BatchOrderError) as info:  # skips ahead
            await feed.deliver(rt, "q", 3, rows(100, 5))
        assert (info.value.last, info.value.batch_id) == (1, 3)
        # Streams are independent.
        await feed.deliver(rt, "other", 0, rows(10, 5))
    assert committed_ids(tmp_path / "table") == list(range(15))


@pytest.mark.anyio
async def test_a_schema_mismatch_names_both_schemas_and_delivers_nothing(tmp_path: Path) -> None:
    feed = BatchFeed(SCHEMA)
    async with build(tmp_path, feed) as rt:
        bad = pa.table({"id": pa.array(["a"])})
        with pytest.raises(SchemaMismatchError) as info:
            await feed.deliver(rt, "q", 0, bad)
        assert info.value.expected_schema == SCHEMA
        assert info.value.actual_schema == bad.schema
        assert await feed.last_batch("q", rt) is None
    assert committed_ids(tmp_path / "table") == []


def test_nullability_may_differ_but_nulls_never_enter_a_non_nullable_field() -> None:
    strict = pa.schema([pa.field("id", pa.int64(), nullable=False)])
    conformed = conform_schema(rows(0, 3), strict, "batch")
    assert conformed.schema.equals(strict)
    assert conformed["id"].to_pylist() == [0, 1, 2]
    with pytest.raises(SchemaMismatchError) as nulls:  # names and types match: only the nulls
        conform_schema(pa.table({"id": pa.array([1, None], pa.int64())}), strict, "batch")
    assert (nulls.value.argument, nulls.value.expected_schema) == ("batch", strict)
    with pytest.raises(InvalidArgumentError) as info:
        conform_schema([1, 2], strict, "batch")  # type: ignore[arg-type]
    assert (info.value.argument, info.value.got) == ("batch", "list")


class Recorder(StreamActor):
    """Records, per epoch, the ids that arrived; checks nothing itself."""

    epochs: ClassVar[list[tuple[int, list[int]]]] = []

    chunk_rows: ClassVar[list[int]] = []

    def __init__(self) -> None:
        self.current: list[int] = []

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk):
            Recorder.chunk_rows.append(message.num_rows)
            self.current.extend(message.batch.column("id").to_pylist())
        elif isinstance(message, Barrier):
            Recorder.epochs.append((message.epoch.prev, self.current))
            self.current = []
        await ctx.emit(message)


@pytest.mark.anyio
async def test_a_barrier_never_cuts_a_batch(tmp_path: Path) -> None:
    # Barriers every millisecond race the feed; each batch still lies in one epoch.
    Recorder.epochs, Recorder.chunk_rows = [], []
    feed = BatchFeed(SCHEMA, chunk_rows=3, capacity=2)
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "s.db", barrier_interval=0.001))
    rt.add_source("src", feed.source)
    rt.add_actor("rec", Recorder, inputs=["src"])
    sizes = [40, 1, 25, 60, 9]
    async with rt:
        start = 0
        for batch, size in enumerate(sizes):
            await feed.deliver(rt, "q", batch, rows(start, size))
            start += size
    # Each batch went in chunks of at most chunk_rows (3) rows.
    assert max(Recorder.chunk_rows) == 3
    assert sum(Recorder.chunk_rows) == sum(sizes)
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    for begin, size in zip(starts, sizes, strict=True):
        holding = [e for e, ids in Recorder.epochs if begin in ids]
        (epoch,) = holding
        ids = next(ids for e, ids in Recorder.epochs if e == epoch)
        assert set(range(begin, begin + size)) <= set(ids)


class FailOnce(StreamActor):
    """Fails once, when its ``after``-th chunk arrives (class-level: survives restarts)."""

    after = 0
    seen = 0
    failed = False

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk) and not FailOnce.failed:
            FailOnce.seen += 1
            if FailOnce.seen >= FailOnce.after:
                FailOnce.failed = True
                raise RuntimeError("injected fault")
        await ctx.emit(message)


def run_with_fault(
    tmp_path: Path, backend: str, sizes: list[int], chunk_rows: int, fail_after: int
) -> tuple[list[int], int]:
    FailOnce.after, FailOnce.seen, FailOnce.failed = fail_after, 0, False
    table = tmp_path / "table"

    async def main() -> int:
        feed = BatchFeed(SCHEMA, chunk_rows=chunk_rows, capacity=2, retries=5)
        config = RuntimeConfig(
            state_path=tmp_path / "state.db",
            barrier_interval=0.002,
            recovery=True,
            max_restarts=5,
            restart_backoff=0.001,
        )
        rt = Runtime(config)
        rt.add_source("src", feed.source)
        rt.add_actor("flaky", FailOnce, inputs=["src"])
        add_sink(rt, "sink", ParquetTable(table, SCHEMA), input="flaky")
        async with rt:
            start = 0
            for batch, size in enumerate(sizes):
                await feed.deliver(rt, "q", batch, rows(start, size))
                start += size
        return feed.stats().retries

    retries = anyio.run(main, backend=backend)
    return committed_ids(table), retries


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@settings(max_examples=12)
@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=5),
    chunk_rows=st.integers(1, 16),
    fail_after=st.integers(1, 12),
    data=st.data(),
)
def test_a_graph_failure_mid_delivery_loses_and_duplicates_nothing(
    tmp_path_factory: pytest.TempPathFactory,
    backend: str,
    sizes: list[int],
    chunk_rows: int,
    fail_after: int,
    data: Any,
) -> None:
    tmp_path = tmp_path_factory.mktemp("fault")
    ids, retries = run_with_fault(tmp_path, backend, sizes, chunk_rows, fail_after)
    assert ids == list(range(sum(sizes)))
    chunks = sum(-(-size // chunk_rows) for size in sizes)
    assert retries == (1 if fail_after <= chunks else 0)


@pytest.mark.anyio
async def test_a_delivery_abandoned_mid_batch_fails_the_graph_and_its_rows_vanish(
    tmp_path: Path,
) -> None:
    feed = BatchFeed(SCHEMA, chunk_rows=1, capacity=1)
    rt = build(tmp_path, feed, recovery=True)
    async with rt:
        await feed.deliver(rt, "q", 0, rows(0, 3))
        with anyio.move_on_after(scaled(0.05)):
            # The sink is slow to start taking rows: the delivery waits for room, and gives up.
            await feed.deliver(rt, "q", 1, rows(1000, 10_000))
        # Delivering again fails the graph first (BatchAbortedError), then retries whole.
        await feed.deliver(rt, "q", 1, rows(3, 4))
        assert rt.stats().restarts == 1
        assert feed.stats().retries == 1
    assert committed_ids(tmp_path / "table") == list(range(7))


@pytest.mark.anyio
async def test_the_abandoned_batch_error_names_the_batch(tmp_path: Path) -> None:
    feed = BatchFeed(SCHEMA, chunk_rows=1, capacity=1)
    rt = build(tmp_path, feed)
    with pytest.raises(ActorFailedError) as info:
        async with rt:
            with anyio.move_on_after(scaled(0.05)):
                await feed.deliver(rt, "q", 0, rows(0, 10_000))
            await rt.checkpoint()
    cause = info.value.cause
    assert isinstance(cause, BatchAbortedError)
    assert (cause.stream, cause.batch_id) == ("q", 0)


@pytest.mark.anyio
async def test_rows_pushed_into_a_batch_source_are_refused(tmp_path: Path) -> None:
    feed = BatchFeed(SCHEMA)
    rt = build(tmp_path, feed)
    with pytest.raises(ActorFailedError) as info:
        async with rt:
            await rt.push("src", Chunk(rows(0, 1).to_batches()[0]))
            await rt.checkpoint()
    cause = info.value.cause
    assert isinstance(cause, FeedBypassedError)
    assert isinstance(cause, ProtocolError)
    assert (cause.source, cause.rows) == ("src", 1)


@pytest.mark.anyio
async def test_the_feed_channel_is_bounded_so_a_slow_graph_blocks_the_driver(
    tmp_path: Path,
) -> None:
    release = anyio.Event()

    class Gate(StreamActor):
        async def process(self, message: Message, ctx: ActorContext) -> None:
            await release.wait()
            await ctx.emit(message)

    feed = BatchFeed(SCHEMA, chunk_rows=1, capacity=2)
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "s.db", barrier_interval=3600.0))
    rt.add_source("src", feed.source)
    rt.add_actor("gate", Gate, inputs=["src"])
    async with rt:
        release.set()  # let the initial barrier through
        await anyio.lowlevel.checkpoint()
        release = anyio.Event()
        done = anyio.Event()

        async def deliver() -> None:
            await feed.deliver(rt, "q", 0, rows(0, 100))
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(deliver)
            with anyio.move_on_after(scaled(0.1)):
                await done.wait()
            assert not done.is_set()
            channel = rt.stats().channels
            assert channel["src->gate"].messages_sent < 100
            release.set()
        assert feed.stats().blocked_seconds > 0


@pytest.mark.anyio
async def test_bad_arguments_are_refused_naming_them(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        BatchFeed("id int")  # type: ignore[arg-type]
    assert info.value.argument == "schema"
    for name, kwargs in (
        ("chunk_rows", {"chunk_rows": 0}),
        ("capacity", {"capacity": 1.5}),
        ("first_batch_id", {"first_batch_id": -1}),
        ("retries", {"retries": -1}),
    ):
        with pytest.raises(InvalidArgumentError) as info:
            BatchFeed(SCHEMA, **kwargs)  # type: ignore[arg-type]
        assert info.value.argument == name
    feed = BatchFeed(SCHEMA)
    async with build(tmp_path, feed) as rt:
        for argument, call in (
            ("runtime", lambda: feed.deliver("rt", "q", 0, rows(0, 1))),  # type: ignore[arg-type]
            ("batch_id", lambda: feed.deliver(rt, "q", -1, rows(0, 1))),
            ("stream", lambda: feed.deliver(rt, "", 0, rows(0, 1))),
            ("data", lambda: feed.deliver(rt, "q", 0, [1, 2])),  # type: ignore[list-item]
        ):
            with pytest.raises(InvalidArgumentError) as info:
                await call()
            assert info.value.argument == argument
        # A list of record batches is fine.
        assert await feed.deliver(rt, "q", 0, rows(0, 2).to_batches()) is not None


@pytest.mark.anyio
async def test_a_delivery_into_a_runtime_that_is_not_running_is_a_typed_error(
    tmp_path: Path,
) -> None:
    feed = BatchFeed(SCHEMA)
    rt = build(tmp_path, feed)
    with pytest.raises(NotRunningError) as info:
        await feed.deliver(rt, "q", 0, rows(0, 1))
    assert info.value.what == "the runtime"
    with pytest.raises(NotRunningError) as info:
        await feed.last_batch("q", rt)
    assert info.value.what == "the runtime"


class Boom(StreamActor):
    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk):
            raise RuntimeError("boom")
        await ctx.emit(message)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_driver_thread_gets_the_graph_failure_instead_of_waiting_for_good(
    tmp_path: Path, backend: str
) -> None:
    # No recovery: the delivery of a blocking caller (a Spark thread) must end with the
    # failure, not wait for a source that will never attach again.
    feed = BatchFeed(SCHEMA, retries=3)
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "s.db", barrier_interval=3600.0))
    rt.add_source("src", feed.source)
    rt.add_actor("boom", Boom, inputs=["src"])
    with pytest.raises(ActorFailedError) as outer, BlockingRuntime(rt, backend=backend) as h:
        with pytest.raises(ActorFailedError) as info:
            h.call(feed.deliver, rt, "q", 0, rows(0, 1))
        assert info.value.actor == "boom"
        assert str(info.value.cause) == "boom"
        # Later calls: the failure again, or, once the runtime has shut down, not running.
        with pytest.raises((ActorFailedError, NotRunningError)):
            h.call(feed.last_batch, "q", rt)
        with pytest.raises((ActorFailedError, NotRunningError)):
            h.checkpoint()
    assert outer.value.actor == "boom"


@pytest.mark.anyio
async def test_one_feed_feeds_one_source(tmp_path: Path) -> None:
    feed = BatchFeed(SCHEMA)
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "s.db", barrier_interval=3600.0))
    rt.add_source("a", feed.source)
    rt.add_source("b", feed.source)
    with pytest.raises(ActorFailedError) as info:
        async with rt:
            await rt.checkpoint()
    cause = info.value.cause
    assert isinstance(cause, FeedSharedError)
    assert isinstance(cause, ProtocolError)
    assert {cause.source, cause.attached} == {"a", "b"}


# A delivery waiting for its source wakes on events, not by polling the runtime.


class _FakeRuntime:
    """What a feed's wait for its source uses of a runtime: ``wait_running`` (raising once the
    runtime failed) and ``committed_epochs`` (ending when the runtime stops)."""

    def __init__(self) -> None:
        self.failure: Exception | None = None
        self.stopped = anyio.Event()
        self.looks = 0

    async def wait_running(self) -> None:
        self.looks += 1
        await anyio.lowlevel.checkpoint()
        if self.failure is not None:
            raise self.failure

    def committed_epochs(self) -> Any:
        async def epochs() -> Any:
            yield 0
            await self.stopped.wait()

        return epochs()


@pytest.mark.anyio
async def test_a_delivery_waiting_for_its_source_wakes_when_the_source_attaches() -> None:
    feed = BatchFeed(SCHEMA)
    runtime = _FakeRuntime()
    got: list[Any] = []

    async def wait() -> None:
        got.append(await feed._channel(runtime))  # type: ignore[arg-type]

    send, receive = anyio.create_memory_object_stream[Any](1)
    with send, receive:
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            assert got == []
            assert runtime.looks == 1  # parked on an event: no periodic looks
            feed.attach("src", send, {}, {})  # type: ignore[arg-type]
        assert got == [send]


@pytest.mark.anyio
async def test_a_delivery_waiting_for_its_source_gets_the_failure_when_the_source_ends() -> None:
    feed = BatchFeed(SCHEMA)
    runtime = _FakeRuntime()
    failure = ActorFailedError("src", 1, RuntimeError("boom"))
    outcome: list[BaseException] = []

    async def wait() -> None:
        try:
            await feed._channel(runtime)  # type: ignore[arg-type]
        except ActorFailedError as exc:
            outcome.append(exc)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            runtime.failure = failure  # failed for good
            feed.detach(None)  # its source ended with the graph
    assert outcome == [failure]


@pytest.mark.anyio
async def test_a_delivery_waiting_for_its_source_gets_not_running_when_the_runtime_stops() -> None:
    feed = BatchFeed(SCHEMA)
    runtime = _FakeRuntime()
    outcome: list[BaseException] = []

    async def wait() -> None:
        try:
            await feed._channel(runtime)  # type: ignore[arg-type]
        except NotRunningError as exc:
            outcome.append(exc)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            runtime.failure = NotRunningError("the runtime", "use it inside `async with rt:`")
            runtime.stopped.set()  # its store closed: no source will ever attach
    assert len(outcome) == 1
