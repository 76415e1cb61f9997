"""Staging on executors without Spark: what a task attempt stages, what the driver adopts, and
the rules for batches staged that way (partitions as the shares, committed by the epoch whose
committable holds them, nothing lost). The Spark half is in ``test_spark_executors.py``.

A task is simulated by calling :meth:`ExecutorStaging.stage_task` in this process, the way a
Spark task calls it on an executor.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from _timeouts import scaled

from barrierflow.actors import BatchFeed, add_sink
from barrierflow.actors.sinks.add_sink import DeclaredSink
from barrierflow.actors.sinks.committables import StagedBatch, check_epoch_batches
from barrierflow.actors.sinks.coordinator.handles import WriterHandle
from barrierflow.actors.sinks.table import Manifest, StagedFile
from barrierflow.channels import Committable, VnodeBitmap
from barrierflow.connectors import ParquetTable
from barrierflow.connectors._staging import clean_staging, kept_epochs
from barrierflow.connectors.executor_staging import ExecutorStaging, executor_writes, staging_number
from barrierflow.errors import (
    ActorFailedError,
    BarrierNotPassedError,
    ExecutorStagingError,
    InvalidArgumentError,
    PartitionCoverageError,
    SinkWriterInputError,
    StagedFilesGoneError,
)
from barrierflow.runtime import Runtime, RuntimeConfig, StreamActor
from barrierflow.testing import ListTable

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False)])
WAIT = scaled(20)


def rows(start: int, count: int) -> list[pa.RecordBatch]:
    ids = pa.array(range(start, start + count), pa.int64())
    return [pa.record_batch([ids], schema=SCHEMA)]


def staging(tmp_path: Path) -> ExecutorStaging:
    writes = executor_writes(ParquetTable(tmp_path / "table", SCHEMA))
    assert isinstance(writes, ExecutorStaging)
    return writes


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
        executor_writes(ListTable(SCHEMA))
    assert (info.value.argument, info.value.got) == ("table", "ListTable")


# The coordinator's rules, partitions as the shares.


def batch(
    batch_id: int, partitions: list[int], count: int | None = None, key: str = "src/s"
) -> StagedBatch:
    manifests = tuple(
        Manifest(f"p{p}", 3, (StagedFile(f".staging/x/wp{p}/part.parquet", 1, 1),))
        for p in partitions
    )
    count = max(partitions, default=-1) + 1 if count is None else count
    return StagedBatch(key, batch_id, count, manifests, "/nowhere")


def test_each_partition_of_a_batch_must_come_exactly_once() -> None:
    for staged, got in ((batch(0, [0, 1, 1], 3), [0, 1, 1]), (batch(0, [0, 2]), [0, 2])):
        with pytest.raises(PartitionCoverageError) as info:
            check_epoch_batches("out", [staged])
        assert (info.value.sink, info.value.batch, info.value.partitions) == ("out", "src/s#0", 3)
        assert info.value.got == got


def test_a_partition_named_twice_is_refused_even_when_every_partition_is_named() -> None:
    # Partitions 0 and 1 are both there, 1 twice: its rows would be committed twice. (The
    # test above names a duplicate with a partition missing, which a check for missing
    # partitions alone refuses too.)
    with pytest.raises(PartitionCoverageError) as info:
        check_epoch_batches("out", [batch(0, [0, 1, 1])])
    assert (info.value.sink, info.value.batch) == ("out", "src/s#0")
    assert (info.value.partitions, info.value.got) == (2, [0, 1, 1])


def test_an_epoch_holding_one_batch_twice_is_refused_and_distinct_batches_are_taken() -> None:
    with pytest.raises(PartitionCoverageError) as info:
        check_epoch_batches("out", [batch(4, [0, 1]), batch(5, [0]), batch(4, [0, 1])])
    assert (info.value.sink, info.value.batch) == ("out", "src/s#4")
    assert (info.value.partitions, info.value.got) == (2, [0, 1, 0, 1])
    taken = check_epoch_batches(
        "out", [batch(4, [0, 1]), batch(5, [0]), batch(4, [0], key="other/s")]
    )
    assert [m.writer for m in taken] == ["p0", "p1", "p0", "p0"]


def test_a_partition_that_staged_no_file_counts_but_commits_nothing() -> None:
    empty = StagedBatch("src/s", 0, 2, (Manifest("p0", 3), batch(0, [1]).manifests[0]), "/r")
    assert [m.writer for m in check_epoch_batches("out", [empty])] == ["p1"]
    with pytest.raises(PartitionCoverageError):  # but it must be there
        check_epoch_batches("out", [StagedBatch("src/s", 0, 2, empty.manifests[1:], "/r")])


def test_a_writer_id_that_names_no_partition_breaks_the_coverage() -> None:
    for writers, got in ((("p0", "q1"), [0, -1]), (("p0", "zz"), [0, -1]), (("p0", "p"), [0, -1])):
        manifests = tuple(Manifest(w, 3) for w in writers)
        with pytest.raises(PartitionCoverageError) as info:
            check_epoch_batches("out", [StagedBatch("src/s", 0, 2, manifests, "/r")])
        assert info.value.got == got


def test_a_staged_batch_refuses_bad_fields_by_name() -> None:
    good = ("k/s", 0, 1, (), "/r")
    for index, value, name, expected in (
        (0, "", "key", "a position key '<source>/<stream>'"),
        (1, -1, "batch_id", "an int >= 0"),
        (2, True, "partitions", "an int >= 0"),
        (3, ("m",), "manifests", "a tuple of Manifests"),
        (3, [], "manifests", "a tuple of Manifests"),
        (4, "", "root", "the table's root directory"),
    ):
        arguments = list(good)
        arguments[index] = value
        with pytest.raises(InvalidArgumentError) as info:
            StagedBatch(*arguments)  # type: ignore[arg-type]
        assert (info.value.argument, info.value.expected, info.value.got) == (name, expected, value)


def test_a_staged_batch_names_its_first_missing_file(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x")
    files = (StagedFile("a", 1, 1), StagedFile("b", 1, 1))
    staged = StagedBatch("k/s", 3, 1, (Manifest("p0", 1, files),), str(tmp_path))
    assert staged.missing_file() == str(tmp_path / "b")
    (tmp_path / "b").write_bytes(b"x")
    assert staged.missing_file() is None
    assert (staged.label, staged.rows) == ("k/s#3", 2)


# In a runtime: committables through the feed, committed by the epoch that holds them.


def build(
    tmp_path: Path, *, between: bool = False
) -> tuple[Runtime, BatchFeed, ParquetTable, DeclaredSink]:
    feed = BatchFeed(SCHEMA)
    table = ParquetTable(tmp_path / "table", SCHEMA)
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=3600.0))
    rt.add_source("events", feed.source)
    if between:  # an actor that knows nothing of committables: it passes them on
        rt.add_actor("between", StreamActor, inputs=["events"])
    sink = add_sink(
        rt, "out", table, input="between" if between else "events", parallelism=2, key=("id",)
    )
    return rt, feed, table, sink


def stage_batch(stage: ExecutorStaging, key: str, batch_id: int, start: int) -> StagedBatch:
    number = staging_number()
    attempts = [stage.stage_task(number, p, p, rows(start + p * 10, 10)) for p in range(2)]
    return StagedBatch(key, batch_id, 2, tuple(stage.adopt(number, attempts)), stage.root)


@pytest.mark.anyio
@pytest.mark.parametrize("between", [False, True], ids=["direct", "through-an-actor"])
async def test_a_batch_delivered_as_a_committable_is_committed_by_the_epoch_that_holds_it(
    tmp_path: Path, between: bool
) -> None:
    rt, feed, _, sink = build(tmp_path, between=between)
    stage = staging(tmp_path)
    epochs: list[int] = []
    async with rt:
        with anyio.fail_after(WAIT):
            key = await feed.position_key("s", rt)
            for batch_id in (0, 1):
                staged = stage_batch(stage, key, batch_id, batch_id * 100)
                epoch = await feed.deliver(
                    rt, "s", batch_id, SCHEMA.empty_table(), retries=0,
                    committables=[Committable("out", staged)],
                )  # fmt: skip
                assert epoch is not None
                epochs.append(epoch)
            await sink.coordinator.wait_committed(epochs[-1])
            stats = sink.coordinator.stats()
    assert stats.rows_committed == 40
    # Each batch's files are in the commit of the epoch whose positions reach its batch id
    # (the epoch its committable travelled in), and only there.
    root = tmp_path / "table"
    held = {}
    for record in root.glob("epoch=*/_PRECOMMITTED.json"):
        facts = json.loads(record.read_text())
        held[facts["positions"][key]] = read(sorted(record.parent.glob("*/*.parquet")))
    assert held == {0: list(range(0, 20)), 1: list(range(100, 120))}


@pytest.mark.anyio
async def test_a_committable_whose_files_are_gone_fails_its_epoch_and_commits_nothing(
    tmp_path: Path,
) -> None:
    rt, feed, _, sink = build(tmp_path)
    stage = staging(tmp_path)
    with pytest.raises(ActorFailedError) as stopped:
        async with rt:
            with anyio.fail_after(WAIT):
                key = await feed.position_key("s", rt)
                staged = stage_batch(stage, key, 0, 0)
                # What a recovery cleaning the staging area meanwhile does.
                gone = Path(stage.root, staged.manifests[1].files[0].path)
                await anyio.Path(gone).unlink()
                with pytest.raises(ActorFailedError) as info:
                    await feed.deliver(
                        rt, "s", 0, SCHEMA.empty_table(), retries=0,
                        committables=[Committable("out", staged)],
                    )  # fmt: skip
    assert stopped.value is info.value
    error = info.value.cause
    assert isinstance(error, StagedFilesGoneError)
    assert (error.sink, error.batch, error.path) == ("out", f"{key}#0", str(gone))
    assert sorted((tmp_path / "table").glob("epoch=*/*/*.parquet")) == []
    assert sink.coordinator.stats().committed_epochs == 0


@pytest.mark.anyio
async def test_a_committable_for_another_sink_is_passed_on_and_a_foreign_payload_refused(
    tmp_path: Path,
) -> None:
    rt, feed, _, sink = build(tmp_path)
    with pytest.raises(ActorFailedError) as stopped:
        async with rt:
            with anyio.fail_after(WAIT):
                # For another sink: the writer passes it on (nothing downstream: dropped).
                epoch = await feed.deliver(
                    rt, "s", 0, SCHEMA.empty_table(), committables=[Committable("other", 1)]
                )
                assert epoch is not None
                await sink.coordinator.wait_committed(epoch)
                assert sink.coordinator.stats().rows_committed == 0
                with pytest.raises(ActorFailedError) as info:
                    await feed.deliver(
                        rt, "s", 1, SCHEMA.empty_table(), retries=0,
                        committables=[Committable("out", "not a batch")],
                    )  # fmt: skip
    assert stopped.value is info.value
    error = info.value.cause
    assert isinstance(error, SinkWriterInputError)
    assert (error.writer, error.expected, error.got) == (
        "out.0", "committables whose payload is a StagedBatch", "str",
    )  # fmt: skip
    with pytest.raises(InvalidArgumentError) as refused:
        await feed.deliver(rt, "s", 2, SCHEMA.empty_table(), committables=["x"])  # type: ignore[list-item]
    assert refused.value.argument == "committables"


def test_the_runtime_says_which_actors_reach_which(tmp_path: Path) -> None:
    rt, _, _, sink = build(tmp_path, between=True)
    assert all(rt.reaches("events", writer) for writer in sink.writers)
    assert rt.reaches("events", "between")
    assert not rt.reaches("between", "events")
    assert not rt.reaches("events", "events")


class SlowRecovery:
    """A Parquet table whose committer's recovery waits for ``released``."""

    def __init__(self, root: Path, released: anyio.Event) -> None:
        self._inner = ParquetTable(root, SCHEMA)
        self._released = released
        self.schema = SCHEMA

    def writer(self, writer_id: str) -> Any:
        return self._inner.writer(writer_id)

    def committer(self) -> Any:
        inner, released = self._inner.committer(), self._released

        class Committer:
            async def recover(self, pending: Any) -> None:
                await released.wait()
                await inner.recover(pending)

            async def prepare(self, epoch: int, manifests: Any) -> Any:
                return await inner.prepare(epoch, manifests)

            async def commit(self, epoch: int, metadata: Any) -> Any:
                return await inner.commit(epoch, metadata)

            async def abort(self, epoch: int, metadata: Any) -> None:
                await inner.abort(epoch, metadata)

        return Committer()


