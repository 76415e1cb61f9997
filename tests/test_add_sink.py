"""A sink in one call: ``add_sink`` declares the writers and their coordinator together, into a
runtime before start or into a job that joins a running pipeline."""

from __future__ import annotations

from pathlib import Path

import anyio
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from _timeouts import scaled

from barrierflow.actors import Coordinator, add_sink
from barrierflow.channels import Chunk, Message
from barrierflow.connectors import ParquetTable
from barrierflow.errors import GraphError, InvalidArgumentError
from barrierflow.runtime import ActorContext, Job, Runtime, RuntimeConfig, StreamActor
from barrierflow.testing import ListTable

pytestmark = pytest.mark.anyio

SCHEMA = pa.schema([("user", pa.int64()), ("clicks", pa.int64())])


def chunk(*users: int) -> Chunk:
    ids = pa.array(users, pa.int64())
    return Chunk(pa.record_batch([ids, ids], schema=SCHEMA))


def users_in(table: Path) -> list[int]:
    """The committed rows of a Parquet table directory (staging is hidden from readers)."""
    return sorted(ds.dataset(table, SCHEMA, format="parquet").to_table()["user"].to_pylist())


class Forward(StreamActor):
    async def process(self, message: Message, ctx: ActorContext) -> None:
        await ctx.emit(message)


def runtime(tmp_path: Path) -> Runtime:
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=3600))
    rt.add_source("events")
    return rt


