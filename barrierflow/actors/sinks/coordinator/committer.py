"""The sink side of a coordinator: the protocol a committer implements, and the schema change
a commit request may carry."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from barrierflow.actors.sinks.protocol import CommitMetadata

__all__ = ["CommitCoordinator", "SchemaChange"]

#: A schema change carried by a commit request (JSON-serializable, compared for equality).
SchemaChange = Mapping[str, Any]


@runtime_checkable
class CommitCoordinator(Protocol):
    """The sink side of a coordinator: turns the writers' metadata into one commit per epoch.

    Lifecycle: ``abort`` for each aborted epoch found at recovery, then ``init`` once, then per
    epoch either ``commit_data`` (single-phase) or ``pre_commit`` and later ``commit``
    (two-phase), in epoch order. ``commit`` may be called again for the same epoch after a
    failure or a crash, so it must be idempotent.
    """

    @property
    def two_phase(self) -> bool:
        """Whether commits wait for the epoch's checkpoint to be durable."""
        ...

    async def init(self, pending: Mapping[int, CommitMetadata | None]) -> None:
        """Prepare (load the table, ...) once per coordinator run, after aborting the aborted
        epochs. ``pending`` maps the epochs that will still be committed to their metadata:
        anything staged that none of them references is garbage of epochs that never reached
        the meta store, and may be deleted."""
        ...

    async def commit_data(self, epoch: int, metadatas: Sequence[CommitMetadata]) -> None:
        """Single-phase: commit every writer's metadata of ``epoch`` now."""
        ...

    async def pre_commit(
        self, epoch: int, metadatas: Sequence[CommitMetadata], schema_change: SchemaChange | None
    ) -> CommitMetadata | None:
        """Two-phase, phase 1: what to persist for ``epoch`` (``None``: nothing to commit)."""
        ...

    async def commit(
        self, epoch: int, metadata: CommitMetadata | None, schema_change: SchemaChange | None
    ) -> None:
        """Phase 2 (or a single-phase schema change): publish ``epoch``. Idempotent."""
        ...

    async def abort(self, epoch: int, metadata: CommitMetadata | None) -> None:
        """Discard what ``epoch`` staged (its rows will be replayed). Errors are logged."""
        ...
