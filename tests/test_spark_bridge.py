"""The Spark bridge with a real local Spark: micro-batches in exactly once, static pumps, the
reader, and the typed errors. One SparkSession for the session; both runtime backends."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from _timeouts import scaled

from barrierflow.actors import BatchFeed, add_sink
from barrierflow.channels import Chunk, Message
from barrierflow.connectors import ParquetTable
from barrierflow.errors import (
    ActorFailedError,
    BatchOrderError,
    InvalidArgumentError,
    NotRunningError,
    SchemaMismatchError,
    SparkCheckpointBehindError,
    SparkQueryFailedError,
    SparkUnavailableError,
)
from barrierflow.runtime import (
    ActorContext,
    BlockingRuntime,
    Runtime,
    RuntimeConfig,
    StreamActor,
)
from barrierflow.spark_bridge import SparkBridge, SparkReader, arrow_schema_of, read_spark
from barrierflow.spark_bridge import session as session_module
from barrierflow.spark_bridge.session import require_spark

pytestmark = pytest.mark.spark

SCHEMA = pa.schema([("key", pa.int64()), ("value", pa.float64())])
BACKENDS = pytest.mark.parametrize("backend", ["asyncio", "trio"])


def build(tmp_path: Path) -> tuple[Runtime, BatchFeed]:
    feed = BatchFeed(SCHEMA, chunk_rows=100, capacity=4)
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=0.05))
    rt.add_source("events", feed.source)
    add_sink(rt, "sink", ParquetTable(tmp_path / "table", SCHEMA), input="events")
    return rt, feed


def keys(tmp_path: Path) -> list[int]:
    table = tmp_path / "table"
    if not table.exists():
        return []
    return sorted(ds.dataset(table, SCHEMA, format="parquet").to_table()["key"].to_pylist())


def frame(spark: Any, start: int, count: int) -> Any:
    return spark.range(start, start + count).selectExpr("id as key", "cast(id as double) as value")


def write_files(directory: Path, sizes: list[int], start: int = 0, first: int = 0) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for index, size in enumerate(sizes, start=first):
        keys_ = pa.array(range(start, start + size), pa.int64())
        table = pa.table({"key": keys_, "value": pa.compute.cast(keys_, pa.float64())})
        pq.write_table(table, directory / f"part-{index:03d}.parquet")
        start += size


def streaming(spark: Any, directory: Path) -> Any:
    from pyspark.sql.types import DoubleType, LongType, StructField, StructType

    schema = StructType([StructField("key", LongType()), StructField("value", DoubleType())])
    return spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(directory))


@BACKENDS
def test_a_streaming_query_is_delivered_exactly_once_across_a_restart(
    spark: Any, tmp_path: Path, backend: str
) -> None:
    write_files(tmp_path / "in", [300, 0, 250])
    rt, feed = build(tmp_path)
    with BlockingRuntime(rt, backend=backend) as handle:
        bridge = SparkBridge(handle, feed, stream="q")
        query = bridge.start(
            streaming(spark, tmp_path / "in"), str(tmp_path / "ck"), available_now=True
        )
        query.awaitTermination()
        assert query.exception() is None
        assert bridge.stats().rows == 550
    assert keys(tmp_path) == list(range(550))
    # New files, a new driver on the same state and Spark checkpoint: only the new ones.
    write_files(tmp_path / "in", [40], start=550, first=3)
    rt, feed = build(tmp_path)
    with BlockingRuntime(rt, backend=backend) as handle:
        bridge = SparkBridge(handle, feed, stream="q")
        query = bridge.start(
            streaming(spark, tmp_path / "in"), str(tmp_path / "ck"), available_now=True
        )
        query.awaitTermination()
        assert bridge.stats().batches == 1
    assert keys(tmp_path) == list(range(590))


@BACKENDS
def test_a_replayed_batch_is_skipped_and_out_of_order_ids_are_refused(
    spark: Any, tmp_path: Path, backend: str
) -> None:
    rt, feed = build(tmp_path)
    with BlockingRuntime(rt, backend=backend) as handle:
        bridge = SparkBridge(handle, feed)
        assert bridge.deliver(frame(spark, 0, 10), 0) is not None
        assert bridge.deliver(frame(spark, 0, 10), 0) is None  # Spark's replay
        with pytest.raises(BatchOrderError) as ahead:
            bridge.deliver(frame(spark, 10, 10), 5)
        assert (ahead.value.direction, ahead.value.last, ahead.value.expected_id) == ("ahead", 0, 1)
        assert (ahead.value.stream, ahead.value.batch_id) == ("spark", 5)
        bridge.deliver(frame(spark, 10, 10), 1)
        with pytest.raises(BatchOrderError) as backwards:
            bridge.deliver(frame(spark, 0, 10), 0)
        assert (backwards.value.direction, backwards.value.last) == ("backwards", 1)
        assert (backwards.value.batch_id, backwards.value.expected_id) == (0, 2)
        assert bridge.stats().replays_skipped == 1
    assert keys(tmp_path) == list(range(20))


@BACKENDS
def test_a_mismatched_schema_names_both_before_any_row(
    spark: Any, tmp_path: Path, backend: str
) -> None:
    rt, feed = build(tmp_path)
    with BlockingRuntime(rt, backend=backend) as handle:
        bridge = SparkBridge(handle, feed)
        wrong = spark.range(5).selectExpr("id as key", "cast(id as string) as value")
        with pytest.raises(SchemaMismatchError) as info:
            bridge.deliver(wrong, 0)
        message = str(info.value)
        assert "value: double" in message
        assert "value: string" in message
        with pytest.raises(InvalidArgumentError) as static:  # refused before its schema
            bridge.start(wrong, str(tmp_path / "ck"))
        assert type(static.value) is InvalidArgumentError
        assert static.value.argument == "df"
        assert static.value.got is wrong
    assert keys(tmp_path) == []


def test_the_arrow_schema_is_known_without_a_spark_job(spark: Any) -> None:
    assert arrow_schema_of(frame(spark, 0, 1)).names == ["key", "value"]


def test_a_callback_outside_a_running_runtime_is_a_typed_error(spark: Any, tmp_path: Path) -> None:
    rt, feed = build(tmp_path)
    handle = BlockingRuntime(rt)
    bridge = SparkBridge(handle, feed)
    with pytest.raises(NotRunningError) as info:
        bridge.callback(frame(spark, 0, 1), 0)
    assert info.value.what == "the runtime behind this Spark bridge"
    assert bridge.last_error is info.value


@BACKENDS
def test_a_static_dataframe_is_pumped_in_slices_and_a_rerun_resumes(
    spark: Any, tmp_path: Path, backend: str
) -> None:
    df = frame(spark, 0, 1_000).orderBy("key")
    rt, feed = build(tmp_path)
    with BlockingRuntime(rt, backend=backend) as handle:
        bridge = SparkBridge(handle, feed)
        assert bridge.pump(df, stream="history", slice_rows=300, progress=True) == 1_000
        assert bridge.stats().batches == 4
        assert handle.call(feed.last_batch, "history", rt) == 3
        # Run again: every slice is durable, nothing is delivered twice.
        assert bridge.pump(df, stream="history", slice_rows=300) == 0
        with pytest.raises(InvalidArgumentError) as info:
            bridge.pump(df, slice_rows=0)
        assert (info.value.argument, info.value.got) == ("slice_rows", 0)
    assert keys(tmp_path) == list(range(1_000))


@pytest.mark.anyio
async def test_the_reader_yields_every_row_in_bounded_chunks(spark: Any) -> None:
    df = frame(spark, 0, 5_000).repartition(3)
    seen: list[int] = []
    async with SparkReader(df, chunk_rows=700, capacity=2) as chunks:
        async for chunk in chunks:
            assert chunk.num_rows <= 700
            seen.extend(chunk.batch.column("key").to_pylist())
    assert sorted(seen) == list(range(5_000))


@pytest.mark.anyio
async def test_a_reader_left_early_stops_fetching(spark: Any) -> None:
    df = frame(spark, 0, 50_000).repartition(4)
    with anyio.fail_after(scaled(60)):
        async with SparkReader(df, chunk_rows=1_000, capacity=1) as chunks:
            first = await chunks.__anext__()
    assert first.num_rows <= 1_000


class _StalledFrame:
    """A DataFrame stand-in: its Arrow stream yields one batch, then blocks the way a Spark job
    computing its next partition does, until released."""

    isStreaming = False  # noqa: N815 - PySpark's name
    SCHEMA = pa.schema([("key", pa.int64())])

    def __init__(self) -> None:
        self.stalled = threading.Event()
        self.release = threading.Event()
        self.resumed = threading.Event()

    def _batches(self) -> Any:
        yield pa.record_batch([pa.array([0, 1], pa.int64())], schema=self.SCHEMA)
        self.stalled.set()
        self.release.wait(30)
        self.resumed.set()
        yield pa.record_batch([pa.array([2, 3], pa.int64())], schema=self.SCHEMA)

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        reader = pa.RecordBatchReader.from_batches(self.SCHEMA, self._batches())
        return reader.__arrow_c_stream__(requested_schema)


@pytest.mark.anyio
async def test_a_cancelled_reader_returns_promptly_and_delivers_nothing_after() -> None:
    df = _StalledFrame()
    got: list[Chunk] = []
    try:
        with anyio.fail_after(scaled(5)), anyio.CancelScope() as scope:
            async with SparkReader(df, chunk_rows=10, capacity=4) as chunks:
                async for chunk in chunks:
                    got.append(chunk)
                    assert await anyio.to_thread.run_sync(df.stalled.wait, 10)
                    scope.cancel()  # while the "Spark call" of the next batch is running
        assert scope.cancelled_caught
        assert not df.release.is_set()  # the caller is back; the call is still running
    finally:
        df.release.set()
    assert await anyio.to_thread.run_sync(df.resumed.wait, 10)
    assert [chunk.batch.column("key").to_pylist() for chunk in got] == [[0, 1]]


def test_the_reader_refuses_bad_input(spark: Any) -> None:
    with pytest.raises(InvalidArgumentError) as rows:
        SparkReader(frame(spark, 0, 1), chunk_rows=0)
    assert (rows.value.argument, rows.value.got) == ("chunk_rows", 0)
    with pytest.raises(InvalidArgumentError) as df:
        SparkReader([1, 2, 3])
    assert (df.value.argument, df.value.got) == ("df", "list")


def test_missing_java_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setattr(session_module.shutil, "which", lambda name: None)
    with pytest.raises(SparkUnavailableError) as info:
        require_spark()
    assert info.value.component == "java"


def test_missing_pyspark_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = session_module.importlib.util.find_spec
    monkeypatch.setattr(
        session_module.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "pyspark" else real(name, *a),
    )
    with pytest.raises(SparkUnavailableError) as info:
        require_spark()
    assert info.value.component == "pyspark"


def test_local_spark_binds_to_loopback(spark: Any) -> None:
    assert os.environ["SPARK_LOCAL_IP"] == "127.0.0.1"
    assert spark.sparkContext.master == "local[2,4]"  # the suite's: tasks are retried


@pytest.mark.anyio
async def test_a_path_read_by_spark_comes_back_as_chunks(spark: Any, tmp_path: Path) -> None:
    write_files(tmp_path / "history", [120, 80])
    df = read_spark(spark, str(tmp_path / "history"), format="parquet")
    async with SparkReader(df, chunk_rows=50) as chunks:
        seen = [key async for chunk in chunks for key in chunk.batch.column("key").to_pylist()]
    assert sorted(seen) == list(range(200))
    spark.range(3).createOrReplaceTempView("three")
    assert read_spark(spark, "three").count() == 3
    bad_options = {"header": True}  # values must be str
    refused: list[tuple[dict[str, Any], str, Any]] = [
        ({"source": ""}, "source", ""),
        ({"source": "x", "format": "csv", "options": bad_options}, "options", bad_options),
        ({"source": "x", "format": ""}, "format", ""),
    ]
    for kwargs, argument, got in refused:
        with pytest.raises(InvalidArgumentError) as info:
            read_spark(spark, **kwargs)
        assert (info.value.argument, info.value.got) == (argument, got)


def test_the_bridge_refuses_bad_input_naming_it(spark: Any, tmp_path: Path) -> None:
    rt, feed = build(tmp_path)
    with pytest.raises(InvalidArgumentError) as info:
        SparkBridge(rt, feed)  # type: ignore[arg-type]
    assert (info.value.argument, info.value.got) == ("runtime", "Runtime")
    with BlockingRuntime(rt) as handle:
        with pytest.raises(InvalidArgumentError) as info:
            SparkBridge(handle, "feed")  # type: ignore[arg-type]
        assert (info.value.argument, info.value.got) == ("feed", "str")
        with pytest.raises(InvalidArgumentError) as info:
            SparkBridge(handle, feed, stream="")
        assert (info.value.argument, info.value.got) == ("stream", "")
        bridge = SparkBridge(handle, feed)
        with pytest.raises(InvalidArgumentError) as info:
            bridge.deliver([1, 2, 3], 0)
        assert (info.value.argument, info.value.got) == ("df", "list")
        with pytest.raises(InvalidArgumentError) as info:
            bridge.deliver(frame(spark, 0, 1), -1)
        assert (info.value.argument, info.value.got) == ("batch_id", -1)
        (tmp_path / "nothing").mkdir()
        stream_df = streaming(spark, tmp_path / "nothing")
        with pytest.raises(InvalidArgumentError) as info:
            bridge.start(stream_df, "")
        assert (info.value.argument, info.value.got) == ("checkpoint_location", "")
        with pytest.raises(InvalidArgumentError) as info:  # a streaming DataFrame
            bridge.pump(stream_df)
        assert type(info.value) is InvalidArgumentError
        assert info.value.argument == "df"
        assert info.value.got is stream_df
    assert keys(tmp_path) == []


class FailOnce(StreamActor):
    """Fails on its third chunk, once per test (class-level: survives the graph's rebuild)."""

    failed = False
    seen = 0

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk) and not FailOnce.failed:
            FailOnce.seen += 1
            if FailOnce.seen == 3:
                FailOnce.failed = True
                raise RuntimeError("injected fault")
        await ctx.emit(message)


