"""Event-time window benchmark: ``window_aggregate`` over tumbling 1-minute windows, closed by
watermarks from ``with_watermark`` as the rows come.

``window_rows_per_s``: 10M rows (``--quick``: 2M) over 100K keys, int64 keys drawn uniformly,
int64 values, timestamps (ms) increasing with the row's position, 1M rows (``--quick``: 200K) a
minute; a push source → ``with_watermark("ts", delay=0)`` → ``window_aggregate("k",
Tumbling(1 min), on="ts", s=sum, c=count, m=max)`` → an actor counting the changelog, in a
runtime on asyncio, pushed in chunks of :data:`CHUNK_ROWS` rows with a checkpoint every 1M rows
(``--quick``: 200K). Every chunk raises the watermark; a window closes when the rows pass its
end (its rows are folded, emitted and its state deleted then), and the state is written at each
checkpoint. A last row far ahead closes every window. Checked: the windows emitted equal the
distinct (key, minute) pairs, and the sum of ``s`` equals the sum of every value. The sizes are
fixed; the sides alternate (the order flips every repetition), each repetition on a fresh state
store.

Baseline: **Polars** ``group_by_dynamic("ts", every="1m", group_by="k")`` with the same three
aggregations over all the rows at once (already in memory, sorted by time: what Polars does
best), multithreaded, nothing durable, no changelog. Goal: ratio ``>= 0.2``. In ``details``,
for scale: a plain Polars ``group_by`` on the key and ``ts.dt.truncate("1m")`` — the same
windows, about ten times faster than ``group_by_dynamic`` with a ``group_by`` on 100K keys
(``polars_group_by_truncate_rows_per_s``, ``ratio_to_group_by_truncate``).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import anyio
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.channels import Chunk
from barrierflow.operators.watermarks import with_watermark
from barrierflow.operators.window import Tumbling, window_aggregate
from barrierflow.runtime import Runtime, RuntimeConfig
from benchmarks.harness import Settings, make_record, median, rounded, sampled
from benchmarks.operators import ChangelogCount

__all__ = ["BENCHMARKS"]

#: Rows per pushed chunk.
CHUNK_ROWS = 65_536
SCHEMA = pa.schema([("k", pa.int64()), ("ts", pa.timestamp("ms")), ("v", pa.int64())])
#: Full and --quick sizes: (rows, keys, rows a minute, rows per checkpoint).
FULL = (10_000_000, 100_000, 1_000_000, 1_000_000)
QUICK = (2_000_000, 100_000, 200_000, 200_000)
REPS = 3
MINUTE_MS = 60_000


def _data(rows: int, keys: int, per_minute: int) -> pa.RecordBatch:
    rng = np.random.default_rng(13)
    ts = (np.arange(rows, dtype=np.int64) * MINUTE_MS) // per_minute
    return pa.record_batch(
        [
            pa.array(rng.integers(0, keys, rows)),
            pa.array(ts, pa.int64()).cast(pa.timestamp("ms")),
            pa.array(rng.integers(0, 1000, rows)),
        ],
        schema=SCHEMA,
    )


def _closer(batch: pa.RecordBatch) -> pa.RecordBatch:
    """One row far ahead of every other (key -1, value 0): its watermark closes them all."""
    last = pc.max(batch.column("ts").cast(pa.int64())).as_py()
    return pa.record_batch(
        [
            pa.array([-1]),
            pa.array([last + 10 * MINUTE_MS]).cast(pa.timestamp("ms")),
            pa.array([0]),
        ],
        schema=SCHEMA,
    )


async def _ours(batch: pa.RecordBatch, per_checkpoint: int, directory: str) -> float:
    """Seconds to push every row through the windows, a checkpoint every ``per_checkpoint``."""
    ChangelogCount.inserts = ChangelogCount.total = 0
    config = RuntimeConfig(state_path=os.path.join(directory, "state.db"), barrier_interval=3600)
    rt = Runtime(config)
    rt.add_source("events")
    rt.add_actor("wm", with_watermark("ts", delay=0), inputs=["events"])
    operator = window_aggregate(
        "k",
        Tumbling(timedelta(minutes=1)),
        on="ts",
        schema=SCHEMA,
        s=("v", "sum"),
        c=("v", "count"),
        m=("v", "max"),
    )
    rt.add_actor("windows", operator, inputs=["wm"])
    rt.add_actor("changes", ChangelogCount, inputs=["windows"])
    async with rt:
        start = time.perf_counter()
        for first in range(0, batch.num_rows, per_checkpoint):
            epoch = batch.slice(first, per_checkpoint)
            for at in range(0, epoch.num_rows, CHUNK_ROWS):
                await rt.push("events", Chunk(epoch.slice(at, CHUNK_ROWS)))
            await rt.checkpoint()
        await rt.push("events", Chunk(_closer(batch)))
        await rt.checkpoint()
        elapsed = time.perf_counter() - start
    return elapsed


def _polars(batch: pa.RecordBatch) -> tuple[float, Any]:
    import polars as pl

    start = time.perf_counter()
    frame = pl.from_arrow(pa.Table.from_batches([batch]))
    assert isinstance(frame, pl.DataFrame)
    result = (
        frame.set_sorted("ts")
        .group_by_dynamic("ts", every="1m", group_by="k")
        .agg(
            pl.col("v").sum().alias("s"),
            pl.col("v").count().alias("c"),
            pl.col("v").max().alias("m"),
        )
    )
    return time.perf_counter() - start, result


def _polars_truncated(batch: pa.RecordBatch) -> float:
    """Seconds of a plain Polars ``group_by`` on the key and the minute (``dt.truncate``): the
    same windows without ``group_by_dynamic`` (a detail, not the goal's baseline)."""
    import polars as pl

    start = time.perf_counter()
    frame = pl.from_arrow(pa.Table.from_batches([batch]))
    assert isinstance(frame, pl.DataFrame)
    frame.group_by("k", pl.col("ts").dt.truncate("1m").alias("minute")).agg(
        pl.col("v").sum().alias("s"),
        pl.col("v").count().alias("c"),
        pl.col("v").max().alias("m"),
    )
    return time.perf_counter() - start


def window_rows_per_s(settings: Settings) -> dict[str, Any]:
    rows, keys, per_minute, per_checkpoint = QUICK if settings.quick else FULL
    batch = _data(rows, keys, per_minute)
    minutes = pc.divide(batch.column("ts").cast(pa.int64()), MINUTE_MS)
    pairs = pa.table({"k": batch.column("k"), "minute": minutes})
    windows = pairs.group_by(["k", "minute"]).aggregate([]).num_rows
    total = int(pc.sum(batch.column("v")).as_py())
    ours: list[float] = []
    theirs: list[float] = []
    for i in range(REPS):
        with tempfile.TemporaryDirectory(prefix="bf-windows-") as directory:
            if i % 2:
                theirs.append(_polars(batch)[0])
                ours.append(anyio.run(_ours, batch, per_checkpoint, directory, backend="asyncio"))
            else:
                ours.append(anyio.run(_ours, batch, per_checkpoint, directory, backend="asyncio"))
                theirs.append(_polars(batch)[0])
            if (ChangelogCount.inserts, ChangelogCount.total) != (windows, total):
                raise AssertionError(
                    f"windows, sum of s: {(ChangelogCount.inserts, ChangelogCount.total)}, "
                    f"expected {(windows, total)}"
                )
    _, result = _polars(batch)
    if result.height != windows or int(result["s"].sum()) != total:
        raise AssertionError("the Polars baseline lost rows")
    our_rates = [rows / t for t in ours]
    their_rates = [rows / t for t in theirs]
    truncated = median([rows / _polars_truncated(batch) for _ in range(REPS)])
    details: dict[str, Any] = {
        "rows": rows,
        "keys": keys,
        "rows_per_minute": per_minute,
        "rows_per_checkpoint": per_checkpoint,
        "chunk_rows": CHUNK_ROWS,
        "windows": windows,
        "graph": (
            "push source -> with_watermark(delay 0) -> window_aggregate(tumbling 1 min; sum, "
            "count, max) -> count changelog (asyncio)"
        ),
        "baseline_impl": "polars group_by_dynamic(every=1m, group_by=k), all rows at once",
        **sampled(our_rates, their_rates),
        "polars_group_by_truncate_rows_per_s": rounded(truncated),
        "ratio_to_group_by_truncate": rounded(median(our_rates) / truncated),
    }
    return make_record(
        "window_rows_per_s",
        median(our_rates),
        "rows/s",
        median(their_rates),
        ">= 0.2",
        details=details,
    )


BENCHMARKS: dict[str, Callable[[Settings], dict[str, Any]]] = {
    "window_rows_per_s": window_rows_per_s,
}
