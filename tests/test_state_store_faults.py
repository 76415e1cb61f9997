"""The state store under faults and bad paths: damaged files, damaged metadata, paths that are
not usable files, other spellings of a locked path, stuck connections. Every failure is a typed
error, leaves nothing behind, and never turns a damaged store into a new empty one."""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from barrierflow.errors import (
    ConcurrentCommitError,
    InvalidArgumentError,
    ProtocolError,
    StateStoreError,
    StoreCorruptedError,
    StoreFormatError,
    StoreIOError,
    StoreLockedError,
    StorePathError,
)
from barrierflow.runtime import StateStore
from barrierflow.runtime.state import _sql, _store_file
from barrierflow.runtime.state import sqlite_asyncio_backend as asyncio_adapter
from barrierflow.runtime.state import sqlite_thread_backend as thread_adapter

ROWS = 300  # enough committed rows for a store of several pages


async def build_store(path: Path, epoch: int = 7) -> None:
    """A closed, valid store with ``ROWS`` committed rows at ``epoch``."""
    async with await StateStore.open(path) as store:
        table = store.table("actor", "t")
        for key in range(ROWS):
            table.put(str(key), "x" * 40)
        table.seal(epoch)
        await store.commit(epoch)


@pytest.fixture(scope="module")
def valid_store_bytes() -> bytes:
    """The bytes of a valid, cleanly closed store (no write-ahead log left)."""
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory, "s.db")
        anyio.run(build_store, path)
        assert not Path(f"{path}-wal").exists()
        return path.read_bytes()


def _page_size(data: bytes) -> int:
    raw = int.from_bytes(data[16:18], "big")
    return 65536 if raw == 1 else raw


def _garbage(size: int) -> bytes:
    return random.Random(size).randbytes(size)


DAMAGES: dict[str, Callable[[bytes], bytes]] = {
    "zero-bytes": lambda data: b"",
    "cut-inside-the-magic": lambda data: data[:10],
    "cut-below-the-header": lambda data: data[:60],
    "cut-mid-page": lambda data: data[: _page_size(data) * 3 + 1234],
    "cut-at-a-page-boundary": lambda data: data[: _page_size(data) * 2],
    "header-then-garbage": lambda data: data[:100] + _garbage(len(data) - 100),
    "first-page-then-garbage": lambda data: (
        data[: _page_size(data)] + _garbage(len(data) - _page_size(data))
    ),
    "magic-then-garbage": lambda data: data[:16] + _garbage(8192 - 16),
}