@BACKENDS
def test_a_graph_failure_mid_micro_batch_is_recovered_inside_the_callback(
    spark: Any, tmp_path: Path, backend: str
) -> None:
    # With recovery on, the callback re-delivers the micro-batch to the rebuilt graph: Spark
    # never sees the failure, and every row lands once.
    FailOnce.failed, FailOnce.seen = False, 0
    write_files(tmp_path / "in", [250, 250])
    feed = BatchFeed(SCHEMA, chunk_rows=100, capacity=2)
    config = RuntimeConfig(
        state_path=tmp_path / "state.db", recovery=True, restart_backoff=0.01, max_restarts=2
    )
    rt = Runtime(config)
    rt.add_source("events", feed.source)
    rt.add_actor("flaky", FailOnce, inputs=["events"])
    add_sink(rt, "sink", ParquetTable(tmp_path / "table", SCHEMA), input="flaky")
    with BlockingRuntime(rt, backend=backend) as handle:
        bridge = SparkBridge(handle, feed, stream="q")
        query = bridge.start(
            streaming(spark, tmp_path / "in"), str(tmp_path / "ck"), available_now=True
        )
        query.awaitTermination()
        assert query.exception() is None
        assert handle.stats().restarts == 1
        assert feed.stats().retries == 1
    assert FailOnce.failed
    assert keys(tmp_path) == list(range(500))


