"""A snapshot backfill that follows a shared view (issue 38: an aggregate kept on Spark's
executors is read from the driver like a materialized view): its snapshot is the view's last
committed epoch, every epoch the view commits later is replayed whole at the next live barrier
(never waited for), the job never forwards the live upstream (no row of the view flows on the
driver), its pin follows what it replayed, and a restart resumes where the last checkpoint
left it — each change exactly once.

No Spark: the view's store is committed in this process, as the driver's table commit does
for Spark's tasks; the live upstream is a Materialize actor the job reads barriers from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pytest
from _timeouts import scaled

from barrierflow.actors.backfill.materialize import VIEW_TABLE, Materialize
from barrierflow.actors.backfill.snapshot_progress import SnapshotPhase, SnapshotProgress
from barrierflow.channels import Op, VnodeBitmap
from barrierflow.channels.chunk import Chunk
from barrierflow.channels.messages import Message
from barrierflow.connectors.vnode_state import VnodeStateStore
from barrierflow.runtime import Job, Runtime, RuntimeConfig
from barrierflow.runtime.actor import ActorContext, StreamActor
from barrierflow.spark_bridge.shared_view import SharedView

pytestmark = pytest.mark.anyio

SCHEMA = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("total", pa.int64())])


class Store:
    """The shared view's store, and the view it should hold (the model)."""

    def __init__(self, root: Path) -> None:
        self.view = SharedView(root, "view")
        self.store = VnodeStateStore(root / VIEW_TABLE, ["k"], SCHEMA)
        self.model: dict[int, int] = {}
        self.epoch = 0

    def commit(self, changes: dict[int, int | None]) -> None:
        """Commit ``changes`` (key -> total; ``None``: a delete) as the next epoch."""
        self.epoch += 1
        keys = sorted(changes)
        rows = pa.table({"k": keys, "total": [changes[k] or 0 for k in keys]}, schema=SCHEMA)
        ops = [int(Op.DELETE if changes[k] is None else Op.UPDATE_INSERT) for k in keys]
        delta = self.store.stage(self.epoch, "t0", VnodeBitmap.full(), rows, ops)
        self.store.commit(self.epoch, [delta])
        for k, total in changes.items():
            if total is None:
                self.model.pop(k, None)
            else:
                self.model[k] = total


class Rebuild(StreamActor):
    """Rebuilds the view from what the follower emits (upserts and deletes, in order)."""

    def __init__(self, into: dict[int, int], rows: list[int]) -> None:
        self._into = into
        self._rows = rows

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk):
            chunk = message.compact()
            ops = [0] * chunk.num_rows if chunk.ops is None else chunk.ops_numpy().tolist()
            for row, op in zip(chunk.batch.to_pylist(), ops, strict=True):
                if op in (int(Op.INSERT), int(Op.UPDATE_INSERT)):
                    self._into[row["k"]] = row["total"]
                elif op == int(Op.DELETE):
                    self._into.pop(row["k"], None)
            self._rows.append(chunk.num_rows)
        await ctx.emit(message)


def runtime(tmp_path: Path) -> Runtime:
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=0.05))
    rt.add_source("src")
    rt.add_actor("view", lambda: Materialize(SCHEMA, ["k"]), inputs=["src"])
    return rt


def follow_job(store: Store, into: dict[int, int], rows: list[int], **options: Any) -> Job:
    job = Job("follow")
    job.add_actor("backfill", store.view.backfill(**options), inputs=["view"])
    job.add_actor("rebuild", lambda: Rebuild(into, rows), inputs=["backfill"])
    return job


async def test_a_follower_takes_the_snapshot_then_each_committed_epoch_once(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "shared")
    store.commit(dict.fromkeys(range(100), 1))
    store.commit({k: 2 for k in range(0, 100, 2)})
    into: dict[int, int] = {}
    rows: list[int] = []
    with anyio.fail_after(scaled(30)):
        async with runtime(tmp_path) as rt:
            handle = await rt.add_job(follow_job(store, into, rows, batch_rows=16))
            await handle.wait_ready()  # the snapshot is out, nothing owed
            assert into == store.model  # the snapshot as of epoch 2
            assert store.store.pins() == {"backfill": 2}
            snapshot = sum(rows)
            assert snapshot == 100
            store.commit({5: 50, 7: None})
            store.commit({8: 80})
            await rt.checkpoint()  # both committed epochs replayed at this barrier
            assert into == store.model
            assert sum(rows) == snapshot + 3  # each change once
            assert store.store.pins() == {"backfill": 4}  # the pin follows the replay
            await rt.checkpoint()  # nothing new committed: nothing emitted
            assert sum(rows) == snapshot + 3
            progress = rt.job("follow").progress()
    assert progress.ready  # caught up with the view
    assert progress.actors["backfill"].detail["phase"] == SnapshotPhase.CHANGE_LOG.value


async def test_a_follower_that_starts_before_the_first_commit_owes_every_epoch(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "shared")
    into: dict[int, int] = {}
    rows: list[int] = []
    with anyio.fail_after(scaled(30)):
        async with runtime(tmp_path) as rt:
            handle = await rt.add_job(follow_job(store, into, rows))
            await handle.wait_ready()
            assert into == {}
            store.commit({1: 10, 2: 20})
            await rt.checkpoint()
            assert into == {1: 10, 2: 20}


async def test_a_restarted_follower_resumes_after_the_last_epoch_it_replayed(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "shared")
    store.commit(dict.fromkeys(range(40), 1))
    into: dict[int, int] = {}
    rows: list[int] = []
    with anyio.fail_after(scaled(30)):
        async with runtime(tmp_path) as rt:
            handle = await rt.add_job(follow_job(store, into, rows))
            await handle.wait_ready()
            store.commit({1: 11})
            await rt.checkpoint()
            await rt.checkpoint()  # the replay of epoch 2 is durable
        before = sum(rows)
        store.commit({2: 22, 3: None})  # committed while the driver is down
        again = runtime(tmp_path)
        again.declare_job(follow_job(store, into, rows))  # in the catalog: it restarts
        async with again as rt:
            await rt.checkpoint()
            await rt.checkpoint()
    assert into == store.model
    assert sum(rows) == before + 2  # only epoch 3's changes: nothing replayed twice


def test_a_follower_s_progress_replays_whatever_is_owed_and_never_forwards() -> None:
    progress = SnapshotProgress.new(4, range(2))
    progress.follow = True
    progress.start_change_log()
    assert not progress.must_replay()
    progress.on_closed(5)
    progress.on_closed(6)
    progress.max_lag = 5.0  # the lag rule would wait: a follower does not
    assert progress.must_replay()
    assert progress.epoch_replayed() == 5
    assert progress.epoch_replayed() == 6
    progress.after_barrier()
    assert (progress.phase, progress.owed) == (SnapshotPhase.CHANGE_LOG, 0)
    unfollowed = SnapshotProgress.new(4, range(2))
    unfollowed.start_change_log()
    unfollowed.after_barrier()
    assert unfollowed.phase is SnapshotPhase.FORWARD
