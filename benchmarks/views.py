"""Materialized-view benchmarks: the versioned table (writes, snapshot scans, change-log
replay) and a snapshot backfill catching up with a live view.

Every table here has three columns (``k`` int64 key, not nullable; ``v`` int64; ``w`` float64),
256 vnodes, and lives in a temporary directory. Rows are written in 4,096-row chunks. The
sizes are fixed (not calibrated): each side runs the same rows, the two sides alternate (the
order flips every repetition) after an untimed warm-up with ``--quick``, the cyclic GC is off
during a timed run, and every run checks its row count (and a checksum of ``v``), so a
benchmark that loses rows fails rather than reporting a fast figure.

* ``versioned_write_rows_per_s`` — a fresh :class:`~barrierflow.runtime.state.StateStore` per
  run; 2M rows (``--quick``: 100K) of distinct keys in shuffled order are written to a versioned
  table with a checkpoint (``seal`` + ``store.commit``: segment files fsynced, manifest in
  SQLite) every 8 chunks; compaction at its default (``compact_after=32``), so a full run folds
  once. Baseline: ``pyarrow.parquet.ParquetWriter`` writing the same batches to one file (no
  fsync). Goal ``>= 0.5`` on the ratio.
* ``snapshot_scan_rows_per_s`` — ``read_vnode`` of vnodes 0..255 as of the newest epoch of a
  5M-row table (``--quick``: 200K) built from 8 insert epochs (folded into a base by a
  compaction) and 4 epochs each updating 10% of the keys (``UPDATE_DELETE``/``UPDATE_INSERT``
  pairs, kept as deltas), so every vnode merges a base and 4 deltas. Baseline:
  ``pyarrow.parquet.read_table`` of the same rows from one Parquet file. Goal ``>= 0.5``. The
  peak RSS during the scans (a thread sampling ``VmRSS`` every 2 ms) is in ``details``, with
  the 1 GB limit it should stay under.
* ``changelog_replay_rows_per_s`` — ``change_log(epoch)`` of every epoch of a table of 64
  durable epochs (``--quick``: 16) totalling 2M rows (``--quick``: 100K): the first half
  inserts, the second half update pairs. Baseline: ``pyarrow.parquet.read_table`` of the same
  rows (with their ops) from one Parquet file. Goal ``>= 0.5``.
* ``snapshot_backfill_catchup_s`` — a runtime (``barrier_interval=0.05``, a checkpoint per
  barrier) of a push source ``src`` and a ``view`` (:class:`~barrierflow.actors.backfill.
  materialize.Materialize`) holding 2M rows (``--quick``: 100K), updated live: at every
  barrier interval a producer pushes 1,024 update pairs. A job of a
  :class:`~barrierflow.actors.backfill.snapshot_backfill.SnapshotBackfill` and a counting actor
  is added: seconds from ``add_job`` to the backfill reporting ``phase == "forward"``
  (``handle.wait_ready()``). Its reports are sampled once per completed barrier (a new
  ``Progress`` each); once past the snapshot phase ``epochs_owed`` must never grow, or the
  benchmark fails. The counter's rows, signed by op, must sum to the view's rows and its
  signed ``v`` to the view's ``v`` once the producer pauses (nothing lost, nothing twice).
  Baseline: ``read_vnode`` of the view's 256 vnodes as of its last sealed epoch (pinned while
  read), in the same runtime under the same live updates — the ratio is what catching up live
  costs over a bare scan. Goal ``<= 3.0`` on the ratio. The jobs are not dropped (see
  ``_catchup_run``): each keeps forwarding the live updates once it has caught up.
"""

from __future__ import annotations

import gc
import itertools
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from barrierflow.actors.backfill.materialize import Materialize
from barrierflow.actors.backfill.snapshot_backfill import SnapshotBackfill
from barrierflow.channels import Chunk, Message, Op
from barrierflow.runtime import ActorContext, Job, Runtime, RuntimeConfig, StateStore, StreamActor
from barrierflow.runtime.state.versioned_table import VersionedTable
from benchmarks.harness import (
    Settings,
    make_record,
    median,
    paired_ratio,
    rounded,
    sampled,
    samples,
)
from benchmarks.jobs import logs_to_stderr

