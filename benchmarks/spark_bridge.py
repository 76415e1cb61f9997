"""Spark bridge benchmarks: micro-batches into a graph through the bridge vs Spark alone.

``spark_bridge_rows_per_s`` — candidate: :meth:`SparkBridge.deliver` of ``K`` micro-batches
(batch ids ``0 .. K-1``) into a runtime whose graph is a :class:`~barrierflow.actors.BatchFeed`
source (65,536-row chunks, capacity 8) and one actor that drops the chunks: per batch Spark's
``toArrow``, the chunks through the bounded feed channel, the end mark and a checkpoint,
returning once durable. A fresh runtime and state directory per run (starting it is untimed).
Baseline: ``df.toArrow()`` of the same DataFrame ``K`` times in the same process — what any
Python consumer of the micro-batch pays. The micro-batch is one static DataFrame of ``n`` rows
(``key`` int64, ``value`` float64; 1M rows, also with ``--quick``, which runs fewer
repetitions), cached and materialized first, so Spark's own computation is the same for both
sides. The two sides alternate; medians are reported. Goal: ratio >= 0.9.

``spark_bridge_batch_overhead_ms`` — the fixed cost of one micro-batch: a real Structured
Streaming query over a directory of empty Parquet files read one file per trigger
(``maxFilesPerTrigger=1``, ``availableNow``), so every micro-batch is empty. Candidate:
``foreachBatch(bridge.callback)`` (schema check, replay check, ``toArrow`` of nothing, an end
mark, a durable checkpoint); baseline: ``foreachBatch`` with an empty callback. The figure is
the steady-state ms per micro-batch: the time between the first and the last callback's start
divided by the batches in between (query start-up, the first micro-batch and shut-down left
out); both sides run on the same files with fresh Spark checkpoints, alternately, after one
untimed warm-up query through the bridge. ``details`` also gives a query whose callback does
only ``df.toArrow()``: the part of the gap that is Spark's job for an empty batch. Goal:
ratio <= 1.5.

``spark_executors_iceberg_rows_per_s`` — micro-batches into an Iceberg table with the rows
written on Spark's executors. Candidate: :meth:`SparkBridge.deliver` with
``write_on="executors"`` of ``K`` micro-batches of ``n`` rows (4 partitions) into a runtime
whose feed source feeds 4 coordinated writers of an :class:`~barrierflow.connectors.IcebergTable`:
per batch one Spark job staging Parquet files in the tasks, the driver adopting them, the end
mark, a durable checkpoint, one Iceberg commit — timed until the last epoch is committed.
Baseline: the hand-written exactly-once-less path a user would write, ``df.toArrow()`` then
pyiceberg's ``Table.append`` per micro-batch, into another table of the same catalog.
``details`` give the same batches through the driver (``write_on="driver"``: ``toArrow`` and
the graph's writers) and the executor path behind ``partition_by_vnode(df, ["key"], 4)``
(barrierflow's vnode function on the executors, then a shuffle: what a table needing key
ownership would add). Goal: ratio >= 0.9.

``metrics_spark_bridge_rows_per_s`` — ``spark_bridge_rows_per_s``'s candidate with the
runtime's metrics endpoint on (``metrics_port=0``) and scraped every 0.5 s by a thread, against
the same without an endpoint, alternating. Goal: ratio >= 0.99 (metrics cost at most 1 %).

One local SparkSession (``spark_session()``: ``local[2]``) serves them all; it starts on first
use.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from barrierflow.actors import BatchFeed, add_sink
from barrierflow.channels import Chunk
from barrierflow.channels.messages import Message
from barrierflow.connectors import IcebergTable, open_local_catalog
from barrierflow.runtime import BlockingRuntime, Runtime, RuntimeConfig
from barrierflow.runtime.actor import ActorContext, StreamActor
from barrierflow.spark_bridge import SparkBridge, spark_session
from barrierflow.spark_bridge.executors import partition_by_vnode
from benchmarks.harness import Settings, make_record, median, rounded, sampled, samples

__all__ = ["BENCHMARKS"]

SCHEMA = pa.schema([("key", pa.int64()), ("value", pa.float64())])
ROWS = 1_000_000
CHUNK_ROWS = 65_536
CAPACITY = 8
#: Micro-batches of a query not in its figure: the first (slow: planning, code generation) and
#: the last (the figure runs from one callback's start to the next).
_SKIPPED = 2

_session: Any = None


def _spark() -> Any:
    """The benchmarks' SparkSession, started on first use (a few seconds)."""
    global _session
    if _session is None:
        _session = spark_session("barrierflow-benchmarks")
    return _session


