"""What watching a pipeline costs: a pass-through graph with its metrics endpoint on and
scraped, against the same graph without one.

``metrics_pass_through_rows_per_s`` — candidate: a runtime with
``RuntimeConfig(metrics_port=0)`` whose graph is a push source and three forwarding stages
(4,096-row chunks pushed nonstop, a checkpoint every 64 chunks), while a thread scrapes its
``/metrics`` every 0.5 s (thirty times Prometheus's default rate). A scrape costs about 0.5 ms
of the event loop (the snapshot) and 3 ms of the scraping thread. Baseline: the
same graph in the same process with no endpoint. A fresh runtime per side and repetition
(started untimed); the sides alternate; medians. Goal: ratio >= 0.97 (metrics on cost at most
3 %).
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread
import pyarrow as pa

from barrierflow.channels import Chunk, Message
from barrierflow.runtime import ActorContext, Runtime, RuntimeConfig, StreamActor
from benchmarks.harness import Settings, make_record, median, paired_ratio, samples

__all__ = ["BENCHMARKS"]

ROWS = 4096
CHUNKS = 8192
CHECKPOINT_EVERY = 64
#: Seconds between scrapes: Prometheus's default is 15 s, 1 s is a busy dashboard.
SCRAPE_EVERY = 0.5


class _Forward(StreamActor):
    async def process(self, message: Message, ctx: ActorContext) -> None:
        await ctx.emit(message)


async def _run(path: str, metrics: bool, scrapes: list[int]) -> float:
    rt = Runtime(
        RuntimeConfig(state_path=path, barrier_interval=3600.0, metrics_port=0 if metrics else None)
    )
    rt.add_source("src")
    rt.add_actor("s1", _Forward, inputs=["src"])
    rt.add_actor("s2", _Forward, inputs=["s1"])
    rt.add_actor("s3", _Forward, inputs=["s2"])
    chunk = Chunk(pa.record_batch({"id": pa.array(range(ROWS), pa.int64())}))
    stop = threading.Event()

    def scraper(url: str) -> None:
        while not stop.wait(SCRAPE_EVERY):
            with urllib.request.urlopen(url, timeout=10) as response:
                response.read()
            scrapes[0] += 1

    async with rt:
        thread = None
        if metrics:
            assert rt.metrics_url is not None
            thread = threading.Thread(target=scraper, args=(rt.metrics_url,), daemon=True)
            thread.start()
        started = time.perf_counter()
        for i in range(CHUNKS):
            await rt.push("src", chunk)
            if i % CHECKPOINT_EVERY == CHECKPOINT_EVERY - 1:
                await rt.checkpoint()
        await rt.checkpoint()
        elapsed = time.perf_counter() - started
        stop.set()
        if thread is not None:
            await anyio.to_thread.run_sync(thread.join)
    return ROWS * CHUNKS / elapsed


def metrics_pass_through_rows_per_s(settings: Settings) -> dict[str, Any]:
    reps = 3 if settings.quick else 5
    ours: list[float] = []
    theirs: list[float] = []
    scrapes = [0]
    with tempfile.TemporaryDirectory() as tmp:
        runs = iter(range(1 << 30))

        def side(metrics: bool) -> float:
            path = os.path.join(tmp, f"run-{next(runs)}.db")
            return anyio.run(_run, path, metrics, scrapes, backend="asyncio")

        side(True), side(False)  # warm-up
        scrapes[0] = 0
        for i in range(reps):
            order = (True, False) if i % 2 == 0 else (False, True)
            for metrics in order:
                (ours if metrics else theirs).append(side(metrics))
    return make_record(
        "metrics_pass_through_rows_per_s",
        median(ours),
        "rows/s",
        median(theirs),
        ">= 0.97",
        details={
            "backend": "asyncio",
            "graph": "push source -> 3 forwarding stages, 4,096-row chunks, a checkpoint "
            "every 64 chunks",
            "rows_per_run": ROWS * CHUNKS,
            "runs": len(ours),
            "scrapes_during_timed_runs": scrapes[0],
            "samples": samples(ours),
            "baseline_samples": samples(theirs),
            "paired_ratio": paired_ratio(ours, theirs),
            "baseline_impl": "the same graph, same process, no metrics endpoint",
        },
    )


#: Every benchmark of this module, by name, in run order.
BENCHMARKS: dict[str, Callable[[Settings], dict[str, Any]]] = {
    "metrics_pass_through_rows_per_s": metrics_pass_through_rows_per_s,
}
