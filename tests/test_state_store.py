"""The state store: per-epoch buffering, one-transaction checkpoints, crash recovery, locking."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pytest
from _portals import portal_case
from _timeouts import scaled
from anyio.from_thread import BlockingPortal
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from barrierflow.errors import (
    EpochOrderError,
    InvalidArgumentError,
    StoreFormatError,
    StoreLockedError,
    StoreVersionError,
)
from barrierflow.runtime import StateStore, StateTable

KEYS = st.sampled_from(["a", "b", "c", "d"])
VALUES = st.one_of(st.integers(-5, 5), st.text(max_size=3), st.lists(st.booleans(), max_size=2))
MISSING = object()


class StateStoreMachine(RuleBasedStateMachine):
    """The store and a dict model agree after every step, crashes included."""

    backend = "asyncio"
    #: One event loop thread for every example of a run (started by the test case's
    #: ``setUpClass``): starting one per example cost more than the steps themselves.
    shared_portal: BlockingPortal | None = None

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "state.db")
        assert self.shared_portal is not None, "run through portal_case"
        self.portal: BlockingPortal = self.shared_portal
        self.committed: dict[str, dict[str, Any]] = {"t1": {}, "t2": {}}
        self.sealed: list[tuple[int, dict[str, dict[str, Any]]]] = []
        self.pending: dict[str, dict[str, Any]] = {"t1": {}, "t2": {}}
        self.epoch = 0
        self.committed_epoch = 0
        self._open()

    def _open(self) -> None:
        self.store: StateStore = self.portal.call(StateStore.open, self.path)
        self.tables: dict[str, StateTable] = {n: self.store.table("actor", n) for n in ("t1", "t2")}

    def own_view(self, name: str) -> dict[str, Any]:
        view = dict(self.committed[name])
        for _, writes in self.sealed:
            view.update(writes[name])
        view.update(self.pending[name])
        return {k: v for k, v in view.items() if v is not MISSING}

    @rule(name=st.sampled_from(["t1", "t2"]), key=KEYS, value=VALUES)
    def put(self, name: str, key: str, value: Any) -> None:
        self.tables[name].put(key, value)
        self.pending[name][key] = value

    @rule(name=st.sampled_from(["t1", "t2"]), key=KEYS)
    def delete(self, name: str, key: str) -> None:
        self.tables[name].delete(key)
        self.pending[name][key] = MISSING

    @rule()
    def barrier(self) -> None:
        self.epoch += 1
        for table in self.tables.values():
            table.seal(self.epoch)
        self.sealed.append((self.epoch, self.pending))
        self.pending = {"t1": {}, "t2": {}}

    @precondition(lambda self: self.epoch > self.committed_epoch)
    @rule()
    def checkpoint(self) -> None:
        self.portal.call(self.store.commit, self.epoch)
        for _, writes in self.sealed:
            for name in writes:
                for key, value in writes[name].items():
                    if value is MISSING:
                        self.committed[name].pop(key, None)
                    else:
                        self.committed[name][key] = value
        self.sealed = []
        self.committed_epoch = self.epoch

    @rule()
    def crash(self) -> None:
        # Closing without committing loses exactly what a crash loses.
        self.portal.call(self.store.aclose)
        self._open()
        self.sealed = []
        self.pending = {"t1": {}, "t2": {}}
        self.epoch = self.committed_epoch

    @invariant()
    def agrees_with_model(self) -> None:
        assert self.store.committed_epoch == self.committed_epoch
        for name, table in self.tables.items():
            assert self.portal.call(table.items) == self.own_view(name)
            assert self.portal.call(self.store.read_all, "actor", name) == self.committed[name]
            for key in ["a", "b"]:
                assert self.portal.call(table.get, key) == self.own_view(name).get(key)

    def teardown(self) -> None:
        self.portal.call(self.store.aclose)
        self.dir.cleanup()


class StateStoreOnTrio(StateStoreMachine):
    backend = "trio"


# Every example opens a store (a new file, fsynced) and every crash reopens it: 12 examples of
# 20 steps run each of the five rules many times, in many orders, on each backend.
SETTINGS = settings(max_examples=12, stateful_step_count=20, deadline=None)
TestStateStoreAsyncio = portal_case(StateStoreMachine)
TestStateStoreAsyncio.settings = SETTINGS
TestStateStoreTrio = portal_case(StateStoreOnTrio)
TestStateStoreTrio.settings = SETTINGS


@pytest.mark.anyio
async def test_reader_sees_own_writes_and_others_see_committed(tmp_path: Path) -> None:
    async with await StateStore.open(tmp_path / "s.db") as store:
        table = store.table("writer", "progress")
        table.put("split-1", {"offset": 10})
        assert await table.get("split-1") == {"offset": 10}
        assert await store.read("writer", "progress", "split-1") is None
        table.seal(1)
        await store.commit(1)
        assert await store.read("writer", "progress", "split-1") == {"offset": 10}


@pytest.mark.anyio
async def test_commit_writes_only_epochs_up_to_the_checkpoint(tmp_path: Path) -> None:
    async with await StateStore.open(tmp_path / "s.db") as store:
        table = store.table("a", "t")
        table.put("k", 1)
        table.seal(1)
        table.put("k", 2)
        table.seal(2)
        await store.commit(1)
        assert await store.read("a", "t", "k") == 1
        assert await table.get("k") == 2  # epoch 2 still sealed, not durable
        with pytest.raises(EpochOrderError) as info:
            await store.commit(1)
        assert (info.value.previous, info.value.current) == (1, 1)


@pytest.mark.anyio
async def test_committed_epochs_stream_starts_with_current(tmp_path: Path) -> None:
    async with await StateStore.open(tmp_path / "s.db") as store:
        table = store.table("a", "t")
        seen: list[int] = []

        async def watch() -> None:
            async for epoch in store.committed_epochs():
                seen.append(epoch)
                if epoch == 3:
                    return

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            await anyio.wait_all_tasks_blocked()
            assert seen == [0]
            for epoch in (1, 3):
                table.seal(epoch)
                await store.commit(epoch)
                await anyio.wait_all_tasks_blocked()
        assert seen == [0, 1, 3]


@pytest.mark.anyio
async def test_second_runtime_on_same_store_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with await StateStore.open(path):
        with pytest.raises(StoreLockedError) as info:
            await StateStore.open(path)
        assert info.value.path == str(path)
    async with await StateStore.open(path):  # released on close
        pass


@pytest.mark.anyio
async def test_file_that_is_not_ours_is_refused(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"hello, this is not sqlite at all")
    with pytest.raises(StoreFormatError):
        await StateStore.open(garbage)
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE users (id INTEGER)")
    with pytest.raises(StoreFormatError) as info:
        await StateStore.open(foreign)
    assert "users" in info.value.found


@pytest.mark.anyio
async def test_newer_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with await StateStore.open(path):
        pass
    with sqlite3.connect(path) as db:
        db.execute("UPDATE bf_meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(StoreVersionError) as info:
        await StateStore.open(path)
    assert (info.value.found, info.value.supported) == (99, 3)


@pytest.mark.anyio
async def test_bad_keys_values_and_epochs_are_rejected(tmp_path: Path) -> None:
    async with await StateStore.open(tmp_path / "s.db") as store:
        table = store.table("a", "t")
        with pytest.raises(InvalidArgumentError) as info:
            table.put("k", object())
        assert info.value.argument == "value"
        with pytest.raises(InvalidArgumentError):
            table.put(3, 1)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            store.table("a", "t")  # already open
        table.seal(5)
        with pytest.raises(EpochOrderError):
            table.seal(5)


CHILD = textwrap.dedent(
    """
    import sys, anyio
    from barrierflow.runtime import StateStore

    async def main(path, mode):
        store = await StateStore.open(path)
        table = store.table("actor", "t")
        epoch = store.committed_epoch
        while True:
            epoch += 1
            for key in range(200):
                table.put(str(key), epoch)
            table.seal(epoch)
            if mode == "buffered" and epoch == 3:
                print("BUFFERED", flush=True)
                await anyio.sleep_forever()  # until the parent kills us
            await store.commit(epoch)
            print("COMMITTED", epoch, flush=True)

    anyio.run(main, sys.argv[1], sys.argv[2], backend=sys.argv[3])
    """
)


def run_child_and_kill(path: Path, mode: str, backend: str, after_lines: int) -> list[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), mode, backend],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    lines = []
    try:
        for _ in range(after_lines):
            lines.append(child.stdout.readline().strip())
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=scaled(30))
        child.stdout.close()
    return lines


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.subprocess
def test_sigkill_between_buffered_writes_and_commit_restores_last_checkpoint(
    tmp_path: Path, backend: str
) -> None:
    path = tmp_path / "s.db"
    lines = run_child_and_kill(path, "buffered", backend, after_lines=3)
    assert lines == ["COMMITTED 1", "COMMITTED 2", "BUFFERED"]

    async def check() -> None:
        async with await StateStore.open(path) as store:
            assert store.committed_epoch == 2
            values = await store.read_all("actor", "t")
            assert set(values.values()) == {2}
            assert len(values) == 200

    anyio.run(check, backend=backend)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.subprocess
def test_sigkill_during_commits_leaves_exactly_one_checkpoint(tmp_path: Path, backend: str) -> None:
    # Killed at an arbitrary point of a stream of commits, often inside a transaction: the
    # store must hold every key of exactly one checkpoint — never a mix.
    path = tmp_path / "s.db"
    lines = run_child_and_kill(path, "loop", backend, after_lines=25)
    assert lines[-1].startswith("COMMITTED")

    async def check() -> None:
        async with await StateStore.open(path) as store:
            epoch = store.committed_epoch
            assert epoch >= 25
            values = await store.read_all("actor", "t")
            assert set(values.values()) == {epoch}
            assert len(values) == 200

    anyio.run(check, backend=backend)


@pytest.mark.anyio
async def test_version_1_store_is_migrated_with_its_state(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with await StateStore.open(path) as store:
        store.table("a", "t").put("k", 1)
        store._tables["a", "t"].seal(5)
        await store.commit(5)
    with sqlite3.connect(path) as db:  # what a version-1 store looked like
        for table in ("bf_sink_state", "bf_segment"):
            db.execute(f"DROP TABLE {table}")
        db.execute("UPDATE bf_meta SET value = '1' WHERE key = 'schema_version'")
    async with await StateStore.open(path) as store:
        assert store.committed_epoch == 5
        assert await store.read("a", "t", "k") == 1
        assert await store.epoch_records("s").list() == []
        versioned = await store.versioned_table(
            "a", "v", schema=pa.schema([pa.field("k", pa.int64(), nullable=False)]),
            primary_key=["k"],
        )  # fmt: skip
        assert versioned.epochs_after(0) == []
    with sqlite3.connect(path) as db:
        (version,) = db.execute("SELECT value FROM bf_meta WHERE key = 'schema_version'").fetchone()
    assert version == "3"


@pytest.mark.anyio
async def test_pending_records_after_committed_epoch_abort_at_open(tmp_path: Path) -> None:
    from barrierflow.runtime.state.epoch_records import RecordStatus as SinkState

    path = tmp_path / "s.db"
    async with await StateStore.open(path) as store:
        store.table("a", "t").put("k", 1)
        store._tables["a", "t"].seal(10)
        await store.commit(10)
        states = store.epoch_records("iceberg")
        await states.add_pending(5, {"files": ["a"]}, None)
        await states.commit_and_prune(5)
        await states.add_pending(10, {"files": ["b"]}, None)  # durable checkpoint: stays
        await states.add_pending(12, {"files": ["c"]}, {"add": "x"})  # after it: aborted
    async with await StateStore.open(path) as store:
        records = await store.epoch_records("iceberg").list()
        assert [(r.epoch, r.status) for r in records] == [
            (5, SinkState.COMMITTED),
            (10, SinkState.PENDING),
            (12, SinkState.ABORTED),
        ]
        assert records[2].payload == {"files": ["c"]}
        assert records[2].extra == {"add": "x"}
        await store.epoch_records("iceberg").commit_and_prune(10)
        await store.epoch_records("iceberg").delete([12])
        records = await store.epoch_records("iceberg").list()
        assert [(r.epoch, r.status) for r in records] == [(10, SinkState.COMMITTED)]
