"""Sink wiring mistakes that used to lose rows or hang are refused with typed errors.

Duplicate writer ids, a coordinator that is not a service, a parallel writer whose siblings'
coordinator is another, a table directory held by another process; and a coordinator waiting
for vnode coverage says what it is waiting for.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pyarrow as pa
import pytest
import structlog
from _timeouts import scaled

from barrierflow.actors import Coordinator, add_sink
from barrierflow.actors.sinks.sink_writer import SinkWriter
from barrierflow.channels import VnodeBitmap
from barrierflow.connectors import (
    IcebergTable,
    ParquetStagingWriter,
    ParquetTable,
    open_local_catalog,
)
from barrierflow.connectors.parquet_committer import ParquetCommitter
from barrierflow.errors import (
    ActorFailedError,
    CoordinatorAbortedError,
    CoordinatorMissingError,
    DuplicateWriterError,
    SinkConnectorError,
    SinkLockedError,
)
from barrierflow.runtime import Fanout, Runtime, RuntimeConfig

pytestmark = pytest.mark.anyio

SCHEMA = pa.schema([("id", pa.int64())])


def runtime(tmp_path: Path) -> Runtime:
    rt = Runtime(RuntimeConfig(state_path=str(tmp_path / "state.db"), barrier_interval=3600.0))
    rt.add_source("src", fanout=Fanout("hash", ("id",)))
    return rt


def parallel_writers(
    rt: Runtime,
    table: Path,
    coordinators: list[Coordinator],
    writer_ids: list[str],
) -> None:
    parquet = ParquetTable(table, SCHEMA)
    for i, (coordinator, writer_id) in enumerate(zip(coordinators, writer_ids, strict=True)):
        rt.add_actor(
            f"writer{i}",
            lambda c=coordinator, w=writer_id: SinkWriter(
                lambda: parquet.writer(w), coordinator=c, writer_id=w
            ),
            inputs=["src"],
        )


def committer(table: Path) -> ParquetCommitter:
    return ParquetTable(table, SCHEMA).committer()


async def test_two_parallel_writers_with_one_writer_id_are_refused_at_start(
    tmp_path: Path,
) -> None:
    table = tmp_path / "table"
    coordinator = Coordinator("table", committer(table))
    rt = runtime(tmp_path)
    rt.add_service("coordinator", coordinator)
    parallel_writers(rt, table, [coordinator, coordinator], ["a", "a"])
    with pytest.raises(DuplicateWriterError) as caught:
        async with rt:
            pass
    assert (caught.value.sink, caught.value.writer) == ("table", "a")
    assert {caught.value.first, caught.value.second} == {"writer0", "writer1"}


async def test_the_coordinator_refuses_a_second_writer_with_the_same_id(tmp_path: Path) -> None:
    # Writers that are not siblings in one graph (or registered by hand) meet the coordinator's
    # own check: it fails, and every writer handle learns why.
    coordinator = Coordinator("table", committer(tmp_path / "table"), warn_interval=60)
    rt = runtime(tmp_path)
    rt.add_service("coordinator", coordinator)
    add_sink(rt, "sink", ParquetTable(tmp_path / "t2", SCHEMA), input="src")
    halves = VnodeBitmap.split(2)
    with pytest.raises(ActorFailedError) as caught:
        async with rt:
            first = await coordinator.register(halves[0], writer="a", name="left")
            second = await coordinator.register(halves[1], writer="a", name="right")
            with anyio.fail_after(scaled(10)), pytest.raises(CoordinatorAbortedError) as aborted:
                await second.wait_started()
            assert isinstance(aborted.value.cause, DuplicateWriterError)
            with pytest.raises(CoordinatorAbortedError):
                await first.wait_started()
            await anyio.sleep_forever()
    assert caught.value.actor == "coordinator"
    assert isinstance(caught.value.cause, DuplicateWriterError)
    assert (caught.value.cause.first, caught.value.cause.second) == ("left", "right")


async def test_a_coordinator_that_is_not_a_service_is_refused_at_start(tmp_path: Path) -> None:
    table = tmp_path / "table"
    coordinator = Coordinator("orders", committer(table))
    rt = runtime(tmp_path)  # the coordinator is never added with add_service
    parallel_writers(rt, table, [coordinator, coordinator], ["0", "1"])
    with pytest.raises(CoordinatorMissingError) as caught:
        async with rt:
            pass
    assert caught.value.writer == "writer0"
    assert caught.value.sink == "orders"


async def test_a_parallel_writer_whose_coordinator_is_not_a_service_is_refused(
    tmp_path: Path,
) -> None:
    # Each sibling is checked for its own coordinator: one running coordinator of the same
    # sink name does not cover a sibling pointing at another.
    table = tmp_path / "table"
    coordinator = Coordinator("orders", committer(table))
    stray = Coordinator("orders", committer(table))
    rt = runtime(tmp_path)
    rt.add_service("coordinator", coordinator)
    parallel_writers(rt, table, [coordinator, stray], ["0", "1"])
    with pytest.raises(CoordinatorMissingError) as caught:
        async with rt:
            pass
    assert caught.value.writer == "writer1"
    assert caught.value.sink == "orders"


async def test_a_coordinator_waiting_for_coverage_logs_what_is_missing(tmp_path: Path) -> None:
    coordinator = Coordinator("table", committer(tmp_path / "table"), warn_interval=0.05)
    rt = runtime(tmp_path)
    rt.add_service("coordinator", coordinator)
    add_sink(rt, "sink", ParquetTable(tmp_path / "t2", SCHEMA), input="src")
    logged = anyio.Event()

    def wake_on_waiting(
        _: structlog.typing.WrappedLogger, __: str, event: structlog.typing.EventDict
    ) -> structlog.typing.EventDict:
        if str(event["event"]).startswith("waiting for writers"):
            logged.set()
        return event

    with structlog.testing.capture_logs(processors=[wake_on_waiting]) as logs:
        async with rt:
            await coordinator.register(VnodeBitmap.split(2)[0], writer="0", name="left")
            with anyio.fail_after(scaled(10)):
                await logged.wait()
    waiting = next(e for e in logs if e["event"].startswith("waiting for writers"))
    assert waiting["uncovered_count"] == 128
    assert waiting["uncovered"] == "128-255"
    assert waiting["registered"] == ["left (128 vnodes)"]


HOLD_DIRECTORY = """
import sys, time
import anyio
import pyarrow as pa
from barrierflow.connectors import ParquetStagingWriter