def open_files() -> set[tuple[str, str]]:
    """The process's open descriptors on files, as (fd, path) pairs. Sockets, pipes and event
    fds are left out: the event loop and other tests open and close those at any time, so a
    count of every descriptor would depend on what else ran, not on the store."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile (the listing's own fd too)
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("/") and not target.startswith("/dev/"):
                found.add((fd, target))
    return found


class Leftovers:
    """Threads and open files that exist now, to compare with later."""

    def __init__(self) -> None:
        self.threads = set(threading.enumerate())
        self.files = open_files()

    def assert_nothing_left(self) -> None:
        new = set(threading.enumerate()) - self.threads
        for thread in new:
            thread.join(timeout=10)  # a worker told to stop may still be on its way out
        assert [thread for thread in new if thread.is_alive()] == []
        assert open_files() - self.files == set()


def real(path: str | Path) -> str:
    return os.path.realpath(path)


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def truncate(path: Path, size: int) -> None:
    with open(path, "r+b") as handle:
        handle.truncate(size)


async def leftovers() -> Leftovers:
    # Worker-thread pools start lazily and keep idle threads: start them first, so that only
    # threads a failed open leaves behind are counted.
    await anyio.to_thread.run_sync(lambda: None)
    return Leftovers()


# 1, 2. Damaged files: typed, left alone, nothing left behind.


@pytest.mark.anyio
@pytest.mark.parametrize("damage", list(DAMAGES))
async def test_damaged_store_file_is_refused_as_corrupted_and_nothing_is_left_behind(
    tmp_path: Path, valid_store_bytes: bytes, damage: str
) -> None:
    path = tmp_path / "s.db"
    damaged = DAMAGES[damage](valid_store_bytes)
    path.write_bytes(damaged)
    before = await leftovers()
    with pytest.raises(StoreCorruptedError) as info:
        await StateStore.open(path)
    assert info.value.path == real(path)
    assert isinstance(info.value, StateStoreError)
    before.assert_nothing_left()
    assert path.read_bytes() == damaged  # never rewritten as a new store
    # Restored, the same path opens again in this process: no lock was kept.
    path.write_bytes(valid_store_bytes)
    async with await StateStore.open(path) as store:
        assert store.committed_epoch == 7
        assert len(await store.read_all("actor", "t")) == ROWS
    before.assert_nothing_left()


@pytest.mark.anyio
@settings(max_examples=30, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(cut=st.floats(0, 1, exclude_max=True))
async def test_every_truncation_of_a_store_is_refused_as_corrupted(
    valid_store_bytes: bytes, cut: float
) -> None:
    size = int(len(valid_store_bytes) * cut)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory, "s.db")
        await anyio.Path(path).write_bytes(valid_store_bytes[:size])
        with pytest.raises(StoreCorruptedError):
            await StateStore.open(path)


@pytest.mark.anyio
async def test_damaged_store_with_a_write_ahead_log_is_refused_and_its_log_kept(
    tmp_path: Path,
) -> None:
    # A copy taken while a runtime was running (as after a crash): the log holds the last
    # commits. Refusing the file must not replay or delete that log.
    live, copy = tmp_path / "live.db", tmp_path / "copy.db"
    async with await StateStore.open(live) as store:
        table = store.table("actor", "t")
        for key in range(ROWS):
            table.put(str(key), key)
        table.seal(1)
        await store.commit(1)
        shutil.copy(live, copy)
        shutil.copy(f"{live}-wal", f"{copy}-wal")
    truncate(copy, 5000)
    wal = await anyio.Path(f"{copy}-wal").read_bytes()
    assert len(wal) > 32  # the log has frames
    before = await leftovers()
    with pytest.raises(StoreCorruptedError):
        await StateStore.open(copy)
    before.assert_nothing_left()
    assert len(await anyio.Path(copy).read_bytes()) == 5000
    assert await anyio.Path(f"{copy}-wal").read_bytes() == wal


@pytest.mark.anyio
@pytest.mark.parametrize("adapter", ["auto", "thread"])
async def test_sqlite_error_while_connecting_is_typed_and_leaves_no_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, adapter: str
) -> None:
    path = tmp_path / "s.db"
    await build_store(path)
    broken = ("PRAGMA journal_mode=WAL", "SELECT * FROM no_such_table")
    monkeypatch.setattr(asyncio_adapter, "PRAGMAS", broken)
    monkeypatch.setattr(thread_adapter, "PRAGMAS", broken)
    before = await leftovers()
    with pytest.raises(StoreIOError) as info:
        await StateStore.open(path, adapter=adapter)  # type: ignore[arg-type]
    assert isinstance(info.value.__cause__, sqlite3.OperationalError)
    before.assert_nothing_left()
    monkeypatch.undo()
    async with await StateStore.open(path) as store:
        assert store.committed_epoch == 7


# 1. Atomic creation.


@pytest.mark.anyio
async def test_new_store_is_built_aside_fsynced_then_renamed_into_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[tuple[str, ...]] = []
    fsync, rename = os.fsync, os.rename

    def spy_fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def spy_rename(src: str, dst: str) -> None:
        events.append(("rename", str(src), str(dst)))
        rename(src, dst)

    monkeypatch.setattr(os, "fsync", spy_fsync)
    monkeypatch.setattr(os, "rename", spy_rename)
    path = tmp_path / "s.db"
    async with await StateStore.open(path) as store:
        assert store.is_empty
    renames = [event for event in events if event[0] == "rename"]
    assert len(renames) == 1
    _, temp, target = renames[0]
    assert target == str(path)
    assert os.path.dirname(temp) == str(tmp_path)  # beside the target: same filesystem
    at = events.index(renames[0])
    assert ("fsync", temp) in events[:at]
    assert ("fsync", str(tmp_path)) in events[at + 1 :]
    assert names(tmp_path) == ["s.db", "s.db.lock"]


@pytest.mark.anyio
async def test_failed_creation_leaves_no_store_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(src: str, dst: str) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "rename", fail)
    path = tmp_path / "s.db"
    before = await leftovers()
    with pytest.raises(StoreIOError) as info:
        await StateStore.open(path)
    assert isinstance(info.value.__cause__, OSError)
    before.assert_nothing_left()
    assert names(tmp_path) == ["s.db.lock"]
    monkeypatch.undo()
    async with await StateStore.open(path) as store:
        assert store.is_empty


@pytest.mark.anyio
async def test_leftovers_of_a_crashed_creation_are_removed(tmp_path: Path) -> None:
    for name in ("s.db.creating-0123456789abcdef", "s.db.creating-0123456789abcdef-wal"):
        (tmp_path / name).write_bytes(b"half built")
    (tmp_path / "other.db.creating-0123456789abcdef").write_bytes(b"not ours to remove")
    async with await StateStore.open(tmp_path / "s.db"):
        pass
    assert names(tmp_path) == [
        "other.db.creating-0123456789abcdef",
        "s.db",
        "s.db.lock",
    ]


@pytest.mark.anyio
async def test_sqlite_database_without_tables_is_not_taken_for_a_new_store(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA user_version = 1")  # writes a header: a valid, empty database
    db.close()
    with pytest.raises(StoreFormatError) as info:
        await StateStore.open(path)
    assert info.value.path == str(path)


# 3. Damaged metadata.

METADATA_DAMAGES = {
    "committed-epoch-row-missing": "DELETE FROM bf_meta WHERE key = 'committed_epoch'",
    "committed-epoch-not-an-integer": (
        "UPDATE bf_meta SET value = 'seven' WHERE key = 'committed_epoch'"
    ),
    "committed-epoch-negative": "UPDATE bf_meta SET value = '-3' WHERE key = 'committed_epoch'",
    "schema-version-not-an-integer": (
        "UPDATE bf_meta SET value = 'two' WHERE key = 'schema_version'"
    ),
    "schema-version-row-missing": "DELETE FROM bf_meta WHERE key = 'schema_version'",
    "format-row-missing": "DELETE FROM bf_meta WHERE key = 'format'",
    "metadata-table-missing": "DROP TABLE bf_meta",
}


@pytest.mark.anyio
@pytest.mark.parametrize("damage", list(METADATA_DAMAGES))
async def test_damaged_metadata_is_refused_as_corrupted(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "s.db"
    await build_store(path)
    with sqlite3.connect(path) as db:
        db.execute(METADATA_DAMAGES[damage])
    db.close()
    before = await leftovers()
    with pytest.raises(StoreCorruptedError) as info:
        await StateStore.open(path)
    assert info.value.path == str(path)
    before.assert_nothing_left()


# 4. The lock is on the real file, whatever the spelling.


def _spellings(tmp_path: Path) -> dict[str, str]:
    real = tmp_path / "s.db"
    (tmp_path / "x").mkdir()
    (tmp_path / "link.db").symlink_to(real)
    (tmp_path / "linked-dir").symlink_to(tmp_path, target_is_directory=True)
    return {
        "symlink": str(tmp_path / "link.db"),
        "dotdot": f"{tmp_path}/x/../s.db",
        "dot": f"{tmp_path}/./s.db",
        "symlinked-directory": str(tmp_path / "linked-dir" / "s.db"),
        "relative": os.path.relpath(real),
    }


SPELLINGS = ["symlink", "dotdot", "dot", "symlinked-directory", "relative"]


@pytest.mark.anyio
@pytest.mark.parametrize("spelling", SPELLINGS)
async def test_lock_holds_against_other_spellings_of_the_same_file(
    tmp_path: Path, spelling: str
) -> None:
    real = str(tmp_path / "s.db")
    alias = _spellings(tmp_path)[spelling]
    async with await StateStore.open(real) as store:
        assert store.path == real
        with pytest.raises(StoreLockedError) as info:
            await StateStore.open(alias)
        assert info.value.path == real
    async with await StateStore.open(alias) as store:
        assert store.path == real
        with pytest.raises(StoreLockedError):
            await StateStore.open(real)


LOCK_HOLDER = textwrap.dedent(
    """
    import sys, anyio, anyio.to_thread
    from barrierflow.runtime import StateStore

    async def main(path):
        async with await StateStore.open(path):
            print("LOCKED", flush=True)
            await anyio.to_thread.run_sync(sys.stdin.readline)

    anyio.run(main, sys.argv[1], backend=sys.argv[2])
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.subprocess
def test_lock_held_by_another_process_holds_against_other_spellings(
    tmp_path: Path, backend: str
) -> None:
    spellings = _spellings(tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, str(tmp_path / "s.db"), backend],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdin is not None
    assert holder.stdout is not None
    try:
        assert holder.stdout.readline().strip() == "LOCKED"

        async def try_each() -> None:
            for spelling in SPELLINGS:
                with pytest.raises(StoreLockedError):
                    await StateStore.open(spellings[spelling])

        anyio.run(try_each, backend=backend)
    finally:
        holder.stdin.close()
        assert holder.wait(timeout=60) == 0
        holder.stdout.close()


