"""Sink benchmarks: rows/s through the exactly-once Parquet path vs pyarrow writing directly.

Candidate: one runtime (SQLite state) with a push source → sink writer → sink task →
:class:`~barrierflow.actors.ParquetFileSink`; per repetition ``n`` chunks of 4,096 rows are
pushed, then one checkpoint, timed until the sink has committed it: files closed and fsynced
(pre-commit), checkpoint durable, epoch renamed into the table and the manifest written.
Everything a user pays to get the rows exactly once is timed; starting the runtime is not.

Baseline: ``pyarrow.parquet.ParquetWriter`` writing the same ``n`` batches into one file, then
closing it (no fsync, no commit). Same process, same data, alternated repetitions.
Goal: ratio >= 0.8.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from barrierflow.actors import SinkWriter
from barrierflow.channels import Chunk
from barrierflow.connectors import ParquetFileSink
from barrierflow.runtime import Runtime, RuntimeConfig
from benchmarks.harness import (
    Comparison,
    Settings,
    compare,
    make_record,
    median,
    paired_ratio,
    samples,
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
    """One runtime for every repetition: push source → sink writer → Parquet sink."""

    def __init__(self, root: str) -> None:
        self.table = os.path.join(root, "table")
        self.runtime = Runtime(RuntimeConfig(state_path=os.path.join(root, "state.db")))
        self.runtime.add_source("src")
        self.writers: list[SinkWriter] = []
        self.runtime.add_actor("sink", self._writer, inputs=["src"])

    def _writer(self) -> SinkWriter:
        writer = SinkWriter(ParquetFileSink(self.table, SCHEMA))
        self.writers.append(writer)
        return writer

    async def write(self, chunks: list[Chunk], n: int) -> None:
        """Push ``n`` chunks, checkpoint, and wait until the sink committed them."""
        rt = self.runtime
        for i in range(n):
            await rt.push("src", chunks[i % len(chunks)])
        durable = await rt.checkpoint()
        await self.writers[-1].wait_committed(durable)


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
            "runs": len(ours),
            "samples": samples(ours),
            "baseline_samples": samples(theirs),
            "paired_ratio": paired_ratio(ours, theirs),
            "candidate": "push source -> sink writer -> sink task -> ParquetFileSink (its "
            "defaults: 128K-row row groups, dictionary on string columns); one checkpoint per "
            "run, timed until the sink committed it (pre-commit fsync, durable checkpoint, "
            "rename, manifest)",
            "baseline_impl": "pyarrow.parquet.ParquetWriter (pyarrow defaults) write_batch per "
            "batch, close; no fsync, no commit",
        },
    )


#: Every benchmark of this module, by name, in run order.
BENCHMARKS: dict[str, Callable[[Settings], dict[str, Any]]] = {
    "sink_parquet_rows_per_s": sink_parquet_rows_per_s,
}
