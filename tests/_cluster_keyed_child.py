"""A driver of its own for the keyed executor fault tests (``test_executor_keyed_faults.py``):
a keyed aggregate run in Spark tasks (``run_on="executors"``) into a table, on a standalone
cluster or on a local master. The pipeline (:func:`declare_keyed`)::

    events (id, user, amount)                           (``_chain_service.events``)
      → filter user > 2                                 (a filter may precede the keyed step)
      → key_by user → aggregate total=sum(id), n=count(id), top=max(id)     ("totals")
      → changelog_rows (op: +I, -U, +U, -D)
      → map_batches "gate": one call per record batch to the test's service, rows unchanged
      → a table (Parquet, Delta or Iceberg) of :data:`KEYED`

The gate is the test's handle on a task mid-batch: it calls ``GET /users/<user>?id=<top>``
of ``_chain_service.ChainService`` with the first row of each record batch (its ``top`` is the
largest id of its user so far, so it tells the micro-batch), which can hold it while the test
kills something. It runs after the aggregate applied the partition and before the task's state
and files are staged.

Usage: ``python _cluster_keyed_child.py MASTER MODE WORK_DIR SERVICE_PORT TABLE BACKEND`` (the
arguments of ``_cluster_chain_child.py``), and from the environment:

* ``BARRIERFLOW_KEYED_PARALLELISM``: the sink's parallelism, so the Spark tasks and the vnode
  split (default 4);
* ``BARRIERFLOW_KEYED_BATCHES``: ``first,count`` — the static micro-batches to deliver
  (default ``0,3``);
* ``BARRIERFLOW_KEYED_KILL``: ``N`` — SIGKILL this driver's whole process group (the driver,
  its JVM, their Python workers) right after the N-th epoch's keyed state was committed and
  before its rows are (the point the commit's ordering argument is about; see
  :mod:`barrierflow.connectors.state_commit`);
* ``BARRIERFLOW_KEYED_SKIP``: ``N`` — commit the N-th epoch's rows without its state (a
  broken commit: the test that shows the exactly-once check catches it).

Modes are the chain child's: ``batches`` (static micro-batches, each commit waited for),
``speculate`` (the same with speculative execution on), ``stream`` (a streaming query over
the files in ``WORK_DIR/in``, one micro-batch per file, resumable from its checkpoints). The
table, the state store and Spark's checkpoint live under WORK_DIR; the application id is
written to ``WORK_DIR/app_id``. The last stdout line is one JSON object: the bridge's counters
and the epochs delivered.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, cast

import pyarrow as pa

ROWS, PARTITIONS, BATCHES = 400, 4, 3
#: How long a gate call may wait at the service (the test holds calls while it acts).
GO_SECONDS = float(os.environ.get("BARRIERFLOW_CHILD_GO_SECONDS", "120"))
#: The keyed step, as its state directory names it.
TOTALS = "totals"
#: The table's rows: the aggregate's changelog as plain rows.
KEYED = pa.schema(
    [
        pa.field("user", pa.int64(), nullable=False),
        pa.field("total", pa.int64()),
        pa.field("n", pa.int64(), nullable=False),
        pa.field("top", pa.int64()),
        pa.field("op", pa.string()),
    ]
)


def gate_fn(host: str, port: int) -> Callable[[pa.RecordBatch], pa.RecordBatch]:
    """The map_batches function: one blocking call per record batch to the service at
    ``host:port`` naming the batch's first row and the Spark task attempt; the batch as it
    came. A status other than 200 raises ``RuntimeError``. Its imports are inside the body:
    Spark ships this closure by value."""

    def gate(batch: pa.RecordBatch) -> pa.RecordBatch:
        import os
        import socket

        from pyspark import TaskContext

        if batch.num_rows == 0:
            return batch
        context = TaskContext.get()
        partition, attempt = (
            (-1, -1) if context is None else (context.partitionId(), context.attemptNumber())
        )
        user, top = batch["user"][0].as_py(), batch["top"][0].as_py()
        path = f"/users/{user}?id={top}&partition={partition}&attempt={attempt}&pid={os.getpid()}"
        request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n"
        with socket.create_connection((host, port), timeout=GO_SECONDS) as connection:
            connection.sendall(request.encode())
            response = b"".join(iter(lambda: connection.recv(65536), b""))
        status = int(response.split(b" ", 2)[1])
        if status != 200:
            raise RuntimeError(f"gate: HTTP {status}")
        return batch

    return gate


def declare_keyed(rt: Any, source: str, service: tuple[str, int]) -> str:
    """Declare the keyed pipeline reading ``source`` on ``rt`` (see the module); the name
    of its last step (the sink's input)."""
    from _chain_service import KEEP

    from barrierflow.operators import Stream

    stream = (
        Stream(rt, source)
        .filter(KEEP, name="keep")
        .key_by("user")
        .aggregate(name=TOTALS, total=("id", "sum"), n=("id", "count"), top=("id", "max"))
        .changelog_rows()
        .map_batches(gate_fn(*service), schema=KEYED, name="gate")
    )
    return stream.name


def make_keyed_table(kind: str, root: Path) -> Any:
    """The ``kind`` table of :data:`KEYED` under ``root`` (created, or opened if there), at
    the places ``_chain_service.table_root`` and ``read_rows`` know."""
    from barrierflow.connectors import (
        DeltaLakeTable,
        IcebergTable,
        ParquetTable,
        open_local_catalog,
    )

    if kind == "iceberg":
        return IcebergTable(open_local_catalog(root / "catalog"), "ns.events", KEYED)
    if kind == "delta":
        return DeltaLakeTable(root / "delta", KEYED, app_id="events")
    if kind == "parquet":
        return ParquetTable(root / "table", KEYED, row_group_rows=20)
    raise ValueError(f"unknown table kind {kind!r}")


def hook_state_commit(number: int, action: str) -> None:
    """At the ``number``-th epoch whose commit carries keyed state: ``"kill"`` — SIGKILL this
    process group right after that state was committed, before the table commits its rows;
    ``"skip"`` — commit its rows without its state (a broken commit, for the test that shows
    the check catches one).

    The committer calls the state commit by its module's name, so the test driver wraps that
    name: the one place the two halves of an epoch's commit are apart."""
    import barrierflow.connectors._file_table as file_table

    commit = file_table.commit_state  # type: ignore[attr-defined]
    seen = 0

    def hooked(epoch: int, records: Iterable[Mapping[str, Any]]) -> None:
        nonlocal seen
        records = list(records)
        seen += bool(records)
        if action == "skip" and seen == number and records:
            return
        commit(epoch, records)
        if action == "kill" and seen == number and records:
            os.killpg(0, signal.SIGKILL)

    file_table.commit_state = hooked  # type: ignore[attr-defined]


def main(master: str, mode: str, work_dir: str, port_text: str, kind: str, backend: str) -> None:
    import structlog
    from _chain_service import events_frame
    from _cluster_chain_child import SPECULATION, stream_frame

    from barrierflow.actors import BatchFeed, add_sink
    from barrierflow.runtime import BlockingRuntime, Runtime, RuntimeConfig
    from barrierflow.spark_bridge import SparkBridge, arrow_schema_of
    from barrierflow.spark_bridge.session import spark_session

    # Stdout's last line is the report: log lines (a warning at exit included) go to stderr.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    parallelism = int(os.environ.get("BARRIERFLOW_KEYED_PARALLELISM", str(PARTITIONS)))
    first, count = map(int, os.environ.get("BARRIERFLOW_KEYED_BATCHES", f"0,{BATCHES}").split(","))
    for action in ("kill", "skip"):
        if f"BARRIERFLOW_KEYED_{action.upper()}" in os.environ:
            hook_state_commit(int(os.environ[f"BARRIERFLOW_KEYED_{action.upper()}"]), action)
    conf = {"spark.driver.host": "127.0.0.1"}
    if master.startswith("spark://"):
        conf["spark.executor.memory"] = "512m"
    if mode == "speculate":
        conf |= SPECULATION
    spark = spark_session(f"barrierflow-keyed-{mode}", master=master, conf=conf)
    work = Path(work_dir)
    (work / "app_id").write_text(spark.sparkContext.applicationId)
    frame = stream_frame(spark, work) if mode == "stream" else events_frame(spark, 0, 1, 1)
    feed = BatchFeed(arrow_schema_of(frame))
    config = RuntimeConfig(state_path=work / "state.db", barrier_interval=3600.0, recovery=True)
    rt = Runtime(config)
    rt.add_source("events", feed.source)
    last = declare_keyed(rt, "events", ("127.0.0.1", int(port_text)))
    sink = add_sink(rt, "out", make_keyed_table(kind, work), input=last, parallelism=parallelism)
    epochs: list[int] = []
    with BlockingRuntime(rt, backend=cast(Literal["asyncio", "trio"], backend)) as handle:
        bridge = SparkBridge(handle, feed, stream="q", sink=sink)
        if mode == "stream":
            query = bridge.start(frame, str(work / "ck"), available_now=True, run_on="executors")
            bridge.await_termination(query)
        else:
            for batch in range(first, first + count):
                micro = events_frame(spark, batch * ROWS, ROWS, PARTITIONS)
                epoch = bridge.deliver(micro, batch, run_on="executors")
                assert epoch is not None
                handle.call(sink.coordinator.wait_committed, epoch)
                epochs.append(epoch)
        stats = bridge.stats()
    print(
        json.dumps(
            {
                "batches": stats.batches,
                "staged_batches": stats.staged_batches,
                "executor_tasks": stats.executor_tasks,
                "to_arrow_seconds": stats.to_arrow_seconds,
                "epochs": epochs,
                "pid": os.getpid(),
            }
        ),
        flush=True,
    )
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:7])
