"""Staging on executors without Spark: what a task attempt stages, what the driver adopts, and
the coordinator's rules for batches staged that way (partitions as the shares, nothing lost,
nothing stale). The Spark half is in ``test_spark_executors.py``.

A task is simulated by calling :meth:`ExecutorStaging.stage_task` in this process, the way a
Spark task calls it on an executor.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from _timeouts import scaled

from barrierflow.actors import BatchFeed, add_sink
from barrierflow.actors.sinks.add_sink import DeclaredSink
from barrierflow.actors.sinks.coordinator.handles import AdoptStaged
from barrierflow.actors.sinks.coordinator.staged import ExecutorBatches
from barrierflow.actors.sinks.table import Manifest, StagedFile
from barrierflow.connectors import ParquetTable
from barrierflow.connectors._staging import clean_staging, kept_epochs
from barrierflow.connectors.executor_staging import ExecutorStaging, staging_number
from barrierflow.errors import (
    ActorFailedError,
    ExecutorStagingError,
    InvalidArgumentError,
    PartitionCoverageError,
    StagedBatchMissingError,
    StaleStagingError,
)
from barrierflow.runtime import Runtime, RuntimeConfig
from barrierflow.testing import ListTable

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False)])
WAIT = scaled(20)


def rows(start: int, count: int) -> list[pa.RecordBatch]:
    ids = pa.array(range(start, start + count), pa.int64())
    return [pa.record_batch([ids], schema=SCHEMA)]


def staging(tmp_path: Path) -> ExecutorStaging:
    return ExecutorStaging.of(ParquetTable(tmp_path / "table", SCHEMA))


def read(files: list[Path]) -> list[int]:
    return sorted(
        ds.dataset([str(f) for f in files], format="parquet").to_table()["id"].to_pylist()
    )


# What the driver adopts.


def test_the_driver_adopts_one_attempt_per_partition_and_deletes_the_others(
    tmp_path: Path,
) -> None:
    stage = staging(tmp_path)
    root = Path(stage.root)
    number = staging_number()
    loser = stage.stage_task(number, 0, 7, rows(0, 10))  # a speculative copy, not kept
    winner = stage.stage_task(number, 0, 9, rows(0, 10))
    other = stage.stage_task(number, 1, 8, rows(10, 5))
    empty = stage.stage_task(number, 2, 10, [])
    assert (loser.writer, winner.writer, empty.files) == ("p0", "p0", ())
    adopted = stage.adopt(number, [winner, other, empty])
    assert [m.writer for m in adopted] == ["p0", "p1", "p2"]
    assert all(m.epoch == number for m in adopted)
    staged = root / ".staging" / f"{number:020d}"
    assert sorted(p.name for p in staged.iterdir()) == ["wp0", "wp1"]
    files = [root / f.path for m in adopted for f in m.files]
    assert all(f.parent.parent == staged for f in files)
    assert read(files) == list(range(15))  # the loser's rows are not there twice
    assert [f.rows for m in adopted for f in m.files] == [10, 5]
    # Every attempt directory is gone, the loser's with it.
    assert sorted(p.name for p in (root / ".staging").iterdir()) == [f"{number:020d}"]


def test_a_dead_run_s_task_staging_late_is_never_adopted_nor_visible_and_recovery_drops_it(
    tmp_path: Path,
) -> None:
    # A crash leaves PySpark's workers of the dead run behind for a moment (they exit once
    # their JVM is gone): one may still be staging when the resumed run stages and adopts.
    stage = staging(tmp_path)
    root = Path(stage.root)
    dead = staging_number()
    resumed = staging_number(dead)
    mine = stage.stage_task(resumed, 0, 0, rows(0, 10))
    late = stage.stage_task(dead, 0, 0, rows(100, 5))  # the dead run's task, after the kill
    adopted = stage.adopt(resumed, [mine])
    stage.stage_task(dead, 1, 0, rows(200, 5))  # and even after the adoption
    files = [root / f.path for m in adopted for f in m.files]
    assert read(files) == list(range(10))  # only the resumed run's rows are adopted
    assert all(f.parent.parent.name == f"{resumed:020d}" for f in files)
    assert all((root / f.path).exists() for f in late.files)  # left where it wrote them
    # A reader of the table's directory skips the staging area: none of it is visible.
    assert ds.dataset(root, SCHEMA, format="parquet").to_table().num_rows == 0
    # The next recovery deletes what no pending commit references: the dead run's files too.
    clean_staging(root, kept_epochs([{"staging_epoch": resumed}]))
    assert sorted(p.name for p in (root / ".staging").iterdir()) == [f"{resumed:020d}"]


def test_adopting_files_outside_the_task_directories_or_gone_is_a_typed_error(
    tmp_path: Path,
) -> None:
    stage = staging(tmp_path)
    number = staging_number()
    stray = Manifest("p0", number, (StagedFile("elsewhere/part-00000.parquet", 1, 1),))
    with pytest.raises(ExecutorStagingError) as info:
        stage.adopt(number, [stray])
    assert "not under" in info.value.reason
    staged = stage.stage_task(number, 0, 1, rows(0, 3))
    stage.task_directory(number, 0, 1).rename(Path(stage.root) / "moved")  # a cleaned area
    with pytest.raises(ExecutorStagingError) as info:
        stage.adopt(number, [staged])
    assert "is gone" in info.value.reason


def test_staging_numbers_never_name_a_runtime_epoch_and_increase() -> None:
    first = staging_number()
    assert first & 0xFFFF == 1  # runtime epochs have their 16 low bits zero
    assert staging_number(first) > first
    assert staging_number(first + (1 << 40)) == first + (1 << 40) + 2


def test_a_table_whose_writers_stage_no_parquet_files_cannot_be_written_on_executors() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        ExecutorStaging.of(ListTable(SCHEMA))
    assert (info.value.argument, info.value.got) == ("table", "ListTable")


# The coordinator's rules, partitions as the shares.


def handed(
    batch: int, partitions: list[int], generation: int = 1, key: str = "src/s"
) -> AdoptStaged:
    manifests = tuple(
        Manifest(f"p{p}", 3, (StagedFile(f".staging/x/wp{p}/part.parquet", 1, 1),))
        for p in partitions
    )
    return AdoptStaged(key, batch, max(partitions, default=-1) + 1, manifests, generation)


def reaching(last: int, first: int | None = None, key: str = "src/s") -> Manifest:
    """A writer actor's (empty) manifest of an epoch whose positions reach ``last``."""
    return Manifest(
        "0", 5, positions={key: last}, positions_from={} if first is None else {key: first}
    )


