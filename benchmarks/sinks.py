"""Sink benchmarks: rows/s through the exactly-once Parquet path vs pyarrow writing directly.

Candidate: one runtime (SQLite state) with a push source → sink writer → sink task →
:class:`~barrierflow.connectors.ParquetStagingWriter`, committed by the coordinator of a
one-writer :class:`~barrierflow.connectors.ParquetTable`; per repetition ``n`` chunks of 4,096
rows are pushed, then one checkpoint, timed until the sink has committed it: files closed and
fsynced (staged), the manifest pending in the meta store, checkpoint durable, epoch renamed
into the table and the manifest written.
Everything a user pays to get the rows exactly once is timed; starting the runtime is not.

Baseline: ``pyarrow.parquet.ParquetWriter`` writing the same ``n`` batches into one file, then
closing it (no fsync, no commit). Same process, same data, alternated repetitions.
Goal: ratio >= 0.8.

``coordinator_delta_rows_per_s`` — candidate: one runtime, a push source sending 4,096-row
chunks (3 columns) round robin (an append-only table needs no key) to 4 coordinated writers
declared by ``add_sink(..., parallelism=4)`` into a :class:`~barrierflow.connectors.DeltaLakeTable`:
Parquet files staged per writer, one Delta commit per checkpoint (the files' add actions, the
app transaction, the positions). A checkpoint every 64 chunks (256 K rows), timed until the
last epoch is committed. Baseline: ``deltalake.write_deltalake(path, table, mode="append")`` of
the same 64 batches per epoch, alone, into another table (on a worker thread, as the
committer's calls run). Goal: ratio >= 0.7.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread
import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from barrierflow.actors import add_sink
from barrierflow.actors.sinks.table import CommitTimings
from barrierflow.channels import Chunk
from barrierflow.connectors import DeltaLakeTable, ParquetTable
from barrierflow.runtime import Runtime, RuntimeConfig
from benchmarks.harness import (
    Comparison,
    Settings,
    compare,
    make_record,
    median,
    paired_ratio,
    sampled,
)

__all__ = ["BENCHMARKS"]

ROWS = 4096
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("ts", pa.timestamp("us")),
        ("amount", pa.float64()),
        ("category", pa.string()),
    ]
)


def _batches(count: int) -> list[pa.RecordBatch]:
    rng = np.random.default_rng(7)
    categories = np.array([f"cat-{i}" for i in range(32)])
    batches = []
    for i in range(count):
        ids = np.arange(i * ROWS, (i + 1) * ROWS, dtype=np.int64)
        batches.append(
            pa.record_batch(
                [
                    pa.array(ids),
                    pa.array(1_700_000_000_000_000 + ids * 1000, pa.timestamp("us")),
                    pa.array(rng.random(ROWS) * 100),
                    pa.array(categories[rng.integers(0, 32, ROWS)]),
                ],
                schema=SCHEMA,
            )
        )
    return batches


class _Dirs:
    """A fresh directory per baseline repetition; the previous one is removed first."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.count = 0

    def next(self) -> str:
        self.count += 1
        path = os.path.join(self.root, f"run-{self.count}")
        previous = os.path.join(self.root, f"run-{self.count - 1}")
        shutil.rmtree(previous, ignore_errors=True)
        os.makedirs(path)
        return path


class _SinkPipeline:
    """One runtime for every repetition: push source → sink writer → Parquet table."""

    def __init__(self, root: str) -> None:
        self.table = os.path.join(root, "table")
        self.runtime = Runtime(RuntimeConfig(state_path=os.path.join(root, "state.db")))
        self.runtime.add_source("src")
        self.sink = add_sink(self.runtime, "sink", ParquetTable(self.table, SCHEMA), input="src")

    async def write(self, chunks: list[Chunk], n: int) -> None:
        """Push ``n`` chunks, checkpoint, and wait until the sink committed them."""
        rt = self.runtime
        for i in range(n):
            await rt.push("src", chunks[i % len(chunks)])
        durable = await rt.checkpoint()
        await self.sink.coordinator.wait_committed(durable)


