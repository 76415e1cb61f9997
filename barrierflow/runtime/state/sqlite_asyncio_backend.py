"""The state store's SQLite adapter for asyncio: aiosqlite runs the SQL of :mod:`._sql`.

aiosqlite runs every call of a connection on the connection's own thread, in order. Reads are
not shielded: a cancelled reader stops waiting at once (the query still runs on the thread, and
its rows are dropped). Transactions are shielded once they hold the connection, with a deadline
(:data:`~._sql.COMMIT_TIMEOUT`); closing is shielded with a deadline
(:data:`~._sql.CLOSE_TIMEOUT`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import aiosqlite
import anyio
import structlog

from barrierflow.runtime.state import _sql
from barrierflow.runtime.state._sql import PRAGMAS, Statement


class AiosqliteConnection:
    """A :class:`~barrierflow.runtime.state._sql.SqlConnection` over one aiosqlite connection."""

    def __init__(self, connection: aiosqlite.Connection) -> None:
        self._connection = connection
        self._closed = False
        # Set when a transaction outlived its deadline: its outcome is unknown.
        self._broken = False
        # A transaction is several calls on the one connection: without this lock a second
        # caller (a coordinator's meta-store write during a checkpoint commit) would BEGIN
        # inside the first one's transaction, or read its uncommitted rows.
        self._lock = asyncio.Lock()

    @classmethod
    async def open(cls, path: str) -> AiosqliteConnection:
        """Connect in autocommit mode (transactions are explicit) and apply the pragmas.

        On any failure (a file SQLite cannot read, cancellation) the connection and its worker
        thread are closed before the error propagates: a thread left running would keep the
        process from exiting.
        """
        connection = await aiosqlite.connect(path, isolation_level=None)
        try:
            for pragma in PRAGMAS:
                await connection.execute(pragma)
        except BaseException:
            await _close(connection)
            raise
        return cls(connection)

    def _check_usable(self) -> None:
        if self._broken:
            raise _sql.commit_timed_out()

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run a query; not shielded (one call on aiosqlite's thread, so a cancelled caller
        leaves no cursor half-read)."""
        self._check_usable()
        async with self._lock:
            rows = await self._connection.execute_fetchall(sql, params)
        return [tuple(row) for row in rows]

    async def transaction(self, statements: Sequence[Statement]) -> None:
        """Apply ``statements`` atomically; shielded once it holds the connection, for at most
        :data:`~._sql.COMMIT_TIMEOUT` seconds.

        Raises:
            TimeoutError: the deadline passed (outcome unknown; the connection is now unusable).
        """
        self._check_usable()
        async with self._lock:
            # Shielded once it holds the connection: a cancelled caller must not leave a
            # transaction half-open on the thread.
            with anyio.move_on_after(_sql.COMMIT_TIMEOUT, shield=True):
                await self._apply(statements)
                return
            self._broken = True
            raise _sql.commit_timed_out()

    async def _apply(self, statements: Sequence[Statement]) -> None:
        await self._connection.execute("BEGIN IMMEDIATE")
        try:
            for statement in statements:
                if statement.rows:
                    await self._connection.executemany(statement.sql, statement.rows)
            await self._connection.execute("COMMIT")
        except Exception:
            # SQLite has already rolled back after some errors (a full disk, an I/O error);
            # a second ROLLBACK would fail and hide the original error. (A deadline that
            # cancels this scope leaves the transaction to the thread: the connection is
            # marked unusable instead.)
            if self._connection.in_transaction:
                await self._connection.execute("ROLLBACK")
            raise

    async def close(self) -> None:
        """Close the connection (idempotent); shielded for at most
        :data:`~._sql.CLOSE_TIMEOUT` seconds."""
        if not self._closed:
            self._closed = True
            await _close(self._connection)


async def _close(connection: aiosqlite.Connection) -> None:
    with anyio.move_on_after(_sql.CLOSE_TIMEOUT, shield=True) as scope:
        await connection.close()
    if scope.cancelled_caught:
        structlog.get_logger("barrierflow.state_store").warning(
            "state store connection did not close in time; abandoned to its worker thread",
            timeout=_sql.CLOSE_TIMEOUT,
        )
