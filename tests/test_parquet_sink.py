"""The exactly-once Parquet file sink, used directly (one test per rule of its module
docstring), and the at-least-once print sink. The SIGKILL tests are in test_sink_crash.py."""

from __future__ import annotations

import io
import json
import os
import threading
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from barrierflow import InvalidArgumentError, SinkRecoveryError
from barrierflow.actors import Manifest, PendingCommit, SinkConnector
from barrierflow.connectors import ParquetFileSink, PrintSink, _parquet_files
from barrierflow.connectors._staging import MANIFEST, PRECOMMITTED, STAGING, epoch_dir_name

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


def staged(path: Path, epoch: int) -> Path:
    return path / STAGING / f"{epoch:020d}"


def committed_dirs(path: Path) -> list[str]:
    return sorted(p.name for p in path.glob("epoch=*"))


def manifest(path: Path) -> dict[str, Any]:
    value: dict[str, Any] = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    return value


async def opened(path: Path, **kwargs: Any) -> ParquetFileSink:
    """A sink as a sink task starts it: open, then recover (nothing pending)."""
    sink = ParquetFileSink(path, SCHEMA, **kwargs)
    await sink.open()
    await sink.recover([])
    return sink


async def epoch_of(sink: ParquetFileSink, epoch: int, *ids: int) -> dict[str, Any]:
    """Begin ``epoch``, write ``ids`` and pre-commit it; its commit metadata."""
    await sink.begin_epoch(epoch)
    if ids:
        await sink.write_batch(batch(*ids))
    return dict(await sink.pre_commit(epoch))


async def test_the_sink_is_an_exactly_once_connector(tmp_path: Path) -> None:
    sink = ParquetFileSink(tmp_path / "table", SCHEMA)
    assert isinstance(sink, SinkConnector)
    assert sink.exactly_once is True
    assert sink.schema == SCHEMA
    assert sink.path == tmp_path / "table"
    assert sink.committed_epoch() == 0  # a new table: no manifest yet
    await sink.open()
    assert (tmp_path / "table" / STAGING).is_dir()
    assert not (tmp_path / "table" / MANIFEST).exists()


async def test_staged_rows_are_invisible_to_readers_until_commit(tmp_path: Path) -> None:
    sink = await opened(tmp_path, row_group_rows=2)
    await sink.begin_epoch(1)
    await sink.write_batch(batch(1, 2, 3))  # over row_group_rows: written to a staged file
    assert list(staged(tmp_path, 1).glob("*.parquet")) != []
    assert ds.dataset(tmp_path, format="parquet").to_table().num_rows == 0
    await sink.write_batch(batch(4))
    await sink.flush()
    assert visible(tmp_path) == []
    await sink.pre_commit(1)
    assert ds.dataset(tmp_path, format="parquet").to_table().num_rows == 0
    assert visible(tmp_path) == []
    await sink.commit_epoch(1)
    assert visible(tmp_path) == [1, 2, 3, 4]
    await sink.close()


async def test_pre_commit_names_the_staged_files_and_records_them(tmp_path: Path) -> None:
    sink = await opened(tmp_path, rows_per_file=2)
    metadata = await epoch_of(sink, 5, 10, 11, 12)
    assert metadata == {
        "epoch": 5,
        "files": ["part-00000.parquet", "part-00001.parquet"],
        "rows": 3,
    }
    directory = staged(tmp_path, 5)
    assert sorted(p.name for p in directory.glob("*.parquet")) == metadata["files"]
    rows = sum(pq.read_metadata(directory / name).num_rows for name in metadata["files"])
    assert rows == 3
    assert json.loads((directory / PRECOMMITTED).read_text(encoding="utf-8")) == metadata
    assert not list(directory.glob("*.tmp"))  # written atomically: no temporary left
    assert not (tmp_path / epoch_dir_name(5)).exists()
    assert not (tmp_path / MANIFEST).exists()  # nothing committed yet


