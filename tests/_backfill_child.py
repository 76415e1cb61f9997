"""The pipeline of ``test_source_backfill_crash.py``, and the child process that kills itself in
it (run as a script: ``python tests/_backfill_child.py STATE_DIR URL PREFIX BACKEND POINT``).

The pipeline: the live split source ``events`` over the Redis streams ``<prefix>k0..k2`` and a
counting live consumer ``live`` (the default job); job ``history`` joins it at run time with a
source backfill ``backfill`` (reading ``events`` as its input ``upstream``) and a single
exactly-once Parquet sink writer ``out`` into ``STATE_DIR/table``.

The child runs with ``barrier_interval=3600``: every barrier after the first is one it injects
itself (its checkpoints and the ``Add`` barrier of the job), so the backfill's progress, its
durable state and the sink's epochs move only when the child says so, and each kill point is
picked from what the child observed at a barrier it injected (never from a sleep):

* it waits until ``live`` has read the whole history, adds the job, appends :data:`LIVE_APPENDS`
  records per stream and checkpoints (the job is durable from then on: ``@ JOB_DURABLE e``);
* then, by ``POINT``:

  - ``backfilling``: checkpoints until one has made durable a state with a split still
    ``BACKFILLING`` while the sink has committed rows of the job (the backfill reader is rate
    limited, so this takes several checkpoints), and kills itself;
  - ``caching_up``: checkpoints until the job is ready (every split ``CACHING_UP`` or
    ``FINISHED``; no record is appended any more, so a split that is ``CACHING_UP`` stays so),
    two more, and kills itself with some split still ``CACHING_UP``;
  - ``finished``: as ``caching_up``, then appends one record per stream and checkpoints until
    every split is ``FINISHED``, three more, and kills itself;
  - ``between_barrier_and_checkpoint``: ``StateStore.commit`` is patched to kill the process
    on its :data:`COMMIT_KILL`-th call after the job became durable — the barrier was
    collected by every actor (the sink pre-committed its epoch), its checkpoint not written;
  - ``between_barrier_and_checkpoint_caching_up``: the same, on the first commit that would
    make a ``CACHING_UP`` split durable (the commit's writes of the backfill's state table,
    sealed by the collected barrier, are read before the kill);
  - ``between_barrier_and_checkpoint_finished``: the same, on the first commit that would
    make every split ``FINISHED`` durable (the child appends one record per stream once the
    job is ready, so the splits caching up finish);
  - ``mid_chunk``: ``ParquetStagingWriter.write`` is patched to kill the process right after
    its :data:`WRITE_KILL`-th call after the job became durable (the sink's row groups are
    :data:`ROW_GROUP_ROWS` rows, so a chunk has been half written into a staged file);
  - ``after_checkpoint_before_sink_commit``: ``ParquetCommitter.commit`` is patched to kill
    the process on its :data:`SINK_COMMIT_KILL`-th call for an epoch with rows after the job
    became durable, before it runs: the checkpoint is durable, the epoch only pending in the
    coordinator's meta store.

Each line of its own on stdout is ``@ MARKER value...`` (structlog logs to stdout too). A child
that misses its kill point prints ``@ MISSED`` and exits with code 3.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pyarrow as pa
import pyarrow.dataset as ds
import redis

from barrierflow.actors.backfill.source_backfill import SourceBackfill
from barrierflow.actors.sinks.add_sink import DeclaredSink, add_sink
from barrierflow.actors.sources.split_log import OFFSET_MAJOR, OFFSET_MINOR, SPLIT_COLUMN
from barrierflow.actors.sources.split_source import SplitSource
from barrierflow.channels import Chunk, Message
from barrierflow.connectors import ParquetStagingWriter, ParquetTable, RedisStreamLog
from barrierflow.connectors.parquet_committer import ParquetCommitter
from barrierflow.runtime import ActorContext, Job, Runtime, RuntimeConfig, StateStore, StreamActor

PAYLOAD = pa.schema([("n", pa.int64())])
STREAMS = 3
#: Records per stream written before the child starts (by the test).
HISTORY = 300
#: Records per stream the child appends right after adding the job.
LIVE_APPENDS = 40
#: Rows per second of the backfill reader where a kill must find it still backfilling.
SLOW_RATE = 400.0
#: Rows per backfill batch.
BACKFILL_ROWS = 25
#: Rows per Parquet row group: a chunk of the backfill is written in more than one.
ROW_GROUP_ROWS = 10
#: The commit (after the job became durable) during which ``between_barrier_and_checkpoint``
#: kills the process, and the ``write`` call after which ``mid_chunk`` does.
COMMIT_KILL = 3
WRITE_KILL = 12
SINK_COMMIT_KILL = 2

#: The kill points that patch ``StateStore.commit`` (killed with a barrier collected, its
#: checkpoint not written).
UNCOMMITTED = (
    "between_barrier_and_checkpoint",
    "between_barrier_and_checkpoint_caching_up",
    "between_barrier_and_checkpoint_finished",
)
POINTS = (
    "backfilling",
    "caching_up",
    "finished",
    *UNCOMMITTED,
    "mid_chunk",
    "after_checkpoint_before_sink_commit",
)


def stream_keys(prefix: str) -> list[str]:
    return [f"{prefix}k{i}" for i in range(STREAMS)]


def append(conn: redis.Redis, keys: list[str], count: int) -> None:
    """``count`` more records on every stream (one pipeline)."""
    pipe = conn.pipeline(transaction=False)
    for key in keys:
        for i in range(count):
            pipe.xadd(key, {"n": str(i)})
    pipe.execute()


class Count(StreamActor):
    """The live job's consumer: counts the rows it sees (``seen["rows"]``) and keeps the last
    offset of each split (``seen[split]``, a ``(major, minor)`` pair)."""

    def __init__(self, seen: dict[str, Any]) -> None:
        self.seen = seen

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk):
            rows = message.compact().batch
            self.seen["rows"] = self.seen.get("rows", 0) + rows.num_rows
            for split, major, minor in zip(
                rows.column(SPLIT_COLUMN).to_pylist(),
                rows.column(OFFSET_MAJOR).to_pylist(),
                rows.column(OFFSET_MINOR).to_pylist(),
                strict=True,
            ):
                self.seen[split] = (major, minor)
        await ctx.emit(message)


def make_log(url: str, prefix: str) -> RedisStreamLog:
    return RedisStreamLog(url, payload=PAYLOAD, splits=stream_keys(prefix), block_ms=50)


def runtime(
    state_dir: Path, log: RedisStreamLog, live: Callable[[], StreamActor], **config: Any
) -> Runtime:
    """The default job: the live source ``events`` and its consumer ``live``."""
    rt = Runtime(RuntimeConfig(state_path=state_dir / "state.db", **config))
    rt.add_source("events", lambda: SplitSource(log, batch_rows=64))
    rt.add_actor("live", live, inputs=["events"])
    return rt


def history_job(
    state_dir: Path, log: RedisStreamLog, sinks: list[DeclaredSink], *, rate: float | None
) -> Job:
    """Job ``history``: the source backfill and the exactly-once Parquet table ``out`` (its
    declaration is appended to ``sinks``)."""
    table = ParquetTable(state_dir / "table", log.schema, row_group_rows=ROW_GROUP_ROWS)
    job = Job("history")
    job.add_actor(
        "backfill",
        lambda: SourceBackfill(log, batch_rows=BACKFILL_ROWS, rate_limit=rate),
        inputs={"upstream": "events"},
    )
    sinks.append(add_sink(job, "out", table, input="backfill"))
    return job


def sealed_phases(store: StateStore, epoch: int) -> dict[str, str]:
    """The backfill's split phases that ``store.commit(epoch)`` is about to make durable (its
    state table's writes sealed up to ``epoch``; read, not taken)."""
    table = store._tables.get(("backfill", "backfill"))
    writes = table._take_through(epoch) if table is not None else {}
    return {k: json.loads(v)["phase"] for k, v in writes.items() if isinstance(v, str)}


