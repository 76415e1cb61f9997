"""One fresh Spark driver for :mod:`benchmarks.spark_keyed`: the process whose tree (this Python
process and the JVM it starts) the parent measures, with the cues of
:mod:`benchmarks._driver_tree_child` (``ready``, ``go``, ``done``, ``check``).

Usage: ``python _keyed_driver_child.py CONFIGS_JSON`` (a list of query configurations, run in
turn in this one driver). Per query the driver declares ``key_by("k") -> aggregate(total=sum,
n=count, top=max) -> changelog_rows() -> an Iceberg table`` (``writers`` writers), delivers one
small warm-up micro-batch, says ``ready`` and waits for ``go``; then it delivers ``batches``
micro-batches of ``rows`` rows on ``run_on`` and waits for the last epoch's commit, and says
``done`` with the rows, the seconds and, in ``stats``, the bridge's counters and, on the
executor path, each Spark job's seconds and each task's report
(:class:`~barrierflow.spark_bridge.task_runtime.TaskReport`: its seconds, and its seconds
loading and staging its keyed state).

The micro-batches are made by Spark on the executors (``spark.range`` in ``partitions``
partitions, never cached): ``k = pmod(xxhash64(id), keys)`` (uniform over ``keys`` keys) and
``v = pmod(xxhash64(id, 'v'), 1000)``, both int64.

The bridge sums the tasks' seconds but not their state seconds
(:class:`~barrierflow.spark_bridge.bridge.BridgeStats`), so this driver keeps the reports
itself: it wraps the bridge module's ``stage_on_executors`` (this process only — a benchmark's
instrument) and also times each Spark job that way.

With ``"mode": "floor"`` there is no runtime: Spark alone over the same micro-batches, a
``mapInArrow`` counting rows in the Python tasks, with and without the vnode repartition
(``BENCH {"done": ..., "floor": ...}``), for the time breakdown.

On ``check`` (unmeasured) the committed changelog is checked against Spark's own aggregate of
every micro-batch: each ``+I``/``+U`` row counts for and each ``-U``/``-D`` row against, so the
signed sums of ``n`` and ``total`` must equal the rows and the sum of ``v``, and the signed
count of ``+I``/``-D`` rows the distinct keys — nothing lost, nothing twice.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from benchmarks._driver_tree_child import WARM_ROWS_PER_PARTITION, _await_cue, _say

#: The changelog column and its ops, by sign: a row's figures count for (+1) or against (-1).
OP = "op"
SIGNS = {"+I": 1, "+U": 1, "-U": -1, "-D": -1}


def _frames(spark: Any, config: dict[str, Any]) -> Iterator[Any]:
    """The micro-batches: the warm-up one, then the timed ones (see the module)."""
    keys, partitions = config["keys"], config["partitions"]
    start = 0
    for rows in [WARM_ROWS_PER_PARTITION * partitions] + [config["rows"]] * config["batches"]:
        yield spark.range(start, start + rows, numPartitions=partitions).selectExpr(
            f"pmod(xxhash64(id), {keys}) AS k", "pmod(xxhash64(id, 'v'), 1000) AS v"
        )
        start += rows


class _Reports:
    """The task reports and Spark job seconds of each ``stage_on_executors`` call."""

    def __init__(self) -> None:
        self.jobs: list[tuple[float, list[Any]]] = []

    def install(self) -> None:
        from barrierflow.spark_bridge import bridge
        from barrierflow.spark_bridge.executors import stage_on_executors as stage

        def recording(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            result = stage(*args, **kwargs)
            self.jobs.append((time.perf_counter() - started, list(result[2])))
            return result

        # The name the bridge calls (imported into its module), replaced in this process only.
        bridge.stage_on_executors = recording  # type: ignore[attr-defined]

    def since(self, first: int) -> dict[str, Any]:
        """The jobs from the ``first``-th on: each job's seconds, and per task ``[batch, rows,
        seconds, state seconds, state rows read]``."""
        jobs = self.jobs[first:]
        return {
            "job_seconds": [seconds for seconds, _ in jobs],
            "tasks": [
                [i, r.rows, r.seconds, r.state_seconds, r.state_rows_read]
                for i, (_, reports) in enumerate(jobs)
                for r in reports
            ],
        }


def _floor(spark: Any, config: dict[str, Any]) -> None:
    """Spark alone over the same micro-batches, for the time breakdown: rows/s of a
    ``mapInArrow`` counting the rows in the Python tasks, over the batches as made
    (``spark_python_tasks``) and after the vnode repartition the executor path adds
    (``vnode_repartition``)."""
    from barrierflow.spark_bridge.executors import partition_by_vnode

    def count(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        rows = sum(batch.num_rows for batch in batches)
        yield pa.record_batch({"rows": pa.array([rows], pa.int64())})

    def counted(frame: Any) -> int:
        return sum(int(row["rows"]) for row in frame.mapInArrow(count, "rows long").collect())

    def repartitioned(frame: Any) -> Any:
        return partition_by_vnode(frame, ["k"], config["writers"])

    frames = list(_frames(spark, config))
    counted(frames[0]), counted(repartitioned(frames[0]))  # warm-up: the Python workers
    _say(ready=True)
    if not _await_cue("go"):
        return
    figures: dict[str, float] = {}
    started = time.perf_counter()
    for name, shape in (("spark_python_tasks", _same), ("vnode_repartition", repartitioned)):
        begun = time.perf_counter()
        rows = sum(counted(shape(frame)) for frame in frames[1:])
        figures[name] = rows / (time.perf_counter() - begun)
    seconds = time.perf_counter() - started
    _say(done=True, seconds=seconds, rows=2 * config["rows"] * config["batches"], floor=figures)


def _same(frame: Any) -> Any:
    return frame


def _out_schema(feed: pa.Schema) -> pa.Schema:
    """The changelog rows' schema: the key as the feed has it, the three aggregates, the op."""
    return pa.schema(
        [
            feed.field("k"),
            pa.field("total", pa.int64()),
            pa.field("n", pa.int64(), nullable=False),
            pa.field("top", pa.int64()),
            pa.field(OP, pa.string()),
        ]
    )