async def test_commit_publishes_the_whole_epoch_at_once_and_updates_the_manifest(
    tmp_path: Path,
) -> None:
    sink = await opened(tmp_path, rows_per_file=2, row_group_rows=1)
    metadata = await epoch_of(sink, 7, 1, 2, 3)
    await sink.commit_epoch(7)
    final = tmp_path / epoch_dir_name(7)
    assert final.is_dir()
    assert not staged(tmp_path, 7).exists()  # moved, not copied
    assert sorted(p.name for p in final.glob("*.parquet")) == metadata["files"]
    assert visible(tmp_path) == [1, 2, 3]
    assert manifest(tmp_path) == {
        "format": "barrierflow-parquet-sink",
        "version": 1,
        "committed_epoch": 7,
        "rows": 3,
        "files": 2,
    }
    assert sink.committed_epoch() == 7
    await epoch_of(sink, 9, 4)
    await sink.commit_epoch(9)
    assert visible(tmp_path) == [1, 2, 3, 4]
    assert (manifest(tmp_path)["committed_epoch"], manifest(tmp_path)["rows"]) == (9, 4)
    assert manifest(tmp_path)["files"] == 3
    assert not (tmp_path / (MANIFEST + ".tmp")).exists()


async def test_commit_of_a_pre_committed_epoch_leaves_the_open_epoch_apart(tmp_path: Path) -> None:
    # The contract: commit_epoch(n) may come after epoch n + 1 has begun.
    sink = await opened(tmp_path, row_group_rows=1)
    await epoch_of(sink, 1, 1, 2)
    await sink.begin_epoch(2)
    await sink.write_batch(batch(3))
    await sink.commit_epoch(1)
    assert visible(tmp_path) == [1, 2]
    await sink.write_batch(batch(4))
    assert (await sink.pre_commit(2))["rows"] == 2
    await sink.commit_epoch(2)
    assert visible(tmp_path) == [1, 2, 3, 4]


async def test_a_replayed_commit_is_a_no_op(tmp_path: Path) -> None:
    sink = await opened(tmp_path)
    await epoch_of(sink, 3, 1, 2)
    await sink.commit_epoch(3)
    after_first = manifest(tmp_path)
    await sink.commit_epoch(3)  # the same epoch again
    assert visible(tmp_path) == [1, 2]
    assert manifest(tmp_path) == after_first
    await epoch_of(sink, 4, 3)
    await sink.commit_epoch(4)
    await sink.commit_epoch(3)  # an older epoch, below the manifest's
    await sink.close()
    reopened = ParquetFileSink(tmp_path, SCHEMA)  # after a restart
    await reopened.open()
    await reopened.commit_epoch(3)
    await reopened.commit_epoch(4)
    assert visible(tmp_path) == [1, 2, 3]
    assert (manifest(tmp_path)["committed_epoch"], manifest(tmp_path)["rows"]) == (4, 3)
    assert committed_dirs(tmp_path) == [epoch_dir_name(3), epoch_dir_name(4)]


async def test_commit_of_an_epoch_already_renamed_only_completes_the_record(
    tmp_path: Path,
) -> None:
    sink = await opened(tmp_path)
    await epoch_of(sink, 6, 1, 2, 3)
    # A crash between the rename and the manifest write; the commit is then replayed.
    os.rename(staged(tmp_path, 6), tmp_path / epoch_dir_name(6))
    assert visible(tmp_path) == [1, 2, 3]
    assert not (tmp_path / MANIFEST).exists()
    await sink.commit_epoch(6)
    assert visible(tmp_path) == [1, 2, 3]
    assert (manifest(tmp_path)["committed_epoch"], manifest(tmp_path)["rows"]) == (6, 3)
    await sink.commit_epoch(6)
    assert manifest(tmp_path)["rows"] == 3


async def test_rollback_deletes_the_staged_files_and_the_buffered_rows(tmp_path: Path) -> None:
    sink = await opened(tmp_path, row_group_rows=3)
    await sink.begin_epoch(2)
    await sink.write_batch(batch(1, 2, 3))  # written into a staged file
    await sink.write_batch(batch(4))  # buffered only
    assert staged(tmp_path, 2).exists()
    await sink.rollback_epoch(2)
    assert not staged(tmp_path, 2).exists()
    assert list((tmp_path / STAGING).iterdir()) == []
    metadata = await epoch_of(sink, 3, 9)
    assert metadata["rows"] == 1  # nothing of the rolled-back epoch leaked into the next
    await sink.commit_epoch(3)
    assert visible(tmp_path) == [9]


async def test_rollback_of_a_pre_committed_epoch_deletes_its_record(tmp_path: Path) -> None:
    sink = await opened(tmp_path)
    await epoch_of(sink, 2, 1)
    await sink.rollback_epoch(2)
    assert not staged(tmp_path, 2).exists()
    await sink.commit_epoch(2)  # nothing left to publish
    assert visible(tmp_path) == []


