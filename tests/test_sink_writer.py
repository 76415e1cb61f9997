"""The sink writer in a runtime: epochs from barriers, staging through its sink task, its
coordinator committing each epoch once the checkpoint is durable, recovery."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from _timeouts import scaled

from barrierflow.actors import Coordinator
from barrierflow.actors.sinks.coordinator.meta_store import SinkState, SinkStates
from barrierflow.actors.sinks.sink_writer import SinkWriter
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
from barrierflow.connectors import ParquetStagingWriter, ParquetTable
from barrierflow.errors import (
    ActorFailedError,
    BarrierflowError,
    BarrierNotPassedError,
    CoordinatorMissingError,
    DuplicateWriterError,
    InvalidArgumentError,
    ProtocolError,
    SchemaMismatchError,
    SinkConnectorError,
    SinkWriterInputError,
)
from barrierflow.runtime import ActorContext, Fanout, Runtime, RuntimeConfig, StreamActor
from barrierflow.runtime.barrier_manager import BarrierManager
from barrierflow.runtime.startup import StartupContext
from barrierflow.runtime.state.state_store import StateStore
from barrierflow.testing import FailingTable, ListTable

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


def staged_files(path: Path) -> list[Path]:
    return sorted((path / ".staging").rglob("*.parquet"))


def config(tmp_path: Path, **kwargs: Any) -> RuntimeConfig:
    kwargs.setdefault("barrier_interval", 3600.0)  # barriers only when a test asks
    return RuntimeConfig(state_path=str(tmp_path / "state.db"), **kwargs)


def faulty(tmp_path: Path) -> FailingTable:
    """A Parquet table under ``tmp_path / "table"`` whose calls are recorded, failing on cue."""
    return FailingTable(ParquetTable(tmp_path / "table", SCHEMA))


def declare(
    rt: Runtime,
    table: Any,
    writers: list[SinkWriter] | None = None,
    *,
    name: str = "sink",
    inputs: tuple[str, ...] = ("src",),
    **writer_kwargs: Any,
) -> Coordinator:
    """One writer ``name`` (writer id "0") of ``table``, with its coordinator service."""
    coordinator = Coordinator(name, table.committer())
    rt.add_service(f"{name}.coordinator", coordinator)
    writer_kwargs.setdefault("flush_interval", 60.0)

    def make() -> SinkWriter:
        writer = SinkWriter(
            lambda: table.writer("0"), coordinator=coordinator, writer_id="0", **writer_kwargs
        )
        if writers is not None:
            writers.append(writer)
        return writer

    rt.add_actor(name, make, inputs=list(inputs))
    return coordinator


def sink_runtime(tmp_path: Path, table: Any, **kwargs: Any) -> Runtime:
    rt = Runtime(config(tmp_path, **kwargs))
    rt.add_source("src")
    declare(rt, table)
    return rt


def writer_calls(table: FailingTable) -> list[tuple[str, Any]]:
    return [c for c in table.calls if c[0] in ("begin", "write", "stage", "discard")]


def begins(table: FailingTable) -> list[int]:
    return table.called("begin")


async def test_epochs_begin_at_initial_barrier_and_after_each_checkpoint(tmp_path: Path) -> None:
    table = faulty(tmp_path)
    rt = sink_runtime(tmp_path, table)
    async with rt:
        await rt.push("src", chunk(1, 2))
        first = await rt.checkpoint()
        await rt.push("src", chunk(3))
        second = await rt.checkpoint()
    kinds = [c[0] for c in writer_calls(table)]
    assert kinds[:4] == ["begin", "write", "stage", "begin"]
    assert table.called("open") == [None]
    # Each sink epoch is named by the epoch that opened it and closed by the next checkpoint.
    assert begins(table)[:2] == [first, second]
    assert table.called("stage")[:2] == [first, second]
    # The coordinator prepares and commits each checkpoint once, after its recovery.
    assert table.called("recover") == [()]
    assert table.called("prepare")[:2] == [first, second]
    assert table.called("commit")[:2] == [first, second]
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
    declare(rt, ListTable(SCHEMA), capacity=3, flush_interval=7.5)
    async with rt:
        await rt.checkpoint()
    assert started == [("sink", 3, 7.5)]


async def test_commit_waits_until_checkpoint_is_durable(tmp_path: Path) -> None:
    table = faulty(tmp_path)
    table.hang("commit")
    rt = sink_runtime(tmp_path, table)
    async with rt:
        await rt.push("src", chunk(1))
        durable = await rt.checkpoint()
        with anyio.fail_after(scaled(5)):
            await table.wait_called("commit")
        [epoch] = table.called("commit")
        assert epoch <= durable
        assert rt.committed_epoch >= epoch  # never before the checkpoint was durable
        assert table_ids(tmp_path / "table") == []  # staged and durable, not committed yet
        table.release("commit")
    assert table_ids(tmp_path / "table") == [1]


async def test_a_single_writer_shows_rows_only_once_their_checkpoint_is_durable(
    tmp_path: Path,
) -> None:
    # One writer runs a coordinator too: staging and acknowledging make nothing visible.
    inner = ListTable(SCHEMA)
    table = FailingTable(inner)
    opened = anyio.Event()
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    rt.add_actor("gate", lambda: Gate(opened), inputs=["src"])
    writers: list[SinkWriter] = []
    declare(rt, table, writers)
    async with rt, anyio.create_task_group() as tg:
        await rt.push("src", chunk(1, 2))
        epochs: list[int] = []

        async def checkpoint() -> None:
            epochs.append(await rt.checkpoint())

        tg.start_soon(checkpoint)
        with anyio.fail_after(scaled(5)):
            await table.wait_called("prepare")
        await anyio.wait_all_tasks_blocked()  # the writer passed its barrier; the gate holds
        [staged] = table.called("stage")
        assert table.called("prepare") == [staged]  # acknowledged: recorded as pending
        assert table.called("commit") == []
        assert inner.committed == {}  # staged, acknowledged, not durable: invisible
        assert epochs == []
        opened.set()
        with anyio.fail_after(scaled(5)):
            await table.wait_called("commit")
            await writers[-1].wait_committed(staged)
        assert table.called("commit") == [staged]
        assert rt.committed_epoch >= staged
        assert inner.rows()["id"].to_pylist() == [1, 2]


async def test_only_visible_rows_are_written(tmp_path: Path) -> None:
    table = faulty(tmp_path)
    rt = sink_runtime(tmp_path, table)
    async with rt:
        await rt.push("src", chunk(1, 2, 3, 4).with_visibility([True, False, True, False]))
        await rt.push("src", chunk(5).with_visibility([False]))  # nothing visible: no write
        await rt.checkpoint()
    assert table.called("write") == [2]
    assert table_ids(tmp_path / "table") == [1, 3]


async def test_rows_declared_not_null_go_into_a_nullable_column_as_the_tables(
    tmp_path: Path,
) -> None:
    # An operator declares its key columns not null; the table's column may take nulls. The
    # writer relabels the batch with the table's schema (no copy); another type is refused.
    table = ListTable(SCHEMA)
    rt = sink_runtime(tmp_path, table)
    strict = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata={b"k": b"v"})])
    async with rt:
        await rt.push("src", Chunk(pa.record_batch([pa.array([1, 2], pa.int64())], schema=strict)))
        await rt.checkpoint()
    assert table.rows().schema == SCHEMA
    assert table.rows().column("id").to_pylist() == [1, 2]
    other = sink_runtime(tmp_path / "other", ListTable(SCHEMA))
    with pytest.raises(ActorFailedError) as info:
        async with other:
            wide = pa.record_batch([pa.array([1], pa.int32())], names=["id"])
            await other.push("src", Chunk(wide))
            await other.checkpoint()
    assert isinstance(info.value.cause, SchemaMismatchError)


async def test_delete_rows_are_refused_by_an_append_only_sink(tmp_path: Path) -> None:
    rt = sink_runtime(tmp_path, ListTable(SCHEMA))
    with pytest.raises(ActorFailedError) as info:
        async with rt:
            await rt.push("src", chunk(1, 2).with_ops([Op.INSERT, Op.DELETE]))
            await rt.checkpoint()
    assert isinstance(info.value.cause, ProtocolError)


async def test_failed_stage_discards_the_epoch_and_fails_the_writer(tmp_path: Path) -> None:
    table = faulty(tmp_path)
    table.fail("stage")
    rt = sink_runtime(tmp_path, table)
    with pytest.raises(ActorFailedError) as info:
        async with rt:
            await rt.push("src", chunk(1))
            await rt.checkpoint()
    assert info.value.actor == "sink"
    assert isinstance(info.value.cause, SinkConnectorError)
    assert info.value.cause.operation == "stage"
    begun = begins(table)[0]
    assert table.called("stage") == [begun]
    assert table.called("discard") == [begun]
    assert table.called("prepare") == []  # nothing reached the coordinator
    assert table.called("commit") == []
    assert table_ids(tmp_path / "table") == []
    assert staged_files(tmp_path / "table") == []


async def test_failed_write_poisons_epoch_and_recovery_takes_replayed_rows_once(
    tmp_path: Path,
) -> None:
    table = faulty(tmp_path)
    rt = sink_runtime(tmp_path, table, recovery=True, restart_backoff=0.01)
    async with rt:
        await rt.push("src", chunk(1))
        table.fail("write")
        await rt.push("src", chunk(2))  # this write fails: the epoch is poisoned
        with pytest.raises(ActorFailedError) as info:
            await rt.checkpoint()  # staging refuses the poisoned epoch
        assert info.value.cause.__class__.__name__ == "EpochPoisonedError"
        poisoned = begins(table)[0]
        assert poisoned in table.called("discard")
        assert poisoned not in table.called("stage")
        await rt.push("src", chunk(1))  # the driver replays the unacknowledged rows
        await rt.push("src", chunk(2))
        await rt.checkpoint()
    assert table_ids(tmp_path / "table") == [1, 2]


async def test_a_failed_commit_shows_no_rows_and_is_retried(tmp_path: Path) -> None:
    table = faulty(tmp_path)
    table.hang("commit")
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    coordinator = declare(rt, table)
    async with rt:
        await rt.push("src", chunk(1, 2))
        epoch = await rt.checkpoint()  # durable: the rows are acknowledged
        with anyio.fail_after(scaled(5)):
            await table.wait_called("commit")
        assert table_ids(tmp_path / "table") == []
        table.fail("commit")
        table.release("commit")  # this commit fails; the coordinator retries it
        with anyio.fail_after(scaled(5)):
            await coordinator.wait_committed(epoch)
        assert table.called("commit") == [epoch, epoch]
        assert table_ids(tmp_path / "table") == [1, 2]
    assert table_ids(tmp_path / "table") == [1, 2]


async def test_graceful_stop_commits_the_last_epoch(tmp_path: Path) -> None:
    rt = sink_runtime(tmp_path, faulty(tmp_path))
    async with rt:
        await rt.push("src", chunk(7, 8))
    assert table_ids(tmp_path / "table") == [7, 8]
    assert not any((tmp_path / "table" / ".staging").iterdir())


class SimulatedCrashError(Exception):
    pass


async def test_restart_after_abrupt_stop_commits_durable_and_drops_the_rest(
    tmp_path: Path,
) -> None:
    table = faulty(tmp_path)
    table.hang("commit")  # the commit after the durable checkpoint never happens in run 1
    rt = sink_runtime(tmp_path, table)
    with pytest.raises(SimulatedCrashError):
        async with rt:
            await rt.push("src", chunk(1, 2))
            durable = await rt.checkpoint()
            with anyio.fail_after(scaled(5)):
                await table.wait_called("commit")
            await rt.push("src", chunk(3))  # staged, never checkpointed
            raise SimulatedCrashError
    assert table_ids(tmp_path / "table") == []
    again = faulty(tmp_path)
    rt = sink_runtime(tmp_path, again)
    async with rt:
        await rt.checkpoint()
    assert again.called("recover") == [(durable,)]  # the pending epoch, handed to recover
    assert again.called("commit")[0] == durable
    assert table_ids(tmp_path / "table") == [1, 2]
    assert staged_files(tmp_path / "table") == []


async def test_a_pending_epoch_is_recorded_in_the_coordinators_meta_store(
    tmp_path: Path,
) -> None:
    # Acknowledged to the writer only once recorded as pending: no checkpoint is durable
    # without the record that lets a restart commit it.
    table = faulty(tmp_path)
    table.hang("commit")
    rt = sink_runtime(tmp_path, table)
    with pytest.raises(SimulatedCrashError):
        async with rt:
            await rt.push("src", chunk(1, 2))
            epoch = await rt.checkpoint()
            with anyio.fail_after(scaled(5)):
                await table.wait_called("commit")
            raise SimulatedCrashError
    async with await StateStore.open(tmp_path / "state.db") as store:
        [record] = await SinkStates(store, "sink").list()
    assert (record.epoch, record.state, record.schema_change) == (epoch, SinkState.PENDING, None)
    assert record.metadata["staging_epoch"] == epoch
    assert record.metadata["rows"] == 2
    assert record.metadata["paths"] == [f".staging/{epoch:020d}/w0/part-00000.parquet"]


def test_writer_rejects_a_non_factory(tmp_path: Path) -> None:
    coordinator = coordinator_for(tmp_path)
    with pytest.raises(InvalidArgumentError) as info:
        SinkWriter(42, coordinator=coordinator, writer_id="0")  # type: ignore[arg-type]
    assert info.value.argument == "writer"
    # A staging writer itself is not a factory of them.
    writer = ParquetStagingWriter(tmp_path / "t", SCHEMA, "0")
    with pytest.raises(InvalidArgumentError) as info:
        SinkWriter(writer, coordinator=coordinator, writer_id="0")  # type: ignore[arg-type]
    assert (info.value.argument, info.value.got) == ("writer", "ParquetStagingWriter")


async def test_wait_committed_returns_once_rows_are_visible(tmp_path: Path) -> None:
    writers: list[SinkWriter] = []
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    declare(rt, ParquetTable(tmp_path / "table", SCHEMA), writers)
    async with rt:
        await rt.push("src", chunk(4, 5))
        durable = await rt.checkpoint()
        with anyio.fail_after(scaled(5)):
            await writers[-1].wait_committed(durable)
        assert writers[-1].coordinator.is_committed(durable)
        assert table_ids(tmp_path / "table") == [4, 5]


# --- Bad input and wiring: typed errors, every field checked ---------------------------------


class NotAWriter:
    pass


def coordinator_for(tmp_path: Path, sink: str = "orders") -> Coordinator:
    return Coordinator(sink, ParquetTable(tmp_path / sink, SCHEMA).committer())


def test_bad_constructor_arguments_get_typed_errors(tmp_path: Path) -> None:
    table = ListTable(SCHEMA)
    orders = coordinator_for(tmp_path)
    ok: dict[str, Any] = {
        "writer": lambda: table.writer("0"),
        "coordinator": orders,
        "writer_id": "0",
    }
    cases: list[tuple[dict[str, Any], tuple[str, str, object]]] = [
        ({"coordinator": 42}, ("coordinator", "a Coordinator", 42)),
        ({"coordinator": None}, ("coordinator", "a Coordinator", None)),
        ({"writer": 42}, ("writer", "a factory of StagingWriters", "int")),
        ({"writer_id": ""}, ("writer_id", "a non-empty writer id", "")),
        ({"writer_id": 0}, ("writer_id", "a non-empty writer id", 0)),
        ({"name": ""}, ("name", "a non-empty str", "")),
        ({"capacity": 0}, ("capacity", "an int >= 1", 0)),
    ]
    for kwargs, (argument, expected, got) in cases:
        with pytest.raises(InvalidArgumentError) as info:
            SinkWriter(**{**ok, **kwargs})
        assert type(info.value) is InvalidArgumentError
        assert (info.value.argument, info.value.expected, info.value.got) == (
            argument,
            expected,
            got,
        )
    writer = SinkWriter(**ok)
    assert (writer.coordinator, writer.writer_id) == (orders, "0")


@pytest.mark.parametrize(("setting", "value"), [("capacity", 0), ("flush_interval", -1.0)])
def test_bad_sink_task_settings_are_refused_by_the_constructor(
    tmp_path: Path, setting: str, value: object
) -> None:
    table = ListTable(SCHEMA)
    with pytest.raises(InvalidArgumentError) as info:
        SinkWriter(
            lambda: table.writer("0"),
            coordinator=coordinator_for(tmp_path),
            writer_id="0",
            **{setting: value},  # type: ignore[arg-type]
        )
    assert (info.value.argument, info.value.got) == (setting, value)


def test_the_startup_path_check_names_the_writer_else_its_actor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked: list[str] = []
    monkeypatch.setattr(
        ParquetStagingWriter, "check_path", lambda _self, sink: checked.append(sink)
    )
    orders = coordinator_for(tmp_path)
    table = ParquetTable(tmp_path / "t", SCHEMA)
    for name in (None, "orders"):
        writer = SinkWriter(lambda: table.writer("0"), coordinator=orders, writer_id="0", name=name)
        writer.check_startup(StartupContext("w0", {"c": orders}, {}))
    assert checked == ["w0", "orders"]


class Schemaless:
    """A staging writer whose schema is not a pyarrow schema (refused when its sink task
    starts)."""

    def __init__(self) -> None:
        self.inner = ListTable(SCHEMA).writer("0")

    @property
    def schema(self) -> pa.Schema:
        return "x: int32"  # type: ignore[return-value]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    open = property(lambda self: self.inner.open)
    begin = property(lambda self: self.inner.begin)
    write = property(lambda self: self.inner.write)
    flush = property(lambda self: self.inner.flush)
    stage = property(lambda self: self.inner.stage)
    discard = property(lambda self: self.inner.discard)
    close = property(lambda self: self.inner.close)


def test_the_input_schema_checked_at_start_is_the_writers_if_it_has_one(
    tmp_path: Path,
) -> None:
    orders = coordinator_for(tmp_path)
    table = ParquetTable(tmp_path / "t", SCHEMA)
    writer = SinkWriter(lambda: table.writer("0"), coordinator=orders, writer_id="0")
    assert writer.input_schema() == SCHEMA
    schemaless = SinkWriter(lambda: Schemaless(), coordinator=orders, writer_id="0")
    assert schemaless.input_schema() is None  # nothing to check the input by


def test_the_staging_writer_is_made_once_per_incarnation(tmp_path: Path) -> None:
    made: list[object] = []
    table = ListTable(SCHEMA)

    def factory() -> Any:
        made.append(table.writer("0"))
        return made[-1]

    orders = coordinator_for(tmp_path)
    writer = SinkWriter(factory, coordinator=orders, writer_id="0")
    assert made == []  # not before the graph asks
    writer.input_schema()
    writer.check_startup(StartupContext("w0", {"c": orders}, {}))
    assert len(made) == 1


def test_a_factory_must_return_a_staging_writer(tmp_path: Path) -> None:
    orders = coordinator_for(tmp_path)
    writer = SinkWriter(NotAWriter, coordinator=orders, writer_id="0")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError) as info:
        writer.check_startup(StartupContext("sink", {"c": orders}, {}))
    assert type(info.value) is InvalidArgumentError
    assert (info.value.argument, info.value.expected, info.value.got) == (
        "writer",
        "a factory returning a StagingWriter",
        "NotAWriter",
    )


def writer_of(coordinator: Coordinator, writer_id: str = "0") -> SinkWriter:
    table = ListTable(SCHEMA)
    return SinkWriter(lambda: table.writer(writer_id), coordinator=coordinator, writer_id=writer_id)


def wiring_cases(tmp_path: Path) -> list[tuple[SinkWriter, StartupContext, BaseException]]:
    """(writer, its startup context, the error it must raise) for every wiring mistake."""
    orders = coordinator_for(tmp_path)
    services = {"coord": orders}
    return [
        (  # a coordinator the runtime does not run
            writer_of(orders, "7"),
            StartupContext("w0", {"other": object(), "more": object()}, {}),
            CoordinatorMissingError(
                "w0",
                "orders",
                "its Coordinator for sink 'orders' added to the runtime with "
                "rt.add_service(name, coordinator)",
                "services ['more', 'other']",
            ),
        ),
        (  # another coordinator of the same sink name is not the writer's
            writer_of(orders, "7"),
            StartupContext("w0", {"coord": coordinator_for(tmp_path)}, {}),
            CoordinatorMissingError(
                "w0",
                "orders",
                "its Coordinator for sink 'orders' added to the runtime with "
                "rt.add_service(name, coordinator)",
                "services ['coord']",
            ),
        ),
        (  # two siblings staging files under one writer id
            writer_of(orders, "7"),
            StartupContext("w1", services, {"w0": writer_of(orders, "7")}),
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
    mine = writer_of(orders, "0")
    # A non-writer sibling first: the writer after it is still checked.
    siblings = {"a_map": object(), "w0": writer_of(orders, "0")}
    with pytest.raises(DuplicateWriterError) as info:
        mine.check_startup(StartupContext("w1", {"coord": orders}, siblings))
    assert (info.value.first, info.value.second) == ("w0", "w1")


def test_writers_of_different_coordinators_may_share_a_writer_id(tmp_path: Path) -> None:
    orders, refunds = coordinator_for(tmp_path, "orders"), coordinator_for(tmp_path, "refunds")
    mine, other = writer_of(orders, "0"), writer_of(refunds, "0")
    services = {"orders": orders, "refunds": refunds}
    mine.check_startup(StartupContext("w1", services, {"w0": other}))
    # The same id under the same coordinator is a duplicate: the coordinator tells them apart.
    with pytest.raises(DuplicateWriterError):
        mine.check_startup(StartupContext("w1", services, {"w0": writer_of(orders, "0")}))


def test_siblings_of_one_coordinator_with_distinct_ids_are_no_duplicates(tmp_path: Path) -> None:
    orders = coordinator_for(tmp_path)
    mine, other = writer_of(orders, "1"), writer_of(orders, "0")
    mine.check_startup(StartupContext("w1", {"orders": orders}, {"w0": other}))
    # A sibling with this writer's id is a duplicate: the ids tell them apart.
    with pytest.raises(DuplicateWriterError):
        mine.check_startup(StartupContext("w1", {"orders": orders}, {"w0": writer_of(orders, "1")}))


def test_only_the_later_of_two_duplicate_writers_reports_them(tmp_path: Path) -> None:
    orders = coordinator_for(tmp_path)
    first, second = writer_of(orders, "0"), writer_of(orders, "0")
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
    table: FailingTable,
    writers: list[SinkWriter] | None = None,
    *,
    upstream: type[StreamActor] | None = None,
    **kwargs: Any,
) -> Runtime:
    """A source, maybe an actor after it, and a writer into a recorded table; plain barriers
    unless a test asks for a checkpoint (``checkpoint_frequency``)."""
    kwargs.setdefault("checkpoint_frequency", 1000)
    writer_kwargs = kwargs.pop("writer", {})
    gate: anyio.Event | None = kwargs.pop("gate", None)
    rt = Runtime(config(tmp_path, **kwargs))
    rt.add_source("src")
    if gate is not None:
        rt.add_actor("gate", lambda: Gate(gate), inputs=["src"])
    if upstream is not None:
        rt.add_actor("up", upstream, inputs=["src"])
    declare(rt, table, writers, inputs=("up" if upstream is not None else "src",), **writer_kwargs)
    return rt


async def test_stats_are_none_until_the_writer_runs_then_count_under_its_name(
    tmp_path: Path,
) -> None:
    writers: list[SinkWriter] = []
    rt = recording_runtime(tmp_path, faulty(tmp_path), writers, writer={"name": "orders"})
    assert writer_of(coordinator_for(tmp_path)).stats() is None
    async with rt:
        await rt.push("src", chunk(1, 2))
        await rt.checkpoint()
        stats = writers[-1].stats()
        assert stats is not None
        assert (stats.name, stats.rows_written) == ("orders", 2)


class RowsFirst(StreamActor):
    """Emits a row before passing any barrier: a broken upstream."""

    async def run(self, ctx: ActorContext) -> None:
        await ctx.emit(chunk(9))
        async for message in ctx.messages():
            await ctx.emit(message)


async def test_an_upstream_emitting_rows_before_its_first_barrier_is_blamed_not_the_writer(
    tmp_path: Path,
) -> None:
    table = faulty(tmp_path)
    rt = recording_runtime(tmp_path, table, upstream=RowsFirst)
    with pytest.raises(ActorFailedError) as info:
        async with rt:
            await rt.checkpoint()
    assert info.value.actor == "up"
    assert isinstance(info.value.cause, BarrierNotPassedError)
    assert table.called("write") == []


class Started:
    """A coordinator's line that starts the writer at once (a hand-built graph has no
    coordinator service)."""

    def __init__(self, bitmap: VnodeBitmap) -> None:
        self.bitmap = bitmap

    async def wait_started(self) -> int | None:
        await anyio.lowlevel.checkpoint()
        return None


async def test_rows_before_any_barrier_fail_the_writer_with_every_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer's own guard, for a graph built by hand (the runtime's contexts already refuse
    such rows in the upstream, above)."""
    table = faulty(tmp_path)
    coordinator = coordinator_for(tmp_path)
    registered: list[tuple[VnodeBitmap, str | None, str | None]] = []

    async def register(
        bitmap: VnodeBitmap, *, writer: str | None = None, name: str | None = None
    ) -> Started:
        registered.append((bitmap, writer, name))
        await anyio.lowlevel.checkpoint()
        return Started(bitmap)

    monkeypatch.setattr(coordinator, "register", register)
    store = await StateStore.open(tmp_path / "s.db")
    try:
        tx, rx = create_channel[Message](4)
        manager = BarrierManager(
            store, {1: tx}, {1}, barrier_interval=1.0, checkpoint_frequency=1, max_in_flight=2
        )
        ctx = ActorContext(1, "sink", rx, None, store, manager)
        writer = SinkWriter(lambda: table.writer("0"), coordinator=coordinator, writer_id="0")
        await tx.send(chunk(9))
        with anyio.fail_after(scaled(30)), pytest.raises(SinkWriterInputError) as info:
            await writer.run(ctx)
    finally:
        await store.aclose()
    cause = info.value
    expected = "a barrier to begin an epoch before rows"
    assert (cause.writer, cause.expected, cause.got) == ("sink", expected, "rows")
    assert str(cause) == f"sink writer 'sink': expected {expected}, got rows"
    assert table.called("write") == []
    # A writer declared alone registers every vnode, under its writer id and actor name.
    [(bitmap, writer_id, name)] = registered
    assert (bitmap.count(), bitmap.vnode_count, writer_id, name) == (
        coordinator.vnode_count,
        coordinator.vnode_count,
        "0",
        "sink",
    )


