"""The state store's SQLite adapter for trio (and any anyio backend): ``anyio.to_thread``.

A plain ``sqlite3`` connection is used from worker threads through ``anyio.to_thread.run_sync``
behind a capacity limiter of one, so the SQL of :mod:`._sql` runs one call at a time, in
order, never concurrently on the connection (anyio reuses its idle worker thread, so in
practice it is one thread). A call that reached its thread runs to its end (a thread cannot be
interrupted); waiting for the limiter is cancellable for reads. Transactions are shielded, so
their caller learns the outcome; closing is shielded with a deadline.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import structlog

from barrierflow.runtime.state import _sql
from barrierflow.runtime.state._sql import PRAGMAS, Statement

T = TypeVar("T")


class ThreadConnection:
    """A :class:`~barrierflow.runtime.state._sql.SqlConnection` run on worker threads, one call at a
    time."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        self._limiter = anyio.CapacityLimiter(1)
        self._closed = False

    @classmethod
    async def open(cls, path: str) -> ThreadConnection:
        """Connect (autocommit mode: transactions are explicit) and apply the pragmas; on a
        failure the connection is closed before the error propagates."""

        def connect() -> sqlite3.Connection:
            db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            try:
                for pragma in PRAGMAS:
                    db.execute(pragma)
            except BaseException:
                db.close()
                raise
            return db

        return cls(await anyio.to_thread.run_sync(connect))

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        return await anyio.to_thread.run_sync(work, self._db, limiter=self._limiter)

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
                # SQLite has already rolled back after some errors (a full disk, an I/O
                # error); a second ROLLBACK would fail and hide the original error.
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

        with anyio.CancelScope(shield=True):
            await self._run(apply)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with anyio.move_on_after(_sql.CLOSE_TIMEOUT, shield=True) as scope:
            await anyio.to_thread.run_sync(
                self._db.close, limiter=self._limiter, abandon_on_cancel=True
            )
        if scope.cancelled_caught:
            structlog.get_logger("barrierflow.state_store").warning(
                "state store connection did not close in time; abandoned to its worker thread",
                timeout=_sql.CLOSE_TIMEOUT,
            )
