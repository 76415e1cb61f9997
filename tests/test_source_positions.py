"""Exactly-once survives the loss of the runtime's state: sinks record source positions.

Each exactly-once sink records, in the same atomic commit as the rows, the source positions
(``"<source>/<stream>"`` → batch id) they reach. A new or empty store next to a sink holding
commits is refused, unless the runtime adopts the sink's positions; a store that went back in
time has the sink skip the epochs it holds.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from hypothesis import given
from hypothesis import strategies as st

from barrierflow.actors import BatchFeed, CommitMetadata, Coordinator, Manifest, add_sink
from barrierflow.actors.sinks.positions import epoch_already_held
from barrierflow.actors.sinks.sink_writer import SinkWriter
from barrierflow.channels import VnodeBitmap
from barrierflow.connectors import IcebergTable, ParquetTable, open_local_catalog
from barrierflow.connectors.iceberg_table import POSITIONS_PROPERTY
from barrierflow.errors import PositionOverlapError, SinkStateMismatchError
from barrierflow.runtime import Fanout, Runtime, RuntimeConfig
from barrierflow.testing import ListTable

pytestmark = pytest.mark.anyio

SCHEMA = pa.schema([("id", pa.int64())])
ROWS = 50


def rows_of(batch_id: int) -> pa.Table:
    start = batch_id * ROWS
    return pa.table({"id": pa.array(range(start, start + ROWS), pa.int64())}, schema=SCHEMA)


def parquet_ids(table: Path) -> list[int]:
    return sorted(ds.dataset(table, SCHEMA, format="parquet").to_table()["id"].to_pylist())


def parquet_runtime(tmp_path: Path, feed: BatchFeed, *, adopt: bool = False) -> Runtime:
    rt = Runtime(
        RuntimeConfig(
            state_path=str(tmp_path / "state.db"),
            barrier_interval=3600.0,
            adopt_sink_positions=adopt,
        )
    )
    rt.add_source("src", feed.source)
    add_sink(rt, "sink", ParquetTable(tmp_path / "table", SCHEMA), input="src")
    return rt


async def deliver(rt: Runtime, feed: BatchFeed, batch_ids: range) -> list[int | None]:
    return [await feed.deliver(rt, "q", b, rows_of(b)) for b in batch_ids]


def forget_state(tmp_path: Path) -> None:
    for path in tmp_path.glob("state.db*"):
        path.unlink()


def back_up_state(tmp_path: Path) -> None:
    backup = tmp_path / "backup"
    backup.mkdir()
    for path in tmp_path.glob("state.db*"):
        shutil.copy2(path, backup / path.name)


def restore_state(tmp_path: Path) -> None:
    """Put the backed-up store back: the runtime's state goes back in time."""
    forget_state(tmp_path)
    for path in (tmp_path / "backup").iterdir():
        shutil.copy2(path, tmp_path / path.name)


async def test_parquet_commits_record_the_positions_with_the_rows(tmp_path: Path) -> None:
    feed = BatchFeed(SCHEMA)
    async with parquet_runtime(tmp_path, feed) as rt:
        await deliver(rt, feed, range(3))
    manifest = json.loads((tmp_path / "table" / "_manifest.json").read_text())
    assert manifest["positions"] == {"src/q": 2}
    # Each epoch directory carries its own record, renamed into place with its files.
    records = [
        json.loads((d / "_PRECOMMITTED.json").read_text())
        for d in sorted((tmp_path / "table").glob("epoch=*"))
    ]
    assert [r["positions"] for r in records] == [{"src/q": 0}, {"src/q": 1}, {"src/q": 2}]
    assert parquet_ids(tmp_path / "table") == list(range(3 * ROWS))


async def test_an_empty_store_next_to_a_sink_with_commits_is_refused(tmp_path: Path) -> None:
    feed = BatchFeed(SCHEMA)
    async with parquet_runtime(tmp_path, feed) as rt:
        await deliver(rt, feed, range(3))
    forget_state(tmp_path)
    with pytest.raises(SinkStateMismatchError) as caught:
        async with parquet_runtime(tmp_path, BatchFeed(SCHEMA)):
            pass
    assert caught.value.positions == {"src/q": 2}
    assert caught.value.committed_epoch > 0
    assert caught.value.state_path == str(tmp_path / "state.db")
    assert parquet_ids(tmp_path / "table") == list(range(3 * ROWS))  # nothing touched