__all__ = ["BENCHMARKS"]

#: Rows per written chunk.
ROWS = 4096
#: The versioned tables' vnodes.
VNODES = 256
SCHEMA = pa.schema(
    [pa.field("k", pa.int64(), nullable=False), ("v", pa.int64()), ("w", pa.float64())]
)
KEY = ["k"]
#: The ops a change log row adds (the others remove one).
_LIVE_OPS = pa.array([int(Op.INSERT), int(Op.UPDATE_INSERT)], pa.int8())
#: Where the RSS is read from.
_STATUS = "/proc/self/status"

Side = Callable[[], Awaitable[float]]


# -- shared -------------------------------------------------------------------------------


def _batch(keys: npt.NDArray[np.int64], values: npt.NDArray[np.int64]) -> pa.RecordBatch:
    return pa.record_batch(
        [pa.array(keys), pa.array(values), pa.array(values * 0.5)], schema=SCHEMA
    )


def _chunks(table: pa.Table, rows: int = ROWS) -> list[pa.RecordBatch]:
    """``table``'s rows as record batches of ``rows`` rows (zero-copy slices)."""
    return [b for b in table.combine_chunks().to_batches(max_chunksize=rows) if b.num_rows]


def _v_sum(table: pa.Table) -> int:
    total = pc.sum(table.column("v")).as_py()
    return 0 if total is None else int(total)


@contextmanager
def _gc_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def _alternate(
    candidate: Side, baseline: Side, reps: int, warm_up: bool
) -> tuple[list[float], list[float]]:
    """Seconds per repetition of each side (async callables returning their seconds), the
    order flipping every repetition; one untimed run of each first with ``warm_up``."""
    if warm_up:
        await candidate()
        await baseline()
    ours: list[float] = []
    theirs: list[float] = []
    for i in range(reps):
        if i % 2 == 0:
            ours.append(await candidate())
            theirs.append(await baseline())
        else:
            theirs.append(await baseline())
            ours.append(await candidate())
    return ours, theirs


def _rates_record(
    name: str,
    rows: int,
    ours: list[float],
    theirs: list[float],
    goal: str,
    details: dict[str, Any],
) -> dict[str, Any]:
    our_rates = [rows / t for t in ours]
    their_rates = [rows / t for t in theirs]
    return make_record(
        name,
        median(our_rates),
        "rows/s",
        median(their_rates),
        goal,
        details={
            "backend": "asyncio",
            "rows_per_run": rows,
            "runs": len(ours),
            **details,
            "samples": samples(our_rates),
            "baseline_samples": samples(their_rates),
            "paired_ratio": paired_ratio(our_rates, their_rates),
        },
    )


