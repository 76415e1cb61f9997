"""A keyed operator's state committed with the epoch's files (connectors/state_commit.py): one
test per rule of its module docstring, driven through a real file table's committer
(Parquet, Iceberg, Delta) as the coordinator drives it, with no Spark.

Spark tasks are simulated by two "tasks" per micro-batch, each owning half of the vnodes: each
stages its rows with the table's staging writer and its state changes with
:meth:`VnodeStateStore.stage`, and hands back a manifest carrying its :func:`state_record`. A
crash is an exception raised at a step of the committer's commit (its ``publish``, the state's
manifest replacement, the staging clean-up); the recovery is a new committer, recovered with
the epoch pending, committing the same metadata again.
"""

from __future__ import annotations

import base64
import json
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from barrierflow.actors import AlreadyCommitted, Committed, Manifest, RetryLater
from barrierflow.channels import Op, VnodeBitmap
from barrierflow.channels.vnode import compute_vnodes
from barrierflow.connectors import (
    DeltaLakeTable,
    IcebergTable,
    ParquetTable,
    open_local_catalog,
    vnode_state,
)
from barrierflow.connectors._file_table import FileCommitter
from barrierflow.connectors.state_commit import commit_state, drop_state, gather_state, state_record
from barrierflow.connectors.vnode_state import StateDelta, VnodeStateStore, remove_staged
from barrierflow.errors import InvalidArgumentError, StateCommitConflictError

pytestmark = pytest.mark.anyio

ROWS = pa.schema([pa.field("id", pa.int64(), nullable=False)])
STATE = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("v", pa.int64())])
# state_record carries no base_ranges: a store rebuilt from it has the default 16 ranges, so
# it needs at least 16 vnodes.
VNODES = 16
HALVES = VnodeBitmap.split(2, VNODES)
TABLES = ("parquet", "iceberg", "delta")

Changes = Mapping[int, int | None]  # key -> new value (None: deleted)


class SimulatedCrashError(Exception):
    """The simulated death of the driver at a step of a commit."""


def make_table(kind: str, root: Path) -> Any:
    if kind == "parquet":
        return ParquetTable(root / "table", ROWS)
    if kind == "iceberg":
        return IcebergTable(open_local_catalog(root / "catalog"), "ns.events", ROWS)
    return DeltaLakeTable(root / "delta", ROWS)


def table_ids(kind: str, table: Any) -> list[int]:
    """The ids a reader of the table sees (sorted, duplicates kept)."""
    if kind == "parquet":
        if not table.path.exists():
            return []
        return sorted(ds.dataset(table.path, ROWS, format="parquet").to_table()["id"].to_pylist())
    if kind == "iceberg":
        return sorted(table.table().scan().to_arrow()["id"].to_pylist())
    if not (table.path / "_delta_log").exists():
        return []
    return sorted(table.read()["id"].to_pylist())


def make_store(root: Path, name: str = "view") -> VnodeStateStore:
    return VnodeStateStore(root / "state" / name, ("k",), STATE, vnode_count=VNODES, base_ranges=2)


def state_of(store: VnodeStateStore, as_of: int | None = None) -> dict[int, int | None]:
    epoch = store.last_committed() if as_of is None else as_of
    rows = store.read(VnodeBitmap.full(VNODES), epoch).to_pydict()
    return dict(zip(rows["k"], rows["v"], strict=True))


def stage_half(
    store: VnodeStateStore, number: int, task: int, changes: Changes, attempt: str = "t"
) -> StateDelta:
    """What task ``task`` (owning ``HALVES[task]``) stages of ``changes``."""
    keys = sorted(changes)
    table = pa.table({"k": keys, "v": [changes[k] for k in keys]}, schema=STATE)
    ops = pa.array(
        [int(Op.DELETE) if changes[k] is None else int(Op.INSERT) for k in keys], pa.int8()
    )
    mine = pa.array(HALVES[task].mask[compute_vnodes(table, ["k"], VNODES)])
    return store.stage(
        number, f"{attempt}{task}", HALVES[task], table.filter(mine), ops.filter(mine)
    )


