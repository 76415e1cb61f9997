"""The state store's SQLite adapter for trio (and any anyio backend): ``anyio.to_thread``.

A plain ``sqlite3`` connection is used from worker threads through ``anyio.to_thread.run_sync``
behind a capacity limiter of one, so the SQL of :mod:`._sql` runs one call at a time, in
order, never concurrently on the connection (anyio reuses its idle worker thread, so in
practice it is one thread). Calls are shielded from cancellation: a transaction that started
finishes, and its caller learns the outcome.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from barrierflow.runtime._sql import PRAGMAS, Statement

T = TypeVar("T")


class ThreadConnection:
    """A :class:`~barrierflow.runtime._sql.SqlConnection` run on worker threads, one call at a
    time."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        self._limiter = anyio.CapacityLimiter(1)
        self._closed = False

    @classmethod
    async def open(cls, path: str) -> ThreadConnection:
        """Connect (autocommit mode: transactions are explicit) and apply the pragmas."""

        def connect() -> sqlite3.Connection:
            db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            for pragma in PRAGMAS:
                db.execute(pragma)
            return db

        return cls(await anyio.to_thread.run_sync(connect))

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        with anyio.CancelScope(shield=True):
            result = await anyio.to_thread.run_sync(work, self._db, limiter=self._limiter)
        return result

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return await self._run(lambda db: [tuple(r) for r in db.execute(sql, params).fetchall()])

    async def transaction(self, statements: Sequence[Statement]) -> None:
        def apply(db: sqlite3.Connection) -> None:
            db.execute("BEGIN IMMEDIATE")
            try:
                for statement in statements:
                    if statement.rows:
                        db.executemany(statement.sql, statement.rows)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

        await self._run(apply)

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._run(lambda db: db.close())
