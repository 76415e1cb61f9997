"""The vnode-partitioned state store on a shared directory (issue 38's first piece): reads as
of a committed epoch, staging per task attempt, one atomic and idempotent commit per epoch,
compaction that keeps pinned readers working, and recovery from a crash at each step of a
commit by calling commit again.

Spark tasks are simulated by calling :meth:`VnodeStateStore.stage` in this process; a crash is
simulated by a step of the commit raising, after which a new store object (a restarted driver)
calls commit again.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from barrierflow import _fs
from barrierflow.channels import Op, VnodeBitmap
from barrierflow.channels.vnode import compute_vnodes
from barrierflow.connectors import vnode_state
from barrierflow.connectors.vnode_state import StateDelta, VnodeStateStore
from barrierflow.errors import (
    EpochOrderError,
    ExecutorStagingError,
    InvalidArgumentError,
    SchemaMismatchError,
    StateCommitConflictError,
    VersionCompactedError,
    VnodeOwnershipError,
)

SCHEMA = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("v", pa.int64())])
VNODES = 8
HALVES = VnodeBitmap.split(2, VNODES)
UPSERT, DELETE = int(Op.INSERT), int(Op.DELETE)


def make_store(root: Path, **options: Any) -> VnodeStateStore:
    return VnodeStateStore(
        root, ("k",), SCHEMA, vnode_count=VNODES, **({"base_ranges": 2} | options)
    )


def as_dict(table: pa.Table) -> dict[int, int | None]:
    rows = table.to_pydict()
    return dict(zip(rows["k"], rows["v"], strict=True))


def stage_epoch(
    store: VnodeStateStore,
    number: int,
    changes: Sequence[tuple[int, int, int | None]],
    attempt: str = "a",
) -> list[StateDelta]:
    """Stage ``changes`` (key, op, value) as the two tasks owning each half of the vnodes do."""
    table = pa.table({"k": [c[0] for c in changes], "v": [c[2] for c in changes]}, schema=SCHEMA)
    ops = pa.array([c[1] for c in changes], pa.int8())
    vnodes = compute_vnodes(table, ["k"], VNODES)
    deltas = []
    for task, bitmap in enumerate(HALVES):
        mine = pa.array(bitmap.mask[vnodes])
        deltas.append(
            store.stage(number, f"{attempt}{task}", bitmap, table.filter(mine), ops.filter(mine))
        )
    return deltas


def commit_epoch(
    store: VnodeStateStore, epoch: int, changes: Sequence[tuple[int, int, int | None]]
) -> list[StateDelta]:
    deltas = stage_epoch(store, epoch, changes)
    store.commit(epoch, deltas)
    return deltas


def read_all(store: VnodeStateStore, as_of: int) -> dict[int, int | None]:
    return as_dict(store.read(VnodeBitmap.full(VNODES), as_of))


# Reads as of an epoch.


def test_read_as_of_an_epoch_sees_each_keys_last_committed_write_and_no_deleted_key(
    tmp_path: Path,
) -> None:
    store = make_store(tmp_path)
    commit_epoch(store, 10, [(1, UPSERT, 1), (2, UPSERT, 2), (3, UPSERT, 3), (1, UPSERT, 11)])
    commit_epoch(store, 20, [(2, DELETE, None), (4, UPSERT, 4), (4, DELETE, None)])
    commit_epoch(store, 30, [(2, UPSERT, 22), (3, int(Op.UPDATE_DELETE), 3)])
    commit_epoch(store, 40, [(3, int(Op.UPDATE_INSERT), 33), (5, DELETE, None)])
    assert read_all(store, 0) == {}
    assert read_all(store, 10) == {1: 11, 2: 2, 3: 3}
    assert read_all(store, 15) == {1: 11, 2: 2, 3: 3}
    assert read_all(store, 20) == {1: 11, 3: 3}
    assert read_all(store, 30) == {1: 11, 2: 22}
    assert read_all(store, 40) == {1: 11, 2: 22, 3: 33}
    assert store.committed_epochs() == [10, 20, 30, 40]


def test_read_returns_only_the_rows_of_the_asked_vnodes(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    keys = list(range(40))
    commit_epoch(store, 1, [(k, UPSERT, k * 10) for k in keys])
    table = pa.table({"k": keys}, schema=pa.schema([SCHEMA.field("k")]))
    vnode_of = dict(zip(keys, compute_vnodes(table, ["k"], VNODES).tolist(), strict=True))
    for asked in ([0], [1, 5], [2, 3, 4, 6, 7]):
        got = as_dict(store.read(asked, 1))
        assert got == {k: k * 10 for k in keys if vnode_of[k] in asked}


def test_read_of_an_epoch_not_committed_yet_is_refused(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    commit_epoch(store, 5, [(1, UPSERT, 1)])
    with pytest.raises(InvalidArgumentError) as caught:
        store.read(range(VNODES), 6)
    assert caught.value.argument == "as_of"


def test_staged_deltas_are_invisible_until_their_epoch_commits(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    commit_epoch(store, 1, [(1, UPSERT, 1)])
    deltas = stage_epoch(store, 2, [(1, DELETE, None), (2, UPSERT, 2)])
    assert read_all(store, 1) == {1: 1}
    assert store.committed_epochs() == [1]
    store.commit(2, deltas)
    assert read_all(store, 2) == {2: 2}


def test_a_failed_or_speculative_attempts_delta_is_never_read(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    stage_epoch(store, 7, [(1, UPSERT, 666), (2, UPSERT, 666)], attempt="failed")
    kept = stage_epoch(store, 7, [(1, UPSERT, 1), (2, UPSERT, 2)], attempt="ok")
    store.commit(1, kept)
    assert read_all(store, 1) == {1: 1, 2: 2}
    assert store.staged_numbers() == []  # the other attempts of the micro-batch are gone


def test_drop_staged_deletes_what_a_failed_micro_batch_staged(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    deltas = stage_epoch(store, 3, [(1, UPSERT, 1)])
    stage_epoch(store, 4, [(2, UPSERT, 2)])
    assert store.staged_numbers() == [3, 4]
    store.drop_staged(3)
    assert store.staged_numbers() == [4]
    with pytest.raises(ExecutorStagingError):
        store.commit(1, deltas)
    assert store.committed_epochs() == []


# Commits.


def test_commit_again_with_the_same_deltas_is_a_no_op(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    deltas = commit_epoch(store, 1, [(1, UPSERT, 1)])
    manifest = (tmp_path / vnode_state.MANIFEST).read_bytes()
    store.commit(1, deltas)
    make_store(tmp_path).commit(1, list(reversed(deltas)))
    assert (tmp_path / vnode_state.MANIFEST).read_bytes() == manifest
    assert store.committed_epochs() == [1]
    assert read_all(store, 1) == {1: 1}


def test_commit_of_a_committed_epoch_with_other_deltas_is_refused(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    commit_epoch(store, 1, [(1, UPSERT, 1)])
    other = stage_epoch(store, 9, [(1, UPSERT, 2)])
    with pytest.raises(StateCommitConflictError) as caught:
        store.commit(1, other)
    assert caught.value.epoch == 1
    assert caught.value.committed == ((1, "a0"), (1, "a1"))
    assert caught.value.got == ((9, "a0"), (9, "a1"))
    assert read_all(store, 1) == {1: 1}


def test_commit_of_an_epoch_folded_into_a_base_with_other_deltas_is_refused(
    tmp_path: Path,
) -> None:
    store = make_store(tmp_path)
    first = commit_epoch(store, 1, [(1, UPSERT, 1)])
    commit_epoch(store, 2, [(2, UPSERT, 2)])
    store.compact(2)
    store.commit(1, first)  # a replay: its deltas were moved
    with pytest.raises(StateCommitConflictError):
        store.commit(1, stage_epoch(store, 9, [(1, UPSERT, 2)]))


def test_commit_of_an_uncommitted_epoch_below_the_last_one_is_refused(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    commit_epoch(store, 5, [(1, UPSERT, 1)])
    with pytest.raises(EpochOrderError) as caught:
        store.commit(3, stage_epoch(store, 3, [(2, UPSERT, 2)]))
    assert (caught.value.previous, caught.value.current) == (5, 3)


def test_deltas_that_own_a_vnode_twice_are_refused(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    one = store.stage(1, "a", [0, 1], SCHEMA.empty_table(), [])
    two = store.stage(1, "b", [1, 2], SCHEMA.empty_table(), [])
    with pytest.raises(VnodeOwnershipError) as caught:
        store.commit(1, [one, two])
    assert caught.value.overlapping == {1}
    assert store.committed_epochs() == []


def test_stage_refuses_a_change_of_a_vnode_the_attempt_does_not_own(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    table = pa.table({"k": list(range(20)), "v": list(range(20))}, schema=SCHEMA)
    with pytest.raises(InvalidArgumentError) as caught:
        store.stage(1, "a", HALVES[0], table, [UPSERT] * 20)
    assert caught.value.argument == "changes"
    assert store.staged_numbers() == []


def test_an_epoch_without_changes_is_a_version(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    commit_epoch(store, 1, [(1, UPSERT, 1)])
    store.commit(2, [])
    assert store.committed_epochs() == [1, 2]
    assert read_all(store, 2) == {1: 1}


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda s: s.stage(-1, "a", [0], SCHEMA.empty_table(), []), "number"),
        (lambda s: s.stage(True, "a", [0], SCHEMA.empty_table(), []), "number"),
        (lambda s: s.stage(1, "../x", [0], SCHEMA.empty_table(), []), "attempt"),
        (lambda s: s.stage(1, "", [0], SCHEMA.empty_table(), []), "attempt"),
        (lambda s: s.stage(1, "a", [VNODES], SCHEMA.empty_table(), []), "vnodes"),
        (lambda s: s.stage(1, "a", "01", SCHEMA.empty_table(), []), "vnodes"),
        (lambda s: s.stage(1, "a", VnodeBitmap.full(4), SCHEMA.empty_table(), []), "vnodes"),
        (lambda s: s.stage(1, "a", [0], [1, 2], []), "changes"),
        (lambda s: s.stage(1, "a", [0], SCHEMA.empty_table(), [1]), "ops"),
        (lambda s: s.stage(1, "a", [0], SCHEMA.empty_table(), None), "ops"),
        (lambda s: s.read([0], -1), "as_of"),
        (lambda s: s.read([0], 1.0), "as_of"),
        (lambda s: s.commit(0, []), "epoch"),
        (lambda s: s.commit(1, [object()]), "deltas"),
        (lambda s: s.commit(1, "x"), "deltas"),
        (lambda s: s.compact(1), "up_to"),
        (lambda s: s.compact(1, pinned=5), "pinned"),
        (lambda s: s.compact(1, pinned=["5"]), "pinned"),
        (lambda s: s.drop_staged(-2), "number"),
    ],
)
def test_bad_arguments_raise_a_typed_error_naming_the_argument(
    tmp_path: Path, call: Any, argument: str
) -> None:
    store = make_store(tmp_path)
    with pytest.raises(InvalidArgumentError) as caught:
        call(store)
    assert caught.value.argument == argument


def test_changes_of_another_schema_are_refused(tmp_path: Path) -> None:
    other = pa.table({"k": [1], "w": [1]})
    with pytest.raises(SchemaMismatchError):
        make_store(tmp_path).stage(1, "a", range(VNODES), other, [UPSERT])


@pytest.mark.parametrize(
    ("options", "argument"),
    [
        ({"key": ("v",)}, "key"),  # nullable
        ({"key": ("x",)}, "key"),
        ({"key": "k"}, "key"),
        ({"schema": "s"}, "schema"),
        ({"schema": SCHEMA.append(pa.field("__vnode", pa.int16()))}, "schema"),
        ({"vnode_count": 0}, "vnode_count"),
        ({"base_ranges": 0}, "base_ranges"),
        ({"root": ""}, "path"),
    ],
)
def test_a_bad_constructor_argument_raises_a_typed_error(
    tmp_path: Path, options: dict[str, Any], argument: str
) -> None:
    given = {"root": tmp_path, "key": ("k",), "schema": SCHEMA} | options
    with pytest.raises(InvalidArgumentError) as caught:
        VnodeStateStore(given.pop("root"), given.pop("key"), given.pop("schema"), **given)
    assert caught.value.argument == argument


@pytest.mark.parametrize(
    ("options", "argument"),
    [
        ({"vnode_count": 16}, "vnode_count"),
        ({"schema": SCHEMA.append(pa.field("w", pa.int64()))}, "schema"),
    ],
)
def test_reopening_a_store_with_another_vnode_count_or_schema_is_refused(
    tmp_path: Path, options: dict[str, Any], argument: str
) -> None:
    commit_epoch(make_store(tmp_path), 1, [(1, UPSERT, 1)])
    given = {"schema": SCHEMA, "vnode_count": VNODES, "base_ranges": 2} | options
    with pytest.raises(InvalidArgumentError) as caught:
        VnodeStateStore(tmp_path, ("k",), given.pop("schema"), **given)
    assert caught.value.argument == argument


# Crashes in a commit: each step interrupted, then commit called again by a new driver.


class SimulatedCrashError(Exception):
    """The simulated death of the driver at a step of a commit."""


CRASH_POINTS = ["before_first_move", "after_first_move", "before_publish", "after_publish"]


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_a_commit_cut_short_at_any_step_is_invisible_or_whole_and_commit_again_completes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    store = make_store(tmp_path)
    commit_epoch(store, 1, [(1, UPSERT, 1), (2, UPSERT, 2)])
    deltas = stage_epoch(store, 2, [(1, DELETE, None), (3, UPSERT, 3), (4, UPSERT, 4)])
    moves = 0
    move, publish, remove = (
        vnode_state._move_delta,
        vnode_state._publish,
        vnode_state._remove_staged,
    )

    def crashing_move(*args: Any) -> None:
        nonlocal moves
        if point == "before_first_move" or (point == "after_first_move" and moves == 1):
            raise SimulatedCrashError
        moves += 1
        move(*args)

    def crashing_publish(*args: Any) -> None:
        if point == "before_publish":
            raise SimulatedCrashError
        publish(*args)

    def crashing_remove(*args: Any) -> None:
        raise SimulatedCrashError

    monkeypatch.setattr(vnode_state, "_move_delta", crashing_move)
    monkeypatch.setattr(vnode_state, "_publish", crashing_publish)
    monkeypatch.setattr(vnode_state, "_remove_staged", crashing_remove)
    with pytest.raises(SimulatedCrashError):
        store.commit(2, deltas)
    monkeypatch.setattr(vnode_state, "_move_delta", move)
    monkeypatch.setattr(vnode_state, "_publish", publish)
    monkeypatch.setattr(vnode_state, "_remove_staged", remove)

    restarted = make_store(tmp_path)
    if point == "after_publish":
        assert restarted.committed_epochs() == [1, 2]
        assert read_all(restarted, 2) == {2: 2, 3: 3, 4: 4}
    else:
        assert restarted.committed_epochs() == [1]
        with pytest.raises(InvalidArgumentError):
            restarted.read(range(VNODES), 2)
    assert read_all(restarted, 1) == {1: 1, 2: 2}
    restarted.commit(2, deltas)
    assert restarted.committed_epochs() == [1, 2]
    assert read_all(restarted, 2) == {2: 2, 3: 3, 4: 4}
    assert restarted.staged_numbers() == []


# Compaction.


def test_compaction_keeps_every_read_from_up_to_on_and_of_pinned_epochs(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    expected = {}
    for epoch in range(1, 9):
        commit_epoch(store, epoch, [(epoch, UPSERT, epoch), (epoch - 1, DELETE, None)])
        expected[epoch] = read_all(store, epoch)
    store.compact(5, pinned=[2])
    for epoch in [2, 5, 6, 7, 8]:
        assert read_all(store, epoch) == expected[epoch]
    assert read_all(store, 1) == expected[1]  # the pin's files hold it: right rows or none
    for epoch in [3, 4]:
        with pytest.raises(VersionCompactedError) as caught:
            store.read(range(VNODES), epoch)
        assert caught.value.epoch == epoch
    commit_epoch(store, 9, [(9, UPSERT, 9)])
    assert read_all(store, 9) == {8: 8, 9: 9}


def test_a_pinned_epoch_after_an_older_base_keeps_that_base_through_a_newer_compaction(
    tmp_path: Path,
) -> None:
    store = make_store(tmp_path)
    for epoch in range(1, 4):
        commit_epoch(store, epoch, [(epoch, UPSERT, epoch)])
    store.compact(2)
    for epoch in range(4, 7):
        commit_epoch(store, epoch, [(epoch, UPSERT, epoch), (epoch - 3, DELETE, None)])
    store.compact(6, pinned=[4])
    assert read_all(store, 4) == {2: 2, 3: 3, 4: 4}
    assert read_all(store, 6) == {4: 4, 5: 5, 6: 6}
    with pytest.raises(VersionCompactedError):
        store.read(range(VNODES), 5)


def test_compaction_deletes_the_files_no_reader_needs_once_the_pin_is_released(
    tmp_path: Path,
) -> None:
    store = make_store(tmp_path)
    for epoch in range(1, 5):
        commit_epoch(store, epoch, [(epoch, UPSERT, epoch)])
    store.compact(3, pinned=[1])
    assert (tmp_path / "deltas" / vnode_state._name(1)).exists()
    assert not (tmp_path / "deltas" / vnode_state._name(2)).exists()
    store.compact(3)  # the pin is released: the same base, fewer files
    assert read_all(store, 3) == {1: 1, 2: 2, 3: 3}
    with pytest.raises(VersionCompactedError):
        store.read(range(VNODES), 1)
    left = sorted(p.relative_to(tmp_path).parts[0:2] for p in tmp_path.rglob("*.parquet"))
    assert left == [("bases", vnode_state._name(3))] * 2 + [("deltas", vnode_state._name(4))] * 2


def test_compaction_writes_one_base_file_per_vnode_range(tmp_path: Path) -> None:
    store = make_store(tmp_path, base_ranges=4)
    commit_epoch(store, 1, [(k, UPSERT, k) for k in range(50)])
    store.compact(1)
    files = sorted((tmp_path / "bases" / vnode_state._name(1)).glob("*.parquet"))
    assert [f.name for f in files] == [
        "r00000-00002.parquet",
        "r00002-00004.parquet",
        "r00004-00006.parquet",
        "r00006-00008.parquet",
    ]
    for file, first in zip(files, (0, 2, 4, 6), strict=True):
        vnodes = pq.read_table(file).column(vnode_state.VNODE_COLUMN).to_numpy()
        assert set(vnodes.tolist()) <= {first, first + 1}
    assert read_all(store, 1) == {k: k for k in range(50)}


def test_a_read_that_loses_a_file_to_a_compaction_reads_the_new_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store(tmp_path)
    for epoch in range(1, 4):
        commit_epoch(store, epoch, [(epoch, UPSERT, epoch)])
    read_table = pq.read_table
    compacted = False

    def compact_first(*args: Any, **kwargs: Any) -> pa.Table:
        nonlocal compacted
        if not compacted:  # the manifest is read: a compaction deletes the deltas now
            compacted = True
            make_store(tmp_path).compact(3)
        return read_table(*args, **kwargs)

    monkeypatch.setattr(pq, "read_table", compact_first)
    assert read_all(store, 3) == {1: 1, 2: 2, 3: 3}
    assert compacted


def test_commits_and_reads_go_on_while_a_compaction_writes_its_base(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store(tmp_path)
    for epoch in range(1, 4):
        commit_epoch(store, epoch, [(epoch, UPSERT, epoch)])
    write = vnode_state._write_parquet
    seen: dict[str, Any] = {}

    def commit_meanwhile(path: Path, table: pa.Table) -> None:
        if "bases" in path.parts and not seen:
            seen["committed"] = commit_epoch(make_store(tmp_path), 4, [(4, UPSERT, 4)])
            seen["read"] = read_all(make_store(tmp_path), 3)
        write(path, table)

    monkeypatch.setattr(vnode_state, "_write_parquet", commit_meanwhile)
    store.compact(3)
    assert seen["read"] == {1: 1, 2: 2, 3: 3}
    assert store.committed_epochs() == [3, 4]
    assert read_all(store, 4) == {1: 1, 2: 2, 3: 3, 4: 4}
    manifest = json.loads((tmp_path / vnode_state.MANIFEST).read_text())
    assert [b["epoch"] for b in manifest["bases"]] == [3]


# The store against a dict model.


KEYS = st.integers(0, 12)
CHANGES = st.lists(
    st.tuples(KEYS, st.sampled_from([UPSERT, DELETE, int(Op.UPDATE_INSERT)]), st.integers(0, 99)),
    max_size=8,
)


class StoreMachine(RuleBasedStateMachine):
    """Random commits (some cut short and completed by a restarted driver), failed attempts,
    compactions with pins, and reads, against a dict per committed epoch: a read returns the
    model's rows or, for an epoch that is neither at or after the newest base nor pinned,
    VersionCompactedError — never other rows."""

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="vnode-state-"))
        self.store = make_store(self.root)
        self.versions: dict[int, dict[int, int]] = {0: {}}
        self.epoch = 0
        self.number = 0
        self.base = 0  # the newest base's epoch (0: none)
        self.pinned: set[int] = set()

    def teardown(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    @initialize()
    def start(self) -> None:
        assert self.store.committed_epochs() == []

    def _apply(self, changes: list[tuple[int, int, int]]) -> dict[int, int]:
        state = dict(self.versions[self.epoch])
        for key, op, value in changes:
            if op == DELETE:
                state.pop(key, None)
            else:
                state[key] = value
        return state

    @rule(changes=CHANGES, gap=st.integers(1, 3), failed=st.booleans(), crash=st.booleans())
    def commit(
        self, changes: list[tuple[int, int, int]], gap: int, failed: bool, crash: bool
    ) -> None:
        self.number += 1
        if failed:
            stage_epoch(self.store, self.number, [(k, UPSERT, -1) for k, _, _ in changes], "f")
        deltas = stage_epoch(self.store, self.number, changes)
        epoch = self.epoch + gap
        if crash:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(vnode_state, "_publish", _crash)
                with pytest.raises(SimulatedCrashError):
                    self.store.commit(epoch, deltas)
            self.store = make_store(self.root)
        self.store.commit(epoch, deltas)
        self.versions[epoch] = self._apply(changes)
        self.epoch = epoch

    @precondition(lambda self: self.epoch > 0)
    @rule(data=st.data())
    def compact(self, data: st.DataObject) -> None:
        committed = sorted(self.versions)
        up_to = data.draw(st.sampled_from(committed[1:]))
        pins = data.draw(st.sets(st.sampled_from(committed)))
        self.store.compact(up_to, pinned=pins)
        was = self.base
        self.base = max(self.base, up_to)
        self.pinned = {p for p in pins if p < self.base and self._readable(p, was)}

    def _readable(self, epoch: int, base: int | None = None) -> bool:
        return epoch >= (self.base if base is None else base) or epoch in self.pinned

    @rule(data=st.data(), vnodes=st.sets(st.integers(0, VNODES - 1), min_size=1))
    def read(self, data: st.DataObject, vnodes: set[int]) -> None:
        as_of = data.draw(st.integers(0, self.epoch))
        committed = max(e for e in self.versions if e <= as_of)
        table = pa.table({"k": list(range(13))}, schema=pa.schema([SCHEMA.field("k")]))
        vnode_of = compute_vnodes(table, ["k"], VNODES)
        expected = {k: v for k, v in self.versions[committed].items() if vnode_of[k] in vnodes}
        try:
            got = as_dict(self.store.read(sorted(vnodes), as_of))
        except VersionCompactedError:
            assert not self._readable(committed)
            return
        assert got == expected

    @invariant()
    def epochs_agree(self) -> None:
        committed = self.store.committed_epochs()
        assert set(committed) <= set(self.versions)
        assert committed[-1:] == ([self.epoch] if self.epoch else [])
        assert self.store.staged_numbers() == []


def _crash(*args: Any) -> None:
    raise SimulatedCrashError


def test_the_store_agrees_with_a_dict_model_through_commits_crashes_compactions_and_reads() -> None:
    run_state_machine_as_test(
        StoreMachine,
        settings=settings(max_examples=40, stateful_step_count=25, deadline=None),
    )


def test_the_last_write_per_key_is_chosen_without_a_loop_per_row() -> None:
    rows = pa.table(
        {
            "k": np.array([1, 2, 1, 3, 2], dtype=np.int64),
            "v": [1, 2, 3, 4, 5],
            vnode_state.OP_COLUMN: pa.array([0, 0, 0, 0, 1], pa.int8()),
        }
    )
    assert vnode_state._latest(rows, ["k"]).to_pydict() == {
        "k": [1, 3],
        "v": [3, 4],
        vnode_state.OP_COLUMN: [0, 0],
    }


# What each refusal says: the argument, what was expected and what came.

FORMAT = "a directory of a vnode state store (barrierflow.vnode_state/1)"
ATTEMPT_NAMES = "1-100 letters, digits, '_', '.', '-' (not first: '.', '-')"
NOT_A_SCHEMA = object()
BOTH_KEYS = SCHEMA.set(1, pa.field("v", pa.int64(), nullable=False))


@pytest.mark.parametrize(
    ("call", "argument", "expected", "got"),
    [
        (lambda s: s.stage(-1, "a", [0], SCHEMA.empty_table(), []), "number", "an int >= 0", -1),
        (lambda s: s.stage(1, ".a", [0], SCHEMA.empty_table(), []), "attempt", ATTEMPT_NAMES, ".a"),
        (lambda s: s.stage(1, 5, [0], SCHEMA.empty_table(), []), "attempt", ATTEMPT_NAMES, 5),
        (
            lambda s: s.stage(1, "a", VnodeBitmap.full(4), SCHEMA.empty_table(), []),
            "vnodes",
            f"a bitmap of {VNODES} vnodes",
            VnodeBitmap.full(4),
        ),
        (
            lambda s: s.stage(1, "a", "01", SCHEMA.empty_table(), []),
            "vnodes",
            "a VnodeBitmap or a sequence of ints",
            "01",
        ),
        (
            lambda s: s.stage(1, "a", [0], SCHEMA.empty_table(), "ab"),
            "ops",
            "a sequence of Op codes (int8 0..3)",
            "ab",
        ),
        (
            lambda s: s.stage(1, "a", [0], SCHEMA.empty_table(), b""),
            "ops",
            "a sequence of Op codes (int8 0..3)",
            b"",
        ),
        (lambda s: s.read([0], -1), "as_of", "an epoch (an int >= 0)", -1),
        (lambda s: s.read([0], 1), "as_of", "a committed epoch (at most 0)", 1),
        (lambda s: s.commit(0, []), "epoch", "an int >= 1", 0),
        (lambda s: s.commit(1, "x"), "deltas", "a list or tuple of StateDelta", "x"),
        (lambda s: s.compact(1), "up_to", "a committed epoch (1..0)", 1),
        (lambda s: s.compact(1, pinned=5), "pinned", "an iterable of epochs (ints)", 5),
        (lambda s: s.compact(1, pinned="12"), "pinned", "an iterable of epochs (ints)", "12"),
        (lambda s: s.compact(1, pinned=b"1"), "pinned", "an iterable of epochs (ints)", b"1"),
        (lambda s: s.compact(1, pinned=(1.0,)), "pinned", "an iterable of epochs (ints)", [1.0]),
        (lambda s: s.drop_staged(-2), "number", "an int >= 0", -2),
        (lambda s: s.drop_staged(True), "number", "an int >= 0", True),
    ],
)
def test_a_refusal_says_what_was_expected_and_what_came(
    tmp_path: Path, call: Any, argument: str, expected: str, got: Any
) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        call(make_store(tmp_path))
    assert (caught.value.argument, caught.value.expected, caught.value.got) == (
        argument,
        expected,
        got,
    )


def test_a_delta_listed_twice_is_refused_saying_so(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    delta = store.stage(1, "a", [0], SCHEMA.empty_table(), [])
    with pytest.raises(InvalidArgumentError) as caught:
        store.commit(1, [delta, delta])
    assert (caught.value.argument, caught.value.expected, caught.value.got) == (
        "deltas",
        "each attempt's delta once",
        [delta, delta],
    )


def test_a_change_outside_the_attempts_vnodes_is_refused_naming_both(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    keys = list(range(40))
    table = pa.table({"k": keys, "v": keys}, schema=SCHEMA)
    vnodes = compute_vnodes(table, ["k"], VNODES)
    outside = sorted({int(v) for v in vnodes if v >= 4})
    with pytest.raises(InvalidArgumentError) as caught:
        store.stage(1, "a", [0, 1, 2, 3], table, [UPSERT] * 40)
    assert (caught.value.argument, caught.value.expected) == (
        "changes",
        "rows of the vnodes [(0, 4)]",
    )
    first_eight = [int(v) for v in vnodes if v >= 4][:8]
    assert caught.value.got == f"rows of vnodes {sorted(set(first_eight))}"
    assert set(first_eight) <= set(outside)


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        (NOT_A_SCHEMA, "a pyarrow Schema"),
        (SCHEMA.append(pa.field("__op", pa.int8())), "no column named __vnode, __op or __seq"),
        (SCHEMA.append(pa.field("__seq", pa.int8())), "no column named __vnode, __op or __seq"),
    ],
)
def test_a_bad_schema_is_refused_saying_what_was_expected(
    tmp_path: Path, schema: Any, expected: str
) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        VnodeStateStore(tmp_path, ("k",), schema, vnode_count=VNODES, base_ranges=2)
    assert (caught.value.argument, caught.value.expected, caught.value.got) == (
        "schema",
        expected,
        schema,
    )


@pytest.mark.parametrize("base_ranges", [0, VNODES + 1, 2.0, True])
def test_base_ranges_outside_one_to_the_vnode_count_are_refused(
    tmp_path: Path, base_ranges: Any
) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        make_store(tmp_path, base_ranges=base_ranges)
    assert (caught.value.argument, caught.value.expected, caught.value.got) == (
        "base_ranges",
        f"an int in 1..{VNODES}",
        base_ranges,
    )


def test_as_many_base_ranges_as_vnodes_write_one_base_file_per_vnode(tmp_path: Path) -> None:
    store = make_store(tmp_path, base_ranges=VNODES)
    commit_epoch(store, 1, [(k, UPSERT, k) for k in range(30)])
    store.compact(1)
    assert len(list((tmp_path / "bases" / vnode_state._name(1)).glob("*.parquet"))) == VNODES
    assert read_all(store, 1) == {k: k for k in range(30)}


@pytest.mark.parametrize(
    ("given", "argument", "expected", "got"),
    [
        ({"key": ("v",), "schema": BOTH_KEYS}, "key", "['k'], as the store holds", ["v"]),
        ({"vnode_count": 16}, "vnode_count", "8, as the store holds", 16),
        (
            {"schema": SCHEMA.append(pa.field("w", pa.int64()))},
            "schema",
            f"{SCHEMA}, as the store holds",
            None,
        ),
    ],
)
def test_reopening_a_store_otherwise_says_what_it_holds(
    tmp_path: Path, given: dict[str, Any], argument: str, expected: str, got: Any
) -> None:
    commit_epoch(make_store(tmp_path), 1, [(1, UPSERT, 1)])
    options = {"key": ("k",), "schema": SCHEMA, "vnode_count": VNODES} | given
    with pytest.raises(InvalidArgumentError) as caught:
        VnodeStateStore(
            tmp_path,
            options["key"],
            options["schema"],
            vnode_count=options["vnode_count"],
            base_ranges=2,
        )
    assert (caught.value.argument, caught.value.expected) == (argument, expected)
    if argument == "schema":
        assert caught.value.got.equals(options["schema"])
    else:
        assert caught.value.got == got


@pytest.mark.parametrize("content", [{"format": "other/1"}, {}])
def test_a_directory_holding_another_manifest_is_refused_as_a_store(
    tmp_path: Path, content: dict[str, Any]
) -> None:
    (tmp_path / vnode_state.MANIFEST).write_text(json.dumps(content))
    with pytest.raises(InvalidArgumentError) as caught:
        make_store(tmp_path)
    assert (caught.value.argument, caught.value.expected, caught.value.got) == (
        "root",
        FORMAT,
        str(tmp_path),
    )


def test_a_delta_dropped_before_its_commit_is_refused_naming_it(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    deltas = stage_epoch(store, 3, [(1, UPSERT, 1)])
    store.drop_staged(3)
    with pytest.raises(ExecutorStagingError) as caught:
        store.commit(1, deltas)
    assert caught.value.table == str(tmp_path)
    assert caught.value.reason == (
        f"the state delta {deltas[0].path} is gone (a recovery dropped it)"
    )


def test_a_folded_epoch_committed_with_deltas_still_staged_names_them(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    commit_epoch(store, 1, [(1, UPSERT, 1)])
    commit_epoch(store, 2, [(2, UPSERT, 2)])
    store.compact(2)
    with pytest.raises(StateCommitConflictError) as caught:
        store.commit(1, stage_epoch(store, 9, [(1, UPSERT, 2)]))
    assert (caught.value.store, caught.value.epoch) == (str(tmp_path), 1)
    assert (caught.value.committed, caught.value.got) == ((), ((9, "a0"), (9, "a1")))


def test_a_read_of_a_folded_epoch_names_the_oldest_readable_one(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    for epoch in range(1, 5):
        commit_epoch(store, epoch, [(epoch, UPSERT, epoch)])
    store.compact(3)
    with pytest.raises(VersionCompactedError) as caught:
        store.read(range(VNODES), 2)
    assert (caught.value.table, caught.value.epoch, caught.value.oldest) == (str(tmp_path), 2, 3)


def test_a_read_of_an_epoch_between_a_pin_and_a_newer_base_names_that_base(
    tmp_path: Path,
) -> None:
    store = make_store(tmp_path)
    for epoch in range(1, 7):
        commit_epoch(store, epoch, [(epoch, UPSERT, epoch)])
    store.compact(5, pinned=[2])
    with pytest.raises(VersionCompactedError) as caught:
        store.read(range(VNODES), 3)
    assert (caught.value.table, caught.value.epoch, caught.value.oldest) == (str(tmp_path), 3, 5)


# Retention: what a compaction keeps for its pins and what it deletes.


def _commits(store: VnodeStateStore, last: int) -> dict[int, dict[int, int | None]]:
    expected = {}
    for epoch in range(1, last + 1):
        commit_epoch(store, epoch, [(epoch, UPSERT, epoch), (epoch - 2, DELETE, None)])
        expected[epoch] = read_all(store, epoch)
    return expected


def test_a_pin_on_the_oldest_base_keeps_that_base(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    expected = _commits(store, 5)
    store.compact(2)
    store.compact(4, pinned=[2])
    assert read_all(store, 2) == expected[2]
    assert (tmp_path / "bases" / vnode_state._name(2)).is_dir()
    with pytest.raises(VersionCompactedError):
        store.read(range(VNODES), 3)


def test_a_pin_below_the_floor_is_skipped_and_the_pins_after_it_still_count(
    tmp_path: Path,
) -> None:
    store = make_store(tmp_path)
    expected = _commits(store, 6)
    store.compact(2)
    store.compact(5, pinned=[1, 3])
    assert read_all(store, 3) == expected[3]
    assert store.committed_epochs() == [2, 3, 4, 5, 6]
    with pytest.raises(VersionCompactedError):
        store.read(range(VNODES), 1)


def test_a_pin_after_a_base_forgets_the_versions_before_that_base(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    expected = _commits(store, 5)
    store.compact(2, pinned=[1])
    assert store.committed_epochs() == [1, 2, 3, 4, 5]
    store.compact(4, pinned=[3])
    assert store.committed_epochs() == [2, 3, 4, 5]
    assert read_all(store, 3) == expected[3]
    with pytest.raises(VersionCompactedError):
        store.read(range(VNODES), 1)
    assert not (tmp_path / "deltas" / vnode_state._name(1)).exists()


def test_a_pin_keeps_only_the_newest_base_at_or_before_it(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    expected = _commits(store, 7)
    store.compact(2)
    store.compact(4, pinned=[3])
    store.compact(6, pinned=[5])
    assert read_all(store, 5) == expected[5]
    assert sorted(p.name for p in (tmp_path / "bases").iterdir()) == [
        vnode_state._name(4),
        vnode_state._name(6),
    ]
    manifest = json.loads((tmp_path / vnode_state.MANIFEST).read_text())
    assert [b["epoch"] for b in manifest["bases"]] == [4, 6]


def test_a_compaction_with_nothing_to_do_rewrites_nothing(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    _commits(store, 3)
    store.compact(2)
    files = {p: p.stat().st_ino for p in tmp_path.rglob("*") if p.is_file()}
    store.compact(2)
    store.compact(1)
    assert {p: p.stat().st_ino for p in tmp_path.rglob("*") if p.is_file()} == files


def test_a_compaction_cut_short_before_its_manifest_is_done_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store(tmp_path)
    expected = _commits(store, 3)
    monkeypatch.setattr(vnode_state, "_publish", _crash)
    with pytest.raises(SimulatedCrashError):
        store.compact(2)
    monkeypatch.undo()
    assert (tmp_path / "bases" / vnode_state._name(2)).is_dir()  # written, named by nothing
    make_store(tmp_path).compact(2)
    assert read_all(store, 2) == expected[2]
    with pytest.raises(VersionCompactedError):
        store.read(range(VNODES), 1)


def test_files_gone_already_or_a_directory_not_empty_do_not_stop_the_deletion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store(tmp_path)
    _commits(store, 3)
    first = tmp_path / "deltas" / vnode_state._name(1)
    (first / ".debris.tmp").write_bytes(b"")  # left by a crash: the directory stays
    publish = vnode_state._publish

    def another_compaction_deletes_first(*args: Any) -> None:
        publish(*args)
        for path in (tmp_path / "deltas" / vnode_state._name(2)).iterdir():
            path.unlink()

    monkeypatch.setattr(vnode_state, "_publish", another_compaction_deletes_first)
    store.compact(2)
    assert [p.name for p in first.iterdir()] == [".debris.tmp"]
    assert not (tmp_path / "deltas" / vnode_state._name(2)).exists()
    assert store.committed_epochs() == [2, 3]


@pytest.mark.parametrize("other", [2, 3])
def test_a_compaction_racing_another_keeps_one_base_per_epoch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, other: int
) -> None:
    store = make_store(tmp_path)
    expected = _commits(store, 4)
    write = vnode_state._write_parquet
    writes = 0

    def another_compaction_after_the_last_file(path: Path, table: pa.Table) -> None:
        # (Not before: the base's rows are read as it is written, from files the other
        # compaction deletes.)
        nonlocal writes
        write(path, table)
        writes += 1
        if writes == 2:
            make_store(tmp_path).compact(other)

    monkeypatch.setattr(vnode_state, "_write_parquet", another_compaction_after_the_last_file)
    store.compact(2)
    manifest = json.loads((tmp_path / vnode_state.MANIFEST).read_text())
    assert [b["epoch"] for b in manifest["bases"]] == [other]
    # Another compaction that went further: this one's files go; one of the same epoch wrote
    # these very files: they stay.
    assert sorted(p.name for p in (tmp_path / "bases").iterdir()) == [vnode_state._name(other)]
    assert len(list((tmp_path / "bases" / vnode_state._name(other)).iterdir())) == 2
    for epoch in range(other, 5):
        assert read_all(store, epoch) == expected[epoch]


def test_sizes_are_the_newest_bases_rows_and_the_committed_delta_rows_after_it(
    tmp_path: Path,
) -> None:
    store = make_store(tmp_path)
    assert store.sizes() == (0, 0)
    commit_epoch(store, 1, [(1, UPSERT, 1), (2, UPSERT, 2), (3, UPSERT, 3)])
    commit_epoch(store, 2, [(1, DELETE, None), (4, UPSERT, 4)])
    stage_epoch(store, 9, [(5, UPSERT, 5)])  # staged, not committed: not counted
    assert store.sizes() == (0, 5)
    commit_epoch(store, 3, [(6, UPSERT, 6)])
    commit_epoch(store, 4, [(7, UPSERT, 7), (8, UPSERT, 8)])
    store.compact(3, pinned=[2])  # the pin keeps epochs 1 and 2's deltas: not after the base
    assert store.sizes() == (4, 2)  # keys 2, 3, 4, 6; then epoch 4's two rows
    store.compact(4)
    assert make_store(tmp_path).sizes() == (6, 0)


# Change logs and pins (a reader on the driver: a snapshot backfill following the state).


def change_rows(table: pa.Table) -> list[tuple[int, int | None, int]]:
    rows = table.to_pydict()
    return list(zip(rows["k"], rows["v"], rows[vnode_state.OP_COLUMN], strict=True))


def test_a_change_log_is_what_the_epoch_changed_with_ops_in_the_order_staged(
    tmp_path: Path,
) -> None:
    store = make_store(tmp_path)
    commit_epoch(store, 1, [(1, UPSERT, 1), (2, UPSERT, 2)])
    commit_epoch(store, 2, [(1, DELETE, None), (3, UPSERT, 3), (1, UPSERT, 11), (4, DELETE, None)])
    log = store.change_log(2)
    assert log.schema.names == ["k", "v", vnode_state.OP_COLUMN]
    assert sorted(change_rows(log), key=lambda r: r[0]) == [
        (1, None, DELETE),
        (1, 11, UPSERT),
        (3, 3, UPSERT),
        (4, None, DELETE),
    ]
    assert sorted(change_rows(store.change_log(1))) == [(1, 1, UPSERT), (2, 2, UPSERT)]


def test_a_change_log_of_some_vnodes_has_only_their_rows(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    keys = list(range(30))
    commit_epoch(store, 1, [(k, UPSERT, k) for k in keys])
    table = pa.table({"k": keys}, schema=pa.schema([SCHEMA.field("k")]))
    vnode_of = dict(zip(keys, compute_vnodes(table, ["k"], VNODES).tolist(), strict=True))
    for asked in ([0], [1, 6], HALVES[1]):
        wanted = set(asked.vnodes()) if isinstance(asked, VnodeBitmap) else set(asked)
        got = sorted(change_rows(store.change_log(1, asked)))
        assert got == [(k, k, UPSERT) for k in keys if vnode_of[k] in wanted]


def test_an_epoch_that_changed_nothing_here_has_an_empty_change_log(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    commit_epoch(store, 1, [(1, UPSERT, 1)])
    store.commit(2, [])
    commit_epoch(store, 4, [(2, UPSERT, 2)])
    for epoch in (2, 3):  # a version without deltas; an epoch with no version here
        log = store.change_log(epoch)
        assert (log.num_rows, log.schema.names) == (0, ["k", "v", vnode_state.OP_COLUMN])


def test_a_change_log_folded_into_a_base_is_refused_naming_the_oldest_epoch(
    tmp_path: Path,
) -> None:
    store = make_store(tmp_path)
    for epoch in range(1, 5):
        commit_epoch(store, epoch, [(epoch, UPSERT, epoch)])
    store.compact(3)
    for epoch in (1, 3):  # before the floor; the base's own epoch (its deltas folded)
        with pytest.raises(VersionCompactedError) as caught:
            store.change_log(epoch)
        assert (caught.value.table, caught.value.epoch, caught.value.oldest) == (
            str(tmp_path),
            epoch,
            3,
        )
    assert change_rows(store.change_log(4)) == [(4, 4, UPSERT)]


def test_the_change_log_of_a_base_epoch_no_commit_had_is_empty(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    commit_epoch(store, 1, [(1, UPSERT, 1)])
    commit_epoch(store, 3, [(3, UPSERT, 3)])
    store.compact(2)  # a base as of epoch 2, which changed nothing here
    assert store.change_log(2).num_rows == 0
    assert change_rows(store.change_log(3)) == [(3, 3, UPSERT)]
    with pytest.raises(VersionCompactedError):
        store.change_log(1)


@pytest.mark.parametrize("epoch", [0, 3, -1, True, 1.0, "1"])
def test_a_change_log_of_an_epoch_not_committed_is_refused(tmp_path: Path, epoch: Any) -> None:
    store = make_store(tmp_path)
    commit_epoch(store, 1, [(1, UPSERT, 1)])
    store.commit(2, [])
    with pytest.raises(InvalidArgumentError) as caught:
        store.change_log(epoch)
    assert (caught.value.argument, caught.value.expected, caught.value.got) == (
        "epoch",
        "a committed epoch (1..2)",
        epoch,
    )


def test_a_change_log_of_bad_vnodes_is_refused(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    commit_epoch(store, 1, [(1, UPSERT, 1)])
    with pytest.raises(InvalidArgumentError) as caught:
        store.change_log(1, [VNODES])
    assert caught.value.argument == "vnodes"


def test_a_pin_per_reader_replaced_by_its_next_and_released_by_unpin(tmp_path: Path) -> None:
    root = tmp_path / "not yet"
    store = make_store(root)
    assert store.pins() == {}
    store.pin("snapshot-1", 3)  # before anything is committed: the directory is made
    store.pin("snapshot-1", 5)
    store.pin("b.2", 0)
    assert make_store(root).pins() == {"snapshot-1": 5, "b.2": 0}  # files: they hold
    store.unpin("snapshot-1")
    store.unpin("snapshot-1")  # none left: a no-op
    store.unpin("never")
    assert store.pins() == {"b.2": 0}


def test_unpin_of_a_name_no_pin_can_have_touches_nothing(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.pin("a", 1)
    (tmp_path / "x.json").write_text("{}")
    store.unpin("../x")
    store.unpin(5)  # type: ignore[arg-type]
    assert (tmp_path / "x.json").exists()
    assert store.pins() == {"a": 1}


def test_pins_skip_damaged_or_vanished_pin_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store(tmp_path)
    store.pin("good", 4)
    pins = tmp_path / "pins"
    (pins / "not-json.json").write_text("{")
    (pins / "no-epoch.json").write_text("{}")
    (pins / "a-gone.json").symlink_to(pins / "nowhere.json")  # listed, then not found
    (pins / "other.txt").write_text('{"epoch": 1}')
    glob = Path.glob
    # Listed in name order: the vanished pin first, the others after it still count.
    monkeypatch.setattr(Path, "glob", lambda self, pattern: iter(sorted(glob(self, pattern))))
    assert store.pins() == {"good": 4}


@pytest.mark.parametrize(
    ("reader", "epoch", "argument", "expected"),
    [
        ("", 1, "reader", "1-100 letters, digits, '_', '.', '-'"),
        ("../x", 1, "reader", "1-100 letters, digits, '_', '.', '-'"),
        (5, 1, "reader", "1-100 letters, digits, '_', '.', '-'"),
        ("a", -1, "epoch", "an int >= 0"),
        ("a", True, "epoch", "an int >= 0"),
        ("a", "1", "epoch", "an int >= 0"),
    ],
)
def test_a_bad_pin_is_refused_saying_what_was_expected(
    tmp_path: Path, reader: Any, epoch: Any, argument: str, expected: str
) -> None:
    store = make_store(tmp_path)
    with pytest.raises(InvalidArgumentError) as caught:
        store.pin(reader, epoch)
    got = reader if argument == "reader" else epoch
    assert (caught.value.argument, caught.value.expected, caught.value.got) == (
        argument,
        expected,
        got,
    )
    assert store.pins() == {}


def test_two_compactions_overtaken_by_a_third_both_give_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store(tmp_path)
    expected = _commits(store, 4)
    fsync = _fs.fsync_path
    bases_synced = 0

    def others_once_a_base_is_written(path: Any) -> None:
        nonlocal bases_synced
        fsync(path)
        if Path(path) == tmp_path / "bases":  # the last step of writing a base
            bases_synced += 1
            if bases_synced == 1:  # a second compaction to the same epoch
                make_store(tmp_path).compact(2)
            elif bases_synced == 2:  # a third goes further and publishes first
                make_store(tmp_path).compact(3)

    monkeypatch.setattr(vnode_state, "fsync_path", others_once_a_base_is_written)
    store.compact(2)
    assert bases_synced == 3
    manifest = json.loads((tmp_path / vnode_state.MANIFEST).read_text())
    assert [b["epoch"] for b in manifest["bases"]] == [3]
    assert sorted(p.name for p in (tmp_path / "bases").iterdir()) == [vnode_state._name(3)]
    assert read_all(store, 3) == expected[3]
