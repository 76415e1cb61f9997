"""window_aggregate: windows closed by watermarks (an INSERT when the watermark reaches the end),
late rows within the allowed lateness as update pairs, beyond it dropped or sent to "late",
state deleted at end + lateness; the exact changelog equals a plain-Python reference behind
with_watermark; sliding windows; two sources; restarts, crashes and SIGKILLs; refusals."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any, ClassVar

import anyio
import numpy as np
import pyarrow as pa
import pytest
from _timeouts import scaled
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from barrierflow.channels import Chunk, Message, Op, Watermark
from barrierflow.errors import (
    ActorFailedError,
    ChangelogInputError,
    InvalidArgumentError,
    SchemaMismatchError,
)
from barrierflow.operators._windows import EventTime, watermark_ticks
from barrierflow.operators.watermarks import with_watermark
from barrierflow.operators.window import LATE, Sliding, Tumbling, window_aggregate
from barrierflow.runtime import ActorContext, Placement, Runtime, RuntimeConfig, StreamActor
from barrierflow.testing.actor_conformance import check_stream_actor, check_stream_actor_kills

pytestmark = pytest.mark.anyio

SCHEMA = pa.schema([("k", pa.int64()), ("ts", pa.int64()), ("v", pa.int64())])
AGGS: dict[str, tuple[str, str]] = {
    "n": ("v", "count"),
    "s": ("v", "sum"),
    "hi": ("v", "max"),
    "f": ("v", "first"),
}
Row = tuple[int, int, int]
Item = Sequence[Row] | tuple[str, Any] | str


class Collect(StreamActor):
    """Keeps the chunks and watermarks it reads (class-level lists, cleared by each run)."""

    seen: ClassVar[list[Message]] = []
    late: ClassVar[list[Chunk]] = []

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk | Watermark):
            Collect.seen.append(message)
        await ctx.emit(message)


class CollectLate(StreamActor):
    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk):
            Collect.late.append(message)
        await ctx.emit(message)


class Inject(StreamActor):
    """Turns a chunk with a column ``mark`` into watermarks of ``ts`` (``other``: of that
    column) — upstream watermarks at exact points of the stream."""

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk) and message.batch.schema.names[0] in ("mark", "other"):
            column = message.batch.column(0)
            name = "ts" if message.batch.schema.names[0] == "mark" else "other"
            values = (
                list(column.to_numpy(zero_copy_only=False))
                if pa.types.is_timestamp(column.type)
                else column.to_pylist()
            )
            for value in values:
                await ctx.emit(Watermark(name, value))
            return
        await ctx.emit(message)


def _batch(rows: Sequence[Row]) -> pa.RecordBatch:
    return pa.record_batch(
        [pa.array([r[i] for r in rows], pa.int64()) for i in range(3)], schema=SCHEMA
    )


def _mark(value: Any, column: str = "mark") -> Chunk:
    typ = pa.int64() if isinstance(value, int) else None
    return Chunk(pa.record_batch({column: pa.array([value], typ)}))


def _runtime(path: Path, operator: Any, *, inject: bool = True, **options: Any) -> Runtime:
    Collect.seen, Collect.late = [], []
    rt = Runtime(RuntimeConfig(state_path=str(path / "state.db"), barrier_interval=3600))
    rt.add_source("events")
    upstream = "events"
    if inject:
        rt.add_actor("inject", Inject, inputs=["events"])
        upstream = "inject"
    rt.add_actor("agg", operator, inputs=[upstream], **options)
    rt.add_actor("collect", Collect, inputs=["agg"])
    if operator.side_outputs:
        rt.add_actor("late", CollectLate, inputs=["agg:late"])
    return rt


async def _push(rt: Runtime, items: Iterable[Item]) -> None:
    for item in items:
        if item == "|":
            await rt.checkpoint()
        elif isinstance(item, tuple) and item[0] == "wm":
            await rt.push("events", _mark(item[1]))
        elif isinstance(item, tuple) and item[0] == "other":
            await rt.push("events", _mark(item[1], "other"))
        else:
            await rt.push("events", Chunk(_batch(item)))  # type: ignore[arg-type]


async def _run(path: Path, operator: Any, items: Iterable[Item], **options: Any) -> list[Any]:
    """Push ``items`` (row lists, ``("wm", value)``, ``"|"`` for a checkpoint); what came
    out: rows as ``(op, row dict)``, watermarks as ``("wm", column, value)``."""
    rt = _runtime(path, operator, **options)
    with anyio.fail_after(scaled(60)):
        async with rt:
            await _push(rt, items)
            await rt.checkpoint()
    return _events()


def _events() -> list[Any]:
    out: list[Any] = []
    for message in Collect.seen:
        if isinstance(message, Chunk):
            assert message.ops is not None
            assert message.ops.type == pa.int8()  # one op code per row, as a changelog has
            out += zip(message.ops_numpy().tolist(), message.batch.to_pylist(), strict=True)
        else:
            out.append(("wm", message.column, message.value))
    return out


def _rows(events: list[Any]) -> list[tuple[int, dict[str, Any]]]:
    return [e for e in events if e[0] != "wm"]


def _win(k: int | None, start: int, size: int, **outputs: Any) -> dict[str, Any]:
    key = {} if k is None else {"k": k}
    return {**key, "window_start": start, "window_end": start + size, **outputs}


INS, UD, UI = int(Op.INSERT), int(Op.UPDATE_DELETE), int(Op.UPDATE_INSERT)


# Closing.


async def test_a_window_is_emitted_as_an_insert_when_the_watermark_reaches_its_end(
    tmp_path: Path,
) -> None:
    operator = window_aggregate("k", Tumbling(10), on="ts", s=("v", "sum"))
    events = await _run(tmp_path, operator, [[(1, 3, 5), (1, 9, 2)], ("wm", 9), ("wm", 10)])
    assert events == [
        ("wm", "ts", 9),
        (INS, _win(1, 0, 10, s=7)),
        ("wm", "ts", 10),
    ]


async def test_a_row_at_exactly_the_end_belongs_to_the_next_window(tmp_path: Path) -> None:
    operator = window_aggregate("k", Tumbling(10), on="ts", s=("v", "sum"))
    events = await _run(tmp_path, operator, [[(1, 0, 1), (1, 10, 2)], ("wm", 20)])
    assert _rows(events) == [(INS, _win(1, 0, 10, s=1)), (INS, _win(1, 10, 10, s=2))]


async def test_the_windows_a_watermark_closes_come_in_start_then_key_order_before_it(
    tmp_path: Path,
) -> None:
    operator = window_aggregate("k", Tumbling(10), on="ts", n=("v", "count"))
    rows = [(3, 15, 0), (2, 5, 0), (3, 1, 0), (1, 12, 0), (2, 25, 0)]
    events = await _run(tmp_path, operator, [rows, "|", ("wm", 20), ("wm", 30)])
    assert events == [
        (INS, _win(2, 0, 10, n=1)),
        (INS, _win(3, 0, 10, n=1)),
        (INS, _win(1, 10, 10, n=1)),
        (INS, _win(3, 10, 10, n=1)),
        ("wm", "ts", 20),
        (INS, _win(2, 20, 10, n=1)),
        ("wm", "ts", 30),
    ]


async def test_a_watermark_that_does_not_advance_is_ignored_and_not_passed_on(
    tmp_path: Path,
) -> None:
    operator = window_aggregate("k", Tumbling(10), on="ts", n=("v", "count"))
    events = await _run(
        tmp_path, operator, [("wm", 5), [(1, 7, 0)], ("wm", 5), ("wm", 3), ("wm", 12)]
    )
    assert events == [("wm", "ts", 5), (INS, _win(1, 0, 10, n=1)), ("wm", "ts", 12)]


async def test_watermarks_of_other_columns_pass_on_and_close_nothing(tmp_path: Path) -> None:
    operator = window_aggregate("k", Tumbling(10), on="ts", n=("v", "count"))
    events = await _run(tmp_path, operator, [[(1, 1, 0)], ("other", 100), ("other", 50)])
    assert events == [("wm", "other", 100), ("wm", "other", 50)]


async def test_windows_of_no_row_emit_nothing_and_open_windows_wait(tmp_path: Path) -> None:
    operator = window_aggregate("k", Tumbling(10), on="ts", n=("v", "count"))
    events = await _run(tmp_path, operator, [[(1, 35, 0)], ("wm", 39), "|"])
    assert _rows(events) == []


# Lateness.


async def test_a_late_row_within_the_lateness_updates_its_window_with_an_update_pair(
    tmp_path: Path,
) -> None:
    operator = window_aggregate(
        "k", Tumbling(10), on="ts", allowed_lateness=5, s=("v", "sum"), hi=("v", "max")
    )
    events = await _run(
        tmp_path, operator, [[(1, 2, 4)], ("wm", 14), [(1, 9, 6), (1, 20, 1)], ("wm", 19)]
    )
    assert _rows(events) == [
        (INS, _win(1, 0, 10, s=4, hi=4)),
        (UD, _win(1, 0, 10, s=4, hi=4)),
        (UI, _win(1, 0, 10, s=10, hi=6)),
    ]


async def test_a_late_row_for_a_window_that_had_no_row_is_an_insert(tmp_path: Path) -> None:
    operator = window_aggregate("k", Tumbling(10), on="ts", allowed_lateness=5, s=("v", "sum"))
    events = await _run(tmp_path, operator, [("wm", 12), [(1, 3, 7), (2, 4, 1)]])
    assert _rows(events) == [(INS, _win(1, 0, 10, s=7)), (INS, _win(2, 0, 10, s=1))]


async def test_a_late_row_that_leaves_the_outputs_unchanged_emits_nothing(tmp_path: Path) -> None:
    operator = window_aggregate("k", Tumbling(10), on="ts", allowed_lateness=5, hi=("v", "max"))
    events = await _run(tmp_path, operator, [[(1, 2, 9)], ("wm", 10), [(1, 3, 1)]])
    assert _rows(events) == [(INS, _win(1, 0, 10, hi=9))]


async def test_late_updates_of_one_chunk_come_once_per_window_in_window_order(
    tmp_path: Path,
) -> None:
    operator = window_aggregate("k", Tumbling(10), on="ts", allowed_lateness=50, s=("v", "sum"))
    rows = [(2, 15, 1), (1, 15, 1), (1, 5, 1)]
    late = [(2, 16, 1), (1, 1, 1), (2, 17, 1), (1, 6, 1)]
    events = await _run(tmp_path, operator, [rows, ("wm", 20), late])
    assert _rows(events) == [
        (INS, _win(1, 0, 10, s=1)),
        (INS, _win(1, 10, 10, s=1)),
        (INS, _win(2, 10, 10, s=1)),
        (UD, _win(1, 0, 10, s=1)),
        (UI, _win(1, 0, 10, s=3)),
        (UD, _win(2, 10, 10, s=1)),
        (UI, _win(2, 10, 10, s=3)),
    ]


@pytest.mark.parametrize(
    ("watermark", "dropped"),
    [(14, False), (15, True), (16, True)],
)
async def test_a_row_is_beyond_the_lateness_exactly_when_end_plus_lateness_reaches_the_watermark(
    tmp_path: Path, watermark: int, dropped: bool
) -> None:
    operator = window_aggregate("k", Tumbling(10), on="ts", allowed_lateness=5, n=("v", "count"))
    rt = _runtime(tmp_path, operator)
    async with rt:
        await _push(rt, [[(1, 25, 0)], ("wm", watermark), [(1, 9, 0)], "|"])
        families = {f.name: f for f in await rt.metrics.snapshot()}
    labels = {"actor": "agg", "operator": "window_aggregate"}
    assert families["barrierflow_operator_late_rows"].value(**labels) == 1
    assert families["barrierflow_operator_late_rows_dropped"].value(**labels) == int(dropped)
    expected = [] if dropped else [(INS, _win(1, 0, 10, n=1))]
    assert _rows(_events()) == expected


async def test_a_row_of_an_open_window_is_not_late(tmp_path: Path) -> None:
    operator = window_aggregate("k", Tumbling(10), on="ts", n=("v", "count"))
    rt = _runtime(tmp_path, operator)
    async with rt:
        await _push(rt, [("wm", 9), [(1, 9, 0), (1, 0, 0)], ("wm", 10), [(1, 9, 0)], "|"])
        families = {f.name: f for f in await rt.metrics.snapshot()}
    labels = {"actor": "agg", "operator": "window_aggregate"}
    assert families["barrierflow_operator_late_rows"].value(**labels) == 1
    assert families["barrierflow_operator_late_rows_dropped"].value(**labels) == 1
    assert families["barrierflow_operator_rows_in"].value(**labels) == 3
    assert families["barrierflow_operator_rows_out"].value(**labels) == 1
    assert _rows(_events()) == [(INS, _win(1, 0, 10, n=2))]


async def test_rows_beyond_the_lateness_go_to_the_late_output_as_they_came(
    tmp_path: Path,
) -> None:
    operator = window_aggregate(
        "k", Tumbling(10), on="ts", allowed_lateness=5, late="output", n=("v", "count")
    )
    assert operator.side_outputs == (LATE,)
    rows = [(1, 2, 10), (2, 12, 20), (3, 4, 30)]
    events = await _run(tmp_path, operator, [("wm", 15), rows, ("wm", 20)])
    assert _rows(events) == [(INS, _win(2, 10, 10, n=1))]
    [late] = Collect.late
    assert late.visibility is not None  # a mask over the chunk, not a copy
    assert late.compact().batch.to_pylist() == [
        {"k": 1, "ts": 2, "v": 10},
        {"k": 3, "ts": 4, "v": 30},
    ]


async def test_the_state_of_a_window_is_deleted_once_the_watermark_reaches_end_plus_lateness(
    tmp_path: Path,
) -> None:
    operator = window_aggregate("k", Tumbling(10), on="ts", allowed_lateness=5, n=("v", "count"))
    rt = _runtime(tmp_path, operator)
    labels = {"actor": "agg", "operator": "window_aggregate"}
    counts = []
    async with rt:
        for item in ([(1, 1, 0), (2, 2, 0), (1, 11, 0)], ("wm", 10), ("wm", 14), ("wm", 15)):
            await _push(rt, [item, "|"])
            families = {f.name: f for f in await rt.metrics.snapshot()}
            counts.append(families["barrierflow_operator_state_rows"].value(**labels))
    assert counts == [3, 3, 3, 1]
    # Each window is emitted once, when it closes, however far the watermark moves after.
    assert _rows(_events()) == [(INS, _win(1, 0, 10, n=1)), (INS, _win(2, 0, 10, n=1))]


async def test_without_lateness_a_window_is_deleted_when_it_closes(tmp_path: Path) -> None:
    operator = window_aggregate("k", Tumbling(10), on="ts", n=("v", "count"))
    rt = _runtime(tmp_path, operator)
    labels = {"actor": "agg", "operator": "window_aggregate"}
    async with rt:
        await _push(rt, [[(1, 1, 0), (1, 11, 0)], ("wm", 10), "|"])
        families = {f.name: f for f in await rt.metrics.snapshot()}
    assert families["barrierflow_operator_state_rows"].value(**labels) == 1


# Sliding windows, other columns, several inputs.


async def test_a_sliding_window_row_falls_in_size_over_every_windows(tmp_path: Path) -> None:
    operator = window_aggregate("k", Sliding(10, 5), on="ts", s=("v", "sum"))
    events = await _run(tmp_path, operator, [[(1, 7, 1), (1, 12, 10)], ("wm", 30)])
    assert _rows(events) == [
        (INS, _win(1, 0, 10, s=1)),
        (INS, _win(1, 5, 10, s=11)),
        (INS, _win(1, 10, 10, s=10)),
    ]


async def test_a_sliding_row_updates_its_windows_within_the_lateness_and_skips_the_others(
    tmp_path: Path,
) -> None:
    operator = window_aggregate("k", Sliding(10, 5), on="ts", allowed_lateness=3, s=("v", "sum"))
    rt = _runtime(tmp_path, operator)
    async with rt:
        # At 14, a row at 7 is in [0, 10) (beyond: 10 + 3 <= 14) and [5, 15) (open).
        await _push(rt, [("wm", 14), [(1, 7, 1)], ("wm", 16), "|"])
        families = {f.name: f for f in await rt.metrics.snapshot()}
    labels = {"actor": "agg", "operator": "window_aggregate"}
    assert families["barrierflow_operator_late_rows"].value(**labels) == 1
    assert families["barrierflow_operator_late_rows_dropped"].value(**labels) == 0
    assert _rows(_events()) == [(INS, _win(1, 5, 10, s=1))]


async def test_a_global_window_has_no_key_and_runs_as_one_instance(tmp_path: Path) -> None:
    operator = window_aggregate(None, Tumbling(10), on="ts", s=("v", "sum"))
    assert operator.placement is Placement.GLOBAL
    assert operator.key is None
    assert window_aggregate((), Tumbling(10), on="ts", s=("v", "sum")).placement is (
        Placement.GLOBAL
    )
    events = await _run(tmp_path, operator, [[(1, 1, 2), (2, 3, 5), (1, 11, 1)], ("wm", 20)])
    assert _rows(events) == [(INS, _win(None, 0, 10, s=7)), (INS, _win(None, 10, 10, s=1))]


async def test_timestamp_windows_take_timedeltas_and_keep_the_columns_type(tmp_path: Path) -> None:
    typ = pa.timestamp("ms", tz="UTC")
    base = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    schema = pa.schema([("k", pa.int64()), ("ts", typ), ("v", pa.int64())])
    operator = window_aggregate(
        "k",
        Tumbling(timedelta(minutes=1)),
        on="ts",
        allowed_lateness=30,
        schema=schema,
        s=("v", "sum"),
    )
    times = [base + timedelta(seconds=s) for s in (5, 50, 70)]
    rows = pa.record_batch(
        [pa.array([1, 1, 1]), pa.array(times, typ), pa.array([1, 2, 4])], schema=schema
    )
    Collect.seen = []
    rt = Runtime(RuntimeConfig(state_path=str(tmp_path / "state.db"), barrier_interval=3600))
    rt.add_source("events")
    rt.add_actor("wm", with_watermark("ts", delay=timedelta(seconds=5)), inputs=["events"])
    rt.add_actor("agg", operator, inputs=["wm"])
    rt.add_actor("collect", Collect, inputs=["agg"])
    async with rt:
        await rt.push("events", Chunk(rows))
        await rt.checkpoint()
    [chunk] = [m for m in Collect.seen if isinstance(m, Chunk)]
    assert chunk.batch.schema.names == ["k", "window_start", "window_end", "s"]
    assert chunk.batch.schema.field("window_start").type == typ
    assert chunk.batch.schema.field("window_end").type == typ
    assert not chunk.batch.schema.field("window_end").nullable
    assert chunk.batch.to_pylist() == [
        {"k": 1, "window_start": base, "window_end": base + timedelta(minutes=1), "s": 3}
    ]


async def test_a_float_column_windows_by_floats(tmp_path: Path) -> None:
    schema = pa.schema([("k", pa.int64()), ("ts", pa.float64()), ("v", pa.int64())])
    operator = window_aggregate("k", Tumbling(0.5), on="ts", n=("v", "count"))
    batch = pa.record_batch(
        [pa.array([1, 1]), pa.array([0.25, 0.75]), pa.array([0, 0])], schema=schema
    )
    rt = _runtime(tmp_path, operator)
    async with rt:
        await rt.push("events", Chunk(batch))
        await rt.push("events", Chunk(pa.record_batch({"mark": pa.array([1.0])})))
        await rt.checkpoint()
    assert _rows(_events()) == [
        (INS, {"k": 1, "window_start": 0.0, "window_end": 0.5, "n": 1}),
        (INS, {"k": 1, "window_start": 0.5, "window_end": 1.0, "n": 1}),
    ]


async def test_two_watermarked_sources_close_a_window_on_the_minimum(tmp_path: Path) -> None:
    Collect.seen = []
    operator = window_aggregate("k", Tumbling(10), on="ts", s=("v", "sum"))
    rt = Runtime(RuntimeConfig(state_path=str(tmp_path / "state.db"), barrier_interval=3600))
    for name in ("a", "b"):
        rt.add_source(name)
        rt.add_actor(f"wm_{name}", with_watermark("ts", delay=0), inputs=[name])
    rt.add_actor("agg", operator, inputs=["wm_a", "wm_b"])
    rt.add_actor("collect", Collect, inputs=["agg"])
    with anyio.fail_after(scaled(30)):
        async with rt:
            await rt.push("a", Chunk(_batch([(1, 3, 1), (1, 25, 1)])))
            await rt.checkpoint()
            assert _rows(_events()) == []  # b has no watermark yet
            await rt.push("b", Chunk(_batch([(1, 8, 2)])))
            await rt.checkpoint()
            assert _rows(_events()) == []  # min(25, 8): nothing closes
            await rt.push("b", Chunk(_batch([(1, 12, 4)])))
            await rt.checkpoint()
            assert _rows(_events()) == [(INS, _win(1, 0, 10, s=3))]  # min(25, 12) >= 10
    assert [e[2] for e in _events() if e[0] == "wm"] == [8, 12]


async def test_parallel_instances_give_what_one_gives(tmp_path: Path) -> None:
    rows = [(k, t, k * t) for k in range(8) for t in (1, 7, 13, 24)]
    items: list[Item] = [rows[:16], ("wm", 10), "|", rows[16:], ("wm", 30)]
    operator = window_aggregate("k", Tumbling(10), on="ts", allowed_lateness=5, **AGGS)
    one = await _run(tmp_path / "one", operator, items)
    two = await _run(tmp_path / "two", operator, items, parallelism=2)
    assert sorted(map(repr, _rows(one))) == sorted(map(repr, _rows(two)))
    # 3 windows per key, each an insert: those of keys 4-7 in [0, 10) late, within the lateness.
    assert [op for op, _ in _rows(two)] == [INS] * (8 * 3)


# Restarts and crashes.


async def test_the_watermark_and_the_windows_survive_a_restart(tmp_path: Path) -> None:
    operator = window_aggregate("k", Tumbling(10), on="ts", allowed_lateness=10, s=("v", "sum"))
    first = await _run(tmp_path, operator, [[(1, 2, 1), (1, 15, 5)], ("wm", 12)])
    assert _rows(first) == [(INS, _win(1, 0, 10, s=1))]
    # Restarted: a row of [0, 10) is late within the lateness (the watermark 12 was kept), and
    # [10, 20) still holds 5.
    second = await _run(tmp_path, operator, [[(1, 3, 2), (1, 1, 1)], ("wm", 20)])
    assert _rows(second) == [
        (UD, _win(1, 0, 10, s=1)),
        (UI, _win(1, 0, 10, s=4)),
        (INS, _win(1, 10, 10, s=5)),
    ]


async def test_a_restart_takes_the_largest_watermark_of_its_group(tmp_path: Path) -> None:
    operator = window_aggregate("k", Tumbling(10), on="ts", s=("v", "sum"))
    await _run(tmp_path, operator, [[(k, 2, 1) for k in range(6)], ("wm", 12)], parallelism=2)
    # From 2 instances to 3: the new one has no watermark of its own, and must not take a
    # late row for an open window.
    second = await _run(
        tmp_path, operator, [[(k, 3, 1) for k in range(6)], ("wm", 20)], parallelism=3
    )
    assert _rows(second) == []


class _OpsAsColumn:
    """The context an inner actor emits through: the changelog's ops become a column ``op``
    (the conformance sink keeps rows, not ops)."""

    def __init__(self, ctx: ActorContext) -> None:
        self._ctx = ctx

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)

    async def emit(self, message: Message, *, output: str | None = None) -> None:
        if isinstance(message, Chunk):
            message = Chunk(message.batch.append_column("op", pa.array(message.ops_numpy())))
        await self._ctx.emit(message, output=output)


class _Into:
    """The context the first actor of a chain emits through: into the next actor."""

    def __init__(self, ctx: ActorContext, actor: StreamActor, out: Any) -> None:
        self._ctx, self._actor, self._out = ctx, actor, out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)

    async def emit(self, message: Message, *, output: str | None = None) -> None:
        await self._actor.process(message, self._out)


class Windowed(StreamActor):
    """with_watermark then window_aggregate in one actor (the conformance suites run one), the
    window's ops as a column: both keep their state in the one actor's tables."""

    def __init__(self) -> None:
        self.marks = with_watermark("ts", delay=3)()
        self.windows = window_aggregate("k", Tumbling(10), on="ts", allowed_lateness=5, **AGGS)()

    async def run(self, ctx: ActorContext) -> None:
        out = _OpsAsColumn(ctx)
        into = _Into(ctx, self.windows, out)
        await self.marks.restore(into)  # type: ignore[arg-type]
        await self.windows.restore(out)  # type: ignore[arg-type]
        async for message in ctx.messages():
            await self.marks.process(message, into)  # type: ignore[arg-type]


WINDOWED_OUTPUT = pa.schema(
    [
        pa.field("k", pa.int64(), nullable=False),
        pa.field("window_start", pa.int64(), nullable=False),
        pa.field("window_end", pa.int64(), nullable=False),
        pa.field("n", pa.int64(), nullable=False),
        pa.field("s", pa.int64()),
        pa.field("hi", pa.int64()),
        pa.field("f", pa.int64()),
        pa.field("op", pa.int8()),
    ]
)


def _disordered_chunks(seed: int, count: int = 12) -> list[Chunk]:
    rng = np.random.default_rng(seed)
    chunks, cursor = [], 0
    for _ in range(count):
        cursor += int(rng.integers(0, 6))
        n = int(rng.integers(1, 6))
        rows = [
            (int(rng.integers(0, 3)), max(0, cursor - int(rng.integers(0, 12))), int(v))
            for v in rng.integers(-5, 6, n)
        ]
        chunks.append(Chunk(_batch(rows)))
    return chunks


_settings = settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@_settings
@given(seed=st.integers(0, 10_000))
async def test_windows_commit_the_same_rows_with_crashes(
    tmp_path_factory: pytest.TempPathFactory, seed: int
) -> None:
    report = await check_stream_actor(
        Windowed,
        _disordered_chunks(seed),
        output=WINDOWED_OUTPUT,
        state_dir=tmp_path_factory.mktemp("conformance"),
        crashes=3,
        seed=seed,
    )
    report.raise_for_failures()


@pytest.mark.subprocess
async def test_windows_commit_the_same_rows_with_sigkills(tmp_path: Path) -> None:
    report = await check_stream_actor_kills(
        Windowed,
        _disordered_chunks(7),
        output=WINDOWED_OUTPUT,
        state_dir=tmp_path,
        kills=3,
        seed=7,
    )
    report.raise_for_failures()


# The reference.


def reference(
    chunks: Sequence[Sequence[Row]], size: int, every: int, delay: int, lateness: int
) -> tuple[list[tuple[int, dict[str, Any]]], list[Row], int]:
    """What window_aggregate(AGGS) behind with_watermark(delay) emits, in plain Python: the
    changelog in order, the rows beyond the lateness, the late rows' count."""
    windows: dict[tuple[int, int], list[int]] = {}
    emitted: dict[tuple[int, int], dict[str, Any]] = {}
    out: list[tuple[int, dict[str, Any]]] = []
    beyond: list[Row] = []
    late = 0
    watermark: int | None = None

    def row(key: tuple[int, int]) -> dict[str, Any]:
        values = windows[key]
        outputs = {"n": len(values), "s": sum(values), "hi": max(values), "f": values[0]}
        return _win(key[0], key[1], size, **outputs)

    for rows in chunks:
        touched: set[tuple[int, int]] = set()
        for k, ts, v in rows:
            last = ts - ts % every
            starts = [last - j * every for j in range(size // every - 1, -1, -1)]
            if watermark is not None and starts[0] + size <= watermark:
                late += 1
            if watermark is not None and last + size + lateness <= watermark:
                beyond.append((k, ts, v))
            for start in starts:
                if watermark is not None and start + size + lateness <= watermark:
                    continue
                windows.setdefault((k, start), []).append(v)
                if watermark is not None and start + size <= watermark:
                    touched.add((k, start))
        for key in sorted(touched, key=lambda key: (key[1], key[0])):
            new, old = row(key), emitted.get(key)
            if old is None:
                out.append((INS, new))
            elif old != new:
                out += [(UD, old), (UI, new)]
            emitted[key] = new
        top = max(ts for _, ts, _ in rows) - delay
        if watermark is None or top > watermark:
            before, watermark = watermark, top
            closing = [
                key
                for key in windows
                if key[1] + size <= watermark and (before is None or key[1] + size > before)
            ]
            for key in sorted(closing, key=lambda key: (key[1], key[0])):
                emitted[key] = row(key)
                out.append((INS, emitted[key]))
    return out, beyond, late


@st.composite
def _streams(draw: st.DrawFn) -> tuple[list[list[Row]], list[int]]:
    """Chunks of rows whose event times grow with bounded disorder, and checkpoints."""
    chunks, cursor = [], 0
    disorder = draw(st.integers(0, 12))
    for _ in range(draw(st.integers(1, 8))):
        cursor += draw(st.integers(0, 6))
        rows = draw(
            st.lists(
                st.tuples(
                    st.integers(0, 3),
                    st.integers(max(0, cursor - disorder), cursor),
                    st.integers(-5, 5),
                ),
                min_size=1,
                max_size=6,
            )
        )
        chunks.append(rows)
    checkpoints = draw(st.lists(st.integers(0, len(chunks) - 1), max_size=3))
    return chunks, checkpoints


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    stream=_streams(),
    every=st.integers(1, 4),
    times=st.integers(1, 3),
    delay=st.integers(0, 4),
    lateness=st.integers(0, 6),
    late=st.sampled_from(["drop", "output"]),
)
async def test_the_changelog_equals_a_plain_python_reference(
    tmp_path_factory: pytest.TempPathFactory,
    stream: tuple[list[list[Row]], list[int]],
    every: int,
    times: int,
    delay: int,
    lateness: int,
    late: str,
) -> None:
    chunks, checkpoints = stream
    size = every * times
    window = Tumbling(size) if times == 1 else Sliding(size, every)
    operator = window_aggregate(
        "k",
        window,
        on="ts",
        allowed_lateness=lateness,
        late=late,
        **AGGS,  # type: ignore[arg-type]
    )
    Collect.seen, Collect.late = [], []
    rt = Runtime(
        RuntimeConfig(
            state_path=str(tmp_path_factory.mktemp("ref") / "state.db"), barrier_interval=3600
        )
    )
    rt.add_source("events")
    rt.add_actor("wm", with_watermark("ts", delay=delay), inputs=["events"])
    rt.add_actor("agg", operator, inputs=["wm"])
    rt.add_actor("collect", Collect, inputs=["agg"])
    if late == "output":
        rt.add_actor("late", CollectLate, inputs=["agg:late"])
    with anyio.fail_after(scaled(60)):
        async with rt:
            for i, rows in enumerate(chunks):
                await rt.push("events", Chunk(_batch(rows)))
                if i in checkpoints:
                    await rt.checkpoint()
            await rt.checkpoint()
            families = {f.name: f for f in await rt.metrics.snapshot()}
    expected, beyond, late_rows = reference(chunks, size, every, delay, lateness)
    assert _rows(_events()) == expected
    labels = {"actor": "agg", "operator": "window_aggregate"}
    assert families["barrierflow_operator_late_rows"].value(**labels) == late_rows
    assert families["barrierflow_operator_late_rows_dropped"].value(**labels) == len(beyond)
    if late == "output":
        sent = [r for c in Collect.late for r in c.compact().batch.to_pylist()]
        assert sent == [{"k": k, "ts": ts, "v": v} for k, ts, v in beyond]


# Refusals.


async def test_a_changelog_input_is_refused(tmp_path: Path) -> None:
    operator = window_aggregate("k", Tumbling(10), on="ts", n=("v", "count"))
    rt = _runtime(tmp_path, operator, inject=False)
    with pytest.raises(ActorFailedError) as caught:
        async with rt:
            await rt.push("events", Chunk(_batch([(1, 1, 1), (1, 1, 1)]), [Op.INSERT, Op.DELETE]))
            await rt.checkpoint()
    error = caught.value.__cause__
    assert isinstance(error, ChangelogInputError)
    assert (error.actor, error.operator, error.expected, error.what) == (
        "agg",
        "window_aggregate",
        "an insert-only input",
        "a chunk with 1 delete(s) or update(s)",
    )


@pytest.mark.parametrize("column", ["k", "ts"])
async def test_a_null_key_or_event_time_is_refused(tmp_path: Path, column: str) -> None:
    operator = window_aggregate("k", Tumbling(10), on="ts", n=("v", "count"))
    values = {"k": [1, 1], "ts": [1, 2], "v": [0, 0]}
    values[column] = [1, None]
    batch = pa.record_batch({n: pa.array(v, pa.int64()) for n, v in values.items()})
    rt = _runtime(tmp_path, operator, inject=False)
    with pytest.raises(ActorFailedError) as caught:
        async with rt:
            await rt.push("events", Chunk(batch))
            await rt.checkpoint()
    error = caught.value.__cause__
    assert isinstance(error, InvalidArgumentError)
    assert (error.argument, error.expected, error.got) == (
        f"window_aggregate 'agg': column {column!r}",
        "no nulls",
        "1 null(s)",
    )


@pytest.mark.parametrize("declared", [True, False])
async def test_a_chunk_of_another_schema_is_refused(tmp_path: Path, declared: bool) -> None:
    schema = SCHEMA if declared else None
    operator = window_aggregate("k", Tumbling(10), on="ts", schema=schema, n=("v", "count"))
    other = pa.record_batch({"k": pa.array([1]), "ts": pa.array([1]), "v": pa.array([1.5])})
    rt = _runtime(tmp_path, operator, inject=False)
    with pytest.raises(ActorFailedError) as caught:
        async with rt:
            if not declared:  # the first chunk's schema is the one every chunk must have
                await rt.push("events", Chunk(_batch([(1, 1, 1)])))
            await rt.push("events", Chunk(other))
            await rt.checkpoint()
    error = caught.value.__cause__
    assert isinstance(error, SchemaMismatchError)
    assert error.argument == "window_aggregate 'agg': input"
    assert (error.expected_schema, error.actual_schema) == (SCHEMA, other.schema)


async def test_a_watermark_of_another_kind_than_the_column_fails_the_actor(
    tmp_path: Path,
) -> None:
    operator = window_aggregate("k", Tumbling(10), on="ts", n=("v", "count"))
    rt = _runtime(tmp_path, operator)
    stamp = pa.array([np.datetime64("2024-01-01T00:00:00", "ns")])
    with pytest.raises(ActorFailedError) as caught:
        async with rt:
            await rt.push("events", Chunk(_batch([(1, 1, 1)])))
            await rt.push("events", Chunk(pa.record_batch({"mark": stamp})))
            await rt.checkpoint()
    assert isinstance(caught.value.__cause__, InvalidArgumentError)


@pytest.mark.parametrize(
    ("window", "lateness", "typ"),
    [
        (Tumbling(timedelta(seconds=10)), 0, pa.int64()),  # a timedelta on a numeric column
        (Tumbling(1.5), 0, pa.int64()),  # not an int on an integer column
        (Tumbling(10), timedelta(seconds=1), pa.int64()),
        (Tumbling(timedelta(milliseconds=1500)), 0, pa.timestamp("s")),  # not whole seconds
        (Sliding(timedelta(seconds=2), 0.0005), 0, pa.timestamp("ms")),  # every: half a ms
    ],
)
def test_a_size_or_lateness_that_does_not_fit_the_column_is_refused_with_a_schema(
    window: Any, lateness: Any, typ: pa.DataType
) -> None:
    schema = pa.schema([("k", pa.int64()), ("ts", typ), ("v", pa.int64())])
    with pytest.raises(InvalidArgumentError) as caught:
        window_aggregate(
            "k", window, on="ts", allowed_lateness=lateness, schema=schema, n=("v", "count")
        )
    if lateness:
        assert caught.value.argument == "allowed_lateness"
    # Without a schema it is accepted when called (the column is unknown yet).
    window_aggregate("k", window, on="ts", allowed_lateness=lateness, n=("v", "count"))


@pytest.mark.parametrize(
    ("schema", "error"),
    [
        (pa.schema([("k", pa.int64()), ("v", pa.int64())]), SchemaMismatchError),  # no ts
        (
            pa.schema([("k", pa.int64()), ("ts", pa.string()), ("v", pa.int64())]),
            SchemaMismatchError,
        ),
        (pa.schema([("ts", pa.int64()), ("v", pa.int64())]), SchemaMismatchError),  # no key
        (pa.schema([("k", pa.int64()), ("ts", pa.int64())]), SchemaMismatchError),  # no v
        ("not a schema", InvalidArgumentError),
    ],
)
def test_a_schema_that_does_not_fit_is_refused_when_called(
    schema: Any, error: type[Exception]
) -> None:
    with pytest.raises(error) as caught:
        window_aggregate("k", Tumbling(10), on="ts", schema=schema, n=("v", "count"))
    if (
        isinstance(schema, pa.Schema)
        and schema.get_field_index("k") >= 0
        and (schema.get_field_index("v") >= 0)
    ):
        assert caught.value.argument == "on"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: window_aggregate("k", 10, on="ts", n=("v", "count")), "window"),
        (lambda: window_aggregate("k", Tumbling(10), on="", n=("v", "count")), "on"),
        (lambda: window_aggregate("k", Tumbling(10), on=None, n=("v", "count")), "on"),
        (lambda: window_aggregate(3, Tumbling(10), on="ts", n=("v", "count")), "key"),
        (lambda: window_aggregate(["k", "k"], Tumbling(10), on="ts", n=("v", "count")), "key"),
        (
            lambda: window_aggregate("window_start", Tumbling(10), on="ts", n=("v", "count")),
            "key",
        ),
        (
            lambda: window_aggregate(
                "k", Tumbling(10), on="ts", allowed_lateness=-1, n=("v", "count")
            ),
            "allowed_lateness",
        ),
        (
            lambda: window_aggregate(
                "k", Tumbling(10), on="ts", allowed_lateness="1", n=("v", "count")
            ),
            "allowed_lateness",
        ),
        (
            lambda: window_aggregate("k", Tumbling(10), on="ts", late="keep", n=("v", "count")),
            "late",
        ),
        (lambda: window_aggregate("k", Tumbling(10), on="ts"), "aggregations"),
        (
            lambda: window_aggregate("k", Tumbling(10), on="ts", window_end=("v", "max")),
            "aggregations",
        ),
        (lambda: window_aggregate("k", Tumbling(10), on="ts", k=("v", "max")), "aggregations"),
        (
            lambda: window_aggregate("k", Tumbling(10), on="ts", x=("window_start", "max")),
            "aggregations",
        ),
        (lambda: window_aggregate("k", Tumbling(10), on="ts", x=("v", "median")), "aggregations"),
        (lambda: Tumbling(0), "size"),
        (lambda: Tumbling(-1), "size"),
        (lambda: Tumbling(timedelta(0)), "size"),
        (lambda: Tumbling(float("inf")), "size"),
        (lambda: Tumbling(True), "size"),
        (lambda: Tumbling("1m"), "size"),
        (lambda: Sliding(10, 0), "every"),
        (lambda: Sliding(10, 3), "Sliding(size, every)"),
        (lambda: Sliding(5, 10), "Sliding(size, every)"),
        (lambda: Sliding(timedelta(seconds=10), timedelta(seconds=4)), "Sliding(size, every)"),
    ],
)
def test_bad_arguments_are_refused_when_called(call: Any, argument: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        call()
    assert caught.value.argument.startswith(argument)


def test_the_operator_is_keyed_by_its_key_and_declares_late_only_when_asked() -> None:
    operator = window_aggregate(["k", "j"], Tumbling(10), on="ts", n=("v", "count"))
    assert operator.placement is Placement.KEYED
    assert operator.key == ("k", "j")
    assert operator.kind == "window_aggregate"
    assert operator.side_outputs == ()
    assert operator() is not operator()


# Event time and assignment.


def test_tumbling_assignment_floors_to_the_size_from_tick_zero() -> None:
    time = EventTime("ts", pa.int64())
    rows, starts = Tumbling(10).assigner(time).assign(np.array([0, 9, 10, -1, -10, 25]))
    assert rows.tolist() == [0, 1, 2, 3, 4, 5]
    assert starts.tolist() == [0, 0, 10, -10, -10, 20]


def test_sliding_assignment_gives_each_row_its_windows_earliest_first() -> None:
    time = EventTime("ts", pa.int64())
    windows = Sliding(15, 5).assigner(time)
    assert windows.count == 3
    rows, starts = windows.assign(np.array([7, 10]))
    assert rows.tolist() == [0, 0, 0, 1, 1, 1]
    assert starts.tolist() == [-5, 0, 5, 0, 5, 10]
    assert windows.last_start(np.array([7, 10, -1])).tolist() == [5, 10, -5]


def test_float_assignment_floors() -> None:
    windows = Sliding(1.0, 0.5).assigner(EventTime("ts", pa.float64()))
    rows, starts = windows.assign(np.array([0.75, -0.25]))
    assert rows.tolist() == [0, 0, 1, 1]
    assert starts.tolist() == [0.0, 0.5, -1.0, -0.5]


def test_timestamps_tick_in_nanoseconds_whatever_their_unit_and_zone() -> None:
    base = datetime(2024, 1, 1, tzinfo=UTC)
    for typ in (pa.timestamp("s"), pa.timestamp("ms", tz="UTC"), pa.timestamp("ns", tz="+02:00")):
        time = EventTime("ts", typ)
        ticks = time.ticks(pa.array([base], typ))
        assert ticks.tolist() == [int(base.timestamp()) * 10**9]
        assert time.column_of(ticks).type == typ
        assert time.span("size", timedelta(minutes=1)) == 60 * 10**9
        assert time.span("size", 1.5) == 1_500_000_000
    assert Tumbling(timedelta(minutes=1)).assigner(EventTime("ts", pa.timestamp("s"))).size == (
        60 * 10**9
    )


def test_watermark_values_tick_by_their_kind() -> None:
    assert watermark_ticks("ts", np.datetime64("1970-01-01T00:00:01", "ms")) == (10**9, True)
    assert watermark_ticks("ts", datetime(1970, 1, 1, 0, 0, 2)) == (2 * 10**9, True)
    aware = datetime(1970, 1, 1, 2, 0, 3, tzinfo=UTC).astimezone()
    assert watermark_ticks("ts", aware) == ((2 * 3600 + 3) * 10**9, True)
    plus_two = datetime(1970, 1, 1, 4, 0, 3, 5, tzinfo=timezone(timedelta(hours=2)))
    assert watermark_ticks("ts", plus_two) == ((2 * 3600 + 3) * 10**9 + 5000, True)
    assert type(watermark_ticks("ts", plus_two)[0]) is int
    exact = np.datetime64("2024-01-01T00:00:00.000000001", "ns")
    assert watermark_ticks("ts", exact) == (1_704_067_200_000_000_001, True)
    assert type(watermark_ticks("ts", 7)[0]) is int
    assert type(watermark_ticks("ts", 7.0)[0]) is float
    assert watermark_ticks("ts", 7) == (7, False)
    assert watermark_ticks("ts", np.int32(7)) == (7, False)
    assert watermark_ticks("ts", 7.5) == (7.5, False)
    with pytest.raises(InvalidArgumentError):
        watermark_ticks("ts", "7")
    with pytest.raises(InvalidArgumentError):
        EventTime("ts", pa.int64()).check_watermark(True, np.datetime64(1, "s"))
    with pytest.raises(InvalidArgumentError):
        EventTime("ts", pa.timestamp("s")).check_watermark(False, 1)
    EventTime("ts", pa.float64()).check_watermark(False, 1.0)


def test_event_time_refuses_a_missing_or_untimely_column() -> None:
    with pytest.raises(SchemaMismatchError):
        EventTime.of(pa.schema([("x", pa.int64())]), "ts", "on")
    with pytest.raises(SchemaMismatchError):
        EventTime.of(pa.schema([("ts", pa.date32())]), "ts", "on")
    assert EventTime.of(pa.schema([("ts", pa.int32())]), "ts", "on").type == pa.int32()


# Nulls, counters and the exact fields of refusals.


async def test_late_updates_compare_nulls_as_values(tmp_path: Path) -> None:
    operator = window_aggregate(
        "k",
        Tumbling(10),
        on="ts",
        allowed_lateness=50,
        s=("v", "sum"),
        hi=("v", "max"),
        f=("v", "first"),
        last=("v", "last"),
    )

    def batch(keys: list[int], ts: list[int], values: list[int | None]) -> Chunk:
        arrays = [pa.array(keys), pa.array(ts), pa.array(values, pa.int64())]
        return Chunk(pa.record_batch(arrays, schema=SCHEMA))

    rt = _runtime(tmp_path, operator)
    async with rt:
        await rt.push("events", batch([1, 2, 3], [1, 2, 3], [None, None, 5]))
        await _push(rt, [("wm", 10)])
        # Key 1: null -> 5 changes s, hi and last (first stays null); key 2: another null
        # changes nothing; key 3: a null last, from 5.
        await rt.push("events", batch([1, 2, 3], [3, 4, 5], [5, None, None]))
        await rt.checkpoint()
        families = {f.name: f for f in await rt.metrics.snapshot()}
    nothing = {"s": None, "hi": None, "f": None, "last": None}
    five = {"s": 5, "hi": 5, "f": 5, "last": 5}
    assert _rows(_events()) == [
        (INS, _win(1, 0, 10, **nothing)),
        (INS, _win(2, 0, 10, **nothing)),
        (INS, _win(3, 0, 10, **five)),
        (UD, _win(1, 0, 10, **nothing)),
        (UI, _win(1, 0, 10, s=5, hi=5, f=None, last=5)),
        (UD, _win(3, 0, 10, **five)),
        (UI, _win(3, 0, 10, s=5, hi=5, f=5, last=None)),
    ]
    labels = {"actor": "agg", "operator": "window_aggregate"}
    assert families["barrierflow_operator_rows_out"].value(**labels) == 7
    assert families["barrierflow_operator_late_rows"].value(**labels) == 3


async def test_a_watermark_value_that_is_no_time_nor_number_fails_naming_it(
    tmp_path: Path,
) -> None:
    operator = window_aggregate("k", Tumbling(10), on="ts", n=("v", "count"))
    rt = _runtime(tmp_path, operator)
    with pytest.raises(ActorFailedError) as caught:
        async with rt:
            await rt.push("events", Chunk(pa.record_batch({"mark": pa.array(["soon"])})))
            await rt.checkpoint()
    error = caught.value.__cause__
    assert isinstance(error, InvalidArgumentError)
    assert (error.argument, error.got) == ("Watermark('ts').value", "soon")


@pytest.mark.parametrize("first_is_time", [True, False])
async def test_watermarks_before_any_row_must_keep_one_kind(
    tmp_path: Path, first_is_time: bool
) -> None:
    stamp = np.datetime64("2024-01-01T00:00:00", "ns")
    marks = [stamp, 5] if first_is_time else [5, stamp]
    operator = window_aggregate("k", Tumbling(10), on="ts", n=("v", "count"))
    rt = _runtime(tmp_path, operator)
    async with rt:  # one watermark of either kind is kept, and passed on
        await rt.push("events", _mark(marks[0]))
        await rt.checkpoint()
    assert [e[0] for e in _events()] == ["wm"]
    rt = _runtime(tmp_path / "b", operator)
    with pytest.raises(ActorFailedError) as caught:
        async with rt:
            for mark in marks:
                await rt.push("events", _mark(mark))
            await rt.checkpoint()
    error = caught.value.__cause__
    assert isinstance(error, InvalidArgumentError)
    assert error.argument == "Watermark('ts').value"
    assert error.expected == ("a time" if first_is_time else "a number")
    assert error.got == marks[1]


async def test_a_watermark_of_another_kind_than_the_column_names_its_value(
    tmp_path: Path,
) -> None:
    operator = window_aggregate("k", Tumbling(10), on="ts", n=("v", "count"))
    rt = _runtime(tmp_path, operator)
    stamp = np.datetime64("2024-01-01T00:00:00", "ns")
    with pytest.raises(ActorFailedError) as caught:
        async with rt:
            await rt.push("events", Chunk(_batch([(1, 1, 1)])))
            await rt.push("events", _mark(stamp))
            await rt.checkpoint()
    error = caught.value.__cause__
    assert isinstance(error, InvalidArgumentError)
    assert (error.argument, error.expected, error.got) == (
        "Watermark('ts').value",
        "a number (a numeric column)",
        stamp,
    )


WHOLE = "a size that is a whole multiple of every"


@pytest.mark.parametrize(
    ("call", "argument", "expected"),
    [
        (lambda: Tumbling(0), "size", "a positive timedelta or number"),
        (lambda: Sliding(0, 1), "size", "a positive timedelta or number"),
        (lambda: Sliding(1, 0), "every", "a positive timedelta or number"),
        (
            lambda: Sliding(1e-10, 1),
            "Sliding(size, every)",
            "a size that is a whole multiple of every",
        ),
        (
            lambda: Sliding(1e308, 1e-300),
            "Sliding(size, every)",
            "a size that is a whole multiple of every",
        ),
        (
            lambda: Sliding(2.5, 1),
            "Sliding(size, every)",
            "a size that is a whole multiple of every",
        ),
        (
            lambda: window_aggregate(
                "k", Tumbling(1), on="ts", allowed_lateness=-1, n=("v", "count")
            ),
            "allowed_lateness",
            "a non-negative timedelta or number",
        ),
        (
            lambda: window_aggregate("k", Tumbling(1), on="ts", late=None, n=("v", "count")),
            "late",
            "'drop' or 'output'",
        ),
        (
            lambda: window_aggregate("k", 3, on="ts", n=("v", "count")),
            "window",
            "a Tumbling or Sliding window",
        ),
        (
            lambda: window_aggregate("k", Tumbling(1), on="", n=("v", "count")),
            "on",
            "the event-time column's name",
        ),
        (
            lambda: window_aggregate("window_end", Tumbling(1), on="ts", n=("v", "count")),
            "key",
            "key columns other than ['window_start', 'window_end']",
        ),
        (
            lambda: window_aggregate("k", Tumbling(1), on="ts", n=("window_end", "count")),
            "aggregations",
            "input columns other than ['window_start', 'window_end']",
        ),
        (
            lambda: window_aggregate("k", Tumbling(1), on="ts", schema=3, n=("v", "count")),
            "schema",
            "None or a pyarrow.Schema",
        ),
    ],
)
def test_refusals_name_the_argument_and_what_was_expected(
    call: Any, argument: str, expected: str
) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        call()
    assert (caught.value.argument, caught.value.expected) == (argument, expected)


@pytest.mark.parametrize(
    ("call", "got"),
    [
        (lambda: Tumbling(-2), -2),
        (lambda: Sliding(4, -3), -3),
        (lambda: window_aggregate("k", 3, on="ts", n=("v", "count")), 3),
        (lambda: window_aggregate("k", Tumbling(1), on=7, n=("v", "count")), 7),
        (lambda: window_aggregate("k", Tumbling(1), on="ts", late=4, n=("v", "count")), 4),
        (
            lambda: window_aggregate(
                "k", Tumbling(1), on="ts", allowed_lateness=-4, n=("v", "count")
            ),
            -4,
        ),
        (
            lambda: window_aggregate("window_start", Tumbling(1), on="ts", n=("v", "max")),
            ("window_start"),
        ),
        (
            lambda: window_aggregate("k", Tumbling(1), on="ts", n=("window_start", "max")),
            ("window_start"),
        ),
        (lambda: window_aggregate("k", Tumbling(1), on="ts", schema=5, n=("v", "max")), 5),
        (lambda: Tumbling(10**400), 10**400),
        (lambda: Tumbling(float("nan")), "nan"),
    ],
)
def test_refusals_hold_what_came(call: Any, got: Any) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        call()
    value = caught.value.got
    assert (str(value) if got == "nan" else value) == got


def test_a_sliding_refusal_holds_the_pair() -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        Sliding(10, 3)
    assert (caught.value.got.size, caught.value.got.every) == (10, 3)


def test_whole_sliding_pairs_are_taken_down_to_one_window() -> None:
    assert Sliding(10, 10).assigner(EventTime("ts", pa.int64())).count == 1
    assert Sliding(timedelta(seconds=2), 1).assigner(EventTime("ts", pa.timestamp("s"))).count == 2
    assert Sliding(0.3, 0.1).assigner(EventTime("ts", pa.float64())).count == 3
    # Within the tolerance when made: a float column takes it, integer ticks do not.
    assert Sliding(3.0000000007, 1).assigner(EventTime("ts", pa.float64())).count == 3
    with pytest.raises(InvalidArgumentError) as caught:
        Sliding(3.0000000007, 1).assigner(EventTime("ts", pa.timestamp("ns")))
    assert caught.value.argument == "Sliding(size, every)"
    assert caught.value.expected == "a size that is a whole multiple of every in 'ts''s ticks"
    assert caught.value.got == "3000000001 and 1000000000 ticks"


@pytest.mark.parametrize(
    ("window", "typ", "argument", "expected"),
    [
        (
            Tumbling(timedelta(milliseconds=1500)),
            pa.timestamp("s"),
            "Tumbling.size",
            "a whole, positive number of s (the column 'ts' is timestamp[s])",
        ),
        (
            Sliding(timedelta(milliseconds=1500), timedelta(milliseconds=500)),
            pa.timestamp("s"),
            "Sliding.size",
            "a whole, positive number of s (the column 'ts' is timestamp[s])",
        ),
        (
            Sliding(timedelta(seconds=2), timedelta(microseconds=500)),
            pa.timestamp("ms"),
            "Sliding.every",
            "a whole, positive number of ms (the column 'ts' is timestamp[ms])",
        ),
        (
            Tumbling(timedelta(seconds=1)),
            pa.int32(),
            "Tumbling.size",
            "a number (in the unit of the numeric column 'ts')",
        ),
        (Tumbling(1.5), pa.int64(), "Tumbling.size", "an int (the integer column 'ts')"),
        (
            Tumbling(1e-12),
            pa.timestamp("ns"),
            "Tumbling.size",
            "a whole, positive number of ns (the column 'ts' is timestamp[ns])",
        ),
    ],
)
def test_a_window_that_does_not_fit_its_column_names_which_and_why(
    window: Any, typ: pa.DataType, argument: str, expected: str
) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        window.assigner(EventTime("ts", typ))
    assert (caught.value.argument, caught.value.expected) == (argument, expected)
    assert caught.value.got == (window.size if argument.endswith("size") else window.every)


def test_event_time_errors_name_the_column_and_the_asker() -> None:
    without = pa.schema([("x", pa.int64())])
    with pytest.raises(SchemaMismatchError) as missing:
        EventTime.of(without, "ts", "asker")
    assert (missing.value.argument, missing.value.got) == ("asker", without)
    assert missing.value.expected_schema == "a schema with the column 'ts'"
    with pytest.raises(SchemaMismatchError) as untimely:
        EventTime.of(pa.schema([("ts", pa.string())]), "ts", "asker")
    assert (untimely.value.argument, untimely.value.got) == ("asker", "ts: string")
    assert untimely.value.expected_schema == "a timestamp, integer or floating column 'ts'"
    with pytest.raises(InvalidArgumentError) as number:
        EventTime("ts", pa.timestamp("s")).check_watermark(False, 1)
    assert (number.value.argument, number.value.expected, number.value.got) == (
        "Watermark('ts').value",
        "a numpy.datetime64 or datetime (a timestamp column)",
        1,
    )
    with pytest.raises(InvalidArgumentError) as neither:
        watermark_ticks("ts", "x")
    assert (neither.value.argument, neither.value.expected) == (
        "Watermark('ts').value",
        "a numpy.datetime64, a datetime or a number",
    )


def test_ticks_and_values_keep_their_types() -> None:
    floats, ints, times = (
        EventTime("ts", pa.float32()),
        EventTime("ts", pa.int16()),
        EventTime("ts", pa.timestamp("ms")),
    )
    assert floats.ticks(pa.chunked_array([[1.5]], pa.float32())).dtype == np.float64
    assert ints.ticks(pa.array([3], pa.int16())).dtype == np.int64
    assert type(floats.watermark_value(2)) is float
    assert type(ints.watermark_value(2.0)) is int
    assert times.watermark_value(5) == np.datetime64(5, "ns")
    assert floats.column_of(np.array([0.5])).type == pa.float32()
    assert ints.column_of(np.array([4])).type == pa.int16()
    assert (floats.is_time, floats.is_float, times.is_time, ints.is_float) == (
        False,
        True,
        True,
        False,
    )
    assert (times.unit_ticks(), ints.unit_ticks()) == (1_000_000, 1)
    assert floats.span("size", 2) == 2.0
    assert type(floats.span("size", 2)) is float
    assert ints.span("size", np.int64(3)) == 3
    assert times.span("size", timedelta(microseconds=7)) == 7000
    assert watermark_ticks("ts", np.float64(2.5)) == (2.5, False)


async def test_a_row_whose_window_ends_at_the_watermark_is_late_within_the_lateness(
    tmp_path: Path,
) -> None:
    operator = window_aggregate("k", Tumbling(10), on="ts", allowed_lateness=5, n=("v", "count"))
    events = await _run(tmp_path, operator, [("wm", 10), [(1, 9, 0), (1, 10, 0)]])
    assert _rows(events) == [(INS, _win(1, 0, 10, n=1))]  # at once; [10, 20) stays open


async def test_rows_held_for_open_windows_are_folded_before_a_watermark_closes_them(
    tmp_path: Path,
) -> None:
    operator = window_aggregate("k", Tumbling(10), on="ts", n=("v", "count"))
    items: list[Item] = [[(1, 25, 0)], [(1, 5, 0)], [(1, 6, 0)], ("wm", 10), ("wm", 30)]
    events = await _run(tmp_path, operator, items)
    assert _rows(events) == [(INS, _win(1, 0, 10, n=2)), (INS, _win(1, 20, 10, n=1))]


async def test_a_restart_with_another_input_schema_is_refused(tmp_path: Path) -> None:
    operator = window_aggregate("k", Tumbling(10), on="ts", s=("v", "sum"))
    await _run(tmp_path, operator, [[(1, 1, 1)]])
    other = pa.record_batch({"k": pa.array([1]), "ts": pa.array([2]), "v": pa.array([1.5])})
    rt = _runtime(tmp_path, operator, inject=False)
    with pytest.raises(ActorFailedError) as caught:
        async with rt:
            await rt.push("events", Chunk(other))
            await rt.checkpoint()
    error = caught.value.__cause__
    assert isinstance(error, SchemaMismatchError)
    assert error.argument == "window_aggregate 'agg': input"
    assert error.expected_schema.field("s").type == pa.int64()  # the state written
    assert error.actual_schema.field("s").type == pa.float64()  # the state asked for


async def test_a_restart_without_a_schema_resumes_the_windows_before_any_row(
    tmp_path: Path,
) -> None:
    operator = window_aggregate("k", Tumbling(10), on="ts", s=("v", "sum"))
    await _run(tmp_path, operator, [[(1, 1, 1), (1, 2, 2)]])
    # The state's window_start tells the event time: a watermark closes the restored window.
    events = await _run(tmp_path, operator, [("wm", 10)])
    assert _rows(events) == [(INS, _win(1, 0, 10, s=3))]
    # ... and which watermarks fit it.
    rt = _runtime(tmp_path, operator)
    with pytest.raises(ActorFailedError) as caught:
        async with rt:
            await rt.push("events", _mark(np.datetime64("2024-01-01T00:00:00", "ns")))
            await rt.checkpoint()
    error = caught.value.__cause__
    assert isinstance(error, InvalidArgumentError)
    assert (error.argument, error.expected) == (
        "Watermark('ts').value",
        "a number (a numeric column)",
    )


async def test_a_row_beyond_the_lateness_leaves_no_state(tmp_path: Path) -> None:
    operator = window_aggregate("k", Tumbling(10), on="ts", n=("v", "count"))
    rt = _runtime(tmp_path, operator)
    async with rt:
        await _push(rt, [("wm", 10), [(1, 3, 0), (1, 12, 0)], "|"])
        families = {f.name: f for f in await rt.metrics.snapshot()}
    labels = {"actor": "agg", "operator": "window_aggregate"}
    assert families["barrierflow_operator_state_rows"].value(**labels) == 1  # [10, 20) only


async def test_a_time_watermark_before_rows_of_a_numeric_column_fails_at_the_first_row(
    tmp_path: Path,
) -> None:
    operator = window_aggregate("k", Tumbling(10), on="ts", n=("v", "count"))
    rt = _runtime(tmp_path, operator)
    stamp = np.datetime64("2024-01-01T00:00:00", "ns")
    with pytest.raises(ActorFailedError) as caught:
        async with rt:
            await rt.push("events", _mark(stamp))
            await rt.push("events", Chunk(_batch([(1, 1, 1)])))
            await rt.checkpoint()
    error = caught.value.__cause__
    assert isinstance(error, InvalidArgumentError)
    assert (error.argument, error.got) == ("Watermark('ts').value", 1_704_067_200 * 10**9)


def test_a_schema_missing_an_input_column_names_it() -> None:
    schema = pa.schema([("k", pa.int64()), ("ts", pa.int64())])
    with pytest.raises(SchemaMismatchError) as caught:
        window_aggregate("k", Tumbling(10), on="ts", schema=schema, n=("v", "count"))
    assert (caught.value.argument, caught.value.got) == ("window_aggregate", schema)
    assert caught.value.expected_schema == "a column 'v'"


async def test_an_insert_only_chunk_with_ops_and_a_counted_key_column_are_taken(
    tmp_path: Path,
) -> None:
    operator = window_aggregate("k", Tumbling(10), on="ts", n=("k", "count"), s=("v", "sum"))
    chunk = Chunk(_batch([(1, 1, 2), (1, 2, 3)]), [Op.INSERT, Op.INSERT])
    rt = _runtime(tmp_path, operator)
    async with rt:
        await rt.push("events", chunk)
        await _push(rt, [("wm", 10)])
        await rt.checkpoint()
    assert _rows(_events()) == [(INS, _win(1, 0, 10, n=2, s=5))]


async def test_parallel_windows_rescaled_across_a_restart_stay_one_per_key(
    tmp_path: Path,
) -> None:
    operator = window_aggregate("k", Tumbling(10), on="ts", n=("v", "count"))
    await _run(tmp_path, operator, [[(k, 1, 0) for k in range(8)]], parallelism=2)
    # Restarted with three instances: each key's open window moved with its vnode, where the
    # key's new rows are dispatched.
    events = await _run(
        tmp_path, operator, [[(k, 2, 0) for k in range(8)], ("wm", 10)], parallelism=3
    )
    assert sorted(r["k"] for _, r in _rows(events)) == list(range(8))
    assert {(op, r["n"]) for op, r in _rows(events)} == {(INS, 2)}


def test_a_one_nanosecond_window_is_whole() -> None:
    assert Tumbling(1e-9).assigner(EventTime("ts", pa.timestamp("ns"))).size == 1


def test_integer_ticks_floor_exactly_beyond_a_floats_precision() -> None:
    windows = Tumbling(10).assigner(EventTime("ts", pa.int64()))
    assert windows.last_start(np.array([2**60 + 7, -3])).tolist() == [2**60 + 4, -10]


async def test_each_kept_pair_folds_its_own_row(tmp_path: Path) -> None:
    # At 20, row (1, 27) keeps both its windows and row (2, 3) none: two pairs of one row.
    operator = window_aggregate("k", Sliding(10, 5), on="ts", s=("v", "sum"))
    events = await _run(tmp_path, operator, [("wm", 20), [(1, 27, 1), (2, 3, 100)], ("wm", 40)])
    assert _rows(events) == [(INS, _win(1, 20, 10, s=1)), (INS, _win(1, 25, 10, s=1))]
