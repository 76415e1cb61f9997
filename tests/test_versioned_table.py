"""The versioned table of the state store: rows as of any epoch a reader still needs, the change
log of each epoch, durability with checkpoints, pins and compaction, crashes."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from _portals import portal_case
from anyio.from_thread import BlockingPortal
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from barrierflow.channels import Op
from barrierflow.channels.vnode import compute_vnodes
from barrierflow.errors import (
    EpochNotSealedError,
    EpochOrderError,
    InvalidArgumentError,
    SchemaMismatchError,
    VersionCompactedError,
)
from barrierflow.runtime import StateStore
from barrierflow.runtime.state.versioned_table import VersionedTable

SCHEMA = pa.schema([pa.field("k", pa.int64(), nullable=False), ("v", pa.int64())])
VNODES = 4
#: The vnode of every key the tests use (the table's own hash: the dispatcher's).
KEY_VNODE = dict(enumerate(compute_vnodes(pa.table({"k": np.arange(16)}), ["k"], VNODES).tolist()))

Row = tuple[int, int]  # key, value


def rows_of(table: pa.Table) -> list[Row]:
    return list(zip(table.column("k").to_pylist(), table.column("v").to_pylist(), strict=True))


def log_of(table: pa.Table) -> list[tuple[int, int, int]]:
    return list(
        zip(
            table.column("k").to_pylist(),
            table.column("v").to_pylist(),
            table.column("_op").to_pylist(),
            strict=True,
        )
    )


def apply(state: dict[int, int], writes: list[tuple[int, int, int]]) -> dict[int, int]:
    """The upsert rule: the last write of a key decides."""
    state = dict(state)
    for key, value, op in writes:
        if op in (Op.INSERT, Op.UPDATE_INSERT):
            state[key] = value
        else:
            state.pop(key, None)
    return state


WRITES = st.lists(
    st.tuples(
        st.integers(0, 15),
        st.integers(-100, 100),
        st.sampled_from([Op.INSERT, Op.DELETE, Op.UPDATE_DELETE, Op.UPDATE_INSERT]),
    ),
    min_size=1,
    max_size=12,
)


class VersionedTableMachine(RuleBasedStateMachine):
    """The table and a dict-of-versions model agree after every step: writes with updates and
    deletes, seals, checkpoints, pins, compactions (every third durable delta), crashes (with
    and without files written for a checkpoint that never committed)."""

    backend = "asyncio"
    shared_portal: BlockingPortal | None = None

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "state.db")
        assert self.shared_portal is not None, "run through portal_case"
        self.portal: BlockingPortal = self.shared_portal
        self.versions: dict[int, dict[int, int]] = {0: {}}  # sealed epoch → contents
        self.logs: dict[int, list[tuple[int, int, int]]] = {}  # sealed epoch → its writes
        self.pending: list[tuple[int, int, int]] = []
        self.epoch = 0
        self.committed = 0
        self.pins: dict[str, int] = {}
        self._open()

    def _open(self) -> None:
        self.store: StateStore = self.portal.call(StateStore.open, self.path)
        self.table: VersionedTable = self.portal.call(
            lambda: self.store.versioned_table(
                "view", "rows", schema=SCHEMA, primary_key=["k"], vnode_count=VNODES,
                compact_after=2,
            )
        )  # fmt: skip

    @property
    def current(self) -> dict[int, int]:
        return apply(self.versions[self.epoch], self.pending)

    @rule(writes=WRITES)
    def write(self, writes: list[tuple[int, int, int]]) -> None:
        batch = pa.table({"k": [w[0] for w in writes], "v": [w[1] for w in writes]}, SCHEMA)
        self.table.write(batch, ops=[int(w[2]) for w in writes])
        self.pending += writes

    @rule()
    def seal(self) -> None:
        self.versions[self.epoch + 1] = self.current
        self.epoch += 1
        self.logs[self.epoch] = self.pending
        self.pending = []
        self.table.seal(self.epoch)

    @precondition(lambda self: self.epoch > self.committed)
    @rule()
    def checkpoint(self) -> None:
        self.portal.call(self.store.commit, self.epoch)
        self.committed = self.epoch
        oldest = self.table.oldest_epoch
        assert oldest <= min([self.committed, *self.pins.values()])

    @rule(reader=st.sampled_from(["r1", "r2"]), data=st.data())
    def pin(self, reader: str, data: st.DataObject) -> None:
        epoch = data.draw(st.integers(self.table.oldest_epoch, self.epoch))
        self.table.pin(reader, epoch)
        self.pins[reader] = epoch

    @rule(reader=st.sampled_from(["r1", "r2"]))
    def unpin(self, reader: str) -> None:
        self.table.unpin(reader)
        self.pins.pop(reader, None)

    @rule(files_written=st.booleans())
    def crash(self, files_written: bool) -> None:
        if files_written and self.epoch > self.committed:
            # The checkpoint's files are written, its transaction never happens.
            self.portal.call(self.table._persist_through, self.epoch)
        self.portal.call(self.store.aclose)
        self._open()
        for epoch in range(self.committed + 1, self.epoch + 1):
            del self.versions[epoch], self.logs[epoch]
        self.epoch, self.pending = self.committed, []
        # Pins live in memory: a reader pins again when it starts.
        assert self.table.pins == {}
        self.pins = {}

    @rule(data=st.data())
    def read_a_version(self, data: st.DataObject) -> None:
        epoch = data.draw(st.integers(0, self.epoch + 1))
        vnode = data.draw(st.integers(0, VNODES - 1))
        after = data.draw(st.none() | st.integers(-1, 16))
        read = self.table.read_vnode
        if epoch > self.epoch:
            with pytest.raises(EpochNotSealedError):
                self.portal.call(read, vnode, epoch)
            return
        if epoch < self.table.oldest_epoch:
            with pytest.raises(VersionCompactedError) as compacted:
                self.portal.call(read, vnode, epoch)
            oldest = self.table.oldest_epoch
            assert (compacted.value.epoch, compacted.value.oldest) == (epoch, oldest)
            return
        got = rows_of(
            self.portal.call(lambda: read(vnode, epoch, after=None if after is None else [after]))
        )
        expected = sorted(
            (k, v)
            for k, v in self.versions[epoch].items()
            if KEY_VNODE[k] == vnode and (after is None or k > after)
        )
        assert got == expected

    @rule(data=st.data())
    def read_a_change_log(self, data: st.DataObject) -> None:
        epoch = data.draw(st.integers(1, self.epoch + 1))
        if epoch > self.epoch:
            with pytest.raises(EpochNotSealedError):
                self.portal.call(self.table.change_log, epoch)
            return
        if self.table.oldest_epoch and epoch <= self.table.oldest_epoch:
            with pytest.raises(VersionCompactedError):
                self.portal.call(self.table.change_log, epoch)
            return
        got = log_of(self.portal.call(self.table.change_log, epoch))
        # By vnode, each vnode's writes in the order written.
        order = sorted(range(len(self.logs[epoch])), key=lambda i: (
            KEY_VNODE[self.logs[epoch][i][0]], i
        ))  # fmt: skip
        assert got == [(k, v, int(op)) for k, v, op in (self.logs[epoch][i] for i in order)]

    @invariant()
    def the_last_sealed_version_agrees(self) -> None:
        if self.epoch < self.table.oldest_epoch:
            return
        got: list[Row] = []
        for vnode in range(VNODES):
            got += rows_of(self.portal.call(self.table.read_vnode, vnode, self.epoch))
        assert sorted(got) == sorted(self.versions[self.epoch].items())

    @invariant()
    def epochs_agree(self) -> None:
        assert self.table.last_sealed_epoch == self.epoch
        assert self.store.committed_epoch == self.committed
        oldest = self.table.oldest_epoch
        with_writes = [e for e in range(oldest + 1, self.epoch + 1) if self.logs.get(e)]
        assert self.table.epochs_after(oldest) == with_writes

    def teardown(self) -> None:
        self.portal.call(self.store.aclose)
        self.dir.cleanup()


class VersionedTableOnTrio(VersionedTableMachine):
    backend = "trio"


SETTINGS = settings(max_examples=40, stateful_step_count=30, deadline=None)
TestVersionedTableAsyncio = portal_case(VersionedTableMachine)
TestVersionedTableAsyncio.settings = SETTINGS
TestVersionedTableTrio = portal_case(VersionedTableOnTrio)
TestVersionedTableTrio.settings = SETTINGS


# Named cases.


async def open_table(path: Path, **options: Any) -> tuple[StateStore, VersionedTable]:
    store = await StateStore.open(path / "state.db")
    table = await store.versioned_table(
        "view", "rows", schema=SCHEMA, primary_key=["k"], vnode_count=VNODES, **options
    )
    return store, table


def batch(*rows: Row) -> pa.Table:
    return pa.table({"k": [r[0] for r in rows], "v": [r[1] for r in rows]}, SCHEMA)


@pytest.mark.anyio
async def test_a_sealed_epoch_is_readable_before_its_checkpoint_and_gone_after_a_crash(
    tmp_path: Path,
) -> None:
    store, table = await open_table(tmp_path)
    async with store:
        table.write(batch((1, 10), (2, 20)))
        table.seal(1)
        await store.commit(1)
        table.write(batch((1, 11)), ops=[Op.UPDATE_INSERT])
        table.seal(2)
        assert table.epochs_after(1) == [2]
        assert log_of(await table.change_log(2)) == [(1, 11, Op.UPDATE_INSERT)]
        vnode = KEY_VNODE[1]
        assert (1, 11) in rows_of(await table.read_vnode(vnode, 2))
    store, table = await open_table(tmp_path)  # epoch 2 never became durable
    async with store:
        assert table.last_sealed_epoch == 1
        assert (1, 10) in rows_of(await table.read_vnode(KEY_VNODE[1], 1))
        with pytest.raises(EpochNotSealedError) as unsealed:
            await table.change_log(2)
        assert (unsealed.value.epoch, unsealed.value.sealed) == (2, 1)


@pytest.mark.anyio
async def test_a_pin_keeps_its_version_through_compaction_and_is_gone_after_a_restart(
    tmp_path: Path,
) -> None:
    store, table = await open_table(tmp_path, compact_after=1)
    async with store:
        table.write(batch((1, 1)))
        table.seal(1)
        table.pin("backfill", 1)
        for epoch in range(2, 6):
            table.write(batch((1, epoch)))
            table.seal(epoch)
            await store.commit(epoch)
        assert table.oldest_epoch == 1  # pinned: nothing after 1 was folded
        assert rows_of(await table.read_vnode(KEY_VNODE[1], 1)) == [(1, 1)]
    store, table = await open_table(tmp_path, compact_after=1)
    async with store:
        assert table.pins == {}  # in memory: a reader pins again at its first barrier
        table.seal(6)
        await store.commit(6)
        assert table.oldest_epoch == 6
        with pytest.raises(VersionCompactedError) as compacted:
            await table.read_vnode(KEY_VNODE[1], 3)
        assert (compacted.value.epoch, compacted.value.oldest) == (3, 6)
        assert rows_of(await table.read_vnode(KEY_VNODE[1], 6)) == [(1, 5)]
        assert sorted(p.name for p in table.directory.iterdir()) == [f"base-{6:020d}.arrow"]


@pytest.mark.anyio
async def test_a_version_is_read_in_key_order_resuming_after_a_key(tmp_path: Path) -> None:
    store, table = await open_table(tmp_path)
    async with store:
        table.write(batch(*((k, k * 10) for k in (9, 3, 15, 0, 7, 12))))
        table.seal(1)
        await store.commit(1)
        for vnode in range(VNODES):
            keys = sorted(k for k in (9, 3, 15, 0, 7, 12) if KEY_VNODE[k] == vnode)
            assert [k for k, _ in rows_of(await table.read_vnode(vnode, 1))] == keys
            if keys:
                rest = rows_of(await table.read_vnode(vnode, 1, after=[keys[0]]))
                assert [k for k, _ in rest] == keys[1:]


@pytest.mark.anyio
async def test_an_empty_table_and_empty_vnodes_read_as_no_rows(tmp_path: Path) -> None:
    store, table = await open_table(tmp_path)
    async with store:
        table.seal(1)
        await store.commit(1)
        for vnode in range(VNODES):
            assert (await table.read_vnode(vnode, 1)).num_rows == 0
        assert (await table.change_log(1)).num_rows == 0
        assert table.epochs_after(0) == []


@pytest.mark.anyio
async def test_bad_input_is_refused_with_what_was_expected(tmp_path: Path) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        with pytest.raises(InvalidArgumentError) as missing:
            await store.versioned_table("v", "t", schema=SCHEMA, primary_key=["id"])
        assert (missing.value.argument, missing.value.got) == ("primary_key", "id")
        with pytest.raises(InvalidArgumentError) as nullable:
            await store.versioned_table("v", "t", schema=SCHEMA, primary_key=["v"])
        assert nullable.value.argument == "primary_key"
        assert "nullable" in str(nullable.value)
        table = await store.versioned_table("v", "t", schema=SCHEMA, primary_key=["k"])
        with pytest.raises(SchemaMismatchError):
            table.write(pa.table({"k": [1]}))
        with pytest.raises(SchemaMismatchError) as nulls:
            loose = pa.schema([("k", pa.int64()), ("v", pa.int64())])  # k nullable here
            table.write(pa.table({"k": [1, None], "v": [1, 2]}, loose))
        assert nulls.value.null_field == "k"
        with pytest.raises(InvalidArgumentError) as ops:
            table.write(batch((1, 1)), ops=[7])
        assert ops.value.argument == "ops"
        table.seal(1)
        with pytest.raises(EpochOrderError):
            table.seal(1)
        with pytest.raises(InvalidArgumentError) as vnode:
            await table.read_vnode(256, 1)
        assert vnode.value.argument == "vnode"
        with pytest.raises(InvalidArgumentError) as reopened:
            await store.versioned_table("v", "t", schema=SCHEMA, primary_key=["k"])
        assert reopened.value.argument == "name"


@pytest.mark.anyio
async def test_a_table_reopened_with_another_schema_is_refused(tmp_path: Path) -> None:
    store, table = await open_table(tmp_path)
    async with store:
        table.write(batch((1, 1)))
        table.seal(1)
        await store.commit(1)
    other = pa.schema([pa.field("k", pa.int64(), nullable=False), ("v", pa.string())])
    async with await StateStore.open(tmp_path / "state.db") as store:
        with pytest.raises(SchemaMismatchError):
            await store.versioned_table(
                "view", "rows", schema=other, primary_key=["k"], vnode_count=VNODES
            )


def test_op_codes_of_no_rows_are_an_empty_array_not_a_failed_range_check() -> None:
    from barrierflow.runtime.state.versioned_checks import op_codes

    assert op_codes([], 0).equals(pa.array([], pa.int8()))
    with pytest.raises(InvalidArgumentError):
        op_codes([0], 0)
