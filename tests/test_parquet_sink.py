"""The Parquet table with one writer, used directly (one test per rule of the staging writer's
and the committer's module docstrings), and the at-least-once print sink. The SIGKILL tests
are in test_sink_crash.py; the rules every table keeps are in test_tables.py."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from barrierflow.actors import Committer, Failed, Manifest, StagedFile, StagingWriter, Table
from barrierflow.actors.sinks.table import ColumnStats
from barrierflow.connectors import ParquetStagingWriter, ParquetTable, PrintSink, _parquet_files
from barrierflow.connectors._staging import MANIFEST, PRECOMMITTED, STAGING, epoch_dir_name
from barrierflow.connectors.parquet_committer import ParquetCommitter
from barrierflow.errors import InvalidArgumentError, SinkRecoveryError

pytestmark = pytest.mark.anyio

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def batch(*ids: int) -> pa.RecordBatch:
    return pa.record_batch(
        [pa.array(ids, pa.int64()), pa.array([f"n{i}" for i in ids], pa.string())],
        schema=SCHEMA,
    )


def visible(path: Path) -> list[int]:
    """The ids a reader of the table sees (sorted, duplicates kept)."""
    table = ds.dataset(path, SCHEMA, format="parquet").to_table()
    return sorted(table["id"].to_pylist())


def staged(path: Path, epoch: int, writer: str = "0") -> Path:
    return path / STAGING / f"{epoch:020d}" / f"w{writer}"


def committed_dirs(path: Path) -> list[str]:
    return sorted(p.name for p in path.glob("epoch=*"))


def manifest(path: Path) -> dict[str, Any]:
    value: dict[str, Any] = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    return value


async def opened(path: Path, writer: str = "0", **kwargs: Any) -> ParquetStagingWriter:
    """A staging writer as a sink task starts it."""
    sink = ParquetStagingWriter(path, SCHEMA, writer, **kwargs)
    await sink.open()
    return sink


async def committer_of(path: Path) -> ParquetCommitter:
    """The table's committer as its coordinator starts it (nothing pending)."""
    committer = ParquetCommitter(path)
    await committer.recover({})
    return committer


async def epoch_of(sink: ParquetStagingWriter, epoch: int, *ids: int) -> Manifest:
    """Begin ``epoch``, write ``ids`` and stage it; its manifest."""
    await sink.begin(epoch)
    if ids:
        await sink.write(batch(*ids))
    return await sink.stage(epoch)


async def commit(committer: ParquetCommitter, epoch: int, *manifests: Manifest) -> None:
    """Prepare and commit ``epoch`` from ``manifests``, as the coordinator does."""
    metadata = await committer.prepare(epoch, manifests)
    if metadata is not None:
        await committer.commit(epoch, metadata)


async def test_the_table_has_one_staging_writer_per_id_and_a_committer(tmp_path: Path) -> None:
    table = ParquetTable(tmp_path / "table", SCHEMA, rows_per_file=5)
    assert isinstance(table, Table)
    assert (table.schema, table.path) == (SCHEMA, tmp_path / "table")
    writer = table.writer("3")
    assert isinstance(writer, StagingWriter)
    assert (writer.schema, writer.writer) == (SCHEMA, "3")
    assert table.writer("3") is not writer  # a new one per incarnation
    committer = table.committer()
    assert isinstance(committer, Committer)
    assert committer.path == tmp_path / "table"
    assert not (tmp_path / "table").exists()  # nothing is created before open
    await writer.open()
    assert (tmp_path / "table" / STAGING).is_dir()
    assert not (tmp_path / "table" / MANIFEST).exists()
    await writer.close()


async def test_staged_rows_are_invisible_to_readers_until_commit(tmp_path: Path) -> None:
    sink = await opened(tmp_path, row_group_rows=2)
    committer = await committer_of(tmp_path)
    await sink.begin(1)
    await sink.write(batch(1, 2, 3))  # over row_group_rows: written to a staged file
    assert list(staged(tmp_path, 1).glob("*.parquet")) != []
    assert ds.dataset(tmp_path, format="parquet").to_table().num_rows == 0
    await sink.write(batch(4))
    await sink.flush()
    assert visible(tmp_path) == []
    staged_manifest = await sink.stage(1)
    assert ds.dataset(tmp_path, format="parquet").to_table().num_rows == 0
    metadata = await committer.prepare(1, [staged_manifest])
    assert metadata is not None
    assert visible(tmp_path) == []  # prepared (pending): still invisible
    await committer.commit(1, metadata)
    assert visible(tmp_path) == [1, 2, 3, 4]
    await sink.close()