class _Drop(StreamActor):
    """Counts and drops every chunk; passes barriers on (so checkpoints complete)."""

    def __init__(self) -> None:
        self.rows = 0

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk):
            self.rows += message.cardinality
            return
        await ctx.emit(message)


class _Graph:
    """A fresh runtime: batch feed source → dropping actor, state in its own directory."""

    def __init__(self, root: str, metrics: bool = False) -> None:
        self.feed = BatchFeed(SCHEMA, chunk_rows=CHUNK_ROWS, capacity=CAPACITY)
        self.drops: list[_Drop] = []
        self.runtime = Runtime(
            RuntimeConfig(
                state_path=os.path.join(root, "state.db"),
                barrier_interval=3600.0,
                metrics_port=0 if metrics else None,
            )
        )
        self.runtime.add_source("events", self.feed.source)
        self.runtime.add_actor("drop", self._drop, inputs=["events"])

    def _drop(self) -> _Drop:
        actor = _Drop()
        self.drops.append(actor)
        return actor

    @property
    def rows(self) -> int:
        return sum(d.rows for d in self.drops)


@contextmanager
def _bridge(root: str, metrics: bool = False) -> Iterator[tuple[SparkBridge, _Graph]]:
    """A running fresh graph in ``root`` and a bridge into it; with ``metrics``, its metrics
    endpoint on and scraped every 0.5 s by a thread meanwhile."""
    graph = _Graph(root, metrics)
    with BlockingRuntime(graph.runtime) as handle:
        stop = threading.Event()
        url = graph.runtime.metrics_url

        def scrape() -> None:
            while url is not None and not stop.wait(0.5):
                with urllib.request.urlopen(url, timeout=10) as response:
                    response.read()

        scraper = threading.Thread(target=scrape, daemon=True)
        scraper.start()
        try:
            yield SparkBridge(handle, graph.feed), graph
        finally:
            stop.set()
            scraper.join()


def _alternate(sides: Sequence[Callable[[], float]], reps: int) -> list[list[float]]:
    """``reps`` figures of each side, the order reversing every repetition (as ``compare``)."""
    figures: list[list[float]] = [[] for _ in sides]
    order = list(enumerate(sides))
    for i in range(reps):
        for index, side in order if i % 2 == 0 else order[::-1]:
            figures[index].append(side())
    return figures


