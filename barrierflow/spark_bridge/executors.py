"""Spark tasks as the graph's hands: a micro-batch run and written on the executors,
committed by the driver's coordinator.

:func:`stage_on_executors` runs one Spark job per micro-batch. It is a ``mapInArrow`` over the
micro-batch's own partitions, where each task runs the chain of the graph's partition-local
actors over its partition (:mod:`barrierflow.spark_bridge.task_runtime`), or writes the rows
as they are when there is no chain. The task stages what comes out under its attempt's own
directory and returns only its manifest and counters as JSON. A few hundred bytes per partition
reach the driver, never a row. Spark returns the result of exactly one successful attempt per
partition. The files of failed, retried and speculative attempts stay under their own attempt
directories, and the driver's adoption or the committer's recovery deletes them.

**How many tasks.** Given a sink's declared ``parallelism`` *N*, the micro-batch is coalesced
to *N* partitions when it has more (no shuffle), or repartitioned to *N* when it has fewer
(round robin, a shuffle; Spark sorts before a round-robin repartition, so that a retried task
gets the same rows). Either way the batch makes exactly *N* file sets, one per declared writer.
Without a declared parallelism there is one task, and one file set, per partition, as Spark
made them.

**Failures.** A failed attempt records why under the staging area
(:func:`~barrierflow.connectors.executor_staging.failures_directory`) and fails its task, and
Spark runs the task again. After the job the driver logs each recorded attempt once, with its
partition, attempt, actor and cause. If Spark gives up on a task, the job's error carries the
last attempt's failure, which becomes
:class:`~barrierflow.errors.ExecutorChainFailedError` in one line, with the actor's own error
attached. A module the executors cannot import becomes
:class:`~barrierflow.errors.ExecutorImportError`. :func:`probe_chain` builds every actor of
the chain once on an executor before the query starts, so that both surface then and not in
the first micro-batch.

How the bridge puts it together, and the mapping of seed 000's rules onto partitions, is in
:mod:`barrierflow.spark_bridge.bridge` and :mod:`barrierflow.actors.sinks.committables`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import structlog

from barrierflow._extras import require
from barrierflow.actors.sinks.table import Manifest
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.channels.vnode import VnodeBitmap, compute_vnodes, vnode_owners
from barrierflow.connectors.executor_staging import failures_directory
from barrierflow.spark_bridge.errors import ExecutorChainFailedError, ExecutorImportError
from barrierflow.spark_bridge.task_runtime import (
    TaskChain,
    TaskFailedError,
    TaskFailure,
    TaskReport,
    failure_of,
    run_partition,
)
from barrierflow.spark_bridge.task_state import compact_state, drop_staged_state

__all__ = ["compact_on_executors", "partition_by_vnode", "probe_chain", "stage_on_executors"]

#: The column :func:`partition_by_vnode` partitions by (dropped before staging).
OWNER = "__barrierflow_owner"

#: What each task returns: its partition, its manifest and its report (JSON).
RESULT_SCHEMA = "partition int, manifest string, report string"

_MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")
#: A failed task's :class:`TaskFailure` in Spark's error text (one line of JSON).
_FAILURE = re.compile(re.escape(TaskFailedError.MARK) + r"(\{.*?\})\s*$", re.MULTILINE)

_log = structlog.get_logger("barrierflow.spark_bridge")


def stage_partition(
    chain: TaskChain, number: int, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """One Spark task: run ``chain`` over the partition's ``batches``, stage the result and
    yield the manifest and report (runs on an executor)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:  # pragma: no cover - only outside a task
        raise RuntimeError("stage_partition runs in a Spark task")
    partition = context.partitionId()
    task, attempt = context.taskAttemptId(), context.attemptNumber()
    manifest, report = run_partition(chain, number, partition, task, attempt, batches)
    yield pa.record_batch(
        {
            "partition": pa.array([partition], pa.int32()),
            "manifest": pa.array([json.dumps(manifest.to_json())], pa.string()),
            "report": pa.array([json.dumps(report.to_json())], pa.string()),
        }
    )