def say(*words: object) -> None:
    print("@", *words, flush=True)


def die(point: str, **facts: object) -> None:
    say("KILLING", point, json.dumps(facts, separators=(",", ":"), sort_keys=True))
    os.kill(os.getpid(), signal.SIGKILL)


def _committed_rows(table: Path, schema: pa.Schema) -> int:
    """Rows the exactly-once table shows readers (staging is hidden from them)."""
    if not table.exists():
        return 0
    return int(ds.dataset(table, schema, format="parquet").count_rows())


async def main(state_dir: Path, url: str, prefix: str, point: str) -> None:
    keys = stream_keys(prefix)
    log = make_log(url, prefix)
    live: dict[str, Any] = {}
    sinks: list[DeclaredSink] = []
    rt = runtime(state_dir, log, lambda: Count(live), barrier_interval=3600)
    armed = {"commits": 0, "writes": 0, "sink_commits": 0, "on": False}
    handle: Any = None

    def phases() -> dict[str, str]:
        actor = handle.progress().actors.get("backfill") if handle is not None else None
        return dict(actor.detail) if actor is not None and actor.detail else {}

    real_commit = StateStore.commit
    real_write = ParquetStagingWriter.write

    async def commit(self: StateStore, epoch: int) -> None:
        if armed["on"] and point in UNCOMMITTED:
            armed["commits"] += 1
            sealed = sealed_phases(self, epoch)
            if (
                (point == UNCOMMITTED[0] and armed["commits"] == COMMIT_KILL)
                or (point == UNCOMMITTED[1] and "caching_up" in sealed.values())
                or (point == UNCOMMITTED[2] and sealed and set(sealed.values()) == {"finished"})
            ):
                die(point, epoch=epoch, committed=self.committed_epoch, sealed=sealed)
        await real_commit(self, epoch)

    async def write(self: ParquetStagingWriter, batch: pa.RecordBatch) -> None:
        await real_write(self, batch)
        if armed["on"] and point == "mid_chunk":
            armed["writes"] += 1
            if armed["writes"] == WRITE_KILL:
                die(point, rows=batch.num_rows, phases=phases())

    real_sink_commit = ParquetCommitter.commit

    async def table_commit(self: ParquetCommitter, epoch: int, metadata: Any) -> None:
        if armed["on"] and point == "after_checkpoint_before_sink_commit" and metadata["paths"]:
            armed["sink_commits"] += 1  # an epoch with rows (an empty one stages nothing)
            if armed["sink_commits"] == SINK_COMMIT_KILL:
                die(point, epoch=epoch, phases=phases())
        await real_sink_commit(self, epoch, metadata)

    ParquetCommitter.commit = table_commit  # type: ignore[method-assign]
    StateStore.commit = commit  # type: ignore[method-assign]
    ParquetStagingWriter.write = write  # type: ignore[method-assign]

    slow = point not in ("caching_up", "finished", UNCOMMITTED[2])
    conn = redis.Redis.from_url(url, protocol=2)
    async with log, rt:
        while live.get("rows", 0) < STREAMS * HISTORY:  # the live job read the whole history
            await rt.checkpoint()
        say("LIVE_READ", live["rows"])
        handle = await rt.add_job(
            history_job(state_dir, log, sinks, rate=SLOW_RATE if slow else None)
        )
        say("ADDED", handle.created_epoch)
        await anyio.to_thread.run_sync(partial(append, conn, keys, LIVE_APPENDS))
        durable = await rt.checkpoint()
        say("JOB_DURABLE", durable)
        armed["on"] = True

        if point == "backfilling":
            for _ in range(1000):
                epoch = await rt.checkpoint()
                await sinks[-1].coordinator.wait_committed(epoch)
                now = phases()
                if "backfilling" not in now.values():
                    break
                # The sink committed an epoch holding some of the job's rows (an epoch can
                # pass before the slow reader's first batch: then go on).
                if epoch > durable and _committed_rows(state_dir / "table", log.schema):
                    die(point, epoch=epoch, phases=now)
        elif point in ("caching_up", "finished"):
            while not handle.progress().ready:
                await rt.checkpoint()
            await handle.wait_ready()
            for _ in range(2):
                epoch = await rt.checkpoint()
            await sinks[-1].coordinator.wait_committed(epoch)
            now = phases()
            if set(now.values()) - {"caching_up", "finished"} or "caching_up" not in now.values():
                say("MISSED", json.dumps(now, separators=(",", ":")))
                sys.exit(3)
            if point == "caching_up":
                die(point, epoch=epoch, phases=now)
            await anyio.to_thread.run_sync(partial(append, conn, keys, 1))
            for _ in range(1000):
                await rt.checkpoint()
                if set(phases().values()) == {"finished"}:
                    break
            for _ in range(3):
                epoch = await rt.checkpoint()
            await sinks[-1].coordinator.wait_committed(epoch)
            die(point, epoch=epoch, phases=phases())
        else:  # killed by a patched method
            appended = False
            for _ in range(1000):
                await rt.checkpoint()
                if handle.progress().ready and not appended:  # the splits caching up finish
                    await anyio.to_thread.run_sync(partial(append, conn, keys, 1))
                    appended = True
        say("MISSED", json.dumps(phases(), separators=(",", ":")))
    sys.exit(3)


if __name__ == "__main__":
    state, address, key_prefix, backend, kill_point = sys.argv[1:6]
    assert kill_point in POINTS, kill_point
    anyio.run(main, Path(state), address, key_prefix, kill_point, backend=backend)
