"""The sink task's commands, its shared state and its stats record.

Package-internal: :class:`~barrierflow.actors.sinks.sink_task_handle.SinkTaskHandle` is the API;
the commands are what it sends the task, the state what the task updates and handles read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

import anyio
import pyarrow as pa

__all__ = [
    "Begin",
    "Close",
    "Discard",
    "Flush",
    "SinkTaskStats",
    "Stage",
    "TaskState",
    "Write",
    "WriteChanges",
]

DEFAULT_CAPACITY = 128
DEFAULT_FLUSH_INTERVAL = 5.0
DEFAULT_SHUTDOWN_TIMEOUT = 30.0


# The commands, one per StagingWriter method the task guards.
@dataclass(frozen=True, slots=True)
class Write:
    batch: pa.RecordBatch


@dataclass(frozen=True, slots=True)
class WriteChanges:
    batch: pa.RecordBatch
    ops: pa.Array


@dataclass(frozen=True, slots=True)
class Begin:
    epoch: int


@dataclass(frozen=True, slots=True)
class Flush:
    pass


@dataclass(frozen=True, slots=True)
class Stage:
    epoch: int


@dataclass(frozen=True, slots=True)
class Discard:
    epoch: int


@dataclass(frozen=True, slots=True)
class Close:
    pass


@final
@dataclass(frozen=True, slots=True)
class SinkTaskStats:
    """A snapshot of one sink task's counters."""

    #: The sink's name.
    name: str
    #: Batches and rows the writer accepted.
    batches_written: int
    rows_written: int
    #: Writes that failed (each poisoned its epoch).
    write_errors: int
    #: Whether the current epoch is poisoned.
    epoch_poisoned: bool
    #: Flushes that succeeded, failed, or overran their timeout (a stuck sink).
    flushes: int
    flush_errors: int
    stuck_flushes: int
    #: The epoch begun and not yet staged or discarded, if any.
    open_epoch: int | None
    #: Epochs staged (their manifests went to the coordinator), and the last one (0: none).
    staged_epochs: int
    last_staged: int
    #: Discards run, and those that failed.
    discards: int
    discard_errors: int
    #: Whether the task has stopped.
    finished: bool


class TaskState:
    """The task's mutable state, shared with its handles (read-only for them)."""

    def __init__(self, name: str, takes_changes: bool = False) -> None:
        self.name = name
        #: Whether the writer applies changelogs (``TakesChanges``).
        self.takes_changes = takes_changes
        self.batches_written = 0
        self.rows_written = 0
        self.write_errors = 0
        self.poisoned = False
        self.flushes = 0
        self.flush_errors = 0
        self.stuck_flushes = 0
        self.last_begun: int | None = None
        self.open_epoch: int | None = None
        self.staged_epochs = 0
        self.last_staged = 0
        self.discards = 0
        self.discard_errors = 0
        self.finished = anyio.Event()

    def snapshot(self) -> SinkTaskStats:
        return SinkTaskStats(
            name=self.name,
            batches_written=self.batches_written,
            rows_written=self.rows_written,
            write_errors=self.write_errors,
            epoch_poisoned=self.poisoned,
            flushes=self.flushes,
            flush_errors=self.flush_errors,
            stuck_flushes=self.stuck_flushes,
            open_epoch=self.open_epoch,
            staged_epochs=self.staged_epochs,
            last_staged=self.last_staged,
            discards=self.discards,
            discard_errors=self.discard_errors,
            finished=self.finished.is_set(),
        )
