"""The pipeline of the SIGKILL test in ``test_split_discovery.py``, and the child process that
kills itself in it (run as a script: ``python tests/_discovery_child.py STATE_DIR URL PREFIX
BACKEND``).

The pipeline: the live split source ``src`` discovering the Redis streams ``<prefix>s*`` (a
log declared by a pattern), its exactly-once Parquet table ``live``; job ``history`` joins it
with a source backfill writing the exactly-once Parquet table ``history``. Barriers come only
from the child's own checkpoints (``barrier_interval=3600``).

The test has written stream ``s0`` before the child starts. The child adds the job, then
creates ``s1`` (after the job listed the log: adopted by it), checkpoints until both tables
hold every record so far, creates ``s2`` and checkpoints once (the source discovers it at that
barrier; its records are read but not committed), appends to ``s2`` and creates ``s3`` (never
listed before the kill), and kills itself.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import anyio
import anyio.to_thread
import pyarrow as pa
import pyarrow.dataset as ds
import redis

from barrierflow.actors import SourceBackfill, SplitSource, add_sink
from barrierflow.connectors import ParquetTable, RedisStreamLog
from barrierflow.runtime import Job, Runtime, RuntimeConfig

PAYLOAD = pa.schema([("v", pa.int64())])
#: Records the test writes to ``s0`` before the child starts, and the child to each new stream.
HISTORY = 50
NEW = 30


def xadd(conn: redis.Redis, key: str, count: int) -> None:
    pipe = conn.pipeline(transaction=False)
    for i in range(count):
        pipe.xadd(key, {"v": str(i)})
    pipe.execute()


def make_log(url: str, prefix: str) -> RedisStreamLog:
    return RedisStreamLog(url, payload=PAYLOAD, pattern=f"{prefix}s*", block_ms=50)


def history_job(state_dir: Path, log: RedisStreamLog) -> Job:
    job = Job("history")
    job.add_actor("backfill", lambda: SourceBackfill(log), inputs={"upstream": "src"})
    table = state_dir / "history"
    add_sink(job, "history", ParquetTable(table, log.schema), input="backfill")
    return job


def runtime(state_dir: Path, log: RedisStreamLog, *, declare_job: bool) -> Runtime:
    rt = Runtime(RuntimeConfig(state_path=state_dir / "state.db", barrier_interval=3600.0))
    rt.add_source("src", lambda: SplitSource(log, discover_every=1, batch_rows=16))
    table = state_dir / "live"
    add_sink(rt, "live", ParquetTable(table, log.schema), input="src")
    if declare_job:
        rt.declare_job(history_job(state_dir, log))
    return rt


def committed_rows(path: Path) -> int:
    if not path.exists():
        return 0
    return int(ds.dataset(path, format="parquet").count_rows())


async def main(state_dir: Path, url: str, prefix: str) -> None:
    log = make_log(url, prefix)
    rt = runtime(state_dir, log, declare_job=False)
    conn = redis.Redis.from_url(url, protocol=2)
    async with log, rt:
        await rt.add_job(history_job(state_dir, log))
        await anyio.to_thread.run_sync(xadd, conn, f"{prefix}s1", NEW)
        for _ in range(1000):
            await rt.checkpoint()
            counts = [committed_rows(state_dir / t) for t in ("live", "history")]
            if counts == [HISTORY + NEW] * 2:
                break
        await anyio.to_thread.run_sync(xadd, conn, f"{prefix}s2", NEW)
        await rt.checkpoint()
        await anyio.to_thread.run_sync(xadd, conn, f"{prefix}s2", NEW)
        await anyio.to_thread.run_sync(xadd, conn, f"{prefix}s3", NEW)
        print("@ KILLING after_new_streams {}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    print("@ MISSED", flush=True)
    sys.exit(3)


if __name__ == "__main__":
    state, address, key_prefix, backend = sys.argv[1:5]
    anyio.run(main, Path(state), address, key_prefix, backend=backend)
