"""Keyed aggregation benchmark: ``aggregate`` (sum, count, max per key) through a runtime, with
its state in versioned tables and its changelog emitted at every checkpoint.

``keyed_aggregate_rows_per_s``: 20M rows (``--quick``: 2M) over 1M keys (``--quick``: 100K),
int64 keys drawn uniformly, int64 values; a push source → ``aggregate("k", s=sum, c=count,
m=max)`` → an actor counting the changelog, in a runtime on asyncio, pushed in chunks of
:data:`CHUNK_ROWS` rows with a checkpoint every 1M rows (``--quick``: 100K) — each checkpoint
closes an epoch, so the aggregate merges that epoch's rows into its state, emits the epoch's
changelog and writes it to its view table, which the checkpoint makes durable. Checked: the
inserts emitted equal the distinct keys, and the changelog's signed sum of ``s`` equals the sum
of every value (nothing lost, nothing twice). The sizes are fixed (not calibrated); the sides
alternate (the order flips every repetition), each repetition on a fresh state store.

Baselines (each fed the same epochs of rows, already in memory):

* **Polars** ``group_by`` of each epoch's rows merged into a running result (``concat`` with
  it, then a ``group_by`` summing the sums and counts and taking the max of the maxes) — Polars
  in memory, multithreaded, nothing durable, no changelog. Goal: ratio ``>= 0.3``.
* **Bytewax** ``stateful_map`` (``bytewax.testing.run_main``) of a slice of the rows (200K;
  ``--quick``: 50K) keyed by the key as a string, the mapper keeping ``(sum, count, max)`` and
  emitting it per row, into a ``TestingSink``; its rows/s is scaled to the full size (it is
  linear: one Python call per row). In ``details``: ``bytewax_rows_per_s`` and
  ``ratio_to_bytewax`` (goal ``>= 20``), or why it did not run.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.channels import Chunk
from barrierflow.operators.aggregate import aggregate
from barrierflow.runtime import Runtime, RuntimeConfig
from benchmarks.harness import Settings, make_record, median, rounded, sampled
from benchmarks.operators import ChangelogCount

__all__ = ["BENCHMARKS"]

#: Rows per pushed chunk.
CHUNK_ROWS = 65_536
SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64())])
#: Full and --quick sizes: (rows, keys, rows per epoch, bytewax slice).
FULL = (20_000_000, 1_000_000, 1_000_000, 200_000)
QUICK = (2_000_000, 100_000, 100_000, 50_000)
REPS = 3


def _data(rows: int, keys: int, per_epoch: int) -> list[list[pa.RecordBatch]]:
    """The rows, as epochs of chunks."""
    rng = np.random.default_rng(11)
    epochs = []
    for start in range(0, rows, per_epoch):
        n = min(per_epoch, rows - start)
        batch = pa.record_batch(
            [pa.array(rng.integers(0, keys, n)), pa.array(rng.integers(0, 1000, n))],
            schema=SCHEMA,
        )
        epochs.append(_slices(batch))
    return epochs


def _slices(batch: pa.RecordBatch) -> list[pa.RecordBatch]:
    return [batch.slice(i, CHUNK_ROWS) for i in range(0, batch.num_rows, CHUNK_ROWS)]


async def _ours(epochs: list[list[pa.RecordBatch]], directory: str) -> float:
    """Seconds to push every epoch through the aggregate, a checkpoint closing each."""
    ChangelogCount.inserts = ChangelogCount.total = 0
    config = RuntimeConfig(state_path=os.path.join(directory, "state.db"), barrier_interval=3600)
    rt = Runtime(config)
    rt.add_source("events")
    rt.add_actor(
        "agg",
        aggregate("k", schema=SCHEMA, s=("v", "sum"), c=("v", "count"), m=("v", "max")),
        inputs=["events"],
    )
    rt.add_actor("changes", ChangelogCount, inputs=["agg"])
    async with rt:
        start = time.perf_counter()
        for chunks in epochs:
            for chunk in chunks:
                await rt.push("events", Chunk(chunk))
            await rt.checkpoint()
        elapsed = time.perf_counter() - start
    return elapsed


def _polars(epochs: list[list[pa.RecordBatch]]) -> tuple[float, Any]:
    import polars as pl

    start = time.perf_counter()
    running = None
    for chunks in epochs:
        frame = pl.from_arrow(pa.Table.from_batches(chunks))
        assert isinstance(frame, pl.DataFrame)
        part = frame.group_by("k").agg(
            pl.col("v").sum().alias("s"),
            pl.col("v").count().alias("c"),
            pl.col("v").max().alias("m"),
        )
        if running is None:
            running = part
        else:
            running = (
                pl.concat([running, part])
                .group_by("k")
                .agg(pl.col("s").sum(), pl.col("c").sum(), pl.col("m").max())
            )
    return time.perf_counter() - start, running


def _bytewax(batch: pa.RecordBatch) -> float | str:
    """Rows per second of Bytewax's ``stateful_map`` over ``batch``'s rows, or why not."""
    try:
        import bytewax.operators as op
        from bytewax.dataflow import Dataflow
        from bytewax.testing import TestingSink, TestingSource, run_main
    except ImportError as exc:  # pragma: no cover - bytewax is optional
        return f"bytewax not importable: {exc}"
    rows = list(zip(batch.column("k").to_pylist(), batch.column("v").to_pylist(), strict=True))
    out: list[Any] = []

    def mapper(state: tuple[int, int, int] | None, v: int) -> tuple[Any, Any]:
        s, c, m = state if state is not None else (0, 0, v)
        new = (s + v, c + 1, max(m, v))
        return new, new

    flow = Dataflow("keyed_aggregate")
    stream = op.input("in", flow, TestingSource(rows))
    keyed = op.key_on("key", stream, lambda row: str(row[0]))
    values = op.map_value("value", keyed, lambda row: row[1])
    folded = op.stateful_map("fold", values, mapper)
    op.output("out", folded, TestingSink(out))
    start = time.perf_counter()
    run_main(flow)  # type: ignore[no-untyped-call]
    elapsed = time.perf_counter() - start
    if len(out) != len(rows):
        raise AssertionError(f"bytewax emitted {len(out)} rows of {len(rows)}")
    return len(rows) / elapsed


def keyed_aggregate_rows_per_s(settings: Settings) -> dict[str, Any]:
    rows, keys, per_epoch, slice_rows = QUICK if settings.quick else FULL
    epochs = _data(rows, keys, per_epoch)
    every = pa.Table.from_batches([c for chunks in epochs for c in chunks])
    distinct = len(pc.unique(every.column("k")))
    total = int(pc.sum(every.column("v")).as_py())
    ours: list[float] = []
    theirs: list[float] = []
    for i in range(REPS):
        with tempfile.TemporaryDirectory(prefix="bf-keyed-agg-") as directory:
            if i % 2:
                theirs.append(_polars(epochs)[0])
                ours.append(anyio.run(_ours, epochs, directory, backend="asyncio"))
            else:
                ours.append(anyio.run(_ours, epochs, directory, backend="asyncio"))
                theirs.append(_polars(epochs)[0])
            if (ChangelogCount.inserts, ChangelogCount.total) != (distinct, total):
                raise AssertionError(
                    f"inserts, sum of s: {(ChangelogCount.inserts, ChangelogCount.total)}, "
                    f"expected {(distinct, total)}"
                )
    _, result = _polars(epochs)
    if result.height != distinct or int(result["s"].sum()) != total:
        raise AssertionError("the Polars baseline lost rows")
    our_rates = [rows / t for t in ours]
    their_rates = [rows / t for t in theirs]
    bytewax = _bytewax(_head(epochs, slice_rows))
    details: dict[str, Any] = {
        "rows": rows,
        "keys": keys,
        "rows_per_epoch": per_epoch,
        "chunk_rows": CHUNK_ROWS,
        "graph": "push source -> aggregate(sum, count, max) -> count changelog (asyncio)",
        "baseline_impl": "polars group_by per epoch, merged into a running result",
        **sampled(our_rates, their_rates),
    }
    if isinstance(bytewax, str):
        details["bytewax"] = bytewax
    else:
        details["bytewax_rows_per_s"] = rounded(bytewax)
        details["bytewax_slice_rows"] = slice_rows
        details["ratio_to_bytewax"] = rounded(median(our_rates) / bytewax)
    return make_record(
        "keyed_aggregate_rows_per_s",
        median(our_rates),
        "rows/s",
        median(their_rates),
        ">= 0.3",
        details=details,
    )


def _head(epochs: list[list[pa.RecordBatch]], rows: int) -> pa.RecordBatch:
    table = pa.Table.from_batches([c for chunks in epochs for c in chunks]).slice(0, rows)
    return table.combine_chunks().to_batches()[0]


BENCHMARKS: dict[str, Callable[[Settings], dict[str, Any]]] = {
    "keyed_aggregate_rows_per_s": keyed_aggregate_rows_per_s,
}
