"""Recovery after the state store is lost: a runtime that adopts the table's positions leaves
the table as a recovery would. A process killed between a commit's file moves and the table's
commit (Iceberg, Delta), its store deleted, then a runtime that adopts the sink's positions:
the moved files of the epoch that never committed are deleted — no barrierflow data file that
no commit references stays in the table's directory — and every row is there exactly once.
Files that only an older version of the table references (rows deleted outside barrierflow)
stay: time travel needs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _timeouts import scaled

from barrierflow.actors import BatchFeed, add_sink
from barrierflow.actors.sinks.add_sink import DeclaredSink
from barrierflow.connectors import IcebergTable, open_local_catalog
from barrierflow.connectors._staging import moved_files
from barrierflow.connectors.delta_table import DeltaLakeTable
from barrierflow.runtime import Runtime, RuntimeConfig

SCHEMA = pa.schema([("id", pa.int64())])
ROWS = 50
COMMITTED = 2  # batches committed before the killed commit (batch COMMITTED)
TABLES = ("iceberg", "delta")

# The child commits COMMITTED batches, then dies in the commit of the next: the table's commit
# call (pyiceberg's transaction commit, delta-rs's write transaction) SIGKILLs the process. It
# is called right after the committer moved the epoch's files out of staging and fsynced them.
# A child the hook never reached exits 3 within a minute instead of waiting for the timeout.
CHILD = """
import os, signal, sys
import anyio
from pathlib import Path
sys.path.insert(0, sys.argv[3])
import test_state_loss_recovery as t

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

async def main(kind, root):
    feed = t.BatchFeed(t.SCHEMA)
    rt, sink = t.runtime(kind, root, feed, adopt=False)
    async with rt:
        epochs = await t.deliver(rt, feed, range(t.COMMITTED))
        await sink.coordinator.wait_committed(epochs[-1])
        if kind == "delta":
            import deltalake
            deltalake.DeltaTable.create_write_transaction = die
        else:
            import pyiceberg.table
            pyiceberg.table.Transaction.commit_transaction = die
        epoch = await feed.deliver(rt, "q", t.COMMITTED, t.rows_of(t.COMMITTED))
        with anyio.move_on_after(60):
            await sink.coordinator.wait_committed(epoch)  # the commit kills the process
        print("the table's commit never reached the patched call", file=sys.stderr)
        os._exit(3)

