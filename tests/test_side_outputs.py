"""Side outputs: an actor emits rows to a named output besides its main one, and only the
readers of that output (``"<actor>:<output>"``) get them, while every reader sees every
barrier; declared and checked when the reader is declared; exactly once across a crash."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import anyio
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from _timeouts import scaled

from barrierflow.actors import add_sink
from barrierflow.channels import (
    Barrier,
    BroadcastDispatcher,
    Chunk,
    Committable,
    EpochPair,
    HashDispatcher,
    Message,
    ReceiveChannel,
    VnodeBitmap,
    Watermark,
    create_channel,
)
from barrierflow.channels.mutation import Add, NewOutput, Update
from barrierflow.channels.outputs import Outputs
from barrierflow.errors import (
    ActorFailedError,
    BarrierNotPassedError,
    GraphError,
    InvalidArgumentError,
)
from barrierflow.runtime import ActorContext, Job, Runtime, RuntimeConfig, StreamActor
from barrierflow.runtime.barrier_manager import BarrierManager
from barrierflow.runtime.placement import Placement
from barrierflow.runtime.state.state_store import StateStore
from barrierflow.testing import ListTable
from barrierflow.testing.scripted import CHECKPOINT, CRASH, Item, ScriptedSource, play

pytestmark = pytest.mark.anyio

SCHEMA = pa.schema([("n", pa.int64())])


def chunk(*values: int) -> Chunk:
    return Chunk(pa.record_batch({"n": pa.array(values, pa.int64())}))


def config(tmp_path: Path, **overrides: object) -> RuntimeConfig:
    values: dict[str, object] = {"state_path": tmp_path / "state.db", "barrier_interval": 3600}
    values.update(overrides)
    return RuntimeConfig(**values)  # type: ignore[arg-type]


class SplitOdd(StreamActor):
    """Even rows to the main output, odd rows to the side output ``"odd"``."""

    side_outputs: ClassVar[tuple[str, ...]] = ("odd",)

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if not isinstance(message, Chunk):
            await ctx.emit(message)
            return
        batch = message.compact().batch
        odd = pc.equal(pc.bit_wise_and(batch.column("n"), 1), 1)
        await ctx.emit(Chunk(batch.filter(pc.invert(odd))))
        await ctx.emit(Chunk(batch.filter(odd)), output="odd")


class Seen:
    """What each recording actor read: its rows and the ``curr`` epoch of each barrier."""

    def __init__(self) -> None:
        self.rows: dict[str, list[int]] = {}
        self.epochs: dict[str, list[int]] = {}

    def recorder(self) -> Callable[..., StreamActor]:
        """A factory (also of a parallel group: it takes the index) of recording actors."""
        seen = self

        class Record(StreamActor):
            async def process(self, message: Message, ctx: ActorContext) -> None:
                rows = seen.rows.setdefault(ctx.name, [])
                epochs = seen.epochs.setdefault(ctx.name, [])
                if isinstance(message, Chunk):
                    rows.extend(message.compact().batch.column("n").to_pylist())
                elif isinstance(message, Barrier):
                    epochs.append(message.epoch.curr)
                await ctx.emit(message)

        return lambda index=None: Record()


# The runtime: who gets which rows.


async def test_each_reader_gets_exactly_the_rows_of_the_output_it_reads_and_every_barrier(
    tmp_path: Path,
) -> None:
    seen = Seen()
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    rt.add_actor("split", SplitOdd, inputs=["src"])
    rt.add_actor("evens", seen.recorder(), inputs=["split"])
    rt.add_actor("odds", seen.recorder(), inputs=["split:odd"])
    with anyio.fail_after(scaled(20)):
        async with rt:
            await rt.push("src", chunk(1, 2, 3, 4))
            first = await rt.checkpoint()
            await rt.push("src", chunk(5, 6, 7))
            second = await rt.checkpoint()
    assert first < second  # both checkpoints completed: every reader collected each barrier
    assert seen.rows["evens"] == [2, 4, 6]
    assert seen.rows["odds"] == [1, 3, 5, 7]
    assert seen.epochs["odds"] == seen.epochs["evens"]
    assert len(seen.epochs["odds"]) >= 3  # the initial barrier and both checkpoints


async def test_rows_to_a_side_output_nobody_reads_are_dropped_and_counted_as_rows_out(
    tmp_path: Path,
) -> None:
    seen = Seen()
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    rt.add_actor("split", SplitOdd, inputs=["src"])
    rt.add_actor("evens", seen.recorder(), inputs=["split"])
    with anyio.fail_after(scaled(20)):
        async with rt:
            await rt.push("src", chunk(1, 2, 3))
            await rt.checkpoint()
            stats = rt.stats().actors
    assert seen.rows["evens"] == [2]
    assert stats["split"].rows_out == 3


async def test_one_actor_reads_the_main_and_a_side_output_of_one_upstream(
    tmp_path: Path,
) -> None:
    seen = Seen()
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    rt.add_actor("split", SplitOdd, inputs=["src"])
    rt.add_actor("both", seen.recorder(), inputs={"main": "split", "late": "split:odd"})
    rt.add_actor("listed", seen.recorder(), inputs=["split", "split:odd"])
    with anyio.fail_after(scaled(20)):
        async with rt:
            await rt.push("src", chunk(1, 2, 3, 4))
            await rt.checkpoint()
    assert sorted(seen.rows["both"]) == sorted(seen.rows["listed"]) == [1, 2, 3, 4]


async def test_a_side_output_read_by_a_parallel_hash_group_sends_each_key_to_one_member(
    tmp_path: Path,
) -> None:
    seen = Seen()
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    rt.add_actor("split", SplitOdd, inputs=["src"])
    rt.add_actor("agg", seen.recorder(), inputs=["split:odd"], parallelism=2, key=["n"])
    rt.add_actor("evens", seen.recorder(), inputs=["split"])
    odds = list(range(1, 200, 2))
    with anyio.fail_after(scaled(20)):
        async with rt:
            await rt.push("src", chunk(*range(200)))
            await rt.push("src", chunk(*range(200)))  # every key again: to the same member
            await rt.checkpoint()
    members = [seen.rows.get("agg.0", []), seen.rows.get("agg.1", [])]
    assert sorted(members[0] + members[1]) == sorted(odds * 2)
    assert not set(members[0]) & set(members[1])
    assert all(members)  # 100 keys over 256 vnodes split in two: both get some
    assert seen.epochs["agg.0"] == seen.epochs["agg.1"] == seen.epochs["evens"]
    assert seen.rows["evens"] == list(range(0, 200, 2)) * 2


async def test_a_job_added_at_runtime_reads_a_side_output_from_its_add_barrier_on(
    tmp_path: Path,
) -> None:
    seen = Seen()
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    rt.add_actor("split", SplitOdd, inputs=["src"])
    rt.add_actor("evens", seen.recorder(), inputs=["split"])
    job = Job("late")
    job.add_actor("late_odds", seen.recorder(), inputs=["split:odd"])
    with anyio.fail_after(scaled(20)):
        async with rt:
            await rt.push("src", chunk(1, 2, 3))
            handle = await rt.add_job(job)
            await rt.push("src", chunk(4, 5, 6, 7))
            await rt.checkpoint()
            assert rt.reaches("src", "late_odds")
            await rt.drop_job("late")
            await rt.push("src", chunk(8, 9))
            await rt.checkpoint()
    assert seen.rows["late_odds"] == [5, 7]
    assert seen.epochs["late_odds"][0] == handle.created_epoch
    assert seen.rows["evens"] == [2, 4, 6, 8]


async def test_a_crash_keeps_main_and_side_outputs_exactly_once_in_two_sinks(
    tmp_path: Path,
) -> None:
    def graph(path: Path) -> tuple[ListTable, ListTable, Runtime]:
        evens, odds = ListTable(SCHEMA), ListTable(SCHEMA)
        rt = Runtime(config(tmp_path, state_path=path, recovery=True, restart_backoff=0.001))
        rt.add_source("src", ScriptedSource)
        rt.add_actor("split", SplitOdd, inputs=["src"])
        add_sink(rt, "evens", evens, input="split")
        add_sink(rt, "odds", odds, input="split:odd")
        return evens, odds, rt

    def batch(*values: int) -> pa.RecordBatch:
        return pa.record_batch({"n": pa.array(values, pa.int64())})

    script: list[Item] = [batch(1, 2), CHECKPOINT, batch(3, 4), batch(5, 6), CRASH]
    script += [batch(7, 8), CHECKPOINT, batch(9), CHECKPOINT]
    evens, odds, rt = graph(tmp_path / "crash.db")
    with anyio.fail_after(scaled(40)):
        async with rt:
            playback = await play(rt, "src", script)
            await rt.checkpoint()
    assert playback.crashes == 1
    assert rt.stats().restarts == 1
    assert sorted(evens.rows().column("n").to_pylist()) == [2, 4, 6, 8]
    assert sorted(odds.rows().column("n").to_pylist()) == [1, 3, 5, 7, 9]


class PlainSplit(SplitOdd):
    """SplitOdd whose class declares nothing: its operator-like factory does."""

    side_outputs: ClassVar[tuple[str, ...]] = ()


class SplitOperator:
    """A factory declaring placement, key and side outputs, as an operator does."""

    placement = Placement.PARTITION_LOCAL
    key: tuple[str, ...] | None = None
    side_outputs: tuple[str, ...] = ("odd",)

    def __call__(self, index: int | None = None) -> StreamActor:
        return PlainSplit()


async def test_an_operator_factorys_side_outputs_are_the_ones_its_actors_emit_to(
    tmp_path: Path,
) -> None:
    seen = Seen()
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    rt.add_actor("split", SplitOperator(), inputs=["src"], parallelism=2)
    rt.add_actor("odds", seen.recorder(), inputs=["split:odd"])
    with anyio.fail_after(scaled(20)):
        async with rt:
            await rt.push("src", chunk(1, 2, 3))
            await rt.checkpoint()
    assert sorted(seen.rows["odds"]) == [1, 3]


class SourceWithRejects(StreamActor):
    """A push source sending rows with a negative ``n`` aside, as ``{"raw": ...}`` rows of
    another schema than its declared one."""

    side_outputs: ClassVar[tuple[str, ...]] = ("rejects",)

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if not isinstance(message, Chunk):
            await ctx.emit(message)
            return
        batch = message.compact().batch
        bad = pc.less(batch.column("n"), 0)
        await ctx.emit(Chunk(batch.filter(pc.invert(bad))))
        rejected = batch.filter(bad).column("n")
        await ctx.emit(Chunk(pa.record_batch({"raw": rejected})), output="rejects")


async def test_a_side_outputs_readers_are_not_checked_against_the_main_outputs_schema(
    tmp_path: Path,
) -> None:
    seen = Seen()
    rejects: list[int] = []

    class Rejects(StreamActor):
        placement: ClassVar[Placement] = Placement.PARTITION_LOCAL

        def __init__(self, index: int | None = None) -> None:
            pass

        async def process(self, message: Message, ctx: ActorContext) -> None:
            if isinstance(message, Chunk):
                rejects.extend(message.compact().batch.column("raw").to_pylist())
            await ctx.emit(message)

    rt = Runtime(config(tmp_path))
    rt.add_source("src", SourceWithRejects, schema=SCHEMA)
    # Keyed by a column the declared (main) schema lacks: the side output has it.
    rt.add_actor("rejects", Rejects, inputs=["src:rejects"], parallelism=2, key=["raw"])
    rt.add_actor("good", seen.recorder(), inputs=["src"])
    with anyio.fail_after(scaled(20)):
        async with rt:
            await rt.push("src", chunk(1, -2, 3, -4))
            await rt.checkpoint()
    assert seen.rows["good"] == [1, 3]
    assert sorted(rejects) == [-4, -2]


# Declaration: checked when the reader is declared.


def test_a_side_output_the_upstream_does_not_declare_is_refused_naming_the_declared_ones(
    tmp_path: Path,
) -> None:
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    rt.add_actor("split", SplitOdd, inputs=["src"])
    with pytest.raises(GraphError) as refused:
        rt.add_actor("x", StreamActor, inputs=["split:even"])
    assert refused.value.argument == "inputs"
    assert refused.value.got == "split:even"
    assert "'split'" in refused.value.expected
    assert "['odd']" in refused.value.expected
    with pytest.raises(GraphError):
        rt.add_actor("y", StreamActor, inputs={"late": "split:even"})
    with pytest.raises(GraphError):  # no side output at all on the source
        rt.add_actor("z", StreamActor, inputs=["src:odd"])
    with pytest.raises(GraphError):
        rt.add_actor("w", StreamActor, inputs=["split:"])
    rt.add_actor("x", StreamActor, inputs=["split:odd"])  # nothing was left of the refusals


def test_a_side_output_of_an_upstream_made_by_a_plain_function_is_refused(tmp_path: Path) -> None:
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    rt.add_actor("opaque", lambda: SplitOdd(), inputs=["src"])
    with pytest.raises(GraphError) as refused:
        rt.add_actor("x", StreamActor, inputs=["opaque:odd"])
    assert refused.value.got == "opaque:odd"
    assert "declare side_outputs" in refused.value.expected


def test_a_side_output_of_an_upstream_group_is_checked_against_the_groups_factory(
    tmp_path: Path,
) -> None:
    class ParallelSplit(SplitOdd):
        placement: ClassVar[Placement] = Placement.PARTITION_LOCAL

        def __init__(self, index: int | None = None) -> None:
            self.index = index

    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    rt.add_actor("split", lambda i: StreamActor(), inputs=["src"], parallelism=2)
    with pytest.raises(GraphError):
        rt.add_actor("x", StreamActor, inputs=["split:odd"])
    rt.add_actor("psplit", ParallelSplit, inputs=["src"], parallelism=2)
    rt.add_actor("reader", StreamActor, inputs=["psplit:odd"])
    assert rt.reaches("psplit.1", "reader")
    with pytest.raises(GraphError):
        rt.add_actor("y", StreamActor, inputs=["psplit:late"])


@pytest.mark.parametrize("name", ["a:b", ":", "split:odd"])
def test_an_actor_name_holding_a_colon_is_refused(tmp_path: Path, name: str) -> None:
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    rt.add_actor("split", SplitOdd, inputs=["src"])
    with pytest.raises(GraphError) as refused:
        rt.add_actor(name, StreamActor, inputs=["src"])
    assert refused.value.argument == "name"
    assert refused.value.got == name
    with pytest.raises(GraphError):
        rt.add_source(name)


def test_a_side_output_edge_is_an_edge_for_reaches_and_the_cycle_check(tmp_path: Path) -> None:
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    rt.add_actor("a", StreamActor, inputs=["src"])
    rt.add_actor("split", SplitOdd, inputs=["a"])
    rt.add_actor("odds", StreamActor, inputs=["split:odd"])
    assert rt.reaches("src", "odds")
    assert rt.reaches("split", "odds")
    assert not rt.reaches("odds", "split")
    with pytest.raises(GraphError) as refused:
        rt.connect("split:odd", "a")
    assert refused.value.expected == "no cycle"
    with pytest.raises(GraphError):
        rt.connect("split:even", "odds")
    with pytest.raises(GraphError):  # the edge exists
        rt.connect("split:odd", "odds")
    rt.connect("split", "odds")  # the main output is another edge
    assert rt.reaches("split", "odds")


# Emitting.


class Emits(StreamActor):
    """Emits, on each chunk, what :meth:`misuse` does (a test's misuse), then the chunk."""

    side_outputs: ClassVar[tuple[str, ...]] = ("odd",)

    async def misuse(self, ctx: ActorContext, message: Message) -> None:
        raise NotImplementedError

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk):
            await self.misuse(ctx, message)
        await ctx.emit(message)


