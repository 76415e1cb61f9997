"""The state store's SQLite adapter for trio (and any anyio backend): one dedicated thread.

A plain ``sqlite3`` connection lives on a thread of its own; every call is a job put on that
thread's queue, and the caller waits for it on an anyio event set from the thread through the
event loop token — so the same SQL of :mod:`._sql` runs on one thread, in order, whatever the
backend.
"""

from __future__ import annotations

import contextlib
import queue
import sqlite3
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel

from barrierflow.runtime._sql import PRAGMAS, Statement

T = TypeVar("T")
_Job = tuple[Callable[[sqlite3.Connection], Any], Callable[[Any, BaseException | None], None]]


class ThreadConnection:
    """A :class:`~barrierflow.runtime._sql.SqlConnection` on a dedicated thread."""

    def __init__(self, path: str) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._ready = threading.Event()
        self._open_error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._serve, args=(path,), name="barrierflow-sqlite", daemon=True
        )
        self._closed = False

    @classmethod
    async def open(cls, path: str) -> ThreadConnection:
        """Start the thread, connect there and apply the pragmas."""
        connection = cls(path)
        connection._thread.start()
        await anyio.to_thread.run_sync(connection._ready.wait)
        if connection._open_error is not None:
            raise connection._open_error
        return connection

    def _serve(self, path: str) -> None:
        try:
            db = sqlite3.connect(path, isolation_level=None, check_same_thread=True)
            for pragma in PRAGMAS:
                db.execute(pragma)
        except BaseException as exc:  # reported to open(), which raises it
            self._open_error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            while (job := self._jobs.get()) is not None:
                work, done = job
                try:
                    result = work(db)
                except BaseException as exc:
                    done(None, exc)
                else:
                    done(result, None)
        finally:
            db.close()

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        token = anyio.lowlevel.current_token()
        finished = anyio.Event()
        outcome: list[Any] = []

        def done(result: Any, error: BaseException | None) -> None:
            outcome.extend((result, error))
            # If the event loop is gone, nobody is waiting any more.
            with contextlib.suppress(RuntimeError):
                anyio.from_thread.run_sync(finished.set, token=token)

        self._jobs.put((work, done))
        # Shielded: the job runs on the thread regardless; the caller must learn its outcome.
        with anyio.CancelScope(shield=True):
            await finished.wait()
        result, error = outcome
        if error is not None:
            raise error
        return result  # type: ignore[no-any-return]

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
            self._jobs.put(None)
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._thread.join)
