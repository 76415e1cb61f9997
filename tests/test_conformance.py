"""The sink connector conformance suite: it passes the connectors that keep the contract and
names each rule a broken one breaks — in process, and across SIGKILLs of a child process
(``crash_steps=True``; the connectors those children build are in ``_conformance_connectors``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import _conformance_connectors as connectors
import anyio
import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from barrierflow import InvalidArgumentError
from barrierflow.actors.sinks.protocol import PendingCommit
from barrierflow.connectors import ParquetFileSink
from barrierflow.testing.conformance import ConformanceError, check_sink_connector
from barrierflow.testing.crash_conformance import CRASH_RULES, TIMEOUT_SCALE_ENV
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


@pytest.fixture
def storage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The directory every factory of ``_conformance_connectors`` reaches, in this process and
    in the suite's children (they inherit the environment)."""
    monkeypatch.setenv(connectors.STORAGE_ENV, str(tmp_path))
    return tmp_path


async def test_the_parquet_sink_survives_a_crash_at_every_step(storage: Path) -> None:
    report = await check_sink_connector(
        connectors.parquet_sink, connectors.read_parquet, crash_steps=True
    )
    report.raise_for_failures()
    assert [r.rule for r in report.results][8:] == list(CRASH_RULES)
    assert len(CRASH_RULES) == 11


async def test_a_connector_keeping_the_contract_passes_the_crash_rules(storage: Path) -> None:
    report = await check_sink_connector(
        connectors.JsonDirSink, connectors.read_json, crash_steps=True
    )
    report.raise_for_failures()


async def crash_failures(factory: type[connectors.JsonDirSink]) -> set[str]:
    report = await check_sink_connector(factory, connectors.read_json, crash_steps=True)
    return {r.rule for r in report.failures}


async def test_recover_ignoring_pending_commits_loses_rows(storage: Path) -> None:
    assert await crash_failures(connectors.IgnoresPending) == {
        "recover_commits_pending",
        "crash_after_open_recovers",
        "crash_after_recover_recovers",
        "crash_after_pre_commit_recovers",
    }


async def test_rows_published_at_pre_commit_are_reported(storage: Path) -> None:
    assert await crash_failures(connectors.PublishesAtPreCommit) == {
        "invisible_before_commit",
        "close_commits_nothing",
        "recover_drops_the_rest",
        "crash_before_checkpoint_drops_epoch",
        "crash_after_close_recovers",
    }


async def test_a_commit_replayed_after_a_crash_must_be_a_noop(storage: Path) -> None:
    assert await crash_failures(connectors.ForgetsCommits) == {
        "crash_after_recover_recovers",
        "crash_after_commit_recovers",
        "recover_is_idempotent",
    }


async def test_crash_steps_refuse_a_factory_a_child_cannot_import(storage: Path) -> None:
    with pytest.raises(InvalidArgumentError) as closure:
        await check_sink_connector(
            lambda: connectors.parquet_sink(), connectors.read_parquet, crash_steps=True
        )
    assert closure.value.argument == "factory"
    assert [p async for p in anyio.Path(storage).iterdir()] == []  # refused before running


async def test_crash_steps_refuse_an_in_memory_list_sink(storage: Path) -> None:
    with pytest.raises(InvalidArgumentError) as in_memory:
        await check_sink_connector(connectors.list_sink, list, crash_steps=True)
    assert in_memory.value.argument == "factory"


async def test_a_child_that_fails_before_its_kill_point_fails_the_rule(storage: Path) -> None:
    # The child cannot report the metadata, so it dies of the error, not of the SIGKILL:
    # every scenario that kills after the report fails rather than passing unchecked.
    assert await crash_failures(connectors.UnserializableMetadata) == {
        "crash_after_open_recovers",
        "crash_after_recover_recovers",
        "crash_after_pre_commit_recovers",
        "crash_after_commit_recovers",
        "crash_after_rollback_recovers",
        "crash_after_close_recovers",
    }


async def test_crash_steps_refuse_a_malformed_timeout_scale(
    storage: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TIMEOUT_SCALE_ENV, "fast")
    with pytest.raises(InvalidArgumentError) as scale:
        await check_sink_connector(
            connectors.parquet_sink, connectors.read_parquet, crash_steps=True
        )
    assert scale.value.argument == TIMEOUT_SCALE_ENV
