"""The sink connector contract: what a sink task drives, and in which order.

A :class:`SinkConnector` is owned by exactly one sink task (:mod:`.sink_task`), which calls it
from one task at a time — a connector needs no locks. Its life, per sink task:

1. :meth:`~SinkConnector.open` once, then :meth:`~SinkConnector.recover` once (before any
   epoch), with the epochs the sink pre-committed whose checkpoint is durable.
2. Per epoch: :meth:`~SinkConnector.begin_epoch`, any number of
   :meth:`~SinkConnector.write_batch` (and :meth:`~SinkConnector.flush` at any time, from the
   periodic flush), then :meth:`~SinkConnector.pre_commit` — or
   :meth:`~SinkConnector.rollback_epoch` instead if something failed. ``pre_commit`` is never
   called on a poisoned epoch (one where a write failed).
3. :meth:`~SinkConnector.commit_epoch` for pre-committed epochs, oldest first, once their
   checkpoint is durable. It may come after the next epoch has begun, so an exactly-once
   connector keeps a pre-committed epoch apart from the one being written.
4. :meth:`~SinkConnector.close` once, also after a failure; it must not commit anything.

Exactly-once connectors make ``commit_epoch`` idempotent (a commit replayed after a crash is a
no-op) and make ``recover`` bring them to a state where every epoch it lists is committed and
every other staged or pre-committed epoch is rolled back: the runtime replays the rows of
those from the upstream, so keeping them would duplicate rows, while the listed ones will
never be replayed, so dropping them would lose rows.

At-least-once connectors (``exactly_once = False``) may treat the epoch hooks as no-ops; after
a crash they see the rows since the last checkpoint again.

A method that raises fails only that operation: the sink task reports it (see the sink task
for which failures poison the epoch); the connector stays owned and may be called again.
Cancellation: a connector's methods may be cancelled (a periodic flush that overruns its
timeout, a runtime stopping); a cancelled call must leave the connector usable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, final, runtime_checkable

import pyarrow as pa

from barrierflow.channels.errors import InvalidArgumentError

__all__ = ["CommitMetadata", "PathChecked", "PendingCommit", "PositionRecorder", "SinkConnector"]

#: What ``pre_commit`` returns: JSON-serializable facts needed to commit the epoch (file
#: names, row counts, a transaction id). It is stored with the checkpoint, so keep it small.
CommitMetadata = Mapping[str, Any]


@final
@dataclass(frozen=True, slots=True)
class PendingCommit:
    """An epoch the sink pre-committed whose checkpoint is durable, handed to ``recover``.

    Attributes:
        epoch: the sink epoch (the one given to ``begin_epoch`` / ``pre_commit``).
        metadata: what ``pre_commit`` returned for it.
    """

    epoch: int
    metadata: CommitMetadata

    def __post_init__(self) -> None:
        if type(self.epoch) is not int or self.epoch < 0:
            raise InvalidArgumentError("epoch", "a non-negative int", self.epoch)
        if not isinstance(self.metadata, Mapping):
            raise InvalidArgumentError(
                "metadata", "a mapping (what pre_commit returned)", self.metadata
            )


@runtime_checkable
class SinkConnector(Protocol):
    """Where a sink's rows go. See the module docstring for the lifecycle contract."""

    @property
    def schema(self) -> pa.Schema:
        """The schema every written batch must have (field names, types and nullability)."""
        ...

    @property
    def exactly_once(self) -> bool:
        """Whether the epoch hooks give exactly-once delivery (else: at-least-once)."""
        ...

    async def open(self) -> None:
        """Acquire resources (directories, connections). Called once, first."""
        ...

    async def recover(self, pending: Sequence[PendingCommit]) -> None:
        """Commit every epoch of ``pending`` not committed yet (oldest first) and roll back
        every other epoch that is staged or pre-committed. Called once, after ``open``."""
        ...

    async def begin_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` (greater than every epoch begun before)."""
        ...

    async def write_batch(self, batch: pa.RecordBatch) -> None:
        """Write ``batch`` (already checked against :attr:`schema`) into the open epoch."""
        ...

    async def flush(self) -> None:
        """Push buffered rows towards storage. Not a commit: nothing becomes visible."""
        ...

    async def pre_commit(self, epoch: int) -> CommitMetadata:
        """Phase 1: make everything written in ``epoch`` durable but not visible."""
        ...

    async def commit_epoch(self, epoch: int) -> None:
        """Phase 2: make ``epoch`` visible, atomically; a no-op if it is already committed."""
        ...

    async def rollback_epoch(self, epoch: int) -> None:
        """Discard what ``epoch`` wrote (it was not, and will never be, committed)."""
        ...

    async def close(self) -> None:
        """Release resources. Called once, last, also after a failure; commits nothing."""
        ...


@runtime_checkable
class PositionRecorder(Protocol):
    """An exactly-once connector that records source positions with its commits (optional).

    The sink task calls :meth:`record_positions` for the open epoch right before
    ``pre_commit``; the connector puts them in what it commits **atomically with the rows**
    (a Parquet epoch record renamed with the files, an Iceberg snapshot's properties). After
    a loss of the runtime's state, those positions say which source batches the sink holds
    (see :mod:`barrierflow.runtime.positions`), and a commit of an epoch whose batches it holds
    already is skipped.
    """

    async def record_positions(
        self, epoch: int, start: Mapping[str, int], end: Mapping[str, int]
    ) -> None:
        """The rows of open epoch ``epoch`` come from the batches after ``start`` up to
        ``end`` (position key → batch id)."""
        ...


@runtime_checkable
class PathChecked(Protocol):
    """A connector writing files under a local path, which it checks before the graph starts
    (optional): a path that cannot be used is refused naming the sink, before any row flows,
    rather than failing ``open`` from inside the running graph."""

    def check_path(self, sink: str) -> None:
        """Make sure the path can be written (blocking, cheap: it may create the directory).

        Raises:
            SinkPathError: it cannot, naming ``sink``.
        """
        ...