def spark_bridge_rows_per_s(settings: Settings) -> dict[str, Any]:
    spark = _spark()
    # The same batch size in both modes: the bridge's fixed cost per batch (~4 ms) weighs
    # against toArrow's time per row, so a smaller quick batch would measure something else.
    n = ROWS
    batches = 8
    reps = 3 if settings.quick else 5
    df = spark.range(n).selectExpr("id as key", "rand(7) as value").cache()
    df.count()
    profile = {"to_arrow": 0.0, "deliver": 0.0, "blocked": 0.0, "checkpoint": 0.0}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            runs = iter(range(1 << 30))

            def candidate() -> float:
                with _bridge(os.path.join(tmp, f"run-{next(runs)}")) as (bridge, graph):
                    started = time.perf_counter()
                    for batch_id in range(batches):
                        bridge.deliver(df, batch_id)
                    elapsed = time.perf_counter() - started
                    stats, feed = bridge.stats(), graph.feed.stats()
                if graph.rows != n * batches or stats.batches != batches:
                    raise AssertionError(
                        f"the graph got {graph.rows} rows in {stats.batches} batches, "
                        f"expected {n * batches} in {batches}"
                    )
                profile["to_arrow"] += stats.to_arrow_seconds
                profile["deliver"] += stats.deliver_seconds
                profile["blocked"] += feed.blocked_seconds
                profile["checkpoint"] += feed.checkpoint_seconds
                return n * batches / elapsed

            def baseline() -> float:
                started = time.perf_counter()
                for _ in range(batches):
                    if df.toArrow().num_rows != n:
                        raise AssertionError("toArrow lost rows")
                return n * batches / (time.perf_counter() - started)

            candidate(), baseline()  # warm-up: JIT, Arrow buffers, the state store
            for key in profile:
                profile[key] = 0.0
            ours, theirs = _alternate([candidate, baseline], reps)
    finally:
        df.unpersist()
    per_batch_ms = {k: round(v / (reps * batches) * 1e3, 3) for k, v in profile.items()}
    return make_record(
        "spark_bridge_rows_per_s",
        median(ours),
        "rows/s",
        median(theirs),
        ">= 0.9",
        details={
            "backend": "asyncio",
            "spark_master": _spark().sparkContext.master,
            "rows_per_batch": n,
            "batches_per_run": batches,
            "chunk_rows": CHUNK_ROWS,
            "feed_capacity": CAPACITY,
            **sampled(ours, theirs),
            "candidate_ms_per_batch": per_batch_ms,
            "candidate": "SparkBridge.deliver per batch: toArrow, 65,536-row chunks through "
            "the bounded feed (capacity 8) to a dropping actor, end mark, durable checkpoint",
            "baseline_impl": "df.toArrow() of the same cached DataFrame, same count",
        },
    )


def metrics_spark_bridge_rows_per_s(settings: Settings) -> dict[str, Any]:
    """The Spark bridge's micro-batches with the runtime's metrics endpoint on and scraped
    every 0.5 s, against the same without an endpoint (see the module docstring)."""
    spark = _spark()
    n, batches = ROWS, 8
    reps = 3 if settings.quick else 5
    df = spark.range(n).selectExpr("id as key", "rand(7) as value").cache()
    df.count()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            runs = iter(range(1 << 30))

            def side(metrics: bool) -> Callable[[], float]:
                def run() -> float:
                    with _bridge(os.path.join(tmp, f"run-{next(runs)}"), metrics) as (bridge, _):
                        started = time.perf_counter()
                        for batch_id in range(batches):
                            bridge.deliver(df, batch_id)
                        return n * batches / (time.perf_counter() - started)

                return run

            side(True)(), side(False)()  # warm-up
            ours, theirs = _alternate([side(True), side(False)], reps)
    finally:
        df.unpersist()
    return make_record(
        "metrics_spark_bridge_rows_per_s",
        median(ours),
        "rows/s",
        median(theirs),
        ">= 0.99",
        details={
            "rows_per_batch": n,
            "batches_per_run": batches,
            **sampled(ours, theirs),
            "candidate": "spark_bridge_rows_per_s's candidate with metrics_port=0, scraped "
            "every 0.5 s",
            "baseline_impl": "the same, no metrics endpoint",
        },
    )


def _empty_files(directory: str, count: int) -> None:
    os.makedirs(directory)
    for i in range(count):
        pq.write_table(SCHEMA.empty_table(), os.path.join(directory, f"part-{i:05d}.parquet"))


def _ms_per_batch(
    spark: Any, input_dir: str, checkpoint: str, callback: Callable[[Any, int], None]
) -> tuple[float, int]:
    """Run the query over ``input_dir`` to the end; the steady-state ms per micro-batch."""
    from pyspark.sql.types import DoubleType, LongType, StructField, StructType

    schema = StructType([StructField("key", LongType()), StructField("value", DoubleType())])
    starts: list[float] = []

    def timed(df: Any, batch_id: int) -> None:
        starts.append(time.perf_counter())
        callback(df, batch_id)

    query = (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", 1)
        .parquet(input_dir)
        .writeStream.foreachBatch(timed)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"the streaming query failed: {query.exception()}")
    timed_starts = starts[_SKIPPED - 1 :]
    return (timed_starts[-1] - timed_starts[0]) / (len(timed_starts) - 1) * 1e3, len(starts)


