"""One fresh Spark driver for :mod:`benchmarks.spark_chain`: the process whose tree (this Python
process and the JVM it starts) the parent measures.

Usage: ``python _driver_tree_child.py CONFIGS_JSON`` (a list of query configurations: one
per fresh driver on the cluster, several in one driver with ``--quick``). The driver starts
its SparkSession (``master``: the benchmark's standalone cluster, or ``local[n]``); per query
it declares the pipeline, starts its runtime and delivers one small warm-up micro-batch
(planning, code generation, the executors' Python workers), prints ``BENCH {"ready": ...}``
and waits for ``go`` on stdin, so that the parent reads the tree's CPU and memory right before
the query. The query is ``batches`` micro-batches of ``rows`` rows each through
:meth:`~barrierflow.spark_bridge.SparkBridge.deliver` on ``run_on``, until the last epoch is
committed; then it prints ``BENCH {"done": ...}`` (rows, seconds, the bridge's counters) and,
on ``check``, checks the table's row count (unmeasured) before the next query.

Modes (``config["mode"]``):

* ``"chain"``: rows of ``key`` int64 and ``value`` double (16 bytes), with ``wide`` also
  ``text``, a 200-character string (~216 bytes), made by Spark on the executors per batch
  (``spark.range`` in ``config["partitions"]`` partitions, never cached nor collected), through
  ``filter (key & 7 != 7) -> map_batches (value * 2) -> 4 Iceberg writers``. With
  ``"chain": false`` the sink reads the feed directly (today's table-only executor path).
* ``"async"``: ``key`` rows through ``async_map`` (one HTTP/1.1 keep-alive call per row to the
  parent's service at ``config["service"]``, ``concurrency`` in flight per task) into
  ``writers`` Iceberg writers, ``config["partitions"]`` Spark tasks.
* ``"floor"``: no runtime — Spark alone over the same micro-batches: ``mapInArrow`` counting
  the rows in the Python tasks (``spark_python_tasks``), and ``toArrow`` on the driver
  (``to_arrow``), each timed (``BENCH {"floor": ...}``); for the time breakdown.

The functions the chain runs are defined here, in ``__main__``, so that they travel to the
executors by value (cloudpickle) and the executors need nothing but barrierflow.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.lowlevel
import pyarrow as pa
import pyarrow.compute as pc
from anyio.abc import SocketStream
from anyio.streams.buffered import BufferedByteReceiveStream

#: The filter of the chain: drops one key in 8, so the filter does work and the count is exact.
KEEP = pc.bit_wise_and(pc.field("key"), 7) != 7
#: Rows per partition of the warm-up micro-batch (batch id 0).
WARM_ROWS_PER_PARTITION = 2_000
#: The text column: 200 characters, distinct per row (hex of a SHA-256, repeated, cut).
TEXT = "substring(repeat(sha2(cast(id AS string), 256), 4), 1, 200) AS text"


def _say(**fields: Any) -> None:
    """One line for the parent (``BENCH`` and JSON: Spark may print other lines to stdout)."""
    print("BENCH " + json.dumps(fields), flush=True)


def kept(start: int, stop: int) -> int:
    """How many keys of ``range(start, stop)`` the filter keeps (those with ``key % 8 != 7``)."""

    def sevens(end: int) -> int:  # keys k < end with k % 8 == 7
        return (end + 1) // 8

    return (stop - start) - (sevens(stop) - sevens(start))


def double_value(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The chain's map: ``value`` doubled (vectorized)."""
    index = batch.schema.get_field_index("value")
    return batch.set_column(index, batch.schema.field(index), pc.multiply(batch.column(index), 2.0))


# -- the async service's client ------------------------------------------------------------

#: The connections of this event loop's run: each task's runtime has a loop of its own.
_CONNECTIONS: anyio.lowlevel.RunVar[list[tuple[SocketStream, BufferedByteReceiveStream]]] = (
    anyio.lowlevel.RunVar("bench_connections")
)
_SERVICE: tuple[str, int] = ("127.0.0.1", 0)


async def score(row: dict[str, Any]) -> dict[str, Any]:
    """One call of the service: ``GET /score?key=<key>`` on a pooled keep-alive connection;
    the answer (``2 * key``) becomes ``score``."""
    try:
        pool = _CONNECTIONS.get()
    except LookupError:
        pool = []
        _CONNECTIONS.set(pool)
    if pool:
        stream, reader = pool.pop()
    else:
        stream = await anyio.connect_tcp(*_SERVICE)
        reader = BufferedByteReceiveStream(stream)
    try:
        await stream.send(b"GET /score?key=%d HTTP/1.1\r\nHost: bench\r\n\r\n" % row["key"])
        head = await reader.receive_until(b"\r\n\r\n", 4096)
        length = int(head.rpartition(b"Content-Length: ")[2])
        body = await reader.receive_exactly(length)
    except BaseException:
        await anyio.aclose_forcefully(stream)
        raise
    pool.append((stream, reader))
    return {"key": row["key"], "score": int(body)}


# -- the driver --------------------------------------------------------------------------------


