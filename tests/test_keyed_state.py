"""Keyed state by vnode: restored as of the checkpoint, moved by vnode on a live rescale and
across a restart with another parallelism (each vnode's rows in exactly one table of the group),
a restart with fewer instances refused while a gone one holds rows; the view read by a snapshot
backfill."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import anyio
import numpy as np
import pyarrow as pa
import pytest
from _changelog import Changelog
from _timeouts import scaled
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from barrierflow.actors import SnapshotBackfill
from barrierflow.actors.backfill.materialize import VIEW_TABLE
from barrierflow.channels import Chunk, Message, Op, VnodeBitmap
from barrierflow.channels.mutation import Update
from barrierflow.channels.vnode import compute_vnodes
from barrierflow.errors import ActorFailedError, KeyedStateOrphanedError
from barrierflow.operators._keyed_state import group_of, positions
from barrierflow.operators.aggregate import aggregate
from barrierflow.runtime import ActorContext, Job, Runtime, RuntimeConfig, StreamActor

pytestmark = pytest.mark.anyio

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64())])
KEYS = 200


class Collect(StreamActor):
    seen: ClassVar[list[Chunk]] = []

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk):
            Collect.seen.append(message)
        await ctx.emit(message)


def _batch(keys: Sequence[int], value: int) -> Chunk:
    return Chunk(
        pa.record_batch(
            [pa.array(keys, pa.int64()), pa.array([value] * len(keys), pa.int64())], schema=SCHEMA
        )
    )


def _operator(kind: str = "view") -> Any:
    """The state is the view, or (``"state"``: a mean) kept in a second table."""
    if kind == "view":
        return aggregate("k", schema=SCHEMA, s=("v", "sum"), n=("v", "count"))
    return aggregate("k", schema=SCHEMA, s=("v", "sum"), n=("v", "count"), avg=("v", "mean"))


KINDS = pytest.mark.parametrize("kind", ["view", "state"])


Step = Callable[[Runtime], Awaitable[None]]


async def _phase(
    path: Path, parallelism: int | None, steps: Sequence[Step], kind: str = "view"
) -> tuple[list[Chunk], dict[str, list[int]]]:
    """Run the aggregate with ``parallelism`` over ``steps``; what it emitted and, at the end,
    the keys each instance's view table holds (checking its state table holds the same)."""
    Collect.seen = []
    rt = Runtime(RuntimeConfig(state_path=str(path / "state.db"), barrier_interval=3600))
    rt.add_source("events")
    options: dict[str, Any] = {} if parallelism is None else {"parallelism": parallelism}
    rt.add_actor("agg", _operator(kind), inputs=["events"], **options)
    rt.add_actor("collect", Collect, inputs=["agg"])
    held: dict[str, list[int]] = {}
    kept: dict[str, list[int]] = {}
    with anyio.fail_after(scaled(60)):
        async with rt:
            for step in steps:
                await step(rt)
            epoch = await rt.checkpoint()
            store: Any = rt._store
            for name, found in ((VIEW_TABLE, held), ("state", kept)):
                for table in store.versioned_group("agg", name):
                    rows = [await table.read_vnode(v, epoch) for v in range(table.vnode_count)]
                    found[table.owner] = sorted(pa.concat_tables(rows).column("k").to_pylist())
            gauge = {f.name: f for f in await rt.metrics.snapshot()}[
                "barrierflow_operator_state_rows"
            ]
            counted = {a: gauge.value(actor=a, operator="aggregate") for a in held}
    assert kept == ({} if kind == "view" else held)
    assert counted == {a: len(keys) for a, keys in held.items()}  # the gauge follows the moves
    return list(Collect.seen), held


def push(keys: Sequence[int], value: int = 1) -> Step:
    async def step(rt: Runtime) -> None:
        await rt.push("events", _batch(keys, value))
        await rt.checkpoint()

    return step