# 5. Paths that cannot hold a store.


def _unusable_paths(tmp_path: Path) -> Iterator[tuple[str, str]]:
    (tmp_path / "dir.db").mkdir()
    yield "directory", str(tmp_path / "dir.db")
    (tmp_path / "plain").write_text("a regular file")
    yield "parent-is-a-file", str(tmp_path / "plain" / "s.db")
    yield "ancestor-is-a-file", str(tmp_path / "plain" / "sub" / "s.db")
    os.mkfifo(tmp_path / "fifo.db")
    yield "fifo", str(tmp_path / "fifo.db")
    (tmp_path / "locked-dir.db.lock").mkdir()
    yield "lock-file-is-a-directory", str(tmp_path / "locked-dir.db")
    if os.path.isdir("/proc/self"):
        yield "under-proc", "/proc/x/state.db"


UNUSABLE = [
    "directory",
    "parent-is-a-file",
    "ancestor-is-a-file",
    "fifo",
    "lock-file-is-a-directory",
    "under-proc",
]


@pytest.mark.anyio
@pytest.mark.parametrize("case", UNUSABLE)
async def test_unusable_state_path_is_a_typed_path_error(tmp_path: Path, case: str) -> None:
    paths = dict(_unusable_paths(tmp_path))
    if case not in paths:
        pytest.skip("no /proc on this system")
    before = await leftovers()
    with pytest.raises(StorePathError) as info:
        await StateStore.open(paths[case])
    error = info.value
    assert isinstance(error, StateStoreError)
    assert isinstance(error, InvalidArgumentError)
    assert error.argument == "state_path"
    assert error.path == real(paths[case])
    assert error.expected
    assert error.got
    before.assert_nothing_left()


