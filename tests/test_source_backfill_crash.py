"""Source backfill under real SIGKILLs, on a real server: a job joining a live Redis-streams
source with a source backfill, writing into an exactly-once Parquet sink, is killed in each
backfill state and at the nasty moments of a checkpoint; restarted on the same state store,
table and streams, it ends up with every record of every stream exactly once.

The child (``_backfill_child.py``, whose docstring says how each kill point is reached from
what the child observes — no sleeps) runs the pipeline on the test's backend and kills itself;
the test then reads what is durable (the store's committed epoch, job catalog and the
backfill's split states; the table's committed rows), restarts the pipeline in-process
(declaring job ``history`` again: every kill point is after its first checkpoint), appends
more records, runs until every split is ``FINISHED`` and the live source has passed the last
record, and compares the table with ``XRANGE`` of every stream.
"""

from __future__ import annotations

import json
from collections import Counter as Tally
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pyarrow.dataset as ds
import pytest
import redis
from _backfill_child import (
    HISTORY,
    PAYLOAD,
    POINTS,
    STREAMS,
    UNCOMMITTED,
    Count,
    append,
    history_job,
    make_log,
    runtime,
    stream_keys,
)
from _killed_child import run_killed_child
from _timeouts import scaled

from barrierflow.actors.sinks.add_sink import DeclaredSink
from barrierflow.actors.sources.split_log import (
    OFFSET_MAJOR,
    OFFSET_MINOR,
    SPLIT_COLUMN,
    split_log_schema,
)
from barrierflow.connectors._staging import MANIFEST, STAGING
from barrierflow.runtime import StateStore
from barrierflow.testing.redis_server import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.redis, pytest.mark.slow]

CHILD = Path(__file__).with_name("_backfill_child.py")
#: Records per stream the restarted pipeline appends before waiting for the job to be ready.
RESTART_APPENDS = 20

Row = tuple[str, str]  # (split, "<ms>-<seq>")


def stream_ids(conn: redis.Redis, keys: list[str]) -> dict[str, list[str]]:
    result: dict[str, list[str]] = {}
    for key in keys:
        entries: Any = conn.xrange(key)
        result[key] = [bytes(i).decode() for i, _ in entries]
    return result


def table_rows(state_dir: Path, schema: Any) -> list[Row]:
    """Every committed row of the sink's table (duplicates kept), as (split, id)."""
    table = state_dir / "table"
    if not table.exists():
        return []
    rows = ds.dataset(table, schema, format="parquet").to_table()
    return [
        (s, f"{a}-{b}")
        for s, a, b in zip(
            rows.column(SPLIT_COLUMN).to_pylist(),
            rows.column(OFFSET_MAJOR).to_pylist(),
            rows.column(OFFSET_MINOR).to_pylist(),
            strict=True,
        )
    ]


def duplicates(rows: list[Row]) -> dict[Row, int]:
    return {row: n for row, n in Tally(rows).items() if n > 1}


def summary(rows: list[Row]) -> dict[str, str]:
    """Per split: how many of ``rows``, and the first few ids."""
    ids: dict[str, list[str]] = {}
    for split, i in sorted(rows):
        ids.setdefault(split, []).append(i)
    return {
        s: f"{len(v)}: {', '.join(v[:5])}{' ...' if len(v) > 5 else ''}" for s, v in ids.items()
    }


def assert_exactly_once(rows: list[Row], expected: dict[str, list[str]]) -> None:
    """``rows`` hold every record of ``expected`` once and nothing else (with what is wrong
    summarized per split, not a diff of thousands of tuples)."""
    want = {(split, i) for split, ids in expected.items() for i in ids}
    twice = duplicates(rows)
    missing = sorted(want - set(rows))
    extra = sorted(set(rows) - want)
    problems = {
        "duplicated": summary(list(twice)),
        "missing": summary(missing),
        "unknown": summary(extra),
    }
    wrong = len(twice) + len(missing) + len(extra)
    assert wrong == 0, (
        f"{len(twice)} duplicated, {len(missing)} missing, {len(extra)} unknown of "
        f"{len(want)} records: {problems}"
    )
    assert len(rows) == len(want)


async def run_child(
    tmp_path: Path, server: RedisServer, prefix: str, backend: str, point: str
) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """Run the child until it kills itself; its markers, and the kill point's facts."""
    args = [str(tmp_path), server.url, prefix, backend, point]
    return await run_killed_child(CHILD, args, point)


async def durable(tmp_path: Path) -> tuple[int, dict[str, Any], dict[str, str]]:
    """The store's committed epoch, job catalog, and the backfill's committed split phases."""
    async with await StateStore.open(tmp_path / "state.db") as store:
        catalog = await store.read_all("__runtime__", "jobs")
        states = await store.read_all("backfill", "backfill")
        return store.committed_epoch, catalog, {s: v["phase"] for s, v in states.items()}


def phases_of(handle: Any) -> dict[str, str]:
    actor = handle.progress().actors.get("backfill")
    return dict(actor.detail) if actor is not None and actor.detail else {}


