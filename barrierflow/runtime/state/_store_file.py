"""Opening the state store's file: where it really is, who holds it, whether it is intact (or
its atomic creation), then the SQLite connection and the check of the store's own metadata.

The file work blocks (``stat``, ``mkdir``, ``flock``, reads, ``fsync``):
:meth:`StateStore.open <barrierflow.runtime.StateStore.open>` runs :func:`prepare` on a
worker thread, then :func:`connect` and :func:`finish_open` through the SQLite adapter.

* **Path.** The path is resolved (:func:`os.path.realpath`: absolute, symlinks and ``..``
  followed), so the lock, the errors and ``StateStore.path`` name the real file whatever its
  spelling. A missing parent directory is created (``mkdir -p``, as the README's
  ``state/example.db`` expects); a directory, a non-regular file, or a parent that cannot be
  created or written is a :class:`~barrierflow.errors.StorePathError`.
* **Lock.** ``flock`` on ``<real file>.lock``: one holder per file, in this process (each open
  takes a new open file description, so a second open in the same process is refused too)
  and across processes; the OS releases it even on SIGKILL.
* **Inspection** (:mod:`._store_check`). A file that exists must look like a whole SQLite
  database: a zero-byte file, a file cut inside the 100-byte header, a page size that is not
  one, or (with no write-ahead log to replay) a size that is not a whole number of pages or
  below the page count its header records is a
  :class:`~barrierflow.errors.StoreCorruptedError`; a file that does not start like SQLite is
  a :class:`~barrierflow.errors.StoreFormatError`. Once open, SQLite's ``quick_check`` reads
  every page, and the metadata rows must be present and well formed.
* **Creation.** A new store is built whole in ``<file>.creating-<random>`` beside the target,
  fsynced, renamed into place and the directory fsynced: the store file either does not exist
  or is complete, so an empty or truncated file is never one that barrierflow half-created
  and is never taken for a new store. Leftovers of a creation that crashed are removed under
  the lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import sqlite3
import stat
from collections.abc import Iterator, Sequence
from typing import Any, Literal, NamedTuple, final

import anyio

from barrierflow._fs import (
    describe_os_error,
    file_kind,
    fsync_path,
    make_directory,
    not_a_directory,
)
from barrierflow.runtime.state import _sql
from barrierflow.runtime.state._store_check import inspect_header, validate
from barrierflow.runtime.state.errors import (
    StoreCorruptedError,
    StoreIOError,
    StoreLockedError,
    StorePathError,
)

Adapter = Literal["auto", "aiosqlite", "thread"]

_CREATING = ".creating-"
_WRITABLE_PARENT = "a file path whose parent directory exists (or can be created) and is writable"


@final
class StoreLock:
    """The store's OS lock: an open, ``flock``-ed descriptor of ``<file>.lock``."""

    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def release(self) -> None:
        """Release the lock (closing the descriptor drops the ``flock``); idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


@final
class Prepared(NamedTuple):
    """A store file ready for its SQLite connection (the result of :func:`prepare`)."""

    #: The real file: absolute, symlinks and ``..`` resolved.
    path: str
    #: The held lock (the caller releases it).
    lock: StoreLock
    #: The store's schema version as found (to migrate from).
    version: int
    #: The store's committed epoch.
    committed: int


def prepare(file: str) -> Prepared:
    """Resolve ``file``, check where it lives, lock it, then check the store it holds (header,
    every page, metadata) or create it.

    Blocking: run it on a worker thread. The checks run on a read-only connection, so a
    damaged file — and its write-ahead log — is left exactly as it was found.

    Raises:
        StorePathError: the path is a directory or not a regular file, or its parent cannot be
            created or written.
        StoreLockedError: another holder has the lock.
        StoreCorruptedError: the file is a damaged store (empty, cut short, pages SQLite
            cannot read, metadata rows missing or malformed).
        StoreFormatError: the file is not a barrierflow store.
        StoreVersionError: the store's schema is newer than this barrierflow.
        StoreIOError: the OS or SQLite failed otherwise (``__cause__`` says how).
    """
    real = os.path.realpath(file)
    if file.endswith(os.sep) or (os.altsep is not None and file.endswith(os.altsep)):
        # realpath would drop the slash and a file would be created where a directory was meant.
        raise StorePathError(real, "a file path, not a directory", f"{file!r}, ending in a slash")
    try:
        _check_target(real)
        _ensure_parent(real)
        lock = _lock(real)
    except OSError as exc:
        raise StoreIOError(real, "open", exc) from exc
    try:
        with sqlite_errors(real):
            _remove_stale_creations(real)
            try:
                size = os.stat(real).st_size
            except FileNotFoundError:
                _create(real)
                return Prepared(real, lock, _sql.SCHEMA_VERSION, 0)
            inspect_header(real, size)
            version, committed = validate(real)
    except BaseException:
        lock.release()
        raise
    return Prepared(real, lock, version, committed)


def _check_target(real: str) -> None:
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        return
    except NotADirectoryError:
        raise StorePathError(real, _WRITABLE_PARENT, not_a_directory(real)) from None
    except OSError as exc:
        got = describe_os_error(exc)
        raise StorePathError(real, "a file path the store can reach", got) from exc
    if stat.S_ISDIR(mode):
        raise StorePathError(real, "a file path, not a directory", "a directory")
    if not stat.S_ISREG(mode):
        expected = "a regular file (or a path that does not exist)"
        raise StorePathError(real, expected, file_kind(mode))
    if not os.access(real, os.R_OK | os.W_OK):
        raise StorePathError(real, "a file the store can read and write", "a read-only file")


def _ensure_parent(real: str) -> None:
    # The same check as a file sink's table directory (barrierflow._fs), in the same words.
    got = make_directory(os.path.dirname(real), what="a parent directory")
    if got is not None:
        raise StorePathError(real, _WRITABLE_PARENT, got)


def _lock(real: str) -> StoreLock:
    path = real + ".lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        got = f"a lock file {path!r} that cannot be opened ({describe_os_error(exc)})"
        raise StorePathError(real, _WRITABLE_PARENT, got) from exc
    lock = StoreLock(fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.release()
        raise StoreLockedError(real) from None
    except BaseException:
        lock.release()
        raise
    return lock


def _remove_files(base: str) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(base + suffix)


def _remove_stale_creations(real: str) -> None:
    directory, name = os.path.split(real)
    prefix = name + _CREATING
    with os.scandir(directory) as entries:
        stale = [
            entry.path
            for entry in entries
            if entry.name.startswith(prefix) and "-" not in entry.name[len(prefix) :]
        ]
    for path in stale:
        _remove_files(path)


def _create(real: str) -> None:
    directory = os.path.dirname(real)
    temp = f"{real}{_CREATING}{secrets.token_hex(8)}"
    try:
        try:
            db = sqlite3.connect(temp, isolation_level=None)
            try:
                for pragma in _sql.PRAGMAS:  # WAL is recorded in the file's header
                    db.execute(pragma)
                db.execute("BEGIN IMMEDIATE")
                for statement in _sql.bootstrap_statements():
                    db.executemany(statement.sql, statement.rows)
                db.execute("COMMIT")
            finally:
                db.close()  # the last connection checkpoints the log into the file
        except sqlite3.Error as exc:
            raise StoreIOError(real, "create", exc) from exc
        fsync_path(temp)
        os.rename(temp, real)
        fsync_path(directory)
    except BaseException:
        _remove_files(temp)
        raise


@contextlib.contextmanager
def sqlite_errors(file: str, operation: str = "open") -> Iterator[None]:
    """Turn SQLite's and the OS's errors during ``operation`` into the store's typed errors."""
    try:
        yield
    except sqlite3.DatabaseError as exc:
        name = getattr(exc, "sqlite_errorname", "")
        if name.startswith("SQLITE_CORRUPT") or name == "SQLITE_NOTADB":
            raise StoreCorruptedError(file, f"a file SQLite cannot read ({exc})") from exc
        raise StoreIOError(file, operation, exc) from exc
    except (sqlite3.Error, OSError) as exc:
        raise StoreIOError(file, operation, exc) from exc


