"""The test kit's tables: an in-memory exactly-once table, and a wrapper that fails or hangs
any table's writers and committer on cue — in a running graph, on both backends."""

from __future__ import annotations

from pathlib import Path

import anyio
import pyarrow as pa
import pytest
from _timeouts import scaled

from barrierflow.actors import add_sink
from barrierflow.actors.sinks.table import Committer, Manifest, StagingWriter, Table
from barrierflow.channels import Chunk
from barrierflow.errors import ActorFailedError, InvalidArgumentError, TableCommitFailedError
from barrierflow.runtime import Runtime, RuntimeConfig
from barrierflow.testing.sinks import FailingTable, InjectedFaultError, ListTable

pytestmark = pytest.mark.anyio

SCHEMA = pa.schema([("id", pa.int64())])


def chunk(*ids: int) -> Chunk:
    return Chunk(pa.record_batch({"id": list(ids)}, schema=SCHEMA))


def ids(table: ListTable) -> list[int]:
    return sorted(table.rows().column("id").to_pylist())


async def staged(writer: StagingWriter, epoch: int, *rows: int) -> Manifest:
    await writer.begin(epoch)
    await writer.write(chunk(*rows).batch)
    return await writer.stage(epoch)


async def test_a_list_table_commits_each_epoch_once_after_its_checkpoint(tmp_path: Path) -> None:
    table = ListTable(SCHEMA)
    assert isinstance(table, Table)
    assert isinstance(table.writer("0"), StagingWriter)
    assert isinstance(table.committer(), Committer)
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=3600))
    rt.add_source("src")
    declared = add_sink(rt, "out", table, input="src")
    with anyio.fail_after(scaled(20)):
        async with rt:
            await rt.push("src", chunk(1, 2))
            assert table.committed == {}  # nothing visible before a checkpoint
            await rt.checkpoint()
            await rt.push("src", chunk(3))
            epoch = await rt.checkpoint()
            await declared.coordinator.wait_committed(epoch)
            assert ids(table) == [1, 2, 3]
    assert declared.writers == ("out",)
    assert ids(table) == [1, 2, 3]
    assert [t.num_rows for t in table.committed.values() if t.num_rows] == [2, 1]
    assert list(table.committed) == sorted(table.committed)  # one entry per epoch, in order
    assert table.staged == {}  # every staged batch was committed


async def test_a_failed_commit_is_retried_with_every_row_exactly_once(tmp_path: Path) -> None:
    table = ListTable(SCHEMA)
    failing = FailingTable(table)
    failing.fail("commit")
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=3600))
    rt.add_source("src")
    declared = add_sink(rt, "out", failing, input="src")
    with anyio.fail_after(scaled(30)):
        async with rt:
            await rt.push("src", chunk(1, 2))
            first = await rt.checkpoint()  # durable; its commit fails, then is retried
            await rt.push("src", chunk(3))
            second = await rt.checkpoint()
            await declared.coordinator.wait_committed(second)
    assert ids(table) == [1, 2, 3]  # the failed epoch committed by the retry, not lost or twice
    assert failing.called("commit")[:2] == [first, first]


async def test_a_commit_failed_for_good_fails_the_runtime_with_table_commit_failed_error(
    tmp_path: Path,
) -> None:
    table = ListTable(SCHEMA)
    failing = FailingTable(table)
    failing.fail("commit", permanent=True)
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=3600))
    rt.add_source("src")
    add_sink(rt, "out", failing, input="src")
    with anyio.fail_after(scaled(30)), pytest.raises(ActorFailedError) as info:
        async with rt:
            await rt.push("src", chunk(1, 2))
            epoch = await rt.checkpoint()  # durable: its commit says Failed
            await anyio.sleep_forever()  # the runtime fails and cancels this
    # The root failure is the coordinator's (the writers' aborts only follow from it).
    assert info.value.actor == "out.coordinator"
    error = info.value.cause
    assert isinstance(error, TableCommitFailedError)
    assert (error.sink, error.epoch, error.permanent) == ("out", epoch, True)
    assert isinstance(error.cause, InjectedFaultError)
    assert failing.called("commit") == [epoch]  # not retried
    assert table.committed == {}


def test_fail_for_good_is_for_commits_only() -> None:
    failing = FailingTable(ListTable(SCHEMA))
    for method, permanent in (("write", True), ("commit", 1)):
        with pytest.raises(InvalidArgumentError) as info:
            failing.fail(method, permanent=permanent)  # type: ignore[arg-type]
        assert info.value.argument == "permanent"


async def test_a_hanging_call_waits_for_release_and_a_fault_fires_as_often_as_asked() -> None:
    failing = FailingTable(ListTable(SCHEMA))
    writer = failing.writer("0")
    failing.hang("flush")
    done = anyio.Event()

    async def flush() -> None:
        await writer.flush()
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(flush)
        await failing.wait_called("flush")
        await anyio.wait_all_tasks_blocked()
        assert not done.is_set()
        failing.release("flush")
    assert done.is_set()
    failing.fail("begin", times=2)
    for _ in range(2):
        with pytest.raises(InjectedFaultError) as fault:
            await writer.begin(5)
        assert fault.value.method == "begin"
    await writer.begin(5)  # the third goes through
    assert failing.called("begin") == [5, 5, 5]
    committer = failing.committer()
    failing.fail("recover")
    with pytest.raises(InjectedFaultError):
        await committer.recover({7: {"paths": []}})
    assert failing.called("recover") == [(7,)]


async def test_recover_keeps_the_pending_epochs_and_drops_the_rest() -> None:
    table = ListTable(SCHEMA)
    writer, committer = table.writer("0"), table.committer()
    await writer.open()
    meta1 = await committer.prepare(1, [await staged(writer, 1, 1)])
    await committer.prepare(2, [await staged(writer, 2, 2)])  # never reached the meta store
    assert meta1 is not None
    assert ids(table) == []  # staged and prepared: nothing visible
    restarted = table.committer()
    await restarted.recover({1: meta1})
    assert sorted(table.staged) == sorted(meta1["paths"])  # epoch 2's batches are gone
    await restarted.commit(1, meta1)
    assert ids(table) == [1]
    await restarted.commit(1, meta1)  # replayed: a no-op
    assert ids(table) == [1]
    assert table.last_committed == 1


async def test_a_discarded_epoch_leaves_nothing_staged() -> None:
    table = ListTable(SCHEMA)
    writer = table.writer("0")
    await writer.begin(3)
    await writer.write(chunk(1).batch)
    await writer.discard(3)
    assert table.staged == {}
    committer = table.committer()
    metadata = await committer.prepare(4, [await staged(writer, 4, 2)])
    assert metadata is not None
    await committer.commit(4, metadata)
    assert ids(table) == [2]  # the next epoch holds only its own rows


def test_bad_input_is_refused_with_what_was_expected() -> None:
    with pytest.raises(InvalidArgumentError) as schema:
        ListTable("id int64")
    assert schema.value.argument == "schema"
    with pytest.raises(InvalidArgumentError) as inner:
        FailingTable(object())  # type: ignore[arg-type]
    assert inner.value.argument == "inner"
    failing = FailingTable(ListTable(SCHEMA))
    with pytest.raises(InvalidArgumentError) as method:
        failing.fail("write_batch")
    assert method.value.argument == "method"
    with pytest.raises(InvalidArgumentError) as times:
        failing.fail("write", times=0)
    assert times.value.argument == "times"