async def restart(tmp_path: Path, server: RedisServer, prefix: str) -> dict[str, list[str]]:
    """The same pipeline on the same store, table and streams, job ``history`` declared
    again; more records arrive; runs until every split finished and the live source passed
    the last record, which the sink committed. Returns every stream's ids."""
    keys = stream_keys(prefix)
    log = make_log(server.url, prefix)
    live: dict[str, Any] = {}
    sinks: list[DeclaredSink] = []
    rt = runtime(tmp_path, log, lambda: Count(live), barrier_interval=0.05)
    rt.declare_job(history_job(tmp_path, log, sinks, rate=None))
    with server.client() as conn, anyio.fail_after(scaled(60)):
        async with log, rt:
            handle = rt.job("history")
            await anyio.to_thread.run_sync(partial(append, conn, keys, RESTART_APPENDS))
            await handle.wait_ready()
            while set(phases_of(handle).values()) != {"finished"}:
                # A split caching up finishes when the live source passes its stop.
                await anyio.to_thread.run_sync(partial(append, conn, keys, 1))
                await rt.checkpoint()
            expected = await anyio.to_thread.run_sync(stream_ids, conn, keys)
            last = {k: tuple(int(x) for x in ids[-1].split("-")) for k, ids in expected.items()}
            while any(live.get(k) != last[k] for k in keys):
                await rt.checkpoint()
            # Every record reached the forwarding backfill before this barrier: committed.
            epoch = await rt.checkpoint()
            await sinks[-1].coordinator.wait_committed(epoch)
    return expected


@pytest.mark.parametrize("point", POINTS)
async def test_a_source_backfill_killed_and_restarted_writes_every_record_exactly_once(
    tmp_path: Path, redis_server: RedisServer, anyio_backend: str, point: str
) -> None:
    prefix = redis_server.key_prefix()
    keys = stream_keys(prefix)
    schema = split_log_schema(PAYLOAD)
    with redis_server.client() as conn:
        await anyio.to_thread.run_sync(partial(append, conn, keys, HISTORY))

    markers, facts = await run_child(tmp_path, redis_server, prefix, anyio_backend, point)
    assert [int(r) for r in markers["LIVE_READ"]] == [STREAMS * HISTORY]
    (created,) = (int(e) for e in markers["ADDED"])
    (job_durable,) = (int(e) for e in markers["JOB_DURABLE"])
    assert created <= job_durable

    # What the kill left durable is the state the kill point is about.
    committed, catalog, phases = await durable(tmp_path)
    assert catalog["history"]["created_epoch"] == created  # the job outlived the kill
    assert sorted(phases) == keys
    if point in ("backfilling", "caching_up", "finished"):
        # Killed right after a checkpoint (the only barriers are the child's own): that
        # checkpoint's split states are the durable ones.
        assert committed == facts["epoch"]
        assert phases == facts["phases"]
    if point == "backfilling":
        assert "backfilling" in phases.values()
    elif point == "caching_up":
        assert "caching_up" in phases.values()
        assert set(phases.values()) <= {"caching_up", "finished"}
    elif point == "finished":
        assert set(phases.values()) == {"finished"}
    elif point in UNCOMMITTED:
        # Every actor collected the barrier (the sink pre-committed its epoch); its
        # checkpoint never became durable.
        assert committed == facts["committed"] < facts["epoch"]
        assert committed >= job_durable
        sealed = facts["sealed"]
        assert sorted(sealed) == keys
        if point == "between_barrier_and_checkpoint":
            assert "backfilling" in phases.values()
        elif point == "between_barrier_and_checkpoint_caching_up":
            # The split states of the lost checkpoint were the first to show CACHING_UP.
            assert "caching_up" in sealed.values()
            assert "caching_up" not in phases.values()
            assert "backfilling" in phases.values()
        else:
            # ... the first to show every split FINISHED.
            assert set(sealed.values()) == {"finished"}
            assert set(phases.values()) != {"finished"}
    elif point == "mid_chunk":  # a chunk half written into a staged file
        assert committed >= job_durable
        assert list((tmp_path / "table" / STAGING).rglob("*.parquet"))
    else:  # after_checkpoint_before_sink_commit: durable, pending, not committed
        table = tmp_path / "table"
        epoch = facts["epoch"]
        assert committed >= epoch >= job_durable
        assert list((table / STAGING).rglob("*.parquet"))  # its files still staged
        manifest = json.loads((table / MANIFEST).read_text(encoding="utf-8"))
        assert manifest["committed_epoch"] < epoch

    # The table before the restart: committed rows only, each once, all of them real.
    before = table_rows(tmp_path, schema)
    with redis_server.client() as conn:
        now = await anyio.to_thread.run_sync(stream_ids, conn, keys)
    assert not duplicates(before)
    assert set(before) <= {(s, i) for s, ids in now.items() for i in ids}
    if point in ("backfilling", "caching_up", "finished"):
        assert before  # the sink had committed rows of the job

    expected = await restart(tmp_path, redis_server, prefix)
    assert all(len(ids) > HISTORY for ids in expected.values())
    assert_exactly_once(table_rows(tmp_path, schema), expected)