async def failure_of(tmp_path: Path, factory: Callable[[], StreamActor]) -> BaseException:
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    rt.add_actor("bad", factory, inputs=["src"])
    with anyio.fail_after(scaled(20)), pytest.raises(ActorFailedError) as failed:
        async with rt:
            await rt.push("src", chunk(1))
            await rt.checkpoint()
    assert failed.value.actor == "bad"
    return failed.value.cause


async def test_emitting_to_an_undeclared_output_raises_even_without_readers(
    tmp_path: Path,
) -> None:
    class Undeclared(Emits):
        async def misuse(self, ctx: ActorContext, message: Message) -> None:
            await ctx.emit(message, output="even")

    cause = await failure_of(tmp_path, Undeclared)
    assert isinstance(cause, InvalidArgumentError)
    assert cause.argument == "output"
    assert cause.got == "even"
    assert "['odd']" in cause.expected


async def test_a_watermark_to_a_side_output_is_refused(tmp_path: Path) -> None:
    class SideWatermark(Emits):
        async def misuse(self, ctx: ActorContext, message: Message) -> None:
            await ctx.emit(Watermark("n", 1), output="odd")

    cause = await failure_of(tmp_path, SideWatermark)
    assert isinstance(cause, InvalidArgumentError)
    assert cause.argument == "output"