@pytest.mark.anyio
@pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0,
    reason="root bypasses directory permissions, so an unwritable parent cannot be made",
)
@pytest.mark.parametrize("where", ["file-in-it", "missing-dir-under-it"])
async def test_unwritable_parent_is_a_typed_path_error(tmp_path: Path, where: str) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    path = locked / "s.db" if where == "file-in-it" else locked / "sub" / "s.db"
    try:
        with pytest.raises(StorePathError) as info:
            await StateStore.open(path)
        assert info.value.argument == "state_path"
    finally:
        locked.chmod(0o700)


@pytest.mark.anyio
async def test_parent_that_is_not_writable_is_a_typed_path_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the OS answers for a parent without write permission, even for root.
    access = os.access
    locked = str(tmp_path / "locked")
    os.mkdir(locked)

    def no_write_to_locked(path: Any, mode: int, **kwargs: Any) -> bool:
        if str(path) == locked and mode & os.W_OK:
            return False
        return access(path, mode, **kwargs)

    monkeypatch.setattr(os, "access", no_write_to_locked)
    with pytest.raises(StorePathError) as info:
        await StateStore.open(tmp_path / "locked" / "s.db")
    assert info.value.argument == "state_path"
    assert names(tmp_path / "locked") == []  # not even a lock file


