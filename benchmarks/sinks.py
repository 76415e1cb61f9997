"""Sink benchmarks: rows/s through the exactly-once Parquet path vs pyarrow writing directly.

Candidate, per repetition: a fresh runtime (SQLite state) with a push source → sink writer →
sink task → :class:`~barrierflow.actors.ParquetFileSink`; ``n`` chunks of 4,096 rows pushed,
one checkpoint, then a graceful stop — which waits until the sink has pre-committed (files
closed and fsynced), the checkpoint is durable, and the epoch is committed (renamed into the
table, manifest written). Everything a user pays to get the rows exactly once is timed.

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

from barrierflow.actors import ParquetFileSink, SinkWriter
from barrierflow.channels import Chunk
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
    """A fresh directory per repetition, removed after it (outside the timed region is not
    possible with the harness, so removal of the previous run happens before the next)."""

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


def _candidate(dirs: _Dirs, chunks: list[Chunk]) -> Callable[[int], Any]:
    async def run(n: int) -> None:
        path = dirs.next()
        rt = Runtime(RuntimeConfig(state_path=os.path.join(path, "state.db")))
        rt.add_source("src")
        table = os.path.join(path, "table")
        rt.add_actor("sink", lambda: SinkWriter(ParquetFileSink(table, SCHEMA)), inputs=["src"])
        async with rt:
            for i in range(n):
                await rt.push("src", chunks[i % len(chunks)])
            await rt.checkpoint()

    return run


def _baseline(dirs: _Dirs, batches: list[pa.RecordBatch]) -> Callable[[int], Any]:
    async def run(n: int) -> None:
        path = dirs.next()
        with pq.ParquetWriter(os.path.join(path, "part.parquet"), SCHEMA) as writer:
            for i in range(n):
                writer.write_batch(batches[i % len(batches)])
        await anyio.lowlevel.checkpoint()

    return run


def _check_candidate_writes_everything(root: str, chunks: list[Chunk]) -> None:
    dirs = _Dirs(os.path.join(root, "check"))
    os.makedirs(dirs.root)
    anyio.run(_candidate(dirs, chunks), 10)
    rows = ds.dataset(os.path.join(dirs.root, "run-1", "table")).count_rows()
    if rows != 10 * ROWS:
        raise AssertionError(f"the sink committed {rows} rows, expected {10 * ROWS}")


def sink_parquet_rows_per_s(settings: Settings) -> dict[str, Any]:
    batches = _batches(16)
    chunks = [Chunk(b) for b in batches]
    with tempfile.TemporaryDirectory() as tmp:
        _check_candidate_writes_everything(tmp, chunks)
        ours_dirs, theirs_dirs = _Dirs(os.path.join(tmp, "ours")), _Dirs(os.path.join(tmp, "pq"))
        os.makedirs(ours_dirs.root)
        os.makedirs(theirs_dirs.root)

        async def main() -> Comparison:
            return await compare(
                _candidate(ours_dirs, chunks),
                _baseline(theirs_dirs, batches),
                budget=settings.budget * 2,
                reps=settings.reps,
                start_n=64,
                min_calibration_time=0.2,
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
            "candidate": "push source -> sink writer -> sink task -> ParquetFileSink, "
            "one checkpoint + graceful stop (pre-commit fsync, durable checkpoint, commit)",
            "baseline_impl": "pyarrow.parquet.ParquetWriter.write_batch per batch, close",
        },
    )


#: Every benchmark of this module, by name, in run order.
BENCHMARKS: dict[str, Callable[[Settings], dict[str, Any]]] = {
    "sink_parquet_rows_per_s": sink_parquet_rows_per_s,
}
