"""Staging on Spark executors: each task attempt writes its partition's rows as Parquet files
in the table's staging area, and the driver adopts the files of the attempts Spark reported
successful.

A table whose writers are :class:`~.parquet_writer.ParquetStagingWriter`\\ s (Parquet, Iceberg,
Delta) can be written on executors: :meth:`ExecutorStaging.of` takes what a task needs from one
of its writers (the root, the schema, the file options) in a small picklable value that Spark
ships to every task. The layout under the writers' root, for a micro-batch staged under the
staging number *S*::

    .staging/<S>-tasks/p<partition>a<attempt>/part-*.parquet   what each task attempt wrote
    .staging/<S>/wp<partition>/part-*.parquet                  the adopted attempts

The second line is exactly the layout of an epoch the writer actors staged (writer id
``p<partition>``), so every committer commits it unchanged.

* **A task** (:meth:`ExecutorStaging.stage_task`) writes under its own attempt's directory:
  a failed attempt, a retry and a speculative copy never share files.
* **The driver** (:meth:`ExecutorStaging.adopt`) gets one manifest per partition — Spark
  returns the result of exactly one successful attempt of each — and renames each of those
  attempts' directories into ``.staging/<S>/`` (one rename per partition, so the driver's work
  grows with the partitions, not the rows), then deletes ``<S>-tasks`` with whatever failed or
  speculative attempts left there. An attempt still running after that (a speculative copy
  Spark has not killed yet) writes only under ``<S>-tasks``, never under ``<S>``: nothing it
  writes can become visible, and the committer's recovery deletes it
  (:func:`~._staging.clean_staging` keeps only the staging directories of pending commits).
* **The staging number** *S* (:func:`staging_number`) is the driver's clock in epoch units with
  the lowest bit set: epochs the runtime makes have their 16 low bits zero, so *S* never names
  a runtime epoch's staging directory, and numbers sort by time like epochs.

The table's directory must be one filesystem path the driver and the executors both see (a
local path when Spark runs on this machine, a shared mount on a cluster): the driver renames
what the executors wrote.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, final, runtime_checkable

import pyarrow as pa

from barrierflow._fs import fsync_path
from barrierflow.actors.sinks.committables import partition_writer
from barrierflow.actors.sinks.table import Manifest
from barrierflow.channels.epoch import epoch_from_unix_ms
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.channels.schema import conform_schema
from barrierflow.connectors._parquet_files import StagedFiles
from barrierflow.connectors._staging import STAGING, staged_name
from barrierflow.connectors.errors import ExecutorStagingError

__all__ = [
    "ExecutorStaging",
    "ExecutorWrites",
    "StagesOnExecutors",
    "TaskFiles",
    "TaskWrite",
    "executor_writes",
    "failures_directory",
    "staging_number",
]


def staging_number(previous: int = 0) -> int:
    """A fresh staging number for a micro-batch staged on executors: the current time as an
    epoch with the lowest bit set (never a runtime epoch), greater than ``previous``."""
    number = epoch_from_unix_ms(int(time.time() * 1000)) | 1
    return number if number > previous else previous + 2


class TaskWrite(Protocol):
    """One Spark task attempt's write of its partition (runs on an executor, blocking)."""

    def add(self, batch: pa.RecordBatch) -> None:
        """Write ``batch`` (rows of the table's schema) into the attempt's staging."""
        ...

    def finish(self) -> Manifest:
        """Make what was added durable but invisible; its manifest is what the task returns."""
        ...


class ExecutorWrites(Protocol):
    """How a table is written from Spark tasks (a small picklable value shipped to every task)
    and what the driver does with what they wrote: :class:`ExecutorStaging` for the tables
    that stage Parquet files, :class:`~barrierflow.connectors.postgres_executors.
    PostgresExecutorWrites` for PostgreSQL (a prepared transaction per task attempt)."""

    @property
    def schema(self) -> pa.Schema:
        """The schema of the rows a task writes."""
        ...

    @property
    def root(self) -> str:
        """The directory the driver and the tasks share for the table (a
        :class:`~barrierflow.actors.sinks.committables.StagedBatch`'s root; failed attempts
        record why under it, :func:`failures_directory`)."""
        ...

    def open_task(self, number: int, partition: int, attempt: int) -> TaskWrite:
        """The write of ``partition``'s task attempt ``attempt`` (Spark's task attempt id,
        unique in the application) under staging ``number`` (on an executor)."""
        ...

    def adopt(self, number: int, manifests: Sequence[Manifest]) -> list[Manifest]:
        """Keep the attempts whose ``manifests`` Spark returned (one per partition) and drop
        every other attempt of ``number``; the kept manifests, as the committer takes them
        (on the driver). With no manifests it drops every attempt: what a failed job
        staged."""
        ...


@runtime_checkable
class StagesOnExecutors(Protocol):
    """A staging writer that can tell Spark tasks how to write as it does."""

    def executor_staging(self) -> ExecutorWrites:
        """What a task needs to write rows the way this writer does."""
        ...


def executor_writes(table: Any) -> ExecutorWrites:
    """How ``table`` is written from Spark tasks (one of its writers tells).

    Raises:
        InvalidArgumentError: ``table``'s writers cannot write from Spark tasks (a print
            sink, a list table).
    """
    make = getattr(table, "writer", None)
    writer = make("spark") if callable(make) else None
    if not isinstance(writer, StagesOnExecutors):
        raise InvalidArgumentError(
            "table",
            "a table whose writers can write from Spark tasks (ParquetTable, IcebergTable, "
            "DeltaLakeTable, a PostgresTable without a key)",
            type(table).__name__,
        )
    return writer.executor_staging()


