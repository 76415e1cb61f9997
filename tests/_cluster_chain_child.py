"""A driver of its own for the executor-chain fault tests (``test_executor_chain_faults.py``):
the chain of ``_chain_service.py`` (filter → async_map calling the test's service →
map_batches) run in Spark tasks (``run_on="executors"``) into a table, on a standalone cluster
or on a local master.

Usage: ``python _cluster_chain_child.py MASTER MODE WORK_DIR SERVICE_PORT TABLE BACKEND``,
where TABLE is ``iceberg``, ``delta`` or ``parquet`` and BACKEND the driver's (and so the
tasks') anyio backend. The table, the state store and Spark's checkpoint live under WORK_DIR;
the application id is written to ``WORK_DIR/app_id`` once Spark is up. The last stdout line is
one JSON object: the bridge's counters.

* ``batches``: delivers static micro-batches 0..2 of :data:`ROWS` events each (ids
  ``ROWS*b ..``, :data:`PARTITIONS` partitions) and waits for each commit. The test's service
  decides what happens mid-chain (it holds calls while the test kills an executor).
* ``speculate``: the same with speculative execution on (the service holds the original
  attempt of a partition, so that only its speculative copy can finish it).
* ``stream``: a streaming query over the Parquet files in ``WORK_DIR/in`` (one micro-batch per
  file, ``availableNow``), resumable: run again after the driver was killed, it continues from
  its checkpoints.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Literal, cast

ROWS, PARTITIONS, BATCHES = 400, 4, 3
#: How long a call may wait at the service (the test holds calls while it acts).
GO_SECONDS = float(os.environ.get("BARRIERFLOW_CHILD_GO_SECONDS", "120"))
SPECULATION = {
    "spark.speculation": "true",
    "spark.speculation.interval": "100ms",
    "spark.speculation.multiplier": "1.5",
    "spark.speculation.quantile": "0.5",
    "spark.speculation.minTaskRuntime": "100ms",
}


def main(master: str, mode: str, work_dir: str, port_text: str, kind: str, backend: str) -> None:
    from _chain_service import declare_chain, events_frame, make_table

    from barrierflow.actors import BatchFeed, add_sink
    from barrierflow.runtime import BlockingRuntime, Runtime, RuntimeConfig
    from barrierflow.spark_bridge import SparkBridge, arrow_schema_of
    from barrierflow.spark_bridge.session import spark_session

    conf = {"spark.driver.host": "127.0.0.1"}
    if master.startswith("spark://"):
        conf["spark.executor.memory"] = "512m"
    if mode == "speculate":
        conf |= SPECULATION
    spark = spark_session(f"barrierflow-chain-{mode}", master=master, conf=conf)
    work = Path(work_dir)
    (work / "app_id").write_text(spark.sparkContext.applicationId)
    frame = stream_frame(spark, work) if mode == "stream" else events_frame(spark, 0, 1, 1)
    feed = BatchFeed(arrow_schema_of(frame))
    config = RuntimeConfig(state_path=work / "state.db", barrier_interval=3600.0, recovery=True)
    rt = Runtime(config)
    rt.add_source("events", feed.source)
    last = declare_chain(rt, "events", ("127.0.0.1", int(port_text)), timeout=GO_SECONDS)
    table = make_table(kind, work, row_group_rows=20 if kind == "parquet" else None)
    sink = add_sink(rt, "out", table, input=last, parallelism=PARTITIONS)
    with BlockingRuntime(rt, backend=cast(Literal["asyncio", "trio"], backend)) as handle:
        bridge = SparkBridge(handle, feed, stream="q", sink=sink)
        if mode == "stream":
            query = bridge.start(frame, str(work / "ck"), available_now=True, run_on="executors")
            bridge.await_termination(query)
        else:
            for batch in range(BATCHES):
                micro = events_frame(spark, batch * ROWS, ROWS, PARTITIONS)
                epoch = bridge.deliver(micro, batch, run_on="executors")
                assert epoch is not None
                handle.call(sink.coordinator.wait_committed, epoch)
        stats = bridge.stats()
    print(
        json.dumps(
            {
                "batches": stats.batches,
                "staged_batches": stats.staged_batches,
                "rows": stats.rows,
                "to_arrow_seconds": stats.to_arrow_seconds,
                "executor_tasks": stats.executor_tasks,
                "pid": os.getpid(),
            }
        ),
        flush=True,
    )
    spark.stop()


def stream_frame(spark: Any, work: Path) -> Any:
    """The streaming DataFrame of the event files in ``work/in``, one per micro-batch."""
    return (
        spark.readStream.schema("id bigint, user bigint, amount double")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(work / "in"))
    )


if __name__ == "__main__":
    main(*sys.argv[1:7])