def _frames(spark: Any, config: dict[str, Any]) -> Iterator[tuple[int, int, Any]]:
    """``(start, stop, frame)`` per micro-batch: the warm-up one, then the timed ones."""
    partitions = config["partitions"]
    columns = ["id AS key"]
    if config["mode"] != "async":
        columns.append("rand(7) AS value")
        if config["wide"]:
            columns.append(TEXT)
    start = 0
    for rows in [WARM_ROWS_PER_PARTITION * partitions] + [config["rows"]] * config["batches"]:
        frame = spark.range(start, start + rows, numPartitions=partitions).selectExpr(*columns)
        yield start, start + rows, frame
        start += rows


def _floor(spark: Any, config: dict[str, Any]) -> None:
    """Spark alone over the benchmark's micro-batches (see the module)."""

    def count(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        rows = sum(batch.num_rows for batch in batches)
        yield pa.record_batch({"rows": pa.array([rows], pa.int64())})

    frames = list(_frames(spark, config))
    frames[0][2].mapInArrow(count, "rows long").collect()  # warm-up: the Python workers
    _say(ready=True)
    if not _await_cue("go"):
        return

    def python_tasks(frame: Any) -> int:
        return sum(int(row["rows"]) for row in frame.mapInArrow(count, "rows long").collect())

    def to_arrow(frame: Any) -> int:
        return int(frame.toArrow().num_rows)

    figures: dict[str, float] = {}
    for name, run in (("spark_python_tasks", python_tasks), ("to_arrow", to_arrow)):
        started = time.perf_counter()
        rows = sum(run(frame) for _, _, frame in frames[1:])
        figures[name] = rows / (time.perf_counter() - started)
    _say(done=True, floor=figures)


def _await_cue(word: str) -> bool:
    """Whether the parent's next line on stdin is ``word`` (an end of input says stop)."""
    return sys.stdin.readline().strip() == word


def _query(spark: Any, config: dict[str, Any]) -> None:
    """Declare, warm up and run one query of ``config`` (see the module), cued by the parent."""
    global _SERVICE
    from barrierflow.actors import BatchFeed, add_sink
    from barrierflow.connectors import IcebergTable, open_local_catalog
    from barrierflow.operators import Stream
    from barrierflow.runtime import BlockingRuntime, Runtime, RuntimeConfig
    from barrierflow.spark_bridge import SparkBridge
    from barrierflow.spark_bridge.bridge import arrow_schema_of

    root = config["root"]
    frames = list(_frames(spark, config))
    schema = arrow_schema_of(frames[0][2])
    feed = BatchFeed(schema)
    rt = Runtime(RuntimeConfig(state_path=os.path.join(root, "state.db"), barrier_interval=3600.0))
    rt.add_source("events", feed.source)
    stream = Stream(rt, "events")
    if config["mode"] == "async":
        _SERVICE = (config["service"][0], config["service"][1])
        out = pa.schema([("key", pa.int64()), ("score", pa.int64())])
        stream = stream.async_map(score, schema=out, concurrency=config["concurrency"])
        expected = sum(stop - start for start, stop, _ in frames)
    elif config["chain"]:
        out = schema
        stream = stream.filter(KEEP).map_batches(double_value, schema=schema)
        expected = sum(kept(start, stop) for start, stop, _ in frames)
    else:
        out = schema
        expected = sum(stop - start for start, stop, _ in frames)
    catalog = open_local_catalog(os.path.join(root, "catalog"))
    table = IcebergTable(catalog, "bench.out", out)
    sink = add_sink(rt, "out", table, input=stream.name, parallelism=config["writers"])
    run_on = config["run_on"]
    with BlockingRuntime(rt, backend=config["backend"]) as handle:
        bridge = SparkBridge(handle, feed, sink=sink)
        bridge.deliver(frames[0][2], 0, run_on=run_on)
        warm = dataclasses.asdict(bridge.stats())
        _say(ready=True)
        if not _await_cue("go"):
            return
        started = time.perf_counter()
        epoch = None
        for batch_id, (_, _, frame) in enumerate(frames[1:], start=1):
            epoch = bridge.deliver(frame, batch_id, run_on=run_on)
        assert epoch is not None
        handle.call(sink.coordinator.wait_committed, epoch)
        seconds = time.perf_counter() - started
        # The query's own counters: the warm-up batch's taken off.
        stats = {k: v - warm[k] for k, v in dataclasses.asdict(bridge.stats()).items()}
        rows = sum(stop - start for start, stop, _ in frames[1:])
        _say(done=True, seconds=seconds, rows=rows, stats=stats)
    # The parent has read the tree's figures: the check is not measured.
    if not _await_cue("check"):
        return
    committed = int(table.table().current_snapshot().summary["total-records"])
    if committed != expected:
        raise AssertionError(f"the table has {committed} rows, expected {expected}")


def main(configs: list[dict[str, Any]]) -> None:
    """Run each query of ``configs`` in turn, in one driver (their master and conf alike)."""
    from barrierflow.spark_bridge import spark_session

    first = configs[0]
    if any((c["master"], c["conf"]) != (first["master"], first["conf"]) for c in configs):
        raise ValueError("the queries of one driver share its master and configuration")
    spark = spark_session("barrierflow-chain-bench", master=first["master"], conf=first["conf"])
    for config in configs:
        if config["mode"] == "floor":
            _floor(spark, config)
            _await_cue("check")
        else:
            _query(spark, config)
    spark.stop()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
