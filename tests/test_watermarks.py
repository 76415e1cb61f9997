"""with_watermark: after each chunk that raises the column's maximum, a watermark at the maximum
minus the delay; never backwards; repeated after each barrier; checkpointed; per column; the
minimum over two sources at a merge; bad arguments refused when called."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import anyio
import numpy as np
import pyarrow as pa
import pytest
from _timeouts import scaled

from barrierflow.channels import Barrier, Chunk, Message, Watermark
from barrierflow.errors import ActorFailedError, InvalidArgumentError, SchemaMismatchError
from barrierflow.operators.watermarks import with_watermark
from barrierflow.runtime import ActorContext, Placement, Runtime, RuntimeConfig, StreamActor

pytestmark = pytest.mark.anyio


class Collect(StreamActor):
    """Keeps every message it reads but the barriers' order (a class-level list)."""

    seen: ClassVar[list[Message]] = []

    async def process(self, message: Message, ctx: ActorContext) -> None:
        Collect.seen.append(message)
        await ctx.emit(message)


class Inject(StreamActor):
    """Turns a chunk with a column ``mark`` into ``Watermark("ts", value)`` (upstream marks)."""

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk) and "mark" in message.batch.schema.names:
            for value in message.batch.column("mark").to_pylist():
                await ctx.emit(Watermark("ts" if value >= 0 else "other", abs(value)))
            return
        await ctx.emit(message)


def _ints(*values: int | None, column: str = "ts") -> Chunk:
    return Chunk(pa.record_batch({column: pa.array(values, pa.int64())}))


def _marks() -> list[Any]:
    """What the collector saw after the first barrier: chunks as their values, watermarks as
    ``("wm", column, value)``, barriers as ``"|"``."""
    out: list[Any] = []
    for message in Collect.seen[1:]:
        if isinstance(message, Chunk):
            out.append(message.batch.column(0).to_pylist())
        elif isinstance(message, Watermark):
            out.append(("wm", message.column, message.value))
        elif isinstance(message, Barrier):
            out.append("|")
    return out


async def _run(
    path: Path, operator: Any, *items: Chunk | str, inject: bool = False, fresh: bool = True
) -> list[Any]:
    """Push ``items`` (``"|"``: a checkpoint) through ``operator`` into the collector."""
    Collect.seen = []
    rt = Runtime(RuntimeConfig(state_path=str(path / "state.db"), barrier_interval=3600))
    rt.add_source("events")
    upstream = "events"
    if inject:
        rt.add_actor("inject", Inject, inputs=["events"])
        upstream = "inject"
    rt.add_actor("wm", operator, inputs=[upstream])
    rt.add_actor("collect", Collect, inputs=["wm"])
    with anyio.fail_after(scaled(30)):
        async with rt:
            for item in items:
                if isinstance(item, str):
                    await rt.checkpoint()
                else:
                    await rt.push("events", item)
            await rt.checkpoint()
    # Up to the barrier of the last checkpoint (what follows is the shutdown's).
    marks = _marks()
    bars = [i for i, m in enumerate(marks) if m == "|"]
    return marks[: bars[sum(1 for i in items if isinstance(i, str))]]


async def test_a_watermark_follows_each_chunk_that_raises_the_max_minus_the_delay(
    tmp_path: Path,
) -> None:
    marks = await _run(
        tmp_path, with_watermark("ts", delay=2), _ints(1, 5, 3), _ints(4), _ints(9), _ints(9)
    )
    assert marks == [[1, 5, 3], ("wm", "ts", 3), [4], [9], ("wm", "ts", 7), [9]]
    assert all(type(m[2]) is int for m in marks if isinstance(m, tuple))


async def test_a_zero_delay_watermarks_at_the_max(tmp_path: Path) -> None:
    marks = await _run(tmp_path, with_watermark("ts", delay=0), _ints(4, 2))
    assert marks == [[4, 2], ("wm", "ts", 4)]


async def test_invisible_rows_nulls_and_empty_chunks_do_not_raise_the_watermark(
    tmp_path: Path,
) -> None:
    masked = _ints(1, 50).with_visibility(pa.array([True, False]))
    marks = await _run(
        tmp_path, with_watermark("ts", delay=1), masked, _ints(None), _ints(), _ints(None, 3)
    )
    assert [m for m in marks if isinstance(m, tuple)] == [("wm", "ts", 0), ("wm", "ts", 2)]


