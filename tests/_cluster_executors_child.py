"""A barrierflow pipeline whose Spark tasks stage the rows on a standalone cluster's executors
(``test_spark_cluster.py``), in a driver process of its own.

Usage: ``python _cluster_executors_child.py MASTER_URL kill|speculate WORK_DIR PORT``. Delivers
micro-batches 0..2 of 400 rows each (ids ``400*b .. 400*b+399``, 4 partitions) with
``write_on="executors"`` into a Parquet table under WORK_DIR, then prints one JSON object on
its last stdout line: the bridge's counters and the application id.

* ``kill``: batch 1's first task attempts, once they have passed on their first rows (the
  staging tasks are writing), arrive at the test's rendezvous on PORT
  (:mod:`barrierflow.testing.rendezvous`, tag ``<partition>-<attempt>``) and wait for its cue:
  the test SIGKILLs an executor JVM meanwhile, and Spark runs its tasks again.
* ``speculate``: speculative execution on; batch 0's first attempt of partition 1 arrives
  after its first rows and waits (until the test closes the rendezvous), so that Spark runs a
  speculative copy of it on the other executor, whose result it keeps.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

ROWS, PARTITIONS, BATCHES = 400, 4, 3
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False)])
GO_SECONDS = float(os.environ.get("BARRIERFLOW_CHILD_GO_SECONDS", "120"))


def main(master: str, mode: str, work: str, port_text: str) -> None:
    from barrierflow.actors import BatchFeed, add_sink
    from barrierflow.connectors import ParquetTable
    from barrierflow.runtime import BlockingRuntime, Runtime, RuntimeConfig
    from barrierflow.spark_bridge import SparkBridge
    from barrierflow.spark_bridge.session import spark_session

    conf = {"spark.driver.host": "127.0.0.1", "spark.executor.memory": "512m"}
    if mode == "speculate":
        conf |= {
            "spark.speculation": "true",
            "spark.speculation.interval": "100ms",
            "spark.speculation.multiplier": "1.5",
            "spark.speculation.quantile": "0.5",
            "spark.speculation.minTaskRuntime": "100ms",
        }
    spark = spark_session(f"barrierflow-cluster-executors-{mode}", master=master, conf=conf)
    sync = Path(work)
    port = int(port_text)
    slow_batch = 1 if mode == "kill" else 0

    def gate_for(batch: int) -> Any:
        def gate(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            from pyspark import TaskContext

            from barrierflow.testing.rendezvous import arrive

            context = TaskContext.get()
            assert context is not None
            partition, attempt = context.partitionId(), context.attemptNumber()
            waits = batch == slow_batch and attempt == 0
            if mode == "speculate":
                waits = waits and partition == 1
            for piece in batches:
                yield piece
                if waits:
                    waits = False
                    arrive(port, f"{partition}-{attempt}", GO_SECONDS)

        return gate

    feed = BatchFeed(SCHEMA)
    rt = Runtime(RuntimeConfig(state_path=sync / "state.db", barrier_interval=3600.0))
    rt.add_source("events", feed.source)
    table = ParquetTable(sync / "table", SCHEMA, row_group_rows=20)
    sink = add_sink(rt, "out", table, input="events", parallelism=2, key=("id",))
    with BlockingRuntime(rt) as handle:
        bridge = SparkBridge(handle, feed, sink=sink)
        for batch in range(BATCHES):
            frame = spark.range(batch * ROWS, (batch + 1) * ROWS, numPartitions=PARTITIONS)
            gated = frame.mapInArrow(gate_for(batch), frame.schema)
            epoch = bridge.deliver(gated, batch, write_on="executors")
            assert epoch is not None
            handle.call(sink.coordinator.wait_committed, epoch)
        stats = bridge.stats()
    print(
        json.dumps(
            {
                "app_id": spark.sparkContext.applicationId,
                "batches": stats.batches,
                "staged_batches": stats.staged_batches,
                "rows": stats.rows,
                "to_arrow_seconds": stats.to_arrow_seconds,
            }
        ),
        flush=True,
    )
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:5])
