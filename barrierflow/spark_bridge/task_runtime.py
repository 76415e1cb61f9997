"""A micro-batch's partition through the chain, inside one Spark task.

:func:`run_partition` is what each task of a micro-batch runs on its executor's Python worker
when the bridge runs with ``run_on="executors"``. It builds a small
:class:`~barrierflow.runtime.Runtime` of the task's own, on the backend the driver chose, with
three kinds of actors:

* a push source, fed the partition's Arrow batches as Spark hands them over. A batch is read
  from Spark's iterator on a worker thread, so the actors keep running meanwhile: an
  ``async_map``'s calls stay in flight while the next batch arrives;
* the chain's steps (:func:`~barrierflow.spark_bridge.chain.plan_chain`), built from the
  factories the user declared, exactly as on the driver;
* a stage actor that writes what reaches it into the attempt's own staging
  (:meth:`~barrierflow.connectors.executor_staging.ExecutorWrites.open_task`).

**The end of the partition is the task's barrier.** Once Spark's iterator is exhausted the
task runtime takes a checkpoint. Every step passes the barrier the way it does on the driver,
so an ``async_map`` drains its calls in flight first. When the checkpoint returns, every row
the chain emitted has reached the stage actor. Only then are the staged files finished and the
manifest returned. A task that fails, or is killed, before that returns nothing, and Spark runs
it again. Its files stay under its own attempt's directory, which the driver never adopts.

The task runtime's state store is a scratch file deleted with the task. A partition-local
actor's state therefore lives for one task, one partition of one micro-batch. A keyed step's
state lives on a shared directory: loaded into the scratch store before the runtime starts,
and its changes staged there after the checkpoint, both by vnode
(:mod:`barrierflow.spark_bridge.task_state`); the task's manifest carries the staged deltas.

**What a task returns**: its manifest, and its counters in :class:`TaskReport`: the chain's
per-actor and per-operator counters, its rows, and its seconds. The driver adds them to its
metrics (:mod:`barrierflow.spark_bridge.executor_metrics`).

**What a failed attempt leaves**: :func:`failure_of` turns what the attempt raised into a
:class:`TaskFailure`: the actor, the cause in one line, and the cause itself pickled when it
pickles. The task records it beside its staging, then raises it as the text of a
:class:`TaskFailedError`. The driver logs every recorded attempt once. When Spark gives up on
a task, the driver raises the last failure as
:class:`~barrierflow.errors.ExecutorChainFailedError` (see
:mod:`barrierflow.spark_bridge.executors`).
"""

from __future__ import annotations

import base64
import json
import pickle
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, final

import anyio
import anyio.to_thread
import numpy as np
import pyarrow as pa

from barrierflow.actors.sinks.errors import SinkWriterInputError
from barrierflow.actors.sinks.table import Manifest
from barrierflow.channels.chunk import Chunk
from barrierflow.channels.messages import Message
from barrierflow.channels.schema import conform_schema
from barrierflow.connectors.executor_staging import ExecutorWrites, TaskWrite, failures_directory
from barrierflow.runtime.actor import ActorContext, StreamActor
from barrierflow.runtime.config import RuntimeConfig
from barrierflow.runtime.errors import ActorFailedError
from barrierflow.runtime.placement import Placement
from barrierflow.runtime.runtime import Runtime
from barrierflow.spark_bridge.chain import ChainStep
from barrierflow.spark_bridge.task_state import KeyedStep, seed_state, stage_state

__all__ = [
    "TaskChain",
    "TaskFailedError",
    "TaskFailure",
    "TaskReport",
    "failure_of",
    "run_partition",
]

#: The task runtime's source and stage actors (names no declared actor has: ``__`` prefix).
SOURCE = "__partition"
STAGE = "__stage"

#: A checkpoint's barrier interval in the task runtime: never on a timer, only at the end.
_NEVER = 1e9

#: The counters a task reports, by metric name prefix.
_REPORTED = ("barrierflow_actor_", "barrierflow_operator_")


@final
@dataclass(frozen=True, slots=True)
class TaskChain:
    """What every task of a micro-batch runs (pickled by Spark into each task).

    Attributes:
        steps: the chain's actors, in order.
        writes: how the sink's table is written from a task.
        schema: the feed's schema (the chain's input).
        backend: the anyio backend of the task runtime (the driver's).
        sink: the sink's name (the stage actor's, in errors).
        keyed: where the chain's keyed step keeps its state (``None``: it has none).
    """

    steps: tuple[ChainStep, ...]
    writes: ExecutorWrites
    schema: pa.Schema
    backend: str
    sink: str
    keyed: KeyedStep | None = None