def spark_bridge_batch_overhead_ms(settings: Settings) -> dict[str, Any]:
    spark = _spark()
    files = 8 if settings.quick else 12
    reps = 2 if settings.quick else 5
    profile = {"to_arrow": 0.0, "deliver": 0.0, "checkpoint": 0.0}
    with tempfile.TemporaryDirectory() as tmp:
        input_dir = os.path.join(tmp, "input")
        _empty_files(input_dir, files)
        runs = iter(range(1 << 30))

        def bridged(directory: str, expected: int) -> float:
            root = os.path.join(tmp, f"run-{next(runs)}")
            with _bridge(root) as (bridge, graph):
                ms, count = _ms_per_batch(
                    spark, directory, os.path.join(root, "ck"), bridge.callback
                )
                stats, feed = bridge.stats(), graph.feed.stats()
            if count != expected or stats.batches != expected:
                raise AssertionError(f"{count} micro-batches, {stats.batches} delivered")
            profile["to_arrow"] += stats.to_arrow_seconds
            profile["deliver"] += stats.deliver_seconds
            profile["checkpoint"] += feed.checkpoint_seconds
            return ms

        def plain(callback: Callable[[Any, int], None]) -> Callable[[], float]:
            def run() -> float:
                root = os.path.join(tmp, f"run-{next(runs)}")
                ms, count = _ms_per_batch(spark, input_dir, os.path.join(root, "ck"), callback)
                if count != files:
                    raise AssertionError(f"{count} micro-batches, expected {files}")
                return ms

            return run

        def empty(df: Any, batch_id: int) -> None:
            pass

        def to_arrow(df: Any, batch_id: int) -> None:
            if df.toArrow().num_rows:
                raise AssertionError("an empty micro-batch has rows")

        warm_dir = os.path.join(tmp, "warm-up")
        _empty_files(warm_dir, 6)
        bridged(warm_dir, 6)  # warm-up: the callback server, toArrow, the state store
        for key in profile:
            profile[key] = 0.0
        ours, theirs, arrow = _alternate(
            [lambda: bridged(input_dir, files), plain(empty), plain(to_arrow)], reps
        )
    per_batch_ms = {k: round(v / (reps * files) * 1e3, 3) for k, v in profile.items()}
    return make_record(
        "spark_bridge_batch_overhead_ms",
        median(ours),
        "ms",
        median(theirs),
        "<= 1.5",
        details={
            "backend": "asyncio",
            "spark_master": spark.sparkContext.master,
            "micro_batches_per_run": files,
            "timed_micro_batches_per_run": files - _SKIPPED,
            **sampled(ours, theirs),
            "candidate_ms_per_batch": per_batch_ms,
            "to_arrow_callback_ms": rounded(median(arrow)),
            "to_arrow_callback_samples": samples(arrow),
            "ratio_to_to_arrow_callback": rounded(median(ours) / median(arrow)),
            "candidate": "readStream parquet of empty files, maxFilesPerTrigger=1, availableNow "
            "-> foreachBatch(bridge.callback): schema and replay checks, toArrow (0 rows), end "
            "mark, durable checkpoint",
            "baseline_impl": "the same query with foreachBatch(an empty callback); "
            "to_arrow_callback_ms: with foreachBatch(lambda df, _: df.toArrow())",
        },
    )


