"""Micro-batches written on Spark's executors and committed by the driver's coordinator, with a
real local Spark: every table, replays, task retries, and the typed errors. Both backends.

The rules (see ``barrierflow.actors.sinks.committables``): the partitions of a micro-batch are
the shares — each exactly once; the batch's files travel through the feed as a committable and
join the commit of the epoch that holds it; nothing staged by a failed or losing attempt
becomes visible; no row is collected to the driver; two crossings into the runtime per batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _executor_actors
import pyarrow as pa
import pytest
from _executor_actors import FailOnFirstDriverBarrier
from pyspark import cloudpickle
from test_tables import ADAPTERS, SCHEMA, TABLES, Adapter

from barrierflow.actors import BatchFeed, add_sink
from barrierflow.actors.sinks.add_sink import DeclaredSink
from barrierflow.connectors import ParquetTable
from barrierflow.errors import ExecutorImportError, InvalidArgumentError, SchemaMismatchError
from barrierflow.runtime import BlockingRuntime, Runtime, RuntimeConfig
from barrierflow.spark_bridge import SparkBridge
from barrierflow.testing import ListTable

pytestmark = pytest.mark.spark

BACKENDS = pytest.mark.parametrize("backend", ["asyncio", "trio"])


def build(
    tmp_path: Path, adapter: Adapter, *, parallelism: int = 2, table: Any = None
) -> tuple[Runtime, BatchFeed, DeclaredSink, Any]:
    feed = BatchFeed(SCHEMA)  # the table's: no row goes through it here, only batch ids
    table = adapter.make(tmp_path) if table is None else table
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=3600.0))
    rt.add_source("events", feed.source)
    sink = add_sink(rt, "out", table, input="events", parallelism=parallelism, key=("id",))
    return rt, feed, sink, table


def ids(spark: Any, start: int, count: int, partitions: int = 3) -> Any:
    return spark.range(start, start + count, numPartitions=partitions).selectExpr("id")


def leftovers(adapter: Adapter, table: Any) -> list[str]:
    """What is left in the staging area (task directories, adopted batches)."""
    staging = adapter.root(table) / ".staging"
    return sorted(p.name for p in staging.iterdir()) if staging.exists() else []


@pytest.mark.parametrize("adapter", TABLES)
@BACKENDS
def test_micro_batches_written_on_executors_are_committed_once_with_no_row_on_the_driver(
    spark: Any, tmp_path: Path, adapter: Adapter, backend: str
) -> None:
    rt, feed, sink, table = build(tmp_path, adapter)
    with BlockingRuntime(rt, backend=backend) as handle:
        bridge = SparkBridge(handle, feed, sink=sink)
        first = bridge.deliver(ids(spark, 0, 500), 0, write_on="executors")
        second = bridge.deliver(ids(spark, 500, 300, partitions=2), 1, write_on="executors")
        assert first is not None
        assert second is not None
        assert second > first
        # The replay of the last durable batch is skipped before any Spark job.
        assert bridge.deliver(ids(spark, 500, 300), 1, write_on="executors") is None
        handle.call(sink.coordinator.wait_committed, second)
        stats = bridge.stats()
    assert (stats.batches, stats.replays_skipped, stats.staged_batches) == (2, 1, 2)
    assert stats.rows == 800
    assert stats.to_arrow_seconds == 0.0  # no row was collected to the driver
    assert adapter.ids(table) == list(range(800))
    assert adapter.file_ids(table) == list(range(800))
    # Each partition's files are the writer "p<partition>"'s; nothing staged is left over.
    assert adapter.writers(table) <= {"wp0", "wp1", "wp2"}
    assert leftovers(adapter, table) == []


@BACKENDS
def test_a_streaming_query_on_executors_is_exactly_once_across_a_driver_restart(
    spark: Any, tmp_path: Path, backend: str
) -> None:
    from test_spark_bridge import streaming, write_files

    adapter = ADAPTERS["delta"]
    source = tmp_path / "in"
    write_files(source, [120, 0, 80])
    for expected in (200, 230):
        rt, feed, sink, table = build(tmp_path, adapter)
        with BlockingRuntime(rt, backend=backend) as handle:
            bridge = SparkBridge(handle, feed, stream="q", sink=sink)
            frame = streaming(spark, source).selectExpr("key as id")
            query = bridge.start(
                frame, str(tmp_path / "ck"), available_now=True, write_on="executors"
            )
            bridge.await_termination(query)
        assert adapter.ids(table) == list(range(expected))
        write_files(source, [30], start=200, first=3)


def fail_once() -> Any:
    """An upstream step whose first attempt of partition 1 fails after it passed on a batch:
    the staging task (pipelined with it) has written a file by then. Made in a function so
    that Spark ships it by value (executors cannot import this test module)."""

    def step(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None
        failing = context.partitionId() == 1 and context.attemptNumber() == 0
        for batch in batches:
            for piece in batch.to_batches(max_chunksize=10) if failing else [batch]:
                yield piece
                if failing:
                    raise RuntimeError("the first attempt of partition 1 fails")

    return step


class NotOnExecutors:
    """A step defined at module level in this test module: Spark ships it by reference, and
    executors cannot import the module."""

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from batches


@BACKENDS
def test_a_task_that_fails_its_first_attempt_is_retried_and_its_files_never_show(
    spark: Any, tmp_path: Path, backend: str
) -> None:
    adapter = ADAPTERS["parquet"]
    # Row groups of 5 rows: the failing attempt has written a file when it fails.
    parquet = ParquetTable(tmp_path / "table", SCHEMA, row_group_rows=5)
    rt, feed, sink, table = build(tmp_path, adapter, table=parquet)
    frame = ids(spark, 0, 400, partitions=2)
    flaky = frame.mapInArrow(fail_once(), frame.schema)
    with BlockingRuntime(rt, backend=backend) as handle:
        bridge = SparkBridge(handle, feed, sink=sink)
        epoch = bridge.deliver(flaky, 0, write_on="executors")
        assert epoch is not None
        handle.call(sink.coordinator.wait_committed, epoch)
    assert adapter.ids(table) == list(range(400))
    assert leftovers(adapter, table) == []
    # Every committed file is an adopted attempt's: one directory per partition.
    assert adapter.writers(table) == {"wp0", "wp1"}


def test_writing_on_executors_refuses_what_it_cannot_do_naming_it(
    spark: Any, tmp_path: Path
) -> None:
    rt, feed, sink, _ = build(tmp_path, ADAPTERS["parquet"])
    listed = add_sink(rt, "listed", ListTable(SCHEMA), input="events")
    with BlockingRuntime(rt) as handle:
        with pytest.raises(InvalidArgumentError) as info:
            SparkBridge(handle, feed, sink=sink).deliver(ids(spark, 0, 1), 0, write_on="gpu")
        assert (info.value.argument, info.value.got) == ("write_on", "gpu")
        with pytest.raises(InvalidArgumentError) as info:
            SparkBridge(handle, feed).deliver(ids(spark, 0, 1), 0, write_on="executors")
        assert info.value.argument == "sink"
        with pytest.raises(InvalidArgumentError) as info:
            SparkBridge(handle, feed, sink=listed).deliver(
                ids(spark, 0, 1), 0, write_on="executors"
            )
        assert (info.value.argument, info.value.got) == ("table", "ListTable")
        with pytest.raises(InvalidArgumentError) as info:
            SparkBridge(handle, feed, sink="out")  # type: ignore[arg-type]
        assert info.value.argument == "sink"
        # The schema checked at the boundary is the table's, before any Spark job.
        with pytest.raises(SchemaMismatchError):
            SparkBridge(handle, feed, sink=sink).deliver(
                ids(spark, 0, 1).selectExpr("cast(id as int) as id"), 0, write_on="executors"
            )


def test_a_micro_batch_on_executors_crosses_into_the_runtime_twice_and_a_replay_twice(
    spark: Any, tmp_path: Path
) -> None:
    rt, feed, sink, table = build(tmp_path, ADAPTERS["parquet"])
    with BlockingRuntime(rt) as handle:
        bridge = SparkBridge(handle, feed, sink=sink)
        crossings: list[str] = []
        call = handle.call

        def counted(function: Any, *args: Any) -> Any:
            crossings.append(getattr(function, "__name__", None) or function.func.__name__)
            return call(function, *args)

        handle.call = counted  # type: ignore[method-assign]
        epoch = bridge.deliver(ids(spark, 0, 100), 0, write_on="executors")
        assert crossings == ["_probe", "deliver"]  # the batch-id check, then the delivery
        crossings.clear()
        assert bridge.deliver(ids(spark, 0, 100), 0, write_on="executors") is None
        assert crossings == ["_probe", "deliver"]  # a replay: no Spark job, a confirmation
        handle.call = call  # type: ignore[method-assign]
        assert epoch is not None
        handle.call(sink.coordinator.wait_committed, epoch)
    assert ADAPTERS["parquet"].ids(table) == list(range(100))


def test_a_sink_not_downstream_of_the_feed_is_refused_before_any_spark_work(
    spark: Any, tmp_path: Path
) -> None:
    adapter = ADAPTERS["parquet"]
    feed, other = BatchFeed(SCHEMA), BatchFeed(SCHEMA)
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=3600.0))
    rt.add_source("events", feed.source)
    rt.add_source("elsewhere", other.source)
    table = adapter.make(tmp_path)
    sink = add_sink(rt, "out", table, input="elsewhere", parallelism=2, key=("id",))
    with BlockingRuntime(rt) as handle:
        bridge = SparkBridge(handle, feed, sink=sink)
        with pytest.raises(InvalidArgumentError) as info:
            bridge.deliver(ids(spark, 0, 10), 0, write_on="executors")
        assert bridge.stats().staged_batches == 0
    assert info.value.argument == "sink"
    assert "'events'" in info.value.expected
    assert "out.0" in str(info.value.got)
    assert adapter.ids(table) == []


def test_a_module_executors_cannot_import_is_one_typed_error_saying_how_to_ship_it(
    spark: Any, tmp_path: Path
) -> None:
    rt, feed, sink, table = build(tmp_path, ADAPTERS["parquet"])
    frame = ids(spark, 0, 10, partitions=1)
    with BlockingRuntime(rt) as handle:
        bridge = SparkBridge(handle, feed, sink=sink)
        with pytest.raises(ExecutorImportError) as info:
            bridge.deliver(
                frame.mapInArrow(NotOnExecutors(), frame.schema), 0, write_on="executors"
            )
    error = info.value
    assert error.module == "test_spark_executors"
    assert "PYSPARK_PYTHON" in str(error)
    assert "spark.archives" in str(error)
    assert "\n" not in str(error)
    assert error.__context__ is None
    assert error.__cause__ is None
    assert ADAPTERS["parquet"].ids(table) == []


@BACKENDS
def test_a_graph_failure_after_the_staging_stages_the_batch_again_and_holds_it_once(
    spark: Any, tmp_path: Path, backend: str
) -> None:
    FailOnFirstDriverBarrier.failed = False
    cloudpickle.register_pickle_by_value(_executor_actors)
    adapter = ADAPTERS["parquet"]
    feed = BatchFeed(SCHEMA)
    config = RuntimeConfig(
        state_path=tmp_path / "state.db", barrier_interval=3600.0, recovery=True,
        restart_backoff=0.01, max_restarts=2,
    )  # fmt: skip
    rt = Runtime(config)
    rt.add_source("events", feed.source)
    rt.add_actor("flaky", FailOnFirstDriverBarrier, inputs=["events"])
    table = adapter.make(tmp_path)
    sink = add_sink(rt, "out", table, input="flaky", parallelism=2, key=("id",))
    with BlockingRuntime(rt, backend=backend) as handle:
        bridge = SparkBridge(handle, feed, sink=sink)
        epoch = bridge.deliver(ids(spark, 0, 300), 0, write_on="executors")
        assert epoch is not None
        handle.call(sink.coordinator.wait_committed, epoch)
        assert handle.stats().restarts == 1
        # Staged twice: the first committable died with its epoch.
        assert (bridge.stats().staged_batches, bridge.stats().batches) == (2, 1)
    assert FailOnFirstDriverBarrier.failed
    assert adapter.ids(table) == list(range(300))
    assert leftovers(adapter, table) == []


def test_a_vnode_partitioned_batch_keeps_each_writer_s_keys_in_one_partition_and_lands_once(
    spark: Any, tmp_path: Path
) -> None:
    import numpy as np

    from barrierflow.channels.vnode import VnodeBitmap, compute_vnodes, vnode_owners
    from barrierflow.spark_bridge.executors import partition_by_vnode

    owned = partition_by_vnode(ids(spark, 0, 600, partitions=3), ["id"], 2)
    assert owned.columns == ["id"]  # the owner column is gone before staging
    rows = owned.selectExpr("id", "spark_partition_id() as p").toArrow()
    owners = vnode_owners(VnodeBitmap.split(2))[compute_vnodes(rows.select(["id"]), ["id"])]
    partitions = np.asarray(rows["p"])
    for owner in (0, 1):  # every row of one writer's vnodes in one Spark partition
        assert len(set(partitions[owners == owner].tolist())) == 1
    adapter = ADAPTERS["parquet"]
    rt, feed, sink, table = build(tmp_path, adapter)
    with BlockingRuntime(rt) as handle:
        bridge = SparkBridge(handle, feed, sink=sink)
        epoch = bridge.deliver(owned, 0, write_on="executors")
        assert epoch is not None
        handle.call(sink.coordinator.wait_committed, epoch)
    assert adapter.ids(table) == list(range(600))
    with pytest.raises(InvalidArgumentError):
        partition_by_vnode(owned, [], 2)
    with pytest.raises(InvalidArgumentError):
        partition_by_vnode(owned, ["id"], 0)
