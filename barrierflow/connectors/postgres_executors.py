"""A PostgreSQL table written from Spark tasks: each task attempt prepares a transaction of
its own, and the driver keeps exactly one per partition.

:class:`PostgresExecutorWrites` is :meth:`PostgresStagingWriter.executor_staging
<barrierflow.connectors.postgres_table.PostgresStagingWriter.executor_staging>`'s answer: the
:class:`~barrierflow.connectors.executor_staging.ExecutorWrites` of a
:class:`~barrierflow.connectors.PostgresTable`. The table's two-phase commit is unchanged; only
who prepares differs. For a micro-batch staged under the staging number *S*
(:func:`~barrierflow.connectors.executor_staging.staging_number`, never a runtime epoch):

* **A task attempt** (:meth:`PostgresExecutorWrites.open_task`) ``COPY``\\ s its partition's
  rows into the table inside a transaction of its own connection and ``PREPARE``\\ s it under
  the global id ``bf:<sink>:<S>:p<partition>a<attempt>`` (:func:`task_gid`; Spark's task
  attempt id is unique in its application), with its row in ``bf_sink_shares``, exactly as a
  writer actor prepares an epoch. Its manifest is the writer actor's: writer ``p<partition>``,
  one :class:`~barrierflow.actors.sinks.table.StagedFile` whose path is the gid. So the
  coordinator's ``prepare`` lists these gids in the epoch's metadata, its ``commit``
  ``COMMIT PREPARED``\\ s them and writes the marker, and its recovery rolls back every gid of
  the sink that no pending epoch names: one mechanism for rows from actors and from tasks.
* **The driver** (:meth:`PostgresExecutorWrites.adopt`), once Spark returned one manifest per
  partition, sets the sink's **fence** to *S*, then rolls back every prepared transaction of
  *S* whose gid no returned manifest names (a failed attempt that prepared before it died, a
  speculative copy, a killed executor's), and checks that the kept ones are still prepared.

**Why nothing of a failed or speculative attempt becomes visible.** Rows become visible only by
``COMMIT PREPARED``, and only the coordinator commits, only the gids an epoch's metadata names,
which are the adopted manifests' — one attempt per partition, the one whose result Spark
returned. An attempt that failed before its ``PREPARE`` left an open transaction that ended
with its connection (the server rolls it back). One that prepared is rolled back by ``adopt``
if it prepared before the fence was set. One still running after that cannot prepare at all:
just before ``PREPARE`` a task takes the sink's fence lock (a session-level advisory lock)
shared and reads the fence; ``adopt`` takes it exclusively while it sets the fence and lists
the prepared transactions. So an attempt either prepared before the listing (and is rolled
back) or reads the fence afterwards and rolls back itself (:class:`ExecutorStagingError`, in a
task whose result nobody reads). A prepared transaction of *S* that outlives all this — the
driver died between a task's ``PREPARE`` and ``adopt`` — is named by no pending epoch, so the
coordinator's next recovery rolls it back. The fence is one row of ``bf_sink_shares`` per sink
(gid ``bf:<sink>:adopted``, the greatest adopted *S* as its epoch): staging numbers grow with
the driver's clock, so a driver restarted on a clock set back past the last adopted number
would have its tasks refused until the clock catches up.

**What recovery does.** Unchanged: the committer's ``recover(pending)`` rolls back every
prepared transaction of the sink that no pending epoch's metadata names (adopted attempts of a
micro-batch whose epoch never became pending, stragglers of the driver's death), and keeps
those of pending epochs to commit them. An adopted batch whose transactions a recovery rolled
back before its committable reached the sink writer is caught there:
:meth:`PostgresExecutorWrites.missing` names a gid no longer prepared, the writer fails the
epoch with :class:`~barrierflow.errors.StagedFilesGoneError`, and the bridge stages the batch
again.

**The shared directory** (:attr:`PostgresExecutorWrites.root`, which the bridge's
:class:`~barrierflow.actors.sinks.committables.StagedBatch` names and under which failed
attempts record why: :func:`~barrierflow.connectors.executor_staging.failures_directory`)
holds no rows: it is
``barrierflow-postgres-<digest of the DSN and sink>`` in the driver's temporary directory,
which local Spark's executors share. On a cluster the executors record failures on their own
machines, so the driver logs only the last failure, which Spark's error carries. ``adopt``
deletes the task records of *S* and of every earlier number.

A keyed table (``key=``) cannot be written from tasks: a prepared transaction keeps its row
locks until its commit, so two tasks (or a retry after an attempt that prepared) upserting one
key in one micro-batch would wait for each other until the job never ends.
:meth:`~barrierflow.connectors.postgres_table.PostgresStagingWriter.executor_staging` refuses
it.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import final

import pyarrow as pa

from barrierflow.actors.sinks.table import Manifest
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.connectors._postgres_sql import (
    GID_PREFIX,
    SHARES_TABLE,
    Connection,
    TableSpec,
    connect,
    end_prepared,
    prepared_gids,
    psycopg,
    sql,
)
from barrierflow.connectors._staging import STAGING
from barrierflow.connectors.errors import ExecutorStagingError, PostgresUnavailableError
from barrierflow.connectors.executor_staging import TaskWrite

__all__ = [
    "PostgresExecutorWrites",
    "enter_fence",
    "scratch_root",
    "task_gid",
    "task_writer",
]

#: The writer id of the fence row in ``bf_sink_shares``.
_FENCE = "adopted"

#: What opens a task attempt's write: ``(spec, number, partition, attempt)``.
OpenTask = Callable[[TableSpec, int, int, int], TaskWrite]


def task_writer(partition: int, attempt: int) -> str:
    """The writer id in a task attempt's gid: ``p<partition>a<attempt>``."""
    return f"p{partition}a{attempt}"