def _baseline(dirs: _Dirs, batches: list[pa.RecordBatch]) -> Callable[[int], Any]:
    async def run(n: int) -> None:
        path = dirs.next()
        with pq.ParquetWriter(os.path.join(path, "part.parquet"), SCHEMA) as writer:
            for i in range(n):
                writer.write_batch(batches[i % len(batches)])
        await anyio.lowlevel.checkpoint()

    return run


async def _check_every_row_committed(pipeline: _SinkPipeline, chunks: list[Chunk]) -> None:
    await pipeline.write(chunks, 10)
    rows = ds.dataset(pipeline.table).count_rows()
    if rows != 10 * ROWS:
        raise AssertionError(f"the sink committed {rows} rows, expected {10 * ROWS}")


def sink_parquet_rows_per_s(settings: Settings) -> dict[str, Any]:
    batches = _batches(16)
    chunks = [Chunk(b) for b in batches]
    with tempfile.TemporaryDirectory() as tmp:
        pipeline = _SinkPipeline(os.path.join(tmp, "ours"))
        theirs_dirs = _Dirs(os.path.join(tmp, "pq"))
        os.makedirs(theirs_dirs.root)

        async def candidate(n: int) -> None:
            await pipeline.write(chunks, n)

        async def main() -> Comparison:
            async with pipeline.runtime:
                await _check_every_row_committed(pipeline, chunks)
                return await compare(
                    candidate,
                    _baseline(theirs_dirs, batches),
                    budget=settings.budget,
                    reps=settings.reps,
                    start_n=32,
                    min_calibration_time=0.1,
                )

        result: Comparison = anyio.run(main, backend="asyncio")
    ours = result.rate("candidate", ROWS)
    theirs = result.rate("baseline", ROWS)
    return make_record(
        "sink_parquet_rows_per_s",
        median(ours),
        "rows/s",
        median(theirs),
        ">= 0.8",
        details={
            "backend": "asyncio",
            "rows_per_chunk": ROWS,
            "columns": len(SCHEMA),
            "chunks_per_run": result.n,
            **sampled(ours, theirs),
            "candidate": "push source -> sink writer -> sink task -> ParquetStagingWriter (its "
            "defaults: 128K-row row groups, dictionary on string columns) -> coordinator of a "
            "one-writer ParquetTable; one checkpoint per run, timed until the sink committed "
            "it (staging fsync, pending record, durable checkpoint, rename, manifest)",
            "baseline_impl": "pyarrow.parquet.ParquetWriter (pyarrow defaults) write_batch per "
            "batch, close; no fsync, no commit",
        },
    )


DELTA_WRITERS = 4
DELTA_CHUNKS_PER_EPOCH = 64
DELTA_SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("amount", pa.float64()),
        pa.field("category", pa.string()),
    ]
)