async def test_stage_describes_the_staged_files_in_its_manifest(tmp_path: Path) -> None:
    sink = await opened(tmp_path, writer="3", rows_per_file=2)
    staged_manifest = await epoch_of(sink, 5, 10, 11, 12)
    directory = staged(tmp_path, 5, "3")
    names = ["part-00000.parquet", "part-00001.parquet"]
    # Each file's statistics, from the footer its writer wrote (ids 10, 11 | 12).
    columns = [
        {"id": ColumnStats(0, 10, 11), "name": ColumnStats(0, "n10", "n11")},
        {"id": ColumnStats(0, 12, 12), "name": ColumnStats(0, "n12", "n12")},
    ]
    assert staged_manifest == Manifest(
        "3",
        5,
        tuple(
            StagedFile(
                f"{STAGING}/{5:020d}/w3/{name}", rows, (directory / name).stat().st_size, stats
            )
            for name, rows, stats in zip(names, [2, 1], columns, strict=True)
        ),
    )
    assert staged_manifest.rows == 3
    assert sorted(p.name for p in directory.iterdir()) == names  # no temporary, no record
    rows = [pq.read_metadata(directory / name).num_rows for name in names]
    assert rows == [2, 1]
    assert not (tmp_path / epoch_dir_name(5)).exists()
    assert not (tmp_path / MANIFEST).exists()  # nothing committed yet
    # The manifest crosses to the coordinator as JSON.
    assert Manifest.from_json(json.loads(json.dumps(staged_manifest.to_json()))) == (
        staged_manifest
    )


async def test_commit_publishes_the_whole_epoch_at_once_and_updates_the_manifest(
    tmp_path: Path,
) -> None:
    sink = await opened(tmp_path, rows_per_file=2, row_group_rows=1)
    committer = await committer_of(tmp_path)
    staged_manifest = await epoch_of(sink, 7, 1, 2, 3)
    await commit(committer, 7, staged_manifest)
    final = tmp_path / epoch_dir_name(7)
    assert final.is_dir()
    assert not staged(tmp_path, 7).exists()  # moved, not copied
    assert sorted(p.name for p in (final / "w0").glob("*.parquet")) == [
        "part-00000.parquet",
        "part-00001.parquet",
    ]
    record = json.loads((final / PRECOMMITTED).read_text(encoding="utf-8"))
    assert record == {"files": [f.path for f in staged_manifest.files], "rows": 3}
    assert visible(tmp_path) == [1, 2, 3]
    assert manifest(tmp_path) == {
        "format": "barrierflow-parquet-sink",
        "version": 1,
        "committed_epoch": 7,
        "rows": 3,
        "files": 2,
    }
    await commit(committer, 9, await epoch_of(sink, 9, 4))
    assert visible(tmp_path) == [1, 2, 3, 4]
    assert (manifest(tmp_path)["committed_epoch"], manifest(tmp_path)["rows"]) == (9, 4)
    assert manifest(tmp_path)["files"] == 3
    assert not (tmp_path / (MANIFEST + ".tmp")).exists()


async def test_commit_of_a_staged_epoch_leaves_the_open_epoch_apart(tmp_path: Path) -> None:
    # The coordinator commits epoch n once durable, after the writer has begun epoch n + 1.
    sink = await opened(tmp_path, row_group_rows=1)
    committer = await committer_of(tmp_path)
    first = await epoch_of(sink, 1, 1, 2)
    await sink.begin(2)
    await sink.write(batch(3))
    await commit(committer, 1, first)
    assert visible(tmp_path) == [1, 2]
    await sink.write(batch(4))
    second = await sink.stage(2)
    assert second.rows == 2
    await commit(committer, 2, second)
    assert visible(tmp_path) == [1, 2, 3, 4]