# -- errors in one line (issue 24, item 5) ----------------------------------------------------

TIMESTAMPS = pa.schema([("ts", pa.timestamp("us")), ("n", pa.int64())])


def build_for(
    tmp_path: Path, schema: pa.Schema, *, fail: bool = False
) -> tuple[Runtime, BatchFeed]:
    """A runtime reading ``schema`` into a Parquet sink (behind an actor that fails on its
    first chunk if ``fail``), recovery off."""
    feed = BatchFeed(schema, chunk_rows=100, capacity=4)
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=0.05))
    rt.add_source("events", feed.source)
    upstream = "events"
    if fail:
        rt.add_actor("flaky", Explode, inputs=["events"])
        upstream = "flaky"
    add_sink(rt, "sink", ParquetTable(tmp_path / "table", schema), input=upstream)
    return rt, feed


class Explode(StreamActor):
    """Fails on its first chunk."""

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk):
            raise RuntimeError("injected: the enrich step failed")
        await ctx.emit(message)


def timestamps(spark: Any) -> Any:
    """A static frame whose ``ts`` is Spark's ``timestamp`` (Arrow: ``timestamp[us, tz=UTC]``)
    and ``n`` an ``int`` (``int32``)."""
    return spark.range(3).selectExpr("timestamp_seconds(id) as ts", "cast(id as int) as n")


