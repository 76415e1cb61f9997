"""The meta store of coordinated sinks: what each sink's coordinator pre-committed, per epoch.

A two-phase coordinator records an epoch as *pending* (with its commit metadata and schema
change) before it acknowledges the writers, marks it *committed* once the sink's commit went
through, and prunes older committed records. The runtime marks *pending* epochs after the last
durable checkpoint *aborted* when it opens the store and before a recovery rebuilds the graph:
their rows will be replayed upstream, so the coordinator aborts them instead of committing.

Records live in the runtime's SQLite store (table ``bf_sink_state``), each change in its own
transaction — they are not part of checkpoints.
"""

from __future__ import annotations

import builtins
import enum
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, final

from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.runtime.state import _sql

__all__ = ["SinkState", "SinkStateRecord", "SinkStates"]


class SinkState(enum.Enum):
    """Where a coordinated sink's epoch stands."""

    PENDING = "pending"
    COMMITTED = "committed"
    ABORTED = "aborted"


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


def _json(argument: str, value: Any) -> str | None:
    if value is None:
        return None
    try:
        return json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(argument, "a JSON-serializable value", value) from exc


@final
class SinkStates:
    """The records of one sink. Get one with ``StateStore.sink_states(sink)``."""

    __slots__ = ("_connection", "_sink")

    def __init__(self, connection: _sql.SqlConnection, sink: str) -> None:
        if not isinstance(sink, str) or not sink:
            raise InvalidArgumentError("sink", "a non-empty str", sink)
        self._connection = connection
        self._sink = sink

    async def list(self) -> list[SinkStateRecord]:
        """Every record of the sink, ordered by epoch."""
        rows = await self._connection.fetchall(_sql.SINK_STATES, (self._sink,))
        return [
            SinkStateRecord(
                epoch,
                SinkState(state),
                None if metadata is None else json.loads(metadata),
                None if change is None else json.loads(change),
            )
            for epoch, state, metadata, change in rows
        ]

    async def persist_pending(
        self, epoch: int, metadata: Any, schema_change: Any, *, committed: int | None = None
    ) -> None:
        """Record ``epoch`` as pre-committed and not yet committed — and, in the same
        transaction, epoch ``committed`` as committed (see :meth:`commit_and_prune`)."""
        row = (
            self._sink,
            epoch,
            _json("metadata", metadata),
            _json("schema_change", schema_change),
        )
        statements = [] if committed is None else self._commit_statements(committed)
        statements.append(_sql.Statement(_sql.SINK_PENDING, [row]))
        await self._connection.transaction(statements)

    def _commit_statements(self, epoch: int) -> builtins.list[_sql.Statement]:
        return [
            _sql.Statement(_sql.SINK_COMMITTED, [(self._sink, epoch)]),
            _sql.Statement(_sql.SINK_PRUNE, [(self._sink, epoch)]),
        ]

    async def commit_and_prune(self, epoch: int) -> None:
        """Mark ``epoch`` committed and delete the committed records before it."""
        await self._connection.transaction(self._commit_statements(epoch))

    async def delete(self, epochs: Iterable[int]) -> None:
        """Delete the records of ``epochs`` (aborted epochs, once aborted)."""
        rows = [(self._sink, epoch) for epoch in epochs]
        if rows:
            await self._connection.transaction([_sql.Statement(_sql.SINK_DELETE, rows)])
