"""Epoch records: small per-owner records, keyed by epoch, that commit on their own.

A service that commits to the outside world in two phases (a coordinated sink) records each
epoch as *pending* (with two JSON payloads) before it acts on it, marks it *committed* once the
outside commit went through, and prunes older committed records. What a record *means* is the
owner's business (see :mod:`barrierflow.actors.sinks.coordinator.meta_store`); the store owns
one rule, because only it knows what is durable: when it reopens, and before a recovery
rebuilds the graph, every *pending* record after the last durable checkpoint becomes *aborted*
(:meth:`~barrierflow.runtime.StateStore.abort_epoch_records_after_committed`) — the
upstream replays those epochs, so their owner must abort them instead of committing.

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

__all__ = ["EpochRecord", "EpochRecords", "RecordStatus"]


class RecordStatus(enum.Enum):
    """Where an epoch record stands."""

    #: Recorded, not committed yet.
    PENDING = "pending"
    #: Its owner's commit went through.
    COMMITTED = "committed"
    #: Pending after the last durable checkpoint when the store reopened: never to be committed.
    ABORTED = "aborted"


@final
@dataclass(frozen=True, slots=True)
class EpochRecord:
    """One epoch of one owner, as persisted."""

    epoch: int
    status: RecordStatus
    #: The owner's first JSON value (``None`` if it stored none).
    payload: Any
    #: The owner's second JSON value (``None`` if it stored none).
    extra: Any


def _json(argument: str, value: Any) -> str | None:
    if value is None:
        return None
    try:
        return json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(argument, "a JSON-serializable value", value) from exc


@final
class EpochRecords:
    """The records of one owner. Get one with ``StateStore.epoch_records(owner)``."""

    __slots__ = ("_connection", "_owner")

    def __init__(self, connection: _sql.SqlConnection, owner: str) -> None:
        if not isinstance(owner, str) or not owner:
            raise InvalidArgumentError("owner", "a non-empty str", owner)
        self._connection = connection
        self._owner = owner

    @property
    def owner(self) -> str:
        """Whose records these are."""
        return self._owner

    async def list(self) -> list[EpochRecord]:
        """Every record of the owner, ordered by epoch."""
        rows = await self._connection.fetchall(_sql.SINK_STATES, (self._owner,))
        return [
            EpochRecord(
                epoch,
                RecordStatus(status),
                None if payload is None else json.loads(payload),
                None if extra is None else json.loads(extra),
            )
            for epoch, status, payload, extra in rows
        ]

    async def add_pending(
        self,
        epoch: int,
        payload: Any,
        extra: Any,
        *,
        committed: int | None = None,
        names: tuple[str, str] = ("payload", "extra"),
    ) -> None:
        """Record ``epoch`` as pending — and, in the same transaction, epoch ``committed`` as
        committed (see :meth:`commit_and_prune`).

        Args:
            names: what the caller calls ``payload`` and ``extra``, for errors.

        Raises:
            InvalidArgumentError: ``payload`` or ``extra`` is not JSON-serializable.
        """
        row = (self._owner, epoch, _json(names[0], payload), _json(names[1], extra))
        statements = [] if committed is None else self._commit_statements(committed)
        statements.append(_sql.Statement(_sql.SINK_PENDING, [row]))
        await self._connection.transaction(statements)

    def _commit_statements(self, epoch: int) -> builtins.list[_sql.Statement]:
        return [
            _sql.Statement(_sql.SINK_COMMITTED, [(self._owner, epoch)]),
            _sql.Statement(_sql.SINK_PRUNE, [(self._owner, epoch)]),
        ]

    async def commit_and_prune(self, epoch: int) -> None:
        """Mark ``epoch`` committed and delete the committed records before it."""
        await self._connection.transaction(self._commit_statements(epoch))

    async def delete(self, epochs: Iterable[int]) -> None:
        """Delete the records of ``epochs``."""
        rows = [(self._owner, epoch) for epoch in epochs]
        if rows:
            await self._connection.transaction([_sql.Statement(_sql.SINK_DELETE, rows)])
