"""The sink writer in a runtime: epochs from barriers, commit after durability, recovery."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from _timeouts import scaled

from barrierflow import (
    ActorFailedError,
    BarrierNotPassedError,
    ProtocolError,
    SinkConnectorError,
)
from barrierflow.actors import CommitMetadata, Coordinator, PendingCommit, SinkWriter
from barrierflow.channels import (
    Barrier,
    Chunk,
    Message,
    Op,
    Resume,
    Stop,
    Update,
    VnodeBitmap,
    create_channel,
)
from barrierflow.connectors import ParquetCommitter, ParquetFileSink
from barrierflow.errors import (
    BarrierflowError,
    CoordinatorMissingError,
    DuplicateWriterError,
    InvalidArgumentError,
    SchemaMismatchError,
    SinkWriterInputError,
)
from barrierflow.runtime import ActorContext, Fanout, Runtime, RuntimeConfig, StreamActor
from barrierflow.runtime.barrier_manager import BarrierManager
from barrierflow.runtime.startup import StartupContext
from barrierflow.runtime.state.state_store import StateStore

pytestmark = pytest.mark.anyio

SCHEMA = pa.schema([("id", pa.int64())])


def batch(*ids: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array(ids, pa.int64())], schema=SCHEMA)


def chunk(*ids: int) -> Chunk:
    return Chunk(batch(*ids))


def table_ids(path: Path) -> list[int]:
    if not path.exists():
        return []
    return sorted(ds.dataset(path, SCHEMA, format="parquet").to_table()["id"].to_pylist())


def config(tmp_path: Path, **kwargs: Any) -> RuntimeConfig:
    kwargs.setdefault("barrier_interval", 3600.0)  # barriers only when a test asks
    return RuntimeConfig(state_path=str(tmp_path / "state.db"), **kwargs)


class Faults:
    """Failures armed by a test, shared by every connector a factory makes."""

    def __init__(self) -> None:
        self.writes = 0
        self.pre_commits = 0
        self.commits = 0
        self.committed: anyio.Event | None = None  # set by the next commit, if a test asks
        self.tripped: anyio.Event | None = None  # set by the next injected failure
        self._waiters: list[tuple[Callable[[list[tuple[Any, ...]]], bool], anyio.Event]] = []

    def when(self, condition: Callable[[list[tuple[Any, ...]]], bool]) -> anyio.Event:
        """An event set once the recorded calls meet ``condition``."""
        event = anyio.Event()
        self._waiters.append((condition, event))
        return event

    def saw(self, calls: list[tuple[Any, ...]]) -> None:
        for condition, event in self._waiters:
            if condition(calls):
                event.set()


class Recording:
    """A connector that records its calls (and what the runtime had committed at each commit)
    around a real Parquet sink, failing on cue."""

    exactly_once = True

    def __init__(self, path: Path, faults: Faults, calls: list[tuple[Any, ...]]) -> None:
        self.inner = ParquetFileSink(path, SCHEMA)
        self.faults = faults
        self.calls = calls
        self.runtime: Runtime | None = None

    def _record(self, call: tuple[Any, ...]) -> None:
        self.calls.append(call)
        self.faults.saw(self.calls)

    @property
    def schema(self) -> pa.Schema:
        return SCHEMA

    async def open(self) -> None:
        await self.inner.open()

    async def recover(self, pending: Sequence[PendingCommit]) -> None:
        self._record(("recover", tuple(p.epoch for p in pending)))
        await self.inner.recover(pending)

    async def begin_epoch(self, epoch: int) -> None:
        self._record(("begin", epoch))
        await self.inner.begin_epoch(epoch)

    async def write_batch(self, batch: pa.RecordBatch) -> None:
        if self.faults.writes:
            self.faults.writes -= 1
            raise OSError("disk full")
        self._record(("write", batch.num_rows))
        await self.inner.write_batch(batch)

    async def flush(self) -> None:
        await self.inner.flush()

    async def pre_commit(self, epoch: int) -> CommitMetadata:
        if self.faults.pre_commits:
            self.faults.pre_commits -= 1
            raise OSError("fsync failed")
        self._record(("pre_commit", epoch))
        return await self.inner.pre_commit(epoch)

    async def commit_epoch(self, epoch: int) -> None:
        committed = None if self.runtime is None else self.runtime.committed_epoch
        if self.faults.commits:
            self.faults.commits -= 1
            if self.faults.tripped is not None:
                self.faults.tripped.set()
            raise OSError("rename failed")
        self._record(("commit", epoch, committed))
        await self.inner.commit_epoch(epoch)
        if self.faults.committed is not None:
            self.faults.committed.set()

    async def rollback_epoch(self, epoch: int) -> None:
        self._record(("rollback", epoch))
        await self.inner.rollback_epoch(epoch)

    async def close(self) -> None:
        await self.inner.close()


def sink_runtime(
    tmp_path: Path, faults: Faults, calls: list[tuple[Any, ...]], **kwargs: Any
) -> Runtime:
    rt = Runtime(config(tmp_path, **kwargs))
    rt.add_source("src")

    def make() -> Recording:
        connector = Recording(tmp_path / "table", faults, calls)
        connector.runtime = rt
        return connector

    rt.add_actor("sink", lambda: SinkWriter(make, flush_interval=60.0), inputs=["src"])
    return rt


async def test_epochs_begin_at_initial_barrier_and_after_each_checkpoint(tmp_path: Path) -> None:
    calls: list[tuple[Any, ...]] = []
    rt = sink_runtime(tmp_path, Faults(), calls)
    async with rt:
        await rt.push("src", chunk(1, 2))
        first = await rt.checkpoint()
        await rt.push("src", chunk(3))
        second = await rt.checkpoint()
    kinds = [c[0] for c in calls]
    assert kinds[:5] == ["recover", "begin", "write", "pre_commit", "begin"]
    begins = [c[1] for c in calls if c[0] == "begin"]
    pre_commits = [c[1] for c in calls if c[0] == "pre_commit"]
    # Each sink epoch is named by the epoch that opened it and closed by the next checkpoint.
    assert begins[0] == first
    assert begins[1] == second
    assert pre_commits[:2] == begins[:2]
    assert table_ids(tmp_path / "table") == [1, 2, 3]


async def test_the_writers_options_reach_its_sink_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import barrierflow.actors.sinks.sink_writer as sink_writer

    started: list[tuple[object, ...]] = []
    start = sink_writer.start_sink_task

    async def recording(*args: Any, **kwargs: Any) -> Any:
        started.append(tuple(kwargs.get(k) for k in ("name", "capacity", "flush_interval")))
        return await start(*args, **kwargs)

    monkeypatch.setattr(sink_writer, "start_sink_task", recording)
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    parquet = ParquetFileSink(tmp_path / "t", SCHEMA)
    writer = lambda: SinkWriter(parquet, capacity=3, flush_interval=7.5)  # noqa: E731
    rt.add_actor("sink", writer, inputs=["src"])
    async with rt:
        await rt.checkpoint()
    assert started == [("sink", 3, 7.5)]


async def test_commit_waits_until_checkpoint_is_durable(tmp_path: Path) -> None:
    calls: list[tuple[Any, ...]] = []
    faults = Faults()
    faults.committed = anyio.Event()
    rt = sink_runtime(tmp_path, faults, calls)
    async with rt:
        await rt.push("src", chunk(1))
        durable = await rt.checkpoint()
        with anyio.fail_after(scaled(5)):
            await faults.committed.wait()
    commits = [c for c in calls if c[0] == "commit"]
    epoch, committed_at_commit = commits[0][1], commits[0][2]
    assert epoch <= durable
    assert committed_at_commit >= durable  # never before the checkpoint was durable


async def test_only_visible_rows_are_written(tmp_path: Path) -> None:
    calls: list[tuple[Any, ...]] = []
    rt = sink_runtime(tmp_path, Faults(), calls)
    async with rt:
        await rt.push("src", chunk(1, 2, 3, 4).with_visibility([True, False, True, False]))
        await rt.push("src", chunk(5).with_visibility([False]))  # nothing visible: no write
        await rt.checkpoint()
    assert [c for c in calls if c[0] == "write"] == [("write", 2)]
    assert table_ids(tmp_path / "table") == [1, 3]


async def test_delete_rows_are_refused_by_an_append_only_sink(tmp_path: Path) -> None:
    rt = sink_runtime(tmp_path, Faults(), [])
    with pytest.raises(ActorFailedError) as info:
        async with rt:
            await rt.push("src", chunk(1, 2).with_ops([Op.INSERT, Op.DELETE]))
            await rt.checkpoint()
    assert isinstance(info.value.cause, ProtocolError)


async def test_failed_pre_commit_rolls_back_and_fails_the_writer(tmp_path: Path) -> None:
    calls: list[tuple[Any, ...]] = []
    faults = Faults()
    faults.pre_commits = 1
    rt = sink_runtime(tmp_path, faults, calls)
    with pytest.raises(ActorFailedError) as info:
        async with rt:
            await rt.push("src", chunk(1))
            await rt.checkpoint()
    assert info.value.actor == "sink"
    assert isinstance(info.value.cause, SinkConnectorError)
    assert info.value.cause.operation == "pre_commit"
    begun = next(c[1] for c in calls if c[0] == "begin")
    assert ("rollback", begun) in calls
    assert table_ids(tmp_path / "table") == []
    assert not any((tmp_path / "table" / ".staging").iterdir())


async def test_failed_write_poisons_epoch_and_recovery_takes_replayed_rows_once(
    tmp_path: Path,
) -> None:
    calls: list[tuple[Any, ...]] = []
    faults = Faults()
    faults.writes = 1
    rt = sink_runtime(tmp_path, faults, calls, recovery=True, restart_backoff=0.01)
    async with rt:
        await rt.push("src", chunk(1))
        await rt.push("src", chunk(2))  # this write fails: the epoch is poisoned
        with pytest.raises(ActorFailedError) as info:
            await rt.checkpoint()  # pre-commit refuses the poisoned epoch
        assert info.value.cause.__class__.__name__ == "EpochPoisonedError"
        await rt.push("src", chunk(1))  # the driver replays the unacknowledged rows
        await rt.push("src", chunk(2))
        await rt.checkpoint()
    assert table_ids(tmp_path / "table") == [1, 2]


async def test_failed_commit_shows_no_rows_and_recovery_commits_them(tmp_path: Path) -> None:
    calls: list[tuple[Any, ...]] = []
    faults = Faults()
    faults.commits = 1
    faults.tripped = anyio.Event()
    rt = sink_runtime(tmp_path, faults, calls, recovery=True, restart_backoff=0.05)
    async with rt:
        await rt.push("src", chunk(1, 2))
        await rt.checkpoint()  # durable: the rows are acknowledged
        with anyio.fail_after(scaled(5)):
            await faults.tripped.wait()
        assert table_ids(tmp_path / "table") == []  # the failed commit exposed nothing
        for _ in range(3):  # the first may still meet the failing graph
            with contextlib.suppress(ActorFailedError):
                await rt.checkpoint()  # the rebuilt writer recovers before passing it
                break
        assert table_ids(tmp_path / "table") == [1, 2]
        recoveries = [c for c in calls if c[0] == "recover"]
        assert len(recoveries) == 2
        assert len(recoveries[1][1]) == 1  # the failed epoch, handed to recover
    assert table_ids(tmp_path / "table") == [1, 2]


async def test_graceful_stop_commits_the_last_epoch(tmp_path: Path) -> None:
    rt = sink_runtime(tmp_path, Faults(), [])
    async with rt:
        await rt.push("src", chunk(7, 8))
    assert table_ids(tmp_path / "table") == [7, 8]
    assert not any((tmp_path / "table" / ".staging").iterdir())


async def test_restart_after_abrupt_stop_commits_durable_and_drops_the_rest(
    tmp_path: Path,
) -> None:
    faults = Faults()
    faults.commits = 1  # the commit after the durable checkpoint never happens in run 1

    class SimulatedCrashError(Exception):
        pass

    rt = sink_runtime(tmp_path, faults, [])
    with pytest.raises(SimulatedCrashError):
        async with rt:
            await rt.push("src", chunk(1, 2))
            await rt.checkpoint()
            await rt.push("src", chunk(3))  # staged, never checkpointed
            raise SimulatedCrashError
    assert table_ids(tmp_path / "table") == []
    again = sink_runtime(tmp_path, Faults(), [])
    async with again:
        await again.checkpoint()
    assert table_ids(tmp_path / "table") == [1, 2]
    assert not any((tmp_path / "table" / ".staging").iterdir())


def test_writer_rejects_a_non_connector() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        SinkWriter(42)  # type: ignore[arg-type]
    assert info.value.argument == "connector"


async def test_wait_committed_returns_once_rows_are_visible(tmp_path: Path) -> None:
    writers: list[SinkWriter] = []

    def make() -> SinkWriter:
        writers.append(SinkWriter(lambda: ParquetFileSink(tmp_path / "table", SCHEMA)))
        return writers[-1]

    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    rt.add_actor("sink", make, inputs=["src"])
    async with rt:
        await rt.push("src", chunk(4, 5))
        durable = await rt.checkpoint()
        with anyio.fail_after(scaled(5)):
            await writers[-1].wait_committed(durable)
        assert writers[-1].committed_checkpoint >= durable
        assert table_ids(tmp_path / "table") == [4, 5]


# --- Bad input and wiring: typed errors, every field checked ---------------------------------


class NotAConnector:
    pass


def coordinator_for(tmp_path: Path, sink: str = "orders") -> Coordinator:
    return Coordinator(sink, ParquetCommitter(tmp_path / sink))


def test_bad_constructor_arguments_get_typed_errors(tmp_path: Path) -> None:
    parquet = ParquetFileSink(tmp_path / "t", SCHEMA)
    cases: list[tuple[dict[str, Any], tuple[str, str, object]]] = [
        ({"connector": parquet, "coordinator": 42}, ("coordinator", "None or a Coordinator", 42)),
        ({"connector": 42}, ("connector", "a SinkConnector or a factory of one", "int")),
        ({"connector": parquet, "name": ""}, ("name", "a non-empty str", "")),
    ]
    for kwargs, (argument, expected, got) in cases:
        with pytest.raises(InvalidArgumentError) as info:
            SinkWriter(**kwargs)
        assert type(info.value) is InvalidArgumentError
        assert (info.value.argument, info.value.expected, info.value.got) == (
            argument,
            expected,
            got,
        )


def test_the_startup_path_check_names_the_writer_else_its_actor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked: list[str] = []
    monkeypatch.setattr(ParquetFileSink, "check_path", lambda _self, sink: checked.append(sink))
    for name in (None, "orders"):
        writer = SinkWriter(ParquetFileSink(tmp_path / "t", SCHEMA), name=name)
        writer.check_startup(StartupContext("w0", {}, {}))
    assert checked == ["w0", "orders"]


class Schemaless(Recording):
    """A connector whose schema is not a pyarrow schema (refused when its sink task starts)."""

    @property
    def schema(self) -> pa.Schema:
        return "x: int32"  # type: ignore[return-value]


def test_the_input_schema_checked_at_start_is_the_connectors_if_it_has_one(
    tmp_path: Path,
) -> None:
    assert SinkWriter(ParquetFileSink(tmp_path / "t", SCHEMA)).input_schema() == SCHEMA
    schemaless = Schemaless(tmp_path / "u", Faults(), [])
    assert SinkWriter(schemaless).input_schema() is None  # nothing to check the input by


def test_a_factory_must_return_a_connector() -> None:
    writer = SinkWriter(NotAConnector)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError) as info:
        writer.check_startup(StartupContext("sink", {}, {}))
    assert type(info.value) is InvalidArgumentError
    assert (info.value.argument, info.value.expected, info.value.got) == (
        "connector",
        "a factory returning a SinkConnector",
        "NotAConnector",
    )


def wiring_cases(tmp_path: Path) -> list[tuple[SinkWriter, StartupContext, BaseException]]:
    """(writer, its startup context, the error it must raise) for every wiring mistake."""
    orders = coordinator_for(tmp_path)
    services = {"coord": orders}

    def parquet(writer: str | None) -> ParquetFileSink:
        return ParquetFileSink(tmp_path / "t", SCHEMA, writer=writer)

    return [
        (  # a writer id, and no coordinator to commit its files
            SinkWriter(parquet("7")),
            StartupContext("w0", {}, {}),
            InvalidArgumentError(
                "sink writer 'w0'",
                "coordinator= for a connector made with writer= (a parallel writer of a "
                "coordinated sink), or a connector without writer=",
                "writer='7' and no coordinator",
            ),
        ),
        (  # a coordinator the runtime does not run
            SinkWriter(parquet("7"), coordinator=orders),
            StartupContext("w0", {"other": object(), "more": object()}, {}),
            CoordinatorMissingError(
                "w0",
                "orders",
                "its Coordinator for sink 'orders' added to the runtime with "
                "rt.add_service(name, coordinator)",
                "services ['more', 'other']",
            ),
        ),
        (  # a coordinated connector without a writer id
            SinkWriter(parquet(None), coordinator=orders),
            StartupContext("w0", services, {}),
            InvalidArgumentError(
                "sink writer 'w0'",
                "writer=<unique id> on the connector of each parallel writer of a coordinated "
                "sink (their files are staged per writer)",
                "a connector without writer=",
            ),
        ),
        (  # a parallel sibling without the coordinator
            SinkWriter(parquet("7"), coordinator=orders),
            StartupContext("w0", services, {"w1": SinkWriter(parquet(None))}),
            CoordinatorMissingError(
                "w1",
                None,
                "coordinator= like its parallel sibling 'w0' (sink 'orders')",
                "no coordinator",
            ),
        ),
        (  # two siblings staging files under one writer id
            SinkWriter(parquet("7"), coordinator=orders),
            StartupContext("w1", services, {"w0": SinkWriter(parquet("7"), coordinator=orders)}),
            DuplicateWriterError("orders", "7", "w0", "w1"),
        ),
    ]


def fields(error: BaseException) -> dict[str, object]:
    return {"type": type(error), "str": str(error), **vars(error)}


def test_wiring_mistakes_are_refused_at_startup_with_every_field(tmp_path: Path) -> None:
    for writer, ctx, expected in wiring_cases(tmp_path):
        with pytest.raises(BarrierflowError) as info:
            writer.check_startup(ctx)
        assert fields(info.value) == fields(expected)


def test_startup_check_skips_siblings_that_are_not_sink_writers(tmp_path: Path) -> None:
    orders = coordinator_for(tmp_path)
    mine = SinkWriter(ParquetFileSink(tmp_path / "t", SCHEMA, writer="0"), coordinator=orders)
    uncoordinated = SinkWriter(ParquetFileSink(tmp_path / "u", SCHEMA))
    # A non-writer sibling first: the writer after it is still checked.
    siblings = {"a_map": object(), "w1": uncoordinated}
    with pytest.raises(CoordinatorMissingError) as info:
        mine.check_startup(StartupContext("w0", {"coord": orders}, siblings))
    assert (info.value.writer, info.value.sink) == ("w1", None)


def test_writers_of_different_coordinators_may_share_a_writer_id(tmp_path: Path) -> None:
    orders, refunds = coordinator_for(tmp_path, "orders"), coordinator_for(tmp_path, "refunds")
    mine = SinkWriter(ParquetFileSink(tmp_path / "o", SCHEMA, writer="0"), coordinator=orders)
    other = SinkWriter(ParquetFileSink(tmp_path / "r", SCHEMA, writer="0"), coordinator=refunds)
    services = {"orders": orders, "refunds": refunds}
    mine.check_startup(StartupContext("w1", services, {"w0": other}))


def test_a_sibling_connector_without_writer_attribute_is_no_duplicate(tmp_path: Path) -> None:
    orders = coordinator_for(tmp_path)
    mine = SinkWriter(ParquetFileSink(tmp_path / "o", SCHEMA, writer="0"), coordinator=orders)
    other = SinkWriter(Recording(tmp_path / "r", Faults(), []), coordinator=orders)
    mine.check_startup(StartupContext("w1", {"orders": orders}, {"w0": other}))


def test_only_the_later_of_two_duplicate_writers_reports_them(tmp_path: Path) -> None:
    orders = coordinator_for(tmp_path)
    first = SinkWriter(ParquetFileSink(tmp_path / "o", SCHEMA, writer="0"), coordinator=orders)
    second = SinkWriter(ParquetFileSink(tmp_path / "o", SCHEMA, writer="0"), coordinator=orders)
    first.check_startup(StartupContext("w0", {"orders": orders}, {"w1": second}))
    with pytest.raises(DuplicateWriterError):
        second.check_startup(StartupContext("w1", {"orders": orders}, {"w0": first}))


# --- In a runtime ------------------------------------------------------------------------------


class Gate(StreamActor):
    """A branch beside the writer that holds every barrier after the first until ``opened``:
    no later checkpoint becomes durable before the test says so."""

    def __init__(self, opened: anyio.Event) -> None:
        self.opened = opened
        self.barriers = 0

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Barrier):
            self.barriers += 1
            if self.barriers > 1:
                await self.opened.wait()
        await ctx.emit(message)


def recording_runtime(
    tmp_path: Path,
    calls: list[tuple[Any, ...]],
    writers: list[SinkWriter] | None = None,
    *,
    upstream: type[StreamActor] | None = None,
    faults: Faults | None = None,
    **kwargs: Any,
) -> Runtime:
    """A source, maybe an actor after it, and a writer into a Recording connector; plain
    barriers unless a test asks for a checkpoint (``checkpoint_frequency``)."""
    kwargs.setdefault("checkpoint_frequency", 1000)
    writer_kwargs = kwargs.pop("writer", {})
    gate: anyio.Event | None = kwargs.pop("gate", None)
    rt = Runtime(config(tmp_path, **kwargs))
    rt.add_source("src")
    if gate is not None:
        rt.add_actor("gate", lambda: Gate(gate), inputs=["src"])
    if upstream is not None:
        rt.add_actor("up", upstream, inputs=["src"])
    shared = faults or Faults()

    def make() -> SinkWriter:
        writer = SinkWriter(
            lambda: Recording(tmp_path / "table", shared, calls),
            flush_interval=60.0,
            **writer_kwargs,
        )
        if writers is not None:
            writers.append(writer)
        return writer

    rt.add_actor("sink", make, inputs=["up" if upstream is not None else "src"])
    return rt


async def test_stats_are_none_until_the_writer_runs_then_count_under_its_name(
    tmp_path: Path,
) -> None:
    writers: list[SinkWriter] = []
    rt = recording_runtime(tmp_path, [], writers, writer={"name": "orders"})
    assert SinkWriter(lambda: Recording(tmp_path / "x", Faults(), [])).stats() is None
    async with rt:
        await rt.push("src", chunk(1, 2))
        await rt.checkpoint()
        stats = writers[-1].stats()
        assert stats is not None
        assert (stats.name, stats.rows_written) == ("orders", 2)


@pytest.mark.parametrize(("setting", "value"), [("capacity", 0), ("flush_interval", -1.0)])
async def test_the_sink_task_settings_reach_the_sink_task(
    tmp_path: Path, setting: str, value: object
) -> None:
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    factory = lambda: Recording(tmp_path / "table", Faults(), [])  # noqa: E731
    rt.add_actor("sink", lambda: SinkWriter(factory, **{setting: value}), inputs=["src"])
    with pytest.raises(ActorFailedError) as info:
        async with rt:
            await rt.checkpoint()
    assert isinstance(info.value.cause, InvalidArgumentError)
    assert (info.value.cause.argument, info.value.cause.got) == (setting, value)


class RowsFirst(StreamActor):
    """Emits a row before passing any barrier: a broken upstream."""

    async def run(self, ctx: ActorContext) -> None:
        await ctx.emit(chunk(9))
        async for message in ctx.messages():
            await ctx.emit(message)


async def test_an_upstream_emitting_rows_before_its_first_barrier_is_blamed_not_the_writer(
    tmp_path: Path,
) -> None:
    calls: list[tuple[Any, ...]] = []
    rt = recording_runtime(tmp_path, calls, upstream=RowsFirst)
    with pytest.raises(ActorFailedError) as info:
        async with rt:
            await rt.checkpoint()
    assert info.value.actor == "up"
    assert isinstance(info.value.cause, BarrierNotPassedError)
    assert not [c for c in calls if c[0] == "write"]


async def test_rows_before_any_barrier_fail_the_writer_with_every_field(tmp_path: Path) -> None:
    """The writer's own guard, for a graph built by hand (the runtime's contexts already refuse
    such rows in the upstream, above)."""
    calls: list[tuple[Any, ...]] = []
    store = await StateStore.open(tmp_path / "s.db")
    try:
        tx, rx = create_channel[Message](4)
        manager = BarrierManager(
            store, {1: tx}, {1}, barrier_interval=1.0, checkpoint_frequency=1, max_in_flight=2
        )
        ctx = ActorContext(1, "sink", rx, None, store, manager)
        writer = SinkWriter(lambda: Recording(tmp_path / "table", Faults(), calls))
        await tx.send(chunk(9))
        with anyio.fail_after(scaled(30)), pytest.raises(SinkWriterInputError) as info:
            await writer.run(ctx)
    finally:
        await store.aclose()
    cause = info.value
    expected = "a barrier to begin an epoch before rows"
    assert (cause.writer, cause.expected, cause.got) == ("sink", expected, "rows")
    assert str(cause) == f"sink writer 'sink': expected {expected}, got rows"
    assert not [c for c in calls if c[0] == "write"]


async def test_deletes_into_an_append_only_sink_fail_the_writer_with_every_field(
    tmp_path: Path,
) -> None:
    calls: list[tuple[Any, ...]] = []
    rt = recording_runtime(tmp_path, calls)
    expected = "insert-only chunks (the sink is append-only)"
    got = "2 delete/update row(s)"
    with pytest.raises(ActorFailedError) as info:
        async with rt:
            await rt.push("src", chunk(1, 2, 3).with_ops([Op.INSERT, Op.DELETE, Op.UPDATE_INSERT]))
            await rt.checkpoint()
    cause = info.value.cause
    assert isinstance(cause, SinkWriterInputError)
    assert (cause.writer, cause.expected, cause.got) == ("sink", expected, got)
    assert str(cause) == f"sink writer 'sink': expected {expected}, got {got}"
    assert not [c for c in calls if c[0] == "write"]


async def test_a_plain_barrier_neither_closes_nor_begins_a_sink_epoch(tmp_path: Path) -> None:
    calls: list[tuple[Any, ...]] = []
    rt = recording_runtime(tmp_path, calls)
    async with rt:
        await rt.push("src", chunk(1))
        await rt.mutate(Resume())  # a plain barrier
        await rt.push("src", chunk(2))
        durable = await rt.checkpoint()
        epochs = [c for c in calls if c[0] in ("begin", "pre_commit")]
        # One sink epoch across the plain barrier, closed by the checkpoint that follows.
        assert [c[0] for c in epochs] == ["begin", "pre_commit", "begin"]
        assert epochs[0][1] == epochs[1][1] < durable < epochs[2][1]
    assert table_ids(tmp_path / "table") == [1, 2]


async def test_a_stop_on_a_plain_barrier_rolls_back_the_open_epoch(tmp_path: Path) -> None:
    calls: list[tuple[Any, ...]] = []
    rt = recording_runtime(tmp_path, calls)
    async with rt:
        await rt.push("src", chunk(1))
        await rt.mutate(Stop(frozenset({rt.actor_id("sink")})))
    begun = next(c[1] for c in calls if c[0] == "begin")
    assert ("rollback", begun) in calls
    assert not [c for c in calls if c[0] in ("pre_commit", "commit")]
    assert table_ids(tmp_path / "table") == []


async def test_a_refused_write_rolls_back_the_open_epoch(tmp_path: Path) -> None:
    calls: list[tuple[Any, ...]] = []
    rt = recording_runtime(tmp_path, calls)
    other = pa.schema([("id", pa.int32())])
    with pytest.raises(ActorFailedError) as info:
        async with rt:
            await rt.push("src", Chunk(pa.record_batch([pa.array([1], pa.int32())], schema=other)))
            await rt.checkpoint()
    assert isinstance(info.value.cause, SchemaMismatchError)
    begun = next(c[1] for c in calls if c[0] == "begin")
    assert ("rollback", begun) in calls
    assert table_ids(tmp_path / "table") == []


def begins(calls: list[tuple[Any, ...]]) -> list[int]:
    return [c[1] for c in calls if c[0] == "begin"]


async def suppressed(call: Callable[[], Awaitable[object]]) -> None:
    with contextlib.suppress(ActorFailedError):
        await call()


async def open_a_second_epoch_before_the_first_is_durable(
    rt: Runtime, faults: Faults, tg: anyio.abc.TaskGroup
) -> None:
    """Rows in epoch 1, its checkpoint (held by the gate), rows written in epoch 2."""
    second_begun = faults.when(lambda calls: len(begins(calls)) == 2)
    second_written = faults.when(lambda calls: [c[0] for c in calls].count("write") == 2)
    await rt.push("src", chunk(1))
    tg.start_soon(suppressed, rt.checkpoint)
    with anyio.fail_after(scaled(5)):
        await second_begun.wait()
    await rt.push("src", chunk(2))
    with anyio.fail_after(scaled(5)):
        await second_written.wait()  # the writer holds epoch 2 open


async def test_a_failed_commit_rolls_back_the_open_epoch(tmp_path: Path) -> None:
    calls: list[tuple[Any, ...]] = []
    faults, opened = Faults(), anyio.Event()
    faults.commits = 1
    rt = recording_runtime(tmp_path, calls, faults=faults, gate=opened)
    with pytest.raises(ActorFailedError) as info:
        async with rt, anyio.create_task_group() as tg:
            await open_a_second_epoch_before_the_first_is_durable(rt, faults, tg)
            opened.set()  # epoch 1 becomes durable; its commit fails
            with anyio.fail_after(scaled(10)):
                await anyio.sleep_forever()
    assert isinstance(info.value.cause, SinkConnectorError)
    assert info.value.cause.operation == "commit_epoch"
    first, second = begins(calls)
    assert ("rollback", second) in calls  # the replayed rows' epoch
    assert ("rollback", first) not in calls  # pre-committed and durable: recovery commits it


async def test_an_epoch_rolled_back_at_a_stop_is_not_rolled_back_again(tmp_path: Path) -> None:
    calls: list[tuple[Any, ...]] = []
    faults, opened = Faults(), anyio.Event()
    faults.commits = 1
    rt = recording_runtime(tmp_path, calls, faults=faults, gate=opened)
    with pytest.raises(ActorFailedError) as info:
        async with rt, anyio.create_task_group() as tg:
            await open_a_second_epoch_before_the_first_is_durable(rt, faults, tg)
            rolled_back = faults.when(lambda calls: calls[-1][0] == "rollback")
            stop = Stop(frozenset({rt.actor_id("sink")}))
            tg.start_soon(suppressed, lambda: rt.mutate(stop))  # a plain barrier
            with anyio.fail_after(scaled(5)):
                await rolled_back.wait()
            opened.set()  # the stopped writer waits for epoch 1's commit, which fails
            with anyio.fail_after(scaled(10)):
                await anyio.sleep_forever()
    assert isinstance(info.value.cause, SinkConnectorError)
    assert info.value.cause.operation == "commit_epoch"
    assert [c for c in calls if c[0] == "rollback"] == [("rollback", begins(calls)[1])]


async def test_a_coordinated_writer_registers_its_connectors_writer_id(tmp_path: Path) -> None:
    # The coordinator refuses a second registration under the writer's id: it knows the id.
    coordinator = Coordinator("orders", ParquetCommitter(tmp_path / "table"))
    rt = Runtime(config(tmp_path))
    rt.add_source("src", fanout=Fanout("hash", ("id",)))
    rt.add_service("coordinator", coordinator)
    for i in range(2):
        rt.add_actor(
            f"writer{i}",
            lambda i=i: SinkWriter(
                lambda: ParquetFileSink(tmp_path / "table", SCHEMA, writer=str(i)),
                coordinator=coordinator,
            ),
            inputs=["src"],
        )
    halves = VnodeBitmap.split(2)
    with pytest.raises(ActorFailedError) as info:
        async with rt:
            await rt.checkpoint()  # both writers registered and started
            await coordinator.register(halves[0], writer="0", name="intruder")
            # A rescale makes the coordinator admit the new registration beside the writers.
            ids = [rt.actor_id("writer0"), rt.actor_id("writer1")]
            with anyio.fail_after(scaled(10)):
                await rt.mutate(Update(vnode_bitmaps=dict(zip(ids, halves, strict=True))))
    cause = info.value.cause
    assert isinstance(cause, DuplicateWriterError)
    assert (cause.sink, cause.writer, cause.first, cause.second) == (
        "orders",
        "0",
        "writer0",
        "intruder",
    )


async def test_a_pre_committed_epoch_is_recorded_in_the_writers_sink_table(
    tmp_path: Path,
) -> None:
    # The record is what recovery reads back from a store written earlier (maybe by an older
    # version): its table, key and fields are part of the store's format.
    calls: list[tuple[Any, ...]] = []
    faults = Faults()
    faults.commits = 1
    rt = recording_runtime(tmp_path, calls, faults=faults)
    with pytest.raises(ActorFailedError):
        async with rt:
            await rt.push("src", chunk(1, 2))
            with contextlib.suppress(ActorFailedError):
                await rt.checkpoint()
            with anyio.fail_after(scaled(10)):
                await anyio.sleep_forever()  # the commit fails
    epoch = begins(calls)[0]
    async with await StateStore.open(tmp_path / "state.db") as store:
        records = await store.read_all("sink", "sink")
    # Closed by the first checkpoint barrier, whose prev epoch is the one the sink epoch opened.
    metadata = {"epoch": epoch, "files": ["part-00000.parquet"], "rows": 2}
    assert records == {f"{epoch:020d}": {"epoch": epoch, "checkpoint": epoch, "metadata": metadata}}


class Forward(StreamActor):
    """Passes everything on; a Stop for it alone ends the writer's input."""


async def test_a_writer_whose_input_ends_commits_its_durable_epochs(tmp_path: Path) -> None:
    # The upstream is stopped alone: the writer's input ends after a checkpoint barrier, with
    # no Stop for the writer. The epoch that barrier closed is committed once durable (not left
    # for a restart's recovery), so the rows are visible when the runtime has stopped.
    calls: list[tuple[Any, ...]] = []
    faults, opened = Faults(), anyio.Event()
    rt = recording_runtime(
        tmp_path, calls, upstream=Forward, checkpoint_frequency=1, faults=faults, gate=opened
    )
    second_begun = faults.when(lambda calls: len(begins(calls)) == 2)
    async with rt, anyio.create_task_group() as tg:
        await rt.push("src", chunk(1, 2))
        tg.start_soon(suppressed, lambda: rt.mutate(Stop(frozenset({rt.actor_id("up")}))))
        with anyio.fail_after(scaled(5)):
            await second_begun.wait()
        await anyio.wait_all_tasks_blocked()  # the writer met the end of its input
        opened.set()  # now the checkpoint becomes durable
    first = begins(calls)[0]
    assert ("commit", first, None) in calls
    assert table_ids(tmp_path / "table") == [1, 2]
