"""The demo pipeline: a Spark Structured Streaming query, exactly once into an Iceberg table.

``barrierflow demo`` (the README's first command) runs, on embedded defaults only — local
Spark, the SQLite state store, local files under ``--workdir``::

    Parquet files of events (key, value)                       generated in <workdir>/input
      → Spark readStream (one file per micro-batch, availableNow)
      → SparkBridge (toArrow, bounded feed, checkpoint per micro-batch)
      → hash dispatch by key → 4 parallel SinkWriters (Iceberg data files)
      → Coordinator → one Iceberg snapshot per epoch               <workdir>/warehouse

It shows live progress, then reads the table back and verifies it: every key Spark sent is in
the table exactly once. Its last line is machine-readable:
``VERIFIED rows_in=N rows_out=N duplicates=0 epochs=K`` (or ``FAILED`` with the same fields).

``--crash-after N`` SIGKILLs the driver during micro-batch ``N`` of the run (by default while
the batch's rows are being written: ``--crash-point mid-batch``; also ``after-checkpoint``,
between the batch's durable checkpoint and Spark's own commit, and ``mid-commit``, after the
Iceberg commit and before the coordinator records it). ``--resume`` continues from the state
left behind (the runtime's checkpoint, Spark's checkpoint, the table): Spark replays the batch
it had not committed, the bridge skips it if it was durable, the coordinator re-commits or
aborts what was pending, and the final verification still shows every row exactly once.
(After a restart Spark may plan the files left into fewer, larger micro-batches; ``epochs``
counts the epochs that hold rows, one per micro-batch.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import os
import shutil
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from barrierflow.actors import (
    BatchFeed,
    CommitCoordinator,
    CommitMetadata,
    Coordinator,
    IcebergSink,
    SchemaChange,
    SinkWriter,
    open_local_catalog,
)
from barrierflow.errors import ConfigError
from barrierflow.runtime import BlockingRuntime, Fanout, Runtime, RuntimeConfig
from barrierflow.spark_bridge import SparkBridge, spark_session

__all__ = ["SCHEMA", "CrashPoint", "DemoConfig", "DemoResult", "run_demo"]

#: The events: a unique key (hash-dispatched, checked for duplicates) and a value.
SCHEMA = pa.schema([("key", pa.int64()), ("value", pa.float64())])
WRITERS = 4
TABLE = "demo.events"

CrashPoint = Literal["mid-batch", "after-checkpoint", "mid-commit"]
CRASH_POINTS: tuple[CrashPoint, ...] = ("mid-batch", "after-checkpoint", "mid-commit")


@dataclass(frozen=True)
class DemoConfig:
    """What the demo runs (see the module docstring).

    Raises:
        ConfigError: a size is not a positive int, or a crash point is unknown.
    """

    workdir: Path = Path("demo-data")
    rows: int = 1_000_000
    batches: int = 20
    backend: Literal["asyncio", "trio"] = "asyncio"
    spark_master: str | None = None
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    crash_after: int | None = None
    crash_point: CrashPoint = "mid-batch"
    resume: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        for name in ("rows", "batches"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ConfigError(name, "an int >= 1", value)
        if self.rows < self.batches:
            raise ConfigError("rows", f"at least one row per batch ({self.batches})", self.rows)
        if self.crash_after is not None and (
            type(self.crash_after) is not int or self.crash_after < 0
        ):
            raise ConfigError("crash_after", "None or an int >= 0", self.crash_after)
        if self.crash_point not in CRASH_POINTS:
            raise ConfigError("crash_point", f"one of {CRASH_POINTS}", self.crash_point)
        if self.backend not in ("asyncio", "trio"):
            raise ConfigError("backend", "'asyncio' or 'trio'", self.backend)


@dataclass(frozen=True)
class DemoResult:
    """What the demo verified, read back from the table."""

    rows_in: int
    rows_out: int
    duplicates: int
    missing: int
    epochs: int
    batches_this_run: int
    seconds: float
    #: Why the run failed (the query or the runtime), if it did.
    error: str | None = None

    @property
    def verified(self) -> bool:
        """The run finished and every key Spark sent is in the table exactly once."""
        return (
            self.error is None
            and self.rows_in == self.rows_out
            and self.duplicates == 0
            and self.missing == 0
        )

    def summary_line(self) -> str:
        """The machine-readable last line: ``VERIFIED ...`` or ``FAILED ...``."""
        word = "VERIFIED" if self.verified else "FAILED"
        return (
            f"{word} rows_in={self.rows_in} rows_out={self.rows_out} "
            f"duplicates={self.duplicates} epochs={self.epochs}"
        )


def generate_input(directory: Path, rows: int, files: int) -> None:
    """Write ``files`` Parquet files of events with keys ``0 .. rows-1`` (each file written
    under a temporary name and renamed, so Spark never sees half a file)."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    bounds = np.linspace(0, rows, files + 1, dtype=np.int64)
    for index, (start, stop) in enumerate(itertools.pairwise(bounds)):
        keys = rng.permutation(np.arange(start, stop, dtype=np.int64))
        table = pa.table({"key": keys, "value": rng.random(len(keys))}, schema=SCHEMA)
        temporary = directory / f".part-{index:05d}.parquet.tmp"
        pq.write_table(table, temporary)
        temporary.rename(directory / f"part-{index:05d}.parquet")


