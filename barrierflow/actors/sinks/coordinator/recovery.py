"""Recovery: what a coordinator finds in the meta store when it starts.

Records are read in epoch order: the last *committed*, then a run of *pending*, then *aborted*
ones (the state store marked pending epochs after the last durable checkpoint aborted before
the coordinator starts). Aborted epochs are aborted in the committer (with their metadata) and
their records deleted; pending ones are committed once durable; the rewind epoch is the last
pending (else the last committed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from barrierflow.actors.sinks.coordinator.commit_queue import CommitItem
from barrierflow.actors.sinks.coordinator.meta_store import SinkState, SinkStateRecord, SinkStates
from barrierflow.actors.sinks.errors import SinkRecordsOrderError
from barrierflow.actors.sinks.table import Committer

__all__ = ["Recovered", "recover"]


@dataclass(frozen=True, slots=True)
class Recovered:
    """What a restart found."""

    #: Pre-committed epochs to commit once durable, in epoch order.
    pending: list[CommitItem]
    #: The last committed epoch, if any record says so.
    last_committed: int | None
    #: Epochs aborted (in the committer) and deleted.
    aborted: list[int]

    @property
    def rewind(self) -> int | None:
        """The last epoch acknowledged to writers before the restart."""
        return self.pending[-1].epoch if self.pending else self.last_committed


def _listing(records: list[SinkStateRecord]) -> list[tuple[int, str]]:
    return [(r.epoch, r.state.value) for r in records]


async def recover(sink: str, states: SinkStates, committer: Committer, log: Any) -> Recovered:
    """Read ``sink``'s records, abort the aborted epochs and delete the stale records.

    Raises:
        SinkRecordsOrderError: the records are not committed, then pending, then aborted.
    """
    records = await states.list()
    index = 0
    last_committed: int | None = None
    committed = [i for i, r in enumerate(records) if r.state is SinkState.COMMITTED]
    if committed:
        # Commits run in epoch order, so a committed mark covers every record before it:
        # pending ones there were committed too, only their marks were never written (each
        # commit is marked at once now, but an older run let a mark ride on the next pending
        # record, leaving epochs committed back to back unmarked).
        index = committed[-1] + 1
        last_committed = records[index - 1].epoch
        if any(r.state is SinkState.ABORTED for r in records[:index]):
            raise SinkRecordsOrderError(
                sink,
                f"no aborted record before the committed epoch {last_committed}",
                _listing(records),
            )
        await states.delete([r.epoch for r in records[: index - 1]])
    pending: list[CommitItem] = []
    while index < len(records) and records[index].state is SinkState.PENDING:
        r = records[index]
        rows = r.metadata.get("rows")
        rows = rows if type(rows) is int else 0
        pending.append(CommitItem(r.epoch, r.metadata, r.schema_change, rows))
        index += 1
    aborted: list[int] = []
    for record in records[index:]:
        if record.state is not SinkState.ABORTED:
            raise SinkRecordsOrderError(
                sink, "only aborted records after the pending ones", _listing(records)
            )
        try:
            await committer.abort(record.epoch, record.metadata)
        except Exception as exc:
            log.warning("abort failed", epoch=record.epoch, error=repr(exc))
        aborted.append(record.epoch)
    await states.delete(aborted)
    return Recovered(pending, last_committed, aborted)