def _rss_bytes() -> int:
    with open(_STATUS, encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


@dataclass
class _RssPeak:
    """The highest RSS a sampling thread saw while it ran, and the RSS when it started."""

    start: int = 0
    peak: int = 0


@contextmanager
def _rss_sampled(every: float = 0.002) -> Iterator[_RssPeak]:
    """Sample ``VmRSS`` every ``every`` seconds on a thread while the block runs (after
    returning the memory Arrow's pool holds unused, so an earlier run's does not count)."""
    pa.default_memory_pool().release_unused()
    found = _RssPeak(start=_rss_bytes())
    found.peak = found.start
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            found.peak = max(found.peak, _rss_bytes())
            stop.wait(every)

    thread = threading.Thread(target=sample, name="rss-sampler", daemon=True)
    thread.start()
    try:
        yield found
    finally:
        stop.set()
        thread.join()
        found.peak = max(found.peak, _rss_bytes())


def _mb(n: int) -> float | None:
    return rounded(n / 2**20, 4)


async def _scan(table: VersionedTable, epoch: int) -> tuple[int, int]:
    """Rows and the sum of ``v`` of every vnode of ``table`` as of ``epoch``."""
    rows = total = 0
    for vnode in range(table.vnode_count):
        part = await table.read_vnode(vnode, epoch)
        rows += part.num_rows
        total += _v_sum(part)
    return rows, total


async def _read_parquet(path: str) -> tuple[int, int]:
    table = await anyio.to_thread.run_sync(pq.read_table, path)
    return table.num_rows, _v_sum(table)


def _check(what: str, got: tuple[int, int], expected: tuple[int, int]) -> None:
    if got != expected:
        raise AssertionError(f"{what}: (rows, sum of v) {got}, expected {expected}")


def _update_pairs(
    keys: npt.NDArray[np.int64], old: npt.NDArray[np.int64], new: npt.NDArray[np.int64]
) -> tuple[pa.Table, pa.Array]:
    """An ``UPDATE_DELETE`` (old row) and ``UPDATE_INSERT`` (new row) for each key: all the
    deletes first (a stable sort keeps each key's pair in order)."""
    table = pa.Table.from_batches(
        [_batch(np.concatenate([keys, keys]), np.concatenate([old, new]))]
    )
    ops = np.concatenate(
        [np.full(len(keys), int(Op.UPDATE_DELETE)), np.full(len(keys), int(Op.UPDATE_INSERT))]
    ).astype(np.int8)
    return table, pa.array(ops)


# -- versioned_write_rows_per_s -----------------------------------------------------------

#: Chunks per checkpoint of the write benchmark.
WRITE_CHECKPOINT_EVERY = 8


class _Runs:
    """A fresh directory per run under ``root``; the previous one is removed first."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.count = 0

    def next(self) -> str:
        self.count += 1
        shutil.rmtree(os.path.join(self.root, f"run-{self.count - 1}"), ignore_errors=True)
        path = os.path.join(self.root, f"run-{self.count}")
        os.makedirs(path)
        return path


async def _versioned_write(
    runs: _Runs, batches: list[pa.RecordBatch], expected: tuple[int, int], stats: dict[str, Any]
) -> float:
    async with await StateStore.open(os.path.join(runs.next(), "state.db")) as store:
        table = await store.versioned_table("bench", "view", schema=SCHEMA, primary_key=KEY)
        epoch = store.committed_epoch
        last = len(batches) - 1
        with _gc_off():
            started = time.perf_counter()
            for i, batch in enumerate(batches):
                table.write(batch)
                if (i + 1) % WRITE_CHECKPOINT_EVERY == 0 or i == last:
                    epoch += 1
                    table.seal(epoch)
                    await store.commit(epoch)
            seconds = time.perf_counter() - started
        stats["checkpoints"] = epoch
        stats["compacted_through"] = table.oldest_epoch
        _check("versioned write", await _scan(table, epoch), expected)
    return seconds


async def _parquet_write(
    runs: _Runs, batches: list[pa.RecordBatch], expected: tuple[int, int]
) -> float:
    path = os.path.join(runs.next(), "part.parquet")
    with _gc_off():
        started = time.perf_counter()
        with pq.ParquetWriter(path, SCHEMA) as writer:
            for batch in batches:
                writer.write_batch(batch)
        seconds = time.perf_counter() - started
    await anyio.lowlevel.checkpoint()
    _check("parquet write", await _read_parquet(path), expected)
    return seconds


def versioned_write_rows_per_s(settings: Settings) -> dict[str, Any]:
    """Rows/s written to a versioned table with checkpoints (see the module doc)."""
    rows = 100_000 if settings.quick else 2_000_000
    reps = 5
    rng = np.random.default_rng(11)
    keys = rng.permutation(rows).astype(np.int64)
    values = rng.integers(0, 1_000_000, rows, dtype=np.int64)
    batches = _chunks(pa.Table.from_batches([_batch(keys, values)]))
    expected = (rows, int(values.sum()))
    stats: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        ours_runs, theirs_runs = _Runs(os.path.join(tmp, "ours")), _Runs(os.path.join(tmp, "pq"))

        async def main() -> tuple[list[float], list[float]]:
            return await _alternate(
                lambda: _versioned_write(ours_runs, batches, expected, stats),
                lambda: _parquet_write(theirs_runs, batches, expected),
                reps,
                warm_up=settings.quick,
            )

        ours, theirs = anyio.run(main, backend="asyncio")
    return _rates_record(
        "versioned_write_rows_per_s",
        rows,
        ours,
        theirs,
        ">= 0.5",
        {
            "rows_per_chunk": ROWS,
            "columns": len(SCHEMA),
            "chunks_per_checkpoint": WRITE_CHECKPOINT_EVERY,
            "checkpoints_per_run": stats["checkpoints"],
            "compacted_through_epoch": stats["compacted_through"],
            "candidate": "a fresh StateStore per run (open untimed); VersionedTable.write of "
            "each chunk (distinct keys, shuffled), seal + store.commit every "
            f"{WRITE_CHECKPOINT_EVERY} chunks (segment files fsynced, manifest in SQLite; "
            "compact_after=32)",
            "baseline_impl": "pyarrow.parquet.ParquetWriter (defaults) write_batch per chunk "
            "into one file, close; no fsync",
        },
    )


# -- snapshot_scan_rows_per_s -------------------------------------------------------------

#: Insert epochs (folded into a base) and update epochs (kept as deltas) of the scanned table.
SCAN_INSERT_EPOCHS = 8
SCAN_UPDATE_EPOCHS = 4
#: The share of the keys each update epoch changes.
SCAN_UPDATE_SHARE = 0.1
#: The RSS the scan should stay under.
RSS_LIMIT = 1 << 30


async def _build_scan_table(
    store: StateStore, rows: int, parquet: str
) -> tuple[VersionedTable, int, tuple[int, int], dict[str, Any]]:
    """The table of ``snapshot_scan_rows_per_s`` (and the same rows in ``parquet``)."""
    table = await store.versioned_table(
        "bench",
        "scan",
        schema=SCHEMA,
        primary_key=KEY,
        compact_after=SCAN_INSERT_EPOCHS - 1,
    )
    rng = np.random.default_rng(13)
    values = rng.integers(0, 1_000_000, rows, dtype=np.int64)
    epoch = 0
    for part in np.array_split(rng.permutation(rows).astype(np.int64), SCAN_INSERT_EPOCHS):
        for batch in _chunks(pa.Table.from_batches([_batch(part, values[part])]), 65_536):
            table.write(batch)
        epoch += 1
        table.seal(epoch)
        await store.commit(epoch)
    folded = table.oldest_epoch
    changed = int(rows * SCAN_UPDATE_SHARE)
    for _ in range(SCAN_UPDATE_EPOCHS):
        keys = np.sort(rng.choice(rows, changed, replace=False)).astype(np.int64)
        new = rng.integers(0, 1_000_000, changed, dtype=np.int64)
        pairs, ops = _update_pairs(keys, values[keys], new)
        values[keys] = new
        table.write(pairs, ops)
        epoch += 1
        table.seal(epoch)
        await store.commit(epoch)
    everything = pa.Table.from_batches([_batch(np.arange(rows, dtype=np.int64), values)])
    await anyio.to_thread.run_sync(pq.write_table, everything, parquet)
    shape = {
        "insert_epochs": SCAN_INSERT_EPOCHS,
        "update_epochs": SCAN_UPDATE_EPOCHS,
        "keys_updated_per_epoch": changed,
        "base_epoch": folded,
        "deltas_merged": len(table.epochs_after(table.oldest_epoch)),
    }
    if folded != SCAN_INSERT_EPOCHS or table.oldest_epoch != folded:
        raise AssertionError(f"scan table: base of epoch {table.oldest_epoch}, expected {folded}")
    return table, epoch, (rows, int(values.sum())), shape


def snapshot_scan_rows_per_s(settings: Settings) -> dict[str, Any]:
    """Rows/s of reading every vnode of a versioned table as of an epoch (see the module)."""
    rows = 200_000 if settings.quick else 5_000_000
    reps = 5
    peaks: list[_RssPeak] = []
    baseline_peaks: list[_RssPeak] = []
    with tempfile.TemporaryDirectory() as tmp:
        parquet = os.path.join(tmp, "scan.parquet")

        async def main() -> tuple[list[float], list[float], dict[str, Any]]:
            async with await StateStore.open(os.path.join(tmp, "state.db")) as store:
                started = time.perf_counter()
                table, epoch, expected, shape = await _build_scan_table(store, rows, parquet)
                shape["build_s"] = rounded(time.perf_counter() - started, 3)

                async def candidate() -> float:
                    with _gc_off(), _rss_sampled() as rss:
                        started = time.perf_counter()
                        got = await _scan(table, epoch)
                        seconds = time.perf_counter() - started
                    peaks.append(rss)
                    _check("snapshot scan", got, expected)
                    return seconds

                async def baseline() -> float:
                    with _gc_off(), _rss_sampled() as rss:
                        started = time.perf_counter()
                        got = await _read_parquet(parquet)
                        seconds = time.perf_counter() - started
                    baseline_peaks.append(rss)
                    _check("parquet read", got, expected)
                    return seconds

                ours, theirs = await _alternate(candidate, baseline, reps, settings.quick)
            return ours, theirs, shape

        ours, theirs, shape = anyio.run(main, backend="asyncio")
    peak = max(p.peak for p in peaks)
    growth = max(p.peak - p.start for p in peaks)
    return _rates_record(
        "snapshot_scan_rows_per_s",
        rows,
        ours,
        theirs,
        ">= 0.5",
        {
            "vnodes": VNODES,
            "columns": len(SCHEMA),
            **shape,
            "peak_rss_mb": _mb(peak),
            "peak_rss_growth_mb": _mb(growth),
            "rss_before_first_scan_mb": _mb(peaks[0].start),
            "first_scan_peak_rss_mb": _mb(peaks[0].peak),
            "rss_limit_mb": _mb(RSS_LIMIT),
            "rss_under_limit": peak < RSS_LIMIT,
            "baseline_peak_rss_mb": _mb(max(p.peak for p in baseline_peaks)),
            "baseline_peak_rss_growth_mb": _mb(max(p.peak - p.start for p in baseline_peaks)),
            "rss_method": "VmRSS of /proc/self/status sampled every 2 ms on a thread during "
            "each timed run (memory-mapped segment pages count), after Arrow's pool released "
            "unused memory; growth: peak - RSS at the run's start; the first scan runs before "
            "any Parquet read",
            "candidate": "read_vnode(vnode, epoch) for vnode 0..255 (a merge of the base and "
            "4 deltas per vnode, on a worker thread per vnode)",
            "baseline_impl": "pyarrow.parquet.read_table (defaults, threads on) of one file of "
            "the same rows, on a worker thread",
        },
    )


# -- changelog_replay_rows_per_s ----------------------------------------------------------


async def _build_log_table(
    store: StateStore, rows: int, epochs: int, parquet: str
) -> tuple[VersionedTable, tuple[int, int]]:
    """``epochs`` durable epochs of about ``rows / epochs`` rows each: inserts of new keys for
    the first half, update pairs of earlier keys for the second (and the rows in ``parquet``)."""
    table = await store.versioned_table(
        "bench", "log", schema=SCHEMA, primary_key=KEY, compact_after=10 * epochs
    )
    rng = np.random.default_rng(17)
    per_epoch = rows // epochs
    inserted = (epochs // 2) * per_epoch
    values = rng.integers(0, 1_000_000, inserted, dtype=np.int64)
    written: list[pa.Table] = []
    for epoch in range(1, epochs + 1):
        if epoch <= epochs // 2:
            keys = np.arange((epoch - 1) * per_epoch, epoch * per_epoch, dtype=np.int64)
            rows_of = pa.Table.from_batches([_batch(keys, values[keys])])
            ops = pa.array(np.zeros(per_epoch, np.int8))
        else:
            keys = rng.choice(inserted, per_epoch // 2, replace=False).astype(np.int64)
            new = rng.integers(0, 1_000_000, len(keys), dtype=np.int64)
            rows_of, ops = _update_pairs(keys, values[keys], new)
            values[keys] = new
        for start in range(0, rows_of.num_rows, ROWS):
            table.write(rows_of.slice(start, ROWS), ops.slice(start, ROWS))
        written.append(rows_of.append_column("_op", ops))
        table.seal(epoch)
        await store.commit(epoch)
    everything = pa.concat_tables(written)
    await anyio.to_thread.run_sync(pq.write_table, everything, parquet)
    if table.oldest_epoch != 0 or len(table.epochs_after(0)) != epochs:
        raise AssertionError("change-log table: an epoch was folded or is missing")
    return table, (everything.num_rows, _v_sum(everything))


async def _replay(table: VersionedTable) -> tuple[int, int]:
    rows = total = 0
    for epoch in table.epochs_after(0):
        log = await table.change_log(epoch)
        rows += log.num_rows
        total += _v_sum(log)
    return rows, total


def changelog_replay_rows_per_s(settings: Settings) -> dict[str, Any]:
    """Rows/s of reading every epoch's change log (see the module doc)."""
    rows, epochs = (100_000, 16) if settings.quick else (2_000_000, 64)
    reps = 5
    with tempfile.TemporaryDirectory() as tmp:
        parquet = os.path.join(tmp, "log.parquet")

        async def main() -> tuple[list[float], list[float], int]:
            async with await StateStore.open(os.path.join(tmp, "state.db")) as store:
                table, expected = await _build_log_table(store, rows, epochs, parquet)

                async def candidate() -> float:
                    with _gc_off():
                        started = time.perf_counter()
                        got = await _replay(table)
                        seconds = time.perf_counter() - started
                    _check("change-log replay", got, expected)
                    return seconds

                async def baseline() -> float:
                    with _gc_off():
                        started = time.perf_counter()
                        got = await _read_parquet(parquet)
                        seconds = time.perf_counter() - started
                    _check("parquet read", got, expected)
                    return seconds

                ours, theirs = await _alternate(candidate, baseline, reps, settings.quick)
            return ours, theirs, expected[0]

        ours, theirs, total = anyio.run(main, backend="asyncio")
    return _rates_record(
        "changelog_replay_rows_per_s",
        total,
        ours,
        theirs,
        ">= 0.5",
        {
            "epochs": epochs,
            "columns": len(SCHEMA) + 1,
            "candidate": "change_log(epoch) of every epoch of table.epochs_after(0), each a "
            "durable segment file (memory-mapped); first half inserts, second half update pairs",
            "baseline_impl": "pyarrow.parquet.read_table (defaults, threads on) of one file of "
            "the same rows with their ops, on a worker thread",
        },
    )


# -- snapshot_backfill_catchup_s ----------------------------------------------------------

#: Seconds between the runtime's barriers (each a checkpoint) and the live producer's pushes.
CATCHUP_INTERVAL = 0.05
#: Keys the producer updates per push (one ``UPDATE_DELETE``/``UPDATE_INSERT`` pair each).
CATCHUP_UPDATES = 1024
#: Rows per chunk when filling the view.
FILL_ROWS = 65_536


@dataclass
class _Signed:
    """What a job's counting actor saw, each row signed by its op (+1 inserts, -1 deletes)."""

    rows: int = 0
    v: int = 0
    chunks: int = 0


class _SignedCounter(StreamActor):
    """Sums the rows and ``v`` it reads, signed by op; passes barriers, drops the rows."""

    def __init__(self, tally: _Signed) -> None:
        self.tally = tally

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if not isinstance(message, Chunk):
            await ctx.emit(message)
            return
        rows = message.compact()
        n = rows.cardinality
        if not n:
            return
        v = rows.batch.column("v").to_numpy()
        tally = self.tally
        tally.chunks += 1
        if rows.ops is None:
            tally.rows += n
            tally.v += int(v.sum())
            return
        live = pc.is_in(rows.ops, value_set=_LIVE_OPS).to_numpy(zero_copy_only=False)
        sign = np.where(live, 1, -1)
        tally.rows += int(sign.sum())
        tally.v += int((sign * v).sum())


@dataclass
class _Live:
    """The view as the producer made it: each key's ``v``; ``paused`` stops the pushes."""

    values: npt.NDArray[np.int64]
    rng: np.random.Generator
    paused: bool = False
    pushes: int = 0
    idle: anyio.Event = field(default_factory=anyio.Event)

    def expected(self) -> tuple[int, int]:
        return len(self.values), int(self.values.sum())

    def next_chunk(self) -> Chunk:
        keys = np.sort(self.rng.choice(len(self.values), CATCHUP_UPDATES, replace=False))
        keys = keys.astype(np.int64)
        new = self.rng.integers(0, 1_000_000, len(keys), dtype=np.int64)
        pairs, ops = _update_pairs(keys, self.values[keys], new)
        self.values[keys] = new
        return Chunk(pairs.combine_chunks().to_batches()[0], ops)


async def _produce(rt: Runtime, live: _Live, stop: anyio.Event) -> None:
    """One chunk of update pairs every barrier interval (a fixed rate) until ``stop``."""
    next_at = anyio.current_time()
    while not stop.is_set():
        if live.paused:
            live.idle.set()
            await anyio.sleep(CATCHUP_INTERVAL / 5)
            continue
        await rt.push("src", live.next_chunk())
        live.pushes += 1
        next_at = max(next_at + CATCHUP_INTERVAL, anyio.current_time())
        await anyio.sleep_until(next_at)


async def _quiesce(rt: Runtime, live: _Live) -> None:
    """Pause the producer and let a checkpoint pass every row it pushed."""
    live.idle = anyio.Event()
    live.paused = True
    await live.idle.wait()
    await rt.checkpoint()


@dataclass
class _Catchup:
    """One job's catch-up: seconds, the reports (phase, epochs owed) per completed barrier."""

    seconds: float
    reports: list[tuple[str, int]]
    snapshot_epoch: int
    rows_backfilled: int


async def _watch(
    handle: Any, actor: str, reports: list[tuple[str, int]], done: anyio.Event
) -> None:
    """Note the backfill's report of every completed barrier (a new Progress object each)."""
    last = None
    while True:
        progress = handle.progress().actors.get(actor)
        if progress is not None and progress is not last:
            last = progress
            reports.append((str(progress.detail["phase"]), int(progress.detail["epochs_owed"])))
        if done.is_set():
            return
        await anyio.sleep(0.002)


def _check_owed(reports: list[tuple[str, int]]) -> list[int]:
    """The epochs owed per barrier after the snapshot phase; fails if that ever grows."""
    lag = [owed for phase, owed in reports if phase != "snapshot"]
    for before, after in itertools.pairwise(lag):
        if after > before:
            raise AssertionError(f"snapshot backfill: epochs owed grew after the snapshot: {lag}")
    if not reports or reports[-1][0] != "forward" or lag[-1] != 0:
        raise AssertionError(f"snapshot backfill: not forwarding with nothing owed: {reports}")
    return lag


async def _pinned_scan(table: VersionedTable) -> tuple[int, int]:
    """:func:`_scan` as of the last sealed epoch, pinned meanwhile (the runtime's checkpoints
    may compact the table during the scan)."""
    epoch = table.last_sealed_epoch
    table.pin("benchmark-scan", epoch)
    try:
        return await _scan(table, epoch)
    finally:
        table.unpin("benchmark-scan")


async def _catchup_run(rows: int, reps: int, warm_up: bool, tmp: str) -> dict[str, Any]:
    rt = Runtime(
        RuntimeConfig(state_path=os.path.join(tmp, "state.db"), barrier_interval=CATCHUP_INTERVAL)
    )
    views: list[Materialize] = []

    def materialize() -> Materialize:
        view = Materialize(SCHEMA, KEY)
        views.append(view)
        return view

    rt.add_source("src")
    rt.add_actor("view", materialize, inputs=["src"])
    rng = np.random.default_rng(19)
    live = _Live(rng.integers(0, 1_000_000, rows, dtype=np.int64), rng)
    keys = rng.permutation(rows).astype(np.int64)
    fill = _chunks(pa.Table.from_batches([_batch(keys, live.values[keys])]), FILL_ROWS)
    catchups: list[_Catchup] = []
    jobs = 0
    stop = anyio.Event()
    async with rt, anyio.create_task_group() as tg:
        started = time.perf_counter()
        for batch in fill:
            await rt.push("src", Chunk(batch))
        await rt.checkpoint()
        fill_seconds = time.perf_counter() - started
        tg.start_soon(_produce, rt, live, stop)

        async def catchup() -> float:
            nonlocal jobs
            name = f"copy{jobs}"
            jobs += 1
            tally = _Signed()
            job = Job(name)
            # Actor names are global to the runtime: each job's are its own.
            backfill = f"{name}_backfill"
            job.add_actor(backfill, lambda: SnapshotBackfill("view"), inputs={"upstream": "view"})
            job.add_actor(f"{name}_count", lambda: _SignedCounter(tally), inputs=[backfill])
            reports: list[tuple[str, int]] = []
            done = anyio.Event()
            with _gc_off():
                started = time.perf_counter()
                handle = await rt.add_job(job)
                async with anyio.create_task_group() as watch:
                    watch.start_soon(_watch, handle, backfill, reports, done)
                    ready = await handle.wait_ready()
                    seconds = time.perf_counter() - started
                    done.set()
            progress = ready.actors[backfill]
            if progress.detail["phase"] != "forward":
                raise AssertionError(f"snapshot backfill: ready in phase {progress.detail}")
            _check_owed(reports)
            await _quiesce(rt, live)
            got = (tally.rows, tally.v)
            # Not dropped: ``drop_job`` can fail here with EpochOrderError (its ``_trim`` seals
            # the dropped actors' tables with the stop barrier's ``curr`` epoch, which the next
            # checkpoint may have committed already at a 50 ms interval). Once forwarding, a
            # job only counts the live updates (about 41,000 rows/s).
            _check("snapshot backfill (signed rows, signed v)", got, live.expected())
            live.paused = False
            catchups.append(
                _Catchup(
                    seconds,
                    reports,
                    int(progress.detail["snapshot_epoch"]),
                    progress.rows,
                )
            )
            return seconds

        async def scan() -> float:
            with _gc_off():
                started = time.perf_counter()
                got = await _pinned_scan(views[-1].table)
                seconds = time.perf_counter() - started
            if got[0] != rows:
                raise AssertionError(f"view scan: {got[0]} rows, expected {rows}")
            return seconds

        ours, theirs = await _alternate(catchup, scan, reps, warm_up)
        await _quiesce(rt, live)
        stop.set()
        live.paused = False
        _check("view scan", await _pinned_scan(views[-1].table), live.expected())
    return {
        "ours": ours,
        "theirs": theirs,
        "catchups": catchups[-len(ours) :],
        "fill_s": rounded(fill_seconds, 3),
        "pushes": live.pushes,
    }


def snapshot_backfill_catchup_s(settings: Settings) -> dict[str, Any]:
    """Seconds for a snapshot backfill over a live view to reach forwarding (see the module)."""
    rows = 100_000 if settings.quick else 2_000_000
    reps = 3
    with tempfile.TemporaryDirectory() as tmp, logs_to_stderr():
        run = anyio.run(_catchup_run, rows, reps, settings.quick, tmp, backend="asyncio")
    ours, theirs = run["ours"], run["theirs"]
    catchups: list[_Catchup] = run["catchups"]
    lags = [_check_owed(c.reports) for c in catchups]
    record = make_record(
        "snapshot_backfill_catchup_s",
        median(ours),
        "s",
        median(theirs),
        "<= 3.0",
        details={
            "backend": "asyncio",
            "view_rows": rows,
            **sampled(ours, theirs),
            "lag_sequence_lengths": [len(lag) for lag in lags],
            "lag_sequences": lags,
            "barriers_in_snapshot_phase": [
                sum(1 for phase, _ in c.reports if phase == "snapshot") for c in catchups
            ],
            "max_epochs_owed": [max((o for _, o in c.reports), default=0) for c in catchups],
            "rows_backfilled": [c.rows_backfilled for c in catchups],
            "barrier_interval_ms": CATCHUP_INTERVAL * 1e3,
            "live_update_pairs_per_push": CATCHUP_UPDATES,
            "live_rows_per_s": rounded(2 * CATCHUP_UPDATES / CATCHUP_INTERVAL),
            "fill_s": run["fill_s"],
            "candidate": "add_job(SnapshotBackfill('view') -> signed counting actor) to "
            "handle.wait_ready() (the backfill's phase == 'forward'); a checkpoint per barrier",
            "baseline_impl": "read_vnode of the view's 256 vnodes as of its last sealed epoch "
            "(pinned), in the same runtime under the same live updates",
            "jobs_kept": "not dropped (drop_job races the next checkpoint, see the module); "
            "the earlier jobs keep forwarding the live updates",
        },
    )
    return record


#: Every benchmark of this module, by name, in run order.
BENCHMARKS: dict[str, Callable[[Settings], dict[str, Any]]] = {
    "versioned_write_rows_per_s": versioned_write_rows_per_s,
    "snapshot_scan_rows_per_s": snapshot_scan_rows_per_s,
    "changelog_replay_rows_per_s": changelog_replay_rows_per_s,
    "snapshot_backfill_catchup_s": snapshot_backfill_catchup_s,
}