def move(bitmaps: dict[str, VnodeBitmap]) -> Step:
    async def step(rt: Runtime) -> None:
        await rt.mutate(Update(vnode_bitmaps={rt.actor_id(n): b for n, b in bitmaps.items()}))

    return step


def expected(
    *pushes: tuple[Sequence[int], int], kind: str = "view"
) -> dict[tuple[int], dict[str, Any]]:
    state: dict[tuple[int], dict[str, Any]] = {}
    for keys, value in pushes:
        for k in keys:
            row = state.setdefault((k,), {"k": k, "s": 0, "n": 0})
            row["s"] += value
            row["n"] += 1
    if kind == "state":
        for row in state.values():
            row["avg"] = row["s"] / row["n"]
    return state


def assert_one_table_per_key(held: dict[str, list[int]], keys: int = KEYS) -> None:
    every = [k for ks in held.values() for k in ks]
    assert sorted(every) == list(range(keys))  # each key once, in one table


ALL_KEYS = list(range(KEYS))
QUARTERS = VnodeBitmap.split(4)


@KINDS
async def test_a_live_rescale_moves_the_rows_of_the_vnodes_and_keeps_the_state(
    tmp_path: Path, kind: str
) -> None:
    swapped = {
        "agg.0": QUARTERS[0] | QUARTERS[2] | QUARTERS[3],  # gains the half of agg.1
        "agg.1": QUARTERS[1],  # loses it, gains a quarter of agg.0
    }
    chunks, held = await _phase(
        tmp_path,
        2,
        [push(ALL_KEYS, 1), move(swapped), push(ALL_KEYS, 2), push(ALL_KEYS[:10], 5)],
        kind,
    )
    log = Changelog().apply(chunks)  # no insert of a known key: the moved state was there
    assert log.state == expected((ALL_KEYS, 1), (ALL_KEYS, 2), (ALL_KEYS[:10], 5), kind=kind)
    assert log.inserts == KEYS
    assert_one_table_per_key(held)
    owner = np.array([QUARTERS.index(q) for q in QUARTERS])
    assert owner.tolist() == [0, 1, 2, 3]
    assert len(held["agg.1"]) < len(held["agg.0"])


async def test_a_second_live_move_before_a_checkpoint_reads_the_first_ones_rows(
    tmp_path: Path,
) -> None:
    halves = VnodeBitmap.split(2)

    async def twice(rt: Runtime) -> None:
        flip = {rt.actor_id("agg.0"): halves[1], rt.actor_id("agg.1"): halves[0]}
        back = {rt.actor_id("agg.0"): halves[0], rt.actor_id("agg.1"): halves[1]}
        await rt.mutate(Update(vnode_bitmaps=flip))
        await rt.mutate(Update(vnode_bitmaps=back))

    chunks, held = await _phase(tmp_path, 2, [push(ALL_KEYS, 1), twice, push(ALL_KEYS, 3)])
    assert Changelog().apply(chunks).state == expected((ALL_KEYS, 1), (ALL_KEYS, 3))
    assert_one_table_per_key(held)


@KINDS
async def test_a_restart_with_more_instances_keeps_the_state(tmp_path: Path, kind: str) -> None:
    first, held2 = await _phase(tmp_path, 2, [push(ALL_KEYS, 1)], kind)
    assert sorted(held2) == ["agg.0", "agg.1"]
    second, held3 = await _phase(tmp_path, 3, [push(ALL_KEYS, 2)], kind)
    log = Changelog().apply(first + second)
    assert log.state == expected((ALL_KEYS, 1), (ALL_KEYS, 2), kind=kind)
    assert log.inserts == KEYS  # the restarted instances knew every key
    assert sorted(held3) == ["agg.0", "agg.1", "agg.2"]
    assert all(held3.values())
    assert_one_table_per_key(held3)
    _, again = await _phase(tmp_path, 3, [], kind)  # restored alone: the gauge counts the rows
    assert again == held3


