"""The sink writer in a runtime: epochs from barriers, commit after durability, recovery."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from _timeouts import scaled

from barrierflow import ActorFailedError, ProtocolError, SinkConnectorError
from barrierflow.actors import CommitMetadata, PendingCommit, SinkWriter
from barrierflow.channels import Chunk, Op
from barrierflow.connectors import ParquetFileSink
from barrierflow.runtime import Runtime, RuntimeConfig

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


class Recording:
    """A connector that records its calls (and what the runtime had committed at each commit)
    around a real Parquet sink, failing on cue."""

    exactly_once = True

    def __init__(self, path: Path, faults: Faults, calls: list[tuple[Any, ...]]) -> None:
        self.inner = ParquetFileSink(path, SCHEMA)
        self.faults = faults
        self.calls = calls
        self.runtime: Runtime | None = None

    @property
    def schema(self) -> pa.Schema:
        return SCHEMA

    async def open(self) -> None:
        await self.inner.open()

    async def recover(self, pending: Sequence[PendingCommit]) -> None:
        self.calls.append(("recover", tuple(p.epoch for p in pending)))
        await self.inner.recover(pending)

    async def begin_epoch(self, epoch: int) -> None:
        self.calls.append(("begin", epoch))
        await self.inner.begin_epoch(epoch)

    async def write_batch(self, batch: pa.RecordBatch) -> None:
        if self.faults.writes:
            self.faults.writes -= 1
            raise OSError("disk full")
        self.calls.append(("write", batch.num_rows))
        await self.inner.write_batch(batch)

    async def flush(self) -> None:
        await self.inner.flush()

    async def pre_commit(self, epoch: int) -> CommitMetadata:
        if self.faults.pre_commits:
            self.faults.pre_commits -= 1
            raise OSError("fsync failed")
        self.calls.append(("pre_commit", epoch))
        return await self.inner.pre_commit(epoch)

    async def commit_epoch(self, epoch: int) -> None:
        committed = None if self.runtime is None else self.runtime.committed_epoch
        if self.faults.commits:
            self.faults.commits -= 1
            if self.faults.tripped is not None:
                self.faults.tripped.set()
            raise OSError("rename failed")
        self.calls.append(("commit", epoch, committed))
        await self.inner.commit_epoch(epoch)
        if self.faults.committed is not None:
            self.faults.committed.set()

    async def rollback_epoch(self, epoch: int) -> None:
        self.calls.append(("rollback", epoch))
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
    from barrierflow import InvalidArgumentError

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