async def test_a_replayed_commit_is_a_no_op(tmp_path: Path) -> None:
    sink = await opened(tmp_path)
    committer = await committer_of(tmp_path)
    first = await committer.prepare(3, [await epoch_of(sink, 3, 1, 2)])
    assert first is not None
    await committer.commit(3, first)
    after_first = manifest(tmp_path)
    await committer.commit(3, first)  # the same epoch again
    assert visible(tmp_path) == [1, 2]
    assert manifest(tmp_path) == after_first
    await commit(committer, 4, await epoch_of(sink, 4, 3))
    await committer.commit(3, first)  # an older epoch, below the manifest's
    await sink.close()
    restarted = await committer_of(tmp_path)  # after a restart
    await restarted.commit(3, first)
    assert visible(tmp_path) == [1, 2, 3]
    assert (manifest(tmp_path)["committed_epoch"], manifest(tmp_path)["rows"]) == (4, 3)
    assert committed_dirs(tmp_path) == [epoch_dir_name(3), epoch_dir_name(4)]


async def test_discard_deletes_the_staged_files_and_the_buffered_rows(tmp_path: Path) -> None:
    sink = await opened(tmp_path, row_group_rows=3)
    committer = await committer_of(tmp_path)
    await sink.begin(2)
    await sink.write(batch(1, 2, 3))  # written into a staged file
    await sink.write(batch(4))  # buffered only
    assert staged(tmp_path, 2).exists()
    await sink.discard(2)
    assert not staged(tmp_path, 2).exists()
    assert list((tmp_path / STAGING).rglob("*.parquet")) == []
    third = await epoch_of(sink, 3, 9)
    assert third.rows == 1  # nothing of the discarded epoch leaked into the next
    await commit(committer, 3, third)
    assert visible(tmp_path) == [9]


async def test_discard_of_a_staged_epoch_deletes_its_files(tmp_path: Path) -> None:
    sink = await opened(tmp_path)
    second = await epoch_of(sink, 2, 1)
    await sink.discard(2)  # staged, but it will never be committed
    assert not staged(tmp_path, 2).exists()
    committer = await committer_of(tmp_path)
    metadata = await committer.prepare(2, [second])
    assert metadata is not None
    # Nothing left to publish: refused for good, not committed empty.
    outcome = await committer.commit(2, metadata)
    assert isinstance(outcome, Failed)
    assert isinstance(outcome.cause, SinkRecoveryError)
    assert "epoch 2" in outcome.cause.reason
    assert visible(tmp_path) == []


async def test_begin_removes_what_an_earlier_incarnation_staged_under_the_epoch(
    tmp_path: Path,
) -> None:
    sink = await opened(tmp_path, row_group_rows=1)
    await sink.begin(4)
    await sink.write(batch(1))
    await sink.close()  # crashed before staging
    again = await opened(tmp_path)
    fourth = await epoch_of(again, 4, 2)
    assert fourth.rows == 1  # only the new row: the leftover file was removed
    assert len(list(staged(tmp_path, 4).iterdir())) == 1


async def test_recover_deletes_every_staged_epoch_not_pending(tmp_path: Path) -> None:
    sink = await opened(tmp_path, row_group_rows=1)
    committer = await committer_of(tmp_path)
    durable = await committer.prepare(1, [await epoch_of(sink, 1, 1)])
    await epoch_of(sink, 2, 2)  # staged, but never recorded as pending
    await sink.begin(3)
    await sink.write(batch(3))  # staged only
    await sink.close()
    assert staged(tmp_path, 2).exists()
    assert staged(tmp_path, 3).exists()
    assert durable is not None
    restarted = ParquetCommitter(tmp_path)
    await restarted.recover({1: durable})
    assert [p.name for p in (tmp_path / STAGING).iterdir()] == [f"{1:020d}"]
    await restarted.commit(1, durable)
    assert visible(tmp_path) == [1]
    assert list((tmp_path / STAGING).iterdir()) == []
    assert manifest(tmp_path)["committed_epoch"] == 1


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "",
        "[]",
        json.dumps({"format": "someone-else", "version": 1}),
        json.dumps({"format": "barrierflow-parquet-sink", "version": 99}),
        json.dumps({"format": "barrierflow-parquet-sink", "version": 1}),
        json.dumps(
            {
                "format": "barrierflow-parquet-sink",
                "version": 1,
                "committed_epoch": "3",
                "rows": 0,
                "files": 0,
            }
        ),
    ],
    ids=["garbage", "empty", "list", "format", "version", "fields", "field-type"],
)
async def test_a_corrupt_manifest_raises_sink_recovery_error(tmp_path: Path, content: str) -> None:
    sink = await opened(tmp_path)
    committer = await committer_of(tmp_path)
    metadata = await committer.prepare(1, [await epoch_of(sink, 1, 1)])
    assert metadata is not None
    await sink.close()
    (tmp_path / MANIFEST).write_text(content, encoding="utf-8")
    restarted = ParquetCommitter(tmp_path)
    with pytest.raises(SinkRecoveryError) as info:
        await restarted.recover({})
    assert info.value.sink == str(tmp_path)
    assert staged(tmp_path, 1).exists()  # nothing was deleted
    outcome = await restarted.commit(1, metadata)  # a damaged table: failed for good
    assert isinstance(outcome, Failed)
    assert isinstance(outcome.cause, SinkRecoveryError)
    assert staged(tmp_path, 1).exists()


