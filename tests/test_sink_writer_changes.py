"""A changelog into a sink: the last change of each key (the reduction a keyed writer
applies), and the sink writer handing chunks with delete/update ops to a staging writer that
takes changes (:class:`~barrierflow.actors.sinks.table.TakesChanges`) — insert-only chunks
still go to ``write``."""

from __future__ import annotations

from typing import Any

import anyio
import pyarrow as pa
import pytest
from _timeouts import scaled

from barrierflow.actors import add_sink
from barrierflow.actors.sinks.sink_task import SinkTask
from barrierflow.actors.sinks.table import (
    Manifest,
    StagingWriter,
    TakesChanges,
    last_change_per_key,
)
from barrierflow.channels import Chunk, Op
from barrierflow.errors import EpochPoisonedError, InvalidArgumentError, SchemaMismatchError
from barrierflow.runtime import Runtime, RuntimeConfig
from barrierflow.testing import ListTable

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])


def rows(ids: list[int], values: list[str]) -> pa.RecordBatch:
    return pa.record_batch([pa.array(ids, pa.int64()), pa.array(values)], schema=SCHEMA)


def test_the_last_change_of_each_key_is_kept_in_batch_order() -> None:
    batch = rows([1, 2, 1, 3, 2, 1], ["a", "b", "c", "d", "e", "f"])
    ops = pa.array(
        [Op.INSERT, Op.INSERT, Op.DELETE, Op.INSERT, Op.UPDATE_DELETE, Op.INSERT], pa.int8()
    )
    kept, kept_ops = last_change_per_key(batch, ops, ["id"])
    assert kept.to_pydict() == {"id": [3, 2, 1], "v": ["d", "e", "f"]}
    assert kept_ops.to_pylist() == [Op.INSERT, Op.UPDATE_DELETE, Op.INSERT]


def test_the_last_change_per_key_groups_by_every_key_column() -> None:
    batch = rows([1, 1, 1], ["a", "b", "a"])
    ops = pa.array([Op.INSERT, Op.INSERT, Op.DELETE], pa.int8())
    kept, kept_ops = last_change_per_key(batch, ops, ["id", "v"])
    assert kept.to_pydict() == {"id": [1, 1], "v": ["b", "a"]}
    assert kept_ops.to_pylist() == [Op.INSERT, Op.DELETE]


def test_the_last_change_per_key_refuses_ops_of_another_length_and_unknown_keys() -> None:
    batch = rows([1, 2], ["a", "b"])
    with pytest.raises(InvalidArgumentError) as short:
        last_change_per_key(batch, pa.array([0], pa.int8()), ["id"])
    assert short.value.argument == "ops"
    with pytest.raises(InvalidArgumentError) as unknown:
        last_change_per_key(batch, pa.array([0, 0], pa.int8()), ["nope"])
    assert unknown.value.argument == "key"


class ChangesWriter:
    """A list table's writer that records the changelogs it is handed."""

    def __init__(self, inner: StagingWriter, log: list[tuple[str, list[int], list[int]]]):
        self._inner = inner
        self._log = log

    @property
    def schema(self) -> pa.Schema:
        return self._inner.schema

    async def open(self) -> None:
        await self._inner.open()

    async def begin(self, epoch: int) -> None:
        await self._inner.begin(epoch)

    async def write(self, batch: pa.RecordBatch) -> None:
        self._log.append(("write", batch.column("id").to_pylist(), []))
        await self._inner.write(batch)

    async def write_changes(self, batch: pa.RecordBatch, ops: pa.Array) -> None:
        self._log.append(("write_changes", batch.column("id").to_pylist(), ops.to_pylist()))

    async def flush(self) -> None:
        await self._inner.flush()

    async def stage(self, epoch: int) -> Manifest:
        return await self._inner.stage(epoch)

    async def discard(self, epoch: int) -> None:
        await self._inner.discard(epoch)

    async def close(self) -> None:
        await self._inner.close()


class ChangesTable:
    """A list table whose writers take changes."""

    def __init__(self) -> None:
        self.inner = ListTable(SCHEMA)
        self.log: list[tuple[str, list[int], list[int]]] = []

    @property
    def schema(self) -> pa.Schema:
        return SCHEMA

    def writer(self, writer_id: str) -> ChangesWriter:
        return ChangesWriter(self.inner.writer(writer_id), self.log)

    def committer(self) -> Any:
        return self.inner.committer()


