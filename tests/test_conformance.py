"""The table conformance suite: it passes the tables that keep the commit protocol and names
each rule a broken one breaks — in process, and across SIGKILLs of a child process
(``crash_steps=True``; the tables those children build are in ``_conformance_tables``)."""

from __future__ import annotations

from pathlib import Path

import _conformance_tables as tables
import anyio
import pyarrow as pa
import pytest

from barrierflow.errors import InvalidArgumentError
from barrierflow.testing.conformance import ConformanceError, check_table
from barrierflow.testing.crash_conformance import CRASH_RULES, TIMEOUT_SCALE_ENV
from barrierflow.testing.sinks import FailingTable, ListTable

pytestmark = pytest.mark.anyio

SCHEMA = pa.schema([("id", pa.int64())])
#: The in-process rules, in the order the report lists them.
RULES = [
    "invisible_before_commit",
    "commit_makes_visible",
    "replayed_commit_is_noop",
    "commit_after_next_begin",
    "discard_discards",
    "parallel_writers_commit_at_once",
    "close_commits_nothing",
    "recover_keeps_pending",
    "recover_drops_the_rest",
]


async def test_the_list_table_keeps_the_protocol() -> None:
    table = ListTable(SCHEMA)
    report = await check_table(lambda: table, table.rows)
    assert report.passed, report.failures
    assert [r.rule for r in report.results] == RULES


async def test_a_failing_table_without_faults_keeps_the_protocol() -> None:
    table = FailingTable(ListTable(SCHEMA))
    report = await check_table(lambda: table, lambda: table.inner.rows())  # type: ignore[attr-defined]
    report.raise_for_failures()
    assert table.called("commit")  # the wrapper was driven, not bypassed


@pytest.fixture
def storage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The directory every factory of ``_conformance_tables`` reaches, in this process and in
    the suite's children (they inherit the environment)."""
    monkeypatch.setenv(tables.STORAGE_ENV, str(tmp_path))
    return tmp_path


async def failures(make: type[tables.JsonDirTable], *, crash_steps: bool = False) -> set[str]:
    report = await check_table(make, tables.read_json, crash_steps=crash_steps)
    return {r.rule for r in report.failures}


async def test_a_table_keeping_the_protocol_passes_in_process(storage: Path) -> None:
    assert await failures(tables.JsonDirTable) == set()


async def test_a_commit_that_is_not_idempotent_is_reported_rule_by_rule(storage: Path) -> None:
    report = await check_table(tables.ForgetsCommits, tables.read_json)
    # The first broken rule is the one named; the later ones see its duplicates too.
    assert report.failures[0].rule == "replayed_commit_is_noop"
    assert all(r.passed for r in report.results[:2])  # the first commit itself was right
    with pytest.raises(ConformanceError) as error:
        report.raise_for_failures()
    assert "replayed_commit_is_noop" in str(error.value)
    assert error.value.failures[0].detail == "expected ids [1, 2], saw [1, 1, 2, 2]"


async def test_a_writer_leaking_a_discarded_epoch_fails_discard_discards(storage: Path) -> None:
    report = await check_table(tables.LeaksDiscarded, tables.read_json)
    # The first broken rule is the one named; the later ones see its leaked row too.
    assert report.failures[0].rule == "discard_discards"
    assert report.failures[0].detail == "expected ids [1, 2, 3, 5], saw [1, 2, 3, 4, 5]"
    assert all(r.passed for r in report.results[: RULES.index("discard_discards")])


async def test_recover_keeping_unreferenced_staging_fails_recover_drops_the_rest(
    storage: Path,
) -> None:
    assert await failures(tables.KeepsStaging) == {"recover_drops_the_rest"}


async def test_bad_input_is_refused() -> None:
    with pytest.raises(InvalidArgumentError) as make:
        await check_table(lambda: object(), list)  # type: ignore[arg-type,return-value]
    assert make.value.argument == "make"
    wide = pa.schema([("a", pa.string())])
    with pytest.raises(InvalidArgumentError) as rows:
        await check_table(lambda: ListTable(wide), list)
    assert rows.value.argument == "rows"


@pytest.mark.subprocess
async def test_the_parquet_table_survives_a_crash_at_every_step(storage: Path) -> None:
    report = await check_table(tables.parquet_table, tables.read_parquet, crash_steps=True)
    report.raise_for_failures()
    assert [r.rule for r in report.results] == RULES + list(CRASH_RULES)
    assert len(CRASH_RULES) == 11


@pytest.mark.subprocess
async def test_a_table_keeping_the_protocol_passes_the_crash_rules(storage: Path) -> None:
    assert await failures(tables.JsonDirTable, crash_steps=True) == set()


@pytest.mark.subprocess
async def test_recover_ignoring_pending_epochs_loses_rows(storage: Path) -> None:
    assert await failures(tables.IgnoresPending, crash_steps=True) == {
        "recover_keeps_pending",
        "crash_after_open_recovers",
        "crash_after_recover_recovers",
        "crash_after_prepare_recovers",
    }


@pytest.mark.subprocess
async def test_rows_published_at_prepare_are_reported(storage: Path) -> None:
    assert await failures(tables.PublishesAtPrepare, crash_steps=True) == {
        "invisible_before_commit",
        "close_commits_nothing",
        "recover_drops_the_rest",
        "crash_before_checkpoint_drops_epoch",
        "crash_after_close_recovers",
    }


@pytest.mark.subprocess
async def test_a_commit_replayed_after_a_crash_must_be_a_noop(storage: Path) -> None:
    broken = await failures(tables.ForgetsCommits, crash_steps=True)
    assert "replayed_commit_is_noop" in broken
    assert broken & set(CRASH_RULES) == {
        "crash_after_recover_recovers",
        "crash_after_commit_recovers",
        "recover_is_idempotent",
    }


async def test_crash_steps_refuse_a_factory_a_child_cannot_import(storage: Path) -> None:
    with pytest.raises(InvalidArgumentError) as closure:
        await check_table(lambda: tables.parquet_table(), tables.read_parquet, crash_steps=True)
    assert closure.value.argument == "make"
    assert [p async for p in anyio.Path(storage).iterdir()] == []  # refused before running


async def test_crash_steps_refuse_an_in_memory_list_table(storage: Path) -> None:
    with pytest.raises(InvalidArgumentError) as in_memory:
        await check_table(tables.list_table, list, crash_steps=True)
    assert in_memory.value.argument == "make"


@pytest.mark.subprocess
async def test_a_child_that_fails_before_its_kill_point_fails_the_rule(storage: Path) -> None:
    # The child cannot report the metadata, so it dies of the error, not of the SIGKILL:
    # every scenario that kills after the report fails rather than passing unchecked.
    assert await failures(tables.UnserializableMetadata, crash_steps=True) == {
        "crash_after_open_recovers",
        "crash_after_recover_recovers",
        "crash_after_prepare_recovers",
        "crash_after_commit_recovers",
        "crash_after_discard_recovers",
        "crash_after_close_recovers",
    }


async def test_crash_steps_refuse_a_malformed_timeout_scale(
    storage: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TIMEOUT_SCALE_ENV, "fast")
    with pytest.raises(InvalidArgumentError) as scale:
        await check_table(tables.parquet_table, tables.read_parquet, crash_steps=True)
    assert scale.value.argument == TIMEOUT_SCALE_ENV
