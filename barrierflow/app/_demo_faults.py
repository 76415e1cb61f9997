"""The demo's crash switch: SIGKILL of the driver at a chosen point of one micro-batch.

``barrierflow demo --crash-after N --crash-point P`` arms :class:`Faults` for micro-batch
``N`` of the run; the wrappers below kill the process at point ``P``: ``mid-batch`` (rows
written, not committed — with ``--run-on executors``: while the executors stage them),
``after-checkpoint`` (the batch durable here, not yet committed by Spark) or ``mid-commit``
(the table committed, the coordinator not yet told). ``executor-lost`` (executors only) kills
a task's Python worker mid-stage instead of the driver: Spark retries the task and the run
goes on. Before dying the demo prints a ``CRASH ...`` line and, on the next line, the command
that resumes the run.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from barrierflow.actors import CommitMetadata, CommitOutcome, Manifest, StagingWriter, Table
from barrierflow.actors.sinks.table import SinkCommits
from barrierflow.app._trace import TracedCommitter, TracedTable, trace
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.connectors.executor_staging import ExecutorWrites, StagesOnExecutors

__all__ = [
    "CrashingCommitter",
    "CrashingTable",
    "CrashingWriter",
    "Faults",
    "executor_faults",
    "kill_self",
]


def kill_self(where: str, resume: str) -> None:
    """Print ``CRASH <where>`` and the command that resumes, then SIGKILL this process."""
    # One write, so that no other thread's line lands between the two.
    sys.stdout.write(f"CRASH {where}: SIGKILL of the driver\nresume with: {resume}\n")
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class Faults:
    """The demo's crash switch: armed for one micro-batch of this run."""

    def __init__(self, after: int | None, point: str, resume: str) -> None:
        self.after = after
        self.point = point
        #: The command that resumes the run, printed on the line after ``CRASH``.
        self.resume = resume
        self.batches = 0
        self.armed = False

    def begin_batch(self) -> None:
        # A mid-commit crash stays armed: the batch's commit runs after its checkpoint, maybe
        # once the next batch has begun.
        sticky = self.armed and self.point == "mid-commit"
        self.armed = sticky or (self.after is not None and self.batches == self.after)

    def end_batch(self) -> None:
        if self.armed and self.point == "after-checkpoint":
            kill_self("after the batch's checkpoint, before Spark's commit", self.resume)
        self.batches += 1


class CrashingWriter:
    """A staging writer that kills the process on its first write of the armed batch."""

    def __init__(self, inner: StagingWriter, faults: Faults) -> None:
        self.inner = inner
        self._faults = faults

    @property
    def schema(self) -> pa.Schema:
        return self.inner.schema

    async def open(self) -> None:
        await self.inner.open()

    async def begin(self, epoch: int) -> None:
        await self.inner.begin(epoch)

    async def write(self, batch: pa.RecordBatch) -> None:
        trace("write", batch.num_rows)
        await self.inner.write(batch)
        if self._faults.armed and self._faults.point == "mid-batch":
            kill_self("mid-batch, rows written but not committed", self._faults.resume)

    async def flush(self) -> None:
        await self.inner.flush()

    async def stage(self, epoch: int) -> Manifest:
        return await self.inner.stage(epoch)

    async def discard(self, epoch: int) -> None:
        await self.inner.discard(epoch)

    async def close(self) -> None:
        await self.inner.close()

    def executor_staging(self) -> ExecutorWrites:
        """The inner writer's: Spark tasks stage without this writer's fault (the demo arms
        the executor path's in the tasks themselves, :func:`executor_faults`).

        Raises:
            InvalidArgumentError: the inner writer cannot stage on executors.
        """
        if not isinstance(self.inner, StagesOnExecutors):
            raise InvalidArgumentError(
                "table", "a table whose writers stage Parquet files", type(self.inner).__name__
            )
        return self.inner.executor_staging()


def executor_faults(df: Any, faults: Faults) -> Any:
    """``df`` with the armed batch's executor-side fault, if any: ``mid-batch`` — the first
    task attempt of partition 0 SIGKILLs the driver once it has passed on its first rows (the
    executors are staging); ``executor-lost`` — it SIGKILLs its own Python worker there
    instead: Spark runs the task again and the run goes on. Both are traced from the task
    (``worker-killed``, then ``task-again`` when Spark runs the task again): Spark no longer
    logs the lost worker (see :mod:`barrierflow.spark_bridge.session`)."""
    if not faults.armed or faults.point not in ("mid-batch", "executor-lost"):
        return df
    driver = os.getpid() if faults.point == "mid-batch" else None
    resume = faults.resume

    def step(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        attempt = context.attemptNumber() if context is not None else 0
        armed = context is not None and context.partitionId() == 0
        if armed and attempt > 0:
            trace("task-again", f"partition 0 attempt {attempt}")
        armed = armed and attempt == 0
        for batch in batches:
            yield batch
            if armed:
                if driver is None:  # executor-lost: this executor's Python worker dies
                    trace("worker-killed", "partition 0 attempt 0")
                    os.kill(os.getpid(), signal.SIGKILL)
                    return
                sys.stdout.write(
                    f"CRASH mid-batch, executors staging: SIGKILL of the driver\n"
                    f"resume with: {resume}\n"
                )
                sys.stdout.flush()
                os.kill(driver, signal.SIGKILL)
                armed = False

    return df.mapInArrow(step, df.schema)


class CrashingCommitter:
    """The table's traced committer (Iceberg or Delta), killing the process after the armed
    batch's table commit and before the coordinator records it committed."""

    def __init__(self, inner: TracedCommitter, faults: Faults) -> None:
        self.inner = inner
        self._faults = faults

    @property
    def commits_state(self) -> bool:
        """Whether the committer it wraps commits keyed state (see ``state_commit``)."""
        return self.inner.commits_state

    async def recover(self, pending: Mapping[int, CommitMetadata]) -> None:
        await self.inner.recover(pending)

    async def sink_commits(self) -> SinkCommits | None:
        """What the table holds (the runtime asks on an empty state store)."""
        return await self.inner.sink_commits()

    async def prepare(self, epoch: int, manifests: Sequence[Manifest]) -> CommitMetadata | None:
        return await self.inner.prepare(epoch, manifests)

    async def commit(self, epoch: int, metadata: CommitMetadata) -> CommitOutcome:
        outcome = await self.inner.commit(epoch, metadata)
        if self._faults.armed and self._faults.point == "mid-commit":
            kill_self(
                "mid-commit, the table committed, the commit not yet recorded", self._faults.resume
            )
        return outcome

    async def abort(self, epoch: int, metadata: CommitMetadata | None) -> None:
        await self.inner.abort(epoch, metadata)


class CrashingTable:
    """The demo's table (Iceberg or Delta) behind :func:`~barrierflow.actors.add_sink`,
    traced (:class:`~barrierflow.app._trace.TracedTable`): its writers and its committer, each
    wrapped to kill the process at the armed point."""

    def __init__(self, inner: Table, faults: Faults) -> None:
        self._traced = TracedTable(inner)
        self._faults = faults

    @property
    def schema(self) -> pa.Schema:
        """The table's schema."""
        return self._traced.schema

    def writer(self, writer_id: str) -> CrashingWriter:
        """Writer ``writer_id`` of the table, crashing on the armed batch's first write."""
        return CrashingWriter(self._traced.writer(writer_id), self._faults)

    def committer(self) -> CrashingCommitter:
        """The table's traced committer, crashing after the armed batch's commit."""
        return CrashingCommitter(self._traced.committer(), self._faults)