def test_each_partition_of_a_batch_must_come_exactly_once() -> None:
    batches = ExecutorBatches("out", set(), 1)
    duplicate = handed(0, [0, 1, 1])
    duplicate.partitions = 3
    missing = handed(0, [0, 2])
    for event, got in ((duplicate, [0, 1, 1]), (missing, [0, 2])):
        with pytest.raises(PartitionCoverageError) as info:
            batches.add(event)
        assert (info.value.sink, info.value.batch, info.value.partitions) == ("out", "src/s#0", 3)
        assert info.value.got == got
    assert len(batches) == 0


def test_a_partition_named_twice_is_refused_even_when_every_partition_is_named() -> None:
    # Partitions 0 and 1 are both there, 1 twice: its rows would be committed twice. (The
    # test above names a duplicate with a partition missing, which a check for missing
    # partitions alone refuses too.)
    batches = ExecutorBatches("out", set(), 1)
    with pytest.raises(PartitionCoverageError) as info:
        batches.add(handed(0, [0, 1, 1]))
    assert (info.value.sink, info.value.batch) == ("out", "src/s#0")
    assert (info.value.partitions, info.value.got) == (2, [0, 1, 1])
    assert len(batches) == 0


def test_a_batch_staged_in_another_coordinator_run_is_refused() -> None:
    with pytest.raises(StaleStagingError) as info:
        ExecutorBatches("out", set(), 2).add(handed(0, [0], generation=1))
    assert (info.value.staged_in, info.value.current) == (1, 2)