@pytest.mark.anyio
async def test_a_feed_takes_deliveries_only_once_the_sink_s_coordinator_has_recovered(
    tmp_path: Path,
) -> None:
    # What a driver stages for a delivery must not be deleted by that recovery: the feed's
    # source attaches only once its first barrier completed, which the sink's writers pass
    # only after the coordinator recovered and started them.
    released = anyio.Event()
    feed = BatchFeed(SCHEMA)
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=3600.0))
    rt.add_source("events", feed.source)
    sink = add_sink(rt, "out", SlowRecovery(tmp_path / "table", released), input="events")
    keys: list[str] = []

    async def ask() -> None:
        keys.append(await feed.position_key("s", rt))

    async with rt:
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(ask)
                await anyio.wait_all_tasks_blocked()
                assert keys == []  # the coordinator is still recovering
                released.set()
            assert keys == ["events/s"]
            epoch = await feed.deliver(rt, "s", 0, SCHEMA.empty_table())
            assert epoch is not None
            await sink.coordinator.wait_committed(epoch)


class Early(StreamActor):
    """Emits a committable before passing its first barrier."""

    async def process(self, message: Any, ctx: Any) -> None:
        if ctx.epoch == 0:
            await ctx.emit(Committable("out", 1))
        await ctx.emit(message)


