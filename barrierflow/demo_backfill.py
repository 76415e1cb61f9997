"""The demo's second act: a job joins a running pipeline and still gets the history.

``barrierflow demo backfill`` runs, on a real Valkey/Redis server (started in ``--workdir``
from the ``valkey-server`` the lock file installs, or an existing one with ``--redis-url``)::

    4 streams of events (key, value), history written before the pipeline starts
      → SplitSource "events" (the live source; its offsets in the state store)
      → job "live": an exactly-once Parquet table of what arrives live   <workdir>/live
    a producer keeps appending to every stream while, mid-run,
      → job "history" joins: SourceBackfill → exactly-once Parquet table <workdir>/history

The history job reads each stream's history with its own reader while the live source keeps
flowing, and merges the two per stream so that each record reaches it once. At the end the
``history`` table is checked against the streams themselves (``XRANGE``): every record of every
stream exactly once — history and live. The last line is machine-readable:
``VERIFIED streams=S records=N rows=N duplicates=0 missing=0`` (or ``FAILED`` with the same
fields).
"""

from __future__ import annotations

import functools
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import anyio
import anyio.to_thread
import pyarrow as pa
import pyarrow.dataset as ds
import redis

from barrierflow.actors import SourceBackfill, SplitSource, add_sink
from barrierflow.actors.sources.split_log import (
    OFFSET_MAJOR,
    OFFSET_MINOR,
    SPLIT_COLUMN,
    split_log_schema,
)
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.connectors import ParquetFileSink, RedisStreamLog
from barrierflow.runtime import Job, Runtime, RuntimeConfig

__all__ = ["BackfillDemoConfig", "BackfillDemoResult", "run_backfill_demo"]

PAYLOAD = pa.schema([pa.field("key", pa.int64(), nullable=False), ("value", pa.int64())])
#: Records the producer appends per stream in one round.
_ROUND = 1_000


@dataclass(frozen=True, slots=True)
class BackfillDemoConfig:
    """What the second act is asked to do.

    Raises:
        InvalidArgumentError: a count out of range.
    """

    workdir: Path
    streams: int = 4
    #: Records per stream written before the pipeline starts.
    history: int = 50_000
    #: Records per stream appended while the pipeline runs.
    live: int = 20_000
    backend: Literal["asyncio", "trio"] = "asyncio"
    #: An existing server (``redis://host:port/db``); ``None`` starts one in ``workdir``.
    redis_url: str | None = None

    def __post_init__(self) -> None:
        for name, value, low in (("streams", self.streams, 1), ("history", self.history, 0)):
            if type(value) is not int or not low <= value <= 10_000_000:
                raise InvalidArgumentError(name, f"an int in {low}..10,000,000", value)
        if type(self.live) is not int or not 0 <= self.live <= 10_000_000:
            raise InvalidArgumentError("live", "an int in 0..10,000,000", self.live)
        if self.backend not in ("asyncio", "trio"):
            raise InvalidArgumentError("backend", "'asyncio' or 'trio'", self.backend)


@dataclass(frozen=True, slots=True)
class BackfillDemoResult:
    """What the check of the history table found."""

    streams: int
    records: int
    rows: int
    duplicates: int
    missing: int
    seconds: float

    @property
    def verified(self) -> bool:
        """Every record of every stream is in the history table exactly once."""
        return self.rows == self.records and self.duplicates == 0 and self.missing == 0

    def summary_line(self) -> str:
        """The machine-readable last line."""
        word = "VERIFIED" if self.verified else "FAILED"
        return (
            f"{word} streams={self.streams} records={self.records} rows={self.rows} "
            f"duplicates={self.duplicates} missing={self.missing}"
        )


def run_backfill_demo(config: BackfillDemoConfig) -> BackfillDemoResult:
    """Run the second act in a fresh ``workdir`` and check its history table (see the module)."""
    if not isinstance(config, BackfillDemoConfig):
        raise InvalidArgumentError("config", "a BackfillDemoConfig", type(config).__name__)
    shutil.rmtree(config.workdir, ignore_errors=True)
    config.workdir.mkdir(parents=True)
    started = time.monotonic()
    with _server(config) as url:
        client = redis.Redis.from_url(url, protocol=2)
        try:
            keys = [f"demo:events:{i}" for i in range(config.streams)]
            client.delete(*keys)
            _append(client, keys, config.history, first_key=0)
            anyio.run(_pipeline, config, url, keys, backend=config.backend)
            return _verify(config, client, keys, time.monotonic() - started)
        finally:
            client.close()