@KINDS
async def test_a_restart_after_a_live_rescale_moves_rows_back_to_the_even_split(
    tmp_path: Path, kind: str
) -> None:
    lopsided = {"agg.0": QUARTERS[0], "agg.1": QUARTERS[1] | QUARTERS[2] | QUARTERS[3]}
    steps = [push(ALL_KEYS, 1), move(lopsided), push(ALL_KEYS, 1)]
    first, _ = await _phase(tmp_path, 2, steps, kind)
    second, held = await _phase(tmp_path, 2, [push(ALL_KEYS, 4)], kind)
    log = Changelog().apply(first + second)
    assert log.state == expected((ALL_KEYS, 1), (ALL_KEYS, 1), (ALL_KEYS, 4), kind=kind)
    assert_one_table_per_key(held)
    assert abs(len(held["agg.0"]) - len(held["agg.1"])) < KEYS // 3  # back to halves


async def test_an_actor_declared_alone_cannot_become_a_group_across_a_restart(
    tmp_path: Path,
) -> None:
    # "agg" and "agg.0" are two actors: the one declared without parallelism is gone.
    await _phase(tmp_path, None, [push(ALL_KEYS, 1)])
    with pytest.raises(ActorFailedError) as caught:
        await _phase(tmp_path, 2, [push(ALL_KEYS, 1)])
    cause = caught.value.cause
    assert isinstance(cause, KeyedStateOrphanedError)
    assert cause.owner == "agg"


async def test_from_a_group_of_one_to_a_group_of_two(tmp_path: Path) -> None:
    first, _ = await _phase(tmp_path, 1, [push(ALL_KEYS, 1)])
    second, held = await _phase(tmp_path, 2, [push(ALL_KEYS, 1)])
    assert sorted(held) == ["agg.0", "agg.1"]
    assert_one_table_per_key(held)
    log = Changelog().apply(first + second)
    assert log.state == expected((ALL_KEYS, 1), (ALL_KEYS, 1))


async def test_a_restart_with_fewer_instances_is_refused_while_a_gone_one_holds_rows(
    tmp_path: Path,
) -> None:
    await _phase(tmp_path, 3, [push(ALL_KEYS, 1)])
    with pytest.raises(ActorFailedError) as caught:
        await _phase(tmp_path, 2, [push(ALL_KEYS, 1)])
    cause = caught.value.cause
    assert isinstance(cause, KeyedStateOrphanedError)
    assert cause.owner == "agg.2"
    assert cause.group == ("agg.0", "agg.1")
    vnodes = compute_vnodes(pa.table({"k": ALL_KEYS}), ["k"])
    third = VnodeBitmap.split(3)[2].mask
    assert cause.vnodes == tuple(sorted({int(v) for v in vnodes if third[v]}))  # with rows


@KINDS
async def test_a_restart_with_fewer_instances_is_allowed_once_the_gone_one_holds_nothing(
    tmp_path: Path, kind: str
) -> None:
    halves = VnodeBitmap.split(2)
    empty = VnodeBitmap.empty()
    drained = {"agg.0": halves[0], "agg.1": halves[1], "agg.2": empty}
    first, _ = await _phase(
        tmp_path, 3, [push(ALL_KEYS, 1), move(drained), push(ALL_KEYS, 2)], kind
    )
    second, held = await _phase(tmp_path, 2, [push(ALL_KEYS, 3)], kind)
    log = Changelog().apply(first + second)
    assert log.state == expected((ALL_KEYS, 1), (ALL_KEYS, 2), (ALL_KEYS, 3), kind=kind)
    assert_one_table_per_key(held)


def test_an_instance_belongs_to_the_group_of_its_name() -> None:
    assert group_of("agg.2") == "agg"
    assert group_of("agg.12") == "agg"
    assert group_of("agg") == "agg"
    assert group_of("a.b.0") == "a.b"
    assert group_of("agg.x") == "agg.x"