@final
class TypedConnection:
    """A connection whose SQLite and OS errors surface as the store's typed errors: a store
    damaged after it was opened (a page overwritten, the disk gone) is a
    :class:`~barrierflow.errors.StoreCorruptedError` or
    :class:`~barrierflow.errors.StoreIOError` naming the file, never a bare
    ``sqlite3.DatabaseError``."""

    def __init__(self, inner: _sql.SqlConnection, file: str) -> None:
        self._inner = inner
        self._file = file

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with sqlite_errors(self._file, "read"):
            return await self._inner.fetchall(sql, params)

    async def transaction(self, statements: Sequence[_sql.Statement]) -> None:
        with sqlite_errors(self._file, "commit"):
            await self._inner.transaction(statements)

    async def close(self) -> None:
        with sqlite_errors(self._file, "close"):
            await self._inner.close()


async def connect(
    file: str, adapter: Adapter, limiter: anyio.CapacityLimiter | None = None
) -> _sql.SqlConnection:
    """A connection to ``file`` through ``adapter``; ``"auto"`` is the ``"thread"`` adapter on
    every backend (its small commits run inline, which a GIL-starved worker thread cannot match
    under load — see :data:`.sqlite_thread_backend.INLINE_ROWS`); it runs its thread calls
    behind ``limiter``. ``"aiosqlite"`` (asyncio only) remains available."""
    if adapter == "auto":
        adapter = "thread"
    if adapter == "aiosqlite":
        from barrierflow.runtime.state.sqlite_asyncio_backend import AiosqliteConnection

        return await AiosqliteConnection.open(file)
    from barrierflow.runtime.state.sqlite_thread_backend import ThreadConnection

    return await ThreadConnection.open(file, limiter)


async def finish_open(connection: _sql.SqlConnection, prepared: Prepared) -> None:
    """Migrate the store's schema and abort the sink epochs its last run left pending."""
    await connection.transaction(_sql.migrate_statements(prepared.version))
    # Recovery starts here: sink epochs pre-committed after the last durable checkpoint will be
    # replayed by the upstream, so their coordinators must abort them, not commit them.
    abort = _sql.Statement(_sql.SINK_ABORT_AFTER, [(prepared.committed,)])
    await connection.transaction([abort])