@pytest.mark.anyio
async def test_path_ending_in_a_slash_is_a_typed_path_error(tmp_path: Path) -> None:
    with pytest.raises(StorePathError):
        await StateStore.open(f"{tmp_path}/state/")
    assert names(tmp_path) == []


@pytest.mark.anyio
async def test_missing_parent_directories_are_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with await StateStore.open(tmp_path / "a" / "b" / "s.db") as store:
        assert store.is_empty
    monkeypatch.chdir(tmp_path)
    async with await StateStore.open("state/example.db") as store:  # the README's example
        assert store.path == str(tmp_path / "state" / "example.db")


# 6. Bad argument types.


class BytesPath:
    def __fspath__(self) -> bytes:
        return b"s.db"

    def __repr__(self) -> str:  # a stable test id: xdist's workers must collect the same ids
        return "BytesPath()"


class StrPath:
    def __init__(self, path: str) -> None:
        self.path = path

    def __fspath__(self) -> str:
        return self.path


@pytest.mark.anyio
@pytest.mark.parametrize(
    "path", [None, 3, 3.5, b"s.db", "", "bad\x00name.db", BytesPath(), ["s.db"]], ids=repr
)
async def test_bad_path_argument_is_a_typed_invalid_argument(path: Any) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        await StateStore.open(path)
    assert info.value.argument == "path"
    assert info.value.got is path


@pytest.mark.anyio
async def test_path_objects_and_path_likes_keep_working(tmp_path: Path) -> None:
    async with await StateStore.open(tmp_path / "a.db") as store:
        assert store.path == str(tmp_path / "a.db")
    async with await StateStore.open(StrPath(str(tmp_path / "b.db"))) as store:
        assert store.path == str(tmp_path / "b.db")


@pytest.mark.anyio
async def test_cancelled_open_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.db"
    await build_store(path)
    finish_open = _store_file.finish_open
    scope = anyio.CancelScope()

    async def cancelled_midway(*args: Any) -> None:
        scope.cancel()  # with the lock held and the connection open
        await anyio.lowlevel.checkpoint()
        await finish_open(*args)

    monkeypatch.setattr(_store_file, "finish_open", cancelled_midway)
    before = await leftovers()
    with scope:
        await StateStore.open(path)
    assert scope.cancelled_caught
    before.assert_nothing_left()
    monkeypatch.undo()
    async with await StateStore.open(path) as store:
        assert store.committed_epoch == 7


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["my store#1?.db", "100%.db", "ünï cødé.db", "a&b=c.db"])
async def test_file_names_with_uri_characters_keep_their_state(tmp_path: Path, name: str) -> None:
    # The store is checked through an SQLite URI: its characters must not change the file.
    path = tmp_path / name
    await build_store(path)
    async with await StateStore.open(path) as store:
        assert store.path == str(path)
        assert store.committed_epoch == 7
    assert names(tmp_path) == sorted([name, f"{name}.lock"])


# 7. Reads are not shielded; cleanups have deadlines.