async def test_rows_to_a_side_output_before_the_first_barrier_are_refused(
    tmp_path: Path,
) -> None:
    class Early(SplitOdd):
        async def restore(self, ctx: ActorContext) -> None:
            await ctx.emit(chunk(1), output="odd")

    cause = await failure_of(tmp_path, Early)
    assert isinstance(cause, BarrierNotPassedError)
    assert cause.actor == "bad"
    assert "'odd'" in cause.then


# Outputs: routing by output name, joining and rescaling.

EPOCH = EpochPair(2 << 16, 1 << 16)


def channels(count: int) -> tuple[list[object], list[ReceiveChannel[Message]]]:
    senders: list[object] = []
    receivers: list[ReceiveChannel[Message]] = []
    for index in range(count):
        tx, rx = create_channel[Message](16, name=f"out{index}")
        senders.append(tx)
        receivers.append(rx)
    return senders, receivers


def received(rx: ReceiveChannel[Message]) -> list[Message]:
    messages: list[Message] = []
    while True:
        try:
            messages.append(rx.receive_nowait())
        except (anyio.WouldBlock, anyio.EndOfStream):
            return messages


async def test_outputs_route_chunks_by_output_committables_to_main_the_rest_to_all() -> None:
    (main_tx, side_tx), (main_rx, side_rx) = channels(2)
    outputs = Outputs(
        [
            (BroadcastDispatcher([main_tx]), [1]),  # type: ignore[list-item]
            (BroadcastDispatcher([side_tx]), [2], "odd"),  # type: ignore[list-item]
        ]
    )
    even, odd, mark = chunk(2), chunk(1), Watermark("n", 5)
    committable = Committable("sink", "payload")
    barrier = Barrier(EPOCH)
    await outputs.dispatch(even)
    await outputs.dispatch(odd, "odd")
    await outputs.dispatch(chunk(3), "nobody")  # no group reads it: dropped
    await outputs.dispatch(committable)
    await outputs.dispatch(mark)
    await outputs.dispatch(barrier)
    assert received(main_rx) == [even, committable, mark, barrier]
    assert received(side_rx) == [odd, mark, barrier]
    for message in (barrier, mark, committable):
        with pytest.raises(InvalidArgumentError) as refused:
            await outputs.dispatch(message, "odd")
        assert refused.value.argument == "output"
    for bad in ("", "a:b", 3):
        with pytest.raises(InvalidArgumentError):
            await outputs.dispatch(odd, bad)  # type: ignore[arg-type]
    assert received(side_rx) == []