async def test_the_watermark_is_repeated_after_each_barrier(tmp_path: Path) -> None:
    marks = await _run(tmp_path, with_watermark("ts", delay=1), "|", _ints(5), "|", _ints(2))
    assert marks == ["|", [5], ("wm", "ts", 4), "|", ("wm", "ts", 4), [2]]


async def test_upstream_watermarks_of_the_column_are_dropped_and_others_pass(
    tmp_path: Path,
) -> None:
    marks_chunk = Chunk(pa.record_batch({"mark": pa.array([100, -7], pa.int64())}))
    marks = await _run(tmp_path, with_watermark("ts", delay=0), _ints(3), marks_chunk, inject=True)
    assert marks == [[3], ("wm", "ts", 3), ("wm", "other", 7)]


async def test_timestamps_watermark_as_datetime64_nanoseconds_with_a_timedelta_or_seconds(
    tmp_path: Path,
) -> None:
    base = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    column = pa.array([base, base + timedelta(seconds=30)], pa.timestamp("ms", tz="UTC"))
    chunk = Chunk(pa.record_batch({"ts": column}))
    expected = np.datetime64("2024-05-01T12:00:20", "ns")
    for delay in (timedelta(seconds=10), 10, 10.0):
        marks = await _run(tmp_path / str(delay), with_watermark("ts", delay=delay), chunk)
        [(_, _, value)] = [m for m in marks if isinstance(m, tuple)]
        assert value == expected
        assert value.dtype == np.dtype("datetime64[ns]")


async def test_a_float_column_watermarks_as_floats_and_ignores_nan(tmp_path: Path) -> None:
    chunk = Chunk(pa.record_batch({"ts": pa.array([1.5, float("nan"), 4.25])}))
    nan_only = Chunk(pa.record_batch({"ts": pa.array([float("nan")])}))
    marks = await _run(tmp_path, with_watermark("ts", delay=0.25), nan_only, chunk)
    assert [m for m in marks if isinstance(m, tuple)] == [("wm", "ts", 4.0)]
    assert type(marks[-1][2]) is float


async def test_the_max_survives_a_restart(tmp_path: Path) -> None:
    operator = with_watermark("ts", delay=1)
    await _run(tmp_path, operator, _ints(10), "|", _ints(20))
    # The shutdown's checkpoint holds 20: after a restart the watermark follows the first
    # barrier (and every one after it), and an older row raises nothing.
    marks = await _run(tmp_path, operator, "|", _ints(15), _ints(21))
    assert marks == [("wm", "ts", 19), "|", ("wm", "ts", 19), [15], [21], ("wm", "ts", 20)]


@pytest.mark.parametrize(
    ("chunk", "delay", "error"),
    [
        (_ints(1), timedelta(seconds=1), InvalidArgumentError),
        (_ints(1), 0.5, InvalidArgumentError),
        (_ints(1, column="other"), 1, SchemaMismatchError),
        (Chunk(pa.record_batch({"ts": pa.array(["a"])})), 1, SchemaMismatchError),
    ],
)
async def test_a_delay_or_column_that_does_not_fit_fails_at_the_first_chunk(
    tmp_path: Path, chunk: Chunk, delay: Any, error: type[Exception]
) -> None:
    with pytest.raises(ActorFailedError) as caught:
        await _run(tmp_path, with_watermark("ts", delay=delay), chunk)
    assert isinstance(caught.value.__cause__, error)
    expected = "with_watermark column" if error is SchemaMismatchError else "delay"
    assert caught.value.__cause__.argument == expected