async def test_recover_commits_the_pending_epochs(tmp_path: Path) -> None:
    sink = await opened(tmp_path)
    first = await epoch_of(sink, 1, 1, 2)
    second = await epoch_of(sink, 2, 3)
    await sink.close()  # a crash after both checkpoints were durable, before any commit
    assert visible(tmp_path) == []
    restarted = ParquetFileSink(tmp_path, SCHEMA)
    await restarted.open()
    await restarted.recover([PendingCommit(1, first), PendingCommit(2, second)])
    assert visible(tmp_path) == [1, 2, 3]
    assert (manifest(tmp_path)["committed_epoch"], manifest(tmp_path)["rows"]) == (2, 3)
    assert list((tmp_path / STAGING).iterdir()) == []


async def test_recover_deletes_every_staged_or_pre_committed_epoch_not_pending(
    tmp_path: Path,
) -> None:
    sink = await opened(tmp_path, row_group_rows=1)
    durable = await epoch_of(sink, 1, 1)
    await epoch_of(sink, 2, 2)  # pre-committed, but its checkpoint never became durable
    await sink.begin_epoch(3)
    await sink.write_batch(batch(3))  # staged only
    await sink.close()
    assert staged(tmp_path, 2).exists()
    assert staged(tmp_path, 3).exists()
    restarted = ParquetFileSink(tmp_path, SCHEMA)
    await restarted.open()
    await restarted.recover([PendingCommit(1, durable)])
    assert visible(tmp_path) == [1]
    assert list((tmp_path / STAGING).iterdir()) == []
    assert manifest(tmp_path)["committed_epoch"] == 1
    # The upstream replays epochs 2 and 3: they are written again, once.
    assert (await epoch_of(restarted, 4, 2, 3))["rows"] == 2
    await restarted.commit_epoch(4)
    assert visible(tmp_path) == [1, 2, 3]


async def test_recover_records_an_epoch_renamed_but_not_in_the_manifest(tmp_path: Path) -> None:
    sink = await opened(tmp_path)
    first = await epoch_of(sink, 3, 1)
    await sink.commit_epoch(3)
    second = await epoch_of(sink, 4, 2, 3)
    # A crash between the rename of epoch 4 and its manifest write:
    os.rename(staged(tmp_path, 4), tmp_path / epoch_dir_name(4))
    assert manifest(tmp_path)["committed_epoch"] == 3
    await sink.close()  # a crash drops the directory lock with the process
    restarted = ParquetFileSink(tmp_path, SCHEMA)
    await restarted.open()
    # Its state record may still be durable (deleted only after the commit), or not.
    await restarted.recover([PendingCommit(3, first), PendingCommit(4, second)])
    assert restarted.committed_epoch() == 4
    assert (manifest(tmp_path)["rows"], manifest(tmp_path)["files"]) == (3, 2)
    assert visible(tmp_path) == [1, 2, 3]
    await restarted.close()
    again = ParquetFileSink(tmp_path, SCHEMA)
    await again.recover([])
    assert manifest(tmp_path)["rows"] == 3
    assert visible(tmp_path) == [1, 2, 3]


async def test_recover_skips_pending_epochs_already_committed(tmp_path: Path) -> None:
    # A crash after the manifest write, before the state record's delete was durable.
    sink = await opened(tmp_path)
    metadata = await epoch_of(sink, 8, 1, 2)
    await sink.commit_epoch(8)
    await sink.close()
    restarted = ParquetFileSink(tmp_path, SCHEMA)
    await restarted.open()
    await restarted.recover([PendingCommit(8, metadata)])
    assert visible(tmp_path) == [1, 2]
    assert manifest(tmp_path)["rows"] == 2


async def test_recover_of_a_pending_empty_epoch_is_a_no_op(tmp_path: Path) -> None:
    sink = await opened(tmp_path)
    metadata = await epoch_of(sink, 2)
    assert metadata == {"epoch": 2, "files": [], "rows": 0}
    restarted = ParquetFileSink(tmp_path, SCHEMA)
    await restarted.recover([PendingCommit(2, metadata)])
    assert not (tmp_path / MANIFEST).exists()
    assert committed_dirs(tmp_path) == []


