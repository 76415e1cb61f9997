"""The Parquet sink under real SIGKILLs: a child process runs a runtime writing numbered rows
through a sink writer into a ParquetTable (one writer and its coordinator) and kills itself at
an exact point of one epoch's life; a fresh runtime on the same state store and table
directory then recovers and resumes.

The table must hold every row of every durable checkpoint exactly once and nothing else; what
is durable is read from the SQLite state store, not guessed from timing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest
from _timeouts import scaled

from barrierflow.actors import add_sink
from barrierflow.actors.sinks.coordinator.meta_store import SinkState, SinkStateRecord, SinkStates
from barrierflow.channels import Chunk
from barrierflow.connectors import ParquetTable
from barrierflow.connectors._staging import MANIFEST, PRECOMMITTED, STAGING, epoch_dir_name
from barrierflow.runtime import Runtime, RuntimeConfig, StateStore

SCHEMA = pa.schema([("id", pa.int64())])
ROOT = Path(__file__).resolve().parents[1]
BATCHES = 4  # batches the child pushes, one checkpoint after each
ROWS = 100  # rows per batch: ids k * ROWS ... (k + 1) * ROWS - 1 for batch k
KILLED_BATCH = 2  # the child dies in the life of the epoch holding this batch
BARRIER_INTERVAL = 0.05  # periodic checkpoint barriers too (checkpoint_frequency 1)

# The child: the kill point comes from KILL_POINT (stage, commit or record), the epoch from the
# sink epoch whose staged rows include KILL_ID; the StagedFiles and ParquetCommitter methods run
# on a worker thread, and os.kill there kills the whole process at once.
CHILD = """
import os, signal, sys
import anyio, pyarrow as pa
from barrierflow.actors import add_sink
from barrierflow.connectors import ParquetTable, _parquet_files, parquet_committer
from barrierflow.channels import Chunk
from barrierflow.runtime import Runtime, RuntimeConfig

root, backend = sys.argv[1], sys.argv[2]
batches, rows = int(sys.argv[3]), int(sys.argv[4])
POINT, KILL_ID = os.environ["KILL_POINT"], int(os.environ["KILL_ID"])
SCHEMA = pa.schema([("id", pa.int64())])
Files = _parquet_files.StagedFiles
Committer = parquet_committer.ParquetCommitter
real_write, real_stage = Files.write, Files.stage
real_commit, real_record = Committer._commit, Files.record
target = set()
committing = []