def stage_all(
    store: VnodeStateStore, number: int, changes: Changes, attempt: str = "all"
) -> StateDelta:
    """What one task owning every vnode stages of ``changes``."""
    keys = sorted(changes)
    table = pa.table({"k": keys, "v": [changes[k] for k in keys]}, schema=STATE)
    ops = [int(Op.DELETE) if changes[k] is None else int(Op.INSERT) for k in keys]
    return store.stage(number, attempt, VnodeBitmap.full(VNODES), table, ops)


async def micro_batch(
    table: Any,
    stores: Sequence[VnodeStateStore],
    number: int,
    ids: Sequence[int],
    changes: Changes,
    **fields: Any,
) -> list[Manifest]:
    """The manifests two tasks return for micro-batch ``number``: each writes half of
    ``ids`` and stages its half of ``changes`` in every store (``fields``: more of the
    manifests' fields, positions for one)."""
    manifests = []
    for task in (0, 1):
        writer = table.writer(str(task))
        await writer.open()
        await writer.begin(number)
        mine = list(ids[task::2])
        if mine:
            await writer.write(pa.record_batch([pa.array(mine, pa.int64())], schema=ROWS))
        staged = await writer.stage(number)
        await writer.close()
        records = tuple(state_record(s, stage_half(s, number, task, changes)) for s in stores)
        manifests.append(replace(staged, state=records, **fields))
    return manifests


async def started(table: Any, pending: Mapping[int, Any] | None = None) -> FileCommitter:
    """The table's committer as its coordinator starts it (``pending``: the epochs a crash
    left pending, with their metadata)."""
    committer: FileCommitter = table.committer()
    await committer.recover(dict(pending or {}))
    return committer


async def prepared(committer: FileCommitter, epoch: int, manifests: list[Manifest]) -> Any:
    metadata = await committer.prepare(epoch, manifests)
    assert metadata is not None
    return metadata


@pytest.fixture(params=TABLES)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# prepare


async def test_prepare_puts_every_manifests_state_records_in_the_commit_metadata(
    tmp_path: Path, kind: str
) -> None:
    table, store = make_table(kind, tmp_path), make_store(tmp_path)
    committer = await started(table)
    manifests = await micro_batch(table, [store], 1, [1, 2, 3], {1: 10, 2: 20})
    metadata = await prepared(committer, 1, manifests)
    assert metadata["state"] == [dict(r) for m in manifests for r in m.state]
    assert len(metadata["state"]) == 2
    assert store.last_committed() == 0  # prepared is pending: nothing committed
    assert table_ids(kind, table) == []


async def test_an_epoch_with_state_but_no_files_still_prepares(tmp_path: Path, kind: str) -> None:
    table, store = make_table(kind, tmp_path), make_store(tmp_path)
    committer = await started(table)
    manifests = await micro_batch(table, [store], 1, [], {1: 10})
    metadata = await committer.prepare(1, manifests)
    assert metadata is not None
    assert (metadata["paths"], len(metadata["state"])) == ([], 2)


async def test_an_epoch_with_state_but_no_files_commits_its_state(
    tmp_path: Path, kind: str
) -> None:
    table, store = make_table(kind, tmp_path), make_store(tmp_path)
    committer = await started(table)
    metadata = await prepared(committer, 1, await micro_batch(table, [store], 1, [], {1: 10}))
    assert await committer.commit(1, metadata) == Committed()
    # Recovery commits it again: the state as it is (Iceberg knows it holds the epoch).
    again = AlreadyCommitted() if kind == "iceberg" else Committed()
    assert await committer.commit(1, metadata) == again
    assert (store.last_committed(), state_of(store), store.staged_numbers()) == (1, {1: 10}, [])
    # Iceberg records the epoch in a snapshot without files; Parquet and Delta record no epoch
    # without files: their marker moves with the next epoch that has rows.
    assert committer.committed_epoch() == (1 if kind == "iceberg" else 0)
    later = await prepared(committer, 2, await micro_batch(table, [store], 2, [5], {1: 11}))
    assert await committer.commit(2, later) == Committed()
    assert (committer.committed_epoch(), state_of(store)) == (2, {1: 11})