def _check(spark: Any, frames: list[Any], committed: pa.Table) -> None:
    """The committed changelog against Spark's aggregate of every micro-batch (see the
    module)."""
    from functools import reduce

    everything = reduce(lambda a, b: a.unionAll(b), frames)
    row = everything.selectExpr(
        "count(*) AS n", "sum(v) AS total", "count(DISTINCT k) AS keys"
    ).collect()[0]
    ops = committed.column(OP)
    sign = pc.subtract(
        pc.cast(pc.is_in(ops, pa.array(["+I", "+U"])), pa.int64()),
        pc.cast(pc.is_in(ops, pa.array(["-U", "-D"])), pa.int64()),
    )
    keys = (
        pc.sum(pc.cast(pc.equal(ops, "+I"), pa.int64())).as_py()
        - pc.sum(pc.cast(pc.equal(ops, "-D"), pa.int64())).as_py()
    )
    got = {
        "n": pc.sum(pc.multiply(committed.column("n"), sign)).as_py(),
        "total": pc.sum(pc.multiply(committed.column("total"), sign)).as_py(),
        "keys": keys,
    }
    want = {"n": row["n"], "total": row["total"], "keys": row["keys"]}
    if got != want:
        raise AssertionError(f"the committed changelog sums to {got}, expected {want}")


def _query(spark: Any, config: dict[str, Any], reports: _Reports) -> None:
    """Declare, warm up and run one query of ``config`` (see the module), cued by the parent."""
    from barrierflow.actors import BatchFeed, add_sink
    from barrierflow.connectors import IcebergTable, open_local_catalog
    from barrierflow.operators import Stream
    from barrierflow.runtime import BlockingRuntime, Runtime, RuntimeConfig
    from barrierflow.spark_bridge import SparkBridge
    from barrierflow.spark_bridge.bridge import arrow_schema_of

    root = config["root"]
    frames = list(_frames(spark, config))
    schema = arrow_schema_of(frames[0])
    feed = BatchFeed(schema)
    rt = Runtime(RuntimeConfig(state_path=os.path.join(root, "state.db"), barrier_interval=3600.0))
    rt.add_source("events", feed.source)
    stream = (
        Stream(rt, "events")
        .key_by("k")
        .aggregate(total=("v", "sum"), n=("v", "count"), top=("v", "max"))
        .changelog_rows(OP)
    )
    catalog = open_local_catalog(os.path.join(root, "catalog"))
    table = IcebergTable(catalog, "bench.out", _out_schema(schema))
    sink = add_sink(rt, "out", table, input=stream.name, parallelism=config["writers"])
    run_on = config["run_on"]
    with BlockingRuntime(rt, backend=config["backend"]) as handle:
        bridge = SparkBridge(handle, feed, sink=sink)
        bridge.deliver(frames[0], 0, run_on=run_on)
        warm = dataclasses.asdict(bridge.stats())
        first_job = len(reports.jobs)
        _say(ready=True)
        if not _await_cue("go"):
            return
        started = time.perf_counter()
        epoch = None
        for batch_id, frame in enumerate(frames[1:], start=1):
            epoch = bridge.deliver(frame, batch_id, run_on=run_on)
        assert epoch is not None
        handle.call(sink.coordinator.wait_committed, epoch)
        seconds = time.perf_counter() - started
        # The query's own counters: the warm-up batch's taken off; the jobs' reports.
        stats = {k: v - warm[k] for k, v in dataclasses.asdict(bridge.stats()).items()}
        stats.update(reports.since(first_job))
        rows = config["rows"] * config["batches"]
        _say(done=True, seconds=seconds, rows=rows, stats=stats)
    # The parent has read the tree's figures: the check is not measured.
    if not _await_cue("check"):
        return
    _check(spark, frames, table.table().scan().to_arrow())


def main(configs: list[dict[str, Any]]) -> None:
    """Run each query of ``configs`` in turn, in one driver (their master and conf alike)."""
    from barrierflow.spark_bridge import spark_session

    first = configs[0]
    if any((c["master"], c["conf"]) != (first["master"], first["conf"]) for c in configs):
        raise ValueError("the queries of one driver share its master and configuration")
    spark = spark_session("barrierflow-keyed-bench", master=first["master"], conf=first["conf"])
    reports = _Reports()
    reports.install()
    for config in configs:
        if config["mode"] == "floor":
            _floor(spark, config)
            _await_cue("check")
        else:
            _query(spark, config, reports)
    spark.stop()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
