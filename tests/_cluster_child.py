"""A Spark driver in a process of its own, against a standalone cluster
(``test_spark_cluster.py``): the test process already holds a local SparkContext, and a
process can hold only one.

Usage: ``python _cluster_child.py MASTER_URL count|slow SYNC_DIR PORT``. Prints one JSON
object on its last stdout line: the driver's pid, the application id and one row per
partition.

* ``count``: 1000 rows in 4 partitions; each task imports barrierflow and pyarrow and
  reports its pid, its partition, its row count and the pids of its ancestor processes.
* ``slow``: the same, but each task first arrives at the test's rendezvous on PORT
  (:mod:`barrierflow.testing.rendezvous`, tag ``<partition>-<attempt>``) and waits for its
  cue; the driver writes the application id to ``SYNC_DIR/app_id`` first.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROWS = 1000
PARTITIONS = 4
#: How long a slow task waits for the go file before it gives up (a hang guard only).
GO_SECONDS = float(os.environ.get("BARRIERFLOW_CHILD_GO_SECONDS", "120"))


def _ancestors() -> list[int]:
    """This process's ancestors' pids, parent first (Linux ``/proc``)."""
    chain: list[int] = []
    pid = os.getppid()
    while pid > 1 and pid not in chain:
        chain.append(pid)
        stat = Path(f"/proc/{pid}/stat").read_text()
        pid = int(stat.rsplit(")", 1)[-1].split()[1])
    return chain


def main(master: str, mode: str, sync_dir: str, port_text: str) -> None:
    from barrierflow.spark_bridge.session import spark_session

    spark = spark_session(
        f"barrierflow-cluster-{mode}",
        master=master,
        conf={"spark.driver.host": "127.0.0.1", "spark.executor.memory": "512m"},
    )
    app_id = spark.sparkContext.applicationId
    sync = Path(sync_dir)
    if mode == "slow":
        (sync / "app_id.tmp").write_text(app_id)
        (sync / "app_id.tmp").rename(sync / "app_id")
    slow = mode == "slow"
    go_seconds = GO_SECONDS
    port = int(port_text)

    def task(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark import TaskContext

        import barrierflow  # the point: the executors' Python workers can import it
        from barrierflow.testing.rendezvous import arrive

        assert barrierflow.__name__ == "barrierflow"
        context = TaskContext.get()
        assert context is not None
        partition, attempt = context.partitionId(), context.attemptNumber()
        if slow and not arrive(port, f"{partition}-{attempt}", go_seconds):
            raise TimeoutError(f"no cue from the test within {go_seconds} s")
        rows = total = 0
        for batch in batches:
            rows += batch.num_rows
            total += sum(batch.column(0).to_pylist())
        yield pa.RecordBatch.from_pylist(
            [
                {
                    "partition": partition,
                    "attempt": attempt,
                    "pid": os.getpid(),
                    "rows": rows,
                    "total": total,
                    "ancestors": ",".join(map(str, _ancestors())),
                }
            ]
        )

    schema = "partition long, attempt long, pid long, rows long, total long, ancestors string"
    result = spark.range(ROWS, numPartitions=PARTITIONS).mapInArrow(task, schema).collect()
    print(
        json.dumps(
            {
                "driver_pid": os.getpid(),
                "app_id": app_id,
                "rows": [row.asDict() for row in result],
            }
        ),
        flush=True,
    )
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:5])