async def test_deletes_into_an_append_only_sink_fail_the_writer_with_every_field(
    tmp_path: Path,
) -> None:
    table = faulty(tmp_path)
    rt = recording_runtime(tmp_path, table)
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
    assert table.called("write") == []


async def test_a_plain_barrier_neither_closes_nor_begins_a_sink_epoch(tmp_path: Path) -> None:
    table = faulty(tmp_path)
    rt = recording_runtime(tmp_path, table)
    async with rt:
        await rt.push("src", chunk(1))
        await rt.mutate(Resume())  # a plain barrier
        await rt.push("src", chunk(2))
        durable = await rt.checkpoint()
        epochs = [c for c in table.calls if c[0] in ("begin", "stage")]
        # One sink epoch across the plain barrier, closed by the checkpoint that follows.
        assert [c[0] for c in epochs] == ["begin", "stage", "begin"]
        assert epochs[0][1] == epochs[1][1] < durable < epochs[2][1]
    assert table_ids(tmp_path / "table") == [1, 2]


async def test_a_stop_on_a_plain_barrier_discards_the_open_epoch(tmp_path: Path) -> None:
    table = faulty(tmp_path)
    rt = recording_runtime(tmp_path, table)
    with anyio.fail_after(scaled(10)):
        async with rt:
            await rt.push("src", chunk(1))
            await rt.mutate(Stop(frozenset({rt.actor_id("sink")})))
    begun = begins(table)[0]
    assert table.called("discard") == [begun]
    assert table.called("stage") == []
    assert table.called("commit") == []
    assert table_ids(tmp_path / "table") == []