async def test_rows_per_file_rolls_files_and_row_group_rows_sizes_row_groups(
    tmp_path: Path,
) -> None:
    sink = await opened(tmp_path, rows_per_file=4, row_group_rows=3)
    committer = await committer_of(tmp_path)
    await sink.begin(1)
    for start in range(0, 10, 2):
        await sink.write(batch(start, start + 1))
    first = await sink.stage(1)
    names = [Path(f.path).name for f in first.files]
    assert names == [f"part-{i:05d}.parquet" for i in range(3)]
    assert [f.rows for f in first.files] == [4, 4, 2]
    assert first.rows == 10
    metadata = [pq.read_metadata(staged(tmp_path, 1) / n) for n in names]
    assert [m.num_rows for m in metadata] == [4, 4, 2]
    # Row groups of row_group_rows (4 buffered, then 4 + 2), cut where a file rolls.
    groups = [[m.row_group(i).num_rows for i in range(m.num_row_groups)] for m in metadata]
    assert groups == [[4], [4], [2]]
    await commit(committer, 1, first)
    assert visible(tmp_path) == list(range(10))
    assert manifest(tmp_path)["files"] == 3


async def test_a_flush_writes_a_row_group_and_writes_fill_the_buffer_first(
    tmp_path: Path,
) -> None:
    sink = await opened(tmp_path, row_group_rows=100)
    await sink.begin(1)
    await sink.write(batch(1, 2))
    assert not staged(tmp_path, 1).exists()  # buffered: under row_group_rows
    await sink.flush()
    await sink.write(batch(3))
    await sink.flush()
    await sink.flush()  # nothing buffered: no empty row group
    first = await sink.stage(1)
    [staged_file] = first.files
    metadata = pq.read_metadata(tmp_path / staged_file.path)
    assert [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)] == [2, 1]


@pytest.mark.parametrize("codec", ["zstd", "none"])
async def test_compression_is_the_files_codec(tmp_path: Path, codec: str) -> None:
    sink = await opened(tmp_path, compression=codec)
    [staged_file] = (await epoch_of(sink, 1, 1, 2)).files
    column = pq.read_metadata(tmp_path / staged_file.path).row_group(0).column(0)
    assert column.compression == ("UNCOMPRESSED" if codec == "none" else codec.upper())


@pytest.mark.parametrize(
    ("choice", "dictionary"),
    [(None, [False, True]), (True, [True, True]), (False, [False, False]), (["id"], [True, False])],
)
async def test_use_dictionary_chooses_the_dictionary_encoded_columns(
    tmp_path: Path, choice: Any, dictionary: list[bool]
) -> None:
    sink = await opened(tmp_path, use_dictionary=choice)
    [staged_file] = (await epoch_of(sink, 1, 1, 2, 1)).files
    group = pq.read_metadata(tmp_path / staged_file.path).row_group(0)
    assert [group.column(i).has_dictionary_page for i in range(2)] == dictionary