def test_outputs_and_new_outputs_refuse_a_bad_output_name() -> None:
    (tx,), _ = channels(1)
    dispatcher = BroadcastDispatcher([tx])  # type: ignore[list-item]
    for bad in ("", "a:b", 1):
        with pytest.raises(InvalidArgumentError) as refused:
            Outputs([(dispatcher, [1], bad)])  # type: ignore[list-item]
        assert refused.value.argument == "output"
        with pytest.raises(InvalidArgumentError) as refused:
            NewOutput(dispatcher, (1,), bad)  # type: ignore[arg-type]
        assert refused.value.argument == "NewOutput.output"
    with pytest.raises(InvalidArgumentError) as refused:
        Outputs([(dispatcher,)])  # type: ignore[list-item]
    assert refused.value.argument == "groups"


async def test_a_side_output_joining_at_an_add_barrier_gets_the_barrier_then_its_rows() -> None:
    (main_tx, side_tx), (main_rx, side_rx) = channels(2)
    outputs = Outputs([(BroadcastDispatcher([main_tx]), [1])])  # type: ignore[list-item]
    new = NewOutput(BroadcastDispatcher([side_tx]), (2,), "odd")  # type: ignore[list-item]
    before = chunk(1)
    await outputs.dispatch(before, "odd")  # nobody reads "odd" yet
    add = Barrier(EPOCH, mutation=Add(added_actors=frozenset({2}), outputs={7: (new,)}))
    await outputs.dispatch(add)
    await outputs.apply(add, 7)
    after, main = chunk(3), chunk(2)
    await outputs.dispatch(after, "odd")
    await outputs.dispatch(main)
    assert received(side_rx) == [add, after]
    assert received(main_rx) == [add, main]


