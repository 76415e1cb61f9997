"""The fluent Stream: each step declares one operator on a runtime or a job, names are
deterministic, and what it declares runs like the same add_actor calls."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from barrierflow.channels import Chunk, Message
from barrierflow.errors import GraphError, InvalidArgumentError
from barrierflow.operators import Stream
from barrierflow.runtime import ActorContext, Job, Runtime, RuntimeConfig, StreamActor

pytestmark = pytest.mark.anyio

SCHEMA = pa.schema([("user", pa.int64()), ("clicks", pa.int64())])


class Keep(StreamActor):
    rows: ClassVar[list[tuple[int, int]]] = []

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk):
            batch = message.compact().batch
            users, clicks = batch["user"].to_pylist(), batch["clicks"].to_pylist()
            Keep.rows += list(zip(users, clicks, strict=True))
        await ctx.emit(message)


def _double(batch: pa.RecordBatch) -> pa.RecordBatch:
    return pa.record_batch([batch["user"], pc.multiply(batch["clicks"], 2)], schema=SCHEMA)


def _runtime(tmp_path: Path) -> Runtime:
    rt = Runtime(RuntimeConfig(str(tmp_path / "state.db")))
    rt.add_source("events")
    return rt


async def test_a_chain_of_steps_runs_as_declared(tmp_path: Path) -> None:
    Keep.rows = []
    rt = _runtime(tmp_path)
    out = (
        Stream(rt, "events").map_batches(_double).filter(pc.field("clicks") > 2).apply("keep", Keep)
    )
    assert out.name == "keep"
    async with rt:
        await rt.push("events", Chunk.from_pydict({"user": [1, 2, 3], "clicks": [1, 2, 3]}, SCHEMA))
        await rt.checkpoint()
    assert Keep.rows == [(2, 4), (3, 6)]


def test_steps_are_named_after_their_upstream_and_kind(tmp_path: Path) -> None:
    rt = _runtime(tmp_path)
    events = Stream(rt, "events")
    first = events.map_batches(_double)
    second = events.map_batches(_double)
    assert (first.name, second.name) == ("events.map_batches", "events.map_batches_2")
    assert first.filter(pc.field("clicks") > 0).name == "events.map_batches.filter"
    assert events.filter(pc.field("clicks") > 0, name="positive").name == "positive"
    assert rt.name_in_use("positive")


def test_a_job_is_a_target_too() -> None:
    job = Job("j")
    job.add_source("events")
    Stream(job, "events").map_batches(_double, name="double", parallelism=2)
    assert job.actor_names()[-2:] == ["double.0", "double.1"]


def test_a_side_output_is_a_stream_of_its_own(tmp_path: Path) -> None:
    rt = _runtime(tmp_path)
    step = Stream(rt, "events").map_batches(_double)
    late = step.side("late")
    assert late.name == "events.map_batches:late"
    # map_batches declares no side output "late": reading it is refused at declaration.
    with pytest.raises(GraphError):
        late.filter(pc.field("clicks") > 0)
    with pytest.raises(InvalidArgumentError):
        late.side("again")
    for bad in ("", "a:b", 3):
        with pytest.raises(InvalidArgumentError):
            step.side(bad)  # type: ignore[arg-type]


def test_key_by_declares_nothing_and_checks_its_columns(tmp_path: Path) -> None:
    rt = _runtime(tmp_path)
    keyed = Stream(rt, "events").key_by("user", "clicks")
    assert keyed.key == ("user", "clicks")
    assert keyed.stream.name == "events"
    assert not rt.name_in_use("events.key_by")
    for bad in [(), ("user", "user"), ("",)]:
        with pytest.raises(InvalidArgumentError) as caught:
            Stream(rt, "events").key_by(*bad)
        assert caught.value.argument == "columns"


def test_bad_targets_and_names_are_refused_when_called(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        Stream(object(), "events")
    assert caught.value.argument == "target"
    with pytest.raises(InvalidArgumentError):
        Stream(_runtime(tmp_path), "")
    with pytest.raises(InvalidArgumentError):
        Stream(_runtime(tmp_path), "events").map_batches(_double, name="")


def test_a_refused_step_leaves_no_actor(tmp_path: Path) -> None:
    rt = _runtime(tmp_path)
    with pytest.raises(GraphError):
        Stream(rt, "nope").map_batches(_double, name="double")
    assert not rt.name_in_use("double")


async def test_a_keyed_aggregate_from_the_stream(tmp_path: Path) -> None:
    Keep.rows = []
    rt = _runtime(tmp_path)
    totals = (
        Stream(rt, "events")
        .key_by("user")
        .aggregate(clicks=("clicks", "sum"), name="totals", parallelism=2)
    )
    assert totals.name == "totals"
    totals.apply("keep", Keep)
    async with rt:
        await rt.push("events", Chunk.from_pydict({"user": [1, 2, 1], "clicks": [1, 2, 3]}, SCHEMA))
        await rt.checkpoint()
    assert sorted(Keep.rows) == [(1, 4), (2, 2)]


def test_a_reduce_step_is_named_after_its_kind(tmp_path: Path) -> None:
    rt = _runtime(tmp_path)
    keyed = Stream(rt, "events").key_by("user")
    assert keyed.reduce(lambda acc, rows: rows).name == "events.reduce"
    assert keyed.aggregate(n=("clicks", "count")).name == "events.aggregate"


TIMED = pa.schema([("user", pa.int64()), ("clicks", pa.int64()), ("at", pa.int64())])


async def test_watermarks_and_a_tumbling_window_from_the_stream(tmp_path: Path) -> None:
    from barrierflow.operators import Tumbling

    Keep.rows = []
    rt = Runtime(RuntimeConfig(str(tmp_path / "state.db")))
    rt.add_source("events")
    windows = (
        Stream(rt, "events")
        .with_watermark("at", delay=0)
        .key_by("user")
        .window(Tumbling(10), on="at")
        .aggregate(clicks=("clicks", "sum"), name="per_10")
    )
    assert windows.name == "per_10"
    windows.map_batches(lambda b: b.select(["user", "clicks"])).apply("keep", Keep)
    async with rt:
        rows = {"user": [1, 1, 2], "clicks": [1, 2, 5], "at": [0, 9, 3]}
        await rt.push("events", Chunk.from_pydict(rows, TIMED))
        # Closes [0, 10): the watermark reaches its end.
        await rt.push("events", Chunk.from_pydict({"user": [1], "clicks": [7], "at": [10]}, TIMED))
        await rt.checkpoint()
    assert sorted(Keep.rows) == [(1, 3), (2, 5)]


async def test_an_async_map_from_the_stream_with_its_dead_letters(tmp_path: Path) -> None:
    Keep.rows = []

    async def lookup(row: dict[str, int]) -> dict[str, int]:
        if row["user"] == 2:
            raise LookupError("no such user")
        return {"user": row["user"], "clicks": row["clicks"] * 10}

    rt = _runtime(tmp_path)
    enriched = Stream(rt, "events").async_map(
        lookup, schema=SCHEMA, retries=0, key="user", dead_letters=True, concurrency=4
    )
    assert enriched.name == "events.async_map"
    enriched.apply("keep", Keep)
    failed = enriched.side("dead_letters").map_batches(
        lambda b: b.select(["user", "clicks"]), name="failed_rows"
    )
    failed.apply("keep_failed", Keep)
    async with rt:
        rows = {"user": [1, 2, 3], "clicks": [1, 2, 3]}
        await rt.push("events", Chunk.from_pydict(rows, SCHEMA))
        await rt.checkpoint()
    assert sorted(Keep.rows) == [(1, 10), (2, 2), (3, 30)]  # 2 as it came, from dead letters


def test_windowed_stream_passes_its_arguments_on() -> None:
    from barrierflow.operators import Sliding

    job = Job("j")
    job.add_source("events")
    windowed = (
        Stream(job, "events")
        .key_by("user")
        .window(Sliding(10, 5), on="at", allowed_lateness=3, late="output")
    )
    assert "on='at'" in repr(windowed)
    out = windowed.aggregate(n=("clicks", "count"), parallelism=2)
    assert out.name == "events.window"
    assert job.actor_names()[-2:] == ["events.window.0", "events.window.1"]
    # late="output" declared the side output "late": a reader of it is accepted.
    out.side("late").map_batches(lambda b: b, name="late_rows")
