"""The durable state store: actors' key→value tables, made durable one checkpoint at a time.

Each actor owns :class:`StateTable`\\ s. Writes go to a buffer for the current epoch; at every
barrier the actor :meth:`~StateTable.seal`\\ s the buffer under that barrier's epoch. When a
checkpoint epoch has been collected by every actor, :meth:`StateStore.commit` writes every
table's sealed writes up to that epoch, and the new *committed epoch*, in **one** SQLite
transaction: after a crash the store holds exactly the state of the last committed checkpoint,
and epochs after it are gone as if they never happened.

Reads: a table sees its own buffered and sealed writes over the committed state
(:meth:`StateTable.get`); anyone else sees only committed state (:meth:`StateStore.read`).

**Versioned tables** (:mod:`.versioned_table`, a materialized view's rows by epoch) keep their
rows in Arrow segment files beside the store; the same checkpoint transaction records which
files hold them, so they are durable in the same one step as every other table.

SQLite runs in WAL mode with ``synchronous=FULL`` through :mod:`.sqlite_thread_backend` on both
backends (one call at a time on a worker thread; a checkpoint-sized commit inline on the event
loop's thread, where no busy loop can starve it of the GIL), or aiosqlite on asyncio if asked;
the SQL itself is in :mod:`._sql`.
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
from collections.abc import Sequence
from types import TracebackType
from typing import Any, final

import anyio
import anyio.lowlevel
import anyio.to_thread
import pyarrow as pa

from barrierflow._fs import check_path_argument
from barrierflow._sync import Notifier
from barrierflow.channels.errors import EpochOrderError, InvalidArgumentError
from barrierflow.channels.vnode import DEFAULT_VNODE_COUNT
from barrierflow.runtime.state import _sql, _store_file
from barrierflow.runtime.state._store_file import Adapter
from barrierflow.runtime.state.committed_epochs import CommittedEpochs
from barrierflow.runtime.state.epoch_records import EpochRecords
from barrierflow.runtime.state.errors import ConcurrentCommitError, StoreCorruptedError
from barrierflow.runtime.state.table import DELETED, MAX_EPOCH, StateTable, check_key
from barrierflow.runtime.state.versioned_checks import check_options
from barrierflow.runtime.state.versioned_table import VersionedTable, table_directory

__all__ = ["CommittedEpochs", "StateStore", "StateTable", "VersionedTable"]


def _check_names(**names: Any) -> None:
    for argument, value in names.items():
        if not isinstance(value, str) or not value:
            raise InvalidArgumentError(argument, "a non-empty str", value)


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
        self._committed_changed = Notifier()
        self._tables: dict[tuple[str, str], StateTable] = {}
        self._versioned: dict[tuple[str, str], VersionedTable] = {}
        self._closed = False
        # The epoch whose commit is running (one at a time).
        self._committing: int | None = None
        self._rows_written = 0

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        adapter: Adapter = "auto",
        limiter: anyio.CapacityLimiter | None = None,
    ) -> StateStore:
        """Open the store at ``path`` and take its lock; a path that does not exist becomes a
        new, empty store (created atomically, with any missing parent directories).

        The path is resolved first (symlinks, ``..``, relative spellings): the lock is on the
        real file. The file work runs on a worker thread: directories, lock, header checks,
        creation, and the check of an existing store on a read-only connection — SQLite's
        ``quick_check`` reads every page once (time proportional to the file's size), so a
        damaged store fails here rather than at a later read, and is left as it was found.

        Args:
            path: the SQLite file, as a ``str`` or ``os.PathLike[str]`` (bytes are refused).
            adapter: ``"aiosqlite"`` (asyncio only), ``"thread"`` (any backend), or ``"auto"``
                (``"thread"``: see :data:`.sqlite_thread_backend.INLINE_ROWS` for why).
            limiter: the worker threads' limiter for every blocking call of the store (the file
                work here, and each SQL call of the ``"thread"`` adapter) — the runtime passes
                its own, so the store's threads count against the runtime's budget; ``None``:
                anyio's default limiter. aiosqlite runs on its own thread and ignores it.

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
        file = check_path_argument(path)
        if not isinstance(adapter, str) or adapter not in ("auto", "aiosqlite", "thread"):
            raise InvalidArgumentError("adapter", "'auto', 'aiosqlite' or 'thread'", adapter)
        if limiter is not None and not isinstance(limiter, anyio.CapacityLimiter):
            raise InvalidArgumentError("limiter", "None or an anyio.CapacityLimiter", limiter)
        # Not abandoned on cancel: the thread holds the lock it takes until it returns it.
        prepared = await anyio.to_thread.run_sync(_store_file.prepare, file, limiter=limiter)
        try:
            with _store_file.sqlite_errors(prepared.path):
                connection = await _store_file.connect(prepared.path, adapter, limiter)
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
        state and the job catalog only become durable with one). It says nothing about epoch
        records (:meth:`epoch_records`), which commit on their own.
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

    async def versioned_table(
        self,
        owner: str,
        name: str,
        *,
        schema: pa.Schema,
        primary_key: Sequence[str],
        distribution_key: Sequence[str] | None = None,
        vnode_count: int = DEFAULT_VNODE_COUNT,
        compact_after: int = 32,
    ) -> VersionedTable:
        """Open ``owner``'s versioned table ``name`` (see :mod:`.versioned_table`): its
        committed versions as the manifest lists them; a new one is empty. Each may be opened
        once per store; others read it through :meth:`versioned`.

        Args:
            schema: the rows' schema; the key columns must be declared not nullable.
            primary_key: the key columns (unique per row of a version).
            distribution_key: the columns hashed to a row's vnode (default: the primary key;
                it must be what the owner's input is hash-dispatched by).
            vnode_count: the number of vnodes.
            compact_after: durable deltas kept before a checkpoint folds them into the base.

        Raises:
            InvalidArgumentError: empty names, the table already open, a schema that is not a
                pyarrow Schema, key columns missing or nullable, or a bad count.
            SchemaMismatchError: the table's files hold another schema.
        """
        _check_names(owner=owner, name=name)
        if (owner, name) in self._versioned:
            raise InvalidArgumentError("name", "a table not opened yet", f"{owner}/{name}")
        key, dist = check_options(schema, primary_key, distribution_key, vnode_count, compact_after)
        directory = table_directory(self._path, owner, name)
        table = VersionedTable(
            self, owner, name, directory, schema, key, dist, vnode_count, compact_after
        )
        segments = await self._connection.fetchall(_sql.SEGMENTS, (owner, name))
        await anyio.to_thread.run_sync(table._load, segments)
        self._versioned[owner, name] = table
        return table

    def versioned(self, owner: str, name: str) -> VersionedTable:
        """The versioned table ``name`` its owner has opened (for readers in this process).

        Raises:
            InvalidArgumentError: no such table is open.
        """
        table = self._versioned.get((owner, name))
        if table is None:
            raise InvalidArgumentError(
                "table",
                f"one of the open versioned tables {sorted(self._versioned)}",
                (owner, name),
            )
        return table

    def versioned_group(self, owner: str, name: str) -> list[VersionedTable]:
        """The open versioned tables ``name`` of actor ``owner`` or of the actors of its
        parallel group (``owner.0``, ``owner.1``, …), in name order (maybe none)."""
        return [
            table
            for (o, n), table in sorted(self._versioned.items())
            if n == name and (o == owner or o.rpartition(".")[0] == owner)
        ]

    async def read(self, owner: str, name: str, key: str, default: Any = None) -> Any:
        """The committed value of ``key`` in ``owner``'s table ``name``.

        Raises:
            InvalidArgumentError: ``owner`` or ``name`` is not a non-empty str, or ``key`` not
                a str.
        """
        _check_names(owner=owner, name=name)
        rows = await self._connection.fetchall(_sql.GET, (owner, name, check_key(key)))
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
            ConcurrentCommitError: another commit is still running.
            StoreIOError: SQLite or the OS failed, or the commit outlived its deadline
                (``__cause__`` a :class:`TimeoutError`: its outcome is unknown, and the store
                refuses every later call — reopen it).
        """
        if self._committing is not None:
            raise ConcurrentCommitError(self._path, epoch, self._committing)
        self._committing = epoch
        try:
            if type(epoch) is not int or not self._committed < epoch <= MAX_EPOCH:
                raise EpochOrderError("epoch", self._committed, epoch)
            upserts: list[tuple[str, str, str, str]] = []
            deletes: list[tuple[str, str, str]] = []
            for (owner, name), table in self._tables.items():
                for key, value in table._take_through(epoch).items():
                    if value is DELETED:
                        deletes.append((owner, name, key))
                    else:
                        upserts.append((owner, name, key, value))
            self._rows_written += len(upserts) + len(deletes)
            statements = _sql.checkpoint_statements(upserts, deletes, epoch)
            for versioned in self._versioned.values():
                statements += await versioned._persist_through(epoch)
            await self._connection.transaction(statements)
            for table in self._tables.values():
                table._drop_through(epoch)
            for versioned in self._versioned.values():
                versioned._committed_through(epoch)
            self._committed = epoch
            self._committed_changed.notify()
            for versioned in self._versioned.values():
                through = versioned._fold_through(epoch)
                if through is not None:
                    await versioned._compact(through, self._connection.transaction)
        finally:
            self._committing = None

    @property
    def rows_written(self) -> int:
        """State rows (upserts and deletes of the key-value tables) checkpoints have written
        since the store was opened."""
        return self._rows_written

    def committed_epochs(self) -> CommittedEpochs:
        """The committed epoch now, then each newer one as it is published.

        A slow subscriber sees the latest epoch, never an older one, and may skip some in
        between (each value is a high-water mark). Iteration ends when the store closes.
        """
        return CommittedEpochs(
            lambda: None if self._closed else self._committed, self._committed_changed
        )

    def epoch_records(self, owner: str) -> EpochRecords:
        """The epoch records of ``owner`` (see :mod:`.epoch_records`), which commit on their
        own, not with checkpoints.

        Raises:
            InvalidArgumentError: ``owner`` is not a non-empty str.
        """
        _check_names(owner=owner)
        return EpochRecords(self._connection, owner)

    async def abort_epoch_records_after_committed(self) -> None:
        """Mark every owner's *pending* epoch record after the committed epoch *aborted*: the
        upstream replays those epochs. Runs at open, and before recovery rebuilds a graph."""
        await self._connection.transaction(
            [_sql.Statement(_sql.SINK_ABORT_AFTER, [(self._committed,)])]
        )

    def discard_uncommitted(self) -> None:
        """Forget every table's writes that are not durable (recovery rewinds to committed)."""
        for table in self._tables.values():
            table._discard_uncommitted()
        for versioned in self._versioned.values():
            versioned._discard_uncommitted(self._committed)

    def release_tables(self) -> None:
        """Discard uncommitted writes and close every table, so a rebuilt graph can reopen
        them (recovery)."""
        self.discard_uncommitted()
        self._tables.clear()
        self._versioned.clear()

    async def aclose(self) -> None:
        """Close the connection and release the lock; unsealed and uncommitted writes are lost.

        Cancellation: the close is shielded, with a deadline (see the adapters); the lock is
        released whatever happens.
        """
        if self._closed:
            return
        self._closed = True
        self._committed_changed.notify()
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