def failures_directory(root: str, number: int) -> Path:
    """Where the task attempts of staging ``number`` that failed record why: under the task
    directories, deleted with them by :meth:`ExecutorStaging.adopt` or a recovery."""
    return Path(root, STAGING, f"{staged_name(number)}-tasks", "failed")


@final
@dataclass(frozen=True, slots=True)
class ExecutorStaging:
    """What a Spark task needs to stage its partition for a table (picklable; see the module
    docstring). Build with :meth:`of`."""

    root: str
    schema: pa.Schema
    rows_per_file: int
    row_group_rows: int
    compression: str
    use_dictionary: bool | list[str]

    def _files(self, partition: int, directory: Path | None) -> StagedFiles:
        return StagedFiles(
            Path(self.root),
            self.schema,
            self.rows_per_file,
            self.compression,
            self.use_dictionary,
            writer=partition_writer(partition),
            directory=directory,
        )

    def task_directory(self, number: int, partition: int, attempt: int) -> Path:
        """Where attempt ``attempt`` of ``partition``'s task stages under ``number``."""
        return Path(self.root, STAGING, f"{staged_name(number)}-tasks", f"p{partition}a{attempt}")

    def open_task(self, number: int, partition: int, attempt: int) -> TaskFiles:
        """The files of attempt ``attempt`` of ``partition``'s task under ``number``, in the
        attempt's own directory (see the module)."""
        files = self._files(partition, self.task_directory(number, partition, attempt))
        files.begin(number)
        return TaskFiles(files, number, self.schema, self.row_group_rows, partition)

    def stage_task(
        self, number: int, partition: int, attempt: int, batches: Iterable[pa.RecordBatch]
    ) -> Manifest:
        """Stage ``batches`` (one task's partition) as Parquet files under the attempt's own
        directory; fsynced, nothing visible. Blocking: runs in the Spark task."""
        write = self.open_task(number, partition, attempt)
        for batch in batches:
            write.add(batch)
        return write.finish()

    def adopt(self, number: int, manifests: Sequence[Manifest]) -> list[Manifest]:
        """Move the successful attempts' files (one manifest per partition) into the staging
        directory of ``number`` and delete what the other attempts left; return the manifests
        of the moved files. Blocking: runs on the driver.

        Raises:
            ExecutorStagingError: a manifest whose files are not under ``number``'s task
                directories, or whose directory is gone (the staging area was cleaned by a
                coordinator's recovery meanwhile: stage the batch again).
        """
        root = Path(self.root)
        tasks = root / STAGING / f"{staged_name(number)}-tasks"
        target = root / STAGING / staged_name(number)
        adopted: list[Manifest] = []
        for manifest in manifests:
            if not manifest.files:
                adopted.append(manifest)
                continue
            source = (root / manifest.files[0].path).parent
            if source.parent != tasks or any(
                (root / f.path).parent != source for f in manifest.files
            ):
                raise ExecutorStagingError(
                    str(root), f"writer {manifest.writer}'s files are not under {tasks}"
                )
            destination = target / f"w{manifest.writer}"
            target.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(destination, ignore_errors=True)
            try:
                os.rename(source, destination)
            except FileNotFoundError as exc:
                raise ExecutorStagingError(
                    str(root), f"{source} is gone (a recovery cleaned the staging area)"
                ) from exc
            # The state deltas a keyed step staged ride along (their store is not moved).
            files = tuple(
                replace(f, path=str((destination / Path(f.path).name).relative_to(root)))
                for f in manifest.files
            )
            adopted.append(replace(manifest, epoch=number, files=files))
        if target.exists():
            fsync_path(target)
            fsync_path(target.parent)
        shutil.rmtree(tasks, ignore_errors=True)
        return adopted


@final
class TaskFiles:
    """One task attempt's Parquet files (:meth:`ExecutorStaging.open_task`): batches are
    conformed to the table's schema and buffered into row groups of ``row_group_rows`` —
    Spark hands a Python task batches of ``spark.sql.execution.arrow.maxRecordsPerBatch``
    rows, too small for a row group of their own."""

    def __init__(
        self,
        files: StagedFiles,
        number: int,
        schema: pa.Schema,
        row_group_rows: int,
        partition: int,
    ) -> None:
        self._files = files
        self._number = number
        self._schema = schema
        self._row_group_rows = row_group_rows
        self._what = f"partition {partition} of a micro-batch"
        self._buffered: list[pa.RecordBatch] = []
        self._rows = 0

    def add(self, batch: pa.RecordBatch) -> None:
        """Buffer ``batch``; write a row group once enough rows are buffered."""
        if not batch.num_rows:
            return
        self._buffered.extend(conform_schema(batch, self._schema, self._what).to_batches())
        self._rows += batch.num_rows
        if self._rows >= self._row_group_rows:
            self._files.write(self._buffered)
            self._buffered, self._rows = [], 0

    def finish(self) -> Manifest:
        """Write what is buffered and stage the files (fsynced, nothing visible)."""
        if self._buffered:
            self._files.write(self._buffered)
            self._buffered, self._rows = [], 0
        return self._files.stage(self._number)
