"""Runtime benchmarks: checkpoint latency through a 4-stage graph to a durable commit.

Each checkpoint: 100 rows pushed, a checkpoint barrier injected, passed by a source and three
stateful stages (each updates one state key per chunk), and committed to SQLite in one
transaction; the latency runs from injection until ``checkpoint()`` returns (asyncio).
Baseline: the raw aiosqlite commit of the same writes, in the same process. p50 and p99 over
>= 200 checkpoints; goals (absolute, on the value): p50 <= 2 ms, p99 <= 10 ms.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import aiosqlite
import anyio
import pyarrow as pa

from barrierflow.channels import Chunk, Message
from barrierflow.runtime import ActorContext, Runtime, RuntimeConfig, StreamActor
from benchmarks.harness import Settings, make_record

__all__ = ["BENCHMARKS"]

ROWS = 100


class _Stage(StreamActor):
    async def restore(self, ctx: ActorContext) -> None:
        self.table = ctx.table("seen")
        self.count = 0

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk):
            self.count += message.num_rows
            self.table.put("rows", self.count)
        await ctx.emit(message)


def _percentile(xs: list[float], q: float) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _graph_latencies(path: str, n: int) -> list[float]:
    rt = Runtime(RuntimeConfig(state_path=path, barrier_interval=3600.0))
    rt.add_source("src")
    rt.add_actor("s1", _Stage, inputs=["src"])
    rt.add_actor("s2", _Stage, inputs=["s1"])
    rt.add_actor("s3", _Stage, inputs=["s2"])
    chunk = Chunk(pa.record_batch({"id": pa.array(range(ROWS), pa.int64())}))
    latencies = []
    async with rt:
        for _ in range(n + 10):
            await rt.push("src", chunk)
            started = time.perf_counter()
            await rt.checkpoint()
            latencies.append((time.perf_counter() - started) * 1e3)
    return latencies[10:]


async def _raw_latencies(path: str, n: int) -> list[float]:
    latencies = []
    async with aiosqlite.connect(path, isolation_level=None) as db:
        await db.execute("PRAGMA journal_mode=WAL")
        await db.execute("PRAGMA synchronous=FULL")
        await db.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v TEXT, e INTEGER)")
        for epoch in range(n + 10):
            rows = [(f"k{i}", str(epoch), epoch) for i in range(3)]
            started = time.perf_counter()
            await db.execute("BEGIN IMMEDIATE")
            await db.executemany(
                "INSERT INTO t VALUES (?, ?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v",
                rows,
            )
            await db.execute("COMMIT")
            latencies.append((time.perf_counter() - started) * 1e3)
    return latencies[10:]


def _measure(settings: Settings) -> tuple[list[float], list[float]]:
    n = 200 if settings.quick else 500
    with tempfile.TemporaryDirectory() as tmp:
        graph = anyio.run(_graph_latencies, os.path.join(tmp, "state.db"), n)
        raw = anyio.run(_raw_latencies, os.path.join(tmp, "raw.db"), n)
    return graph, raw


_cache: dict[bool, tuple[list[float], list[float]]] = {}


def _latencies(settings: Settings) -> tuple[list[float], list[float]]:
    if settings.quick not in _cache:
        _cache[settings.quick] = _measure(settings)
    return _cache[settings.quick]


def _record(name: str, q: float, goal: str) -> Callable[[Settings], dict[str, Any]]:
    def run(settings: Settings) -> dict[str, Any]:
        graph, raw = _latencies(settings)
        return make_record(
            name,
            _percentile(graph, q),
            "ms",
            _percentile(raw, q),
            goal,
            goal_on="value",
            details={
                "checkpoints": len(graph),
                "graph": "push source -> 3 stateful stages, 100 rows per checkpoint",
                "baseline_impl": "raw aiosqlite WAL commit of the same writes",
                "graph_mean_ms": round(statistics.fmean(graph), 4),
            },
        )

    return run


BENCHMARKS: dict[str, Callable[[Settings], dict[str, Any]]] = {
    "checkpoint_latency_p50_ms": _record("checkpoint_latency_p50_ms", 0.50, "<= 2"),
    "checkpoint_latency_p99_ms": _record("checkpoint_latency_p99_ms", 0.99, "<= 10"),
}