async def test_adopting_the_sinks_positions_skips_what_it_holds(tmp_path: Path) -> None:
    feed = BatchFeed(SCHEMA)
    async with parquet_runtime(tmp_path, feed) as rt:
        await deliver(rt, feed, range(3))
    forget_state(tmp_path)
    feed = BatchFeed(SCHEMA)
    async with parquet_runtime(tmp_path, feed, adopt=True) as rt:
        # The upstream starts over (its own checkpoint lost too): 0..2 are in the sink.
        results = await deliver(rt, feed, range(5))
    assert results[:3] == [None, None, None]
    assert all(epoch is not None for epoch in results[3:])
    assert parquet_ids(tmp_path / "table") == list(range(5 * ROWS))
    # The adopted positions are durable now: a plain restart continues from batch 4.
    feed = BatchFeed(SCHEMA)
    async with parquet_runtime(tmp_path, feed) as rt:
        assert await feed.last_batch("q", rt) == 4
        assert await feed.deliver(rt, "q", 2, rows_of(2)) is None  # still held, still skipped
        await deliver(rt, feed, range(5, 6))
    assert parquet_ids(tmp_path / "table") == list(range(6 * ROWS))


async def test_a_store_gone_back_in_time_has_the_sink_skip_what_it_holds(
    tmp_path: Path,
) -> None:
    feed = BatchFeed(SCHEMA)
    async with parquet_runtime(tmp_path, feed) as rt:
        await deliver(rt, feed, range(2))
    back_up_state(tmp_path)
    feed = BatchFeed(SCHEMA)
    async with parquet_runtime(tmp_path, feed) as rt:
        await deliver(rt, feed, range(2, 4))
    restore_state(tmp_path)  # the store says batch 1; the sink holds 3
    feed = BatchFeed(SCHEMA)
    async with parquet_runtime(tmp_path, feed) as rt:
        assert await feed.last_batch("q", rt) == 1
        await deliver(rt, feed, range(2, 6))  # 2 and 3 again: the sink skips their commits
    assert parquet_ids(tmp_path / "table") == list(range(6 * ROWS))


def iceberg_runtime(
    tmp_path: Path, feed: BatchFeed, *, adopt: bool = False
) -> tuple[Runtime, IcebergTable]:
    table = IcebergTable(open_local_catalog(tmp_path / "iceberg"), "demo.events", SCHEMA)
    coordinator = Coordinator("events", table.committer())
    rt = Runtime(
        RuntimeConfig(
            state_path=str(tmp_path / "state.db"),
            barrier_interval=3600.0,
            adopt_sink_positions=adopt,
        )
    )
    rt.add_source("src", feed.source, fanout=Fanout("hash", ("id",)))
    rt.add_service("coordinator", coordinator)
    for i in range(2):
        rt.add_actor(
            f"writer{i}",
            lambda i=i: SinkWriter(
                lambda: table.writer(str(i)), coordinator=coordinator, writer_id=str(i)
            ),
            inputs=["src"],
        )
    return rt, table


def iceberg_ids(table: IcebergTable) -> list[int]:
    return sorted(table.table().scan().to_arrow()["id"].to_pylist())


async def test_iceberg_records_positions_and_refuses_or_adopts_on_an_empty_store(
    tmp_path: Path,
) -> None:
    feed = BatchFeed(SCHEMA)
    rt, table = iceberg_runtime(tmp_path, feed)
    async with rt:
        await deliver(rt, feed, range(3))
    assert json.loads(table.table().properties[POSITIONS_PROPERTY]) == {"src/q": 2}
    summaries = [s.summary.additional_properties for s in table.table().snapshots()]
    assert json.loads(summaries[-1]["barrierflow.positions"]) == {"src/q": 2}
    forget_state(tmp_path)
    rt, _ = iceberg_runtime(tmp_path, BatchFeed(SCHEMA))
    with pytest.raises(SinkStateMismatchError) as caught:
        async with rt:
            pass
    assert (caught.value.sink, caught.value.positions) == ("demo.events", {"src/q": 2})
    feed = BatchFeed(SCHEMA)
    rt, table = iceberg_runtime(tmp_path, feed, adopt=True)
    async with rt:
        results = await deliver(rt, feed, range(4))
    assert results[:3] == [None, None, None]
    assert iceberg_ids(table) == list(range(4 * ROWS))