def _delta_batches(batches: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
    return [
        pa.record_batch([b["id"], b["amount"], b["category"]], schema=DELTA_SCHEMA) for b in batches
    ]


class _DeltaPipeline:
    """One runtime for every repetition: push source → ``writers`` coordinated writers
    (round robin) → Delta table."""

    def __init__(self, root: str, writers: int) -> None:
        self.sink = DeltaLakeTable(os.path.join(root, "delta"), DELTA_SCHEMA, app_id="bench")
        self.runtime = Runtime(
            RuntimeConfig(state_path=os.path.join(root, "state.db"), barrier_interval=3600.0)
        )
        self.runtime.add_source("src")
        # Round robin: an append-only table needs no key, so rows are not hashed to writers.
        declared = add_sink(self.runtime, "delta", self.sink, input="src", parallelism=writers)
        self.coordinator = declared.coordinator

    async def epochs(self, chunks: list[Chunk], n: int) -> None:
        """``n`` epochs of rows, each closed by a checkpoint; returns once the last is
        committed (commits overlap the next epoch's rows, as in a live stream)."""
        rt = self.runtime
        durable = 0
        for _ in range(n):
            for i in range(DELTA_CHUNKS_PER_EPOCH):
                await rt.push("src", chunks[i % len(chunks)])
            durable = await rt.checkpoint()
        await self.coordinator.wait_committed(durable)


def _compare_delta(
    settings: Settings, root: str, writers: int, reps: int
) -> tuple[Comparison, _DeltaPipeline, int]:
    """Time ``writers`` coordinated writers into a Delta table against ``write_deltalake``
    of the same batches per epoch; the comparison, the pipeline and the baseline's rows."""
    from deltalake import DeltaTable, write_deltalake

    batches = _delta_batches(_batches(16))
    chunks = [Chunk(b) for b in batches]
    epoch_table = pa.Table.from_batches(
        [batches[i % len(batches)] for i in range(DELTA_CHUNKS_PER_EPOCH)]
    )
    pipeline = _DeltaPipeline(os.path.join(root, f"ours-{writers}"), writers)
    alone = os.path.join(root, f"alone-{writers}")

    async def candidate(n: int) -> None:
        await pipeline.epochs(chunks, n)

    async def baseline(n: int) -> None:
        for _ in range(n):
            await anyio.to_thread.run_sync(
                lambda: write_deltalake(alone, epoch_table, mode="append")
            )

    async def main() -> Comparison:
        async with pipeline.runtime:
            await pipeline.epochs(chunks, 1)
            rows = pipeline.sink.table().count()
            if rows != DELTA_CHUNKS_PER_EPOCH * ROWS:
                raise AssertionError(
                    f"the Delta sink committed {rows} rows, expected "
                    f"{DELTA_CHUNKS_PER_EPOCH * ROWS}"
                )
            return await compare(
                candidate,
                baseline,
                budget=settings.budget * 2,
                reps=reps,
                start_n=4,  # commits overlap the next epochs' rows only across epochs
                min_calibration_time=0.2,
            )

    result: Comparison = anyio.run(main, backend="asyncio")
    return result, pipeline, DeltaTable(alone).count()


def coordinator_delta_rows_per_s(settings: Settings) -> dict[str, Any]:
    rows_per_epoch = DELTA_CHUNKS_PER_EPOCH * ROWS
    reps = 5 if settings.quick else 9
    with tempfile.TemporaryDirectory() as tmp:
        result, pipeline, theirs_rows = _compare_delta(settings, tmp, DELTA_WRITERS, reps)
        ours_rows = pipeline.sink.table().count()
        # The same with one writer: the sink path alone.
        single, _, _ = _compare_delta(settings, tmp, 1, 3 if settings.quick else 5)
    ours = result.rate("candidate", rows_per_epoch)
    theirs = result.rate("baseline", rows_per_epoch)
    one = single.rate("candidate", rows_per_epoch)
    one_theirs = single.rate("baseline", rows_per_epoch)
    committer = pipeline.coordinator.committer
    timed = isinstance(committer, CommitTimings)
    latencies = [s * 1e3 for s in committer.commit_seconds] if timed else []
    return make_record(
        "coordinator_delta_rows_per_s",
        median(ours),
        "rows/s",
        median(theirs),
        ">= 0.7",
        details={
            "backend": "asyncio",
            "writers": DELTA_WRITERS,
            "rows_per_epoch": rows_per_epoch,
            "epochs_per_run": result.n,
            **sampled(ours, theirs),
            "delta_commit_ms_first": round(latencies[0], 2) if latencies else None,
            "delta_commit_ms_last": round(latencies[-1], 2) if latencies else None,
            "epochs_committed": len(latencies),
            "rows_in_tables": [ours_rows, theirs_rows],
            "one_writer": {
                "value": round(median(one)),
                "baseline": round(median(one_theirs)),
                "ratio": round(median(one) / median(one_theirs), 6),
                "paired_ratio": paired_ratio(one, one_theirs),
            },
            "candidate": f"push source -> {DELTA_WRITERS} coordinated writers (add_sink "
            "parallelism, round robin; Parquet staged per writer, 32K-row row "
            "groups) -> coordinator: one Delta commit per checkpoint (add actions + app "
            "transaction + positions); one_writer: the same with parallelism=1",
            "baseline_impl": "deltalake.write_deltalake(path, table, mode='append') of the "
            "same batches per epoch, alone, on a worker thread",
        },
    )


#: Every benchmark of this module, by name, in run order.
BENCHMARKS: dict[str, Callable[[Settings], dict[str, Any]]] = {
    "sink_parquet_rows_per_s": sink_parquet_rows_per_s,
    "coordinator_delta_rows_per_s": coordinator_delta_rows_per_s,
}
