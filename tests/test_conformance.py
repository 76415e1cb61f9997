"""The sink connector conformance suite: it passes the connectors that keep the contract and
names each rule a broken one breaks."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from barrierflow import InvalidArgumentError
from barrierflow.actors.sinks.protocol import PendingCommit
from barrierflow.connectors import ParquetFileSink
from barrierflow.testing.conformance import ConformanceError, check_sink_connector
from barrierflow.testing.sinks import ListSink

pytestmark = pytest.mark.anyio

SCHEMA = pa.schema([("id", pa.int64())])


async def test_the_list_sink_keeps_the_contract() -> None:
    sink = ListSink(SCHEMA)
    report = await check_sink_connector(lambda: sink, lambda: sink.rows())
    assert report.passed, report.failures
    assert len(report.results) == 8


async def test_the_parquet_sink_keeps_the_contract(tmp_path: Path) -> None:
    table = tmp_path / "table"

    def read() -> list[int]:
        if not table.exists():
            return []
        return ds.dataset(table, SCHEMA, format="parquet").to_table().column("id").to_pylist()

    report = await check_sink_connector(lambda: ParquetFileSink(table, SCHEMA), read)
    report.raise_for_failures()


class ReplaysAndKeepsAll:
    """A connector breaking two rules: its commit is not idempotent, and recover commits every
    staged epoch, listed or not."""

    exactly_once = True

    def __init__(self) -> None:
        self.staged: dict[int, list[int]] = {}
        self.visible: list[int] = []
        self.open_epoch = 0

    @property
    def schema(self) -> pa.Schema:
        return SCHEMA

    async def open(self) -> None: ...

    async def recover(self, pending: Sequence[PendingCommit]) -> None:
        for epoch in sorted(self.staged):
            self.visible += self.staged.pop(epoch)

    async def begin_epoch(self, epoch: int) -> None:
        self.open_epoch = epoch
        self.staged[epoch] = []

    async def write_batch(self, batch: pa.RecordBatch) -> None:
        self.staged[self.open_epoch] += batch.column("id").to_pylist()

    async def flush(self) -> None: ...

    async def pre_commit(self, epoch: int) -> dict[str, int]:
        return {}

    async def commit_epoch(self, epoch: int) -> None:
        self.visible += self.staged.get(epoch, [])

    async def rollback_epoch(self, epoch: int) -> None:
        self.staged.pop(epoch, None)

    async def close(self) -> None: ...


async def test_a_broken_connector_is_reported_rule_by_rule() -> None:
    sink = ReplaysAndKeepsAll()
    report = await check_sink_connector(lambda: sink, lambda: list(sink.visible))
    broken = {r.rule for r in report.failures}
    assert "replayed_commit_is_noop" in broken
    assert "recover_drops_the_rest" in broken
    with pytest.raises(ConformanceError) as error:
        report.raise_for_failures()
    assert "replayed_commit_is_noop" in str(error.value)


async def test_bad_input_is_refused() -> None:
    with pytest.raises(InvalidArgumentError):
        await check_sink_connector(lambda: object(), list)  # type: ignore[arg-type,return-value]
    wide = pa.schema([("a", pa.string())])
    with pytest.raises(InvalidArgumentError) as rows:
        await check_sink_connector(lambda: ListSink(wide), list)
    assert rows.value.argument == "rows"