@final
@dataclass(slots=True)
class TaskReport:
    """What a task returns besides its manifest.

    Attributes:
        rows: rows the task read from its partition.
        seconds: the task's time in :func:`run_partition`.
        counters: ``(metric name, labels, value)`` of the chain's actor and operator counters.
        state_rows_read: rows of keyed state the task loaded.
        state_seconds: the task's time loading its keyed state and staging its changes.
    """

    rows: int = 0
    seconds: float = 0.0
    counters: list[tuple[str, dict[str, str], float]] = field(default_factory=list)
    state_rows_read: int = 0
    state_seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-able data."""
        return {
            "rows": self.rows,
            "seconds": self.seconds,
            "counters": self.counters,
            "state_rows_read": self.state_rows_read,
            "state_seconds": self.state_seconds,
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> TaskReport:
        """A report from :meth:`to_json`'s data."""
        counters = [(str(n), dict(labels), float(v)) for n, labels, v in data["counters"]]
        return TaskReport(
            int(data["rows"]),
            float(data["seconds"]),
            counters,
            int(data.get("state_rows_read", 0)),
            float(data.get("state_seconds", 0.0)),
        )


@final
@dataclass(frozen=True, slots=True)
class TaskFailure:
    """Why a task attempt failed, as it travels to the driver (JSON).

    Attributes:
        partition, attempt: the task attempt: Spark's partition id, and which attempt of
            the partition's task it was (``0`` for the first; Spark's ``attemptNumber``).
        actor: the chain's actor that raised (``None``: the task failed outside one).
        cause_line: the cause in one line, ``"<type>: <message>"``.
        cause: the cause, pickled and base64-encoded (``""`` when it does not pickle).
        task: Spark's id of the task attempt (unique in the application; its staging
            directory is named after it).
    """

    partition: int
    attempt: int
    actor: str | None
    cause_line: str
    cause: str = ""
    task: int = 0

    def to_json(self) -> str:
        """The failure as one line of JSON."""
        return json.dumps(
            {
                "partition": self.partition,
                "attempt": self.attempt,
                "actor": self.actor,
                "cause_line": self.cause_line,
                "cause": self.cause,
                "task": self.task,
            }
        )

    @staticmethod
    def from_json(text: str) -> TaskFailure:
        """A failure from :meth:`to_json`'s text."""
        data = json.loads(text)
        actor = data["actor"]
        return TaskFailure(
            int(data["partition"]),
            int(data["attempt"]),
            None if actor is None else str(actor),
            str(data["cause_line"]),
            str(data["cause"]),
            int(data["task"]),
        )

    def error(self) -> BaseException | None:
        """The cause as it was raised (``None`` if it did not travel)."""
        if not self.cause:
            return None
        try:
            error = pickle.loads(base64.b64decode(self.cause))
        except Exception:
            return None
        return error if isinstance(error, BaseException) else None


class TaskFailedError(Exception):
    """What a failed task attempt raises in Spark: its :class:`TaskFailure` as the message,
    after :data:`MARK`, for the driver to find in Spark's error text."""

    #: What precedes the failure's JSON in the message.
    MARK = "barrierflow-task-failure:"

    def __init__(self, failure: TaskFailure) -> None:
        self.failure = failure
        super().__init__(self.MARK + failure.to_json())


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def failure_of(
    error: BaseException, partition: int, attempt: int, sink: str, task: int = 0
) -> TaskFailure:
    """What ``error``, raised by attempt ``attempt`` (Spark's task ``task``) of
    ``partition``'s task, tells the driver."""
    actor: str | None = None
    cause = error
    if isinstance(error, ActorFailedError):
        actor = sink if error.actor == STAGE else error.actor
        cause = error.cause
    try:
        pickled = pickle.dumps(cause)
        pickle.loads(pickled)  # a round trip: does it travel?
    except Exception:
        encoded = ""
    else:
        encoded = base64.b64encode(pickled).decode("ascii")
    return TaskFailure(partition, attempt, actor, _one_line(cause), encoded, task)