def test_the_epoch_that_reaches_a_batch_takes_its_files_and_one_without_them_fails() -> None:
    keys: set[str] = set()
    batches = ExecutorBatches("out", keys, 1)
    batches.add(handed(0, [0, 1]))
    batches.add(handed(1, [0]))
    assert keys == {"src/s"}
    assert batches.claim(10, [Manifest("0", 5)]) == []  # an epoch before any batch
    taken = batches.claim(11, [reaching(0)])
    assert [m.writer for m in taken] == ["p0", "p1"]
    assert [m.writer for m in batches.claim(12, [reaching(1, first=0)])] == ["p0"]
    assert batches.claim(13, [reaching(1, first=1)]) == []  # nothing new
    assert len(batches) == 0
    # A later run, a batch reached that was never handed over: the keys are remembered.
    later = ExecutorBatches("out", keys, 2)
    with pytest.raises(StagedBatchMissingError) as info:
        later.claim(14, [reaching(3, first=1)])
    assert (info.value.epoch, info.value.key, info.value.batches) == (14, "src/s", [2, 3])
    # Keys never written on executors are not its business.
    assert later.claim(15, [reaching(9, key="other/s")]) == []


# In a runtime: hand-over, end mark, commit.


def build(tmp_path: Path) -> tuple[Runtime, BatchFeed, ParquetTable, DeclaredSink]:
    feed = BatchFeed(SCHEMA)
    table = ParquetTable(tmp_path / "table", SCHEMA)
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=3600.0))
    rt.add_source("events", feed.source)
    sink = add_sink(rt, "out", table, input="events", parallelism=2, key=("id",))
    return rt, feed, table, sink


@pytest.mark.anyio
async def test_a_handed_over_batch_is_committed_with_the_epoch_of_its_end_mark(
    tmp_path: Path,
) -> None:
    rt, feed, _, sink = build(tmp_path)
    stage = staging(tmp_path)
    with pytest.raises(ActorFailedError) as stopped:
        async with rt:
            coordinator = sink.coordinator
            with anyio.fail_after(WAIT):
                key = await feed.position_key("s", rt)
                generation = await coordinator.staging_generation()
                number = staging_number()
                attempts = [stage.stage_task(number, p, p, rows(p * 10, 10)) for p in range(2)]
                adopted = stage.adopt(number, attempts)
                await coordinator.adopt_staged(key, 0, 2, adopted, generation)
                epoch = await feed.deliver(rt, "s", 0, SCHEMA.empty_table(), retries=0)
                assert epoch is not None
                await coordinator.wait_committed(epoch)
                # The next end mark without its files: the graph fails, nothing is lost.
                with pytest.raises(ActorFailedError) as info:
                    await feed.deliver(rt, "s", 1, SCHEMA.empty_table(), retries=0)
    assert stopped.value is info.value
    missing = info.value.cause
    assert isinstance(missing, StagedBatchMissingError)
    assert (missing.sink, missing.key, missing.batches) == ("out", "events/s", [1])
    assert missing.epoch > epoch  # the epoch that reached batch 1
    assert isinstance(info.value.cause, StagedBatchMissingError)
    files = sorted((tmp_path / "table").glob("epoch=*/*/*.parquet"))
    assert read(files) == list(range(20))
    assert {f.parent.name for f in files} == {"wp0", "wp1"}


@pytest.mark.anyio
async def test_handing_over_bad_arguments_is_refused_by_name(tmp_path: Path) -> None:
    rt, _, _, sink = build(tmp_path)
    coordinator = sink.coordinator
    for arguments, name, expected, got in (
        (("", 0, 1, [], 1), "key", "a position key '<source>/<stream>'", ""),
        (("k/s", -1, 1, [], 1), "batch", "an int >= 0", -1),
        (("k/s", 0, True, [], 1), "partitions", "an int >= 0", True),
        (("k/s", 0, 1, ["m"], 1), "manifests", "Manifests", ["m"]),
    ):
        with pytest.raises(InvalidArgumentError) as info:
            await coordinator.adopt_staged(*arguments)
        assert (info.value.argument, info.value.expected, info.value.got) == (name, expected, got)
    del rt


