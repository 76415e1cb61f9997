"""The demo's second act: a job joins a running pipeline and still gets the history.

``barrierflow demo backfill`` runs, on a real Valkey/Redis server (started in ``--workdir``
from the ``valkey-server`` the lock file installs, or an existing one with ``--redis-url``)::

    4 streams of events (key, value), history written before the pipeline starts
      → SplitSource "events" (the live source; its offsets in the state store)
      → job "live": an exactly-once Parquet table of what arrives live   <workdir>/live
    a producer keeps appending to every stream while, mid-run,
      → job "history" joins: SourceBackfill → exactly-once Parquet table <workdir>/history

The history job reads each stream's history with its own reader while the live source keeps
flowing, and merges the two per stream so that each record reaches it once. The live source
is declared with the stream keys and ``wait_for_splits=True``: a stream the producer has not
created yet (``--history 0``) is read from its first record once it exists, by the live job
and by the history job alike (rule 10 of :mod:`barrierflow.actors.sources.split_source`).

At the end **every table the act writes** — ``live`` and ``history`` — is checked against the
streams themselves (``XRANGE``): each must hold every record of every stream exactly once (the
live source reads each stream from its first record, so the live table has the history too).
The last line is machine-readable:
``VERIFIED streams=S records=N live=N history=N duplicates=0 missing=0`` — ``live`` and
``history`` are each table's rows, ``duplicates`` and ``missing`` the sums over both tables
(or ``FAILED`` with the same fields).

**Crash and resume.** ``--crash-after N`` SIGKILLs the driver (the runtime, its actors and the
producer) once the history job is durable (the checkpoint after its ``Add``) and the producer
has appended ``N`` more rounds (``0``: at once, while the job is still backfilling). It prints
``CRASH ...`` and the command that resumes. ``--resume`` continues the run started in the
work directory (its sizes are the started run's, from ``demo-backfill.json``; other sizes are
refused):

* the server the demo started keeps running after the driver died (a log outlives its
  readers); the resume kills it and starts it again on the same directory, where its
  append-only file (fsynced on every write) holds every record appended before the crash;
* the runtime restarts from the last checkpoint: the job ``history`` is declared again if the
  state store's job catalog holds it (its backfill resumes from its committed split states),
  else — a crash before its ``Add`` became durable — it joins again as in a new run;
* the producer tops every stream up to the run's size (a record is numbered by its position in
  its stream, so none is written twice); a stream it had not created before the crash is read
  from its first record once it exists, by both jobs (the live source waits for it).

The record each stream ends with is the same either way, and so is the check.
"""

from __future__ import annotations

import json
import shutil
import time
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
from barrierflow.app._demo_backfill_streams import (
    MANIFEST,
    Manifest,
    Producer,
    server,
    stop_left_behind,
    top_up,
)
from barrierflow.app._demo_faults import kill_self
from barrierflow.app._demo_progress import show_job_progress
from barrierflow.app._demo_runs import resume_command as resume_words
from barrierflow.app._trace import TracedTable, follow_job, trace, tracing
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.connectors import ParquetTable, RedisStreamLog
from barrierflow.runtime import Job, Runtime, RuntimeConfig, stored_jobs

__all__ = [
    "BackfillDemoConfig",
    "BackfillDemoResult",
    "TableCheck",
    "resume_command",
    "run_backfill_demo",
]

PAYLOAD = pa.schema([pa.field("key", pa.int64(), nullable=False), ("value", pa.int64())])
#: A new run's sizes when none are given: streams, records per stream before and during it.
DEFAULT_SIZES = (4, 50_000, 20_000)
#: The tables the act writes (their directories in the work directory), each checked.
_TABLES = ("live", "history")
#: Checkpoints in a row with no new row in any table before the run gives up waiting (and the
#: check reports what is missing).
_STALLED_CHECKPOINTS = 300