def die(epoch):
    print("KILLED", POINT, epoch, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

def write(self, batches):
    if any(KILL_ID in b.column(0).to_pylist() for b in batches):
        target.add(self.epoch)
    real_write(self, batches)

def stage(self, epoch):
    manifest = real_stage(self, epoch)
    if POINT == "stage" and epoch in target:  # staged, its manifest not sent: not durable
        die(epoch)
    return manifest

def commit(self, epoch, metadata):
    staged = metadata["staging_epoch"]
    if POINT == "commit" and staged in target:  # its checkpoint is durable: commit is called
        die(staged)
    committing[:] = [staged]
    real_commit(self, epoch, metadata)

def record(self, manifest, epoch, files, rows, positions=None):
    if POINT == "record" and committing and committing[0] in target:
        die(committing[0])  # renamed into epoch=..., manifest not written
    real_record(self, manifest, epoch, files, rows, positions)

Files.write, Files.stage, Committer._commit, Files.record = write, stage, commit, record

async def main():
    config = RuntimeConfig(state_path=os.path.join(root, "state.db"), barrier_interval=0.05)
    rt = Runtime(config)
    rt.add_source("src")
    table = ParquetTable(os.path.join(root, "table"), SCHEMA, row_group_rows=32, rows_per_file=64)
    sink = add_sink(rt, "sink", table, input="src")
    async with rt:
        for k in range(batches):
            ids = pa.array(range(k * rows, (k + 1) * rows), pa.int64())
            await rt.push("src", Chunk(pa.record_batch([ids], schema=SCHEMA)))
            epoch = await rt.checkpoint()
            print("DURABLE", (k + 1) * rows - 1, epoch, flush=True)
            # The next batch only once this one is committed: the kill point stays exact.
            await sink.coordinator.wait_committed(epoch)
    print("DONE", flush=True)

anyio.run(main, backend=backend)
"""


def ids_of(table: Path) -> list[int]:
    """Every id a reader of the table sees, sorted, duplicates kept."""
    return sorted(ds.dataset(table, SCHEMA, format="parquet").to_table()["id"].to_pylist())


def batch_ids(batches: int) -> list[int]:
    return list(range(batches * ROWS))


def run_child(tmp_path: Path, backend: str, point: str) -> tuple[list[int], int]:
    """Run the child until it kills itself; the ids it reported durable and the killed epoch."""
    env = {**os.environ, "KILL_POINT": point, "KILL_ID": str(KILLED_BATCH * ROWS)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path), backend, str(BATCHES), str(ROWS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )
    try:
        out, err = child.communicate(timeout=scaled(60))
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate(timeout=scaled(30))
        pytest.fail(f"the child never reached its kill point {point!r}")
    assert child.returncode == -signal.SIGKILL, (child.returncode, out[-2000:], err[-2000:])
    lines = [line.split() for line in out.splitlines()]
    durable = [int(line[1]) for line in lines if line[:1] == ["DURABLE"]]
    (killed,) = [int(line[2]) for line in lines if line[:2] == ["KILLED", point]]
    return durable, killed


async def durable_state(path: Path) -> tuple[int, list[SinkStateRecord]]:
    """The store's committed epoch and the sink coordinator's records."""
    async with await StateStore.open(path) as store:
        return store.committed_epoch, await SinkStates(store, "sink").list()


async def restart_and_resume(tmp_path: Path, durable_batches: int) -> tuple[list[int], int]:
    """Recover on the same store and table, check the table holds exactly the durable rows,
    then push the batches that were not durable (as a pushing driver does) and stop."""
    table = tmp_path / "table"
    config = RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=BARRIER_INTERVAL)
    rt = Runtime(config)
    rt.add_source("src")
    sink = add_sink(rt, "sink", ParquetTable(table, SCHEMA, rows_per_file=64), input="src")
    with anyio.fail_after(scaled(30)):
        async with rt:
            restarted_from = rt.committed_epoch
            epoch = await rt.checkpoint()
            await sink.coordinator.wait_committed(epoch)
            recovered = ids_of(table)
            assert list((table / STAGING).iterdir()) == []
            for k in range(durable_batches, BATCHES):
                ids = pa.array(range(k * ROWS, (k + 1) * ROWS), pa.int64())
                await rt.push("src", Chunk(pa.record_batch([ids], schema=SCHEMA)))
                await rt.checkpoint()
    return recovered, restarted_from


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize(
    ("point", "durable_batches"),
    [
        # Killed when the writer staged the epoch (its manifest not sent, the barrier not
        # passed): its checkpoint never becomes durable, so recovery deletes it and the
        # upstream replays.
        ("stage", KILLED_BATCH),
        # Killed after its checkpoint is durable, before the sink's commit: recovery commits it.
        ("commit", KILLED_BATCH + 1),
        # Killed mid-commit, after the rename into epoch=..., before the manifest write:
        # recovery records it, and the replayed commit is a no-op.
        ("record", KILLED_BATCH + 1),
    ],
    ids=["before-durable", "after-durable-before-commit", "mid-commit"],
)
@pytest.mark.subprocess
def test_killed_sink_recovers_every_durable_row_exactly_once(
    tmp_path: Path, backend: str, point: str, durable_batches: int
) -> None:
    table = tmp_path / "table"
    reported, killed = run_child(tmp_path, backend, point)
    # Every checkpoint the child saw return made its batch durable; the killed one's line may
    # or may not have been printed when its commit began (and never is before durability).
    assert [(i + 1) * ROWS - 1 for i in range(len(reported))] == reported
    if point == "stage":
        assert len(reported) == KILLED_BATCH  # blocked in the checkpoint that never came
    else:
        assert len(reported) in (KILLED_BATCH, KILLED_BATCH + 1)

    # The kill happened where it was meant to, and that is what the store holds durable.
    committed_epoch, records = anyio.run(durable_state, tmp_path / "state.db", backend=backend)
    manifest = json.loads((table / MANIFEST).read_text(encoding="utf-8"))
    assert manifest["committed_epoch"] < killed
    staged = table / STAGING / f"{killed:020d}"
    [record] = [r for r in records if r.metadata and r.metadata["staging_epoch"] == killed] or [
        None
    ]
    if point == "stage":
        assert list((staged / "w0").glob("part-*.parquet")) != []  # staged, fsynced
        assert not (staged / PRECOMMITTED).exists()
        assert record is None  # the manifest never reached the coordinator
        assert committed_epoch < killed
        assert ids_of(table) == batch_ids(KILLED_BATCH)
    else:
        assert record is not None
        assert record.state is SinkState.PENDING
        assert record.epoch == killed
        assert record.metadata["rows"] == ROWS
        assert committed_epoch >= record.epoch  # durable: the commit may proceed
        if point == "commit":
            assert list((staged / "w0").glob("part-*.parquet")) != []
            assert ids_of(table) == batch_ids(KILLED_BATCH)  # not committed: invisible
        else:
            assert (table / epoch_dir_name(killed)).is_dir()  # the rename is the commit point
            assert not (table / STAGING / f"{killed:020d}").exists()
            assert ids_of(table) == batch_ids(KILLED_BATCH + 1)

    recovered, restarted_from = anyio.run(
        restart_and_resume, tmp_path, durable_batches, backend=backend
    )
    assert restarted_from == committed_epoch
    # Exactly the rows of the durable checkpoints, once each: a superset of what the child
    # reported durable, nothing of the epoch that was not.
    assert recovered == batch_ids(durable_batches)
    assert set(recovered) >= {i for last in reported for i in range(last + 1)}

    # Resumed: every row pushed by either run, exactly once, every epoch recorded.
    assert ids_of(table) == batch_ids(BATCHES)
    manifest = json.loads((table / MANIFEST).read_text(encoding="utf-8"))
    assert manifest["rows"] == BATCHES * ROWS
    epochs = sorted(int(p.name.removeprefix("epoch=")) for p in table.glob("epoch=*"))
    assert len(epochs) == BATCHES  # one non-empty epoch per batch
    assert manifest["committed_epoch"] == epochs[-1]
    assert list((table / STAGING).iterdir()) == []
    # Real epochs overflow int32, where "hive" would infer a string column: name its type.
    hive_int64 = ds.partitioning(pa.schema([("epoch", pa.int64())]), flavor="hive")
    hive = ds.dataset(table, format="parquet", partitioning=hive_int64).to_table()
    per_epoch = [sorted(hive.filter(pc.field("epoch") == e)["id"].to_pylist()) for e in epochs]
    assert sorted(per_epoch) == [list(range(k * ROWS, (k + 1) * ROWS)) for k in range(BATCHES)]