async def test_recover_refuses_a_pending_epoch_neither_staged_nor_committed(
    tmp_path: Path,
) -> None:
    sink = await opened(tmp_path)
    await epoch_of(sink, 4, 1)
    await sink.commit_epoch(4)
    lost = await epoch_of(sink, 5, 2)
    await epoch_of(sink, 6, 3)  # not durable: would be deleted by a successful recovery
    await sink.close()
    for path in sorted(staged(tmp_path, 5).iterdir()):
        path.unlink()
    staged(tmp_path, 5).rmdir()
    before = manifest(tmp_path)
    restarted = ParquetFileSink(tmp_path, SCHEMA)
    with pytest.raises(SinkRecoveryError) as info:
        await restarted.recover([PendingCommit(5, lost)])
    assert "epoch 5" in info.value.reason
    assert info.value.sink == str(tmp_path)
    assert (staged(tmp_path, 6) / "part-00000.parquet").exists()  # nothing was deleted
    assert (staged(tmp_path, 6) / PRECOMMITTED).exists()
    assert manifest(tmp_path) == before
    assert visible(tmp_path) == [1]


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
    await epoch_of(sink, 1, 1)
    await sink.close()
    (tmp_path / MANIFEST).write_text(content, encoding="utf-8")
    restarted = ParquetFileSink(tmp_path, SCHEMA)
    with pytest.raises(SinkRecoveryError) as info:
        await restarted.recover([])
    assert info.value.sink == str(tmp_path)
    assert staged(tmp_path, 1).exists()  # nothing was deleted
    with pytest.raises(SinkRecoveryError):
        await restarted.commit_epoch(1)
    assert staged(tmp_path, 1).exists()


async def test_rows_per_file_rolls_files(tmp_path: Path) -> None:
    sink = await opened(tmp_path, rows_per_file=4, row_group_rows=3)
    await sink.begin_epoch(1)
    for start in range(0, 10, 2):
        await sink.write_batch(batch(start, start + 1))
    metadata = dict(await sink.pre_commit(1))
    assert metadata["files"] == [f"part-{i:05d}.parquet" for i in range(3)]
    assert metadata["rows"] == 10
    counts = [pq.read_metadata(staged(tmp_path, 1) / n).num_rows for n in metadata["files"]]
    assert counts == [4, 4, 2]
    await sink.commit_epoch(1)
    assert visible(tmp_path) == list(range(10))
    assert manifest(tmp_path)["files"] == 3


async def test_empty_epochs_write_nothing(tmp_path: Path) -> None:
    sink = await opened(tmp_path)
    await sink.begin_epoch(1)
    await sink.write_batch(batch())  # zero rows
    await sink.flush()
    assert await sink.pre_commit(1) == {"epoch": 1, "files": [], "rows": 0}
    assert not staged(tmp_path, 1).exists()
    await sink.commit_epoch(1)
    assert not (tmp_path / epoch_dir_name(1)).exists()
    assert not (tmp_path / MANIFEST).exists()
    await epoch_of(sink, 2, 5)
    await sink.commit_epoch(2)
    await epoch_of(sink, 3)
    await sink.commit_epoch(3)
    assert not (tmp_path / epoch_dir_name(3)).exists()
    assert manifest(tmp_path)["committed_epoch"] == 2  # the last epoch that wrote rows
    assert visible(tmp_path) == [5]


async def test_hive_partitioning_yields_an_epoch_column(tmp_path: Path) -> None:
    sink = await opened(tmp_path)
    await epoch_of(sink, 12, 1, 2)
    await sink.commit_epoch(12)
    await epoch_of(sink, 30, 3)
    await sink.commit_epoch(30)
    table = ds.dataset(tmp_path, format="parquet", partitioning="hive").to_table()
    rows = sorted(zip(table["id"].to_pylist(), table["epoch"].to_pylist(), strict=True))
    assert rows == [(1, 12), (2, 12), (3, 30)]
    assert table["name"].to_pylist().count("n1") == 1
    # A real epoch (wall-clock milliseconds << 16) overflows the int32 that "hive" infers,
    # which then falls back to a string column; naming the type keeps it an integer.
    real_epoch = 1_800_000_000_000 << 16
    await epoch_of(sink, real_epoch, 4)
    await sink.commit_epoch(real_epoch)
    hive_int64 = ds.partitioning(pa.schema([("epoch", pa.int64())]), flavor="hive")
    table = ds.dataset(tmp_path, format="parquet", partitioning=hive_int64).to_table()
    rows = sorted(zip(table["id"].to_pylist(), table["epoch"].to_pylist(), strict=True))
    assert rows == [(1, 12), (2, 12), (3, 30), (4, real_epoch)]


