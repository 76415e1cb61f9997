"""The coordinated Iceberg sink: one snapshot per epoch, idempotent commits, crash recovery."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pytest
from _timeouts import scaled

from barrierflow import InvalidArgumentError
from barrierflow.actors import Coordinator, SinkWriter, add_sink
from barrierflow.channels import Chunk
from barrierflow.connectors import IcebergSink, iceberg_sink, open_local_catalog
from barrierflow.connectors.iceberg_sink import COMMITTED_EPOCH_PROPERTY
from barrierflow.runtime import Fanout, Job, Runtime, RuntimeConfig

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False)])
ROOT = Path(__file__).resolve().parents[1]


def batch(start: int, count: int) -> Chunk:
    return Chunk(
        pa.record_batch([pa.array(range(start, start + count), pa.int64())], schema=SCHEMA)
    )


def build(
    tmp_path: Path, writers: int = 2, **committer: Any
) -> tuple[Runtime, IcebergSink, Coordinator]:
    sink = IcebergSink(open_local_catalog(tmp_path / "catalog"), "ns.events", SCHEMA)
    coordinator = Coordinator("events", sink.committer(**committer))
    rt = Runtime(RuntimeConfig(state_path=str(tmp_path / "state.db"), barrier_interval=3600.0))
    rt.add_source("src", fanout=Fanout("hash", ("id",)))
    rt.add_service("coordinator", coordinator)
    for i in range(writers):
        rt.add_actor(
            f"writer{i}",
            lambda i=i: SinkWriter(lambda: sink.writer(str(i)), coordinator=coordinator),
            inputs=["src"],
        )
    return rt, sink, coordinator


def ids(sink: IcebergSink) -> list[int]:
    return sorted(sink.table().scan().to_arrow()["id"].to_pylist())


@pytest.mark.anyio
async def test_each_epoch_is_one_snapshot_recording_its_epoch(tmp_path: Path) -> None:
    rt, sink, coordinator = build(tmp_path)
    durable = []
    async with rt:
        for k in range(3):
            await rt.push("src", batch(k * 10, 10))
            durable.append(await rt.checkpoint())
            with anyio.fail_after(scaled(10)):
                await coordinator.wait_committed(durable[-1])
    table = sink.table()
    assert ids(sink) == list(range(30))
    assert len(table.snapshots()) == 3  # the last, empty epoch of the stop adds none
    assert int(table.properties[COMMITTED_EPOCH_PROPERTY]) == durable[-1]
    assert table.current_snapshot().summary["barrierflow.epoch"] == str(durable[-1])


@pytest.mark.anyio
async def test_replayed_commit_is_skipped_by_the_epoch_property(tmp_path: Path) -> None:
    rt, sink, coordinator = build(tmp_path, writers=1)
    async with rt:
        await rt.push("src", batch(0, 5))
        epoch = await rt.checkpoint()
        with anyio.fail_after(scaled(10)):
            await coordinator.wait_committed(epoch)
    committer = sink.committer()
    metadata = {"staging_epoch": 1, "paths": [".staging/00000000000000000001/w0/x.parquet"]}
    await committer.commit(epoch, metadata, None)  # replay: would fail if not skipped
    assert len(sink.table().snapshots()) == 1
    assert ids(sink) == list(range(5))


@pytest.mark.anyio
async def test_abort_deletes_the_files_of_an_uncommitted_epoch(tmp_path: Path) -> None:
    sink = IcebergSink(open_local_catalog(tmp_path / "catalog"), "ns.events", SCHEMA)
    writer = sink.writer("0")
    await writer.open()
    await writer.begin_epoch(7)
    await writer.write_batch(batch(0, 3).batch)
    metadata = await writer.pre_commit(7)
    staged = [sink.data_path / p for p in metadata["paths"]]
    assert all(p.exists() for p in staged)
    committer = sink.committer()
    pre = await committer.pre_commit(100, [metadata], None)
    await committer.abort(100, pre)
    assert not any(p.exists() for p in staged)
    assert sink.table().current_snapshot() is None


@pytest.mark.anyio
async def test_schema_change_adds_columns_in_the_commit(tmp_path: Path) -> None:
    sink = IcebergSink(open_local_catalog(tmp_path / "catalog"), "ns.events", SCHEMA)
    committer = sink.committer()
    change = {"add_columns": [{"name": "note", "type": "string"}]}
    pre = await committer.pre_commit(5, [{"epoch": 1, "paths": [], "rows": 0}], change)
    await committer.commit(5, pre, change)
    table = sink.table()
    assert table.schema().find_field("note") is not None
    assert int(table.properties[COMMITTED_EPOCH_PROPERTY]) == 5
    with pytest.raises(InvalidArgumentError):
        await committer.pre_commit(6, [{"epoch": 2}], {"drop": "id"})


@pytest.mark.anyio
async def test_commit_seconds_keep_a_bounded_recent_window_and_count_every_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(iceberg_sink, "RECENT_COMMITS", 2)
    sink = IcebergSink(open_local_catalog(tmp_path / "catalog"), "ns.events", SCHEMA)
    committer = sink.committer()
    for epoch, column in ((5, "a"), (6, "b"), (7, "c")):
        change = {"add_columns": [{"name": column, "type": "string"}]}
        pre = await committer.pre_commit(epoch, [{"epoch": epoch, "paths": [], "rows": 0}], change)
        await committer.commit(epoch, pre, change)
    assert committer.commits == 3
    assert len(committer.commit_seconds) == 2  # only the latest are kept
    assert all(seconds >= 0 for seconds in committer.commit_seconds)


@pytest.mark.anyio
async def test_old_snapshots_are_expired(tmp_path: Path) -> None:
    rt, sink, coordinator = build(tmp_path, writers=1, keep_snapshots=2, expire_every=2)
    async with rt:
        for k in range(6):
            await rt.push("src", batch(k, 1))
            epoch = await rt.checkpoint()
            with anyio.fail_after(scaled(10)):
                await coordinator.wait_committed(epoch)
    table = sink.table()
    assert len(table.snapshots()) <= 3
    assert ids(sink) == list(range(6))  # expiry never loses current rows


@pytest.mark.anyio
async def test_an_iceberg_sink_opened_off_the_loop_joins_a_running_pipeline(
    tmp_path: Path,
) -> None:
    # The catalog I/O on a worker thread; then two coordinated writers join at an Add barrier
    # (their first barrier, not the initial one) and see exactly the rows after it.
    sink = await IcebergSink.open(open_local_catalog(tmp_path / "catalog"), "ns.events", SCHEMA)
    with pytest.raises(InvalidArgumentError) as bad:
        await IcebergSink.open(sink.catalog, "no-namespace", SCHEMA)
    assert bad.value.argument == "identifier"
    rt = Runtime(RuntimeConfig(state_path=str(tmp_path / "state.db"), barrier_interval=3600.0))
    rt.add_source("src")
    with anyio.fail_after(scaled(60)):
        async with rt:
            await rt.push("src", batch(0, 10))
            await rt.checkpoint()
            job = Job("lake")
            declared = add_sink(job, "events", sink, input="src", parallelism=2, key=("id",))
            await rt.add_job(job)
            await rt.push("src", batch(10, 20))
            epoch = await rt.checkpoint()
            assert declared.coordinator is not None
            await declared.coordinator.wait_committed(epoch)
            assert ids(sink) == list(range(10, 30))


def test_a_table_schema_that_differs_is_refused(tmp_path: Path) -> None:
    catalog = open_local_catalog(tmp_path / "catalog")
    IcebergSink(catalog, "ns.events", SCHEMA)
    nullable = pa.schema([pa.field("id", pa.int64(), nullable=True)])
    with pytest.raises(InvalidArgumentError) as info:
        IcebergSink(catalog, "ns.events", nullable)
    assert info.value.argument == "schema"


# A real process, SIGKILLed at a chosen point of the first epoch's commit.
CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import anyio, pyarrow as pa
    sys.path.insert(0, {tests!r})
    from test_iceberg_sink import batch, build
    from pathlib import Path

    point = os.environ["KILL_AT"]
    if point == "before_durable":
        from barrierflow.connectors.iceberg_sink import IcebergCommitter
        async def pre_commit(self, *args):
            os.kill(os.getpid(), signal.SIGKILL)
        IcebergCommitter.pre_commit = pre_commit
    elif point == "after_pending":
        from barrierflow.connectors.iceberg_sink import IcebergCommitter
        def commit(self, *args):
            os.kill(os.getpid(), signal.SIGKILL)
        IcebergCommitter._commit = commit
    elif point == "after_commit":
        # The committed mark is written with the next pending record (or at the end).
        from barrierflow.actors.sinks import SinkStates
        persist = SinkStates.persist_pending
        async def persist_pending(self, *args, committed=None):
            if committed is not None:
                os.kill(os.getpid(), signal.SIGKILL)
            await persist(self, *args, committed=committed)
        async def commit_and_prune(self, epoch):
            os.kill(os.getpid(), signal.SIGKILL)
        SinkStates.persist_pending = persist_pending
        SinkStates.commit_and_prune = commit_and_prune

    async def main():
        rt, sink, coordinator = build(Path(sys.argv[1]))
        async with rt:
            for k in range(3):
                await rt.push("src", batch(k * 10, 10))
                await rt.checkpoint()
                print("DURABLE", k, flush=True)
            await anyio.sleep_forever()

    anyio.run(main, backend=sys.argv[2])
    """
)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize(
    ("point", "expected"),
    [("before_durable", []), ("after_pending", list(range(10))), ("after_commit", list(range(10)))],
)
def test_killed_mid_commit_restarts_with_each_epoch_once(
    tmp_path: Path, backend: str, point: str, expected: list[int]
) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(tests=str(ROOT / "tests")))
    child = subprocess.run(
        [sys.executable, str(script), str(tmp_path), backend],
        env={**os.environ, "KILL_AT": point},
        capture_output=True,
        text=True,
        timeout=scaled(60),
        cwd=ROOT,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]

    async def restart() -> list[int]:
        rt, sink, coordinator = build(tmp_path)
        async with rt:
            epoch = await rt.checkpoint()
            with anyio.fail_after(scaled(20)):
                await coordinator.wait_committed(epoch)
        staged = sink.data_path / ".staging"
        assert not any(staged.iterdir()), "aborted or orphaned files were left staged"
        return ids(sink)

    assert anyio.run(restart, backend=backend) == expected