_settings = settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@_settings
@given(
    data=st.lists(st.lists(st.integers(0, 60), min_size=1, max_size=30), min_size=2, max_size=5),
    cut=st.integers(0, 255),
)
async def test_a_random_live_move_keeps_the_state(
    tmp_path_factory: pytest.TempPathFactory, data: list[list[int]], cut: int
) -> None:
    mask = np.arange(256) < cut
    bitmaps = {"agg.0": VnodeBitmap(mask), "agg.1": VnodeBitmap(~mask)}
    steps: list[Step] = [push(data[0], 1), move(bitmaps)]
    steps += [push(keys, i + 2) for i, keys in enumerate(data[1:])]
    chunks, held = await _phase(tmp_path_factory.mktemp("move"), 2, steps)
    pushes = [(data[0], 1)] + [(keys, i + 2) for i, keys in enumerate(data[1:])]
    state = Changelog().apply(chunks).state
    assert state == expected(*pushes)
    every = sorted(k for ks in held.values() for k in ks)
    assert every == sorted({k for keys in data for k in keys})


async def test_a_snapshot_backfill_reads_the_aggregate_like_a_view(tmp_path: Path) -> None:
    seen: list[Chunk] = []

    class Replay(StreamActor):
        async def process(self, message: Message, ctx: ActorContext) -> None:
            if isinstance(message, Chunk):
                seen.append(message)
            await ctx.emit(message)

    rt = Runtime(RuntimeConfig(state_path=str(tmp_path / "state.db"), barrier_interval=0.05))
    rt.add_source("events")
    rt.add_actor("agg", _operator(), inputs=["events"], parallelism=2)
    with anyio.fail_after(scaled(30)):
        async with rt:
            await rt.push("events", _batch(ALL_KEYS, 1))
            await rt.checkpoint()
            job = Job("copy")
            job.add_actor("backfill", lambda: SnapshotBackfill("agg"), inputs=["agg"])
            job.add_actor("replay", Replay, inputs=["backfill"])
            handle = await rt.add_job(job)
            await rt.push("events", _batch(ALL_KEYS[:50], 2))
            await handle.wait_ready()
            await rt.checkpoint()
            await rt.push("events", _batch(ALL_KEYS[:5], 3))
            await rt.checkpoint()
    state = Changelog().apply(seen).state
    assert state == expected((ALL_KEYS, 1), (ALL_KEYS[:50], 2), (ALL_KEYS[:5], 3))
    assert [c for c in seen if c.ops is not None and (c.ops_numpy() == Op.DELETE).any()] == []


async def test_an_instance_that_never_saw_a_row_takes_vnodes_from_a_peer(tmp_path: Path) -> None:
    # No schema declared: agg.1 never opened its tables; it opens them with its peer's schema.
    halves = VnodeBitmap.split(2)
    vnodes = compute_vnodes(pa.table({"k": ALL_KEYS}), ["k"])
    mine = [k for k, v in zip(ALL_KEYS, vnodes, strict=True) if halves[0].mask[v]]
    everything = {"agg.0": VnodeBitmap.empty(), "agg.1": VnodeBitmap.full()}
    Collect.seen = []
    rt = Runtime(RuntimeConfig(state_path=str(tmp_path / "state.db"), barrier_interval=3600))
    rt.add_source("events")
    rt.add_actor(
        "agg", aggregate("k", s=("v", "sum"), n=("v", "count")), inputs=["events"], parallelism=2
    )
    rt.add_actor("collect", Collect, inputs=["agg"])
    with anyio.fail_after(scaled(60)):
        async with rt:
            for step in (push(mine, 1), move(everything), push(mine, 2)):
                await step(rt)
    log = Changelog().apply(Collect.seen)
    assert log.state == expected((mine, 1), (mine, 2))
    assert log.inserts == len(mine)


