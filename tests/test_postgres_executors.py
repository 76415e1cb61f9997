"""A PostgreSQL table written from Spark tasks (``barrierflow.connectors.postgres_executors``):
each task attempt prepares a transaction of its own, the driver's ``adopt`` keeps the attempt
Spark returned for each partition and rolls back every other, a late attempt is fenced off,
the coordinator commits the kept ones, and recovery rolls back what no pending epoch names.

The task writes are driven directly (the speculative duplicate, an attempt that prepared and
was lost, a late straggler, a crash) and through a real local Spark (a first attempt that
fails and is retried). Each test keeps to its own table on the session's server.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _executor_actors
import _postgres_executor_actors
import anyio
import anyio.to_thread
import pyarrow as pa
import pytest
import structlog
from _executor_actors import OUT, not_a_third, twice
from _postgres_executor_actors import FLAKY_PARTITION, FailsFirstAttemptAtItsEnd
from _timeouts import scaled
from test_postgres_table import SCHEMA, assert_holds_only, ids, prepared, select

from barrierflow.actors import BatchFeed, add_sink
from barrierflow.actors.sinks.add_sink import DeclaredSink
from barrierflow.actors.sinks.committables import ChecksStaged, StagedBatch
from barrierflow.actors.sinks.table import Committed, Manifest
from barrierflow.channels import Committable
from barrierflow.connectors import PostgresTable
from barrierflow.connectors.executor_staging import (
    StagesOnExecutors,
    executor_writes,
    staging_number,
)
from barrierflow.connectors.postgres_executors import PostgresExecutorWrites, task_gid
from barrierflow.errors import (
    ActorFailedError,
    ExecutorStagingError,
    InvalidArgumentError,
    StagedFilesGoneError,
)
from barrierflow.operators import Stream
from barrierflow.runtime import BlockingRuntime, Runtime, RuntimeConfig
from barrierflow.spark_bridge import SparkBridge
from barrierflow.testing import PostgresServer

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

WAIT = scaled(30)


def writes_of(table: PostgresTable) -> PostgresExecutorWrites:
    writes = executor_writes(table)
    assert isinstance(writes, PostgresExecutorWrites)
    return writes


def attempt(
    writes: PostgresExecutorWrites, number: int, partition: int, attempt: int, rows: list[int]
) -> Manifest:
    """One task attempt, run to its end: its rows copied and prepared."""
    write = writes.open_task(number, partition, attempt)
    write.add(ids(rows))
    return write.finish()


def of_number(dsn: str, table: str, number: int) -> list[str]:
    """The prepared transactions of staging ``number`` of the sink writing ``table``."""
    return [g for g in prepared(dsn, table) if g.startswith(f"bf:public.{table}:{number}:")]


async def test_a_task_attempt_prepares_its_rows_invisibly_under_a_gid_of_its_own_attempt(
    postgres_server: PostgresServer,
) -> None:
    dsn, name = postgres_server.dsn, postgres_server.unique_name()
    table = PostgresTable(dsn, name, SCHEMA, batch_rows=2)
    writes = writes_of(table)
    number = staging_number()
    manifest = attempt(writes, number, 3, 17, [1, 2, 3, 4, 5])
    gid = task_gid(writes.spec, number, 3, 17)
    assert gid == f"bf:public.{name}:{number}:p3a17"
    # The manifest is the writer actor's shape: writer p<partition>, the gid as its file.
    assert (manifest.writer, manifest.epoch, manifest.rows) == ("p3", number, 5)
    assert [f.path for f in manifest.files] == [gid]
    assert prepared(dsn, name) == [gid]
    assert select(dsn, f'SELECT id FROM "{name}"') == []  # prepared: invisible
    # A partition without rows prepares nothing.
    empty = writes.open_task(number, 4, 18)
    assert empty.finish() == Manifest("p4", number)
    assert prepared(dsn, name) == [gid]


async def test_a_speculative_duplicate_and_a_lost_attempt_leave_the_kept_attempts_once(
    postgres_server: PostgresServer,
) -> None:
    dsn, name = postgres_server.dsn, postgres_server.unique_name()
    table = PostgresTable(dsn, name, SCHEMA)
    writes = writes_of(table)
    committer = table.committer()
    await committer.recover({})  # the coordinator's start, before any micro-batch
    number = staging_number()
    # Partition 0: attempt 1 prepared, then its executor died before its result came back;
    # Spark's retry, attempt 2, is the one it returned.
    attempt(writes, number, 0, 1, [1, 2, 3])
    kept0 = attempt(writes, number, 0, 2, [1, 2, 3])
    # Partition 1: the task writer called twice, a speculative copy; Spark returned the copy.
    attempt(writes, number, 1, 3, [4, 5])
    kept1 = attempt(writes, number, 1, 4, [4, 5])
    assert len(of_number(dsn, name, number)) == 4
    adopted = writes.adopt(number, [kept0, kept1])
    assert adopted == [kept0, kept1]
    assert sorted(of_number(dsn, name, number)) == sorted(f.path for m in adopted for f in m.files)
    epoch = 1 << 16
    metadata = await committer.prepare(epoch, adopted)
    assert metadata is not None
    assert await committer.commit(epoch, metadata) == Committed()
    await committer.aclose()
    assert_holds_only(dsn, name, [1, 2, 3, 4, 5])


async def test_an_attempt_that_would_prepare_after_adopt_is_fenced_off(
    postgres_server: PostgresServer,
) -> None:
    dsn, name = postgres_server.dsn, postgres_server.unique_name()
    table = PostgresTable(dsn, name, SCHEMA)
    writes = writes_of(table)
    number = staging_number()
    kept = attempt(writes, number, 0, 1, [1, 2])
    straggler = writes.open_task(number, 0, 2)  # a speculative copy still running
    straggler.add(ids([1, 2]))
    writes.adopt(number, [kept])
    with pytest.raises(ExecutorStagingError) as info:
        straggler.finish()
    assert f"staging {number} was adopted already" in info.value.reason
    assert of_number(dsn, name, number) == [f.path for f in kept.files]
    # The fence holds for earlier numbers too, and lets a later micro-batch's tasks through.
    with pytest.raises(ExecutorStagingError):
        attempt(writes, number - 2, 0, 3, [9])
    later = staging_number(number)
    assert attempt(writes, later, 0, 4, [3]).rows == 1
    assert len(of_number(dsn, name, later)) == 1


async def test_adopt_refuses_a_transaction_of_another_number_or_one_recovery_rolled_back(
    postgres_server: PostgresServer,
) -> None:
    dsn, name = postgres_server.dsn, postgres_server.unique_name()
    table = PostgresTable(dsn, name, SCHEMA)
    writes = writes_of(table)
    number = staging_number()
    other = attempt(writes, number + 2, 0, 1, [7])
    with pytest.raises(ExecutorStagingError) as info:
        writes.adopt(number, [other])
    assert f"not of staging {number}" in info.value.reason
    # A coordinator's recovery rolls back what no pending epoch names, meanwhile.
    kept = [attempt(writes, number, 0, 2, [1]), attempt(writes, number, 1, 3, [2])]
    committer = table.committer()
    await committer.recover({})
    await committer.aclose()
    assert prepared(dsn, name) == []
    with pytest.raises(ExecutorStagingError) as info:
        writes.adopt(number, kept)
    assert "gone" in info.value.reason
    assert prepared(dsn, name) == []


async def test_a_staged_batch_of_prepared_transactions_names_the_one_a_recovery_rolled_back(
    postgres_server: PostgresServer,
) -> None:
    dsn, name = postgres_server.dsn, postgres_server.unique_name()
    table = PostgresTable(dsn, name, SCHEMA)
    writes = writes_of(table)
    assert isinstance(writes, ChecksStaged)
    number = staging_number()
    kept = writes.adopt(number, [attempt(writes, number, 0, 1, [1]), Manifest("p1", number)])
    batch = StagedBatch("events/s", 0, 2, tuple(kept), writes.root, writes)
    assert batch.missing_file() is None  # the prepared transactions are there: no file is
    committer = table.committer()
    await committer.recover({})  # the graph recovered between the adopt and the delivery
    await committer.aclose()
    assert batch.missing_file() == task_gid(writes.spec, number, 0, 1)
    with pytest.raises(InvalidArgumentError) as info:
        StagedBatch("events/s", 0, 2, tuple(kept), writes.root, "writes")  # type: ignore[arg-type]
    assert info.value.argument == "check"


async def test_recovery_after_a_crash_between_prepare_and_commit_commits_the_pending_batch(
    postgres_restartable: PostgresServer,
) -> None:
    server = postgres_restartable
    dsn, name = server.dsn, server.unique_name()
    table = PostgresTable(dsn, name, SCHEMA)
    writes = writes_of(table)
    committer = table.committer()
    await committer.recover({})
    number = staging_number()
    adopted = writes.adopt(
        number, [attempt(writes, number, 0, 1, [1, 2]), attempt(writes, number, 1, 2, [3])]
    )
    epoch = 1 << 16
    pending = await committer.prepare(epoch, adopted)  # recorded pending in the meta store
    assert pending is not None
    # The next micro-batch's tasks prepared; the driver died before adopting them.
    later = staging_number(number)
    attempt(writes, later, 0, 3, [4])
    attempt(writes, later, 0, 4, [4])
    await committer.aclose()
    server.stop()  # SIGKILL: prepared transactions survive in the WAL
    server.start()
    restarted = PostgresTable(dsn, name, SCHEMA).committer()
    await restarted.recover({epoch: pending})
    assert sorted(prepared(dsn, name)) == sorted(pending["gids"])
    assert await restarted.commit(epoch, pending) == Committed()
    await restarted.aclose()
    assert_holds_only(dsn, name, [1, 2, 3])


async def test_task_writes_refuse_bad_arguments_and_keyed_tables_by_name(
    postgres_server: PostgresServer,
) -> None:
    dsn, name = postgres_server.dsn, postgres_server.unique_name()
    writes = writes_of(PostgresTable(dsn, name, SCHEMA))
    for arguments, argument in (((-1, 0, 0), "number"), ((1, "0", 0), "partition"),
                                ((1, 0, True), "attempt")):  # fmt: skip
        with pytest.raises(InvalidArgumentError) as info:
            writes.open_task(*arguments)  # type: ignore[arg-type]
        assert info.value.argument == argument
    with pytest.raises(InvalidArgumentError) as info:
        writes.adopt(1, "manifests")  # type: ignore[arg-type]
    assert info.value.argument == "manifests"
    keyed = PostgresTable(dsn, postgres_server.unique_name(), SCHEMA, key=["id"])
    assert isinstance(keyed.writer("0"), StagesOnExecutors)
    with pytest.raises(InvalidArgumentError) as info:
        executor_writes(keyed)
    assert info.value.argument == "table"


# In a runtime: the adopted transactions travel through the feed as a committable.


def pipeline(tmp_path: Path, table: PostgresTable) -> tuple[Runtime, BatchFeed, DeclaredSink]:
    feed = BatchFeed(SCHEMA)
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=3600.0))
    rt.add_source("events", feed.source)
    return rt, feed, add_sink(rt, "out", table, input="events", parallelism=2)


def adopted_batch(writes: PostgresExecutorWrites, key: str, batch_id: int) -> StagedBatch:
    """A micro-batch of two partitions, one with a speculative duplicate, adopted (what the
    bridge does between the Spark job and the delivery; blocking)."""
    number = staging_number()
    kept = [attempt(writes, number, 0, 2, [1, 2]), attempt(writes, number, 1, 4, [3])]
    attempt(writes, number, 1, 3, [3])  # the speculative copy Spark did not return
    return StagedBatch(key, batch_id, 2, tuple(writes.adopt(number, kept)), writes.root, writes)


async def test_a_committable_of_task_transactions_is_committed_once_by_the_epoch_holding_it(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    dsn, name = postgres_server.dsn, postgres_server.unique_name()
    table = PostgresTable(dsn, name, SCHEMA)
    writes = writes_of(table)
    rt, feed, sink = pipeline(tmp_path, table)
    async with rt:
        with anyio.fail_after(WAIT):
            key = await feed.position_key("s", rt)
            staged = await anyio.to_thread.run_sync(adopted_batch, writes, key, 0)
            epoch = await feed.deliver(
                rt, "s", 0, SCHEMA.empty_table(), retries=0,
                committables=[Committable("out", staged)],
            )  # fmt: skip
            assert epoch is not None
            await sink.coordinator.wait_committed(epoch)
    assert_holds_only(dsn, name, [1, 2, 3])


async def test_a_committable_whose_transactions_a_recovery_rolled_back_fails_its_epoch(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    dsn, name = postgres_server.dsn, postgres_server.unique_name()
    table = PostgresTable(dsn, name, SCHEMA)
    writes = writes_of(table)
    rt, feed, sink = pipeline(tmp_path, table)
    with pytest.raises(ActorFailedError) as stopped:
        async with rt:
            with anyio.fail_after(WAIT):
                key = await feed.position_key("s", rt)
                staged = await anyio.to_thread.run_sync(adopted_batch, writes, key, 0)
                # What the graph's recovery does meanwhile: nothing pending names them.
                recovering = table.committer()
                await recovering.recover({})
                await recovering.aclose()
                with pytest.raises(ActorFailedError) as info:
                    await feed.deliver(
                        rt, "s", 0, SCHEMA.empty_table(), retries=0,
                        committables=[Committable("out", staged)],
                    )  # fmt: skip
    assert stopped.value is info.value
    error = info.value.cause
    assert isinstance(error, StagedFilesGoneError)
    assert (error.batch, error.path) == (f"{key}#0", staged.manifests[0].files[0].path)
    assert sink.coordinator.stats().committed_epochs == 0
    assert_holds_only(dsn, name, [])


# Through a real local Spark (local[2,4]: a failed task is retried).


@pytest.fixture
def _chain_code_by_value() -> Iterator[None]:
    from pyspark import cloudpickle

    modules = (_executor_actors, _postgres_executor_actors)
    for module in modules:
        cloudpickle.register_pickle_by_value(module)
    yield
    for module in modules:
        if module.__name__ in cloudpickle.list_registry_pickle_by_value():
            cloudpickle.unregister_pickle_by_value(module)


@pytest.mark.spark
@pytest.mark.usefixtures("_chain_code_by_value")
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_micro_batch_from_tasks_whose_first_attempt_fails_is_in_the_table_exactly_once(
    spark: Any, postgres_server: PostgresServer, tmp_path: Path, backend: str
) -> None:
    dsn, name = postgres_server.dsn, postgres_server.unique_name()
    # Copies of 5 rows: the failing attempt has copied its rows when it fails at its end.
    table = PostgresTable(dsn, name, OUT, batch_rows=5)
    feed = BatchFeed(pa.schema([pa.field("id", pa.int64(), nullable=False)]))
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=3600.0))
    rt.add_source("events", feed.source)
    stream = (
        Stream(rt, "events")
        .filter(not_a_third)
        .apply("flaky", FailsFirstAttemptAtItsEnd)
        .map_batches(twice, schema=OUT)
    )
    sink = add_sink(rt, "out", table, input=stream.name, parallelism=2)
    with structlog.testing.capture_logs() as logs, BlockingRuntime(rt, backend=backend) as handle:
        bridge = SparkBridge(handle, feed, sink=sink)
        for batch_id in range(2):
            frame = spark.range(batch_id * 100, batch_id * 100 + 100, numPartitions=3)
            epoch = bridge.deliver(frame.selectExpr("id"), batch_id, run_on="executors")
            assert epoch is not None
        handle.call(sink.coordinator.wait_committed, epoch)
    failed = [e for e in logs if e["event"] == "executor task attempt failed"]
    assert {(e["partition"], e["actor"]) for e in failed} == {(FLAKY_PARTITION, "flaky")}
    assert len(failed) == 2  # the first attempt of partition 1, in each micro-batch
    rows = select(dsn, f'SELECT id FROM "{name}" ORDER BY id')
    assert rows == [i for i in range(200) if i % 3 != 0]
    assert select(dsn, f'SELECT count(*) FROM "{name}" WHERE twice <> 2 * id') == [0]
    assert prepared(dsn, name) == []
    # The failed attempts' records went with the adopt.
    assert not list(Path(writes_of(table).root).glob(".staging/*-tasks"))
