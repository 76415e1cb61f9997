"""The state store's SQLite adapter for asyncio: aiosqlite runs the SQL of :mod:`._sql`."""

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

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        async with self._lock, self._connection.execute(sql, params) as cursor:
            return [tuple(row) for row in await cursor.fetchall()]

    async def transaction(self, statements: Sequence[Statement]) -> None:
        async with self._lock:
            # Shielded once it holds the connection: a cancelled caller must not leave a
            # transaction half-open on the thread.
            with anyio.CancelScope(shield=True):
                await self._apply(statements)

    async def _apply(self, statements: Sequence[Statement]) -> None:
        await self._connection.execute("BEGIN IMMEDIATE")
        try:
            for statement in statements:
                if statement.rows:
                    await self._connection.executemany(statement.sql, statement.rows)
            await self._connection.execute("COMMIT")
        except BaseException:
            # SQLite has already rolled back after some errors (a full disk, an I/O error);
            # a second ROLLBACK would fail and hide the original error.
            if self._connection.in_transaction:
                await self._connection.execute("ROLLBACK")
            raise

    async def close(self) -> None:
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