anyio.run(main, sys.argv[1], Path(sys.argv[2]))
"""


def rows_of(batch_id: int) -> pa.Table:
    start = batch_id * ROWS
    return pa.table({"id": pa.array(range(start, start + ROWS), pa.int64())}, schema=SCHEMA)


def open_sink(kind: str, root: Path) -> Any:
    if kind == "delta":
        return DeltaLakeTable(root / "delta", SCHEMA, app_id="events")
    return IcebergTable(open_local_catalog(root / "iceberg"), "demo.events", SCHEMA)


def data_root(kind: str, root: Path) -> Path:
    sink = open_sink(kind, root)
    return Path(sink.path if kind == "delta" else sink.data_path)


def runtime(kind: str, root: Path, feed: BatchFeed, *, adopt: bool) -> tuple[Runtime, DeclaredSink]:
    rt = Runtime(
        RuntimeConfig(
            state_path=str(root / "state.db"), barrier_interval=3600.0, adopt_sink_positions=adopt
        )
    )
    rt.add_source("src", feed.source)
    sink = add_sink(rt, "events", open_sink(kind, root), input="src", parallelism=2, key=("id",))
    return rt, sink


async def deliver(rt: Runtime, feed: BatchFeed, batch_ids: range) -> list[int | None]:
    return [await feed.deliver(rt, "q", b, rows_of(b)) for b in batch_ids]


def committed_ids(kind: str, root: Path) -> list[int]:
    sink = open_sink(kind, root)
    table = sink.read() if kind == "delta" else sink.table().scan().to_arrow()
    return sorted(table["id"].to_pylist())


def unreferenced(kind: str, root: Path) -> list[Path]:
    """barrierflow's data files in the table's directory that no commit references."""
    sink = open_sink(kind, root)
    if kind == "delta":
        from deltalake import DeltaTable

        named = {Path(uri).resolve() for uri in DeltaTable(str(sink.path)).file_uris()}
    else:
        files = sink.table().inspect.all_files()["file_path"].to_pylist()
        named = {Path(path.removeprefix("file://")).resolve() for path in files}
    return [p for p in moved_files(data_root(kind, root), set()) if p.resolve() not in named]


def forget_state(root: Path) -> None:
    """The state store is lost."""
    for path in root.glob("state.db*"):
        path.unlink()


def kill_between_moves_and_commit(kind: str, root: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, kind, str(root), str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        timeout=scaled(120),
    )
    assert done.returncode == -9, done.stderr[-2000:]


@pytest.mark.subprocess
@pytest.mark.anyio
@pytest.mark.parametrize("kind", TABLES)
async def test_adopting_after_a_kill_between_moves_and_commit_deletes_the_moved_files(
    tmp_path: Path, kind: str
) -> None:
    kill_between_moves_and_commit(kind, tmp_path)
    # The kill landed where it was aimed: the epoch's files moved in, not committed.
    left = unreferenced(kind, tmp_path)
    assert left, "the killed commit moved no file into the table"
    assert committed_ids(kind, tmp_path) == list(range(COMMITTED * ROWS))
    forget_state(tmp_path)
    feed = BatchFeed(SCHEMA)
    rt, sink = runtime(kind, tmp_path, feed, adopt=True)
    async with rt:
        # The upstream starts over (its own checkpoint lost too): what the table holds is
        # skipped, the killed epoch's batch is written again.
        results = await deliver(rt, feed, range(COMMITTED + 2))
        last = results[-1]
        assert last is not None
        with anyio.fail_after(scaled(60)):
            await sink.coordinator.wait_committed(last)
    assert results[:COMMITTED] == [None] * COMMITTED
    assert unreferenced(kind, tmp_path) == []
    assert not any(path.exists() for path in left)
    assert committed_ids(kind, tmp_path) == list(range((COMMITTED + 2) * ROWS))
    # A plain directory reader counts the table's rows, no more.
    rows = sum(pq.read_metadata(p).num_rows for p in moved_files(data_root(kind, tmp_path), set()))
    assert rows == (COMMITTED + 2) * ROWS


def drop_first_batch(kind: str, root: Path) -> None:
    """Delete the first batch's rows outside barrierflow: its files stay, named only by an
    older version of the table (a Delta ``remove``, an older Iceberg snapshot)."""
    sink = open_sink(kind, root)
    if kind == "delta":
        from deltalake import DeltaTable

        DeltaTable(str(sink.path)).delete(f"id < {ROWS}")
    else:
        from pyiceberg.expressions import LessThan

        sink.table().delete(LessThan("id", ROWS))


@pytest.mark.anyio
@pytest.mark.parametrize("kind", TABLES)
async def test_recovery_keeps_files_only_an_older_version_of_the_table_references(
    tmp_path: Path, kind: str
) -> None:
    feed = BatchFeed(SCHEMA)
    rt, _ = runtime(kind, tmp_path, feed, adopt=False)
    async with rt:
        await deliver(rt, feed, range(COMMITTED))
    before = set(moved_files(data_root(kind, tmp_path), set()))
    drop_first_batch(kind, tmp_path)
    assert committed_ids(kind, tmp_path) == list(range(ROWS, COMMITTED * ROWS))
    forget_state(tmp_path)
    rt, _ = runtime(kind, tmp_path, BatchFeed(SCHEMA), adopt=True)
    async with rt:  # the recovery runs at start
        pass
    # Time travel to the older version still needs the first batch's files: none deleted.
    assert before <= set(moved_files(data_root(kind, tmp_path), set()))