async def test_a_side_outputs_hash_group_is_rescaled_by_an_update() -> None:
    (main_tx, a_tx, b_tx), (main_rx, a_rx, b_rx) = channels(3)
    halves = VnodeBitmap.split(2)
    outputs = Outputs(
        [
            (BroadcastDispatcher([main_tx]), [1]),  # type: ignore[list-item]
            (HashDispatcher([a_tx, b_tx], halves, ["n"]), [2, 3], "odd"),  # type: ignore[list-item]
        ]
    )
    update = Barrier(
        EPOCH,
        mutation=Update(
            dropped_actors=frozenset({3}),
            vnode_bitmaps={2: VnodeBitmap.full(halves[0].vnode_count)},
        ),
    )
    await outputs.dispatch(update)
    await outputs.apply(update, 1)
    rows = chunk(*range(1, 100, 2))
    await outputs.dispatch(rows, "odd")
    to_a = [m for m in received(a_rx) if isinstance(m, Chunk)]
    assert sorted(n for m in to_a for n in m.compact().batch.column("n").to_pylist()) == list(
        range(1, 100, 2)
    )
    assert [m for m in received(b_rx) if isinstance(m, Chunk)] == []
    assert [m for m in received(main_rx) if isinstance(m, Chunk)] == []


async def test_a_context_checks_side_outputs_and_emit_refuses_misuse_without_any_output(
    tmp_path: Path,
) -> None:
    tx, rx = create_channel[Message](4)
    async with await StateStore.open(tmp_path / "store.db") as store:
        manager = BarrierManager(
            store, {1: tx}, {1}, barrier_interval=1.0, checkpoint_frequency=1, max_in_flight=2
        )
        for bad in (["odd"], ("odd", None), ("",), ("a:b",), (3,)):
            with pytest.raises(InvalidArgumentError) as refused:
                ActorContext(1, "a", rx, None, store, manager, side_outputs=bad)  # type: ignore[arg-type]
            assert refused.value.argument == "side_outputs"
        ctx = ActorContext(1, "a", rx, None, store, manager, side_outputs=("odd",))
        assert ctx.side_outputs == ("odd",)
        with pytest.raises(InvalidArgumentError) as refused:
            await ctx.emit(Watermark("n", 1), output="odd")
        assert refused.value.argument == "output"
        with pytest.raises(InvalidArgumentError) as refused:
            await ctx.emit(chunk(1), output="even")
        assert refused.value.got == "even"
        with pytest.raises(BarrierNotPassedError):
            await ctx.emit(chunk(1), output="odd")
        with pytest.raises(InvalidArgumentError) as refused:
            await ctx.emit("not a message", output="odd")  # type: ignore[arg-type]
        assert refused.value.argument == "message"
