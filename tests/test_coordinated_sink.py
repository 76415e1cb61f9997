"""Parallel sink writers with a coordinator, in a runtime: the coordinated Parquet sink."""

from __future__ import annotations

import random
from pathlib import Path

import anyio
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from _timeouts import scaled

from barrierflow.actors import Coordinator
from barrierflow.actors.sinks.sink_writer import SinkWriter
from barrierflow.channels import Chunk, Update, VnodeBitmap
from barrierflow.connectors import ParquetTable
from barrierflow.runtime import Fanout, Runtime, RuntimeConfig
from barrierflow.testing import FailingTable

pytestmark = pytest.mark.anyio

SCHEMA = pa.schema([("id", pa.int64())])


def batch(start: int, count: int) -> Chunk:
    return Chunk(
        pa.record_batch([pa.array(range(start, start + count), pa.int64())], schema=SCHEMA)
    )


def ids(table: Path) -> list[int]:
    return sorted(ds.dataset(table, SCHEMA, format="parquet").to_table()["id"].to_pylist())


def build(tmp_path: Path, writers: int) -> tuple[Runtime, Coordinator]:
    table = tmp_path / "table"
    parquet = ParquetTable(table, SCHEMA)
    coordinator = Coordinator("table", parquet.committer())
    rt = Runtime(RuntimeConfig(state_path=str(tmp_path / "state.db"), barrier_interval=3600.0))
    rt.add_source("src", fanout=Fanout("hash", ("id",)))
    rt.add_service("coordinator", coordinator)
    for i in range(writers):
        rt.add_actor(
            f"writer{i}",
            lambda i=i: SinkWriter(
                lambda: parquet.writer(str(i)), coordinator=coordinator, writer_id=str(i)
            ),
            inputs=["src"],
        )
    return rt, coordinator


async def test_parallel_writers_commit_each_epoch_as_one_directory(tmp_path: Path) -> None:
    rt, coordinator = build(tmp_path, writers=3)
    async with rt:
        await rt.push("src", batch(0, 300))
        epoch = await rt.checkpoint()
        with anyio.fail_after(scaled(10)):
            await coordinator.wait_committed(epoch)
        assert ids(tmp_path / "table") == list(range(300))
        committed = [p for p in (tmp_path / "table").iterdir() if p.name.startswith("epoch=")]
        assert len(committed) == 1
        # Every writer's files, and the epoch's record (what it holds and from where).
        names = sorted(p.name for p in committed[0].iterdir())
        assert names == ["_PRECOMMITTED.json", "w0", "w1", "w2"]
        await rt.push("src", batch(300, 30))
    # The graceful stop committed the last epoch before the runtime returned.
    assert ids(tmp_path / "table") == list(range(330))
    assert coordinator.stats().committed_epochs == 2


async def test_restart_resumes_with_the_rewind_epoch_and_no_duplicates(tmp_path: Path) -> None:
    rt, _ = build(tmp_path, writers=2)
    async with rt:
        await rt.push("src", batch(0, 50))
        await rt.checkpoint()
    rt, coordinator = build(tmp_path, writers=2)
    async with rt:
        await rt.push("src", batch(50, 50))
        epoch = await rt.checkpoint()
        with anyio.fail_after(scaled(10)):
            await coordinator.wait_committed(epoch)
    assert ids(tmp_path / "table") == list(range(100))


async def test_rescaling_realigns_writers_and_keeps_every_row(tmp_path: Path) -> None:
    rt, coordinator = build(tmp_path, writers=3)
    async with rt:
        await rt.push("src", batch(0, 90))
        await rt.checkpoint()
        # Writer 2 leaves; writers 0 and 1 take over its vnodes.
        halves = VnodeBitmap.split(2)
        update = Update(
            vnode_bitmaps={rt.actor_id("writer0"): halves[0], rt.actor_id("writer1"): halves[1]},
            dropped_actors=frozenset({rt.actor_id("writer2")}),
        )
        with anyio.fail_after(scaled(10)):
            await rt.mutate(update)
        assert coordinator.stats().running == 2
        await rt.push("src", batch(90, 60))
        epoch = await rt.checkpoint()
        with anyio.fail_after(scaled(10)):
            await coordinator.wait_committed(epoch)
    assert ids(tmp_path / "table") == list(range(150))


async def test_round_robin_writers_share_the_coordinators_own_vnode_count(
    tmp_path: Path,
) -> None:
    # Round robin: no writer gets a bitmap from its input, so each registers an even share of
    # the coordinator's vnodes — of *its* count (16 here), which it must check against.
    parquet = ParquetTable(tmp_path / "table", SCHEMA)
    coordinator = Coordinator("table", parquet.committer(), vnode_count=16)
    rt = Runtime(RuntimeConfig(state_path=str(tmp_path / "state.db"), barrier_interval=3600.0))
    rt.add_source("src")
    rt.add_service("coordinator", coordinator)
    rt.add_actor(
        "writer",
        lambda i: SinkWriter(
            lambda: parquet.writer(str(i)), coordinator=coordinator, writer_id=str(i)
        ),
        inputs=["src"],
        parallelism=2,
    )
    async with rt:
        await rt.push("src", batch(0, 40))
        epoch = await rt.checkpoint()
        with anyio.fail_after(scaled(10)):
            await coordinator.wait_committed(epoch)
        assert coordinator.stats().running == 2
    assert ids(tmp_path / "table") == list(range(40))


class _FixedDraw(random.Random):
    """A jitter source that always draws ``value``: the retry delay is known in advance."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


async def test_a_writer_dropped_while_a_commit_waits_to_be_retried_leaves_at_its_barrier(
    tmp_path: Path,
) -> None:
    # The epoch's commit fails once and waits ~0.5 s for its retry (base 10 s x draw 0.05).
    # Meanwhile writer 2 is dropped. It must leave the coordinator at its Stop barrier: if it
    # waited for its last epoch's commit first, the coordinator — realigning the others, and
    # committing nothing until that is done — and the writer would wait on each other.
    table = FailingTable(ParquetTable(tmp_path / "table", SCHEMA))
    coordinator = Coordinator("table", table.committer(), base_delay=10.0, rng=_FixedDraw(0.05))
    rt = Runtime(RuntimeConfig(state_path=str(tmp_path / "state.db"), barrier_interval=3600.0))
    rt.add_source("src", fanout=Fanout("hash", ("id",)))
    rt.add_service("coordinator", coordinator)
    for i in range(3):
        rt.add_actor(
            f"writer{i}",
            lambda i=i: SinkWriter(
                lambda: table.writer(str(i)), coordinator=coordinator, writer_id=str(i)
            ),
            inputs=["src"],
        )
    async with rt:
        table.fail("commit")
        await rt.push("src", batch(0, 90))
        epoch = await rt.checkpoint()
        with anyio.fail_after(scaled(10)):
            await table.wait_called("commit")  # failed: the retry is scheduled
        halves = VnodeBitmap.split(2)
        update = Update(
            vnode_bitmaps={rt.actor_id("writer0"): halves[0], rt.actor_id("writer1"): halves[1]},
            dropped_actors=frozenset({rt.actor_id("writer2")}),
        )
        with anyio.fail_after(scaled(10)):
            await rt.mutate(update)
            await rt.checkpoint()  # the others realigned and passed it
        assert coordinator.stats().running == 2
        with anyio.fail_after(scaled(10)):
            await coordinator.wait_committed(epoch)
        assert table.called("commit")[:2] == [epoch, epoch]  # failed, then retried
    assert ids(tmp_path / "table") == list(range(90))
