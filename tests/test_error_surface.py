"""Errors as users see them: refused at the boundary, typed, and the real error on top.

One test per rule of issue 12: a value that would fail later is refused when it is given; a
refused declaration leaves no trace; an actor's failure shows the error it raised, not a
one-member exception group around it; a schema mismatch reads on one line.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pytest
from _timeouts import scaled

from barrierflow._taskgroups import single_error
from barrierflow.actors import SplitSource, add_sink
from barrierflow.actors.sources.split_log import split_log_schema
from barrierflow.channels import (
    Add,
    Barrier,
    BarrierKind,
    BroadcastDispatcher,
    Chunk,
    EpochClock,
    EpochPair,
    HashDispatcher,
    Op,
    Stop,
    Throttle,
    VnodeBitmap,
    Watermark,
    compute_vnodes,
    create_channel,
    epoch_from_unix_ms,
    physical_time_ms,
)
from barrierflow.channels.merge import AlignedMerge
from barrierflow.errors import (
    ActorFailedError,
    BarrierCollectError,
    ConfigError,
    GraphError,
    InvalidArgumentError,
    SchemaMismatchError,
    UnknownSplitError,
    WatermarkTypeMismatchError,
)
from barrierflow.runtime import (
    ActorContext,
    Fanout,
    Runtime,
    RuntimeConfig,
    StateStore,
    StreamActor,
    Ticker,
)
from barrierflow.runtime.barrier_manager import BarrierManager
from barrierflow.testing import FakeClock, ListTable
from barrierflow.testing.split_log import MemorySplitLog

PAYLOAD = pa.schema([("v", pa.int64())])
BATCH = pa.record_batch({"k": pa.array([1, 2, 3], pa.int64())})


async def _tick() -> None:
    pass


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 10**400])
def test_durations_must_be_finite(bad: float) -> None:
    for field in ("barrier_interval", "restart_backoff"):
        with pytest.raises(ConfigError) as info:
            RuntimeConfig("x.db", **{field: bad})  # type: ignore[arg-type]
        assert info.value.argument == field
    with pytest.raises(InvalidArgumentError) as ticker:
        Ticker(bad, _tick)
    assert ticker.value.argument == "interval"
    with pytest.raises(InvalidArgumentError) as clock:
        FakeClock().advance(bad)
    assert clock.value.argument == "seconds"


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_rates_must_be_finite(bad: float) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Throttle({1: bad})
    assert info.value.argument == "Throttle.rates"
    assert Throttle({1: None}).rates[1] is None  # "unlimited" is spelled None


def test_str_is_refused_where_a_sequence_of_names_is_expected() -> None:
    tx, _ = create_channel[Any](1)
    with pytest.raises(GraphError) as fanout:
        Fanout("hash", "k")  # type: ignore[arg-type]
    assert (fanout.value.argument, fanout.value.got) == ("key_columns", "k")
    assert Fanout("hash", ["k"]).key_columns == ("k",)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError) as dispatcher:
        HashDispatcher([tx], [VnodeBitmap.full()], "k")
    assert dispatcher.value.argument == "key_columns"
    with pytest.raises(InvalidArgumentError) as vnodes:
        compute_vnodes(BATCH, "k")
    assert vnodes.value.argument == "key_columns"
    with pytest.raises(InvalidArgumentError) as stop:
        Stop("12")  # type: ignore[arg-type]
    assert stop.value.argument == "Stop.actors"
    with pytest.raises(InvalidArgumentError):
        VnodeBitmap.from_vnodes("12")  # type: ignore[arg-type]
    rt = Runtime(RuntimeConfig("unused.db"))
    rt.add_source("src")
    with pytest.raises(GraphError) as inputs:
        rt.add_actor("a", StreamActor, inputs="src")
    assert (inputs.value.argument, inputs.value.got) == ("inputs", "src")


def test_floats_and_bools_are_refused_where_ints_are_expected() -> None:
    refused: list[tuple[Any, tuple[Any, ...], str]] = [
        (epoch_from_unix_ms, (1.7e12,), "unix_ms"),
        (physical_time_ms, (True,), "epoch"),
        (physical_time_ms, (None,), "epoch"),
        (EpochPair, (2.0, 1), "EpochPair.curr"),
        (EpochPair(2, 1).advance, (3.5,), "curr"),
        (EpochPair(2, 1).advance, ("3",), "curr"),
        (EpochClock, (1.0,), "last"),
        (Op, (1.0,), "Op"),
        (Op, (True,), "Op"),
        (Add, ({}, "yes"), "Add.pause"),
        (RuntimeConfig, ("x.db", 1.0, 1.0), "checkpoint_frequency"),
    ]
    for fn, args, argument in refused:
        with pytest.raises(InvalidArgumentError) as info:
            fn(*args)
        assert info.value.argument == argument, fn


@pytest.mark.parametrize("ops", [[0.0, 1.0, 2.0], [0, 1.5, 2], [True, False, True], [0, 2**70, 1]])
def test_float_bool_or_huge_op_codes_are_refused_not_truncated(ops: list[Any]) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Chunk(BATCH, ops)
    assert info.value.argument == "ops"
    empty = Chunk(BATCH.slice(0, 0), [])  # an empty list is still valid for no rows
    assert empty.ops is not None
    assert empty.ops.type == pa.int8()


def test_epochs_beyond_64_bits_are_refused_when_made() -> None:
    with pytest.raises(InvalidArgumentError):
        EpochPair(1 << 63, 0)
    with pytest.raises(InvalidArgumentError):
        epoch_from_unix_ms(10**30)


@pytest.mark.parametrize("reading", [math.nan, math.inf, "1.7e9", None, 10**400, True])
def test_a_clock_reading_that_is_not_a_finite_number_is_an_error_naming_clock(
    reading: Any,
) -> None:
    clock = EpochClock(clock=lambda: reading)
    with pytest.raises(InvalidArgumentError) as info:
        clock.next()
    assert (info.value.argument, info.value.got) == ("clock", reading)
    assert clock.last == 0  # nothing was handed out


def test_a_clock_that_is_not_callable_is_refused_at_construction() -> None:
    with pytest.raises(InvalidArgumentError) as runtime:
        Runtime(RuntimeConfig("unused.db"), clock=5)  # type: ignore[arg-type]
    assert runtime.value.argument == "clock"
    with pytest.raises(InvalidArgumentError) as epochs:
        EpochClock(clock=5)  # type: ignore[arg-type]
    assert epochs.value.argument == "clock"


@pytest.mark.anyio
async def test_dispatch_accepts_only_messages_and_sends_nothing_else() -> None:
    tx, rx = create_channel[Any](4)
    dispatcher = BroadcastDispatcher([tx])
    for bad in (42, None, "chunk", BATCH):
        with pytest.raises(InvalidArgumentError) as info:
            await dispatcher.dispatch(bad)  # type: ignore[arg-type]
        assert info.value.argument == "message"
        with pytest.raises(InvalidArgumentError):
            await dispatcher.dispatch_chunk(bad)  # type: ignore[arg-type]
    assert rx.statistics().buffered_messages == 0


@pytest.mark.parametrize(
    "bad",
    [
        {"inputs": ["nope"]},
        {"inputs": ["src", "src"]},
        {"inputs": "src"},
        {"inputs": ["src"], "fanout": "hash"},
        {"inputs": ["src"], "actor": 42},
    ],
)
def test_a_refused_add_actor_leaves_no_trace(bad: dict[str, Any]) -> None:
    rt = Runtime(RuntimeConfig("unused.db"))
    rt.add_source("src")
    kwargs: dict[str, Any] = {"actor": StreamActor, **bad}
    actor = kwargs.pop("actor")
    with pytest.raises(GraphError):
        rt.add_actor("a", actor, **kwargs)
    assert list(rt._graph.nodes) == ["src"]
    node = rt.add_actor("a", StreamActor, inputs=["src"])  # the name is still free
    assert (node.actor_id, node.inputs) == (2, ["src"])


def test_a_name_taken_by_a_service_is_refused_for_an_actor() -> None:
    class Svc:
        async def run(self, ctx: object) -> None:
            pass

    rt = Runtime(RuntimeConfig("unused.db"))
    rt.add_service("svc", Svc())
    with pytest.raises(GraphError):
        rt.add_source("svc")


@pytest.mark.anyio
async def test_watermarks_of_unorderable_types_are_a_protocol_error() -> None:
    with pytest.raises(InvalidArgumentError):
        Watermark("ts", math.nan)
    (tx_a, rx_a), (tx_b, rx_b) = create_channel[Any](4), create_channel[Any](4)
    out, _merged = create_channel[Any](4)
    await tx_a.send(Watermark("ts", 1))
    await tx_b.send(Watermark("ts", "late"))
    with pytest.raises(WatermarkTypeMismatchError) as info, anyio.fail_after(5):
        await AlignedMerge({"a": rx_a, "b": rx_b}).run(out)
    assert info.value.column == "ts"
    assert info.value.input_types == {"a": "int", "b": "str"}
    assert info.value.emitted_type is None


@pytest.mark.anyio
async def test_a_barrier_collected_twice_or_never_injected_is_a_protocol_error(
    tmp_path: Path,
) -> None:
    tx, _rx = create_channel[Any](4)
    async with await StateStore.open(tmp_path / "state.db") as store:
        manager = BarrierManager(
            store, {1: tx}, {1, 2}, barrier_interval=1.0, checkpoint_frequency=1, max_in_flight=4
        )
        barrier = (await manager.inject()).barrier
        epoch = barrier.epoch.curr
        manager.collect(1, barrier)
        with pytest.raises(BarrierCollectError) as twice:
            manager.collect(1, barrier)
        assert (twice.value.actor_id, twice.value.epoch) == (1, epoch)
        assert (twice.value.in_flight, twice.value.epoch_in_flight) == ((epoch,), True)
        never = Barrier(barrier.epoch.advance(epoch + 1), BarrierKind.BARRIER)
        with pytest.raises(BarrierCollectError) as info:
            manager.collect(2, never)
        assert (info.value.actor_id, info.value.epoch) == (2, epoch + 1)
        assert (info.value.in_flight, info.value.epoch_in_flight) == ((epoch,), False)
        manager.collect(2, barrier)  # the refusals changed nothing: the barrier waited for 2


class _NestedFailure(StreamActor):
    """Fails from inside its own task group: the error reaches the runtime in a group."""

    async def run(self, ctx: ActorContext) -> None:
        async def fail() -> None:
            raise ValueError("bad row")

        async with anyio.create_task_group() as tg:
            tg.start_soon(fail)


@pytest.mark.anyio
async def test_actor_failed_error_names_the_real_error_not_a_group(tmp_path: Path) -> None:
    rt = Runtime(RuntimeConfig(tmp_path / "state.db", barrier_interval=60.0))
    rt.add_source("src", _NestedFailure)
    with pytest.raises(ActorFailedError) as info:
        async with rt:
            await rt.checkpoint()
    failure = info.value
    assert isinstance(failure.cause, ValueError)
    assert failure.__cause__ is failure.cause
    assert "ValueError: bad row" in str(failure)
    assert "TaskGroup" not in str(failure)


@pytest.mark.parametrize("writers", [1, 2])
@pytest.mark.anyio
async def test_the_failure_that_caused_the_others_is_the_one_raised(
    tmp_path: Path, writers: int
) -> None:
    # A misspelled split fails the source at its first barrier; its writers then see their
    # input end and leave, and the sink's coordinator, still aligning them, fails on that
    # (UnexpectedWriterRequestError). The source's error came first: it is the one raised.
    log = MemorySplitLog(PAYLOAD)
    log.append("a", {"v": [1, 2]})
    rt = Runtime(RuntimeConfig(tmp_path / "state.db", barrier_interval=60.0))
    rt.add_source("events", lambda: SplitSource(log, splits=["a", "zz"]))
    add_sink(rt, "out", ListTable(split_log_schema(PAYLOAD)), input="events", parallelism=writers)
    with anyio.fail_after(scaled(10)), pytest.raises(ActorFailedError) as info:
        async with rt:
            await rt.checkpoint()
    assert info.value.actor == "events"
    assert isinstance(info.value.cause, UnknownSplitError)
    assert info.value.cause.split == "zz"


@pytest.mark.anyio
async def test_single_error_keeps_the_leafs_own_cause() -> None:
    root = KeyError("the clue")

    async def fail() -> None:
        raise RuntimeError("outer") from root

    with pytest.raises(RuntimeError) as info, single_error():
        async with anyio.create_task_group() as tg:
            tg.start_soon(fail)
    assert info.value.__cause__ is root
    assert info.value.__traceback__ is not None


def test_schema_mismatch_message_renders_each_schema_on_one_line() -> None:
    expected = pa.schema([("user", pa.int64()), ("clicks", pa.int64())])
    actual = pa.schema([("user", pa.string())])
    error = SchemaMismatchError("batch", expected, actual)
    message = str(error)
    assert "\n" not in message
    assert "user: int64, clicks: int64" in message
    assert "user: string" in message
    assert (error.expected_schema, error.actual_schema, error.got) == (expected, actual, actual)