@contextmanager
def _server(config: BackfillDemoConfig) -> Iterator[str]:
    if config.redis_url is not None:
        yield config.redis_url
        return
    from barrierflow.testing.redis_server import RedisServer

    server = RedisServer(config.workdir / "valkey")
    server.directory.mkdir(parents=True, exist_ok=True)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


def _append(client: redis.Redis, keys: list[str], count: int, *, first_key: int) -> None:
    """``count`` records on every stream, keys numbered from ``first_key`` (one pipeline)."""
    pipe = client.pipeline(transaction=False)
    for stream, key in enumerate(keys):
        for i in range(count):
            pipe.xadd(key, {"key": (first_key + i) * len(keys) + stream, "value": i})
            if len(pipe) >= 10_000:
                pipe.execute()
    pipe.execute()


async def _pipeline(config: BackfillDemoConfig, url: str, keys: list[str]) -> None:
    """The live job from the start; the history job added mid-run, while records arrive."""
    schema = split_log_schema(PAYLOAD)
    workdir = config.workdir
    log = RedisStreamLog(url, payload=PAYLOAD, splits=keys, block_ms=100)
    rt = Runtime(RuntimeConfig(state_path=workdir / "state.db", barrier_interval=0.2))
    rt.add_source("events", lambda: SplitSource(log, batch_rows=4096))
    add_sink(rt, "live", lambda: ParquetFileSink(workdir / "live", schema), input="events")
    producer = redis.Redis.from_url(url, protocol=2)
    async with log, rt:
        done = anyio.Event()

        async def produce() -> None:
            appended = 0
            while appended < config.live:
                count = min(_ROUND, config.live - appended)
                first = config.history + appended
                await anyio.to_thread.run_sync(
                    functools.partial(_append, producer, keys, count, first_key=first)
                )
                appended += count
                await anyio.sleep(0.01)
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(produce)
            await rt.checkpoint()  # the live job is under way
            history = Job("history")
            history.add_actor(
                "backfill", lambda: SourceBackfill(log), inputs={"upstream": "events"}
            )
            add_sink(
                history,
                "history_out",
                lambda: ParquetFileSink(workdir / "history", schema),
                input="backfill",
            )
            handle = await rt.add_job(history)
            await handle.wait_ready()
            await done.wait()
        total = (config.history + config.live) * len(keys)
        # The live source reads to the end; the backfill's splits all finish behind it.
        while rt.stats().actors["events"].rows_out < total:
            await rt.checkpoint()
        await rt.checkpoint()
    producer.close()


def _verify(
    config: BackfillDemoConfig, client: redis.Redis, keys: list[str], seconds: float
) -> BackfillDemoResult:
    """Compare the history table with the streams (``XRANGE``): one row per record."""
    expected: set[tuple[str, int, int]] = set()
    for key in keys:
        entries = cast(list[tuple[bytes, Any]], client.xrange(key))
        for entry_id, _fields in entries:
            major, minor = entry_id.decode().split("-")
            expected.add((key, int(major), int(minor)))
    table = ds.dataset(config.workdir / "history", split_log_schema(PAYLOAD), format="parquet")
    rows = table.to_table(columns=[SPLIT_COLUMN, OFFSET_MAJOR, OFFSET_MINOR])
    unique = rows.group_by([SPLIT_COLUMN, OFFSET_MAJOR, OFFSET_MINOR]).aggregate([])
    found = set(
        zip(
            unique[SPLIT_COLUMN].to_pylist(),
            unique[OFFSET_MAJOR].to_pylist(),
            unique[OFFSET_MINOR].to_pylist(),
            strict=True,
        )
    )
    return BackfillDemoResult(
        streams=len(keys),
        records=len(expected),
        rows=rows.num_rows,
        duplicates=rows.num_rows - unique.num_rows,
        missing=len(expected - found),
        seconds=seconds,
    )
