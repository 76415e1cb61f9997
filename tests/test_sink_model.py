"""Property: whatever writes, failures, checkpoints and crashes happen, the Parquet table holds
exactly the acknowledged rows — nothing lost, nothing duplicated.

A driver behaves as the Spark bridge does: a row is *acknowledged* once a checkpoint taken
after it returned; rows not acknowledged when the graph fails or the process crashes are
pushed again. Faults are injected into the table (a write or a commit that fails once) and
crashes end the runtime abruptly (no graceful stop), after which a new runtime opens the same
state file and table.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from _timeouts import scaled
from hypothesis import given, settings
from hypothesis import strategies as st

from barrierflow.actors import CommitMetadata, Committer, DeclaredSink, StagingWriter, add_sink
from barrierflow.channels import Chunk
from barrierflow.connectors import ParquetTable
from barrierflow.errors import ActorFailedError
from barrierflow.runtime import Runtime, RuntimeConfig

SCHEMA = pa.schema([("id", pa.int64())])


class Faults:
    def __init__(self) -> None:
        self.writes = 0
        self.commits = 0


class Faulty:
    """A Parquet table whose writers' next write or its committer's next commit fails when
    armed (a failed commit is retried by the coordinator)."""

    def __init__(self, path: Path, faults: Faults) -> None:
        self.inner = ParquetTable(path, SCHEMA, row_group_rows=4)
        self.faults = faults

    @property
    def schema(self) -> pa.Schema:
        return SCHEMA

    def writer(self, writer_id: str) -> FaultyWriter:
        return FaultyWriter(self.inner.writer(writer_id), self.faults)

    def committer(self) -> FaultyCommitter:
        return FaultyCommitter(self.inner.committer(), self.faults)


class FaultyWriter:
    """A staging writer whose next write fails when armed."""

    def __init__(self, inner: StagingWriter, faults: Faults) -> None:
        self.inner = inner
        self.faults = faults
        self.schema = inner.schema
        self.open, self.begin, self.flush = inner.open, inner.begin, inner.flush
        self.stage, self.discard, self.close = inner.stage, inner.discard, inner.close

    async def write(self, batch: pa.RecordBatch) -> None:
        if self.faults.writes:
            self.faults.writes -= 1
            raise OSError("injected write failure")
        await self.inner.write(batch)


class FaultyCommitter:
    """A committer whose next commit fails when armed."""

    def __init__(self, inner: Committer, faults: Faults) -> None:
        self.inner = inner
        self.faults = faults
        self.recover, self.prepare, self.abort = inner.recover, inner.prepare, inner.abort

    async def commit(self, epoch: int, metadata: CommitMetadata) -> None:
        if self.faults.commits:
            self.faults.commits -= 1
            raise OSError("injected commit failure")
        await self.inner.commit(epoch, metadata)


class SimulatedCrashError(Exception):
    """Ends a runtime abruptly, as a killed process would."""


def committed_ids(path: Path) -> list[int]:
    if not path.exists():
        return []
    return sorted(ds.dataset(path, SCHEMA, format="parquet").to_table()["id"].to_pylist())


steps = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(1, 5)),
        st.just(("checkpoint",)),
        st.just(("fail_write",)),
        st.just(("fail_commit",)),
        st.just(("crash",)),
    ),
    max_size=14,
)


class Driver:
    """Pushes numbered rows, acknowledges them at checkpoints, re-pushes after failures."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.table = root / "table"
        self.faults = Faults()
        self.next_id = 0
        self.acked: list[int] = []
        self.unacked: list[int] = []
        self.sink: DeclaredSink | None = None

    def runtime(self) -> Runtime:
        rt = Runtime(
            RuntimeConfig(
                state_path=str(self.root / "state.db"),
                barrier_interval=3600.0,
                recovery=True,
                max_restarts=1000,
                restart_backoff=0.001,
            )
        )
        rt.add_source("src")
        self.sink = add_sink(rt, "sink", Faulty(self.table, self.faults), input="src")
        return rt

    async def push(self, rt: Runtime, ids: list[int]) -> None:
        await rt.push("src", Chunk(pa.record_batch([pa.array(ids, pa.int64())], schema=SCHEMA)))

    async def checkpoint(self, rt: Runtime) -> int:
        """Checkpoint until it succeeds, pushing the unacknowledged rows again after a failure;
        the checkpoint's epoch."""
        for _ in range(20):
            try:
                epoch = await rt.checkpoint()
            except ActorFailedError:
                for i in range(0, len(self.unacked), 3):
                    await self._push_retrying(rt, self.unacked[i : i + 3])
                continue
            self.acked += self.unacked
            self.unacked = []
            committed = committed_ids(self.table)
            assert len(set(committed)) == len(committed), "a row was committed twice"
            assert set(committed) <= set(self.acked), "an unacknowledged row was committed"
            return epoch
        raise AssertionError("no checkpoint succeeded in 20 tries")

    async def _push_retrying(self, rt: Runtime, ids: list[int]) -> None:
        for _ in range(20):
            try:
                await self.push(rt, ids)
                return
            except ActorFailedError:
                continue  # pushed into a graph that just failed: push into the rebuilt one
        raise AssertionError("no push succeeded in 20 tries")

    async def run(self, plan: list[tuple[Any, ...]]) -> None:
        remaining = list(plan)
        while True:
            try:
                async with self.runtime() as rt:
                    # After a (re)start the table holds exactly the acknowledged rows.
                    lost, self.unacked = self.unacked, []
                    epoch = await self.checkpoint(rt)
                    # The coordinator commits what recovery found durable (retrying a failed
                    # commit): once it committed the checkpoint, the table holds exactly the
                    # acknowledged rows.
                    assert self.sink is not None
                    with anyio.fail_after(scaled(30)):
                        await self.sink.coordinator.wait_committed(epoch)
                    assert committed_ids(self.table) == sorted(self.acked)
                    self.unacked = lost
                    for i in range(0, len(self.unacked), 3):  # replay what the crash lost
                        await self._push_retrying(rt, self.unacked[i : i + 3])
                    while remaining:
                        step = remaining.pop(0)
                        if step[0] == "push":
                            ids = list(range(self.next_id, self.next_id + step[1]))
                            self.next_id += step[1]
                            self.unacked += ids
                            await self._push_retrying(rt, ids)
                        elif step[0] == "checkpoint":
                            await self.checkpoint(rt)
                        elif step[0] == "fail_write":
                            self.faults.writes = 1
                        elif step[0] == "fail_commit":
                            self.faults.commits = 1
                        elif step[0] == "crash":
                            raise SimulatedCrashError
                    self.faults.writes = self.faults.commits = 0
                    await self.checkpoint(rt)
                return
            except SimulatedCrashError:
                continue


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@settings(max_examples=20)
@given(plan=steps)
def test_table_always_equals_acknowledged_rows(backend: str, plan: list[tuple[Any, ...]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        driver = Driver(Path(tmp))
        anyio.run(driver.run, plan, backend=backend)
        assert committed_ids(driver.table) == list(range(driver.next_id))
        assert sorted(driver.acked) == list(range(driver.next_id))