async def test_a_coordinated_writer_stages_apart_and_leaves_commit_to_its_coordinator(
    tmp_path: Path,
) -> None:
    sink = ParquetFileSink(tmp_path, SCHEMA, writer="3")
    assert sink.writer == "3"
    await sink.open()
    await sink.recover([])
    metadata = await epoch_of(sink, 2, 1, 2)
    # Its pre-commit returns its manifest, as JSON, for the coordinator.
    manifest = Manifest.from_json(metadata)
    assert (manifest.writer, manifest.epoch, manifest.rows) == ("3", 2, 2)
    [staged] = manifest.files
    assert staged.path == f"{STAGING}/{2:020d}/w3/part-00000.parquet"
    assert (staged.rows, staged.size) == (2, (tmp_path / staged.path).stat().st_size)
    await sink.commit_epoch(2)  # the coordinator's job
    await sink.recover([PendingCommit(2, metadata)])
    assert visible(tmp_path) == []
    assert (tmp_path / staged.path).exists()


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"path": ""}, "path"),
        ({"path": 3}, "path"),
        ({"schema": "id int64"}, "schema"),
        ({"rows_per_file": 0}, "rows_per_file"),
        ({"rows_per_file": True}, "rows_per_file"),
        ({"rows_per_file": 1.5}, "rows_per_file"),
        ({"row_group_rows": -1}, "row_group_rows"),
        ({"compression": None}, "compression"),
        ({"use_dictionary": "id"}, "use_dictionary"),
        ({"use_dictionary": ["nope"]}, "use_dictionary"),
        ({"use_dictionary": 3}, "use_dictionary"),
        ({"writer": ""}, "writer"),
        ({"writer": "a/b"}, "writer"),
        ({"writer": 7}, "writer"),
    ],
)
def test_bad_arguments_raise_invalid_argument_error_naming_the_argument(
    tmp_path: Path, kwargs: dict[str, Any], argument: str
) -> None:
    options: dict[str, Any] = {"path": tmp_path, "schema": SCHEMA, **kwargs}
    with pytest.raises(InvalidArgumentError) as info:
        ParquetFileSink(**options)
    assert info.value.argument == argument
    assert str(info.value).startswith(f"{argument}: expected ")


async def test_print_sink_prints_rows_and_is_at_least_once() -> None:
    out = io.StringIO()
    sink = PrintSink(SCHEMA, out=out, max_rows=2, prefix="[dbg] ")
    assert isinstance(sink, SinkConnector)
    assert sink.exactly_once is False
    assert sink.schema == SCHEMA
    await sink.open()
    await sink.recover([PendingCommit(1, {"epoch": 1})])
    await sink.begin_epoch(9)
    await sink.write_batch(batch(1, 2, 3))
    assert out.getvalue().splitlines() == [
        "[dbg] epoch=9 rows=3",
        "[dbg]   id=1 name='n1'",
        "[dbg]   id=2 name='n2'",
        "[dbg]   ... 1 more",
    ]
    assert await sink.pre_commit(9) == {"epoch": 9}
    await sink.commit_epoch(9)
    await sink.begin_epoch(10)
    await sink.write_batch(batch(4))
    await sink.rollback_epoch(10)
    assert out.getvalue().splitlines()[-3:] == [
        "[dbg] epoch=10 rows=1",
        "[dbg]   id=4 name='n4'",
        "[dbg] epoch=10 rolled back (its rows above may be printed again)",
    ]
    await sink.close()
    assert (sink.rows, sink.epochs) == (4, 1)


async def test_print_sink_prints_to_standard_output_by_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sink = PrintSink(SCHEMA, max_rows=0)
    await sink.begin_epoch(1)
    await sink.write_batch(batch(1, 2))
    await sink.flush()
    assert capsys.readouterr().out.splitlines() == ["epoch=1 rows=2", "  ... 2 more"]


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [({"schema": None}, "schema"), ({"max_rows": -1}, "max_rows"), ({"max_rows": 2.0}, "max_rows")],
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
    release = threading.Event()
    real_write = _parquet_files.StagedFiles.write

    def slow_write(files: Any, batches: list[pa.RecordBatch]) -> None:
        release.wait(10)
        real_write(files, batches)

    monkeypatch.setattr(_parquet_files.StagedFiles, "write", slow_write)
    await sink.begin_epoch(1)
    await sink.write_batch(batch(1))
    with anyio.move_on_after(0.05) as stuck:
        await sink.flush()  # abandoned: the thread goes on
    assert stuck.cancelled_caught
    await sink.write_batch(batch(2))
    with anyio.move_on_after(0.05) as waiting:
        await sink.flush()  # cancelled while the stuck flush still holds the sink
    assert waiting.cancelled_caught
    await sink.write_batch(batch(3))
    release.set()
    assert (await sink.pre_commit(1))["rows"] == 3
    await sink.commit_epoch(1)
    assert visible(tmp_path) == [1, 2, 3]