def test_a_schema_differing_in_time_zone_or_integer_width_says_how_to_fix_it(
    spark: Any, tmp_path: Path
) -> None:
    rt, feed = build_for(tmp_path, TIMESTAMPS)
    df = timestamps(spark)
    with BlockingRuntime(rt) as handle:
        bridge = SparkBridge(handle, feed)
        with pytest.raises(SchemaMismatchError) as info:
            bridge.deliver(df, 0)
        message = str(info.value)
        assert "\n" not in message
        assert "ts: timestamp[us, tz=UTC]" in message
        assert "BatchFeed(arrow_schema_of(df))" in info.value.fix
        assert "cast('timestamp_ntz')" in info.value.fix
        assert "cast('bigint')" in info.value.fix
        assert message.endswith(info.value.fix)
        # The fix it gives works.
        fixed = df.withColumn("ts", df["ts"].cast("timestamp_ntz")).withColumn(
            "n", df["n"].cast("bigint")
        )
        assert bridge.deliver(fixed, 0) is not None
        # A difference no cast fixes gets no fix.
        with pytest.raises(SchemaMismatchError) as other:
            bridge.deliver(df.selectExpr("ts as when", "n"), 1)
        assert other.value.fix == ""
    assert arrow_schema_of(df).types == [pa.timestamp("us", tz="UTC"), pa.int32()]


