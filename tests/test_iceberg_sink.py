"""What only the Iceberg sink does: snapshot expiry, opening its catalog off the event loop.

The rules every coordinated table keeps (one snapshot per epoch recording it, replays
skipped by the committed-epoch property, abort, recovery, positions, rescaling, schema
changes, commit timings, SIGKILLed commits) are in ``test_tables.py``, run against Parquet,
Iceberg and Delta alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pytest
from _timeouts import scaled

from barrierflow import InvalidArgumentError
from barrierflow.actors import Coordinator, SinkWriter, add_sink
from barrierflow.channels import Chunk
from barrierflow.connectors import IcebergSink, open_local_catalog
from barrierflow.runtime import Fanout, Job, Runtime, RuntimeConfig

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False)])


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