async def install_blocker(store: StateStore) -> tuple[threading.Event, threading.Event]:
    """An SQL function ``bf_block()`` that holds the connection's thread until released."""
    entered, release = threading.Event(), threading.Event()

    def block() -> int:
        entered.set()
        release.wait(10)
        return 1

    connection: Any = store._connection._inner  # type: ignore[attr-defined]  # the adapter
    if isinstance(connection, thread_adapter.ThreadConnection):
        connection._db.create_function("bf_block", 0, block)
    else:
        await connection._connection.create_function("bf_block", 0, block)
    return entered, release


@pytest.mark.anyio
async def test_a_read_waiting_for_the_connection_can_be_cancelled(tmp_path: Path) -> None:
    async with await StateStore.open(tmp_path / "s.db") as store:
        entered, release = await install_blocker(store)
        outcome: list[bool] = []
        async with anyio.create_task_group() as tg:
            try:
                tg.start_soon(store._connection.fetchall, "SELECT bf_block()")
                assert await anyio.to_thread.run_sync(entered.wait, 10)
                scope = anyio.CancelScope()

                async def waiting_read() -> None:
                    with scope:
                        await store.read("actor", "t", "k")
                    outcome.append(scope.cancelled_caught)

                tg.start_soon(waiting_read)
                await anyio.wait_all_tasks_blocked()
                scope.cancel()
                await anyio.wait_all_tasks_blocked()
                assert outcome == [True]  # gave up while the connection was still busy
            finally:
                release.set()


@pytest.mark.anyio
async def test_close_gives_up_after_its_deadline_when_the_connection_is_stuck(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_sql, "CLOSE_TIMEOUT", 0.2, raising=False)
    path = tmp_path / "s.db"
    store = await StateStore.open(path)
    entered, release = await install_blocker(store)

    async def stuck_read() -> None:
        # Closed under it, the read may fail on its way out: only the close matters here.
        with contextlib.suppress(Exception):
            await store._connection.fetchall("SELECT bf_block()")

    async with anyio.create_task_group() as tg:
        try:
            tg.start_soon(stuck_read)
            assert await anyio.to_thread.run_sync(entered.wait, 10)
            start = anyio.current_time()
            await store.aclose()
            elapsed = anyio.current_time() - start
        finally:
            release.set()
    assert elapsed < 5
    async with await StateStore.open(path):  # the lock was released all the same
        pass


# 8. File work runs off the event loop.


@pytest.mark.anyio
async def test_open_does_its_file_work_off_the_event_loop_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop_thread = threading.get_ident()
    calls: list[tuple[str, int]] = []
    for module, name in ((fcntl, "flock"), (os, "fsync"), (os, "mkdir")):
        original = getattr(module, name)

        def spy(*args: Any, _original: Any = original, _name: str = name) -> Any:
            calls.append((_name, threading.get_ident()))
            return _original(*args)

        monkeypatch.setattr(module, name, spy)
    async with await StateStore.open(tmp_path / "new" / "s.db"):
        pass
    assert [name for name, thread in calls if thread == loop_thread] == []
    assert {name for name, _ in calls} == {"flock", "fsync", "mkdir"}


# is_empty.