async def test_empty_epochs_stage_nothing(tmp_path: Path) -> None:
    sink = await opened(tmp_path)
    committer = await committer_of(tmp_path)
    await sink.begin(1)
    await sink.write(batch())  # zero rows
    await sink.flush()
    assert await sink.stage(1) == Manifest("0", 1)
    assert not staged(tmp_path, 1).exists()
    assert await committer.prepare(1, [Manifest("0", 1)]) is None  # nothing to commit
    await commit(committer, 2, await epoch_of(sink, 2, 5))
    await commit(committer, 3, await epoch_of(sink, 3))
    assert not (tmp_path / epoch_dir_name(3)).exists()
    assert manifest(tmp_path)["committed_epoch"] == 2  # the last epoch that wrote rows
    assert visible(tmp_path) == [5]


async def test_hive_partitioning_yields_an_epoch_column(tmp_path: Path) -> None:
    sink = await opened(tmp_path)
    committer = await committer_of(tmp_path)
    await commit(committer, 12, await epoch_of(sink, 12, 1, 2))
    await commit(committer, 30, await epoch_of(sink, 30, 3))
    hive_int64 = ds.partitioning(pa.schema([("epoch", pa.int64())]), flavor="hive")
    table = ds.dataset(tmp_path, format="parquet", partitioning=hive_int64).to_table()
    rows = sorted(zip(table["id"].to_pylist(), table["epoch"].to_pylist(), strict=True))
    assert rows == [(1, 12), (2, 12), (3, 30)]
    assert table["name"].to_pylist().count("n1") == 1
    # A real epoch (wall-clock milliseconds << 16) overflows the int32 that "hive" infers,
    # which then falls back to a string column; naming the type keeps it an integer.
    real_epoch = 1_800_000_000_000 << 16
    await commit(committer, real_epoch, await epoch_of(sink, real_epoch, 4))
    table = ds.dataset(tmp_path, format="parquet", partitioning=hive_int64).to_table()
    rows = sorted(zip(table["id"].to_pylist(), table["epoch"].to_pylist(), strict=True))
    assert rows == [(1, 12), (2, 12), (3, 30), (4, real_epoch)]


def test_check_path_creates_the_table_and_staging_directories(tmp_path: Path) -> None:
    sink = ParquetStagingWriter(tmp_path / "a" / "table", SCHEMA, "0")
    assert not (tmp_path / "a").exists()
    sink.check_path("orders")
    assert (tmp_path / "a" / "table" / STAGING).is_dir()
    sink.check_path("orders")  # again: nothing to do


async def test_the_lock_lets_writers_of_one_process_share_the_table_until_closed(
    tmp_path: Path,
) -> None:
    # Other processes are refused (test_sink_wiring.py); the writers of one table in this
    # process stage side by side, and a closed writer's lock is released.
    first, second = await opened(tmp_path, "0"), await opened(tmp_path, "1")
    assert (tmp_path / ".barrierflow.lock").exists()
    await first.close()
    await second.close()
    again = await opened(tmp_path, "0")
    await again.close()
    await again.close()  # closing twice is harmless


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"root": ""}, "root"),
        ({"root": 3}, "root"),
        ({"schema": "id int64"}, "schema"),
        ({"rows_per_file": 0}, "rows_per_file"),
        ({"rows_per_file": True}, "rows_per_file"),
        ({"rows_per_file": 1.5}, "rows_per_file"),
        ({"row_group_rows": -1}, "row_group_rows"),
        ({"compression": None}, "compression"),
        ({"compression": "lzma"}, "compression"),
        ({"use_dictionary": "id"}, "use_dictionary"),
        ({"use_dictionary": ["nope"]}, "use_dictionary"),
        ({"use_dictionary": 3}, "use_dictionary"),
        ({"writer": ""}, "writer"),
        ({"writer": "a/b"}, "writer"),
        ({"writer": 7}, "writer"),
        ({"writer": None}, "writer"),
    ],
)
def test_bad_arguments_raise_invalid_argument_error_naming_the_argument(
    tmp_path: Path, kwargs: dict[str, Any], argument: str
) -> None:
    options: dict[str, Any] = {"root": tmp_path, "schema": SCHEMA, "writer": "0", **kwargs}
    with pytest.raises(InvalidArgumentError) as info:
        ParquetStagingWriter(**options)
    assert info.value.argument == argument
    assert str(info.value).startswith(f"{argument}: expected ")
    # The table refuses the same options when it is made, not when its writers are.
    table_options = {k: v for k, v in options.items() if k not in ("root", "writer")}
    if argument not in ("root", "writer"):
        with pytest.raises(InvalidArgumentError) as table_info:
            ParquetTable(tmp_path, **table_options)
        assert table_info.value.argument == argument