def task_gid(spec: TableSpec, number: int, partition: int, attempt: int) -> str:
    """The global id of the transaction attempt ``attempt`` of ``partition`` prepares under
    staging ``number``: ``bf:<sink>:<number>:p<partition>a<attempt>``."""
    return spec.gid(number, task_writer(partition, attempt))


def _fence_gid(spec: TableSpec) -> str:
    return f"{GID_PREFIX}:{spec.sink}:{_FENCE}"


def _fence_lock(spec: TableSpec) -> str:
    """The text whose ``hashtext`` is the sink's fence lock (an advisory lock key)."""
    return f"barrierflow fence {spec.sink}"


def enter_fence(connection: Connection, spec: TableSpec, number: int) -> None:
    """In a task's transaction, just before its ``PREPARE``: take the sink's fence lock
    shared (held by the session until it closes) and refuse if staging ``number`` was adopted
    already (see the module).

    Raises:
        ExecutorStagingError: ``number`` is adopted: this attempt is one Spark does not keep.
    """
    s = sql()
    connection.execute("SELECT pg_advisory_lock_shared(hashtext(%s))", [_fence_lock(spec)])
    row = connection.execute(
        s.SQL("SELECT epoch FROM {} WHERE gid = %s").format(spec.name(SHARES_TABLE)),
        [_fence_gid(spec)],
    ).fetchone()
    if row is not None and row[0] >= number:
        raise ExecutorStagingError(
            spec.qualified,
            f"staging {number} was adopted already (up to {row[0]}): this attempt is not the "
            "one Spark kept, and prepares nothing",
        )


def scratch_root(spec: TableSpec) -> str:
    """The directory the driver and local executors share for ``spec``'s table (see the
    module): in the temporary directory, named by a digest of the DSN and the sink."""
    digest = hashlib.sha1(f"{spec.dsn}\0{spec.sink}".encode()).hexdigest()[:16]
    return str(Path(tempfile.gettempdir(), f"barrierflow-postgres-{digest}"))


def _count(argument: str, value: object) -> int:
    if type(value) is not int or value < 0:
        raise InvalidArgumentError(argument, "an int >= 0", value)
    return value