#: Every benchmark of this module, by name, in run order.
def _iceberg_run(root: str, frames: Sequence[Any], write_on: str, catalog: Any, name: str) -> float:
    """Rows/s of ``frames`` (batch ids 0..) through a bridge into a fresh Iceberg sink of 4
    writers, until the last epoch is committed."""
    feed = BatchFeed(ICEBERG_SCHEMA)
    rt = Runtime(RuntimeConfig(state_path=os.path.join(root, "state.db"), barrier_interval=3600.0))
    rt.add_source("events", feed.source)
    table = IcebergTable(catalog, name, ICEBERG_SCHEMA)
    sink = add_sink(rt, "out", table, input="events", parallelism=4, key=("key",))
    with BlockingRuntime(rt) as handle:
        bridge = SparkBridge(handle, feed, sink=sink)
        started = time.perf_counter()
        epoch = None
        for batch_id, frame in enumerate(frames):
            epoch = bridge.deliver(frame, batch_id, write_on=write_on)
        assert epoch is not None
        handle.call(sink.coordinator.wait_committed, epoch)
        elapsed = time.perf_counter() - started
        rows = bridge.stats().rows
    if rows != sum(_ICEBERG_ROWS for _ in frames):
        raise AssertionError(f"{rows} rows delivered, expected {_ICEBERG_ROWS * len(frames)}")
    return rows / elapsed


ICEBERG_SCHEMA = pa.schema([("key", pa.int64()), ("value", pa.float64())])
_ICEBERG_ROWS = 1_000_000


def spark_executors_iceberg_rows_per_s(settings: Settings) -> dict[str, Any]:
    spark = _spark()
    n, batches = _ICEBERG_ROWS, 4
    reps = 2 if settings.quick else 4
    df = spark.range(n, numPartitions=4).selectExpr("id as key", "rand(7) as value").cache()
    df.count()
    shuffled = partition_by_vnode(df, ["key"], 4)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            catalog = open_local_catalog(os.path.join(tmp, "catalog"))
            runs = iter(range(1 << 30))

            def ours(frame: Any, write_on: str) -> Callable[[], float]:
                def run() -> float:
                    number = next(runs)
                    root = os.path.join(tmp, f"run-{number}")
                    os.makedirs(root)
                    name = f"bench.run{number}"
                    return _iceberg_run(root, [frame] * batches, write_on, catalog, name)

                return run

            def baseline() -> float:
                table = IcebergTable(catalog, f"bench.alone{next(runs)}", ICEBERG_SCHEMA).table()
                started = time.perf_counter()
                for _ in range(batches):
                    table.append(df.toArrow())
                return n * batches / (time.perf_counter() - started)

            sides = [
                ours(df, "executors"),
                baseline,
                ours(df, "driver"),
                ours(shuffled, "executors"),
            ]
            for side in sides:
                side()  # warm-up: planning, Python workers, the catalog
            candidate, theirs, driver, shuffle = _alternate(sides, reps)
    finally:
        df.unpersist()
    return make_record(
        "spark_executors_iceberg_rows_per_s",
        median(candidate),
        "rows/s",
        median(theirs),
        ">= 0.9",
        details={
            "spark_master": spark.sparkContext.master,
            "rows_per_batch": n,
            "partitions": 4,
            "batches_per_run": batches,
            "writers": 4,
            **sampled(candidate, theirs),
            "driver_path_rows_per_s": rounded(median(driver)),
            "executors_vs_driver": rounded(median(candidate) / median(driver), 3),
            "with_vnode_shuffle_rows_per_s": rounded(median(shuffle)),
            "shuffle_vs_no_shuffle": rounded(median(shuffle) / median(candidate), 3),
            "baseline_impl": "df.toArrow() then pyiceberg Table.append per micro-batch (no "
            "exactly-once), into another table of the same catalog",
        },
    )


BENCHMARKS: dict[str, Callable[[Settings], dict[str, Any]]] = {
    "spark_bridge_rows_per_s": spark_bridge_rows_per_s,
    "spark_bridge_batch_overhead_ms": spark_bridge_batch_overhead_ms,
    "spark_executors_iceberg_rows_per_s": spark_executors_iceberg_rows_per_s,
    "metrics_spark_bridge_rows_per_s": metrics_spark_bridge_rows_per_s,
}