@pytest.mark.anyio
async def test_is_empty_until_the_first_checkpoint_commits(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with await StateStore.open(path) as store:
        assert store.is_empty
        table = store.table("actor", "t")
        table.put("k", 1)
        table.seal(1)
        assert store.is_empty  # sealed is not durable
    async with await StateStore.open(path) as store:
        assert store.is_empty
        store.table("actor", "t").seal(2)
        await store.commit(2)
        assert not store.is_empty
    async with await StateStore.open(path) as store:
        assert not store.is_empty


# Damage found after the store was opened.


@pytest.mark.anyio
async def test_a_stored_value_that_is_not_json_is_a_corrupted_store(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with await StateStore.open(path) as store:
        table = store.table("a", "t")
        table.put("k", {"x": 1})
        table.seal(5)
        await store.commit(5)
    with contextlib.closing(sqlite3.connect(path)) as raw, raw:
        raw.execute("UPDATE bf_state SET value = '{not json' WHERE key = 'k'")
    async with await StateStore.open(path) as store:  # a valid SQLite file: opens
        with pytest.raises(StoreCorruptedError) as caught:
            await store.read("a", "t", "k")
        assert caught.value.path == str(path.resolve())
        with pytest.raises(StoreCorruptedError):
            await store.read_all("a", "t")


class _FailingConnection:
    def __init__(self, error: Exception) -> None:
        self.error = error

    async def fetchall(self, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
        raise self.error

    async def transaction(self, statements: Any) -> None:
        raise self.error

    async def close(self) -> None:
        raise self.error


def _sqlite_error(name: str) -> sqlite3.DatabaseError:
    error = sqlite3.DatabaseError(f"{name} from SQLite")
    error.sqlite_errorname = name  # type: ignore[attr-defined]
    return error


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (_sqlite_error("SQLITE_CORRUPT"), StoreCorruptedError),
        (_sqlite_error("SQLITE_NOTADB"), StoreCorruptedError),
        (_sqlite_error("SQLITE_IOERR"), StoreIOError),
        (sqlite3.OperationalError("disk I/O error"), StoreIOError),
        (OSError(5, "Input/output error"), StoreIOError),
    ],
)
async def test_sqlite_errors_after_open_are_typed(
    error: Exception, expected: type[Exception]
) -> None:
    connection = _store_file.TypedConnection(_FailingConnection(error), "/x/s.db")
    for call in (
        lambda: connection.fetchall("SELECT 1"),
        lambda: connection.transaction([]),
        connection.close,
    ):
        with pytest.raises(expected) as caught:
            await call()
        assert caught.value.__cause__ is error


# 9. Cancellation: reads are abandoned at once; commits and closes are shielded with deadlines;
#    every worker thread of the store runs behind the runtime's limiter.


def _adapter_of(store: StateStore) -> Any:
    return store._connection._inner  # type: ignore[attr-defined]


@pytest.mark.anyio
@pytest.mark.parametrize("adapter", ["auto", "thread"])
async def test_a_cancelled_read_returns_at_once_while_its_query_still_runs(
    tmp_path: Path, adapter: str
) -> None:
    async with await StateStore.open(tmp_path / "s.db", adapter=adapter) as store:  # type: ignore[arg-type]
        entered, release = await install_blocker(store)
        try:
            with anyio.fail_after(5), anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(store._connection.fetchall, "SELECT bf_block()")
                    assert await anyio.to_thread.run_sync(entered.wait, 10)
                    scope.cancel()
            assert scope.cancelled_caught
            assert not release.is_set()  # the caller is back while the query is still stuck
        finally:
            release.set()
        with anyio.fail_after(5):  # the connection serves the next call once the query ends
            assert await store.read("actor", "t", "k", "none") == "none"


@pytest.mark.anyio
@pytest.mark.parametrize("adapter", ["auto", "thread"])
async def test_close_under_cancellation_still_closes(tmp_path: Path, adapter: str) -> None:
    path = tmp_path / "s.db"
    store = await StateStore.open(path, adapter=adapter)  # type: ignore[arg-type]
    inner = _adapter_of(store)
    with anyio.CancelScope() as scope:
        scope.cancel()
        await store.aclose()
    if isinstance(inner, thread_adapter.ThreadConnection):
        with pytest.raises(sqlite3.ProgrammingError):  # the SQLite connection is closed
            inner._db.execute("SELECT 1")
    else:
        assert inner._connection._connection is None  # aiosqlite closed its connection
    async with await StateStore.open(path):  # and the lock was released
        pass


@pytest.mark.anyio
@pytest.mark.parametrize("adapter", ["auto", "thread"])
async def test_a_commit_past_its_deadline_is_a_typed_error_and_the_connection_refuses_later_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, adapter: str
) -> None:
    monkeypatch.setattr(_sql, "COMMIT_TIMEOUT", 0.2)
    path = tmp_path / "s.db"
    store = await StateStore.open(path, adapter=adapter)  # type: ignore[arg-type]
    entered, release = await install_blocker(store)
    table = store.table("actor", "t")
    table.put("k", 1)
    table.seal(1)
    try:
        with anyio.CancelScope() as read_scope:  # a read abandoned while its query is stuck
            async with anyio.create_task_group() as tg:
                tg.start_soon(store._connection.fetchall, "SELECT bf_block()")
                assert await anyio.to_thread.run_sync(entered.wait, 10)
                read_scope.cancel()
        with anyio.fail_after(5), pytest.raises(StoreIOError) as caught:
            await store.commit(1)  # waits behind the stuck query past its deadline
        assert caught.value.operation == "commit"
        assert isinstance(caught.value.__cause__, TimeoutError)
        assert store.committed_epoch == 0
        with pytest.raises(StoreIOError) as later:
            await store.read("actor", "t", "k")
        assert isinstance(later.value.__cause__, TimeoutError)
    finally:
        release.set()
        await store.aclose()
    async with await StateStore.open(path) as reopened:  # the abandoned commit never ran
        assert reopened.committed_epoch == 0