async def test_add_sink_declares_parallel_writers_and_their_coordinator(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    sink = add_sink(
        rt, "clicks", ParquetTable(tmp_path / "out", SCHEMA), input="events",
        parallelism=3, key=("user",),
    )  # fmt: skip
    assert sink.writers == ("clicks.0", "clicks.1", "clicks.2")
    assert isinstance(sink.coordinator, Coordinator)
    assert rt.name_in_use("clicks.coordinator")
    with anyio.fail_after(scaled(30)):
        async with rt:
            await rt.push("events", chunk(*range(100)))
            epoch = await rt.checkpoint()
            await sink.coordinator.wait_committed(epoch)
            assert users_in(tmp_path / "out") == list(range(100))
            stats = rt.stats().actors
            # Hash-dispatched by user: every writer got a share, none got all.
            shares = [stats[name].rows_in for name in sink.writers]
            assert sum(shares) == 100
            assert all(0 < share < 100 for share in shares)
            assert sink.coordinator.stats().writers == 3


async def test_round_robin_writers_of_a_coordinated_table_each_register_a_share(
    tmp_path: Path,
) -> None:
    """Without ``key`` the rows go round robin; the writers still make one coordinated table
    (each registers an even share of the vnodes, so the coordinator waits for all of them)."""
    rt = runtime(tmp_path)
    sink = add_sink(
        rt, "clicks", ParquetTable(tmp_path / "out", SCHEMA), input="events", parallelism=3
    )
    with anyio.fail_after(scaled(30)):
        async with rt:
            for start in range(0, 90, 10):
                await rt.push("events", chunk(*range(start, start + 10)))
            epoch = await rt.checkpoint()
            await sink.coordinator.wait_committed(epoch)
            assert users_in(tmp_path / "out") == list(range(90))
            assert sink.coordinator.stats().writers == 3
            shares = [rt.stats().actors[name].rows_in for name in sink.writers]
            assert shares == [30, 30, 30]


async def test_add_sink_with_one_writer_declares_its_coordinator_too(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    sink = add_sink(rt, "out", ParquetTable(tmp_path / "out", SCHEMA), input="events")
    assert sink.writers == ("out",)
    assert isinstance(sink.coordinator, Coordinator)
    assert sink.coordinator.sink == "out"
    assert sink.coordinator.commit_retry_timeout == 300.0  # the coordinator's default
    assert rt.name_in_use("out.coordinator")
    bounded = add_sink(
        rt, "bounded", ParquetTable(tmp_path / "b", SCHEMA), input="events",
        commit_retry_timeout=12.5,
    )  # fmt: skip
    assert bounded.coordinator.commit_retry_timeout == 12.5
    with anyio.fail_after(scaled(30)):
        async with rt:
            await rt.push("events", chunk(1, 2, 3))
            epoch = await rt.checkpoint()
            await sink.coordinator.wait_committed(epoch)
            assert users_in(tmp_path / "out") == [1, 2, 3]
            assert sink.coordinator.stats().writers == 1
            await rt.push("events", chunk(4))
    # The graceful stop committed the last epoch through the coordinator.
    assert users_in(tmp_path / "out") == [1, 2, 3, 4]


async def test_two_sinks_in_one_job_each_have_their_coordinator(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    with anyio.fail_after(scaled(30)):
        async with rt:
            job = Job("export")
            left, right = ListTable(SCHEMA), ListTable(SCHEMA)
            first = add_sink(job, "left", left, input="events")
            second = add_sink(job, "right", right, input="events", parallelism=2)
            assert first.coordinator is not second.coordinator
            assert (first.coordinator.sink, second.coordinator.sink) == ("left", "right")
            handle = await rt.add_job(job)
            assert handle.actors == ["left", "right.0", "right.1"]
            await rt.push("events", chunk(1, 2, 3))
            epoch = await rt.checkpoint()
            await first.coordinator.wait_committed(epoch)
            await second.coordinator.wait_committed(epoch)
            assert first.coordinator.stats().writers == 1
            assert second.coordinator.stats().writers == 2
    assert sorted(left.rows()["user"].to_pylist()) == [1, 2, 3]
    assert sorted(right.rows()["user"].to_pylist()) == [1, 2, 3]


async def test_a_sink_job_joining_a_running_pipeline_writes_exactly_the_rows_after_it(
    tmp_path: Path,
) -> None:
    rt = runtime(tmp_path)
    with anyio.fail_after(scaled(30)):
        async with rt:
            await rt.push("events", chunk(1, 2))  # before the sink exists: not in it
            job = Job("export")
            sink = add_sink(
                job, "clicks", ParquetTable(tmp_path / "out", SCHEMA), input="events",
                parallelism=2, key=("user",),
            )  # fmt: skip
            handle = await rt.add_job(job)
            assert handle.actors == ["clicks.0", "clicks.1"]
            await rt.push("events", chunk(3, 4, 5))
            epoch = await rt.checkpoint()
            assert sink.coordinator is not None
            await sink.coordinator.wait_committed(epoch)
            assert users_in(tmp_path / "out") == [3, 4, 5]
            await rt.push("events", chunk(6))
            # Dropping the job commits what its writers hold before they leave.
            await rt.drop_job("export")
            assert users_in(tmp_path / "out") == [3, 4, 5, 6]
            await rt.push("events", chunk(7))  # after the drop: not in it
            await rt.checkpoint()
    assert users_in(tmp_path / "out") == [3, 4, 5, 6]


async def test_a_refused_sink_declares_nothing(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    rt.add_actor("clicks.coordinator", Forward, inputs=["events"])
    table = ParquetTable(tmp_path / "out", SCHEMA)
    with pytest.raises(GraphError) as taken:
        add_sink(rt, "clicks", table, input="events", parallelism=2)
    assert (taken.value.argument, taken.value.got) == ("name", "clicks.coordinator")
    assert not rt.name_in_use("clicks.0")
    with pytest.raises(GraphError) as unknown:
        add_sink(rt, "other", table, input="nowhere", parallelism=2)
    assert unknown.value.argument == "inputs"
    assert not rt.name_in_use("other.0")
    assert not rt.name_in_use("other.coordinator")


def test_add_sink_rejects_bad_input(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    table = ParquetTable(tmp_path / "out", SCHEMA)
    factory = lambda: table.writer("0")  # noqa: E731
    with pytest.raises(InvalidArgumentError) as connector:
        add_sink(rt, "out", factory, input="events")  # type: ignore[arg-type]
    assert (connector.value.argument, connector.value.got) == ("table", "function")
    with pytest.raises(InvalidArgumentError) as not_a_table:
        add_sink(rt, "out", "not a sink", input="events")  # type: ignore[arg-type]
    assert (not_a_table.value.argument, not_a_table.value.got) == ("table", "str")
    with pytest.raises(InvalidArgumentError) as no_input:
        add_sink(rt, "out", table, input=["events"])  # type: ignore[arg-type]
    assert no_input.value.argument == "input"
    with pytest.raises(InvalidArgumentError) as empty_input:
        add_sink(rt, "out", table, input="")
    assert empty_input.value.argument == "input"
    with pytest.raises(GraphError) as no_name:
        add_sink(rt, "", table, input="events")
    assert no_name.value.argument == "name"
    with pytest.raises(GraphError) as bad_parallelism:
        add_sink(rt, "out", table, input="events", parallelism=0)
    assert bad_parallelism.value.argument == "parallelism"
    with pytest.raises(InvalidArgumentError) as bad_bound:
        add_sink(rt, "out", table, input="events", commit_retry_timeout=0)
    assert bad_bound.value.argument == "commit_retry_timeout"
    with pytest.raises(InvalidArgumentError) as writer_option:
        ParquetTable(tmp_path / "t", SCHEMA, writer="0")
    assert writer_option.value.argument == "options"
    assert not rt.name_in_use("out")
    assert not rt.name_in_use("out.coordinator")