@pytest.mark.anyio
async def test_a_refused_hand_over_fails_only_its_asker_and_the_run_goes_on(
    tmp_path: Path,
) -> None:
    rt, feed, _, sink = build(tmp_path)
    stage = staging(tmp_path)
    async with rt:
        coordinator = sink.coordinator
        with anyio.fail_after(WAIT):
            key = await feed.position_key("s", rt)
            generation = await coordinator.staging_generation()
            assert generation == 1  # the first run
            number = staging_number()
            adopted = stage.adopt(number, [stage.stage_task(number, 0, 1, rows(0, 5))])
            with pytest.raises(StaleStagingError) as stale:
                await coordinator.adopt_staged(key, 0, 1, adopted, generation + 1)
            assert (stale.value.sink, stale.value.staged_in, stale.value.current) == ("out", 2, 1)
            with pytest.raises(PartitionCoverageError) as coverage:
                await coordinator.adopt_staged(key, 0, 2, adopted, generation)
            assert coverage.value.sink == "out"
            with pytest.raises(PartitionCoverageError) as twice:
                await coordinator.adopt_staged(key, 0, 1, [*adopted, *adopted], generation)
            assert (twice.value.partitions, twice.value.got) == (1, [0, 0])
            await coordinator.adopt_staged(key, 0, 1, adopted, generation)  # still serving
            epoch = await feed.deliver(rt, "s", 0, SCHEMA.empty_table(), retries=0)
            assert epoch is not None
            await coordinator.wait_committed(epoch)
    files = sorted((tmp_path / "table").glob("epoch=*/*/*.parquet"))
    assert read(files) == list(range(5))


def test_a_writer_id_that_names_no_partition_breaks_the_coverage() -> None:
    batches = ExecutorBatches("out", set(), 1)
    for writers, got in ((("p0", "q1"), [0, -1]), (("p0", "zz"), [0, -1]), (("p0", "p"), [0, -1])):
        manifests = tuple(Manifest(w, 3) for w in writers)
        with pytest.raises(PartitionCoverageError) as info:
            batches.add(AdoptStaged("src/s", 0, 2, manifests, 1))
        assert info.value.got == got
    assert len(batches) == 0


def test_claims_look_at_every_executor_written_key_and_the_first_epoch_at_its_end() -> None:
    batches = ExecutorBatches("out", set(), 1)
    batches.add(handed(3, [0], key="b/s"))
    batches.add(handed(0, [0], key="a/s"))  # sorted first; the epoch below does not reach it
    # The key's first epoch (no start): only the batch it ends at is required and taken.
    taken = batches.claim(20, [Manifest("0", 5, positions={"b/s": 3})])
    assert [m.writer for m in taken] == ["p0"]
    assert len(batches) == 1  # a/s batch 0 still waits
    with pytest.raises(StagedBatchMissingError) as info:
        batches.claim(21, [Manifest("0", 5, positions={"b/s": 5})])
    assert (info.value.sink, info.value.epoch, info.value.batches) == ("out", 21, [5])


@pytest.mark.anyio
async def test_the_staging_generation_is_each_recovered_run_and_waits_for_one(
    tmp_path: Path,
) -> None:
    from barrierflow.actors.sinks.coordinator import Coordinator
    from barrierflow.runtime.service import ServiceContext
    from barrierflow.runtime.state.state_store import StateStore
    from barrierflow.testing import ListTable

    coordinator = Coordinator("out", ListTable(SCHEMA).committer())
    seen: list[int] = []

    async def generation() -> None:
        seen.append(await coordinator.staging_generation())

    async with await StateStore.open(tmp_path / "state.db") as store:
        for run in (1, 2):
            async with anyio.create_task_group() as waiting:
                waiting.start_soon(generation)
                await anyio.wait_all_tasks_blocked()
                assert len(seen) == run - 1  # no run recovered yet: it waits
                async with anyio.create_task_group() as tg:
                    tg.start_soon(coordinator.run, ServiceContext("out", store))
                    with anyio.fail_after(WAIT):
                        while len(seen) < run:
                            await anyio.wait_all_tasks_blocked()
                    tg.cancel_scope.cancel()
    assert seen == [1, 2]
