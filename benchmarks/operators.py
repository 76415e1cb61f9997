"""Operator benchmarks: the stateless operators' cost over the compute they run.

``map_filter_rows_per_s``: a push source → ``map_batches`` (double a column) → ``filter_rows``
(keep the positive ones, a function returning the mask) → an actor counting visible rows, in a
runtime on asyncio, batches of :data:`BATCH_ROWS` rows; checked: every visible row counted.
Baseline: the same pyarrow compute calls (the map's and the mask's) in a bare loop over the
same batches, with the mask applied as a visibility mask's count (no copy either side). Goal:
ratio >= 0.8. The runtime's share per batch is fixed (a few channel hops and message checks),
so the ratio depends on the batch size: the record gives it at 10,000 (Spark's Arrow batch),
65,536 (the figure) and 262,144 rows.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.channels import Chunk, Message, Op
from barrierflow.operators import filter_rows, map_batches
from barrierflow.runtime import ActorContext, Runtime, RuntimeConfig, StreamActor
from benchmarks.harness import Settings, compare, make_record, median, sampled

__all__ = ["BENCHMARKS", "ChangelogCount"]

#: Rows per batch: Spark's default Arrow batch is 10,000 rows; the record reports both.
BATCH_ROWS = 65_536
SCHEMA = pa.schema([("user", pa.int64()), ("clicks", pa.int64())])


def _double(batch: pa.RecordBatch) -> pa.RecordBatch:
    return pa.record_batch([batch["user"], pc.multiply(batch["clicks"], 2)], schema=SCHEMA)


def _positive(batch: pa.RecordBatch) -> pa.Array:
    return pc.greater(batch["clicks"], 0)


class _Count(StreamActor):
    rows: ClassVar[int] = 0

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk):
            _Count.rows += message.cardinality
        await ctx.emit(message)


class ChangelogCount(StreamActor):
    """Counts a keyed operator's changelog (the keyed benchmarks' sink): its inserts, and the
    signed sum of its column ``s`` (an insert or update's new half adds, the rest subtracts),
    vectorized; reset both before a run."""

    inserts: ClassVar[int] = 0
    total: ClassVar[int] = 0

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk):
            ops = message.ops_numpy()
            s = message.batch.column("s").to_numpy(zero_copy_only=False)
            sign = np.where((ops == Op.INSERT) | (ops == Op.UPDATE_INSERT), 1, -1)
            ChangelogCount.inserts += int((ops == Op.INSERT).sum())
            ChangelogCount.total += int((sign * s).sum())
        await ctx.emit(message)


def _batches(rows: int) -> tuple[list[pa.RecordBatch], int]:
    rng = np.random.default_rng(7)
    batches = [
        pa.record_batch(
            [pa.array(np.arange(rows)), pa.array(rng.integers(-5, 5, rows))], schema=SCHEMA
        )
        for _ in range(16)
    ]
    expected = sum(int(pc.sum(pc.greater(b["clicks"], 0)).as_py()) for b in batches)
    return batches, expected


def map_filter_rows_per_s(settings: Settings) -> dict[str, Any]:
    import anyio

    def run(rows: int) -> tuple[Any, int]:
        batches, visible = _batches(rows)
        chunks = [Chunk(b) for b in batches]

        async def measure() -> Any:
            with tempfile.TemporaryDirectory() as tmp:
                rt = Runtime(
                    RuntimeConfig(state_path=os.path.join(tmp, "s.db"), barrier_interval=3600.0)
                )
                rt.add_source("events")
                rt.add_actor("double", map_batches(_double), inputs=["events"])
                rt.add_actor("positive", filter_rows(_positive), inputs=["double"])
                rt.add_actor("count", _Count, inputs=["positive"])
                async with rt:

                    async def ours(n: int) -> None:
                        before = _Count.rows
                        for i in range(n):
                            await rt.push("events", chunks[i % len(chunks)])
                        await rt.checkpoint()  # every row went through
                        want = (n // len(chunks)) * visible + sum(
                            int(pc.sum(pc.greater(c.batch["clicks"], 0)).as_py())
                            for c in chunks[: n % len(chunks)]
                        )
                        if _Count.rows - before != want:
                            raise AssertionError(f"counted {_Count.rows - before}, want {want}")

                    async def bare(n: int) -> None:
                        seen = 0
                        for i in range(n):
                            batch = _double(batches[i % len(batches)])
                            mask = _positive(batch)
                            seen += len(mask) - mask.false_count
                        if seen < 0:
                            raise AssertionError

                    return await compare(
                        ours,
                        bare,
                        budget=settings.budget,
                        reps=settings.reps,
                        start_n=len(chunks),
                    )

        return anyio.run(measure), rows

    result, rows = run(BATCH_ROWS)
    small, _ = run(10_000)
    large, _ = run(262_144)
    ours, bare = result.rate("candidate", rows), result.rate("baseline", rows)
    details = {
        "batch_rows": rows,
        "graph": "push source -> map_batches -> filter_rows -> count (asyncio)",
        "baseline_impl": "the same pc.multiply + pc.greater calls in a bare loop",
        "ratio_at_10000_rows": round(
            median(small.rate("candidate", 10_000)) / median(small.rate("baseline", 10_000)), 3
        ),
        "ratio_at_262144_rows": round(
            median(large.rate("candidate", 262_144)) / median(large.rate("baseline", 262_144)), 3
        ),
        **sampled(result.candidate, result.baseline),
    }
    return make_record(
        "map_filter_rows_per_s", median(ours), "rows/s", median(bare), ">= 0.8", details=details
    )


BENCHMARKS: dict[str, Callable[[Settings], dict[str, Any]]] = {
    "map_filter_rows_per_s": map_filter_rows_per_s,
}