async def test_a_stop_on_a_plain_barrier_after_a_checkpoint_discards_only_the_open_epoch(
    tmp_path: Path,
) -> None:
    # The staged epoch is committed before the writer leaves; the open one is discarded once.
    table = faulty(tmp_path)
    rt = recording_runtime(tmp_path, table)
    with anyio.fail_after(scaled(10)):
        async with rt:
            await rt.push("src", chunk(1))
            durable = await rt.checkpoint()
            await rt.push("src", chunk(2))
            await rt.mutate(Stop(frozenset({rt.actor_id("sink")})))
    first, second = begins(table)
    assert first == durable
    assert table.called("stage") == [first]
    assert table.called("commit") == [durable]
    assert table.called("discard") == [second]
    assert table_ids(tmp_path / "table") == [1]


async def test_a_refused_write_discards_the_open_epoch(tmp_path: Path) -> None:
    table = faulty(tmp_path)
    rt = recording_runtime(tmp_path, table)
    other = pa.schema([("id", pa.int32())])
    with pytest.raises(ActorFailedError) as info:
        async with rt:
            await rt.push("src", Chunk(pa.record_batch([pa.array([1], pa.int32())], schema=other)))
            await rt.checkpoint()
    assert isinstance(info.value.cause, SchemaMismatchError)
    begun = begins(table)[0]
    assert begun in table.called("discard")
    assert table.called("stage") == []
    assert table_ids(tmp_path / "table") == []