@dataclass(frozen=True, slots=True)
class BackfillDemoConfig:
    """What the second act is asked to do (sizes left ``None``: :data:`DEFAULT_SIZES` for a new
    run, the started run's for a resumed one).

    Raises:
        InvalidArgumentError: a count out of range, or a bad backend or crash round.
    """

    workdir: Path
    streams: int | None = None
    #: Records per stream written before the pipeline starts.
    history: int | None = None
    #: Records per stream appended while the pipeline runs.
    live: int | None = None
    backend: Literal["asyncio", "trio"] = "asyncio"
    #: An existing server (``redis://host:port/db``); ``None`` starts one in ``workdir``.
    redis_url: str | None = None
    #: SIGKILL the driver this many producer rounds after the history job became durable.
    crash_after: int | None = None
    #: Continue the run started in ``workdir`` instead of starting a new one.
    resume: bool = False

    def __post_init__(self) -> None:
        for name, value, low in (
            ("streams", self.streams, 1),
            ("history", self.history, 0),
            ("live", self.live, 0),
        ):
            if value is not None and (type(value) is not int or not low <= value <= 10_000_000):
                raise InvalidArgumentError(name, f"None or an int in {low}..10,000,000", value)
        if self.backend not in ("asyncio", "trio"):
            raise InvalidArgumentError("backend", "'asyncio' or 'trio'", self.backend)
        if self.crash_after is not None and (
            type(self.crash_after) is not int or self.crash_after < 0
        ):
            raise InvalidArgumentError("crash_after", "None or an int >= 0", self.crash_after)
        if type(self.resume) is not bool:
            raise InvalidArgumentError("resume", "a bool", self.resume)


@dataclass(frozen=True, slots=True)
class TableCheck:
    """What the check of one table the act writes found."""

    #: The table (``live`` or ``history``, its directory in the work directory).
    table: str
    #: Rows it holds.
    rows: int
    #: Rows beyond the first of each record it holds more than once.
    duplicates: int
    #: Records of the streams it does not hold.
    missing: int


@dataclass(frozen=True, slots=True)
class BackfillDemoResult:
    """What the check of every table the act writes found."""

    streams: int
    records: int
    tables: tuple[TableCheck, ...]
    seconds: float

    @property
    def duplicates(self) -> int:
        """Duplicated rows, over every table."""
        return sum(t.duplicates for t in self.tables)

    @property
    def missing(self) -> int:
        """Missing records, over every table (a record missing from both counts twice)."""
        return sum(t.missing for t in self.tables)

    @property
    def verified(self) -> bool:
        """Every table holds every record of every stream exactly once."""
        return bool(self.tables) and all(
            t.rows == self.records and t.duplicates == 0 and t.missing == 0 for t in self.tables
        )

    def report_lines(self) -> list[str]:
        """One line per table, for people."""
        return [
            f"{t.rows:,} rows in the {t.table} job's table for {self.records:,} records of "
            f"{self.streams} streams (history and live); duplicates {t.duplicates}, "
            f"missing {t.missing}"
            for t in self.tables
        ]

    def summary_line(self) -> str:
        """The machine-readable last line."""
        word = "VERIFIED" if self.verified else "FAILED"
        rows = " ".join(f"{t.table}={t.rows}" for t in self.tables)
        return (
            f"{word} streams={self.streams} records={self.records} {rows} "
            f"duplicates={self.duplicates} missing={self.missing}"
        )


def resume_command(config: BackfillDemoConfig) -> str:
    """The command that resumes the run ``config`` describes (for the user to copy)."""
    return resume_words("backfill", config.workdir, config.backend)


def run_backfill_demo(config: BackfillDemoConfig) -> BackfillDemoResult:
    """Run the second act (a new run in a fresh ``workdir``, or the started one resumed) and
    check every table it writes (see the module).

    Raises:
        InvalidArgumentError: ``config`` is not a BackfillDemoConfig.
        ConfigError: a resume with no run started in ``workdir``, or with other sizes.
    """
    if not isinstance(config, BackfillDemoConfig):
        raise InvalidArgumentError("config", "a BackfillDemoConfig", type(config).__name__)
    workdir = config.workdir
    if config.resume:
        manifest = Manifest.read(workdir)
        manifest.check(config)
        stop_left_behind(workdir, manifest)
    else:
        if (workdir / MANIFEST).exists():
            stop_left_behind(workdir, Manifest.read(workdir))
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(parents=True)
        streams, history, live = (
            default if given is None else given
            for given, default in zip(
                (config.streams, config.history, config.live), DEFAULT_SIZES, strict=True
            )
        )
        manifest = Manifest(streams, history, live, config.redis_url)
    started = time.monotonic()
    with server(workdir, manifest) as url:
        trace("server-ready")
        client = redis.Redis.from_url(url, protocol=2)
        try:
            keys = [f"demo:events:{i}" for i in range(manifest.streams)]
            if not config.resume:
                client.delete(*keys)
                top_up(client, keys, manifest.history, manifest.history)
            anyio.run(_pipeline, config, manifest, url, keys, backend=config.backend)
            trace("verify")
            return _verify(workdir, client, keys, time.monotonic() - started)
        finally:
            client.close()