@pytest.mark.parametrize(
    ("column", "delay", "argument"),
    [
        ("", 1, "column"),
        (3, 1, "column"),
        ("ts", -1, "delay"),
        ("ts", timedelta(seconds=-1), "delay"),
        ("ts", float("nan"), "delay"),
        ("ts", float("inf"), "delay"),
        ("ts", True, "delay"),
        ("ts", "1s", "delay"),
        ("ts", None, "delay"),
    ],
)
def test_bad_arguments_are_refused_when_called(column: Any, delay: Any, argument: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        with_watermark(column, delay=delay)
    assert caught.value.argument == argument


def test_the_operator_is_partition_local_and_makes_a_fresh_actor_each_call() -> None:
    operator = with_watermark("ts", delay=timedelta(0))
    assert operator.placement is Placement.PARTITION_LOCAL
    assert operator.kind == "with_watermark"
    assert operator.key is None
    assert operator.side_outputs == ()
    assert operator() is not operator()


async def test_two_watermarked_sources_merge_to_the_minimum(tmp_path: Path) -> None:
    Collect.seen = []
    rt = Runtime(RuntimeConfig(state_path=str(tmp_path / "state.db"), barrier_interval=3600))
    for name in ("a", "b"):
        rt.add_source(name)
        rt.add_actor(f"wm_{name}", with_watermark("ts", delay=0), inputs=[name])
    rt.add_actor("collect", Collect, inputs=["wm_a", "wm_b"])
    with anyio.fail_after(scaled(30)):
        async with rt:
            await rt.push("a", _ints(10))
            await rt.checkpoint()  # both inputs' messages so far have reached the merge
            assert [m for m in Collect.seen if isinstance(m, Watermark)] == []
            await rt.push("b", _ints(4))
            await rt.checkpoint()
            await rt.push("b", _ints(30))
            await rt.checkpoint()
    values = [m.value for m in Collect.seen if isinstance(m, Watermark)]
    # b's 4 is the minimum, then a's 10 holds the merge back from b's 30.
    assert values == [4, 10]


async def test_the_counters_are_reported(tmp_path: Path) -> None:
    rt = Runtime(RuntimeConfig(state_path=str(tmp_path / "state.db"), barrier_interval=3600))
    rt.add_source("events")
    rt.add_actor("wm", with_watermark("ts", delay=0), inputs=["events"])
    async with rt:
        await rt.push("events", _ints(1, 2, 3))
        await rt.push("events", _ints(4).with_visibility(pa.array([False])))
        await rt.checkpoint()
        families = {f.name: f for f in await rt.metrics.snapshot()}
    labels = {"actor": "wm", "operator": "with_watermark"}
    assert families["barrierflow_operator_rows_in"].value(**labels) == 3
    assert families["barrierflow_operator_rows_out"].value(**labels) == 3


@pytest.mark.parametrize(
    ("chunk", "value"),
    [
        (
            Chunk(pa.record_batch({"ts": pa.array([5_000], pa.timestamp("ms", tz="UTC"))})),
            np.datetime64(4, "s"),
        ),
        (Chunk(pa.record_batch({"ts": pa.array([5.5])})), 4.5),
    ],
)
async def test_a_restored_watermark_keeps_its_kind_before_any_row(
    tmp_path: Path, chunk: Chunk, value: Any
) -> None:
    operator = with_watermark("ts", delay=1)
    await _run(tmp_path, operator, chunk)
    marks = await _run(tmp_path, operator, "|")
    assert marks == [("wm", "ts", value), "|", ("wm", "ts", value)]
    assert type(marks[0][2]) is type(value)


@pytest.mark.parametrize(
    ("column", "delay", "argument", "expected"),
    [
        ("", 1, "column", "a column name"),
        ("ts", -1, "delay", "a non-negative timedelta or number"),
    ],
)
def test_refusals_name_what_was_expected_and_what_came(
    column: Any, delay: Any, argument: str, expected: str
) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        with_watermark(column, delay=delay)
    assert (caught.value.argument, caught.value.expected) == (argument, expected)
    assert caught.value.got == (column if argument == "column" else delay)


def test_a_zero_delay_is_taken_when_called() -> None:
    assert with_watermark("ts", delay=0).kind == "with_watermark"
    assert with_watermark("ts", delay=timedelta(0)).kind == "with_watermark"


async def test_a_restart_with_a_delay_that_does_not_fit_the_restored_column_fails_naming_it(
    tmp_path: Path,
) -> None:
    await _run(tmp_path, with_watermark("ts", delay=1), _ints(5))
    with pytest.raises(ActorFailedError) as caught:
        await _run(tmp_path, with_watermark("ts", delay=0.5))
    error = caught.value.__cause__
    assert isinstance(error, InvalidArgumentError)
    assert (error.argument, error.expected, error.got) == (
        "delay",
        "an int (the integer column 'ts')",
        0.5,
    )
