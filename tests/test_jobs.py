"""Jobs joining and leaving a running graph, the job catalog, and the actor capabilities the
backfills stand on (named inputs, biased select, progress, other actors' tables)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pytest
from _timeouts import scaled
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from barrierflow.channels import Barrier, Chunk, Message, create_channel
from barrierflow.channels.select import BiasedSelect
from barrierflow.errors import (
    ActorFailedError,
    DuplicateJobError,
    GraphError,
    InvalidArgumentError,
    JobDroppingError,
    JobError,
    JobNotDeclaredError,
    UnknownInputError,
    UnknownJobError,
)
from barrierflow.runtime import (
    ActorContext,
    Job,
    Progress,
    Runtime,
    RuntimeConfig,
    StreamActor,
    stored_jobs,
)

pytestmark = pytest.mark.anyio


def chunk(*ids: int) -> Chunk:
    return Chunk(pa.record_batch({"id": pa.array(ids, pa.int64())}))


def collector(seen: dict[str, list[int]], name: str) -> Callable[[], StreamActor]:
    """A factory of actors appending every row id they read to ``seen[name]``."""

    class Collect(StreamActor):
        async def process(self, message: Message, ctx: ActorContext) -> None:
            if isinstance(message, Chunk):
                seen.setdefault(name, []).extend(message.compact().batch.column("id").to_pylist())
            await ctx.emit(message)

    return Collect


def config(tmp_path: Path, **overrides: object) -> RuntimeConfig:
    values: dict[str, object] = {"state_path": tmp_path / "state.db", "barrier_interval": 3600}
    values.update(overrides)
    return RuntimeConfig(**values)  # type: ignore[arg-type]


def reader_job(name: str, seen: dict[str, list[int]], upstream: str = "src") -> Job:
    job = Job(name)
    job.add_actor(name, collector(seen, name), inputs=[upstream])
    return job


async def test_a_joining_job_sees_exactly_the_rows_after_its_barrier(tmp_path: Path) -> None:
    seen: dict[str, list[int]] = {}
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    rt.add_actor("old", collector(seen, "old"), inputs=["src"])
    with anyio.fail_after(scaled(20)):
        async with rt:
            await rt.push("src", chunk(1, 2, 3))
            handle = await rt.add_job(reader_job("new", seen))
            await rt.push("src", chunk(4, 5))
            await rt.checkpoint()
            assert handle.created_epoch > 0
            assert handle.actors == ["new"]
    assert seen["old"] == [1, 2, 3, 4, 5]
    assert seen["new"] == [4, 5]


async def test_a_dropped_job_sees_nothing_after_its_drop_barrier(tmp_path: Path) -> None:
    seen: dict[str, list[int]] = {}
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    with anyio.fail_after(scaled(20)):
        async with rt:
            await rt.add_job(reader_job("gone", seen))
            await rt.push("src", chunk(1))
            await rt.drop_job("gone")
            await rt.push("src", chunk(2))
            await rt.checkpoint()
            assert rt.jobs() == ["main"]
            assert "gone" not in rt.stats().jobs
    assert seen["gone"] == [1]


async def test_job_stats_sum_their_actors(tmp_path: Path) -> None:
    seen: dict[str, list[int]] = {}
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    with anyio.fail_after(scaled(20)):
        async with rt:
            handle = await rt.add_job(reader_job("count", seen))
            await rt.push("src", chunk(1, 2, 3))
            await rt.checkpoint()
            stats = rt.stats().jobs["count"]
            assert stats.rows_in == 3
            assert stats.actors == ("count",)
            assert stats.created_epoch == handle.created_epoch
            assert stats.ready


async def test_add_job_refuses_a_taken_name_and_unknown_upstreams(tmp_path: Path) -> None:
    seen: dict[str, list[int]] = {}
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    with anyio.fail_after(scaled(20)):
        async with rt:
            await rt.add_job(reader_job("a", seen))
            with pytest.raises(DuplicateJobError) as dup:
                await rt.add_job(reader_job("a", seen))
            assert dup.value.job == "a"
            with pytest.raises(GraphError) as unknown:
                await rt.add_job(reader_job("b", seen, upstream="nowhere"))
            assert unknown.value.argument == "inputs"
            assert unknown.value.got == "nowhere"
            with pytest.raises(UnknownJobError) as missing:
                await rt.drop_job("nope")
            assert missing.value.known == ["main", "a"]
            # A refused job left nothing behind: its name is free.
            await rt.add_job(reader_job("b", seen))
            assert rt.jobs() == ["main", "a", "b"]


async def test_a_job_another_job_reads_cannot_be_dropped(tmp_path: Path) -> None:
    seen: dict[str, list[int]] = {}
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    with anyio.fail_after(scaled(20)):
        async with rt:
            await rt.add_job(reader_job("first", seen))
            await rt.add_job(reader_job("second", seen, upstream="first"))
            with pytest.raises(JobError) as refused:
                await rt.drop_job("first")
            assert refused.value.job == "first"
            await rt.drop_job("second")
            await rt.drop_job("first")


async def _seed_a_runtime_added_job(path: Path, seen: dict[str, list[int]]) -> int:
    """Run once, add job ``audit`` and checkpoint it; returns its creation epoch."""
    rt = Runtime(config(path))
    rt.add_source("src")
    async with rt:
        handle = await rt.add_job(reader_job("audit", seen))
        await rt.checkpoint()
    return handle.created_epoch


def _restarted(path: Path) -> Runtime:
    rt = Runtime(config(path))
    rt.add_source("src")
    return rt


async def test_a_job_in_the_store_must_be_declared_at_restart(tmp_path: Path) -> None:
    with anyio.fail_after(scaled(30)):
        await _seed_a_runtime_added_job(tmp_path, {})
        with pytest.raises(JobNotDeclaredError) as undeclared:
            async with _restarted(tmp_path):
                pass
    assert undeclared.value.job == "audit"
    assert undeclared.value.created_epoch > 0


async def test_a_job_declared_again_at_restart_runs_and_a_forgotten_one_is_gone(
    tmp_path: Path,
) -> None:
    seen: dict[str, list[int]] = {}
    with anyio.fail_after(scaled(30)):
        created = await _seed_a_runtime_added_job(tmp_path, seen)
        declared = _restarted(tmp_path)
        declared.declare_job(reader_job("audit", seen))
        async with declared as rt:
            await rt.push("src", chunk(7))
            await rt.checkpoint()
            # A job keeps the epoch it was created at across restarts.
            assert rt.job("audit").created_epoch == created
            assert rt.job("main").created_epoch > 0
        assert seen["audit"] == [7]
        forgetting = _restarted(tmp_path)
        forgetting.forget_job("audit")
        async with forgetting as rt:
            await rt.checkpoint()
        async with _restarted(tmp_path):  # forgotten for good: no declaration needed
            pass


async def test_a_job_exists_in_the_store_only_after_the_next_checkpoint(tmp_path: Path) -> None:
    seen: dict[str, list[int]] = {}
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    with anyio.fail_after(scaled(20)):
        async with rt:
            await rt.checkpoint()
            store = rt._store
            assert store is not None
            await rt.add_job(reader_job("late", seen))
            assert "late" not in await store.read_all("__runtime__", "jobs")
            await rt.checkpoint()
            assert "late" in await store.read_all("__runtime__", "jobs")
            await rt.drop_job("late")
            await rt.checkpoint()
            assert "late" not in await store.read_all("__runtime__", "jobs")


class Backfill(StreamActor):
    """Reports progress with each barrier; finished after three."""

    backfills = True

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Barrier):
            done = ctx.stats().barriers + 1
            ctx.report_progress(Progress(finished=done >= 3, rows=done * 10))
        await ctx.emit(message)


async def test_wait_ready_returns_once_every_backfilling_actor_finished(tmp_path: Path) -> None:
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    job = Job("view")
    job.add_actor("fill", Backfill, inputs=["src"])
    with anyio.fail_after(scaled(20)):
        async with rt:
            handle = await rt.add_job(job)
            progress = handle.progress()
            assert not progress.ready
            assert progress.actors["fill"].rows == 10
            assert not rt.stats().jobs["view"].ready
            await rt.checkpoint()
            assert not handle.progress().ready
            await rt.checkpoint()
            ready = await handle.wait_ready()
            assert ready.ready
            assert ready.rows == 30
            assert ready.fraction_finished == 1.0


class TwoSides(StreamActor):
    """Reads its named inputs independently: counts what came from each."""

    aligned_inputs = False

    def __init__(self, seen: dict[str, list[int]]) -> None:
        self.seen = seen

    async def run(self, ctx: ActorContext) -> None:
        assert set(ctx.inputs) == {"upstream", "history"}
        with pytest.raises(UnknownInputError) as unknown:
            ctx.inputs["nope"]
        assert unknown.value.known == ["upstream", "history"]
        select = ctx.select("upstream", "history")
        while True:
            try:
                name, message = await select.receive()
            except anyio.EndOfStream:
                return
            if isinstance(message, Chunk):
                self.seen.setdefault(name, []).extend(message.batch.column("id").to_pylist())
            elif isinstance(message, Barrier) and name == "upstream":
                await ctx.emit(message)
                if ctx.finished:
                    return


async def test_named_inputs_are_read_independently(tmp_path: Path) -> None:
    seen: dict[str, list[int]] = {}
    rt = Runtime(config(tmp_path))
    rt.add_source("live")
    rt.add_source("old")
    rt.add_actor("both", lambda: TwoSides(seen), inputs={"upstream": "live", "history": "old"})
    with anyio.fail_after(scaled(20)):
        async with rt:
            await rt.push("live", chunk(1))
            await rt.push("old", chunk(2))
            await rt.checkpoint()
    assert seen == {"upstream": [1], "history": [2]}


async def test_messages_refuses_an_actor_with_independent_inputs(tmp_path: Path) -> None:
    class Wrong(StreamActor):
        aligned_inputs = False

    rt = Runtime(config(tmp_path))
    rt.add_source("a")
    rt.add_source("b")
    rt.add_actor("wrong", Wrong, inputs=["a", "b"])
    with pytest.raises(ActorFailedError) as failed, anyio.fail_after(scaled(20)):
        async with rt:
            await rt.checkpoint()
    assert failed.value.actor == "wrong"
    assert isinstance(failed.value.cause, GraphError)


async def test_biased_select_always_polls_the_first_input_first() -> None:
    up_tx, up_rx = create_channel[int](8)
    down_tx, down_rx = create_channel[int](8)
    for i in range(3):
        up_tx.send_nowait(i)
        down_tx.send_nowait(100 + i)
    select = BiasedSelect({"upstream": up_rx, "backfill": down_rx})
    got = [await select.receive() for _ in range(6)]
    assert got[:3] == [("upstream", 0), ("upstream", 1), ("upstream", 2)]
    assert [m for _, m in got[3:]] == [100, 101, 102]


async def test_biased_select_skips_a_paused_input_until_resumed() -> None:
    up_tx, up_rx = create_channel[int](8)
    down_tx, down_rx = create_channel[int](8)
    up_tx.send_nowait(1)
    down_tx.send_nowait(2)
    select = BiasedSelect({"upstream": up_rx, "backfill": down_rx})
    select.pause("upstream")
    assert select.is_paused("upstream")
    assert await select.receive() == ("backfill", 2)
    with anyio.move_on_after(0.05):
        await select.receive()
        pytest.fail("a paused input was read")
    select.resume("upstream")
    assert await select.receive() == ("upstream", 1)
    with pytest.raises(UnknownInputError):
        select.pause("nope")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    plan=st.lists(
        st.tuples(st.sampled_from(["a", "b"]), st.integers(1, 3)), min_size=1, max_size=20
    ),
    cancel_after=st.lists(st.integers(0, 3), max_size=20),
)
async def test_biased_select_loses_nothing_and_keeps_each_inputs_order_under_cancellation(
    plan: list[tuple[str, int]], cancel_after: list[int]
) -> None:
    if True:  # one block, as the property reads
        a_tx, a_rx = create_channel[int](64)
        b_tx, b_rx = create_channel[int](64)
        select = BiasedSelect({"a": a_rx, "b": b_rx})
        sent: dict[str, list[int]] = {"a": [], "b": []}
        got: dict[str, list[int]] = {"a": [], "b": []}
        cancels = iter(cancel_after)
        for index, (side, burst) in enumerate(plan):
            tx = a_tx if side == "a" else b_tx
            for i in range(burst):
                tx.send_nowait(index * 10 + i)
                sent[side].append(index * 10 + i)
            # A receive cancelled at once (nothing ready or not): nothing may be lost.
            with anyio.CancelScope() as scope:
                if next(cancels, 0) % 2:
                    scope.cancel()
                name, value = await select.receive()
                got[name].append(value)
        a_tx.close()
        b_tx.close()
        while True:
            try:
                name, value = await select.receive()
            except anyio.EndOfStream:
                break
            got[name].append(value)
        assert got == sent


class Writer(StreamActor):
    """Counts rows in its table."""

    async def restore(self, ctx: ActorContext) -> None:
        self.table = ctx.table("state")

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk):
            self.table.put("rows", (await self.table.get("rows", 0)) + message.cardinality)
        await ctx.emit(message)


async def test_an_actor_reads_another_actors_committed_table(tmp_path: Path) -> None:
    observed: list[object] = []

    class Reader(StreamActor):
        """Waits, beside its stream, for the first checkpoint after it joined; then reads."""

        async def run(self, ctx: ActorContext) -> None:
            first = anyio.Event()
            joined: list[int] = []

            async def observe() -> None:
                await first.wait()
                committed = await ctx.wait_committed(joined[0])
                assert committed >= joined[0]
                observed.append(await ctx.read_table("writer", "state").get("rows", 0))
                observed.append(ctx.barrier_interval)

            async with anyio.create_task_group() as tg:
                tg.start_soon(observe)
                async for message in ctx.messages():
                    if isinstance(message, Barrier) and not joined:
                        joined.append(message.epoch.curr)
                        first.set()
                    await ctx.emit(message)

    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    rt.add_actor("writer", Writer, inputs=["src"])
    with anyio.fail_after(scaled(20)):
        async with rt:
            await rt.push("src", chunk(1, 2))
            await rt.checkpoint()
            job = Job("reader")
            job.add_actor("reader", Reader, inputs=["writer"])
            await rt.add_job(job)
            await rt.push("src", chunk(3))
            await rt.checkpoint()
            await rt.checkpoint()
    assert observed == [3, 3600]


async def test_fanout_is_per_edge_hash_to_a_group_and_everything_to_a_monitor(
    tmp_path: Path,
) -> None:
    seen: dict[str, list[int]] = {}
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    rt.add_actor(
        "writer",
        lambda i: collector(seen, f"writer.{i}")(),
        inputs=["src"],
        parallelism=2,
        key=("id",),
    )
    rt.add_actor("monitor", collector(seen, "monitor"), inputs=["src"])
    with anyio.fail_after(scaled(20)):
        async with rt:
            await rt.push("src", chunk(*range(100)))
            await rt.checkpoint()
    assert sorted(seen["monitor"]) == list(range(100))
    parts = [set(seen.get("writer.0", [])), set(seen.get("writer.1", []))]
    assert parts[0]
    assert parts[1]
    assert not parts[0] & parts[1]
    assert parts[0] | parts[1] == set(range(100))


def test_an_actor_instance_is_refused_factories_only(tmp_path: Path) -> None:
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    with pytest.raises(GraphError) as refused:
        rt.add_actor("x", StreamActor(), inputs=["src"])
    assert refused.value.argument == "actor"
    assert "x" not in rt._graph.nodes


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("push"), st.integers(1, 5)),
            st.tuples(st.just("add"), st.integers(0, 3)),
            st.tuples(st.just("drop"), st.integers(0, 3)),
            st.tuples(st.just("checkpoint"), st.just(0)),
        ),
        min_size=1,
        max_size=14,
    )
)
async def test_jobs_added_and_dropped_at_random_see_exactly_their_rows(
    steps: list[tuple[str, int]],
) -> None:
    """Every job sees exactly the rows pushed while it ran, in order; the old job sees all."""
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory)
        seen: dict[str, list[int]] = {}
        expected: dict[str, list[int]] = {"old": []}
        running: dict[int, str] = {}
        rt = Runtime(config(path))
        rt.add_source("src")
        rt.add_actor("old", collector(seen, "old"), inputs=["src"])
        next_id, generation = 0, 0
        with anyio.fail_after(scaled(60)):
            async with rt:
                for kind, value in steps:
                    if kind == "push":
                        ids = list(range(next_id, next_id + value))
                        next_id += value
                        await rt.push("src", chunk(*ids))
                        for name in ["old", *running.values()]:
                            expected[name] += ids
                    elif kind == "add" and value not in running:
                        generation += 1
                        name = f"job{value}g{generation}"
                        await rt.add_job(reader_job(name, seen))
                        running[value] = name
                        expected[name] = []
                    elif kind == "drop" and value in running:
                        await rt.drop_job(running.pop(value))
                    elif kind == "checkpoint":
                        await rt.checkpoint()
                await rt.checkpoint()
        assert {name: seen.get(name, []) for name in expected} == expected


async def test_a_dropped_jobs_state_is_trimmed_in_the_next_checkpoint(tmp_path: Path) -> None:
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    job = Job("stateful")
    job.add_actor("writer", Writer, inputs=["src"])
    with anyio.fail_after(scaled(20)):
        async with rt:
            await rt.add_job(job)
            await rt.push("src", chunk(1, 2))
            await rt.checkpoint()
            store = rt._store
            assert store is not None
            assert await store.read_all("writer", "state") == {"rows": 2}
            await rt.drop_job("stateful")
            await rt.checkpoint()
            assert await store.read_all("writer", "state") == {}


async def test_a_drop_trims_state_even_when_a_checkpoint_passed_while_its_actors_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A checkpoint after the stop barrier completes before the trim (its actors took their
    # time to leave): the trim's deletes go into the checkpoint after it, not a committed one.
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    job = Job("stateful")
    job.add_actor("writer", Writer, inputs=["src"])
    trim = Runtime._trim

    async def late_trim(ctx: Any, epoch: int) -> None:
        assert await rt.checkpoint() >= epoch  # the stop barrier's epoch is committed now
        await trim(ctx, epoch)

    monkeypatch.setattr(Runtime, "_trim", staticmethod(late_trim))
    with anyio.fail_after(scaled(20)):
        async with rt:
            await rt.add_job(job)
            await rt.push("src", chunk(1, 2))
            await rt.checkpoint()
            await rt.drop_job("stateful")
            await rt.checkpoint()
            store = rt._store
            assert store is not None
            assert await store.read_all("writer", "state") == {}


async def test_a_job_cannot_read_an_actor_of_a_job_being_dropped(tmp_path: Path) -> None:
    arrived, release = anyio.Event(), anyio.Event()

    class HoldsItsStop(StreamActor):
        """Keeps the Stop barrier of its drop until released, so the drop stays in flight."""

        async def process(self, message: Message, ctx: ActorContext) -> None:
            if isinstance(message, Barrier) and message.is_stop(ctx.actor_id):
                arrived.set()
                await release.wait()
            await ctx.emit(message)

    seen: dict[str, list[int]] = {}
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    leaving = Job("leaving")
    leaving.add_actor("held", HoldsItsStop, inputs=["src"])
    with anyio.fail_after(scaled(20)):
        async with rt, anyio.create_task_group() as tg:
            await rt.add_job(leaving)
            tg.start_soon(rt.drop_job, "leaving")
            await arrived.wait()
            with pytest.raises(JobDroppingError) as dropping:
                await rt.add_job(reader_job("late", seen, upstream="held"))
            assert (dropping.value.job, dropping.value.upstream) == ("late", "held")
            assert dropping.value.dropping == "leaving"
            release.set()
    assert rt.jobs() == ["main"]


async def test_stored_jobs_reads_the_catalog_before_a_runtime_starts(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    assert await stored_jobs(path) == {}
    assert not path.exists()  # reading created nothing
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    job = Job("stateful")
    job.add_actor("writer", Writer, inputs=["src"])
    with anyio.fail_after(scaled(20)):
        async with rt:
            handle = await rt.add_job(job)
            await rt.checkpoint()
    stored = await stored_jobs(path)
    assert sorted(stored) == ["main", "stateful"]
    assert stored["stateful"] == handle.created_epoch
    with pytest.raises(InvalidArgumentError) as bad:
        await stored_jobs(b"state.db")  # type: ignore[arg-type]
    assert bad.value.argument == "path"