async def test_iceberg_skips_an_epoch_it_holds_after_the_store_went_back(tmp_path: Path) -> None:
    feed = BatchFeed(SCHEMA)
    rt, table = iceberg_runtime(tmp_path, feed)
    async with rt:
        await deliver(rt, feed, range(1))
    back_up_state(tmp_path)
    feed = BatchFeed(SCHEMA)
    rt, table = iceberg_runtime(tmp_path, feed)
    async with rt:
        await deliver(rt, feed, range(1, 3))
    restore_state(tmp_path)
    feed = BatchFeed(SCHEMA)
    rt, table = iceberg_runtime(tmp_path, feed)
    async with rt:
        await deliver(rt, feed, range(1, 4))
    assert iceberg_ids(table) == list(range(4 * ROWS))


positions = st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(0, 6), max_size=3)


@given(held=positions, start=positions, steps=positions)
def test_an_epoch_is_held_new_or_refused_as_overlapping(
    held: dict[str, int], start: dict[str, int], steps: dict[str, int]
) -> None:
    end = {k: start.get(k, -1) + steps.get(k, 0) for k in set(start) | set(steps)}
    ranges = {k: range(start.get(k, -1) + 1, end[k] + 1) for k in end if end[k] > start.get(k, -1)}
    in_sink = [b <= held.get(k, -1) for k, r in ranges.items() for b in r]
    if any(in_sink) and not all(in_sink):  # some batches held, some not: neither is exact
        with pytest.raises(PositionOverlapError) as caught:
            epoch_already_held("t", 1, held, start, end)
        assert caught.value.key in ranges
        return
    # Held: every batch of the epoch is in the sink; new: none is.
    assert epoch_already_held("t", 1, held, start, end) == (bool(in_sink) and all(in_sink))


class Capturing:
    """A ListTable whose committer keeps every epoch's manifests, as the writers sent them."""

    def __init__(self) -> None:
        self.inner = ListTable(SCHEMA)
        self.manifests: dict[int, list[Manifest]] = {}
        self.schema = SCHEMA

    def writer(self, writer_id: str) -> Any:
        return self.inner.writer(writer_id)

    def committer(self) -> Any:
        return CapturingCommitter(self)


class CapturingCommitter:
    def __init__(self, table: Capturing) -> None:
        self.table = table
        self.inner = table.inner.committer()

    async def recover(self, pending: Mapping[int, CommitMetadata]) -> None:
        await self.inner.recover(pending)

    async def prepare(self, epoch: int, manifests: Sequence[Manifest]) -> CommitMetadata | None:
        self.table.manifests[epoch] = sorted(manifests, key=lambda m: m.writer)
        return await self.inner.prepare(epoch, manifests)

    async def commit(self, epoch: int, metadata: CommitMetadata) -> None:
        await self.inner.commit(epoch, metadata)

    async def abort(self, epoch: int, metadata: CommitMetadata | None) -> None:
        await self.inner.abort(epoch, metadata)


async def test_manifests_carry_the_writers_vnodes_and_the_positions_their_epoch_spans(
    tmp_path: Path,
) -> None:
    feed = BatchFeed(SCHEMA)
    table = Capturing()
    rt = Runtime(RuntimeConfig(state_path=str(tmp_path / "state.db"), barrier_interval=3600.0))
    rt.add_source("src", feed.source)
    add_sink(rt, "sink", table, input="src", parallelism=2, key=("id",))
    async with rt:
        epochs = await deliver(rt, feed, range(3))
    halves = VnodeBitmap.split(2)
    spans = []
    for epoch in epochs:
        assert epoch is not None
        manifests = table.manifests[epoch]
        assert [m.writer for m in manifests] == ["0", "1"]
        assert [m.vnodes for m in manifests] == [halves[0].runs(), halves[1].runs()]
        # Every writer saw the same barriers: they report the same span.
        assert manifests[0].positions == manifests[1].positions
        assert manifests[0].positions_from == manifests[1].positions_from
        spans.append((dict(manifests[0].positions_from), dict(manifests[0].positions)))
    assert spans == [({}, {"src/q": 0}), ({"src/q": 0}, {"src/q": 1}), ({"src/q": 1}, {"src/q": 2})]
    assert table.inner.positions == {"src/q": 2}
    assert sorted(table.inner.rows()["id"].to_pylist()) == list(range(3 * ROWS))
