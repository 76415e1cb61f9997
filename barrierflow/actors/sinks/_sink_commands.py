"""The sink task's commands, its shared state and its stats record, and argument checks.

Private: :class:`~barrierflow.actors.sinks.SinkTaskHandle` is the API; the commands are what it
sends the task, the state what the task updates and handles read.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import final

import anyio
import pyarrow as pa

from barrierflow.actors.sinks.protocol import PendingCommit

__all__ = [
    "BeginEpoch",
    "Close",
    "CommitEpoch",
    "Flush",
    "PreCommit",
    "Recover",
    "RollbackEpoch",
    "SinkTaskStats",
    "TaskState",
    "WriteBatch",
]

DEFAULT_CAPACITY = 128
DEFAULT_FLUSH_INTERVAL = 5.0
DEFAULT_SHUTDOWN_TIMEOUT = 30.0


# The commands (package-internal: the handle is the API).
@dataclass(frozen=True, slots=True)
class WriteBatch:
    batch: pa.RecordBatch


@dataclass(frozen=True, slots=True)
class BeginEpoch:
    epoch: int


@dataclass(frozen=True, slots=True)
class Flush:
    pass


@dataclass(frozen=True, slots=True)
class PreCommit:
    epoch: int
    # Source positions the epoch's rows span (after the first, up to the second), if known.
    positions: tuple[dict[str, int], dict[str, int]] | None = None


@dataclass(frozen=True, slots=True)
class CommitEpoch:
    epoch: int


@dataclass(frozen=True, slots=True)
class RollbackEpoch:
    epoch: int


@dataclass(frozen=True, slots=True)
class Recover:
    pending: tuple[PendingCommit, ...]


@dataclass(frozen=True, slots=True)
class Close:
    pass


@final
@dataclass(frozen=True, slots=True)
class SinkTaskStats:
    """A snapshot of one sink task's counters."""

    #: The sink's name, and whether its connector is exactly-once.
    name: str
    exactly_once: bool
    #: Batches and rows the connector accepted.
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
    #: The epoch begun and not yet pre-committed or rolled back, if any.
    open_epoch: int | None
    #: Pre-committed epochs waiting for their commit, oldest first.
    pre_committed: tuple[int, ...]
    #: The last epoch committed by this task (or by recovery); 0 before the first.
    committed_epoch: int
    #: Rollbacks run, and those that failed.
    rollbacks: int
    rollback_errors: int
    #: Whether the task has stopped.
    finished: bool


class TaskState:
    """The task's mutable state, shared with its handles (read-only for them)."""

    def __init__(self, name: str, exactly_once: bool) -> None:
        self.name = name
        self.exactly_once = exactly_once
        self.batches_written = 0
        self.rows_written = 0
        self.write_errors = 0
        self.poisoned = False
        self.flushes = 0
        self.flush_errors = 0
        self.stuck_flushes = 0
        self.last_begun: int | None = None
        self.open_epoch: int | None = None
        self.pre_committed: deque[int] = deque()
        self.committed_epoch = 0
        self.rollbacks = 0
        self.rollback_errors = 0
        self.finished = anyio.Event()

    def snapshot(self) -> SinkTaskStats:
        return SinkTaskStats(
            name=self.name,
            exactly_once=self.exactly_once,
            batches_written=self.batches_written,
            rows_written=self.rows_written,
            write_errors=self.write_errors,
            epoch_poisoned=self.poisoned,
            flushes=self.flushes,
            flush_errors=self.flush_errors,
            stuck_flushes=self.stuck_flushes,
            open_epoch=self.open_epoch,
            pre_committed=tuple(self.pre_committed),
            committed_epoch=self.committed_epoch,
            rollbacks=self.rollbacks,
            rollback_errors=self.rollback_errors,
            finished=self.finished.is_set(),
        )
