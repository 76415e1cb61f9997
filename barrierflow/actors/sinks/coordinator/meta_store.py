"""The meta store of coordinated sinks: what each sink's coordinator pre-committed, per epoch.

A two-phase coordinator records an epoch as *pending* (with its commit metadata and schema
change) before it acknowledges the writers, marks it *committed* once the sink's commit went
through, and prunes older committed records. The state store marks *pending* epochs after the
last durable checkpoint *aborted* when it opens and before a recovery rebuilds the graph: their
rows will be replayed upstream, so the coordinator aborts them instead of committing.

Built on the state store's generic epoch records
(:class:`~barrierflow.runtime.state.epoch_records.EpochRecords`): this module gives them the
sink's meaning (the payload is the commit metadata, the extra value the schema change).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, final

from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.runtime.state.epoch_records import EpochRecord, RecordStatus
from barrierflow.runtime.state.state_store import StateStore

__all__ = ["SinkState", "SinkStateRecord", "SinkStates"]


class SinkState(enum.Enum):
    """Where a coordinated sink's epoch stands."""

    #: Pre-committed and acknowledged to the writers; committed once its checkpoint is durable.
    PENDING = "pending"
    #: The sink's commit went through.
    COMMITTED = "committed"
    #: Pending past the last durable checkpoint at a restart: aborted, its rows replayed.
    ABORTED = "aborted"


_FROM_STATUS = {
    RecordStatus.PENDING: SinkState.PENDING,
    RecordStatus.COMMITTED: SinkState.COMMITTED,
    RecordStatus.ABORTED: SinkState.ABORTED,
}


@final
@dataclass(frozen=True, slots=True)
class SinkStateRecord:
    """One epoch of a coordinated sink, as persisted."""

    epoch: int
    state: SinkState
    #: What the coordinator's pre-commit returned (JSON value), or ``None``.
    metadata: Any
    #: The schema change committed with the epoch (JSON value), or ``None``.
    schema_change: Any

    @classmethod
    def _of(cls, record: EpochRecord) -> SinkStateRecord:
        return cls(record.epoch, _FROM_STATUS[record.status], record.payload, record.extra)


@final
class SinkStates:
    """The meta-store records of coordinated sink ``sink`` in ``store``.

    Raises:
        InvalidArgumentError: ``store`` is not a StateStore, or ``sink`` not a non-empty str.
    """

    __slots__ = ("_records",)

    def __init__(self, store: StateStore, sink: str) -> None:
        if not isinstance(store, StateStore):
            raise InvalidArgumentError("store", "a StateStore", store)
        if not isinstance(sink, str) or not sink:
            raise InvalidArgumentError("sink", "a non-empty str", sink)
        self._records = store.epoch_records(sink)

    async def list(self) -> list[SinkStateRecord]:
        """Every record of the sink, ordered by epoch."""
        return [SinkStateRecord._of(record) for record in await self._records.list()]

    async def persist_pending(
        self, epoch: int, metadata: Any, schema_change: Any, *, committed: int | None = None
    ) -> None:
        """Record ``epoch`` as pre-committed and not yet committed — and, in the same
        transaction, epoch ``committed`` as committed (see :meth:`commit_and_prune`).

        Raises:
            InvalidArgumentError: ``metadata`` or ``schema_change`` is not JSON-serializable.
        """
        await self._records.add_pending(
            epoch, metadata, schema_change, committed=committed, names=("metadata", "schema_change")
        )

    async def commit_and_prune(self, epoch: int) -> None:
        """Mark ``epoch`` committed and delete the committed records before it."""
        await self._records.commit_and_prune(epoch)

    async def delete(self, epochs: Iterable[int]) -> None:
        """Delete the records of ``epochs`` (aborted epochs, once aborted)."""
        await self._records.delete(epochs)
