"""The demo's third act: a job joins a running materialized view and sees its history.

``barrierflow demo views`` runs, on embedded defaults (SQLite state, local files)::

    events (key, amount), delivered in numbered batches (exactly once, BatchFeed)
      → "totals": per-key running totals, as a change stream (insert, update pairs)
      → "view": Materialize — the totals as a materialized view (a versioned table)
    mid-run, while batches keep arriving:
      → job "copy" joins: SnapshotBackfill("view") → the change stream as rows (an ``_op``
        column) → an exactly-once Parquet table                      <workdir>/copy

The copy job reads the view as of its snapshot epoch, then every later change from the view's
change log, then the live view. At the end the copy's table is replayed key by key, in commit
order: every retraction must retract the value the key had, every insert must insert a key that
was absent, and each key's last value must be its total over the whole input (computed from the
input itself) — the snapshot plus every later change, none missing, none twice. The last line is
machine-readable: ``VERIFIED keys=K changes=N broken=0 wrong=0`` (or ``FAILED``).

**Crash and resume.** ``--crash-after N`` SIGKILLs the driver ``N`` batches after the copy job
became durable (``0``: at once, mid-snapshot). ``--resume`` continues the run started in the
work directory (its sizes from ``demo-views.json``): the runtime restarts from the last
checkpoint, the copy job is declared again if the job catalog holds it (else it joins again),
and the feed continues after the last durable batch.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import anyio
import anyio.to_thread

from barrierflow._fs import write_atomically
from barrierflow.actors import add_sink
from barrierflow.actors.backfill.materialize import Materialize
from barrierflow.actors.backfill.snapshot_backfill import SnapshotBackfill
from barrierflow.actors.sources.batch_feed import BatchFeed
from barrierflow.app._demo_faults import kill_self
from barrierflow.app._demo_progress import show_job_progress
from barrierflow.app._demo_runs import check_sizes, read_manifest
from barrierflow.app._demo_runs import resume_command as resume_words
from barrierflow.app._demo_views_graph import (
    TOTALS,
    WITH_OPS,
    ChangeCheck,
    OpsColumn,
    Totals,
    check_changes,
    events,
    expected_totals,
    read_changes,
)
from barrierflow.app._trace import TracedTable, follow_job, trace, tracing
from barrierflow.channels.errors import ConfigError, InvalidArgumentError
from barrierflow.connectors import ParquetTable
from barrierflow.connectors._staging import STAGING
from barrierflow.runtime import Job, Runtime, RuntimeConfig, stored_jobs

__all__ = ["ViewsDemoConfig", "ViewsDemoResult", "resume_command", "run_views_demo"]

#: A new run's sizes when none are given: batches, events (over all batches), keys.
DEFAULT_SIZES = (60, 1_200_000, 5_000)
MANIFEST = "demo-views.json"
_STREAM = "events"


@dataclass(frozen=True, slots=True)
class ViewsDemoConfig:
    """What the third act is asked to do (sizes left ``None``: :data:`DEFAULT_SIZES` for a new
    run, the started run's for a resumed one).

    Raises:
        InvalidArgumentError: a size out of range, or a bad backend or crash count.
    """

    workdir: Path
    batches: int | None = None
    #: Events over all batches (a multiple of ``batches``).
    rows: int | None = None
    keys: int | None = None
    backend: Literal["asyncio", "trio"] = "asyncio"
    crash_after: int | None = None
    resume: bool = False

    def __post_init__(self) -> None:
        for name in ("batches", "rows", "keys"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or not 1 <= value <= 10_000_000):
                raise InvalidArgumentError(name, "None or an int in 1..10,000,000", value)
        if self.backend not in ("asyncio", "trio"):
            raise InvalidArgumentError("backend", "'asyncio' or 'trio'", self.backend)
        if self.crash_after is not None and (
            type(self.crash_after) is not int or self.crash_after < 0
        ):
            raise InvalidArgumentError("crash_after", "None or an int >= 0", self.crash_after)


@dataclass(frozen=True, slots=True)
class _Manifest:
    batches: int
    rows: int
    keys: int

    @property
    def per_batch(self) -> int:
        return self.rows // self.batches

    @classmethod
    def read(cls, workdir: Path) -> _Manifest:
        return read_manifest(cls, workdir, MANIFEST, "views")

    def check(self, config: ViewsDemoConfig) -> None:
        check_sizes(self, config, ("batches", "rows", "keys"))


@dataclass(frozen=True, slots=True)
class ViewsDemoResult:
    """What the check of the copy's table found."""

    check: ChangeCheck
    seconds: float

    @property
    def verified(self) -> bool:
        return self.check.verified

    def summary_line(self) -> str:
        c = self.check
        word = "VERIFIED" if self.verified else "FAILED"
        return f"{word} keys={c.keys} changes={c.rows} broken={c.broken} wrong={c.wrong}"


def resume_command(config: ViewsDemoConfig) -> str:
    """The command that resumes the run ``config`` describes."""
    return resume_words("views", config.workdir, config.backend)


def run_views_demo(config: ViewsDemoConfig) -> ViewsDemoResult:
    """Run the third act (new, or the started run resumed) and check the copy (see module).

    Raises:
        InvalidArgumentError: ``config`` is not a ViewsDemoConfig.
        ConfigError: a resume with no run started in ``workdir``, or with other sizes.
    """
    if not isinstance(config, ViewsDemoConfig):
        raise InvalidArgumentError("config", "a ViewsDemoConfig", type(config).__name__)
    workdir = config.workdir
    if config.resume:
        manifest = _Manifest.read(workdir)
        manifest.check(config)
    else:
        given = (config.batches, config.rows, config.keys)
        manifest = _Manifest(
            *(d if g is None else g for g, d in zip(given, DEFAULT_SIZES, strict=True))
        )
        if manifest.rows % manifest.batches:
            raise ConfigError(
                "rows", f"a multiple of the {manifest.batches} batches", manifest.rows
            )
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(parents=True)
        write_atomically(workdir / MANIFEST, json.dumps(asdict(manifest)).encode())
    started = time.monotonic()
    anyio.run(_pipeline, config, manifest, backend=config.backend)
    trace("verify")
    changes = read_changes(workdir / "copy")
    expected = expected_totals(manifest.batches, manifest.per_batch, manifest.keys)
    return ViewsDemoResult(check_changes(changes, expected), time.monotonic() - started)


def _copy_job(workdir: Path) -> Job:
    job = Job("copy")
    job.add_actor("backfill", lambda: SnapshotBackfill("view", batch_rows=8192), inputs=["view"])
    job.add_actor("changes", OpsColumn, inputs=["backfill"])
    add_sink(
        job,
        "copy_out",
        TracedTable(ParquetTable(workdir / "copy", WITH_OPS)),
        input="changes",
    )
    return job


async def _pipeline(config: ViewsDemoConfig, manifest: _Manifest) -> None:
    workdir = config.workdir
    state_path = workdir / "state.db"
    declared = "copy" in await stored_jobs(state_path)
    feed = BatchFeed(events(0, 1, 1).schema, chunk_rows=8192)
    rt = Runtime(RuntimeConfig(state_path=state_path, barrier_interval=0.2))
    rt.add_source(_STREAM, feed.source)
    rt.add_actor("totals", Totals, inputs=[_STREAM])
    rt.add_actor("view", lambda: Materialize(TOTALS, ["key"]), inputs=["totals"])
    if declared:
        rt.declare_job(_copy_job(workdir))
    async with rt, anyio.create_task_group() as tg:
        last = await feed.last_batch(_STREAM, rt)
        next_batch = 0 if last is None else last + 1
        join_at = manifest.batches // 3
        handle = rt.job("copy") if declared else None
        durable_at: int | None = next_batch if declared else None
        if handle is not None:
            tg.start_soon(show_job_progress, "copy", handle)
            if tracing():
                tg.start_soon(follow_job, handle)
        for batch in range(next_batch, manifest.batches):
            if handle is None and batch >= join_at:
                trace("job-add")
                handle = await rt.add_job(_copy_job(workdir))
                await rt.checkpoint()  # the job is durable: a crash from here resumes it
                trace("job-durable")
                durable_at = batch
                tg.start_soon(show_job_progress, "copy", handle)
                if tracing():
                    tg.start_soon(follow_job, handle)
            if (
                config.crash_after is not None
                and durable_at is not None
                and batch - durable_at >= config.crash_after
            ):
                kill_self(
                    f"{config.crash_after} batches after the copy job became durable",
                    resume_command(config),
                )
            rows = events(batch, manifest.per_batch, manifest.keys)
            await feed.deliver(rt, _STREAM, batch, rows)
            trace("batch-delivered", batch)
        if handle is None:
            handle = await rt.add_job(_copy_job(workdir))
            tg.start_soon(show_job_progress, "copy", handle)
        await handle.wait_ready()
        trace("drain")
        epoch = await rt.checkpoint()
        await _until_committed(rt, workdir / "copy", epoch)


async def _until_committed(rt: Runtime, table: Path, epoch: int) -> None:
    """Checkpoint until the copy's table has committed every epoch up to ``epoch`` (its sink
    commits an epoch once its checkpoint is durable; until then it is staged)."""

    def staged() -> bool:
        staging = table / STAGING
        return staging.exists() and any(
            d.name.isdigit() and int(d.name) <= epoch for d in staging.iterdir()
        )

    while await anyio.to_thread.run_sync(staged):
        await rt.checkpoint()