class _Stage(StreamActor):
    """The chain's end in a task: what reaches it is written into the attempt's staging."""

    placement = Placement.PARTITION_LOCAL

    def __init__(self, write: TaskWrite, sink: str) -> None:
        self._write = write
        self._sink = sink

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if not isinstance(message, Chunk):
            await ctx.emit(message)  # a barrier is passed (to nobody) so it is collected
            return
        if message.cardinality == 0:
            return
        chunk = message.compact()
        if chunk.ops is not None and np.count_nonzero(chunk.ops_numpy()):
            raise SinkWriterInputError(
                self._sink, "insert-only rows (written from Spark tasks)", "deletes or updates"
            )
        await anyio.to_thread.run_sync(self._write.add, chunk.batch)


async def _run_chain(
    chain: TaskChain,
    write: TaskWrite,
    batches: Iterator[pa.RecordBatch],
    report: TaskReport,
    staging: tuple[int, int, int],
) -> tuple[dict[str, Any], ...]:
    """Run the chain in a task runtime of its own; returns the state records of its keyed
    step (``staging``: the staging number, the partition and Spark's task attempt id)."""
    names = {step.name for step in chain.steps}
    number, partition, task = staging
    keyed = chain.keyed
    with tempfile.TemporaryDirectory(prefix="barrierflow-task-") as scratch:
        path = Path(scratch, "state.db")
        vnodes = None if keyed is None else keyed.vnodes(partition)
        if keyed is not None and vnodes is not None:
            started = time.perf_counter()
            report.state_rows_read = await seed_state(keyed, path, vnodes)
            report.state_seconds += time.perf_counter() - started
        rt = Runtime(RuntimeConfig(state_path=path, barrier_interval=_NEVER))
        rt.add_source(SOURCE, schema=chain.schema)
        upstream = SOURCE
        for step in chain.steps:
            rt.add_actor(step.name, step.factory, inputs=[upstream])
            upstream = step.name
        rt.add_actor(STAGE, lambda: _Stage(write, chain.sink), inputs=[upstream])
        async with rt:
            while True:
                batch = await anyio.to_thread.run_sync(next, batches, None)
                if batch is None:
                    break
                if batch.num_rows:
                    report.rows += batch.num_rows
                    if not batch.schema.equals(chain.schema):
                        # Spark's nullability may differ from the feed's (checked on the
                        # driver already); a null where the feed has none is refused here.
                        table = conform_schema(batch, chain.schema, "micro-batch")
                        batch = table.to_batches()[0] if table.num_rows else batch
                    await rt.push(SOURCE, Chunk(batch))
            await rt.checkpoint()  # the partition's end: every step drains and passes it
            for family in await rt.metrics.snapshot():
                if family.kind != "counter" or not family.name.startswith(_REPORTED):
                    continue
                for sample in family.samples:
                    labels = dict(sample.labels)
                    if not sample.suffix and labels.get("actor") in names:
                        report.counters.append((family.name, labels, sample.value))
        if keyed is None or vnodes is None:
            return ()
        started = time.perf_counter()
        records = await stage_state(keyed, path, number, f"t{task}", vnodes)
        report.state_seconds += time.perf_counter() - started
        return records


def run_partition(
    chain: TaskChain,
    number: int,
    partition: int,
    task: int,
    attempt: int,
    batches: Iterator[pa.RecordBatch],
) -> tuple[Manifest, TaskReport]:
    """Run ``chain`` over one task's ``batches`` and stage what it emits under staging
    ``number`` (blocking; in the Spark task ``task``, attempt ``attempt`` of ``partition``'s
    task). Without steps the batches are written as they come, with no runtime.

    Raises:
        TaskFailedError: the chain or the write failed (after recording the failure).
    """
    started = time.perf_counter()
    report = TaskReport()
    try:
        write = chain.writes.open_task(number, partition, task)
        state: tuple[dict[str, Any], ...] = ()
        if chain.steps:
            staging = (number, partition, task)
            state = anyio.run(
                _run_chain, chain, write, batches, report, staging, backend=chain.backend
            )
        else:
            for batch in batches:
                report.rows += batch.num_rows
                write.add(batch)
        manifest = write.finish()
        if state:
            manifest = replace(manifest, state=state)
    except Exception as exc:
        failure = failure_of(exc, partition, attempt, chain.sink, task)
        record_failure(chain.writes.root, number, failure)
        raise TaskFailedError(failure) from None
    report.seconds = time.perf_counter() - started
    return manifest, report


def record_failure(root: str, number: int, failure: TaskFailure) -> None:
    """Record ``failure`` for the driver to log (best effort: a table without a directory
    the driver sees keeps only the last failure, which Spark's error carries)."""
    directory = failures_directory(root, number)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        name = f"p{failure.partition}t{failure.task}.json"
        Path(directory, name).write_text(failure.to_json())
    except OSError:
        pass
