"""The exactly-once Parquet file sink and the at-least-once print sink."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from barrierflow import InvalidArgumentError, SinkRecoveryError
from barrierflow.actors import ParquetFileSink, PendingCommit, PrintSink
from barrierflow.actors.parquet_sink import MANIFEST, PRECOMMITTED, STAGING, epoch_dir_name

SCHEMA = pa.schema([("id", pa.int64())])
ROOT = Path(__file__).resolve().parents[1]


def batch(*ids: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array(ids, pa.int64())], schema=SCHEMA)


def visible(path: Path) -> list[int]:
    return sorted(ds.dataset(path, SCHEMA, format="parquet").to_table()["id"].to_pylist())


async def staged_epoch(path: Path, epoch: int, *ids: int, **kwargs: object) -> ParquetFileSink:
    sink = ParquetFileSink(path, SCHEMA, **kwargs)  # type: ignore[arg-type]
    await sink.open()
    await sink.recover([])
    await sink.begin_epoch(epoch)
    await sink.write_batch(batch(*ids))
    return sink


@pytest.mark.anyio
async def test_staged_and_pre_committed_rows_are_invisible_to_readers(tmp_path: Path) -> None:
    sink = await staged_epoch(tmp_path, 1, 1, 2, 3)
    await sink.flush()
    assert visible(tmp_path) == []
    await sink.pre_commit(1)
    assert visible(tmp_path) == []
    await sink.close()


@pytest.mark.anyio
async def test_pre_commit_fsyncs_and_names_the_staged_files(tmp_path: Path) -> None:
    sink = await staged_epoch(tmp_path, 1, 1, 2, 3)
    metadata = await sink.pre_commit(1)
    assert metadata == {"epoch": 1, "files": ["part-00000.parquet"], "rows": 3}
    staged = tmp_path / STAGING / f"{1:020d}"
    assert (staged / "part-00000.parquet").exists()
    assert json.loads((staged / PRECOMMITTED).read_text())["files"] == metadata["files"]


@pytest.mark.anyio
async def test_commit_publishes_the_whole_epoch_and_records_it(tmp_path: Path) -> None:
    sink = await staged_epoch(tmp_path, 7, 1, 2)
    await sink.write_batch(batch(3))
    await sink.pre_commit(7)
    await sink.commit_epoch(7)
    assert visible(tmp_path) == [1, 2, 3]
    assert (tmp_path / epoch_dir_name(7)).is_dir()
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    assert (manifest["committed_epoch"], manifest["rows"]) == (7, 3)
    assert sink.committed_epoch() == 7


@pytest.mark.anyio
async def test_a_replayed_commit_is_a_no_op(tmp_path: Path) -> None:
    sink = await staged_epoch(tmp_path, 3, 1, 2)
    await sink.pre_commit(3)
    await sink.commit_epoch(3)
    await sink.commit_epoch(3)
    again = ParquetFileSink(tmp_path, SCHEMA)
    await again.open()
    await again.commit_epoch(3)  # after a "restart"
    assert visible(tmp_path) == [1, 2]
    assert json.loads((tmp_path / MANIFEST).read_text())["rows"] == 2


@pytest.mark.anyio
async def test_rollback_deletes_the_staged_files(tmp_path: Path) -> None:
    sink = await staged_epoch(tmp_path, 2, 1)
    await sink.flush()
    await sink.rollback_epoch(2)
    assert not (tmp_path / STAGING / f"{2:020d}").exists()
    await sink.begin_epoch(3)
    await sink.write_batch(batch(9))
    await sink.pre_commit(3)
    await sink.commit_epoch(3)
    assert visible(tmp_path) == [9]


@pytest.mark.anyio
async def test_recover_commits_durable_epochs_and_deletes_the_rest(tmp_path: Path) -> None:
    sink = await staged_epoch(tmp_path, 1, 1)
    durable = await sink.pre_commit(1)
    await sink.begin_epoch(2)
    await sink.write_batch(batch(2))
    await sink.pre_commit(2)  # pre-committed, but its checkpoint never became durable
    await sink.begin_epoch(3)
    await sink.write_batch(batch(3))
    await sink.flush()  # staged only
    await sink.close()
    restarted = ParquetFileSink(tmp_path, SCHEMA)
    await restarted.open()
    await restarted.recover([PendingCommit(1, durable)])
    assert visible(tmp_path) == [1]
    assert list((tmp_path / STAGING).iterdir()) == []


@pytest.mark.anyio
async def test_recover_records_an_epoch_renamed_before_the_manifest(tmp_path: Path) -> None:
    sink = await staged_epoch(tmp_path, 4, 1, 2)
    metadata = await sink.pre_commit(4)
    # A crash between the rename and the manifest write:
    os.rename(tmp_path / STAGING / f"{4:020d}", tmp_path / epoch_dir_name(4))
    restarted = ParquetFileSink(tmp_path, SCHEMA)
    await restarted.open()
    await restarted.recover([PendingCommit(4, metadata)])
    assert restarted.committed_epoch() == 4
    assert visible(tmp_path) == [1, 2]


@pytest.mark.anyio
async def test_recover_refuses_a_durable_epoch_whose_files_are_gone(tmp_path: Path) -> None:
    sink = await staged_epoch(tmp_path, 5, 1)
    metadata = await sink.pre_commit(5)
    await sink.begin_epoch(6)
    await sink.write_batch(batch(2))
    await sink.flush()
    (tmp_path / STAGING / f"{5:020d}" / "part-00000.parquet").unlink()
    (tmp_path / STAGING / f"{5:020d}" / PRECOMMITTED).unlink()
    (tmp_path / STAGING / f"{5:020d}").rmdir()
    with pytest.raises(SinkRecoveryError) as info:
        await ParquetFileSink(tmp_path, SCHEMA).recover([PendingCommit(5, metadata)])
    assert "epoch 5" in info.value.reason
    assert (tmp_path / STAGING / f"{6:020d}").exists()  # nothing was deleted


@pytest.mark.anyio
async def test_a_corrupt_manifest_is_refused(tmp_path: Path) -> None:
    (tmp_path / MANIFEST).write_text("{not json")
    with pytest.raises(SinkRecoveryError):
        await ParquetFileSink(tmp_path, SCHEMA).recover([])
    (tmp_path / MANIFEST).write_text(json.dumps({"format": "someone-else"}))
    with pytest.raises(SinkRecoveryError):
        await ParquetFileSink(tmp_path, SCHEMA).recover([])


@pytest.mark.anyio
async def test_files_roll_over_and_empty_epochs_write_nothing(tmp_path: Path) -> None:
    sink = await staged_epoch(tmp_path, 1, *range(10), rows_per_file=4, row_group_rows=3)
    metadata = await sink.pre_commit(1)
    assert len(metadata["files"]) == 3
    await sink.commit_epoch(1)
    await sink.begin_epoch(2)
    assert (await sink.pre_commit(2))["files"] == []
    await sink.commit_epoch(2)
    assert not (tmp_path / epoch_dir_name(2)).exists()
    assert visible(tmp_path) == list(range(10))
    hive = ds.dataset(tmp_path, format="parquet", partitioning="hive").to_table()
    assert set(hive["epoch"].to_pylist()) == {1}


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    cases: list[tuple[dict[str, object], str]] = [
        ({"path": ""}, "path"),
        ({"schema": "id int"}, "schema"),
        ({"rows_per_file": 0}, "rows_per_file"),
        ({"row_group_rows": -1}, "row_group_rows"),
        ({"use_dictionary": ["nope"]}, "use_dictionary"),
        ({"writer": "a/b"}, "writer"),
    ]
    for kwargs, argument in cases:
        options: dict[str, object] = {"path": tmp_path, "schema": SCHEMA, **kwargs}
        with pytest.raises(InvalidArgumentError) as info:
            ParquetFileSink(**options)  # type: ignore[arg-type]
        assert info.value.argument == argument


@pytest.mark.anyio
async def test_print_sink_prints_rows_and_is_at_least_once() -> None:
    out = io.StringIO()
    sink = PrintSink(SCHEMA, out=out, max_rows=2, prefix="[dbg] ")
    assert sink.exactly_once is False
    await sink.begin_epoch(9)
    await sink.write_batch(batch(1, 2, 3))
    await sink.rollback_epoch(9)
    text = out.getvalue()
    assert "[dbg] epoch=9 rows=3" in text
    assert "id=1" in text
    assert "1 more" in text
    assert "may be printed again" in text
    assert sink.rows == 3


# SIGKILL: a real child process killed at three points of the first checkpoint's life.
CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import anyio, pyarrow as pa
    from barrierflow.actors import ParquetFileSink, SinkWriter
    from barrierflow.actors import parquet_sink
    from barrierflow.channels import Chunk
    from barrierflow.runtime import Runtime, RuntimeConfig

    root, backend, point = sys.argv[1], sys.argv[2], sys.argv[3]
    SCHEMA = pa.schema([("id", pa.int64())])

    def die(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    if point == "before_durable":  # during the pre-commit of the first checkpoint
        parquet_sink._Files.pre_commit = die
    elif point == "after_durable":  # the checkpoint is durable, the sink has not committed
        parquet_sink._Files.commit = die
    elif point == "mid_commit":  # renamed into the table, manifest not yet written
        parquet_sink._Files.record = die

    async def main():
        rt = Runtime(RuntimeConfig(state_path=root + "/state.db", barrier_interval=3600.0))
        rt.add_source("src")
        rt.add_actor(
            "sink",
            lambda: SinkWriter(lambda: ParquetFileSink(root + "/table", SCHEMA)),
            inputs=["src"],
        )
        async with rt:
            for k in range(3):
                ids = pa.array(range(k * 10, k * 10 + 10), pa.int64())
                await rt.push("src", Chunk(pa.record_batch([ids], schema=SCHEMA)))
                await rt.checkpoint()
                print("DURABLE", k, flush=True)
            await anyio.sleep_forever()

    anyio.run(main, backend=backend)
    """
)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize(
    ("point", "expected"),
    [
        ("before_durable", []),
        ("after_durable", list(range(10))),
        ("mid_commit", list(range(10))),
    ],
)
def test_killed_process_restarts_with_every_durable_row_once(
    tmp_path: Path, backend: str, point: str, expected: list[int]
) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    child = subprocess.run(
        [sys.executable, str(script), str(tmp_path), backend, point],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    if point != "before_durable":
        # The kill came after the first checkpoint was durable (the commit follows it).
        assert (tmp_path / "state.db").exists()

    async def restart() -> list[int]:
        from barrierflow.actors import SinkWriter
        from barrierflow.runtime import Runtime, RuntimeConfig

        writers: list[SinkWriter] = []

        def make() -> SinkWriter:
            writers.append(SinkWriter(lambda: ParquetFileSink(tmp_path / "table", SCHEMA)))
            return writers[-1]

        rt = Runtime(RuntimeConfig(state_path=str(tmp_path / "state.db"), barrier_interval=3600))
        rt.add_source("src")
        rt.add_actor("sink", make, inputs=["src"])
        async with rt:
            epoch = await rt.checkpoint()
            with anyio.fail_after(10):
                await writers[-1].wait_committed(epoch)
        assert list((tmp_path / "table" / STAGING).iterdir()) == []
        return visible(tmp_path / "table")

    assert anyio.run(restart, backend=backend) == expected