# commit


async def test_commit_makes_the_state_version_and_the_files_visible(
    tmp_path: Path, kind: str
) -> None:
    table = make_table(kind, tmp_path)
    view, hidden = make_store(tmp_path, "view"), make_store(tmp_path, "state")
    committer = await started(table)
    metadata = await prepared(
        committer, 4, await micro_batch(table, [view, hidden], 7, [1, 2, 3], {1: 10, 2: 20})
    )
    assert await committer.commit(4, metadata) == Committed()
    for store in (view, hidden):
        assert store.last_committed() == 4  # the epoch, not the staging number
        assert state_of(store) == {1: 10, 2: 20}
        assert store.staged_numbers() == []
    assert table_ids(kind, table) == [1, 2, 3]
    assert committer.committed_epoch() == 4


async def test_the_state_is_committed_before_the_files_and_commit_again_finishes_the_table(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    table, store = make_table(kind, tmp_path), make_store(tmp_path)
    committer = await started(table)
    metadata = await prepared(committer, 1, await micro_batch(table, [store], 1, [5], {5: 50}))
    seen: list[int] = []

    def failing_publish(state: Any, epoch: Any) -> None:
        seen.append(store.last_committed())
        raise OSError("the catalog is unreachable")

    monkeypatch.setattr(committer, "publish", failing_publish)
    outcome = await committer.commit(1, metadata)
    assert isinstance(outcome, RetryLater)
    assert seen == [1]  # the state version was there when the files were published
    assert store.last_committed() == 1
    assert committer.committed_epoch() == 0
    # (A Parquet table's rename of the epoch's directory, before its manifest, shows the rows.)
    assert table_ids(kind, table) == ([5] if kind == "parquet" else [])
    manifest = (store.root / vnode_state.MANIFEST).read_bytes()
    monkeypatch.undo()
    assert await committer.commit(1, metadata) == Committed()  # no StateCommitConflictError
    assert table_ids(kind, table) == [5]
    assert (store.root / vnode_state.MANIFEST).read_bytes() == manifest  # left as it is
    assert (state_of(store), store.staged_numbers()) == ({5: 50}, [])


CRASHES = ("in_state_commit", "after_state_commit", "after_publish")


def crash_at(point: str, monkeypatch: pytest.MonkeyPatch, committer: FileCommitter) -> None:
    """Make ``committer``'s next commit die at ``point``: after the first store's state
    version (the second's not), between the state and the table's commit, or after the
    table's commit (before the staged state is dropped)."""
    if point == "in_state_commit":
        publish = vnode_state._publish
        calls = 0

        def second_store_dies(*args: Any) -> None:
            nonlocal calls
            calls += 1
            if calls == 2:
                raise SimulatedCrashError
            publish(*args)

        monkeypatch.setattr(vnode_state, "_publish", second_store_dies)
    elif point == "after_state_commit":
        monkeypatch.setattr(committer, "publish", _crash)
    else:
        monkeypatch.setattr(committer, "drop_staging", _crash)


def _crash(*args: Any) -> None:
    raise SimulatedCrashError


@pytest.mark.parametrize("point", CRASHES)
async def test_a_crash_between_the_state_and_the_table_commit_is_finished_by_commit_again(
    tmp_path: Path, kind: str, point: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = make_table(kind, tmp_path)
    view, hidden = make_store(tmp_path, "view"), make_store(tmp_path, "state")
    committer = await started(table)
    first = await prepared(committer, 1, await micro_batch(table, [view, hidden], 1, [1], {1: 1}))
    assert await committer.commit(1, first) == Committed()
    manifests = await micro_batch(table, [view, hidden], 2, [2, 3], {1: None, 2: 2, 3: 3})
    metadata = await prepared(committer, 2, manifests)
    crash_at(point, monkeypatch, committer)
    with pytest.raises(SimulatedCrashError):
        await committer.commit(2, metadata)
    monkeypatch.undo()
    assert view.last_committed() == 2  # the first store's version went through in each case
    assert hidden.last_committed() == (1 if point == "in_state_commit" else 2)
    assert committer.committed_epoch() == (2 if point == "after_publish" else 1)

    restarted = await started(table, {2: metadata})
    outcome = await restarted.commit(2, metadata)
    assert outcome == (AlreadyCommitted() if point == "after_publish" else Committed())
    assert table_ids(kind, table) == [1, 2, 3]
    assert restarted.committed_epoch() == 2
    for store in (view, hidden):
        assert store.last_committed() == 2
        assert (state_of(store), state_of(store, 1)) == ({2: 2, 3: 3}, {1: 1})
        assert store.staged_numbers() == []


async def test_a_replayed_commit_only_drops_the_staged_state(tmp_path: Path, kind: str) -> None:
    table, store = make_table(kind, tmp_path), make_store(tmp_path)
    committer = await started(table)
    first = await prepared(committer, 1, await micro_batch(table, [store], 1, [1], {1: 1}))
    assert await committer.commit(1, first) == Committed()
    manifest = (store.root / vnode_state.MANIFEST).read_bytes()
    # The same epoch again, with deltas a replayed micro-batch staged under a new number.
    replayed = await prepared(committer, 1, await micro_batch(table, [store], 2, [1], {1: 99}))
    assert store.staged_numbers() == [2]
    assert await committer.commit(1, replayed) == AlreadyCommitted()
    assert store.staged_numbers() == []
    assert (store.root / vnode_state.MANIFEST).read_bytes() == manifest
    assert (store.last_committed(), state_of(store)) == (1, {1: 1})
    assert table_ids(kind, table) == [1]


async def test_an_epoch_the_table_already_holds_drops_its_staged_state_uncommitted(
    tmp_path: Path, kind: str
) -> None:
    table, store = make_table(kind, tmp_path), make_store(tmp_path)
    committer = await started(table)
    first = await micro_batch(table, [store], 1, [1], {1: 1}, positions={"src": 5})
    assert await committer.commit(1, await prepared(committer, 1, first)) == Committed()
    # The runtime's store went back in time: batches 3..4 of "src", held already, come again.
    again = await micro_batch(
        table, [store], 2, [3, 4], {1: 77}, positions_from={"src": 2}, positions={"src": 4}
    )
    assert await committer.commit(2, await prepared(committer, 2, again)) == AlreadyCommitted()
    assert (store.last_committed(), state_of(store)) == (1, {1: 1})
    assert store.staged_numbers() == []
    assert table_ids(kind, table) == [1]


async def test_abort_drops_every_attempt_staged_under_the_number_and_commits_nothing(
    tmp_path: Path, kind: str
) -> None:
    table, store = make_table(kind, tmp_path), make_store(tmp_path)
    committer = await started(table)
    stage_half(store, 3, 0, {1: -1}, attempt="failed")  # an attempt no manifest names
    metadata = await prepared(committer, 1, await micro_batch(table, [store], 3, [1], {1: 1}))
    assert store.staged_numbers() == [3]
    await committer.abort(1, metadata)
    assert store.staged_numbers() == []
    assert not (store.root / "staged").exists() or not any((store.root / "staged").iterdir())
    assert (store.last_committed(), store.committed_epochs()) == (0, [])
    assert table_ids(kind, table) == []


async def test_a_failed_attempts_delta_is_never_read_and_the_commit_of_its_number_deletes_it(
    tmp_path: Path,
) -> None:
    table, store = make_table("parquet", tmp_path), make_store(tmp_path)
    committer = await started(table)
    for task in (0, 1):  # the failed and the speculative attempts of both tasks
        stage_half(store, 1, task, {k: -1 for k in range(8)}, attempt="failed")
    metadata = await prepared(committer, 1, await micro_batch(table, [store], 1, [1], {1: 1}))
    assert await committer.commit(1, metadata) == Committed()
    assert state_of(store) == {1: 1}
    assert store.staged_numbers() == []
    assert sorted(p.name for p in store.root.rglob("*.parquet")) == [
        "00000000000000000001-t0.parquet",
        "00000000000000000001-t1.parquet",
    ]


# The functions, alone.


def test_state_record_says_which_store_and_which_delta(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    delta = stage_half(store, 2, 1, {1: 1, 2: 2, 3: 3})
    record = state_record(store, delta)
    assert json.loads(json.dumps(record)) == record
    assert (record["root"], record["key"], record["vnode_count"]) == (
        str(store.root),
        ["k"],
        VNODES,
    )
    schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(record["schema"])))
    assert schema.equals(STATE)
    assert StateDelta.from_json(record["delta"]) == delta


def test_a_state_delta_round_trips_through_json(tmp_path: Path) -> None:
    delta = StateDelta(7, "t12", ((0, 3), (5, 16)), 42, "staged/00000000000000000007/t12/x")
    data = json.loads(json.dumps(delta.to_json()))
    assert data == {
        "number": 7,
        "attempt": "t12",
        "vnodes": [[0, 3], [5, 16]],
        "rows": 42,
        "path": "staged/00000000000000000007/t12/x",
    }
    assert StateDelta.from_json(data) == delta
    assert delta.ident == (7, "t12")
    assert delta.committed_path(3) == (
        "deltas/00000000000000000003/00000000000000000007-t12.parquet"
    )


@pytest.mark.parametrize(
    "data",
    [
        None,
        {},
        {"number": 1, "attempt": "a", "vnodes": [[0, 1]], "rows": 1},
        {"number": "x", "attempt": "a", "vnodes": [[0, 1]], "rows": 1, "path": "p"},
        {"number": 1, "attempt": "a", "vnodes": [[0]], "rows": 1, "path": "p"},
        {"number": 1, "attempt": "a", "vnodes": 5, "rows": 1, "path": "p"},
    ],
)
def test_a_damaged_delta_is_refused_with_a_typed_error(data: Any) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        StateDelta.from_json(data)
    assert (caught.value.argument, caught.value.got) == ("delta", data)


def test_gather_state_lists_the_manifests_records_in_manifest_order() -> None:
    records = [{"n": i} for i in range(3)]
    manifests = [
        Manifest("0", 1, state=(records[2],)),
        Manifest("1", 1),
        Manifest("2", 1, state=(records[0], records[1])),
    ]
    gathered = gather_state(manifests)
    assert gathered == [records[2], records[0], records[1]]
    gathered[0]["n"] = 9  # copies: the manifests are left alone
    assert records[2] == {"n": 2}
    assert gather_state([]) == []


def test_commit_state_commits_each_store_its_deltas_and_leaves_a_store_without_any(
    tmp_path: Path,
) -> None:
    one, two = make_store(tmp_path, "one"), make_store(tmp_path, "two")
    records = [
        state_record(s, stage_half(s, 1, t, {1: 1, 2: 2})) for s in (one, two) for t in (0, 1)
    ]
    commit_state(1, records)
    assert (state_of(one), state_of(two)) == ({1: 1, 2: 2}, {1: 1, 2: 2})
    commit_state(1, records)  # idempotent
    assert one.committed_epochs() == two.committed_epochs() == [1]
    # Epoch 2 changes only "two": "one" stays at epoch 1, and reads as of 2 see it unchanged.
    commit_state(2, [state_record(two, stage_half(two, 2, t, {2: None})) for t in (0, 1)])
    assert (one.last_committed(), two.last_committed()) == (1, 2)
    assert state_of(two) == {1: 1}
    assert (one.staged_numbers(), two.staged_numbers()) == ([], [])


def test_commit_state_of_a_committed_epoch_with_other_deltas_is_refused(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    commit_state(1, [state_record(store, stage_all(store, 1, {1: 1}))])
    other = [state_record(store, stage_all(store, 2, {1: 2}))]
    with pytest.raises(StateCommitConflictError) as caught:
        commit_state(1, other)
    assert (caught.value.epoch, caught.value.committed, caught.value.got) == (
        1,
        ((1, "all"),),
        ((2, "all"),),
    )
    assert state_of(store) == {1: 1}


def test_commit_state_of_nothing_does_nothing(tmp_path: Path) -> None:
    commit_state(1, [])
    drop_state([])
    assert list(tmp_path.iterdir()) == []


def test_drop_state_deletes_every_attempt_of_the_records_numbers_only(tmp_path: Path) -> None:
    one, two = make_store(tmp_path, "one"), make_store(tmp_path, "two")
    records = [
        state_record(one, stage_all(one, 1, {1: 1})),
        state_record(one, stage_half(one, 4, 1, {2: 2})),
        state_record(two, stage_all(two, 5, {1: 1})),
    ]
    stage_half(one, 1, 1, {2: 2}, attempt="speculative")  # not named: the same number
    stage_all(one, 2, {1: 1})  # another micro-batch's
    drop_state(records)
    assert (one.staged_numbers(), two.staged_numbers()) == ([2], [])
    assert one.committed_epochs() == two.committed_epochs() == []


def _damaged(record: dict[str, Any], how: str) -> Any:
    damaged = dict(record)
    if how.startswith("no "):
        del damaged[how[3:]]
    elif how == "schema not base64":
        damaged["schema"] = "&&&"
    elif how == "schema not bytes":
        damaged["schema"] = 5
    elif how == "schema not a schema":
        damaged["schema"] = base64.b64encode(b"not a schema").decode()
    elif how == "vnode_count not a number":
        damaged["vnode_count"] = "many"
    elif how == "key not a column":
        damaged["key"] = ["nope"]
    elif how == "delta damaged":
        damaged["delta"] = {"number": 1}
    elif how == "not a mapping":
        return [damaged]
    return damaged


DAMAGES = (
    "no root",
    "no key",
    "no schema",
    "no vnode_count",
    "no delta",
    "schema not base64",
    "schema not bytes",
    "schema not a schema",
    "vnode_count not a number",
    "key not a column",
    "delta damaged",
    "not a mapping",
)


@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.parametrize("call", [commit_state.__name__, drop_state.__name__])
def test_a_damaged_record_is_refused_with_a_typed_error(
    tmp_path: Path, how: str, call: str
) -> None:
    store = make_store(tmp_path)
    good = state_record(store, stage_all(store, 1, {1: 1}))
    damaged = _damaged(good, how)
    with pytest.raises(InvalidArgumentError) as caught:
        if call == "commit_state":
            commit_state(1, [damaged, good])
        else:
            drop_state([damaged, good])
    assert caught.value.argument == "state"
    assert caught.value.expected == "records made by state_record"
    assert caught.value.got == damaged
    assert (store.committed_epochs(), store.staged_numbers()) == ([], [1])


# The store's own driver-side helpers.


def test_existing_is_none_before_the_first_commit_and_the_store_after(tmp_path: Path) -> None:
    root = tmp_path / "state" / "view"
    assert VnodeStateStore.existing(root) is None  # no directory
    store = make_store(tmp_path)
    stage_all(store, 1, {1: 1})
    assert VnodeStateStore.existing(root) is None  # staged only: nothing records it yet
    assert VnodeStateStore.existing(root / "staged" / "x") is None  # under a file's name
    commit_state(1, [state_record(store, stage_all(store, 1, {1: 1}))])
    found = VnodeStateStore.existing(root)
    assert found is not None
    assert (found.root, found.key, found.vnode_count) == (root, ("k",), VNODES)
    assert found.schema.equals(STATE)
    assert state_of(found) == {1: 1}


@pytest.mark.parametrize(
    "content",
    [b"not json", json.dumps({"format": "another/1"}).encode(), json.dumps({}).encode()],
)
def test_existing_refuses_a_directory_that_is_not_a_store(tmp_path: Path, content: bytes) -> None:
    (tmp_path / vnode_state.MANIFEST).write_bytes(content)
    with pytest.raises(InvalidArgumentError) as caught:
        VnodeStateStore.existing(tmp_path)
    assert (caught.value.argument, caught.value.got) == ("root", str(tmp_path))
    assert caught.value.expected == "a directory of a vnode state store (barrierflow.vnode_state/1)"


def test_existing_refuses_a_root_that_is_not_a_path() -> None:
    with pytest.raises(InvalidArgumentError):
        VnodeStateStore.existing(5)  # type: ignore[arg-type]


def test_last_committed_is_zero_before_the_first_commit_then_the_last_epoch(
    tmp_path: Path,
) -> None:
    store = make_store(tmp_path)
    assert store.last_committed() == 0
    commit_state(3, [state_record(store, stage_all(store, 1, {1: 1}))])
    commit_state(8, [])
    assert store.last_committed() == 3  # a commit without records touches no store
    store.commit(8, [])
    assert make_store(tmp_path).last_committed() == 8


def test_remove_staged_deletes_one_number_of_any_store_without_building_it(
    tmp_path: Path,
) -> None:
    store = make_store(tmp_path)
    for number in (1, 2):
        stage_half(store, number, 0, {1: 1})
        stage_half(store, number, 1, {2: 2}, attempt="other")
    remove_staged(store.root, 1)
    remove_staged(str(store.root), 7)  # nothing staged under it: nothing to do
    assert store.staged_numbers() == [2]
    remove_staged(tmp_path / "no store here", 2)
    assert store.staged_numbers() == [2]


# Against a model: epochs with a crash at a random point, each recovered.


EPOCHS = st.lists(
    st.tuples(
        st.dictionaries(st.integers(0, 9), st.none() | st.integers(0, 99), max_size=6),
        st.sampled_from((None, *CRASHES)),
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=8, deadline=None)
@given(epochs=EPOCHS)
async def test_epochs_cut_short_at_random_points_and_recovered_equal_a_model(
    epochs: list[tuple[dict[int, int | None], str | None]],
) -> None:
    root = Path(tempfile.mkdtemp(prefix="state-commit-"))
    try:
        table = make_table("parquet", root)
        view, hidden = make_store(root, "view"), make_store(root, "state")
        committer = await started(table)
        models: dict[int, dict[int, int | None]] = {0: {}}
        ids: list[int] = []
        for epoch, (changes, point) in enumerate(epochs, start=1):
            written = [epoch * 100 + i for i in range(len(changes) + 1)]
            manifests = await micro_batch(table, [view, hidden], epoch + 10, written, changes)
            metadata = await prepared(committer, epoch, manifests)
            if point is not None:
                with pytest.MonkeyPatch.context() as patch:
                    crash_at(point, patch, committer)
                    with pytest.raises(SimulatedCrashError):
                        await committer.commit(epoch, metadata)
                committer = await started(table, {epoch: metadata})  # a restarted driver
            outcome = await committer.commit(epoch, metadata)
            assert outcome == (AlreadyCommitted() if point == "after_publish" else Committed())
            model = dict(models[epoch - 1])
            for key, value in changes.items():
                if value is None:
                    model.pop(key, None)
                else:
                    model[key] = value
            models[epoch] = model
            ids += written
            assert table_ids("parquet", table) == sorted(ids)
            assert committer.committed_epoch() == epoch
            for store in (view, hidden):
                assert store.last_committed() == epoch
                assert store.staged_numbers() == []
                assert all(state_of(store, e) == models[e] for e in models)
    finally:
        shutil.rmtree(root, ignore_errors=True)
