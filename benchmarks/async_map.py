"""The async_map benchmark: many slow calls in flight against their ideal rate.

``async_map_rows_per_s`` — a push source → ``async_map`` (concurrency :data:`CONCURRENCY`,
ordered) → an actor counting rows, in a runtime on asyncio; the function is a fake service
answering each row after :data:`LATENCY` s (``anyio.sleep``). ``n`` rows are pushed in chunks of
:data:`CHUNK_ROWS`, then a checkpoint (the drain of the last calls included); checked: every
row counted, in order. The value is rows/s, the median of the repetitions.

**Baseline: the ideal rate ``concurrency / latency`` (25,600 rows/s), not a measurement** — as
the job-latency benchmark's barrier interval — so the ratio reads "the share of the ideal the
window achieves", and the goal ``>= 0.8`` on it says the operator's own cost (reading rows,
starting calls, assembling results, drains) keeps the window at least 80 % full. ``details``
give the other two comparisons of the issue, measured in the same process:

* ``sequential_rows_per_s``: the same calls one after the other in a plain loop (``await
  fn(row)`` per row) — about ``1 / latency``; ``vs_sequential`` is the value over it (goal
  ``>= 50``, in ``vs_sequential_meets_goal``);
* ``spark_pandas_udf_rows_per_s``: the same latency paid synchronously in a Spark pandas UDF
  (``time.sleep(latency)`` per row, as a blocking client would), over
  :data:`SPARK_ROWS` rows in a local ``local[2]`` session (two tasks at a time) — skipped
  with ``--quick`` (Spark's start alone takes longer than the budget) or when Spark is not
  installed, and then ``spark_note`` says why;
* ``bare_pool_rows_per_s``: the ceiling of the event loop itself — :data:`CONCURRENCY` anyio
  tasks each awaiting the same calls (each under ``move_on_after``, as ``async_map``'s timeout)
  in a loop, no runtime: asyncio's timers fire up to a millisecond late and the loop's own
  work per call counts, so this is below the ideal too; ``vs_bare_pool`` is the value over it;
* the same graph on trio (``trio_rows_per_s``).
"""

from __future__ import annotations

import importlib
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any, ClassVar

import anyio
import pyarrow as pa

from barrierflow.channels import Chunk, Message
from barrierflow.operators.async_map import async_map
from barrierflow.runtime import ActorContext, Runtime, RuntimeConfig, StreamActor
from benchmarks.harness import Settings, make_record, median, rounded, samples

__all__ = ["BENCHMARKS"]

#: The fake service's latency (seconds) and the calls in flight: the issue's figures.
LATENCY = 0.01
CONCURRENCY = 256
#: Rows per pushed chunk.
CHUNK_ROWS = 1024
#: Rows through the Spark pandas UDF (20 s of sleeps, on two cores ~10 s).
SPARK_ROWS = 2000

INPUT = pa.schema([("user", pa.int64())])
OUTPUT = pa.schema([("user", pa.int64()), ("score", pa.int64())])


async def _service(row: dict[str, Any]) -> dict[str, Any]:
    """The fake service: one row's answer after :data:`LATENCY` seconds."""
    await anyio.sleep(LATENCY)
    return {"user": row["user"], "score": row["user"] * 2}


class _Count(StreamActor):
    rows: ClassVar[int] = 0
    last: ClassVar[int] = -1
    ordered: ClassVar[bool] = True

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk) and message.num_rows:
            users = message.batch["user"]
            first = users[0].as_py()
            # Ordered output: each chunk continues where the last ended.
            _Count.ordered = _Count.ordered and first == _Count.last + 1
            _Count.last = users[-1].as_py()
            _Count.rows += message.num_rows
        await ctx.emit(message)


def _graph_rates(rows: int, reps: int, backend: str) -> list[float]:
    """rows/s of ``reps`` runs of ``rows`` rows through the graph (after one warm-up)."""
    chunks = [
        Chunk(pa.record_batch([pa.array(range(i, min(i + CHUNK_ROWS, rows)), pa.int64())], INPUT))
        for i in range(0, rows, CHUNK_ROWS)
    ]

    async def measure() -> list[float]:
        rates: list[float] = []
        with tempfile.TemporaryDirectory() as tmp:
            rt = Runtime(RuntimeConfig(state_path=os.path.join(tmp, "s.db"), barrier_interval=3600))
            rt.add_source("events")
            rt.add_actor(
                "enrich",
                async_map(_service, schema=OUTPUT, concurrency=CONCURRENCY),
                inputs=["events"],
            )
            rt.add_actor("count", _Count, inputs=["enrich"])
            async with rt:
                for rep in range(reps + 1):
                    _Count.rows, _Count.last, _Count.ordered = 0, -1, True
                    started = time.perf_counter()
                    for chunk in chunks:
                        await rt.push("events", chunk)
                    await rt.checkpoint()  # every call answered and emitted
                    elapsed = time.perf_counter() - started
                    if _Count.rows != rows or not _Count.ordered:
                        raise AssertionError(f"counted {_Count.rows} of {rows} rows, in order?")
                    if rep:  # the first run warms up
                        rates.append(rows / elapsed)
        return rates

    return anyio.run(measure, backend=backend)