@pytest.mark.anyio
async def test_a_committable_emitted_before_the_first_barrier_is_refused_naming_the_actor(
    tmp_path: Path,
) -> None:
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=3600.0))
    rt.add_source("events")
    rt.add_actor("early", Early, inputs=["events"])
    add_sink(rt, "out", ParquetTable(tmp_path / "table", SCHEMA), input="early")
    with anyio.fail_after(WAIT), pytest.raises(ActorFailedError) as failed:
        async with rt:
            await rt.checkpoint()
    assert failed.value.actor == "early"
    error = failed.value.cause
    assert isinstance(error, BarrierNotPassedError)
    assert (error.actor, error.then) == ("early", "emitted a committable")


@pytest.mark.anyio
async def test_a_batch_whose_partitions_do_not_cover_fails_its_epoch_naming_the_sink(
    tmp_path: Path,
) -> None:
    rt, feed, _, sink = build(tmp_path)
    stage = staging(tmp_path)
    with pytest.raises(ActorFailedError) as stopped:
        async with rt:
            with anyio.fail_after(WAIT):
                key = await feed.position_key("s", rt)
                staged = stage_batch(stage, key, 0, 0)
                short = StagedBatch(key, 0, 3, staged.manifests, staged.root)  # 2 of 3
                with pytest.raises(ActorFailedError):
                    await feed.deliver(
                        rt, "s", 0, SCHEMA.empty_table(), retries=0,
                        committables=[Committable("out", short)],
                    )  # fmt: skip
    error = stopped.value.cause
    assert isinstance(error, PartitionCoverageError)
    assert (error.sink, error.batch, error.partitions, error.got) == ("out", f"{key}#0", 3, [0, 1])
    assert sink.coordinator.stats().committed_epochs == 0


@pytest.mark.anyio
async def test_a_writer_s_commit_refuses_staged_batches_that_are_not_a_tuple_of_them(
    tmp_path: Path,
) -> None:
    rt, _, _, sink = build(tmp_path)
    coordinator = sink.coordinator
    handle = WriterHandle(coordinator, 1, VnodeBitmap.full(), "0")
    for staged in ([batch(0, [0])], ("x",)):
        with pytest.raises(InvalidArgumentError) as info:
            await handle.commit(1, Manifest("0", 1), staged)  # type: ignore[arg-type]
        assert (info.value.argument, info.value.expected, info.value.got) == (
            "staged", "a tuple of StagedBatch", staged,
        )  # fmt: skip
    del rt