def test_the_orphaned_state_error_names_the_gone_instance_its_vnodes_and_the_group() -> None:
    few = KeyedStateOrphanedError("agg.0", "agg.2", (3, 9), ("agg.0", "agg.1"))
    assert str(few) == (
        "keyed state of 'agg.0': 'agg.2' holds the rows of 2 vnode(s) [3, 9], and is not in "
        "the group ['agg.0', 'agg.1'] any more; restart with its parallelism, or move its "
        "vnodes live first"
    )
    many = KeyedStateOrphanedError("a", "b", tuple(range(20)), ("a",))
    assert "20 vnode(s) [0, 1, 2, 3, 4, 5, '...', 19]" in str(many)


def test_positions_find_each_key_or_minus_one() -> None:
    rows = pa.table({"a": ["x", "y", "x"], "b": [1, 1, 2], "v": [0.5, 1.5, 2.5]})
    keys = pa.table({"b": [2, 1, 1, 3], "a": ["x", "y", "z", "x"]})
    found = positions(keys, rows, ("a", "b"))
    assert found.tolist() == [2, 1, -1, -1]
    assert found.dtype == np.int64
    none = positions(keys.slice(0, 0), rows, ("a", "b"))
    assert none.tolist() == []
    empty = positions(keys, rows.slice(0, 0), ("a", "b"))
    assert empty.tolist() == [-1, -1, -1, -1]


async def test_state_kept_over_many_epochs_stays_whole(tmp_path: Path) -> None:
    # Each epoch adds a chunk to the state in memory; past 16 they are combined into one.
    steps = [push([i, i + 1], i) for i in range(20)]
    chunks, held = await _phase(tmp_path, None, steps)
    pushes = [([i, i + 1], i) for i in range(20)]
    assert Changelog().apply(chunks).state == expected(*pushes)
    assert held == {"agg": list(range(21))}


async def test_a_restart_takes_an_instances_vnodes_from_several_peers(tmp_path: Path) -> None:
    # Live, agg.1 and agg.2 take the vnodes the even split of three gives agg.0; restarted
    # with three, agg.0 takes them back from both.
    a = np.arange(256)
    scattered = {
        "agg.0": VnodeBitmap(a >= 85),
        "agg.1": VnodeBitmap(a < 43),
        "agg.2": VnodeBitmap((a >= 43) & (a < 85)),
    }
    first, moved = await _phase(
        tmp_path, 3, [push(ALL_KEYS, 1), move(scattered), push(ALL_KEYS, 2)]
    )
    owner = compute_vnodes(pa.table({"k": ALL_KEYS}), ["k"])
    assert moved["agg.1"] == [k for k, v in zip(ALL_KEYS, owner, strict=True) if v < 43]
    second, held = await _phase(tmp_path, 3, [push(ALL_KEYS, 3)])
    log = Changelog().apply(first + second)
    assert log.state == expected((ALL_KEYS, 1), (ALL_KEYS, 2), (ALL_KEYS, 3))
    assert held["agg.0"] == [k for k, v in zip(ALL_KEYS, owner, strict=True) if v < 85]
    assert_one_table_per_key(held)


async def test_a_new_instance_without_a_declared_schema_takes_its_peers(tmp_path: Path) -> None:
    operator = aggregate("k", s=("v", "sum"), n=("v", "count"))

    async def run(parallelism: int, value: int) -> list[Chunk]:
        Collect.seen = []
        rt = Runtime(RuntimeConfig(state_path=str(tmp_path / "state.db"), barrier_interval=3600))
        rt.add_source("events")
        rt.add_actor("agg", operator, inputs=["events"], parallelism=parallelism)
        rt.add_actor("collect", Collect, inputs=["agg"])
        with anyio.fail_after(scaled(60)):
            async with rt:
                await rt.checkpoint()  # agg.2 restored and took its vnodes before any row
                await push(ALL_KEYS, value)(rt)
        return list(Collect.seen)

    first = await run(2, 1)
    second = await run(3, 2)
    log = Changelog().apply(first + second)
    assert log.state == expected((ALL_KEYS, 1), (ALL_KEYS, 2))
    assert log.inserts == KEYS