def _sequential_rate(rows: int) -> float:
    """rows/s of the same calls awaited one after the other."""

    async def loop() -> float:
        started = time.perf_counter()
        for user in range(rows):
            await _service({"user": user})
        return rows / (time.perf_counter() - started)

    return anyio.run(loop)


def _bare_pool_rate(rows: int) -> float:
    """rows/s of :data:`CONCURRENCY` bare tasks making the calls, each under a timeout."""

    async def pool() -> float:
        users = iter(range(rows))

        async def worker() -> None:
            for user in users:
                with anyio.move_on_after(30):
                    await _service({"user": user})

        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(CONCURRENCY):
                tg.start_soon(worker)
        return rows / (time.perf_counter() - started)

    return anyio.run(pool)


def _spark_rate(quick: bool) -> tuple[float | None, str]:
    """rows/s of a Spark pandas UDF sleeping :data:`LATENCY` per row, or why not measured."""
    if quick:
        return None, "skipped with --quick (Spark's start-up exceeds the budget)"
    try:
        # Imported by name: neither ships type stubs, and neither is needed with --quick.
        pd: Any = importlib.import_module("pandas")
        functions: Any = importlib.import_module("pyspark.sql.functions")
        from barrierflow.spark_bridge import spark_session
    except ImportError as exc:
        return None, f"skipped: Spark not available ({exc})"

    def sleepy(users: Any) -> Any:
        out = []
        for user in users:
            time.sleep(LATENCY)  # a blocking client's call
            out.append(user * 2)
        return pd.Series(out)

    # Spark reads the kind of pandas UDF from the annotations (Series to Series: scalar).
    sleepy.__annotations__ = {"users": pd.Series, "return": pd.Series}
    spark = spark_session()
    score = functions.pandas_udf(sleepy, "long")
    df = spark.range(SPARK_ROWS).withColumnRenamed("id", "user").repartition(2).cache()
    df.count()
    started = time.perf_counter()
    total = df.select(score("user").alias("score")).groupBy().sum("score").collect()[0][0]
    elapsed = time.perf_counter() - started
    if total != SPARK_ROWS * (SPARK_ROWS - 1):
        raise AssertionError(f"Spark's UDF summed {total}")
    parallelism = spark.sparkContext.defaultParallelism
    return SPARK_ROWS / elapsed, f"{SPARK_ROWS} rows, 2 partitions, local[{parallelism}]"


def async_map_rows_per_s(settings: Settings) -> dict[str, Any]:
    ideal = CONCURRENCY / LATENCY
    rows = int(ideal * (0.4 if settings.quick else 2.0))  # one run ≈ 0.4 s / 2 s
    reps = 3 if settings.quick else 5
    rates = _graph_rates(rows, reps, "asyncio")
    trio = _graph_rates(rows, max(1, reps // 2), "trio")
    sequential = _sequential_rate(20 if settings.quick else 100)
    bare = median([_bare_pool_rate(rows) for _ in range(reps)])
    spark, note = _spark_rate(settings.quick)
    value = median(rates)
    details: dict[str, Any] = {
        "rows": rows,
        "latency_s": LATENCY,
        "concurrency": CONCURRENCY,
        "chunk_rows": CHUNK_ROWS,
        "baseline_impl": "the ideal concurrency / latency, not a measurement",
        "graph": "push source -> async_map(ordered) -> count (asyncio)",
        "samples": samples(rates),
        "trio_rows_per_s": rounded(median(trio)),
        "bare_pool_rows_per_s": rounded(bare),
        "vs_bare_pool": rounded(value / bare),
        "sequential_rows_per_s": rounded(sequential),
        "vs_sequential": rounded(value / sequential),
        "vs_sequential_goal": ">= 50",
        "vs_sequential_meets_goal": value / sequential >= 50,
        "spark_pandas_udf_rows_per_s": rounded(spark),
        "vs_spark_pandas_udf": None if spark is None else rounded(value / spark),
        "spark_note": note,
    }
    return make_record("async_map_rows_per_s", value, "rows/s", ideal, ">= 0.8", details=details)


BENCHMARKS: dict[str, Callable[[Settings], dict[str, Any]]] = {
    "async_map_rows_per_s": async_map_rows_per_s,
}
