"""The durable state store: actors' key→value tables, made durable one checkpoint at a time.

Each actor owns :class:`StateTable`\\ s. Writes go to a buffer for the current epoch; at every
barrier the actor :meth:`~StateTable.seal`\\ s the buffer under that barrier's epoch. When a
checkpoint epoch has been collected by every actor, :meth:`StateStore.commit` writes every
table's sealed writes up to that epoch, and the new *committed epoch*, in **one** SQLite
transaction: after a crash the store holds exactly the state of the last committed checkpoint,
and epochs after it are gone as if they never happened.

Reads: a table sees its own buffered and sealed writes over the committed state
(:meth:`StateTable.get`); anyone else sees only committed state (:meth:`StateStore.read`).

SQLite runs in WAL mode with ``synchronous=FULL``: through aiosqlite on asyncio, and on one
worker thread on trio (:mod:`.sqlite_thread_backend`, one call at a time); the SQL itself is
in :mod:`._sql`.
A store file is locked (an OS lock on ``<file>.lock``, released even on SIGKILL) so a second
runtime cannot open it while one holds it; the lock is taken on the real file (symlinks and
``..`` resolved), so no other spelling of the path gets around it.

**A new store is created atomically**: built whole in a temporary file beside the target,
fsynced, renamed into place and its directory fsynced. A store file therefore either does not
exist (a new store) or is complete, and a damaged file is never mistaken for a new one — that
would replay from nothing and duplicate everything a sink already holds. **A damaged file**
(zero bytes, cut short, unreadable pages — SQLite's ``quick_check`` runs at open — or
missing or malformed metadata rows) raises :class:`~barrierflow.errors.StoreCorruptedError`;
**a foreign file** (not SQLite, or someone else's SQLite database) raises
:class:`~barrierflow.errors.StoreFormatError`. Neither changes the file, and a failed open
leaves nothing behind: no lock, no open file, no worker thread.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from types import TracebackType
from typing import Any, final

import anyio
import anyio.lowlevel
import anyio.to_thread

from barrierflow.channels.errors import EpochOrderError, InvalidArgumentError, ProtocolError
from barrierflow.runtime.state import _sql, _store_file
from barrierflow.runtime.state._store_file import Adapter
from barrierflow.runtime.state.errors import StoreCorruptedError
from barrierflow.runtime.state.sink_states import SinkStates

__all__ = ["CommittedEpochs", "StateStore", "StateTable"]

_DELETED: Any = object()


def _encode(value: Any) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError("value", "a JSON-serializable value", value) from exc


def _check_key(key: Any) -> str:
    if not isinstance(key, str):
        raise InvalidArgumentError("key", "a str", key)
    return key


def _check_names(**names: Any) -> None:
    for argument, value in names.items():
        if not isinstance(value, str) or not value:
            raise InvalidArgumentError(argument, "a non-empty str", value)


#: Epochs are stored as SQLite integers (signed 64-bit).
_MAX_EPOCH = 2**63 - 1


@final
class StateTable:
    """One actor's key→value table; values are JSON-serializable.

    Create with :meth:`StateStore.table`. Lifecycle per epoch: any number of :meth:`put` /
    :meth:`delete`, then :meth:`seal` at the barrier; durability comes with the store's
    :meth:`StateStore.commit` of a checkpoint at or after that epoch.
    """

    __slots__ = ("_last_sealed", "_name", "_owner", "_pending", "_sealed", "_store")

    def __init__(self, store: StateStore, owner: str, name: str) -> None:
        self._store = store
        self._owner = owner
        self._name = name
        # Writes are JSON text (or _DELETED), as they will be stored.
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
        self._pending[_check_key(key)] = _encode(value)

    def delete(self, key: str) -> None:
        """Remove ``key`` in the current epoch."""
        self._pending[_check_key(key)] = _DELETED

    def seal(self, epoch: int) -> None:
        """Close the current epoch's writes under ``epoch`` (call at each barrier).

        Raises:
            EpochOrderError: ``epoch`` is not greater than the last sealed or committed epoch.
        """
        last = max(self._last_sealed, self._store.committed_epoch)
        if type(epoch) is not int or not last < epoch <= _MAX_EPOCH:
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
        _check_key(key)
        for writes in self._overlay():
            if key in writes:
                value = writes[key]
                return default if value is _DELETED else json.loads(value)
        return await self._store.read(self._owner, self._name, key, default)

    async def items(self) -> dict[str, Any]:
        """Every key and value as this actor sees it."""
        merged = await self._store.read_all(self._owner, self._name)
        for writes in reversed(list(self._overlay())):
            for key, value in writes.items():
                if value is _DELETED:
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
class StateStore:
    """The durable store behind every actor's state and the committed epoch.

    Open with ``async with await StateStore.open(path) as store:`` (or :meth:`open` /
    :meth:`aclose`).
    """

    def __init__(
        self,
        path: str,
        connection: _sql.SqlConnection,
        lock: _store_file.StoreLock,
        committed_epoch: int,
    ) -> None:
        self._path = path
        self._connection = connection
        self._lock = lock
        self._committed = committed_epoch
        self._committed_changed = anyio.Event()
        self._tables: dict[tuple[str, str], StateTable] = {}
        self._closed = False
        self._committing = False

    @classmethod
    async def open(cls, path: str | os.PathLike[str], *, adapter: Adapter = "auto") -> StateStore:
        """Open the store at ``path`` and take its lock; a path that does not exist becomes a
        new, empty store (created atomically, with any missing parent directories).

        The path is resolved first (symlinks, ``..``, relative spellings): the lock is on the
        real file. The file work runs on a worker thread: directories, lock, header checks,
        creation, and the check of an existing store on a read-only connection — SQLite's
        ``quick_check`` reads every page once (time proportional to the file's size), so a
        damaged store fails here rather than at a later read, and is left as it was found.

        Args:
            path: the SQLite file, as a ``str`` or ``os.PathLike[str]`` (bytes are refused).
            adapter: ``"aiosqlite"`` (asyncio only), ``"thread"`` (any backend), or ``"auto"``:
                aiosqlite on asyncio, the dedicated thread otherwise.

        Cancellation: nothing is left behind — a cancelled open releases the lock and closes
        the connection (a store it was creating is either complete or absent).

        Raises:
            InvalidArgumentError: ``path`` is not a non-empty ``str`` or ``os.PathLike[str]``
                (``argument="path"``), or a bad ``adapter``.
            StorePathError: the path is a directory or not a regular file, or its parent
                directory cannot be created or is not writable (``argument="state_path"``).
            StoreLockedError: another runtime (in this process or another) holds the store.
            StoreCorruptedError: the file is a damaged store: empty, cut short, pages SQLite
                cannot read, or metadata rows missing or malformed.
            StoreFormatError: the file is not a barrierflow store.
            StoreVersionError: the store's schema is newer than this barrierflow.
            StoreIOError: the OS or SQLite failed otherwise (``__cause__`` says how).
        """
        file = _store_file.check_argument(path)
        if not isinstance(adapter, str) or adapter not in ("auto", "aiosqlite", "thread"):
            raise InvalidArgumentError("adapter", "'auto', 'aiosqlite' or 'thread'", adapter)
        prepared = await anyio.to_thread.run_sync(_store_file.prepare, file)
        try:
            with _store_file.sqlite_errors(prepared.path):
                connection = await _store_file.connect(prepared.path, adapter)
                try:
                    await _store_file.finish_open(connection, prepared)
                except BaseException:
                    await connection.close()
                    raise
        except BaseException:
            prepared.lock.release()
            raise
        typed = _store_file.TypedConnection(connection, prepared.path)
        return cls(prepared.path, typed, prepared.lock, prepared.committed)

    @property
    def path(self) -> str:
        """The store's real file: absolute, with symlinks and ``..`` resolved."""
        return self._path

    @property
    def committed_epoch(self) -> int:
        """The last durable checkpoint epoch (0 before the first)."""
        return self._committed

    @property
    def is_empty(self) -> bool:
        """Whether no checkpoint was ever committed in this store (its committed epoch is 0).

        A new store is empty; so is one whose runtimes never reached a checkpoint (actors'
        state and the job catalog only become durable with one). It says nothing about sink
        records (:meth:`sink_states`), which commit on their own.
        """
        return self._committed == 0

    def table(self, owner: str, name: str) -> StateTable:
        """The table ``name`` of actor ``owner``; each may be opened once per store.

        Raises:
            InvalidArgumentError: empty names, or the table is already open.
        """
        _check_names(owner=owner, name=name)
        if (owner, name) in self._tables:
            raise InvalidArgumentError("name", "a table not opened yet", f"{owner}/{name}")
        table = StateTable(self, owner, name)
        self._tables[owner, name] = table
        return table

    async def read(self, owner: str, name: str, key: str, default: Any = None) -> Any:
        """The committed value of ``key`` in ``owner``'s table ``name``.

        Raises:
            InvalidArgumentError: ``owner`` or ``name`` is not a non-empty str, or ``key`` not
                a str.
        """
        _check_names(owner=owner, name=name)
        rows = await self._connection.fetchall(_sql.GET, (owner, name, _check_key(key)))
        return self._decode(owner, name, rows[0][0]) if rows else default

    async def read_all(self, owner: str, name: str) -> dict[str, Any]:
        """Every committed key and value of ``owner``'s table ``name``.

        Raises:
            InvalidArgumentError: ``owner`` or ``name`` is not a non-empty str.
        """
        _check_names(owner=owner, name=name)
        rows = await self._connection.fetchall(_sql.SCAN, (owner, name))
        return {key: self._decode(owner, name, value) for key, value in rows}

    def _decode(self, owner: str, name: str, value: Any) -> Any:
        try:
            return json.loads(value)
        except (TypeError, ValueError) as exc:
            raise StoreCorruptedError(
                self._path, f"a value of table {owner}/{name} that is not JSON ({exc})"
            ) from exc

    async def commit(self, epoch: int) -> None:
        """Make every table's writes sealed up to ``epoch`` durable, with ``epoch`` as the new
        committed epoch, in one transaction; then publish it to subscribers.

        Cancellation: shielded — the transaction, once started, completes.

        Raises:
            EpochOrderError: ``epoch`` is not greater than the committed epoch.
        """
        if self._committing:
            raise ProtocolError(
                f"state store {self._path!r}: expected one checkpoint commit at a time, got a "
                f"commit of epoch {epoch} while another is running"
            )
        self._committing = True
        try:
            if type(epoch) is not int or not self._committed < epoch <= _MAX_EPOCH:
                raise EpochOrderError("epoch", self._committed, epoch)
            upserts: list[tuple[str, str, str, str]] = []
            deletes: list[tuple[str, str, str]] = []
            for (owner, name), table in self._tables.items():
                for key, value in table._take_through(epoch).items():
                    if value is _DELETED:
                        deletes.append((owner, name, key))
                    else:
                        upserts.append((owner, name, key, value))
            await self._connection.transaction(_sql.checkpoint_statements(upserts, deletes, epoch))
            for table in self._tables.values():
                table._drop_through(epoch)
            self._committed = epoch
            changed, self._committed_changed = self._committed_changed, anyio.Event()
            changed.set()
        finally:
            self._committing = False

    def committed_epochs(self) -> CommittedEpochs:
        """The committed epoch now, then each newer one as it is published.

        A slow subscriber sees the latest epoch, never an older one, and may skip some in
        between (each value is a high-water mark). Iteration ends when the store closes.
        """
        return CommittedEpochs(self)

    def sink_states(self, sink: str) -> SinkStates:
        """The meta-store records of coordinated sink ``sink`` (see :mod:`.sink_states`).

        Raises:
            InvalidArgumentError: ``sink`` is not a non-empty str.
        """
        _check_names(sink=sink)
        return SinkStates(self._connection, sink)

    async def abort_sink_epochs_after_committed(self) -> None:
        """Mark every *pending* sink epoch after the committed epoch *aborted*: the upstream
        replays its rows. Runs at open, and before recovery rebuilds a graph."""
        await self._connection.transaction(
            [_sql.Statement(_sql.SINK_ABORT_AFTER, [(self._committed,)])]
        )

    def discard_uncommitted(self) -> None:
        """Forget every table's writes that are not durable (recovery rewinds to committed)."""
        for table in self._tables.values():
            table._discard_uncommitted()

    def release_tables(self) -> None:
        """Discard uncommitted writes and close every table, so a rebuilt graph can reopen
        them (recovery)."""
        self.discard_uncommitted()
        self._tables.clear()

    async def aclose(self) -> None:
        """Close the connection and release the lock; unsealed and uncommitted writes are lost.

        Cancellation: the close is shielded, with a deadline (see the adapters); the lock is
        released whatever happens.
        """
        if self._closed:
            return
        self._closed = True
        self._committed_changed.set()
        try:
            await self._connection.close()
        finally:
            self._lock.release()

    async def __aenter__(self) -> StateStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


@final
class CommittedEpochs:
    """An async iterator over a store's committed epochs (see
    :meth:`StateStore.committed_epochs`). A plain iterator, not an async generator, so
    breaking out of ``async for`` needs no finalization on any backend."""

    __slots__ = ("_seen", "_store")

    def __init__(self, store: StateStore) -> None:
        self._store = store
        self._seen = -1

    def __aiter__(self) -> CommittedEpochs:
        return self

    async def __anext__(self) -> int:
        store = self._store
        while not store._closed:
            if store._committed > self._seen:
                self._seen = store._committed
                await anyio.lowlevel.checkpoint()
                return self._seen
            await store._committed_changed.wait()
        raise StopAsyncIteration