def one_line_of(error: BaseException) -> str:
    (line,) = str(error).splitlines()
    return line


def test_a_callback_error_is_raised_as_itself_not_as_a_py4j_wall(
    spark: Any, tmp_path: Path
) -> None:
    # A timestamp with a time zone where the feed has none, through the user's own
    # foreachBatch (bridge.start would refuse it before starting).
    (tmp_path / "in").mkdir()
    pq.write_table(
        pa.table({"ts": pa.array([0, 1], pa.timestamp("us", tz="UTC")), "n": [0, 1]}),
        tmp_path / "in" / "part-0.parquet",
    )
    rt, feed = build_for(tmp_path, TIMESTAMPS)
    with BlockingRuntime(rt) as handle:
        bridge = SparkBridge(handle, feed, stream="q")
        stream_df = spark.readStream.schema("ts timestamp, n bigint").parquet(str(tmp_path / "in"))
        query = (
            stream_df.writeStream.foreachBatch(bridge.callback)
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
        )
        with pytest.raises(SchemaMismatchError) as info:
            bridge.await_termination(query)
        assert info.value is bridge.last_error  # the object the callback raised
        line = one_line_of(info.value)
        assert line.startswith("micro-batch 0 of 'q': expected schema (ts: timestamp[us], ")
        assert "cast('timestamp_ntz')" in line
        # What Spark itself hands over is a wall of traces around that line.
        assert len(str(query.exception()).splitlines()) > 10
        assert bridge.unwrap(query.exception()) is info.value


