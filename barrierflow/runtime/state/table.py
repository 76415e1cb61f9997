"""One actor's state table: its writes buffered per epoch, sealed at each barrier, and made
durable by the store's checkpoint commit.

A table sees its own buffered and sealed writes over the committed state
(:meth:`StateTable.get`); the :class:`~barrierflow.runtime.StateStore` owns the committed
state and takes each table's sealed writes into a checkpoint (:meth:`StateTable._take_through`).
Kept apart from the store because it is pure in-memory bookkeeping: no SQL, no file.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Protocol, final

from barrierflow.channels.errors import EpochOrderError, InvalidArgumentError

__all__ = ["CommittedState", "ReadOnlyTable", "StateTable"]


class CommittedState(Protocol):
    """What a table reads through: the committed epoch and the committed rows of every
    table (the :class:`~barrierflow.runtime.StateStore` that owns it)."""

    @property
    def committed_epoch(self) -> int:
        """The last committed epoch (0: none)."""
        ...

    async def read(self, owner: str, name: str, key: str, default: Any = None) -> Any:
        """The committed value of ``key`` in ``owner``'s table ``name``."""
        ...

    async def read_all(self, owner: str, name: str) -> dict[str, Any]:
        """Every committed key and value of ``owner``'s table ``name``."""
        ...


#: Marks a deleted key among a table's buffered writes.
DELETED: Any = object()


def encode(value: Any) -> str:
    """``value`` as the JSON text the store keeps (validated once, when written)."""
    try:
        return json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError("value", "a JSON-serializable value", value) from exc


def check_key(key: Any) -> str:
    """``key``, if it is a str (the store's keys are text)."""
    if not isinstance(key, str):
        raise InvalidArgumentError("key", "a str", key)
    return key


#: Epochs are stored as SQLite integers (signed 64-bit).
MAX_EPOCH = 2**63 - 1


@final
class StateTable:
    """One actor's key→value table; values are JSON-serializable.

    Create with :meth:`StateStore.table`. Lifecycle per epoch: any number of :meth:`put` /
    :meth:`delete`, then :meth:`seal` at the barrier; durability comes with the store's
    :meth:`StateStore.commit` of a checkpoint at or after that epoch.

    **One rule: reads are awaited, writes are not.** :meth:`get` and :meth:`items` may read
    the committed state from the store's file, so they are ``async``
    (``await table.items()``); :meth:`put` and :meth:`delete` only buffer the write in memory
    until the barrier seals it, so they are plain calls. :class:`ReadOnlyTable` follows the
    same rule.
    """

    __slots__ = ("_last_sealed", "_name", "_owner", "_pending", "_sealed", "_store")

    def __init__(self, store: CommittedState, owner: str, name: str) -> None:
        self._store = store
        self._owner = owner
        self._name = name
        # Writes are JSON text (or DELETED), as they will be stored.
        self._pending: dict[str, Any] = {}
        # (epoch, writes) in epoch order, sealed but not yet durable.
        self._sealed: list[tuple[int, dict[str, Any]]] = []
        self._last_sealed = store.committed_epoch

    @property
    def owner(self) -> str:
        """The owning actor's name."""
        return self._owner

    @property
    def name(self) -> str:
        """The table's name within its owner."""
        return self._name

    def put(self, key: str, value: Any) -> None:
        """Set ``key`` to ``value`` in the current epoch.

        Raises:
            InvalidArgumentError: ``key`` is not a str or ``value`` is not JSON-serializable.
        """
        # Kept encoded: validated once here, written as is by the checkpoint.
        self._pending[check_key(key)] = encode(value)

    def delete(self, key: str) -> None:
        """Remove ``key`` in the current epoch."""
        self._pending[check_key(key)] = DELETED

    def seal(self, epoch: int) -> None:
        """Close the current epoch's writes under ``epoch`` (call at each barrier).

        Raises:
            EpochOrderError: ``epoch`` is not greater than the last sealed or committed epoch.
        """
        last = max(self._last_sealed, self._store.committed_epoch)
        if type(epoch) is not int or not last < epoch <= MAX_EPOCH:
            raise EpochOrderError("epoch", last, epoch)
        self._last_sealed = epoch
        if self._pending:
            self._sealed.append((epoch, self._pending))
            self._pending = {}

    def _overlay(self) -> Iterator[dict[str, Any]]:
        yield self._pending
        for _, writes in reversed(self._sealed):
            yield writes

    async def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key`` as this actor sees it: its own writes over committed state."""
        check_key(key)
        for writes in self._overlay():
            if key in writes:
                value = writes[key]
                return default if value is DELETED else json.loads(value)
        return await self._store.read(self._owner, self._name, key, default)

    async def items(self) -> dict[str, Any]:
        """Every key and value as this actor sees it."""
        merged = await self._store.read_all(self._owner, self._name)
        for writes in reversed(list(self._overlay())):
            for key, value in writes.items():
                if value is DELETED:
                    merged.pop(key, None)
                else:
                    merged[key] = json.loads(value)
        return merged

    def _take_through(self, epoch: int) -> dict[str, Any]:
        """Merge the sealed writes up to ``epoch`` (for the store's commit)."""
        merged: dict[str, Any] = {}
        for sealed_epoch, writes in self._sealed:
            if sealed_epoch <= epoch:
                merged.update(writes)
        return merged

    def _drop_through(self, epoch: int) -> None:
        self._sealed = [(e, w) for e, w in self._sealed if e > epoch]

    def _discard_uncommitted(self) -> None:
        self._pending = {}
        self._sealed = []
        self._last_sealed = self._store.committed_epoch


@final
class ReadOnlyTable:
    """Another actor's state table as of the last checkpoint (reads only)."""

    __slots__ = ("_name", "_owner", "_store")

    def __init__(self, store: CommittedState, owner: str, name: str) -> None:
        self._store = store
        self._owner = owner
        self._name = name

    @property
    def owner(self) -> str:
        """The owning actor's name."""
        return self._owner

    @property
    def name(self) -> str:
        """The table's name within its owner."""
        return self._name

    async def get(self, key: str, default: Any = None) -> Any:
        """The committed value of ``key`` (``default`` if absent)."""
        return await self._store.read(self._owner, self._name, key, default)

    async def items(self) -> dict[str, Any]:
        """Every committed key and value."""
        return await self._store.read_all(self._owner, self._name)