@final
@dataclass(frozen=True, slots=True)
class PostgresExecutorWrites:
    """How a :class:`~barrierflow.connectors.PostgresTable` is written from Spark tasks
    (picklable; see the module). Made by the table's writer,
    :meth:`~barrierflow.connectors.postgres_table.PostgresStagingWriter.executor_staging`.

    Attributes:
        spec: the table.
        root: the directory the driver and the tasks share (no rows: failed attempts'
            records).
        task: what opens a task attempt's write (the table module's task writer).
    """

    spec: TableSpec
    root: str
    task: OpenTask

    @property
    def schema(self) -> pa.Schema:
        """The schema of the rows a task writes."""
        return self.spec.arrow

    def open_task(self, number: int, partition: int, attempt: int) -> TaskWrite:
        """The write of attempt ``attempt`` of ``partition``'s task under staging ``number``:
        connected, its transaction begun at its first rows, prepared by ``finish`` under
        :func:`task_gid` (blocking; on an executor).

        Raises:
            InvalidArgumentError: an argument that is not an int >= 0.
            PostgresUnavailableError: the database cannot be reached.
        """
        _count("number", number)
        _count("partition", partition)
        _count("attempt", attempt)
        return self.task(self.spec, number, partition, attempt)

    def adopt(self, number: int, manifests: Sequence[Manifest]) -> list[Manifest]:
        """Keep the prepared transactions the ``manifests`` name (one per partition, the
        attempts Spark returned), set the fence to ``number`` and roll back every other
        prepared transaction of ``number``; the manifests, unchanged (blocking; on the
        driver).

        Raises:
            InvalidArgumentError: ``number`` is not an int >= 0, or ``manifests`` not a
                sequence of Manifests.
            ExecutorStagingError: a manifest names a transaction of another staging number, a
                kept transaction is no longer prepared (a recovery rolled it back: every
                transaction of ``number`` is then rolled back, stage the batch again), or the
                database failed meanwhile.
        """
        _count("number", number)
        if not isinstance(manifests, Sequence) or not all(
            isinstance(m, Manifest) for m in manifests
        ):
            raise InvalidArgumentError("manifests", "a sequence of Manifests", manifests)
        spec = self.spec
        prefix = spec.gid_prefix(number)
        kept = {f.path for m in manifests for f in m.files}
        foreign = sorted(gid for gid in kept if not gid.startswith(prefix))
        if foreign:
            raise ExecutorStagingError(
                spec.qualified, f"the transactions {foreign} are not of staging {number}"
            )
        try:
            with connect(spec) as connection:
                gone = self._adopt(connection, number, kept)
        except psycopg().Error as exc:
            raise ExecutorStagingError(spec.qualified, f"adopting failed: {exc}") from exc
        if gone:
            raise ExecutorStagingError(
                spec.qualified,
                f"the prepared transactions {gone} are gone (a recovery rolled them back): "
                "stage the batch again",
            )
        self._forget_tasks(number)
        return list(manifests)

    def _adopt(self, connection: Connection, number: int, kept: set[str]) -> list[str]:
        """Set the fence and roll back what is not kept, under the fence lock (released when
        the connection closes); the kept gids that are gone (then nothing is kept)."""
        spec, s = self.spec, sql()
        connection.execute("SELECT pg_advisory_lock(hashtext(%s))", [_fence_lock(spec)])
        connection.execute(
            s.SQL(
                "INSERT INTO {} AS f (gid, sink, epoch, writer, rows) VALUES (%s, %s, %s, %s, 0) "
                "ON CONFLICT (gid) DO UPDATE SET epoch = GREATEST(f.epoch, EXCLUDED.epoch)"
            ).format(spec.name(SHARES_TABLE)),
            [_fence_gid(spec), spec.sink, number, _FENCE],
        )
        prepared = prepared_gids(connection, spec.gid_prefix(number))
        gone = sorted(kept - set(prepared))
        for gid in prepared:
            if gone or gid not in kept:
                end_prepared(connection, "ROLLBACK", gid)
        return gone

    def _forget_tasks(self, number: int) -> None:
        """Delete the task records (failed attempts') of ``number`` and earlier numbers."""
        staging = Path(self.root, STAGING)
        if not staging.is_dir():
            return
        for directory in staging.glob("*-tasks"):
            stem = directory.name.removesuffix("-tasks")
            if stem.isdigit() and int(stem) <= number:
                shutil.rmtree(directory, ignore_errors=True)

    def missing(self, manifests: Sequence[Manifest]) -> str | None:
        """The first transaction the ``manifests`` name that is no longer prepared (``None``:
        all are); the check a :class:`~barrierflow.actors.sinks.committables.StagedBatch`
        makes before its epoch takes it. Blocking: one query.

        Raises:
            PostgresUnavailableError: the database cannot be reached.
        """
        gids = [f.path for m in manifests for f in m.files]
        if not gids:
            return None
        try:
            with connect(self.spec) as connection:
                rows = connection.execute(
                    "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() "
                    "AND gid = ANY(%s)",
                    [gids],
                ).fetchall()
        except psycopg().Error as exc:
            raise PostgresUnavailableError(self.spec.qualified, f"{exc}".strip()) from exc
        prepared = {row[0] for row in rows}
        return next((gid for gid in gids if gid not in prepared), None)