def _history_job(workdir: Path, log: RedisStreamLog) -> Job:
    history = Job("history")
    history.add_actor("backfill", lambda: SourceBackfill(log), inputs={"upstream": "events"})
    schema = split_log_schema(PAYLOAD)
    add_sink(
        history,
        "history_out",
        TracedTable(ParquetTable(workdir / "history", schema)),
        input="backfill",
    )
    return history


async def _pipeline(
    config: BackfillDemoConfig, manifest: Manifest, url: str, keys: list[str]
) -> None:
    """The live job from the start; the history job added mid-run (or declared again on a
    resume after it became durable), while records arrive."""
    workdir = config.workdir
    schema = split_log_schema(PAYLOAD)
    log = RedisStreamLog(url, payload=PAYLOAD, splits=keys, block_ms=100)
    state_path = workdir / "state.db"
    declared = "history" in await stored_jobs(state_path)
    rt = Runtime(RuntimeConfig(state_path=state_path, barrier_interval=0.2))
    # The keys are declared: a stream not created yet is waited for, not an error.
    rt.add_source("events", lambda: SplitSource(log, batch_rows=4096, wait_for_splits=True))
    add_sink(rt, "live", ParquetTable(workdir / "live", schema), input="events")
    if declared:
        rt.declare_job(_history_job(workdir, log))
    producer = Producer(url, keys, manifest.history + manifest.live)
    async with log, rt:
        async with anyio.create_task_group() as tg:
            tg.start_soon(producer.run)
            if declared:
                handle = rt.job("history")
            else:
                await rt.checkpoint()  # the live job is under way
                trace("job-add")
                handle = await rt.add_job(_history_job(workdir, log))
                await rt.checkpoint()  # the job is durable: a crash from here resumes it
                trace("job-durable")
            if tracing():
                tg.start_soon(follow_job, handle)
            tg.start_soon(show_job_progress, "history", handle)
            if config.crash_after is not None:
                await producer.wait_rounds(producer.rounds + config.crash_after)
                state = "ready" if handle.progress().ready else "backfilling"
                kill_self(
                    f"{config.crash_after} producer rounds after the history job became "
                    f"durable (the job {state})",
                    resume_command(config),
                )
            await handle.wait_ready()
            await producer.done.wait()
        records = manifest.streams * (manifest.history + manifest.live)
        trace("drain")
        await _until_complete(rt, [workdir / table for table in _TABLES], records)


async def _until_complete(rt: Runtime, tables: list[Path], records: int) -> None:
    """Checkpoint until every table holds ``records`` rows (or they all stop growing)."""
    stalled, last = 0, [-1] * len(tables)
    while stalled < _STALLED_CHECKPOINTS:
        await rt.checkpoint()
        rows = [await anyio.to_thread.run_sync(_committed_rows, table) for table in tables]
        if all(n >= records for n in rows):
            return
        stalled = stalled + 1 if rows == last else 0
        last = rows


def _committed_rows(table: Path) -> int:
    """The rows a Parquet file sink's table holds, from its manifest (no scan)."""
    try:
        return int(json.loads((table / "_manifest.json").read_text())["rows"])
    except FileNotFoundError:
        return 0


def _verify(
    workdir: Path, client: redis.Redis, keys: list[str], seconds: float
) -> BackfillDemoResult:
    """Compare every table the act writes with the streams (``XRANGE``): one row per
    record in each."""
    expected: set[tuple[str, int, int]] = set()
    for key in keys:
        entries = cast(list[tuple[bytes, Any]], client.xrange(key))
        for entry_id, _fields in entries:
            major, minor = entry_id.decode().split("-")
            expected.add((key, int(major), int(minor)))
    checks = tuple(_check_table(workdir, table, expected) for table in _TABLES)
    return BackfillDemoResult(
        streams=len(keys), records=len(expected), tables=checks, seconds=seconds
    )


def _check_table(workdir: Path, name: str, expected: set[tuple[str, int, int]]) -> TableCheck:
    """One table against the streams' records."""
    if not (workdir / name).is_dir():  # no checkpoint ever wrote it
        return TableCheck(name, rows=0, duplicates=0, missing=len(expected))
    table = ds.dataset(workdir / name, split_log_schema(PAYLOAD), format="parquet")
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
    return TableCheck(
        name,
        rows=rows.num_rows,
        duplicates=rows.num_rows - unique.num_rows,
        missing=len(expected - found),
    )
