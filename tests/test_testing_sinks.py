"""The test kit's sink connectors: an in-memory exactly-once sink, and a wrapper that fails or
hangs any connector on cue — in a running graph, on both backends."""

from __future__ import annotations

from pathlib import Path

import anyio
import pyarrow as pa
import pytest
from _timeouts import scaled

from barrierflow import InvalidArgumentError
from barrierflow.actors import add_sink
from barrierflow.actors.sinks.protocol import PendingCommit, SinkConnector
from barrierflow.channels import Chunk
from barrierflow.runtime import Runtime, RuntimeConfig
from barrierflow.testing.sinks import FailingConnector, InjectedFaultError, ListSink

pytestmark = pytest.mark.anyio

SCHEMA = pa.schema([("id", pa.int64())])


def chunk(*ids: int) -> Chunk:
    return Chunk(pa.record_batch({"id": list(ids)}, schema=SCHEMA))


def ids(sink: ListSink) -> list[int]:
    return sorted(sink.rows().column("id").to_pylist())


async def test_a_list_sink_commits_each_epoch_once_after_its_checkpoint(tmp_path: Path) -> None:
    sink = ListSink(SCHEMA)
    assert isinstance(sink, SinkConnector)
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=3600))
    rt.add_source("src")
    writers = add_sink(rt, "out", lambda: sink, input="src")
    with anyio.fail_after(scaled(20)):
        async with rt:
            await rt.push("src", chunk(1, 2))
            assert sink.committed == {}  # nothing visible before a checkpoint
            await rt.checkpoint()
            await rt.push("src", chunk(3))
            await rt.checkpoint()
    assert writers.writers == ("out",)
    assert ids(sink) == [1, 2, 3]
    assert [t.num_rows for t in sink.committed.values() if t.num_rows] == [2, 1]
    assert list(sink.committed) == sorted(sink.committed)  # one entry per epoch, in order


async def test_a_failed_commit_is_recovered_with_every_row_exactly_once(tmp_path: Path) -> None:
    sink = ListSink(SCHEMA)
    failing = FailingConnector(sink)
    failing.fail("commit_epoch")
    config = RuntimeConfig(
        state_path=tmp_path / "state.db", barrier_interval=3600, recovery=True,
        restart_backoff=0.01,
    )  # fmt: skip
    rt = Runtime(config)
    rt.add_source("src")
    add_sink(rt, "out", lambda: failing, input="src")
    with anyio.fail_after(scaled(30)):
        async with rt:
            await rt.push("src", chunk(1, 2))
            await rt.checkpoint()  # durable; its commit fails: the graph is rebuilt
            await failing.wait_called("recover", 2)  # the rebuilt sink recovered it
            await rt.wait_running()
            await rt.push("src", chunk(3))
            await rt.checkpoint()
            await rt.checkpoint()
    assert ids(sink) == [1, 2, 3]  # the failed epoch committed by recovery, not lost or twice
    assert rt.stats().restarts == 1


async def test_a_hanging_call_waits_for_release_and_a_fault_fires_as_often_as_asked() -> None:
    failing = FailingConnector(ListSink(SCHEMA))
    failing.hang("flush")
    done = anyio.Event()

    async def flush() -> None:
        await failing.flush()
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(flush)
        await anyio.wait_all_tasks_blocked()
        assert not done.is_set()
        failing.release("flush")
    assert done.is_set()
    failing.fail("begin_epoch", times=2)
    for _ in range(2):
        with pytest.raises(InjectedFaultError) as fault:
            await failing.begin_epoch(5)
        assert fault.value.method == "begin_epoch"
    await failing.begin_epoch(5)  # the third goes through
    assert failing.called("begin_epoch") == [5, 5, 5]


async def test_recover_commits_the_pending_epochs_it_holds_and_drops_the_rest() -> None:
    sink = ListSink(SCHEMA)
    for epoch, rows in ((1, [1]), (2, [2])):
        await sink.begin_epoch(epoch)
        await sink.write_batch(pa.record_batch({"id": rows}, schema=SCHEMA))
        await sink.pre_commit(epoch)
    await sink.recover([PendingCommit(1, {})])  # epoch 2's checkpoint never became durable
    assert ids(sink) == [1]
    await sink.commit_epoch(1)  # replayed: a no-op
    assert ids(sink) == [1]


def test_bad_input_is_refused_with_what_was_expected() -> None:
    with pytest.raises(InvalidArgumentError) as schema:
        ListSink("id int64")  # type: ignore[arg-type]
    assert schema.value.argument == "schema"
    with pytest.raises(InvalidArgumentError) as inner:
        FailingConnector(object())  # type: ignore[arg-type]
    assert inner.value.argument == "inner"
    failing = FailingConnector(ListSink(SCHEMA))
    with pytest.raises(InvalidArgumentError) as method:
        failing.fail("write")
    assert method.value.argument == "method"
    with pytest.raises(InvalidArgumentError) as times:
        failing.fail("write_batch", times=0)
    assert times.value.argument == "times"