def partition_by_vnode(df: Any, key: Sequence[str], writers: int) -> Any:
    """``df`` repartitioned so that partition *p* of ``writers`` holds exactly the rows whose
    vnode, barrierflow's own (the hash dispatch's ``compute_vnodes``, run on the executors),
    is in ``VnodeBitmap.split(writers)[p]``: every key's rows land in one partition, the one
    whose task owns the key's state (or whose writer actor would own it). A Spark stage of its
    own, a shuffle (``spark_executors_iceberg_rows_per_s`` measures its cost); the bridge adds
    it before a keyed step.

    Raises:
        InvalidArgumentError: no key, or ``writers`` not an int >= 1.
    """
    keys = list(key)
    if not keys or not all(isinstance(k, str) for k in keys):
        raise InvalidArgumentError("key", "one or more column names", key)
    if type(writers) is not int or writers < 1:
        raise InvalidArgumentError("writers", "an int >= 1", writers)
    # Spark sends a row to partition pmod(hash(column), n): each range is labelled with an
    # int that Spark's own hash sends to the range's partition.
    labels = _partition_labels(df.sparkSession, writers)[vnode_owners(VnodeBitmap.split(writers))]
    types = require("spark", "pyspark.sql.types")
    schema = types.StructType([*df.schema.fields, types.StructField(OWNER, types.IntegerType())])

    def owner(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            vnodes = compute_vnodes(batch, keys)
            yield batch.append_column(OWNER, pa.array(labels[vnodes], pa.int32()))

    owned = df.mapInArrow(owner, schema)
    return owned.repartition(writers, OWNER).drop(OWNER)


#: Labels found per partition count (Spark's hash never changes within a version).
_LABELS: dict[int, npt.NDArray[np.int32]] = {}


def _partition_labels(spark: Any, partitions: int) -> npt.NDArray[np.int32]:
    """For each partition *p* of ``partitions``, an int that Spark's hash partitioning sends
    to *p* (``pmod(hash(x), partitions) == p``, asked of Spark once per count).

    Raises:
        RuntimeError: Spark's hash left a partition without a label among the ints tried
            (never seen: each is missed with probability about e**-64).
    """
    found = _LABELS.get(partitions)
    if found is None:
        tried = 64 * partitions
        rows = (
            spark.range(0, tried, numPartitions=1)
            .selectExpr("cast(id as int) as x", f"pmod(hash(cast(id as int)), {partitions}) as p")
            .toArrow()
        )
        xs = rows.column("x").to_numpy()
        ps = rows.column("p").to_numpy()
        found = np.full(partitions, -1, np.int32)
        # The first int of each partition: assign in reverse so the smallest wins.
        found[ps[::-1]] = xs[::-1]
        if (found < 0).any():
            raise RuntimeError(f"no int among {tried} hashes to each of {partitions} partitions")
        _LABELS[partitions] = found
    return found


def _with_tasks(df: Any, tasks: int | None) -> Any:
    """``df`` with exactly ``tasks`` partitions (coalesced or repartitioned; see the
    module), or as it is for ``None``."""
    if tasks is None:
        return df
    partitions = df.rdd.getNumPartitions()
    if partitions > tasks:
        return df.coalesce(tasks)
    if partitions < tasks:
        return df.repartition(tasks)
    return df


def stage_on_executors(
    df: Any, chain: TaskChain, number: int, tasks: int | None = None
) -> tuple[int, list[Manifest], list[TaskReport]]:
    """Run ``chain`` over ``df`` on the executors and stage the result under staging number
    ``number``, in ``tasks`` tasks (``None``: one per partition); returns the number of
    partitions, one manifest per partition (of the attempt Spark kept) and the tasks'
    reports. Each failed attempt is logged once.

    Raises:
        ExecutorImportError: an executor could not import a module the chain needs.
        ExecutorChainFailedError: a task failed in every attempt Spark made.
    """

    failures = failures_directory(chain.writes.root, number)
    try:  # Spark may run Python while it plans, too: every call is inside
        keyed = chain.keyed
        if keyed is None:
            df = _with_tasks(df, tasks)
        else:
            # Task p gets the rows of the vnodes of split(N)[p], the ones its state is of.
            count = tasks if tasks is not None else df.rdd.getNumPartitions()
            chain = replace(chain, keyed=replace(keyed, tasks=count))
            df = partition_by_vnode(df, keyed.key, count)
        staged = chain

        def stage(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            return stage_partition(staged, number, batches)

        runs = df.mapInArrow(stage, RESULT_SCHEMA).rdd
        partitions: int = runs.getNumPartitions()
        rows = runs.collect()
    except Exception as exc:
        recorded = _log_failures(failures)
        _drop_attempts(chain, number)
        error = _job_error(str(exc), recorded)
        if error is None:
            raise
    else:
        _log_failures(failures)
        manifests = [Manifest.from_json(json.loads(row["manifest"])) for row in rows]
        reports = [TaskReport.from_json(json.loads(row["report"])) for row in rows]
        return partitions, manifests, reports
    raise error  # outside the except block: the Py4J wall is not chained on as the context


def compact_on_executors(spark: Any, root: str) -> list[str]:
    """Compact the keyed state stores under ``root`` in one Spark task
    (:func:`~barrierflow.spark_bridge.task_state.compact_state`), so that folding the state,
    which reads and rewrites all of it, takes an executor's time and not the driver's;
    returns the tables compacted.

    Raises:
        Exception: the Spark job failed (the caller logs it; the next micro-batch tries
            again).
    """

    def compact(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in batches:
            pass
        done = compact_state(root)
        yield pa.record_batch({"table": pa.array(done, pa.string())})

    rows = spark.range(1, numPartitions=1).mapInArrow(compact, "table string").collect()
    return [str(row["table"]) for row in rows]


def probe_chain(spark: Any, chain: TaskChain) -> None:
    """Build every actor of ``chain`` once in a Spark task, before the query starts: a module
    the executors cannot import, or a factory that fails, surfaces now.

    Raises:
        ExecutorImportError: an executor could not import a module the chain needs.
        ExecutorChainFailedError: a factory raised on the executor.
    """
    if not chain.steps:
        return

    def build(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in batches:
            pass
        for step in chain.steps:
            try:
                step.factory()
            except Exception as exc:
                failure = failure_of(exc, 0, 0, chain.sink)
                raise TaskFailedError(replace(failure, actor=step.name)) from None
        yield pa.record_batch({"ok": pa.array([1], pa.int32())})

    try:
        spark.range(1, numPartitions=1).mapInArrow(build, "ok int").collect()
    except Exception as exc:
        error = _job_error(str(exc), [])
        if error is None:
            raise
    else:
        return
    raise error


def _drop_attempts(chain: TaskChain, number: int) -> None:
    """Drop what every attempt of a failed job staged under ``number`` (adopting none of
    them); a failure to is logged, and the committer's recovery drops it later."""
    try:
        chain.writes.adopt(number, [])
        if chain.keyed is not None:
            drop_staged_state(chain.keyed, number)
    except Exception as exc:
        _log.warning(
            "staged attempts of a failed Spark job not dropped",
            staging=number,
            cause=f"{type(exc).__name__}: {exc}",
        )


def _log_failures(directory: Path) -> list[TaskFailure]:
    """Log each failed attempt recorded in ``directory`` once (it is deleted with the task
    directories); returns them."""
    failures: list[TaskFailure] = []
    if directory.is_dir():
        for path in sorted(directory.glob("*.json")):
            try:
                failures.append(TaskFailure.from_json(path.read_text()))
            except (OSError, ValueError, KeyError):
                continue
    for failure in failures:
        _log.warning(
            "executor task attempt failed",
            partition=failure.partition,
            attempt=failure.attempt,
            actor=failure.actor,
            cause=failure.cause_line,
        )
    return failures


def _job_error(text: str, recorded: Sequence[TaskFailure]) -> Exception | None:
    """The typed error behind a failed Spark job's ``text`` (``None``: none of ours)."""
    missing = _MISSING_MODULE.search(text)
    if missing is not None:
        return ExecutorImportError(missing.group(1))
    found = _FAILURE.search(text)
    if found is None:
        return None
    try:
        failure = TaskFailure.from_json(found.group(1))
    except (ValueError, KeyError):
        return None
    attempts = max(1, sum(1 for f in recorded if f.partition == failure.partition))
    cause = failure.error()
    error = ExecutorChainFailedError(
        failure.actor, failure.partition, attempts, failure.cause_line, cause
    )
    error.__cause__ = cause
    return error
