"""The snapshot backfill actor in a running graph: a job added over a materialized view sees
the view as of its snapshot epoch, then every later change once, then the live view."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pytest
from _timeouts import scaled

from barrierflow import ActorFailedError, NotAMaterializedViewError, VnodeUpdateDuringBackfillError
from barrierflow.actors.backfill.materialize import Materialize
from barrierflow.actors.backfill.snapshot_backfill import SnapshotBackfill
from barrierflow.channels import Chunk, Message, Op, Throttle, Update
from barrierflow.channels.vnode import VnodeBitmap
from barrierflow.runtime import ActorContext, Job, Runtime, RuntimeConfig, StreamActor

pytestmark = pytest.mark.anyio

SCHEMA = pa.schema([pa.field("k", pa.int64(), nullable=False), ("v", pa.int64())])
Change = tuple[int, int]  # value, op


class Replay(StreamActor):
    """The job's output, exactly once with checkpoints: every change it reads, per key, in a
    state table (restored at a restart like any actor state)."""

    def __init__(self, seen: dict[int, list[Change]]) -> None:
        self.seen = seen

    async def restore(self, ctx: ActorContext) -> None:
        self.table = ctx.table("changes")
        self.seen.clear()
        for key, changes in (await self.table.items()).items():
            self.seen[int(key)] = [tuple(c) for c in changes]  # type: ignore[misc]

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk):
            rows = message.compact()
            ops = rows.ops.to_pylist() if rows.ops is not None else [0] * rows.cardinality
            keys = rows.batch.column("k").to_pylist()
            values = rows.batch.column("v").to_pylist()
            for k, v, op in zip(keys, values, ops, strict=True):
                self.seen.setdefault(k, []).append((v, op))
            for k in set(keys):
                self.table.put(str(k), [list(c) for c in self.seen[k]])
        await ctx.emit(message)


class Upserts:
    """What the driver made the view hold, and every change, per key (each change writes a
    value never written before, so a duplicate shows)."""

    def __init__(self) -> None:
        self.state: dict[int, int] = {}
        self.changes: dict[int, list[Change]] = {}
        self._value = 0

    def change(self, keys: range) -> Chunk:
        rows: list[tuple[int, int]] = []
        ops: list[int] = []
        for k in keys:
            self._value += 1
            if k in self.state:
                rows += [(k, self.state[k]), (k, self._value)]
                ops += [Op.UPDATE_DELETE, Op.UPDATE_INSERT]
            else:
                rows.append((k, self._value))
                ops.append(Op.INSERT)
            self.state[k] = self._value
        return self._chunk(rows, ops)

    def delete(self, keys: range) -> Chunk:
        rows = [(k, self.state.pop(k)) for k in keys if k in self.state]
        return self._chunk(rows, [Op.DELETE] * len(rows))

    def _chunk(self, rows: list[tuple[int, int]], ops: list[int]) -> Chunk:
        for (k, v), op in zip(rows, ops, strict=True):
            self.changes.setdefault(k, []).append((v, op))
        batch = pa.record_batch({"k": [r[0] for r in rows], "v": [r[1] for r in rows]}, SCHEMA)
        return Chunk(batch, ops)


def assert_exactly_once(driver: Upserts, seen: dict[int, list[Change]]) -> None:
    """Per key, the job saw the key's row as of the snapshot (an insert, or nothing if it did
    not exist then), then exactly the driver's later changes, in order: none lost, none twice."""
    for k in set(driver.changes) | set(seen):
        written, got = driver.changes.get(k, []), seen.get(k, [])
        ok = False
        for i in range(len(written) + 1):  # the snapshot fell after written[:i]
            live = [c for c in written[:i] if c[1] in (Op.INSERT, Op.UPDATE_INSERT)]
            gone = i > 0 and written[i - 1][1] in (Op.DELETE, Op.UPDATE_DELETE)
            head = [] if not written[:i] or gone else [(live[-1][0], int(Op.INSERT))]
            if got == head + [(v, int(op)) for v, op in written[i:]]:
                ok = True
                break
        assert ok, (k, written, got)


def runtime(tmp_path: Path, **config: Any) -> Runtime:
    config.setdefault("barrier_interval", 0.05)
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", **config))
    rt.add_source("src")
    rt.add_actor("view", lambda: Materialize(SCHEMA, ["k"]), inputs=["src"])
    return rt


def copy_job(seen: dict[int, list[Change]], view: str = "view", **options: Any) -> Job:
    job = Job("copy")
    job.add_actor(
        "backfill", lambda: SnapshotBackfill(view, **options), inputs={"upstream": "view"}
    )
    job.add_actor("replay", lambda: Replay(seen), inputs=["backfill"])
    return job


def view_pins(rt: Runtime) -> dict[str, int]:
    return rt._store.versioned("view", "view").pins  # type: ignore[union-attr]


async def until_forwarding(rt: Runtime, handle: Any) -> None:
    await handle.wait_ready()
    await rt.checkpoint()


async def test_a_job_over_a_view_sees_its_snapshot_then_every_change_once(tmp_path: Path) -> None:
    driver = Upserts()
    seen: dict[int, list[Change]] = {}
    rt = runtime(tmp_path)
    with anyio.fail_after(scaled(30)):
        async with rt:
            await rt.push("src", driver.change(range(0, 500)))
            await rt.checkpoint()
            await rt.push("src", driver.change(range(250, 700)))  # sealed, not durable yet
            handle = await rt.add_job(copy_job(seen, batch_rows=64))
            pinned = view_pins(rt)  # the snapshot epoch: the last committed one
            assert list(pinned) == ["backfill"]
            for round_ in range(3, 8):  # the view keeps changing while the job backfills
                await rt.push("src", driver.change(range(round_ * 50, round_ * 50 + 300)))
                await rt.push("src", driver.delete(range(round_ * 7, round_ * 7 + 5)))
                await rt.checkpoint()
            await until_forwarding(rt, handle)
            await rt.push("src", driver.change(range(0, 20)))  # live, forwarded
            await rt.checkpoint()
            detail = handle.progress().actors["backfill"].detail
            assert view_pins(rt) == {}  # released when the job reached forwarding
    assert detail["phase"] == "forward"
    assert detail["epochs_owed"] == 0
    assert detail["snapshot_epoch"] == pinned["backfill"]
    assert_exactly_once(driver, seen)