@pytest.mark.anyio
@pytest.mark.parametrize("adapter", ["auto", "thread"])
async def test_open_and_thread_calls_run_behind_the_given_limiter(
    tmp_path: Path, adapter: str
) -> None:
    limiter = anyio.CapacityLimiter(1)
    path = tmp_path / "s.db"
    opened: list[StateStore] = []

    async def open_store() -> None:
        opened.append(await StateStore.open(path, adapter=adapter, limiter=limiter))  # type: ignore[arg-type]

    # The only token is taken: the file work must wait for it.
    async with anyio.create_task_group() as tg, limiter:
        tg.start_soon(open_store)
        await anyio.wait_all_tasks_blocked()
        assert opened == []
        assert not path.exists()
    async with opened[0] as store:
        if not isinstance(_adapter_of(store), thread_adapter.ThreadConnection):
            return  # aiosqlite runs SQL on its own thread
        reads: list[Any] = []

        async def read() -> None:
            reads.append(await store.read("actor", "t", "k"))

        async with anyio.create_task_group() as tg, limiter:
            tg.start_soon(read)
            await anyio.wait_all_tasks_blocked()
            assert reads == []
        assert reads == [None]


@pytest.mark.anyio
async def test_a_limiter_that_is_not_a_capacity_limiter_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        await StateStore.open(tmp_path / "s.db", limiter=3)  # type: ignore[arg-type]
    assert caught.value.argument == "limiter"
    assert not (tmp_path / "s.db").exists()


@pytest.mark.anyio
async def test_a_second_commit_while_one_runs_is_a_concurrent_commit_error(tmp_path: Path) -> None:
    async with await StateStore.open(tmp_path / "s.db") as store:
        entered, release = await install_blocker(store)
        table = store.table("actor", "t")
        table.put("k", 1)
        table.seal(1)
        table.seal(2)
        try:
            async with anyio.create_task_group() as tg:
                # The first commit waits behind a stuck query; the second finds it running.
                tg.start_soon(store._connection.fetchall, "SELECT bf_block()")
                assert await anyio.to_thread.run_sync(entered.wait, 10)
                tg.start_soon(store.commit, 1)
                await anyio.wait_all_tasks_blocked()
                with pytest.raises(ConcurrentCommitError) as caught:
                    await store.commit(2)
                assert isinstance(caught.value, ProtocolError)
                assert (caught.value.path, caught.value.epoch, caught.value.running) == (
                    store.path,
                    2,
                    1,
                )
                release.set()
        finally:
            release.set()
        assert store.committed_epoch == 1