def test_the_table_refuses_options_its_writers_do_not_take(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        ParquetTable(tmp_path, SCHEMA, writer="0", rows=3)
    assert (info.value.argument, info.value.got) == ("options", ["rows", "writer"])


async def test_print_sink_prints_rows_and_is_at_least_once() -> None:
    out = io.StringIO()
    sink = PrintSink(SCHEMA, out=out, max_rows=2, prefix="[dbg] ")
    assert isinstance(sink, Table)
    assert sink.schema == SCHEMA
    writer = sink.writer("0")
    assert isinstance(writer, StagingWriter)
    committer = sink.committer()
    await committer.recover({1: {"epoch": 1}})
    await writer.open()
    await writer.begin(9)
    await writer.write(batch(1, 2, 3))
    assert out.getvalue().splitlines() == [
        "[dbg] epoch=9 rows=3",
        "[dbg]   id=1 name='n1'",
        "[dbg]   id=2 name='n2'",
        "[dbg]   ... 1 more",
    ]
    staged_manifest = await writer.stage(9)
    assert staged_manifest == Manifest("0", 9)  # printed already: nothing staged
    assert await committer.prepare(9, [staged_manifest]) is None  # nothing to commit
    await writer.begin(10)
    await writer.write(batch(4))
    await writer.discard(10)
    assert out.getvalue().splitlines()[-3:] == [
        "[dbg] epoch=10 rows=1",
        "[dbg]   id=4 name='n4'",
        "[dbg] epoch=10 discarded (its rows above may be printed again)",
    ]
    await writer.close()
    assert (sink.rows, sink.epochs) == (4, 1)


async def test_print_sink_prints_to_standard_output_by_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    writer = PrintSink(SCHEMA, max_rows=0).writer("0")
    await writer.begin(1)
    await writer.write(batch(1, 2))
    await writer.flush()
    assert capsys.readouterr().out.splitlines() == ["epoch=1 rows=2", "  ... 2 more"]


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"schema": None}, "schema"),
        ({"max_rows": -1}, "max_rows"),
        ({"max_rows": 2.0}, "max_rows"),
        ({"prefix": 1}, "prefix"),
    ],
)
def test_print_sink_bad_arguments_raise_invalid_argument_error(
    kwargs: dict[str, Any], argument: str
) -> None:
    options: dict[str, Any] = {"schema": SCHEMA, **kwargs}
    with pytest.raises(InvalidArgumentError) as info:
        PrintSink(**options)
    assert info.value.argument == argument


async def test_a_flush_cancelled_before_its_thread_starts_loses_no_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A periodic flush that overruns its timeout is abandoned on its thread; the next flush
    # then waits for that thread, and may be cancelled while it waits: its rows must stay.
    sink = await opened(tmp_path, row_group_rows=1_000)
    committer = await committer_of(tmp_path)
    release = threading.Event()
    real_write = _parquet_files.StagedFiles.write

    def slow_write(files: Any, batches: list[pa.RecordBatch]) -> None:
        release.wait(10)
        real_write(files, batches)

    monkeypatch.setattr(_parquet_files.StagedFiles, "write", slow_write)
    await sink.begin(1)
    await sink.write(batch(1))
    with anyio.move_on_after(0.05) as stuck:
        await sink.flush()  # abandoned: the thread goes on
    assert stuck.cancelled_caught
    await sink.write(batch(2))
    with anyio.move_on_after(0.05) as waiting:
        await sink.flush()  # cancelled while the stuck flush still holds the writer
    assert waiting.cancelled_caught
    await sink.write(batch(3))
    release.set()
    first = await sink.stage(1)
    assert first.rows == 3
    await commit(committer, 1, first)
    assert visible(tmp_path) == [1, 2, 3]
