"""The graph on Spark's executors: a chain of partition-local actors between the bridge's
feed and a table sink runs inside every Spark task (``run_on="executors"``), only manifests
come back, and what cannot be placed is refused before any Spark job.

Local Spark (``local[2,4]``: a failed task is retried, as on a cluster). The chain's own
functions live in ``_executor_actors``, pickled by value: the tests' modules are not
importable on Spark's Python workers.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _executor_actors
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import structlog
from _executor_actors import OUT, Global, Passes, fails_on_seven, not_a_third, slow_twice, twice
from pyspark import cloudpickle

from barrierflow.actors import BatchFeed, add_sink
from barrierflow.actors.sinks.add_sink import DeclaredSink
from barrierflow.connectors import ParquetTable
from barrierflow.errors import (
    ExecutorChainFailedError,
    ExecutorImportError,
    ExecutorPlacementError,
    InvalidArgumentError,
)
from barrierflow.operators import Stream, async_map
from barrierflow.runtime import BlockingRuntime, Runtime, RuntimeConfig
from barrierflow.spark_bridge import SparkBridge

pytestmark = pytest.mark.spark

BACKENDS = pytest.mark.parametrize("backend", ["asyncio", "trio"])

IN = pa.schema([pa.field("id", pa.int64(), nullable=False)])


@pytest.fixture(autouse=True)
def _chain_code_by_value() -> Iterator[None]:
    cloudpickle.register_pickle_by_value(_executor_actors)
    yield
    if _executor_actors.__name__ in cloudpickle.list_registry_pickle_by_value():
        cloudpickle.unregister_pickle_by_value(_executor_actors)


def metric(rt: Runtime, name: str, **labels: str) -> float | None:
    """The value of the sample of ``name`` in ``rt``'s registry whose labels include
    ``labels`` (``None``: no such sample)."""
    for family in rt.metrics.collect():
        if family.name == name:
            for sample in family.samples:
                if not sample.suffix and labels.items() <= dict(sample.labels).items():
                    return sample.value
    return None


def frame(spark: Any, start: int, count: int, partitions: int = 3) -> Any:
    return spark.range(start, start + count, numPartitions=partitions).selectExpr("id")


def read(table: ParquetTable) -> list[tuple[int, int]]:
    files = sorted(Path(table.path).glob("data/**/*.parquet")) or sorted(
        p for p in Path(table.path).rglob("*.parquet") if ".staging" not in p.parts
    )
    rows = [r for f in files for r in pq.read_table(f).to_pylist()]
    return sorted((r["id"], r["twice"]) for r in rows)


def expected(start: int, count: int) -> list[tuple[int, int]]:
    return [(i, 2 * i) for i in range(start, start + count) if i % 3 != 0]


def chain_pipeline(
    tmp_path: Path, *, parallelism: int | None = 2, middle: Any = None
) -> tuple[Runtime, BatchFeed, DeclaredSink, ParquetTable]:
    feed = BatchFeed(IN)
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=3600.0))
    rt.add_source("events", feed.source)
    stream = Stream(rt, "events").filter(not_a_third)
    if middle is not None:
        stream = stream.apply("middle", middle)
    stream = stream.map_batches(twice, schema=OUT)
    table = ParquetTable(tmp_path / "table", OUT)
    sink = add_sink(rt, "out", table, input=stream.name, parallelism=parallelism)
    return rt, feed, sink, table


@BACKENDS
def test_a_partition_local_chain_runs_in_spark_tasks_exactly_once_with_no_row_on_the_driver(
    spark: Any, tmp_path: Path, backend: str
) -> None:
    rt, feed, sink, table = chain_pipeline(tmp_path, middle=Passes)
    with BlockingRuntime(rt, backend=backend) as handle:
        bridge = SparkBridge(handle, feed, sink=sink)
        for batch_id in range(3):
            epoch = bridge.deliver(frame(spark, batch_id * 100, 100), batch_id, run_on="executors")
            assert epoch is not None
        handle.call(sink.coordinator.wait_committed, epoch)
        assert bridge.deliver(frame(spark, 200, 100), 2, run_on="executors") is None  # replay
        stats = bridge.stats()
        assert (stats.staged_batches, stats.batches, stats.replays_skipped) == (3, 3, 1)
        assert stats.to_arrow_seconds == 0.0  # no toArrow: no row came to the driver
        assert stats.rows == 300  # delivered (read by the tasks), not the 200 the chain wrote
        assert stats.executor_tasks == 6  # parallelism 2: two tasks per micro-batch
        # The driver's instances of the chain saw barriers and the committable, no row.
        assert metric(rt, "barrierflow_actor_rows_in", actor="events.filter") == 0
    assert read(table) == expected(0, 300)


def test_the_chain_s_counters_come_back_from_the_tasks_labelled_on_executors(
    spark: Any, tmp_path: Path
) -> None:
    rt, feed, sink, _ = chain_pipeline(tmp_path)
    with BlockingRuntime(rt) as handle:
        bridge = SparkBridge(handle, feed, sink=sink)
        bridge.deliver(frame(spark, 0, 90), 0, run_on="executors")

    def on_executors(name: str, actor: str, **labels: str) -> float | None:
        return metric(rt, name, actor=actor, on="executors", **labels)

    assert on_executors("barrierflow_actor_rows_in", "events.filter") == 90
    assert (
        on_executors(
            "barrierflow_operator_rows_in", "events.filter.map_batches", operator="map_batches"
        )
        == 60
    )
    assert on_executors("barrierflow_operator_rows_out", "events.filter", operator="filter") == 60


@BACKENDS
def test_an_async_map_in_a_task_drains_its_calls_at_the_partition_s_end(
    spark: Any, tmp_path: Path, backend: str
) -> None:
    feed = BatchFeed(IN)
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=3600.0))
    rt.add_source("events", feed.source)
    stream = (
        Stream(rt, "events")
        .filter(not_a_third)
        .async_map(slow_twice, schema=OUT, concurrency=16, ordered=False)
    )
    table = ParquetTable(tmp_path / "table", OUT)
    sink = add_sink(rt, "out", table, input=stream.name)
    with BlockingRuntime(rt, backend=backend) as handle:
        bridge = SparkBridge(handle, feed, sink=sink)
        epoch = bridge.deliver(frame(spark, 0, 200, partitions=4), 0, run_on="executors")
        assert epoch is not None
        handle.call(sink.coordinator.wait_committed, epoch)
        calls = metric(rt, "barrierflow_operator_rows_in", actor="events.filter.async_map",
                       operator="async_map", on="executors")  # fmt: skip
    assert read(table) == expected(0, 200)
    assert calls == len(expected(0, 200))


@pytest.mark.parametrize(("partitions", "parallelism"), [(5, 2), (1, 3), (3, 3)])
def test_a_sink_s_parallelism_is_the_number_of_tasks_and_file_sets_on_the_executors(
    spark: Any, tmp_path: Path, partitions: int, parallelism: int
) -> None:
    rt, feed, sink, table = chain_pipeline(tmp_path, parallelism=parallelism)
    with BlockingRuntime(rt) as handle:
        bridge = SparkBridge(handle, feed, sink=sink)
        epoch = bridge.deliver(frame(spark, 0, 120, partitions), 0, run_on="executors")
        handle.call(sink.coordinator.wait_committed, epoch)
        assert bridge.stats().executor_tasks == parallelism
    assert read(table) == expected(0, 120)


def test_without_a_declared_parallelism_each_spark_partition_is_a_task(
    spark: Any, tmp_path: Path
) -> None:
    rt, feed, sink, table = chain_pipeline(tmp_path, parallelism=None)
    with BlockingRuntime(rt) as handle:
        bridge = SparkBridge(handle, feed, sink=sink)
        epoch = bridge.deliver(frame(spark, 0, 120, 5), 0, run_on="executors")
        handle.call(sink.coordinator.wait_committed, epoch)
        assert bridge.stats().executor_tasks == 5
    assert read(table) == expected(0, 120)


def refused(tmp_path: Path, spark: Any, declare: Any) -> ExecutorPlacementError:
    """What ``start(run_on="executors")`` refuses for the graph ``declare`` adds to, before
    any query starts."""
    feed = BatchFeed(IN)
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=3600.0))
    rt.add_source("events", feed.source)
    upstream = declare(rt)
    sink = add_sink(rt, "out", ParquetTable(tmp_path / "t", OUT), input=upstream)
    stream_df = spark.readStream.format("rate").load().selectExpr("value as id")
    with BlockingRuntime(rt) as handle:
        bridge = SparkBridge(handle, feed, sink=sink)
        with pytest.raises(ExecutorPlacementError) as info:
            bridge.start(stream_df, str(tmp_path / "ck"), run_on="executors")
    assert spark.streams.active == []
    assert "\n" not in str(info.value)
    return info.value


def test_a_global_actor_on_the_path_is_refused_before_the_query_starts(
    spark: Any, tmp_path: Path
) -> None:
    def declare(rt: Runtime) -> str:
        rt.add_actor("audit", Global, inputs=["events"])
        return Stream(rt, "audit").map_batches(twice, schema=OUT).name

    error = refused(tmp_path, spark, declare)
    assert error.actor == "audit"
    assert "global" in error.reason
    assert "run_on='driver'" in error.reason


def test_a_keyed_operator_after_a_map_is_refused_as_the_map_may_change_its_key(
    spark: Any, tmp_path: Path
) -> None:
    def declare(rt: Runtime) -> str:
        stream = Stream(rt, "events").map_batches(twice, schema=OUT)
        return stream.key_by("id").aggregate(total=("twice", "sum")).name

    error = refused(tmp_path, spark, declare)
    assert error.actor.endswith("aggregate")
    assert "only filter_rows may come before a keyed step" in error.reason


def test_a_plain_function_factory_is_refused_as_declaring_no_placement(
    spark: Any, tmp_path: Path
) -> None:
    def declare(rt: Runtime) -> str:
        rt.add_actor("plain", lambda: Passes(), inputs=["events"])
        return Stream(rt, "plain").map_batches(twice, schema=OUT).name

    error = refused(tmp_path, spark, declare)
    assert (error.actor, "plain function" in error.reason) == ("plain", True)


def test_a_side_branch_off_the_chain_is_refused_as_it_would_get_no_rows(
    spark: Any, tmp_path: Path
) -> None:
    def declare(rt: Runtime) -> str:
        mapped = Stream(rt, "events").map_batches(twice, schema=OUT)
        rt.add_actor("tap", Passes, inputs=[mapped.name])
        return mapped.name

    error = refused(tmp_path, spark, declare)
    assert error.actor == "tap"
    assert "never reach the driver" in error.reason


def test_a_chain_that_reads_a_side_output_is_refused(spark: Any, tmp_path: Path) -> None:
    def declare(rt: Runtime) -> str:
        enrich = Stream(rt, "events").async_map(
            fails_on_seven, schema=IN, dead_letters=True, retries=0
        )
        return Stream(rt, enrich.side("dead_letters").name).map_batches(twice, schema=OUT).name

    error = refused(tmp_path, spark, declare)
    assert "side output" in error.reason


def test_a_step_that_cannot_be_imported_on_the_executors_is_refused_at_start(
    spark: Any, tmp_path: Path
) -> None:
    cloudpickle.unregister_pickle_by_value(_executor_actors)
    rt, feed, sink, _ = chain_pipeline(tmp_path, middle=Passes)
    stream_df = spark.readStream.format("rate").load().selectExpr("value as id")
    with BlockingRuntime(rt) as handle:
        bridge = SparkBridge(handle, feed, sink=sink)
        with pytest.raises(ExecutorImportError) as info:
            bridge.start(stream_df, str(tmp_path / "ck"), run_on="executors")
    assert info.value.module == "_executor_actors"
    assert "register_pickle_by_value" in str(info.value)
    assert spark.streams.active == []


@BACKENDS
def test_a_chain_failing_in_every_attempt_fails_the_batch_in_one_line_naming_the_actor(
    spark: Any, tmp_path: Path, backend: str
) -> None:
    feed = BatchFeed(IN)
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=3600.0))
    rt.add_source("events", feed.source)
    stream = Stream(rt, "events").apply(
        "enrich", async_map(fails_on_seven, schema=IN, retries=1, retry_delay=0.001)
    )
    table = ParquetTable(tmp_path / "table", IN)
    sink = add_sink(rt, "out", table, input=stream.name)
    with structlog.testing.capture_logs() as logs, BlockingRuntime(rt, backend=backend) as handle:
        bridge = SparkBridge(handle, feed, sink=sink)
        with pytest.raises(ExecutorChainFailedError) as info:
            bridge.deliver(frame(spark, 0, 20, 1), 0, run_on="executors")
    error = info.value
    assert error.actor == "enrich"
    assert "\n" not in str(error)
    assert "id 7 is cursed" in str(error)
    assert error.attempts == 4  # local[2,4]: Spark tried 4 times
    assert type(error.cause).__name__ == "AsyncCallFailedError"
    failed = [e for e in logs if e["event"] == "executor task attempt failed"]
    assert len(failed) == 4
    assert sorted(e["attempt"] for e in failed) == [0, 1, 2, 3]  # Spark's attempt numbers
    assert all(e["actor"] == "enrich" for e in failed)
    assert not list(Path(table.path).rglob("*.parquet"))  # nothing of it became visible
    assert not any((Path(table.path) / ".staging").glob("*"))  # nor stays staged


def test_run_on_names_the_bad_value_and_write_on_stays_its_old_name(
    spark: Any, tmp_path: Path
) -> None:
    rt, feed, sink, table = chain_pipeline(tmp_path)
    with BlockingRuntime(rt) as handle:
        bridge = SparkBridge(handle, feed, sink=sink)
        with pytest.raises(InvalidArgumentError) as info:
            bridge.deliver(frame(spark, 0, 10), 0, run_on="cluster")
        assert info.value.argument == "run_on"
        epoch = bridge.deliver(frame(spark, 0, 30), 0, write_on="executors")
        handle.call(sink.coordinator.wait_committed, epoch)
    assert read(table) == expected(0, 30)
