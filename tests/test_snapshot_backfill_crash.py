"""Snapshot backfill under real SIGKILLs: a job added over a running materialized view is
killed in each phase of its backfill (mid-vnode in the snapshot, right after the snapshot,
mid-epoch in the change log, right after it started forwarding) and between a collected
barrier and its checkpoint; restarted on the same state store, it sees the view's snapshot
then every later change exactly once.

The child (``_snapshot_child.py``, whose docstring says how each kill point is reached from
the durable state a checkpoint it injected made — no sleeps) runs the pipeline on the test's
backend and kills itself; the test then reads what is durable (the store's committed epoch, the
backfill's state table), restarts the pipeline in-process (declaring job ``copy`` again), checks
that the view holds exactly the driver's durable changes (``driver.json``, written after every
completed checkpoint), pushes more changes, waits until the job is ready and compares, per key,
what the job emitted with every change the driver made.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import anyio
import pytest
from _killed_child import MissedKillPointError, run_killed_child
from _snapshot_child import BACKFILL, BATCH_ROWS, POINTS, load_driver
from _timeouts import scaled
from test_snapshot_backfill import Upserts, assert_exactly_once, copy_job, runtime

from barrierflow.actors.backfill.snapshot_backfill import TABLE
from barrierflow.runtime import Runtime, StateStore

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

CHILD = Path(__file__).with_name("_snapshot_child.py")

#: The kill points right after a checkpoint (the only barriers are the child's own): that
#: checkpoint's state is the durable one.
AFTER_CHECKPOINT = tuple(p for p in POINTS if p != "between_barrier_and_checkpoint")


#: Runs of the child per test: a point picked from durable states that a loaded machine's
#: timing never produced (the run ended first, nothing killed) is tried again from scratch.
ATTEMPTS = 3


async def run_child(state_dir: Path, backend: str, point: str) -> tuple[dict[str, Any], Any]:
    """Run the child until it kills itself; its markers, and the kill point's facts."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return await run_killed_child(CHILD, [str(state_dir), backend, point], point)
        except MissedKillPointError:
            if attempt == ATTEMPTS:
                raise
            # Start over: a fresh store and view.
            await anyio.to_thread.run_sync(shutil.rmtree, state_dir)
            await anyio.to_thread.run_sync(state_dir.mkdir)
    raise AssertionError("unreachable")


async def durable(state_dir: Path) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """The store's committed epoch, job catalog, and the backfill's committed state."""
    async with await StateStore.open(state_dir / "state.db") as store:
        catalog = await store.read_all("__runtime__", "jobs")
        state = await store.read_all(BACKFILL, TABLE)
        return store.committed_epoch, catalog, state


async def view_rows(rt: Runtime) -> dict[int, int]:
    """The view's rows (key -> value) as of its last sealed epoch, over every vnode."""
    assert rt._store is not None
    view = rt._store.versioned("view", "view")
    rows: dict[int, int] = {}
    for vnode in range(view.vnode_count):
        part = await view.read_vnode(vnode, view.last_sealed_epoch)
        keys, values = part.column("k").to_pylist(), part.column("v").to_pylist()
        rows.update(zip(keys, values, strict=True))
    return rows


async def restart(state_dir: Path) -> tuple[Upserts, dict[int, list[Any]], dict[str, Any]]:
    """The same pipeline on the same store, job ``copy`` declared again; checks the view
    holds exactly the driver's durable changes, pushes more, runs until the job is ready and
    a checkpoint made everything durable. Returns the driver, what the job emitted, and the
    backfill's last progress detail."""
    driver = load_driver(state_dir / "driver.json")
    seen: dict[int, list[Any]] = {}
    rt = runtime(state_dir)
    rt.declare_job(copy_job(seen, batch_rows=BATCH_ROWS))
    with anyio.fail_after(scaled(60)):
        async with rt:
            await rt.checkpoint()  # every actor restored (nothing pushed yet)
            assert await view_rows(rt) == driver.state  # what was durable at the kill
            handle = rt.job("copy")
            for round_ in range(5):  # the view keeps changing while the job catches up
                await rt.push("src", driver.change(range(round_ * 30, round_ * 30 + 60)))
                await rt.push("src", driver.change(range(5000 + round_ * 5, 5005 + round_ * 5)))
                await rt.push("src", driver.delete(range(900 + round_ * 4, 902 + round_ * 4)))
                await rt.checkpoint()
            await handle.wait_ready()
            await rt.push("src", driver.change(range(100, 120)))  # live, forwarded
            await rt.push("src", driver.delete(range(120, 125)))
            await rt.checkpoint()
            detail = dict(handle.progress().actors[BACKFILL].detail)
            assert await view_rows(rt) == driver.state
    return driver, seen, detail


def vnode_rows(state: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {int(k[6:]): v for k, v in state.items() if k.startswith("vnode:")}


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.subprocess
async def test_a_snapshot_backfill_killed_and_restarted_sees_every_change_exactly_once(
    tmp_path: Path, anyio_backend: str, point: str
) -> None:
    markers, facts = await run_child(tmp_path, anyio_backend, point)
    (created,) = (int(e) for e in markers["ADDED"])

    # What the kill left durable is the state the kill point is about.
    committed, catalog, state = await durable(tmp_path)
    assert catalog["copy"]["created_epoch"] == created  # the job outlived the kill
    progress = state["progress"]
    vnodes = vnode_rows(state)
    assert sorted(vnodes) == list(range(256))
    assert progress["snapshot_epoch"] < created <= committed
    if point in AFTER_CHECKPOINT:
        assert committed == facts["epoch"]
        assert progress == facts["progress"]
    if point == "mid_snapshot":
        assert progress["phase"] == "snapshot"
        assert facts["cut"]
        for key, (emitted, total) in facts["cut"].items():
            vnode = vnodes[int(key[6:])]  # resumed mid-vnode, after its last key emitted
            assert vnode["after"] is not None
            assert not vnode["done"]
            assert 0 < vnode["rows"] == emitted < total
    elif point == "between_phases":
        # The first durable state after the snapshot: every vnode done, the change log begun
        # (the barrier replays the oldest owed epoch before it passes: the epochs must shrink).
        assert progress["phase"] == "change_log"
        assert all(v["done"] for v in vnodes.values())
        assert facts["undone"] == []
        assert progress["replayed"] >= progress["snapshot_epoch"]
    elif point == "mid_change_log_epoch":
        # An owed epoch half replayed: a restart resumes it from its offset.
        assert progress["phase"] == "change_log"
        assert all(v["done"] for v in vnodes.values())
        assert progress["replayed"] < facts["owed"] <= committed
        assert 0 < progress["log_offset"] < facts["owed_rows"]
    elif point == "right_after_forward":
        assert progress["phase"] == "forward"
        assert all(v["done"] for v in vnodes.values())
        assert progress["replayed"] == committed  # the epoch its barrier closed, replayed
    else:  # between_barrier_and_checkpoint: collected, never made durable
        assert committed == facts["committed"] < facts["epoch"]
        assert facts["sealed"]["phase"] == "change_log"
        assert progress == facts["durable"]
        assert progress["phase"] == "snapshot"  # the first commit to show change_log was lost

    driver, seen, detail = await restart(tmp_path)
    assert (detail["phase"], detail["epochs_owed"], detail["vnodes_left"]) == ("forward", 0, 0)
    assert detail["snapshot_epoch"] == progress["snapshot_epoch"]  # the same snapshot
    assert_exactly_once(driver, seen)