def test_a_deleted_spark_checkpoint_is_refused_naming_the_cause_and_the_way_on(
    spark: Any, tmp_path: Path
) -> None:
    write_files(tmp_path / "in", [30, 30])
    rt, feed = build(tmp_path)
    with BlockingRuntime(rt) as handle:
        bridge = SparkBridge(handle, feed, stream="q")
        first = bridge.start(streaming(spark, tmp_path / "in"), str(tmp_path / "ck"),
                             available_now=True)  # fmt: skip
        assert bridge.await_termination(first)
        assert bridge.stats().batches == 2
        # Spark's checkpoint is deleted: Spark starts again from batch 0, which is behind.
        shutil.rmtree(tmp_path / "ck")
        again = bridge.start(streaming(spark, tmp_path / "in"), str(tmp_path / "ck"),
                             available_now=True)  # fmt: skip
        with pytest.raises(SparkCheckpointBehindError) as info:
            bridge.await_termination(again)
        assert isinstance(info.value, BatchOrderError)  # still one, for callers catching it
        assert (info.value.direction, info.value.batch_id, info.value.last) == ("backwards", 0, 1)
        line = one_line_of(info.value)
        assert "Spark's checkpoint was lost or reset" in line  # the cause
        assert "RuntimeConfig(adopt_sink_positions=True)" in line  # the way on
    assert keys(tmp_path) == list(range(60))


def test_a_failing_callback_is_one_line_naming_its_error(spark: Any, tmp_path: Path) -> None:
    write_files(tmp_path / "in", [10])
    rt, feed = build(tmp_path)
    with BlockingRuntime(rt) as handle:
        bridge = SparkBridge(handle, feed, stream="q")

        def callback(df: Any, batch_id: int) -> None:  # the user's own code around the bridge
            bridge.callback(df, batch_id)
            raise ValueError(f"user code failed after batch {batch_id}")

        query = (
            streaming(spark, tmp_path / "in").writeStream.foreachBatch(callback)
            .queryName("enrich").option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True).start()
        )  # fmt: skip
        with pytest.raises(SparkQueryFailedError) as info:
            bridge.await_termination(query)
        assert info.value.query == "enrich"
        assert info.value.cause == "ValueError: user code failed after batch 0"
        assert one_line_of(info.value) == (
            "Spark streaming query enrich stopped: ValueError: user code failed after batch 0"
        )
        assert type(info.value.__cause__).__name__ == "StreamingQueryException"


def test_a_graph_failure_in_the_callback_is_the_actor_failed_error(
    spark: Any, tmp_path: Path
) -> None:
    write_files(tmp_path / "in", [10])
    rt, feed = build_for(tmp_path, SCHEMA, fail=True)
    with pytest.raises(ActorFailedError) as ended, BlockingRuntime(rt) as handle:
        bridge = SparkBridge(handle, feed, stream="q")
        query = bridge.start(streaming(spark, tmp_path / "in"), str(tmp_path / "ck"),
                             available_now=True)  # fmt: skip
        with pytest.raises(ActorFailedError) as info:
            bridge.await_termination(query)
        assert info.value is bridge.last_error
    assert ended.value.actor == "flaky"
    assert "flaky" in one_line_of(info.value)


def test_the_session_keeps_spark_from_printing_a_failures_jvm_trace(spark: Any) -> None:
    """A failed query's or task's JVM stack trace (30 to 70 lines on stderr) is not logged by
    the session barrierflow makes: the same failure reaches the driver, where it is one line."""
    log4j = spark.sparkContext._jvm.org.apache.logging.log4j
    for name in (
        "org.apache.spark.sql.execution.streaming",
        "org.apache.spark.executor.Executor",
        "org.apache.spark.scheduler.TaskSetManager",
    ):
        assert str(log4j.LogManager.getLogger(name).getLevel()) == "OFF", name
    # The rest of Spark still logs its errors.
    assert str(log4j.LogManager.getLogger("org.apache.spark.SparkContext").getLevel()) == "ERROR"
