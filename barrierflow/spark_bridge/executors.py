"""Spark tasks as staging writers: a micro-batch written on the executors, committed by the
driver's coordinator.

:func:`stage_on_executors` runs one Spark job per micro-batch: ``mapInArrow`` over the
micro-batch's own partitions (no shuffle is added), each task staging its partition's rows as
Parquet files under its attempt's directory
(:meth:`~barrierflow.connectors.executor_staging.ExecutorStaging.stage_task`) and returning
only its :class:`~barrierflow.actors.sinks.table.Manifest` as JSON — a few hundred bytes per
partition reach the driver, never a row. Spark returns the result of exactly one successful
attempt per partition; the files of failed, retried and speculative attempts stay under their
own attempt directories and are deleted by the driver's adoption or the committer's recovery.

How the bridge puts it together, and the mapping of seed 000's rules onto partitions, is in
:mod:`barrierflow.spark_bridge.bridge` and :mod:`barrierflow.actors.sinks.committables`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from barrierflow._extras import require
from barrierflow.actors.sinks.table import Manifest
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.channels.vnode import VnodeBitmap, compute_vnodes, vnode_owners
from barrierflow.connectors.executor_staging import ExecutorStaging
from barrierflow.spark_bridge.errors import ExecutorImportError

__all__ = ["partition_by_vnode", "stage_on_executors"]

#: The column :func:`partition_by_vnode` partitions by (dropped before staging).
OWNER = "__barrierflow_owner"

#: What each task returns: its partition and its manifest (JSON).
RESULT_SCHEMA = "partition int, manifest string"

_MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")


def stage_partition(
    staging: ExecutorStaging, number: int, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """One Spark task: stage the partition's ``batches`` and yield its manifest (runs on an
    executor)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:  # pragma: no cover - only outside a task
        raise RuntimeError("stage_partition runs in a Spark task")
    partition = context.partitionId()
    manifest = staging.stage_task(number, partition, context.taskAttemptId(), batches)
    yield pa.record_batch(
        {
            "partition": pa.array([partition], pa.int32()),
            "manifest": pa.array([json.dumps(manifest.to_json())], pa.string()),
        }
    )


def partition_by_vnode(df: Any, key: Sequence[str], writers: int) -> Any:
    """``df`` repartitioned so that each of ``writers`` partitions holds whole vnode ranges,
    barrierflow's own (the hash dispatch's ``compute_vnodes``, run on the executors, and the
    ranges of ``VnodeBitmap.split(writers)``): every key's rows land in one partition, the one
    its writer actor would own. For a table that needs key ownership; every table of
    :mod:`barrierflow.connectors` is append-only, so the bridge never adds it (it is an extra
    Spark stage, a shuffle; ``spark_executors_iceberg_rows_per_s`` measures its cost).

    Raises:
        InvalidArgumentError: no key, or ``writers`` not an int >= 1.
    """
    keys = list(key)
    if not keys or not all(isinstance(k, str) for k in keys):
        raise InvalidArgumentError("key", "one or more column names", key)
    if type(writers) is not int or writers < 1:
        raise InvalidArgumentError("writers", "an int >= 1", writers)
    owners = vnode_owners(VnodeBitmap.split(writers))
    types = require("spark", "pyspark.sql.types")
    schema = types.StructType([*df.schema.fields, types.StructField(OWNER, types.IntegerType())])

    def owner(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            vnodes = compute_vnodes(batch, keys)
            yield batch.append_column(OWNER, pa.array(owners[vnodes], pa.int32()))

    owned = df.mapInArrow(owner, schema)
    return owned.repartition(writers, OWNER).drop(OWNER)


def stage_on_executors(
    df: Any, staging: ExecutorStaging, number: int
) -> tuple[int, list[Manifest]]:
    """Stage ``df`` on the executors under staging number ``number``; returns the number of
    partitions and one manifest per partition (of the attempt Spark kept).

    Raises:
        ExecutorImportError: an executor could not import a module staging needs.
    """

    def stage(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return stage_partition(staging, number, batches)

    tasks = df.mapInArrow(stage, RESULT_SCHEMA).rdd
    partitions: int = tasks.getNumPartitions()
    try:
        rows = tasks.collect()
    except Exception as exc:
        missing = _MISSING_MODULE.search(str(exc))
        if missing is None:
            raise
        error = ExecutorImportError(missing.group(1))
    else:
        return partitions, [Manifest.from_json(json.loads(row["manifest"])) for row in rows]
    raise error  # outside the except block: the Py4J wall is not chained on as the context
