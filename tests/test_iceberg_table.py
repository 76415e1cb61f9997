"""What only the Iceberg sink does: the table conformance suite (crash steps included),
snapshot expiry, opening its catalog off the event loop.

The rules every coordinated table keeps (one snapshot per epoch recording it, replays
skipped by the committed-epoch property, abort, recovery, positions, rescaling, schema
changes, commit timings, SIGKILLed commits) are in ``test_tables.py``, run against Parquet,
Iceberg and Delta alike."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pyiceberg.catalog.sql  # what the tables import lazily: imported once by the crash
import pyiceberg.io.pyarrow  # noqa: F401  # suite's fork server, not in each child (1 s each)
import pytest
from _timeouts import scaled

from barrierflow.actors import Coordinator, add_sink
from barrierflow.actors.sinks.sink_writer import SinkWriter
from barrierflow.channels import Chunk
from barrierflow.connectors import IcebergTable, open_local_catalog
from barrierflow.errors import InvalidArgumentError
from barrierflow.runtime import Fanout, Job, Runtime, RuntimeConfig
from barrierflow.testing.conformance import check_table
from barrierflow.testing.crash_conformance import CRASH_RULES

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False)])
#: The directory the conformance factory reaches, in this process and in the suite's children.
STORAGE_ENV = "BARRIERFLOW_ICEBERG_CONFORMANCE_STORAGE"


def batch(start: int, count: int) -> Chunk:
    return Chunk(
        pa.record_batch([pa.array(range(start, start + count), pa.int64())], schema=SCHEMA)
    )


def build(
    tmp_path: Path, writers: int = 2, **committer: Any
) -> tuple[Runtime, IcebergTable, Coordinator]:
    sink = IcebergTable(open_local_catalog(tmp_path / "catalog"), "ns.events", SCHEMA)
    coordinator = Coordinator("events", sink.committer(**committer))
    rt = Runtime(RuntimeConfig(state_path=str(tmp_path / "state.db"), barrier_interval=3600.0))
    rt.add_source("src", fanout=Fanout("hash", ("id",)))
    rt.add_service("coordinator", coordinator)
    for i in range(writers):
        rt.add_actor(
            f"writer{i}",
            lambda i=i: SinkWriter(
                lambda: sink.writer(str(i)), coordinator=coordinator, writer_id=str(i)
            ),
            inputs=["src"],
        )
    return rt, sink, coordinator


def ids(sink: IcebergTable) -> list[int]:
    return sorted(sink.table().scan().to_arrow()["id"].to_pylist())


# The conformance suite: an Iceberg table, importable by name for the crash children, over
# the storage named by STORAGE_ENV.


def conformance_table() -> IcebergTable:
    """An Iceberg table in a local catalog under ``$STORAGE_ENV`` (what the suite drives)."""
    catalog = open_local_catalog(Path(os.environ[STORAGE_ENV]) / "catalog")
    return IcebergTable(catalog, "ns.conformance", pa.schema([("id", pa.int64())]))


def conformance_read() -> list[int]:
    """The ids pyiceberg's scan sees in :func:`conformance_table`'s table."""
    found: list[int] = conformance_table().table().scan().to_arrow()["id"].to_pylist()
    return found


@pytest.mark.anyio
@pytest.mark.subprocess
async def test_the_iceberg_table_keeps_the_commit_protocol_across_crashes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(STORAGE_ENV, str(tmp_path))
    report = await check_table(conformance_table, conformance_read, crash_steps=True)
    report.raise_for_failures()
    assert [r.rule for r in report.results][-len(CRASH_RULES) :] == list(CRASH_RULES)


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
    sink = await IcebergTable.open(open_local_catalog(tmp_path / "catalog"), "ns.events", SCHEMA)
    with pytest.raises(InvalidArgumentError) as bad:
        await IcebergTable.open(sink.catalog, "no-namespace", SCHEMA)
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