@pytest.mark.anyio
async def test_a_changelog_goes_to_a_writer_that_takes_changes(tmp_path: Any) -> None:
    table = ChangesTable()
    assert isinstance(table.writer("0"), TakesChanges)
    rt = Runtime(RuntimeConfig(state_path=str(tmp_path / "state.db"), barrier_interval=3600.0))
    rt.add_source("src", schema=SCHEMA)
    sink = add_sink(rt, "sink", table, input="src")
    async with rt:
        await rt.push("src", Chunk(rows([1, 2], ["a", "b"])).with_ops([Op.DELETE, Op.INSERT]))
        # Ops present but all inserts: an insert-only chunk, written as rows.
        await rt.push("src", Chunk(rows([3], ["c"])).with_ops([Op.INSERT]))
        epoch = await rt.checkpoint()
        with anyio.fail_after(scaled(20)):
            await sink.coordinator.wait_committed(epoch)
    assert table.log == [
        ("write_changes", [1, 2], [Op.DELETE, Op.INSERT]),
        ("write", [3], []),
    ]


@pytest.mark.anyio
async def test_a_sink_task_takes_changes_only_for_a_writer_that_takes_them() -> None:
    changelog = rows([1], ["a"])
    delete = pa.array([Op.DELETE], pa.int8())
    async with SinkTask(ListTable(SCHEMA).writer("0"), name="plain") as plain:
        assert not plain.takes_changes
        with pytest.raises(InvalidArgumentError) as refused:
            await plain.write_changes(changelog, delete)
        assert (refused.value.argument, refused.value.expected, refused.value.got) == (
            "batch",
            "inserts only (sink 'plain' takes no changes)",
            "a changelog",
        )
    table = ChangesTable()
    async with SinkTask(table.writer("0"), name="keyed") as keyed:
        assert keyed.takes_changes
        with pytest.raises(InvalidArgumentError) as short:
            await keyed.write_changes(changelog, pa.array([], pa.int8()))
        assert short.value.argument == "ops"
        await keyed.begin(1)
        await keyed.write_changes(changelog, delete)
        await keyed.flush()  # the task served the write before the flush
    assert table.log == [("write_changes", [1], [Op.DELETE])]


@pytest.mark.anyio
async def test_write_changes_refuses_a_non_batch_naming_what_it_expected_and_got() -> None:
    table = ChangesTable()
    async with SinkTask(table.writer("0"), name="keyed") as keyed:
        with pytest.raises(InvalidArgumentError) as info:
            await keyed.write_changes([1], pa.array([Op.DELETE], pa.int8()))  # type: ignore[arg-type]
    assert (info.value.argument, info.value.expected, info.value.got) == (
        "batch",
        "a pyarrow.RecordBatch",
        "list",
    )
    assert table.log == []


@pytest.mark.anyio
@pytest.mark.parametrize(
    "ops",
    [
        [Op.DELETE],  # not an Arrow array, though one code per row
        pa.array([Op.DELETE], pa.int32()),  # one code per row, not int8
        pa.array([Op.DELETE, Op.INSERT], pa.int8()),  # int8, one code too many
    ],
    ids=["list", "int32", "too-long"],
)
async def test_write_changes_refuses_ops_that_are_not_one_int8_code_per_row(ops: Any) -> None:
    table = ChangesTable()
    async with SinkTask(table.writer("0"), name="keyed") as keyed:
        with pytest.raises(InvalidArgumentError) as info:
            await keyed.write_changes(rows([1], ["a"]), ops)
    assert (info.value.argument, info.value.expected) == ("ops", "1 int8 op codes")
    assert info.value.got is ops
    assert table.log == []


@pytest.mark.anyio
async def test_a_changelog_of_another_schema_raises_naming_both_and_poisons_the_epoch() -> None:
    other = pa.schema([("id", pa.int32()), ("v", pa.string())])
    wrong = pa.record_batch([pa.array([1], pa.int32()), pa.array(["a"])], schema=other)
    table = ChangesTable()
    async with SinkTask(table.writer("0"), name="keyed") as keyed:
        await keyed.begin(1)
        with pytest.raises(SchemaMismatchError) as info:
            await keyed.write_changes(wrong, pa.array([Op.DELETE], pa.int8()))
        await keyed.flush()  # the task served the write before the flush
        stats = keyed.stats()
        with pytest.raises(EpochPoisonedError):
            await keyed.stage(1)
    assert info.value.argument == "batch for sink 'keyed'"
    assert info.value.expected_schema == SCHEMA
    assert info.value.actual_schema == other
    assert info.value.got == other
    # The changelog still reached the task, which counted the failed write.
    assert (stats.write_errors, stats.epoch_poisoned, stats.batches_written) == (1, True, 0)
    assert table.log == []  # the writer never saw the wrong changelog