async def main():
    sink = ParquetStagingWriter(sys.argv[1], pa.schema([("id", pa.int64())]), sys.argv[2])
    await sink.open()
    print("READY", flush=True)
    sys.stdin.read()  # hold until the test closes our stdin

anyio.run(main)
"""


def hold_directory(path: Path, writer: str) -> subprocess.Popen[str]:
    """Another process holding ``path`` open as a sink directory, until its stdin closes."""
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(HOLD_DIRECTORY), str(path), writer],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "READY"
    return holder


@pytest.mark.parametrize("writer", ["0", "1"], ids=["same-writer", "other-writer"])
@pytest.mark.subprocess
def test_a_table_directory_held_by_another_process_is_refused(tmp_path: Path, writer: str) -> None:
    table = tmp_path / "table"
    table.mkdir()
    link = tmp_path / "link"
    link.symlink_to(table)
    holder = hold_directory(table, "0")
    try:
        for path in (table, link):  # another spelling of the same directory too
            sink = ParquetStagingWriter(path, SCHEMA, writer)
            with pytest.raises(SinkLockedError) as caught:
                anyio.run(sink.open)
            assert caught.value.holder == "another process"
    finally:
        holder.communicate("", timeout=scaled(30))
    # Once the other process is gone, the directory is free.
    sink = ParquetStagingWriter(table, SCHEMA, writer)

    async def open_and_close() -> None:
        await sink.open()
        await sink.close()

    anyio.run(open_and_close)


@pytest.mark.subprocess
def test_an_iceberg_tables_staging_area_held_by_another_process_is_refused(
    tmp_path: Path,
) -> None:
    catalog = open_local_catalog(tmp_path / "iceberg")
    table = IcebergTable(catalog, "demo.events", SCHEMA)
    table.data_path.mkdir(parents=True, exist_ok=True)
    holder = hold_directory(table.data_path, "0")
    try:
        with pytest.raises(SinkLockedError):
            anyio.run(table.writer("1").open)
    finally:
        holder.communicate("", timeout=scaled(30))


@pytest.mark.subprocess
async def test_a_sink_task_reports_a_locked_directory_as_a_connector_error(
    tmp_path: Path,
) -> None:
    # Through a runtime the lock error reaches the user as the sink's failure, typed.
    table = tmp_path / "table"
    table.mkdir()
    holder = hold_directory(table, "7")
    try:
        rt = runtime(tmp_path)
        add_sink(rt, "sink", ParquetTable(table, SCHEMA), input="src")
        with pytest.raises(ActorFailedError) as caught:
            async with rt:
                await rt.checkpoint()
        assert isinstance(caught.value.cause, SinkConnectorError)
        assert isinstance(caught.value.cause.__cause__, SinkLockedError)
    finally:
        holder.communicate("", timeout=scaled(30))
