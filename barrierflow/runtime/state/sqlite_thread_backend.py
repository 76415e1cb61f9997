"""The state store's SQLite adapter for trio (and any anyio backend): ``anyio.to_thread``.

A plain ``sqlite3`` connection is used from worker threads through ``anyio.to_thread.run_sync``
(behind the runtime's thread limiter when it passes one). Calls run one at a time, in the order
they were made: an ``anyio.Lock`` orders the callers, and a ``threading.Lock`` held by the
worker thread keeps the connection to one call even when a caller stopped waiting.

A thread cannot be interrupted, so a caller that is cancelled *abandons* its call instead of
waiting for it: **reads are not shielded** — a cancelled read returns at once (its query either
never starts, or finishes on the thread and its rows are dropped). **Transactions are
shielded** for at most :data:`~._sql.COMMIT_TIMEOUT` seconds, so their caller learns the
outcome; past that the outcome is unknown and the connection refuses every later call. A small
transaction (at most :data:`INLINE_ROWS` rows: every checkpoint of a graph with modest state)
runs on the caller's thread instead, see :data:`INLINE_ROWS`.
**Closing** is shielded for at most :data:`~._sql.CLOSE_TIMEOUT` seconds; past that the close
is left to the thread, which runs it once the call before it returns.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar, final

import anyio
import anyio.to_thread
import structlog

from barrierflow.runtime.state import _sql
from barrierflow.runtime.state._sql import PRAGMAS, Statement

T = TypeVar("T")

#: A transaction of at most this many rows runs on the calling (event loop) thread. A
#: checkpoint's commit is a few rows in one WAL transaction (≈ 0.3 ms with its fsync); on a
#: worker thread it needs the GIL a dozen times, and while the event loop is busy moving data
#: each handover waits for the loop's switch interval: measured at 0.5 to 2 s per commit with a
#: 4-stage graph at full speed (``add_job`` then took 10 s instead of 3 ms). Larger
#: transactions, and any while an abandoned call still holds the connection, go to a thread.
INLINE_ROWS = 2_000


class _AbandonedError(Exception):
    """The caller stopped waiting before its call reached the connection: it was skipped."""


@final
class _Call(Generic[T]):
    """One call on the connection, run by a worker thread under the connection's lock."""

    __slots__ = ("_busy", "_db", "_run_if_abandoned", "_work", "abandoned")

    def __init__(
        self,
        db: sqlite3.Connection,
        busy: threading.Lock,
        work: Callable[[sqlite3.Connection], T],
        run_if_abandoned: bool,
    ) -> None:
        self._db = db
        self._busy = busy
        self._work = work
        self._run_if_abandoned = run_if_abandoned
        # Written by the event loop's thread, read by the worker (a bool, atomic under the GIL).
        self.abandoned = False

    def run(self) -> T:
        with self._busy:
            if self.abandoned and not self._run_if_abandoned:
                raise _AbandonedError
            return self._work(self._db)


class ThreadConnection:
    """A :class:`~barrierflow.runtime.state._sql.SqlConnection` run on worker threads, one call
    at a time (see the module)."""

    def __init__(self, db: sqlite3.Connection, limiter: anyio.CapacityLimiter | None) -> None:
        self._db = db
        self._limiter = limiter
        self._turn = anyio.Lock()  # callers in order (anyio's lock is fair)
        self._busy = threading.Lock()  # the connection, one call at a time, abandoned or not
        self._closed = False
        # Set when a transaction outlived its deadline: its outcome is unknown.
        self._broken = False

    @classmethod
    async def open(
        cls, path: str, limiter: anyio.CapacityLimiter | None = None
    ) -> ThreadConnection:
        """Connect (autocommit mode: transactions are explicit) and apply the pragmas; on a
        failure the connection is closed before the error propagates.

        Cancellation: waits for the thread (not abandoned, so no connection is left open).
        """

        def connect() -> sqlite3.Connection:
            db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            try:
                for pragma in PRAGMAS:
                    db.execute(pragma)
            except BaseException:
                db.close()
                raise
            return db

        return cls(await anyio.to_thread.run_sync(connect, limiter=limiter), limiter)

    async def _run(
        self,
        work: Callable[[sqlite3.Connection], T],
        *,
        deadline: float | None = None,
    ) -> T:
        """Run ``work`` on a worker thread once it is this caller's turn.

        Waiting for the turn is cancellable. With a ``deadline``, the call itself is shielded
        for that many seconds; past it (or on cancellation without one) the call is abandoned:
        skipped if it has not reached the connection yet, else left to finish on its thread.

        Raises:
            TimeoutError: the deadline passed.
        """
        call = _Call(self._db, self._busy, work, run_if_abandoned=False)
        async with self._turn:
            with anyio.move_on_after(deadline, shield=deadline is not None):
                try:
                    return await anyio.to_thread.run_sync(
                        call.run, limiter=self._limiter, abandon_on_cancel=True
                    )
                except anyio.get_cancelled_exc_class():
                    call.abandoned = True
                    raise
            call.abandoned = True
            raise TimeoutError

    def _check_usable(self) -> None:
        if self._broken:
            raise _sql.commit_timed_out()

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run a query. Cancellation: not shielded — the caller returns at once."""
        self._check_usable()
        return await self._run(lambda db: [tuple(r) for r in db.execute(sql, params).fetchall()])

    async def transaction(self, statements: Sequence[Statement]) -> None:
        """Apply ``statements`` atomically; shielded for at most
        :data:`~._sql.COMMIT_TIMEOUT` seconds.

        Raises:
            TimeoutError: the deadline passed (outcome unknown; the connection is now unusable).
        """
        self._check_usable()

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

        if sum(len(s.rows) for s in statements) <= INLINE_ROWS:
            async with self._turn:
                if self._busy.acquire(blocking=False):  # no abandoned call holds it
                    try:
                        apply(self._db)
                    finally:
                        self._busy.release()
                    return
        try:
            await self._run(apply, deadline=_sql.COMMIT_TIMEOUT)
        except TimeoutError:
            self._broken = True
            raise _sql.commit_timed_out() from None

    async def close(self) -> None:
        """Close the connection (idempotent); shielded for at most
        :data:`~._sql.CLOSE_TIMEOUT` seconds, then left to the thread."""
        if self._closed:
            return
        self._closed = True
        # Not behind the turn (a caller stuck in a call holds it): straight to a thread, which
        # closes the connection as soon as the call before it returns, even past the deadline.
        call = _Call(self._db, self._busy, sqlite3.Connection.close, run_if_abandoned=True)
        with anyio.move_on_after(_sql.CLOSE_TIMEOUT, shield=True) as scope:
            await anyio.to_thread.run_sync(call.run, limiter=self._limiter, abandon_on_cancel=True)
        if scope.cancelled_caught:
            structlog.get_logger("barrierflow.state_store").warning(
                "state store connection did not close in time; abandoned to its worker thread",
                timeout=_sql.CLOSE_TIMEOUT,
            )