def _kill_self(where: str) -> None:
    print(f"CRASH {where}: SIGKILL of the driver", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


class _Faults:
    """The demo's crash switch: armed for one micro-batch of this run."""

    def __init__(self, config: DemoConfig) -> None:
        self.after = config.crash_after
        self.point = config.crash_point
        self.batches = 0
        self.armed = False

    def begin_batch(self) -> None:
        # A mid-commit crash stays armed: the batch's commit runs after its checkpoint, maybe
        # once the next batch has begun.
        sticky = self.armed and self.point == "mid-commit"
        self.armed = sticky or (self.after is not None and self.batches == self.after)

    def end_batch(self) -> None:
        if self.armed and self.point == "after-checkpoint":
            _kill_self("after the batch's checkpoint, before Spark's commit")
        self.batches += 1


class _CrashingWriter:
    """A sink connector that kills the process on its first write of the armed batch."""

    def __init__(self, inner: Any, faults: _Faults) -> None:
        self._inner = inner
        self._faults = faults

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def write_batch(self, batch: pa.RecordBatch) -> None:
        await self._inner.write_batch(batch)
        if self._faults.armed and self._faults.point == "mid-batch":
            _kill_self("mid-batch, rows written but not committed")


class _CrashingCommitter:
    """The Iceberg committer, killing the process after the armed batch's Iceberg commit and
    before the coordinator records it committed."""

    def __init__(self, inner: CommitCoordinator, faults: _Faults) -> None:
        self._inner = inner
        self._faults = faults
        self.two_phase = inner.two_phase

    async def init(self, pending: Mapping[int, CommitMetadata | None]) -> None:
        await self._inner.init(pending)

    async def commit_data(self, epoch: int, metadatas: Sequence[CommitMetadata]) -> None:
        await self._inner.commit_data(epoch, metadatas)

    async def pre_commit(
        self, epoch: int, metadatas: Sequence[CommitMetadata], schema_change: SchemaChange | None
    ) -> CommitMetadata | None:
        return await self._inner.pre_commit(epoch, metadatas, schema_change)

    async def commit(
        self, epoch: int, metadata: CommitMetadata | None, schema_change: SchemaChange | None
    ) -> None:
        await self._inner.commit(epoch, metadata, schema_change)
        if self._faults.armed and self._faults.point == "mid-commit" and metadata is not None:
            _kill_self("mid-commit, Iceberg committed, the commit not yet recorded")

    async def abort(self, epoch: int, metadata: CommitMetadata | None) -> None:
        await self._inner.abort(epoch, metadata)


def build_runtime(workdir: Path, faults: _Faults) -> tuple[Runtime, BatchFeed, Coordinator, Any]:
    """The demo's graph: batch source → hash by key → 4 Iceberg writers + their coordinator."""
    catalog = open_local_catalog(workdir / "warehouse")
    sink = IcebergSink(catalog, TABLE, SCHEMA)
    coordinator = Coordinator("events", _CrashingCommitter(sink.committer(), faults))
    feed = BatchFeed(SCHEMA, chunk_rows=16_384, capacity=8)
    # With recovery, a transient failure rebuilds the graph and the bridge re-delivers the batch.
    config = RuntimeConfig(state_path=workdir / "state.db", barrier_interval=1.0, recovery=True)
    rt = Runtime(config)
    rt.add_source("events", feed.source, fanout=Fanout("hash", ("key",)))
    rt.add_service("coordinator", coordinator)

    def writer(i: int) -> SinkWriter:
        def connector() -> Any:
            return _CrashingWriter(sink.writer(str(i)), faults)

        return SinkWriter(connector, coordinator=coordinator)

    for i in range(WRITERS):
        rt.add_actor(f"writer{i}", functools.partial(writer, i), inputs=["events"])
    return rt, feed, coordinator, sink


def verify(sink: Any, rows_in: int, batches: int, seconds: float) -> DemoResult:
    """Read the table back: rows, duplicate keys, missing keys, epochs committed."""
    table = sink.table()
    keys = table.scan(selected_fields=("key",)).to_arrow()["key"].to_numpy()
    unique = np.unique(keys)
    expected = np.arange(rows_in, dtype=np.int64)
    missing = len(np.setdiff1d(expected, unique, assume_unique=True))
    files = table.inspect.files()["file_path"].to_pylist()
    epochs = {Path(path).parent.parent.name for path in files}
    return DemoResult(
        rows_in=rows_in,
        rows_out=len(keys),
        duplicates=len(keys) - len(unique),
        missing=missing,
        epochs=len(epochs),
        batches_this_run=batches,
        seconds=seconds,
    )


def _spark_schema() -> Any:
    from pyspark.sql.types import DoubleType, LongType, StructField, StructType

    return StructType([StructField("key", LongType()), StructField("value", DoubleType())])


def run_demo(config: DemoConfig) -> DemoResult:
    """Run the demo once (see the module docstring) and verify the table."""
    started = time.perf_counter()
    workdir = config.workdir.resolve()
    input_dir = workdir / "input"
    if not config.resume:
        shutil.rmtree(workdir, ignore_errors=True)
        generate_input(input_dir, config.rows, config.batches)
    elif not input_dir.exists():
        raise ConfigError("resume", f"a previous run's state in {workdir}", "nothing there")
    rows_in = pq.ParquetDataset(str(input_dir)).read(columns=["key"]).num_rows
    spark = spark_session("barrierflow-demo", master=config.spark_master, conf=config.spark_conf)
    faults = _Faults(config)
    rt, feed, coordinator, sink = build_runtime(workdir, faults)
    stream = (
        spark.readStream.schema(_spark_schema())
        .option("maxFilesPerTrigger", 1)
        .parquet(str(input_dir))
    )
    error: str | None = None
    try:
        with BlockingRuntime(rt, backend=config.backend) as handle:
            bridge = SparkBridge(handle, feed, stream="events-query")

            def callback(df: Any, batch_id: int) -> None:
                faults.begin_batch()
                bridge.callback(df, batch_id)
                faults.end_batch()

            query = (
                stream.writeStream.foreachBatch(callback)
                .option("checkpointLocation", str(workdir / "spark-checkpoint"))
                .trigger(availableNow=True)
                .start()
            )
            from pyspark.errors import StreamingQueryException

            with contextlib.suppress(StreamingQueryException):  # read just below
                _follow(query, bridge, coordinator, feed, config.progress)
            failure = query.exception()
            if failure is not None:
                error = "the streaming query failed: " + str(failure).strip().splitlines()[0]
    except Exception as exc:  # the runtime failed: still read back what the table holds
        error = error or f"{type(exc).__name__}: {exc}"
    result = verify(sink, rows_in, faults.batches, time.perf_counter() - started)
    return dataclasses.replace(result, error=error)


def _follow(
    query: Any, bridge: SparkBridge, coordinator: Coordinator, feed: BatchFeed, show: bool
) -> None:
    """Wait for the query to finish, showing live progress."""
    if not show:
        query.awaitTermination()
        return
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    started = time.perf_counter()

    def render() -> Table:
        stats, feed_stats, coordinator_stats = bridge.stats(), feed.stats(), coordinator.stats()
        elapsed = max(time.perf_counter() - started, 1e-9)
        table = Table(title="barrierflow demo: Spark → bridge → 4 writers → Iceberg")
        for column in (
            "rows in",
            "batches",
            "replays skipped",
            "epochs committed",
            "rows/s",
            "backpressure (s)",
        ):
            table.add_column(column, justify="right")
        table.add_row(
            f"{stats.rows:,}",
            str(stats.batches),
            str(stats.replays_skipped),
            str(coordinator_stats.committed_epochs),
            f"{stats.rows / elapsed:,.0f}",
            f"{feed_stats.blocked_seconds:.2f}",
        )
        return table

    with Live(render(), console=Console(file=sys.stderr), refresh_per_second=4) as live:
        while not query.awaitTermination(0.25):
            live.update(render())
        live.update(render())
    sys.stderr.write("\n")