async def suppressed(call: Callable[[], Awaitable[object]]) -> None:
    with contextlib.suppress(ActorFailedError):
        await call()


async def test_a_coordinated_writer_registers_its_writer_id(tmp_path: Path) -> None:
    # The coordinator refuses a second registration under the writer's id: it knows the id.
    table = ParquetTable(tmp_path / "table", SCHEMA)
    coordinator = Coordinator("orders", table.committer())
    rt = Runtime(config(tmp_path))
    rt.add_source("src", fanout=Fanout("hash", ("id",)))
    rt.add_service("coordinator", coordinator)
    for i in range(2):
        rt.add_actor(
            f"writer{i}",
            lambda i=i: SinkWriter(
                lambda: table.writer(str(i)), coordinator=coordinator, writer_id=str(i)
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


class Forward(StreamActor):
    """Passes everything on; a Stop for it alone ends the writer's input."""


async def test_a_writer_whose_input_ends_commits_its_durable_epochs(tmp_path: Path) -> None:
    # The upstream is stopped alone: the writer's input ends after a checkpoint barrier, with
    # no Stop for the writer. The epoch that barrier closed is committed once durable (not left
    # for a restart's recovery), so the rows are visible when the runtime has stopped.
    table, opened = faulty(tmp_path), anyio.Event()
    rt = recording_runtime(tmp_path, table, upstream=Forward, checkpoint_frequency=1, gate=opened)
    async with rt, anyio.create_task_group() as tg:
        await rt.push("src", chunk(1, 2))
        tg.start_soon(suppressed, lambda: rt.mutate(Stop(frozenset({rt.actor_id("up")}))))
        with anyio.fail_after(scaled(5)):
            await table.wait_called("begin", 2)
        await anyio.wait_all_tasks_blocked()  # the writer met the end of its input
        assert table.called("commit") == []  # not durable yet: the gate holds it
        opened.set()  # now the checkpoint becomes durable
    first = begins(table)[0]
    assert table.called("commit") == [first]
    assert table_ids(tmp_path / "table") == [1, 2]


async def test_a_writer_reports_its_sink_task_counters_as_metrics_while_it_runs(
    tmp_path: Path,
) -> None:
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    writers: list[SinkWriter] = []
    declare(rt, faulty(tmp_path), writers, name="orders")
    async with rt:
        await rt.push("src", chunk(1, 2, 3))
        await rt.checkpoint()
        families = {f.name: f for f in writers[0].metric_families()}
    labels = {"sink": "orders", "actor": "orders"}
    assert families["barrierflow_sink_rows_written"].value(**labels) == 3
    assert families["barrierflow_sink_staged_epochs"].value(**labels) == 1
    assert families["barrierflow_sink_poisoned_epochs"].value(**labels) == 0
    assert families["barrierflow_sink_flush_errors"].value(**labels) == 0
    idle = SinkWriter(lambda: None, coordinator=coordinator_for(tmp_path), writer_id="0")
    assert idle.metric_families() == []  # not running: no sink task to report


async def test_a_writer_restarted_after_acknowledged_epochs_is_started_with_its_rewind(
    tmp_path: Path,
) -> None:
    # After a recovery the coordinator starts its writers with the rewind epoch (the last one
    # acknowledged): a writer that did not wait to be started would ask for an initial
    # alignment the coordinator no longer runs, and the graph would fail again.
    table = faulty(tmp_path)
    rt = sink_runtime(tmp_path, table, recovery=True, restart_backoff=0.01, max_restarts=1)
    async with rt:
        await rt.push("src", chunk(1))
        await rt.checkpoint()  # acknowledged: a rewind epoch from now on
        table.fail("write")
        await rt.push("src", chunk(2))
        with pytest.raises(ActorFailedError):
            await rt.checkpoint()
        await rt.push("src", chunk(2))  # the rebuilt writer takes the replay
        await rt.checkpoint()
        assert rt.stats().restarts == 1
    assert table_ids(tmp_path / "table") == [1, 2]
