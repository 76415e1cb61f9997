"""The snapshot backfill actor in a running graph: a job added over a materialized view sees
the view as of its snapshot epoch, then every later change once, then the live view."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import anyio.lowlevel
import pyarrow as pa
import pytest
from _timeouts import scaled

from barrierflow.actors.backfill.errors import UpstreamEndedDuringBackfillError
from barrierflow.actors.backfill.materialize import Materialize
from barrierflow.actors.backfill.snapshot_backfill import TABLE, SnapshotBackfill
from barrierflow.channels import (
    Add,
    Barrier,
    BarrierKind,
    Chunk,
    EpochPair,
    Message,
    Op,
    Pause,
    Resume,
    Stop,
    Throttle,
    Update,
)
from barrierflow.channels.errors import ProtocolError
from barrierflow.channels.vnode import VnodeBitmap
from barrierflow.errors import (
    ActorFailedError,
    InvalidArgumentError,
    NotAMaterializedViewError,
    SnapshotBackfillStateError,
    VnodeUpdateDuringBackfillError,
)
from barrierflow.runtime import (
    ActorContext,
    Job,
    Runtime,
    RuntimeConfig,
    StateStore,
    StreamActor,
)
from barrierflow.runtime.progress import Progress

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


async def test_an_empty_view_is_finished_at_once_and_forwards_live_changes(
    tmp_path: Path,
) -> None:
    driver = Upserts()
    seen: dict[int, list[Change]] = {}
    rt = runtime(tmp_path)
    with anyio.fail_after(scaled(30)):
        async with rt:
            handle = await rt.add_job(copy_job(seen))
            await until_forwarding(rt, handle)
            assert handle.progress().actors["backfill"].rows == 0
            await rt.push("src", driver.change(range(3)))
            await rt.checkpoint()
    assert_exactly_once(driver, seen)
    assert seen == {k: [(v, Op.INSERT)] for k, ((v, _),) in driver.changes.items()}


async def test_empty_vnodes_are_passed_over(tmp_path: Path) -> None:
    # Three keys: three vnodes of 256 hold rows, the others are empty.
    driver = Upserts()
    seen: dict[int, list[Change]] = {}
    rt = runtime(tmp_path)
    with anyio.fail_after(scaled(30)):
        async with rt:
            await rt.push("src", driver.change(range(3)))
            await rt.checkpoint()
            handle = await rt.add_job(copy_job(seen))
            await until_forwarding(rt, handle)
            detail = handle.progress().actors["backfill"].detail
    assert detail["vnodes_left"] == 0
    assert handle.progress().actors["backfill"].rows == 3
    assert_exactly_once(driver, seen)


async def test_a_snapshot_taken_while_non_checkpoint_barriers_are_pending(
    tmp_path: Path,
) -> None:
    # Periodic barriers are not checkpoints: at creation several epochs are sealed after the
    # committed snapshot epoch; they are owed, replayed from the (not yet durable) change log.
    driver = Upserts()
    seen: dict[int, list[Change]] = {}
    rt = runtime(tmp_path, checkpoint_frequency=10_000)
    with anyio.fail_after(scaled(30)):
        async with rt:
            await rt.push("src", driver.change(range(100)))
            committed = await rt.checkpoint()
            for round_ in range(4):
                await rt.push("src", driver.change(range(round_ * 20, round_ * 20 + 40)))
                await rt.mutate(Throttle({}))  # a non-checkpoint barrier closes the epoch
            handle = await rt.add_job(copy_job(seen, batch_rows=16))
            assert view_pins(rt) == {"backfill": committed}
            await handle.wait_ready()
            await rt.push("src", driver.change(range(90, 110)))
            await rt.checkpoint()
    assert_exactly_once(driver, seen)


async def test_a_long_catch_up_shrinks_the_lag_at_every_barrier(tmp_path: Path) -> None:
    # A slow backfill (rate limited) over a view changing at every barrier: many epochs are
    # owed when the snapshot ends; the lag it reports never grows after that, and reaches 0.
    driver = Upserts()
    seen: dict[int, list[Change]] = {}
    rt = runtime(tmp_path, barrier_interval=3600)  # every barrier is the test's own
    with anyio.fail_after(scaled(60)):
        async with rt:
            await rt.push("src", driver.change(range(400)))
            await rt.checkpoint()
            handle = await rt.add_job(copy_job(seen, batch_rows=50, rate_limit=2000))
            lags: list[tuple[str, int]] = []
            for round_ in range(400):
                await rt.push("src", driver.change(range(round_ % 40, round_ % 40 + 10)))
                await rt.checkpoint()
                detail = handle.progress().actors["backfill"].detail
                lags.append((detail["phase"], detail["epochs_owed"]))
                if detail["phase"] == "forward":
                    break
    after_snapshot = [lag for phase, lag in lags if phase != "snapshot"]
    assert len(after_snapshot) > 1  # the catch-up took several barriers
    assert max(lag for phase, lag in lags if phase == "snapshot") > 2  # with epochs owed
    assert after_snapshot == sorted(after_snapshot, reverse=True)
    assert after_snapshot[-1] == 0
    assert_exactly_once(driver, seen)


async def test_throttle_zero_pauses_the_backfill_and_a_rate_resumes_it(tmp_path: Path) -> None:
    driver = Upserts()
    seen: dict[int, list[Change]] = {}
    rt = runtime(tmp_path)
    with anyio.fail_after(scaled(30)):
        async with rt:
            await rt.push("src", driver.change(range(50)))
            await rt.checkpoint()
            handle = await rt.add_job(copy_job(seen, rate_limit=0))
            for _ in range(3):
                await rt.checkpoint()
            progress = handle.progress().actors["backfill"]
            assert (progress.rows, progress.detail["phase"]) == (0, "snapshot")
            await rt.mutate(Throttle({rt.actor_id("backfill"): None}))
            await until_forwarding(rt, handle)
    assert_exactly_once(driver, seen)


async def test_a_vnode_update_while_backfilling_fails_with_a_typed_error(tmp_path: Path) -> None:
    driver = Upserts()
    seen: dict[int, list[Change]] = {}
    rt = runtime(tmp_path)
    with anyio.fail_after(scaled(30)), pytest.raises(ActorFailedError) as failed:
        async with rt:
            await rt.push("src", driver.change(range(50)))
            await rt.checkpoint()
            await rt.add_job(copy_job(seen, rate_limit=0))
            backfill = rt.actor_id("backfill")
            await rt.mutate(Update(vnode_bitmaps={backfill: VnodeBitmap.full()}))
            await rt.checkpoint()
    error = failed.value.__cause__
    assert isinstance(error, VnodeUpdateDuringBackfillError)
    assert (error.actor, error.phase) == ("backfill", "snapshot")


async def test_a_vnode_update_after_the_backfill_is_allowed(tmp_path: Path) -> None:
    driver = Upserts()
    seen: dict[int, list[Change]] = {}
    rt = runtime(tmp_path)
    with anyio.fail_after(scaled(30)):
        async with rt:
            await rt.push("src", driver.change(range(50)))
            handle = await rt.add_job(copy_job(seen))
            await until_forwarding(rt, handle)
            backfill = rt.actor_id("backfill")
            await rt.mutate(Update(vnode_bitmaps={backfill: VnodeBitmap.full()}))
            await rt.push("src", driver.change(range(40, 60)))
            await rt.checkpoint()
    assert_exactly_once(driver, seen)


async def test_a_backfill_over_an_actor_that_is_not_a_view_is_refused(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    job = Job("copy")
    job.add_actor("backfill", lambda: SnapshotBackfill("src"), inputs={"upstream": "src"})
    with anyio.fail_after(scaled(30)):
        async with rt:
            with pytest.raises(NotAMaterializedViewError) as refused:
                await rt.add_job(job)  # refused before anything was added
            assert (refused.value.view, refused.value.argument) == ("src", "view")
            assert rt.jobs() == ["main"]
            await rt.checkpoint()  # the runtime goes on


async def test_dropping_a_job_mid_backfill_releases_its_pin(tmp_path: Path) -> None:
    driver = Upserts()
    rt = runtime(tmp_path)
    with anyio.fail_after(scaled(30)):
        async with rt:
            await rt.push("src", driver.change(range(50)))
            await rt.checkpoint()
            await rt.add_job(copy_job({}, rate_limit=0))
            assert list(view_pins(rt)) == ["backfill"]
            await rt.drop_job("copy")
            await rt.checkpoint()
            assert view_pins(rt) == {}


async def test_a_restarted_job_resumes_mid_snapshot_then_skips_to_forwarding_once_done(
    tmp_path: Path,
) -> None:
    driver = Upserts()
    seen: dict[int, list[Change]] = {}
    rt = runtime(tmp_path, barrier_interval=3600)
    with anyio.fail_after(scaled(30)):
        async with rt:
            await rt.push("src", driver.change(range(300)))
            await rt.checkpoint()
            handle = await rt.add_job(copy_job(seen, batch_rows=20, rate_limit=1000))
            while (
                handle.progress().actors.get("backfill") is None
                or not 0 < (handle.progress().actors["backfill"].rows) < 300
            ):
                await rt.checkpoint()
            await rt.push("src", driver.change(range(100, 120)))
    # The second run: the job is declared again and resumes from its committed progress.
    rt = runtime(tmp_path)
    rt.declare_job(copy_job(seen))
    with anyio.fail_after(scaled(30)):
        async with rt:
            handle = rt.job("copy")
            await rt.push("src", driver.change(range(110, 130)))
            await until_forwarding(rt, handle)
    assert_exactly_once(driver, seen)
    # The third run: the job finished; it forwards from its first barrier.
    rt = runtime(tmp_path)
    rt.declare_job(copy_job(seen))
    with anyio.fail_after(scaled(30)):
        async with rt:
            await rt.wait_running()
            await rt.checkpoint()
            detail = rt.job("copy").progress().actors["backfill"].detail
            assert (detail["phase"], detail["epochs_owed"]) == ("forward", 0)
            await rt.push("src", driver.change(range(0, 5)))
            await rt.checkpoint()
    assert_exactly_once(driver, seen)


@pytest.mark.parametrize("backfills", [1, 2])
async def test_a_parallel_view_is_backfilled_by_one_actor_or_a_parallel_group(
    tmp_path: Path, backfills: int
) -> None:
    driver = Upserts()
    seen: dict[int, list[Change]] = {}
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=0.05))
    rt.add_source("src")
    rt.add_actor(
        "view", lambda i: Materialize(SCHEMA, ["k"]), inputs=["src"], parallelism=2, key=["k"]
    )
    job = Job("copy")
    job.add_actor(
        "backfill",
        lambda *_: SnapshotBackfill("view", batch_rows=32),
        inputs=["view"],  # the group: every actor of the parallel view
        **({"parallelism": 2, "key": ["k"]} if backfills == 2 else {}),
    )
    job.add_actor("replay", lambda: Replay(seen), inputs=["backfill"])
    with anyio.fail_after(scaled(30)):
        async with rt:
            await rt.push("src", driver.change(range(300)))
            await rt.checkpoint()
            handle = await rt.add_job(job)
            await rt.push("src", driver.change(range(200, 400)))
            await rt.push("src", driver.delete(range(0, 30)))
            await until_forwarding(rt, handle)
            await rt.push("src", driver.change(range(0, 50)))
            await rt.checkpoint()
            rows = [p.rows for p in handle.progress().actors.values()]
    assert len(rows) == backfills
    assert all(rows)  # each backfill actor read its share
    assert_exactly_once(driver, seen)


async def test_barriers_win_over_snapshot_chunks(tmp_path: Path) -> None:
    # A slow snapshot (rate limited) of a big view: checkpoints still complete at once, the
    # snapshot going on across them.
    driver = Upserts()
    seen: dict[int, list[Change]] = {}
    rt = runtime(tmp_path, barrier_interval=3600)
    with anyio.fail_after(scaled(30)):
        async with rt:
            await rt.push("src", driver.change(range(5000)))
            await rt.checkpoint()
            handle = await rt.add_job(copy_job(seen, batch_rows=100, rate_limit=20_000))
            for _ in range(5):
                await rt.checkpoint()  # each returns while the snapshot is under way
            progress = handle.progress().actors["backfill"]
            assert progress.detail["phase"] == "snapshot"
            assert 0 < progress.rows < 5000
            await rt.mutate(Throttle({rt.actor_id("backfill"): None}))
            while not handle.progress().ready:
                await rt.checkpoint()
    assert_exactly_once(driver, seen)


async def test_pause_stops_the_backfill_and_resume_continues_it(tmp_path: Path) -> None:
    driver = Upserts()
    seen: dict[int, list[Change]] = {}
    rt = runtime(tmp_path, barrier_interval=3600)
    with anyio.fail_after(scaled(30)):
        async with rt:
            await rt.push("src", driver.change(range(500)))
            await rt.checkpoint()
            handle = await rt.add_job(copy_job(seen, batch_rows=10))
            await rt.mutate(Pause())  # its snapshot has hardly begun
            await rt.checkpoint()
            paused = handle.progress().actors["backfill"]
            assert paused.detail["phase"] == "snapshot"
            await rt.checkpoint()
            assert handle.progress().actors["backfill"].rows == paused.rows  # not moving
            await rt.mutate(Resume())
            while not handle.progress().ready:
                await rt.checkpoint()
            await rt.push("src", driver.change(range(490, 510)))
            await rt.checkpoint()
    assert_exactly_once(driver, seen)


async def test_an_epoch_partly_dropped_while_backfilling_is_replayed_whole(
    tmp_path: Path,
) -> None:
    # The snapshot (a few rows) ends mid-epoch, soon after the job's first barrier: the live
    # chunks of the epochs until then were all dropped, also those after the snapshot's end
    # in its epoch; those epochs are read whole from the change log, then the job forwards.
    driver = Upserts()
    seen: dict[int, list[Change]] = {}
    rt = runtime(tmp_path, barrier_interval=3600)
    with anyio.fail_after(scaled(30)):
        async with rt:
            await rt.push("src", driver.change(range(3)))
            await rt.checkpoint()
            handle = await rt.add_job(copy_job(seen))
            await rt.push("src", driver.change(range(2, 6)))  # dropped live, then replayed
            await rt.push("src", driver.delete(range(0, 1)))
            for _ in range(3):  # the snapshot's end is seen after a barrier; then one epoch
                await rt.checkpoint()
                if handle.progress().actors["backfill"].detail["phase"] == "forward":
                    break
            assert handle.progress().actors["backfill"].detail["phase"] == "forward"
            await rt.push("src", driver.change(range(5, 8)))  # forwarded live
            await rt.checkpoint()
    assert_exactly_once(driver, seen)


async def test_a_finished_job_whose_state_says_a_vnode_is_undone_is_refused(
    tmp_path: Path,
) -> None:
    # The seed's "skip backfill" assertions, as a typed error: a job restarted in phase forward
    # must have every vnode's snapshot done.
    driver = Upserts()
    rt = runtime(tmp_path)
    with anyio.fail_after(scaled(30)):
        async with rt:
            await rt.push("src", driver.change(range(10)))
            await rt.checkpoint()
            await until_forwarding(rt, await rt.add_job(copy_job({})))
    async with await StateStore.open(tmp_path / "state.db") as store:  # a damaged state
        table = store.table("backfill", "snapshot_backfill")
        table.put("vnode:7", {"after": [3], "rows": 1, "done": False})
        epoch = store.committed_epoch + 1
        table.seal(epoch)
        await store.commit(epoch)
    rt = runtime(tmp_path)
    rt.declare_job(copy_job({}))
    with anyio.fail_after(scaled(30)), pytest.raises(ActorFailedError) as failed:
        async with rt:
            await rt.checkpoint()
    error = failed.value.__cause__
    assert isinstance(error, SnapshotBackfillStateError)
    assert (error.actor, error.found) == ("backfill", "vnodes [7]")


#: The key that makes :class:`EndsOnPoison` end its stream (the driver never sends it again).
END = -1


class EndsOnPoison(StreamActor):
    """Passes its input on until a chunk holds the key :data:`END`, then returns: its output
    closes, so the view behind it ends, and the backfill's upstream with it."""

    async def run(self, ctx: ActorContext) -> None:
        async for message in ctx.messages():
            if isinstance(message, Chunk) and END in message.batch.column("k").to_pylist():
                return
            await ctx.emit(message)


class SeesTheEnd(Replay):
    """:class:`Replay` that tells when its input (the backfill's output) ended cleanly."""

    def __init__(self, seen: dict[int, list[Change]], ended: anyio.Event) -> None:
        super().__init__(seen)
        self.ended = ended

    async def run(self, ctx: ActorContext) -> None:
        await super().run(ctx)
        self.ended.set()


def endable_runtime(tmp_path: Path) -> Runtime:
    """``src -> gate -> view``: pushing the key :data:`END` ends the view's output stream."""
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=3600))
    rt.add_source("src")
    rt.add_actor("gate", EndsOnPoison, inputs=["src"])
    rt.add_actor("view", lambda: Materialize(SCHEMA, ["k"]), inputs=["gate"])
    return rt


def end_of_stream() -> Chunk:
    return Chunk(pa.record_batch({"k": [END], "v": [0]}, SCHEMA))


def endable_job(ended: anyio.Event, **options: Any) -> Job:
    """:func:`copy_job` whose output actor sets ``ended`` when the backfill's output ends
    (whether the backfill returned or failed): a silent end shows at once, no timeout."""
    job = Job("copy")
    job.add_actor(
        "backfill", lambda: SnapshotBackfill("view", **options), inputs={"upstream": "view"}
    )
    job.add_actor("replay", lambda: SeesTheEnd({}, ended), inputs=["backfill"])
    return job


async def test_upstream_ending_mid_snapshot_fails_with_the_epochs_owed(tmp_path: Path) -> None:
    # The seed's `anyhow!("end of upstream")`: the live chunks dropped while backfilling are
    # owed; an upstream that ends before they are replayed is an error, not a silent end.
    driver = Upserts()
    rt = endable_runtime(tmp_path)
    with anyio.fail_after(scaled(30)), pytest.raises(ActorFailedError) as failed:
        async with rt:
            await rt.push("src", driver.change(range(50)))
            await rt.checkpoint()
            ended = anyio.Event()
            handle = await rt.add_job(endable_job(ended, rate_limit=0))  # the snapshot waits
            closed = []
            for round_ in range(3):  # live epochs, dropped: owed
                await rt.push("src", driver.change(range(round_ * 10, round_ * 10 + 20)))
                closed.append(await rt.checkpoint())
            detail = handle.progress().actors["backfill"].detail
            assert (detail["phase"], detail["epochs_owed"]) == ("snapshot", 4)  # and Add's
            await rt.push("src", end_of_stream())
            await ended.wait()  # the backfill's output closed
            await rt.checkpoint()  # fails (after a silent end, it would complete)
    assert failed.value.actor == "backfill"
    error = failed.value.__cause__
    assert isinstance(error, UpstreamEndedDuringBackfillError)
    assert (error.actor, error.phase) == ("backfill", "snapshot")
    assert len(error.epochs_owed) == 4
    assert error.epochs_owed[1:] == closed
    assert error.vnodes_left  # the snapshot had not begun
    assert "end of the upstream" in str(error)
    assert "expected" in str(error)


class HeldBack(SeesTheEnd):
    """:class:`SeesTheEnd` that holds the first chunk until ``release`` is set: the backfill,
    which emits without waiting (no rate limit), blocks on a full output meanwhile."""

    def __init__(self, ended: anyio.Event, reached: anyio.Event, release: anyio.Event) -> None:
        super().__init__({}, ended)
        self.reached, self.release = reached, release

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk) and not self.release.is_set():
            self.reached.set()
            await self.release.wait()
        await super().process(message, ctx)


async def test_upstream_ending_while_the_backfill_emits_without_waiting_fails_too(
    tmp_path: Path,
) -> None:
    # Between two chunks the backfill only polls its upstream (barriers first): the end of
    # the upstream seen there is the same error as when it waits for a barrier.
    driver = Upserts()
    ended, reached, release = anyio.Event(), anyio.Event(), anyio.Event()
    rt = endable_runtime(tmp_path)
    job = Job("copy")
    job.add_actor(
        "backfill", lambda: SnapshotBackfill("view", batch_rows=10), inputs={"upstream": "view"}
    )
    job.add_actor("replay", lambda: HeldBack(ended, reached, release), inputs=["backfill"])
    with anyio.fail_after(scaled(30)), pytest.raises(ActorFailedError) as failed:
        async with rt:
            await rt.push("src", driver.change(range(2000)))
            await rt.checkpoint()
            await rt.add_job(job)
            await reached.wait()  # the snapshot is under way, its output full soon
            await rt.push("src", end_of_stream())
            await anyio.wait_all_tasks_blocked()  # the gate and the view have ended
            release.set()  # the backfill goes on emitting, polls, finds the end
            await ended.wait()
            await rt.checkpoint()  # fails (after a silent end, it would complete)
    error = failed.value.__cause__
    assert isinstance(error, UpstreamEndedDuringBackfillError)
    assert (error.actor, error.phase) == ("backfill", "snapshot")
    assert error.vnodes_left


async def test_upstream_ending_mid_change_log_fails_with_the_epochs_owed(
    tmp_path: Path,
) -> None:
    driver = Upserts()
    rt = endable_runtime(tmp_path)
    with anyio.fail_after(scaled(30)), pytest.raises(ActorFailedError) as failed:
        async with rt:
            await rt.checkpoint()  # the snapshot epoch: an empty view
            ended = anyio.Event()
            handle = await rt.add_job(endable_job(ended, batch_rows=10, rate_limit=0))
            for round_ in range(3):  # owed epochs of 300 changes each
                await rt.push("src", driver.change(range(round_ * 100, round_ * 100 + 300)))
                await rt.checkpoint()
            # 10 rows/s: the snapshot (empty) ends at once, the replay between barriers
            # crawls; each barrier replays whole epochs but owes one more.
            await rt.mutate(Throttle({rt.actor_id("backfill"): 10}))
            detail = handle.progress().actors["backfill"].detail
            while detail["phase"] == "snapshot":
                await rt.checkpoint()
                detail = handle.progress().actors["backfill"].detail
            assert detail["phase"] == "change_log"
            assert detail["epochs_owed"] > 0
            await rt.push("src", end_of_stream())
            await ended.wait()  # the backfill's output closed
            await rt.checkpoint()  # fails (after a silent end, it would complete)
    error = failed.value.__cause__
    assert isinstance(error, UpstreamEndedDuringBackfillError)
    assert (error.actor, error.phase, error.vnodes_left) == ("backfill", "change_log", [])
    assert len(error.epochs_owed) == detail["epochs_owed"]


async def test_upstream_ending_after_the_backfill_forwards_ends_it_cleanly(
    tmp_path: Path,
) -> None:
    driver = Upserts()
    seen: dict[int, list[Change]] = {}
    ended = anyio.Event()
    rt = endable_runtime(tmp_path)
    job = Job("copy")
    job.add_actor("backfill", lambda: SnapshotBackfill("view"), inputs={"upstream": "view"})
    job.add_actor("replay", lambda: SeesTheEnd(seen, ended), inputs=["backfill"])
    with anyio.fail_after(scaled(30)):
        async with rt:
            await rt.push("src", driver.change(range(20)))
            await rt.checkpoint()
            handle = await rt.add_job(job)
            while not handle.progress().ready:  # the test's own barriers
                await rt.checkpoint()
            await rt.checkpoint()
            assert handle.progress().actors["backfill"].detail["phase"] == "forward"
            await rt.push("src", driver.change(range(10, 30)))  # forwarded live
            await rt.checkpoint()
            await rt.push("src", end_of_stream())
            await ended.wait()  # the backfill returned, its output closed: no error
    assert_exactly_once(driver, seen)


# --- The actor alone: its rules one by one ------------------------------------------------------
#
# The actor runs here without a runtime: a stand-in context hands it the upstream's messages and
# records what it emits, the progress it reports and the state it saves at each barrier; a
# stand-in view holds the snapshot (as of one epoch) and each later epoch's change log. Nothing
# sleeps: each step waits until every task is blocked (:func:`anyio.wait_all_tasks_blocked`) and
# then looks at what the actor did. A rate so low that the next chunk is due in years lets
# exactly one chunk go between two barriers.

ACTOR, ACTOR_ID = "backfill", 5
VNODES = 4  # a key's vnode in the stand-in view: key % VNODES
SNAPSHOT_EPOCH = 10
CRAWL = 1e-9  # rows per second: one chunk, then the next is due in years
Row = tuple[int, int, int]  # key, value, op


class FakeView:
    """A view's versioned table as the actor reads it: the rows as of ``snapshot_epoch``
    (key → value), and what each later epoch wrote (key, value, op), in the order written.
    Reading a version other than ``snapshot_epoch`` fails the actor."""

    primary_key = ("k",)

    def __init__(
        self,
        snapshot: dict[int, int] | None = None,
        logs: dict[int, list[Row]] | None = None,
        *,
        snapshot_epoch: int = SNAPSHOT_EPOCH,
        vnode_count: int = VNODES,
    ) -> None:
        self.snapshot = snapshot or {}
        self.logs = logs or {}
        self.snapshot_epoch = snapshot_epoch
        self.vnode_count = vnode_count
        self.pins: dict[str, int] = {}
        #: (vnode, after) of every snapshot read, and the epochs whose change log was read.
        self.reads: list[tuple[int, list[Any] | None]] = []
        self.log_reads: list[int] = []

    def pin(self, reader: str, epoch: int) -> None:
        self.pins[reader] = epoch

    def unpin(self, reader: str) -> None:
        self.pins.pop(reader, None)

    def epochs_after(self, epoch: int) -> list[int]:
        return sorted(e for e in self.logs if e > epoch)

    async def read_vnode(
        self, vnode: int, epoch: int, *, after: list[Any] | None = None
    ) -> pa.Table:
        await anyio.lowlevel.checkpoint()
        assert epoch == self.snapshot_epoch, f"snapshot read as of {epoch}"
        self.reads.append((vnode, after))
        keys = sorted(
            k
            for k in self.snapshot
            if k % self.vnode_count == vnode and (after is None or k > after[0])
        )
        return pa.table({"k": keys, "v": [self.snapshot[k] for k in keys]}, SCHEMA)

    async def change_log(self, epoch: int, vnodes: VnodeBitmap | None = None) -> pa.Table:
        await anyio.lowlevel.checkpoint()
        self.log_reads.append(epoch)
        rows = [
            r
            for r in self.logs.get(epoch, [])
            if vnodes is None or r[0] % self.vnode_count in vnodes
        ]
        return pa.table(
            {
                "k": pa.array([r[0] for r in rows], pa.int64()),
                "v": pa.array([r[1] for r in rows], pa.int64()),
                "_op": pa.array([r[2] for r in rows], pa.int8()),
            }
        )


class FakeMessages:
    """``ctx.messages()``: ends (``EndOfStream``) with the input or once the actor finished."""

    def __init__(self, ctx: FakeContext, receive: Any) -> None:
        self.ctx, self.input = ctx, receive

    async def receive(self) -> Message:
        if self.ctx.finished:
            raise anyio.EndOfStream
        try:
            message: Message = await self.input.receive()
        except anyio.EndOfStream:
            self.ctx.finished = True
            raise
        return message

    def receive_nowait(self) -> Message | None:
        if self.ctx.finished:
            raise anyio.EndOfStream
        try:
            message: Message = self.input.receive_nowait()
        except anyio.WouldBlock:
            return None
        except anyio.EndOfStream:
            self.ctx.finished = True
            raise
        return message


class FakeTable:
    def __init__(self, rows: dict[str, Any]) -> None:
        self.rows = rows

    def put(self, key: str, value: Any) -> None:
        self.rows[key] = copy.deepcopy(value)

    async def items(self) -> dict[str, Any]:
        await anyio.lowlevel.checkpoint()
        return copy.deepcopy(self.rows)


class FakeContext:
    """What :meth:`SnapshotBackfill.run` uses of an actor context."""

    def __init__(
        self,
        receive: Any,
        views: list[FakeView],
        state: dict[str, Any],
        *,
        vnode_bitmap: VnodeBitmap | None = None,
        committed_epoch: int = SNAPSHOT_EPOCH,
    ) -> None:
        self.name, self.actor_id = ACTOR, ACTOR_ID
        self.vnode_bitmap = vnode_bitmap
        self.committed_epoch = committed_epoch
        self.finished = False
        self.views = views
        self.state = state
        self.receive = receive
        self.emitted: list[Message] = []
        self.progress: list[Progress] = []
        #: The state rows as each barrier was emitted (what a checkpoint at it keeps).
        self.saved: list[dict[str, Any]] = []
        self.view_reads: list[tuple[str, str]] = []
        #: When each message was emitted (``anyio.current_time()``).
        self.times: list[float] = []
        self.returned = False
        self._emitted = anyio.Event()

    async def until(self, done: Any) -> None:
        """Wait until ``done()`` holds (checked after every message emitted)."""
        while not done():
            await self._emitted.wait()

    def messages(self) -> FakeMessages:
        return FakeMessages(self, self.receive)

    def read_view(self, view: str, name: str) -> list[FakeView]:
        self.view_reads.append((view, name))
        return self.views

    def table(self, name: str) -> FakeTable:
        assert name == TABLE
        return FakeTable(self.state)

    def report_progress(self, progress: Progress) -> None:
        self.progress.append(progress)

    async def emit(self, message: Message) -> None:
        await anyio.lowlevel.checkpoint()
        self.emitted.append(message)
        self.times.append(anyio.current_time())
        self._emitted.set()
        self._emitted = anyio.Event()
        if isinstance(message, Barrier):
            self.saved.append(copy.deepcopy(self.state))
            if message.is_stop(self.actor_id):
                self.finished = True

    def trace(self) -> list[Any]:
        """What went out: a barrier as its ``curr`` epoch, a chunk as its rows (key, value,
        op)."""
        out: list[Any] = []
        for message in self.emitted:
            if isinstance(message, Barrier):
                out.append(message.epoch.curr)
            else:
                assert isinstance(message, Chunk)
                out.append(chunk_rows(message))
        return out

    def rows(self) -> list[Row]:
        """Every row emitted, in order."""
        return [r for m in self.emitted if isinstance(m, Chunk) for r in chunk_rows(m)]


def chunk_rows(chunk: Chunk) -> list[Row]:
    ops = [0] * chunk.num_rows if chunk.ops is None else chunk.ops.to_pylist()
    keys, values = chunk.batch.column("k").to_pylist(), chunk.batch.column("v").to_pylist()
    return [(k, v, int(op)) for k, v, op in zip(keys, values, ops, strict=True)]


class Live:
    """The live upstream: barriers with consecutive epochs, and chunks (which the actor drops
    while it backfills). Each is queued at once (the actor sees it when the test settles)."""

    def __init__(self, send: Any, prev: int) -> None:
        self.send = send
        self.prev = prev

    def barrier(self, mutation: Any = None, *, kind: BarrierKind = BarrierKind.CHECKPOINT) -> int:
        """Queue the barrier closing the epoch in progress; returns the epoch it closes."""
        closed, self.prev = self.prev, self.prev + 1
        self.send.send_nowait(Barrier(EpochPair(self.prev, closed), kind, mutation))
        return closed

    def chunk(self, *keys: int) -> None:
        batch = pa.record_batch({"k": list(keys), "v": [0] * len(keys)}, SCHEMA)
        self.send.send_nowait(Chunk(batch))

    def end(self) -> None:
        """The upstream ends."""
        self.send.close()


@asynccontextmanager
async def backfilling(
    actor: SnapshotBackfill,
    views: list[FakeView],
    state: dict[str, Any] | None = None,
    *,
    first_prev: int = SNAPSHOT_EPOCH,
    **context: Any,
) -> AsyncIterator[tuple[Live, FakeContext, list[BaseException]]]:
    """Run ``actor`` against a stand-in context; yields the live upstream (whose next barrier
    closes ``first_prev``), the context, and the error the actor failed with (empty while it
    runs, or if it returned)."""
    send, receive = anyio.create_memory_object_stream[Message](64)
    ctx = FakeContext(receive, views, {} if state is None else state, **context)
    failed: list[BaseException] = []

    async def run() -> None:
        try:
            await actor.run(ctx)  # type: ignore[arg-type]
        except Exception as exc:  # the test asserts on it
            failed.append(exc)
        else:
            ctx.returned = True

    with anyio.fail_after(scaled(10)):
        async with send, receive, anyio.create_task_group() as tg:
            tg.start_soon(run)
            yield Live(send, first_prev), ctx, failed
            tg.cancel_scope.cancel()


settle = anyio.wait_all_tasks_blocked


def snapshot_rows(view: FakeView, vnodes: Any = range(VNODES)) -> list[Row]:
    """The view's snapshot in the order the actor reads it: by vnode, then by key."""
    return [
        (k, view.snapshot[k], 0)
        for vnode in vnodes
        for k in sorted(view.snapshot)
        if k % view.vnode_count == vnode
    ]


def busy_view() -> FakeView:
    """A snapshot over every vnode, and epochs 11 and 12 written after it (12 is still in
    progress when the job's first barrier comes: that barrier closes it)."""
    return FakeView(
        {0: 100, 1: 101, 2: 102, 5: 105},
        {11: [(1, 101, 2), (1, 111, 3)], 12: [(7, 107, 0), (0, 100, 1)]},
    )


def reported(ctx: FakeContext) -> list[tuple[bool, int, dict[str, Any]]]:
    """The progress reported with each barrier: (finished, rows, detail)."""
    return [(p.finished, p.rows, dict(p.detail)) for p in ctx.progress]


def fresh_vnodes(*vnodes: int) -> dict[str, Any]:
    return {f"vnode:{v}": {"after": None, "rows": 0, "done": False} for v in vnodes}


async def test_the_snapshot_then_each_owed_epoch_once_then_the_live_upstream() -> None:
    view = busy_view()
    async with backfilling(SnapshotBackfill("view", batch_rows=3), [view], first_prev=12) as (
        live,
        ctx,
        failed,
    ):
        live.barrier()
        live.chunk(9)  # dropped: its epoch is owed
        await settle()
        assert ctx.view_reads == [("view", "view")]
        assert view.pins == {ACTOR: SNAPSHOT_EPOCH}
        snapshot = snapshot_rows(view)
        assert ctx.trace() == [
            13,
            snapshot[:3],
            snapshot[3:],
            view.logs[11],
            view.logs[12],
        ]
        # Each vnode read once, each epoch's change log once.
        assert view.reads == [(0, None), (1, None), (2, None), (3, None)]
        assert view.log_reads == [11, 12]
        view.logs[13] = [(3, 103, 0)]
        live.barrier()  # closes 13: the only epoch owed, replayed before the barrier
        live.chunk(4)  # the epoch it opens is forwarded live
        await settle()
        assert ctx.trace()[5:] == [[(3, 103, 0)], 14, [(4, 0, 0)]]
        assert view.pins == {}
        assert not failed
    assert reported(ctx) == [
        (
            False,
            0,
            {
                "phase": "snapshot",
                "snapshot_epoch": 10,
                "epochs_owed": 2,
                "vnodes_left": 4,
                "vnodes_total": 4,
            },
        ),
        (
            True,
            9,
            {
                "phase": "forward",
                "snapshot_epoch": 10,
                "epochs_owed": 0,
                "vnodes_left": 0,
                "vnodes_total": 4,
            },
        ),
    ]
    head = {"snapshot_epoch": 10, "log_offset": 0}
    assert ctx.saved == [
        {
            "progress": {"phase": "snapshot", "replayed": 10, "rows": 0, **head},
            **fresh_vnodes(0, 1, 2, 3),
        },
        {
            "progress": {"phase": "forward", "replayed": 13, "rows": 9, **head},
            "vnode:0": {"after": [0], "rows": 1, "done": True},
            "vnode:1": {"after": [5], "rows": 2, "done": True},
            "vnode:2": {"after": [2], "rows": 1, "done": True},
            "vnode:3": {"after": None, "rows": 0, "done": True},
        },
    ]


@pytest.mark.parametrize(
    ("options", "argument", "expected", "got"),
    [
        ({"view": ""}, "view", "the name of a Materialize actor", ""),
        ({"view": 3}, "view", "the name of a Materialize actor", 3),
        ({"batch_rows": 0}, "batch_rows", "a positive int", 0),
        ({"batch_rows": True}, "batch_rows", "a positive int", True),
        ({"batch_rows": 2.0}, "batch_rows", "a positive int", 2.0),
        (
            {"rate_limit": -1},
            "rate_limit",
            "None or a finite rate >= 0 (rows per second)",
            -1,
        ),
    ],
)
def test_a_bad_argument_is_refused(
    options: dict[str, Any], argument: str, expected: str, got: Any
) -> None:
    options = {"view": "view", **options}
    with pytest.raises(InvalidArgumentError) as refused:
        SnapshotBackfill(**options)
    error = refused.value
    assert (error.argument, error.expected, error.got) == (argument, expected, got)


async def test_chunks_hold_batch_rows_rows_4096_by_default() -> None:
    big = FakeView({4 * i: i for i in range(5000)})  # every key in vnode 0
    tiny = FakeView({0: 0, 4: 1, 1: 2})
    async with backfilling(SnapshotBackfill("view"), [big]) as (live, ctx, _):
        live.barrier()
        await settle()
        assert [len(c) for c in ctx.trace()[1:]] == [4096, 904]
        assert big.reads == [(0, None), (1, None), (2, None), (3, None)]  # each vnode once
    async with backfilling(SnapshotBackfill("view", batch_rows=1), [tiny]) as (live, ctx, _):
        live.barrier()
        await settle()
        assert ctx.trace()[1:] == [[(0, 0, 0)], [(4, 1, 0)], [(1, 2, 0)]]


def startup(graph: dict[str, Any]) -> Any:
    return SimpleNamespace(graph=graph)


def materialize() -> Materialize:
    return Materialize(SCHEMA, ["k"])


@pytest.mark.parametrize(
    ("view", "graph"),
    [
        ("view", {"src": object(), "view": materialize()}),
        ("a.b", {"src": object(), "a.b.0": materialize(), "a.b.1": materialize()}),
    ],
)
def test_a_materialized_view_or_a_parallel_group_of_them_is_accepted(
    view: str, graph: dict[str, Any]
) -> None:
    SnapshotBackfill(view).check_startup(startup(graph))
    # The same graph with those actors not views is refused: it is them the check accepted.
    not_views = {name: actor if name == "src" else object() for name, actor in graph.items()}
    with pytest.raises(NotAMaterializedViewError) as refused:
        SnapshotBackfill(view).check_startup(startup(not_views))
    assert refused.value.view == view


@pytest.mark.parametrize(
    ("view", "graph"),
    [
        ("view", {"src": object()}),  # no such actor
        ("src", {"src": object(), "view": materialize()}),  # not a view
        ("view", {"view.0": materialize(), "view.1": object()}),  # a group not all views
    ],
)
def test_anything_but_a_materialized_view_is_refused_before_the_job_is_added(
    view: str, graph: dict[str, Any]
) -> None:
    with pytest.raises(NotAMaterializedViewError) as refused:
        SnapshotBackfill(view).check_startup(startup(graph))
    error = refused.value
    assert (error.argument, error.view, error.table, error.got) == ("view", view, "view", view)


async def test_a_view_gone_when_the_job_starts_is_refused() -> None:
    async with backfilling(SnapshotBackfill("view"), []) as (live, ctx, failed):
        live.barrier()
        await settle()
    (error,) = failed
    assert isinstance(error, NotAMaterializedViewError)
    assert (error.view, error.table) == ("view", "view")
    assert ctx.view_reads == [("view", "view")]
    assert ctx.emitted == []


async def test_the_first_message_must_be_a_barrier() -> None:
    async with backfilling(SnapshotBackfill("view"), [busy_view()]) as (live, ctx, failed):
        live.chunk(1)
        live.barrier()
        await settle()
    (error,) = failed
    assert type(error) is ProtocolError
    assert str(error) == "snapshot backfill backfill: expected a barrier first"
    assert ctx.emitted == []


async def test_barriers_go_before_every_snapshot_or_change_log_chunk() -> None:
    view = busy_view()
    async with backfilling(SnapshotBackfill("view", batch_rows=3), [view], first_prev=12) as (
        live,
        ctx,
        _,
    ):
        live.barrier()
        live.chunk(9)
        live.barrier()  # waiting when the first chunk could go
        await settle()
        assert ctx.trace()[:2] == [13, 14]
        assert ctx.rows() == snapshot_rows(view) + view.logs[11] + view.logs[12]


async def test_the_view_is_pinned_at_the_snapshot_epoch_until_the_job_forwards() -> None:
    # A parallel view: every actor's table pinned, read and released; their rows together.
    left = FakeView({0: 100, 2: 102}, {11: [(0, 100, 1)]})
    right = FakeView({1: 101, 5: 105}, {11: [(5, 115, 0)]})
    async with backfilling(
        SnapshotBackfill("view", rate_limit=0), [left, right], first_prev=11
    ) as (live, ctx, _):
        live.barrier()
        await settle()
        assert (left.pins, right.pins) == ({ACTOR: 10}, {ACTOR: 10})
        assert ctx.trace() == [12]  # paused by its rate
        live.barrier(Throttle({ACTOR_ID: None}))
        await settle()
        assert (left.pins, right.pins) == ({ACTOR: 10}, {ACTOR: 10})  # 11 and 12 owed
        assert ctx.trace() == [
            12,
            13,
            [(0, 100, 0), (1, 101, 0), (5, 105, 0), (2, 102, 0)],
            [(0, 100, 1), (5, 115, 0)],
        ]
        live.barrier()
        await settle()
        assert (left.pins, right.pins) == ({}, {})
        assert ctx.trace()[4:] == [14]


async def test_a_job_whose_snapshot_epoch_is_the_last_closed_one_owes_no_epoch_before_it() -> None:
    # The job's first barrier closes the snapshot epoch itself: its change log is in the
    # snapshot, nothing before that barrier is owed.
    view = FakeView({1: 101}, {10: [(1, 101, 0)], 11: [(1, 101, 1)]})
    async with backfilling(SnapshotBackfill("view"), [view], first_prev=10) as (live, ctx, _):
        live.barrier()
        await settle()
        assert ctx.trace() == [11, [(1, 101, 0)]]
        live.barrier()  # closes 11: owed, replayed
        await settle()
        assert ctx.trace()[2:] == [[(1, 101, 1)], 12]
    assert reported(ctx)[0][2]["epochs_owed"] == 0


async def test_epochs_the_view_sealed_after_the_first_barrier_are_owed_only_once_closed() -> None:
    # The view runs ahead of the job: it has sealed epoch 13 when the job's first barrier
    # (closing 12) comes; 13 is owed when the job's own barrier closes it, not before.
    view = FakeView({}, {11: [(1, 1, 0)], 13: [(2, 2, 0)]})
    async with backfilling(SnapshotBackfill("view"), [view], first_prev=12) as (live, ctx, failed):
        live.barrier()
        await settle()
        assert ctx.trace() == [13, [(1, 1, 0)]]
        live.barrier()
        await settle()
        assert ctx.trace()[2:] == [[(2, 2, 0)], 14]
        assert not failed
    assert [r[2]["epochs_owed"] for r in reported(ctx)] == [2, 0]


def state_at(phase: str, replayed: int, rows: int = 0, **vnodes: Any) -> dict[str, Any]:
    """A saved state: the progress row, and ``vnode_<v>=(after, rows, done)`` rows."""
    saved: dict[str, Any] = {
        "progress": {
            "phase": phase,
            "snapshot_epoch": SNAPSHOT_EPOCH,
            "replayed": replayed,
            "log_offset": 0,
            "rows": rows,
        }
    }
    for name, (after, count, done) in vnodes.items():
        row = {"after": after, "rows": count, "done": done}
        saved[f"vnode:{name.removeprefix('vnode_')}"] = row
    return saved


ALL_DONE = {f"vnode_{v}": (None, 0, True) for v in range(VNODES)}


async def test_a_restart_mid_snapshot_resumes_after_the_last_key_emitted() -> None:
    view = FakeView({0: 100, 4: 104, 8: 108, 1: 101}, {11: [(4, 114, 3)]})
    state: dict[str, Any] = {}
    async with backfilling(
        SnapshotBackfill("view", batch_rows=2, rate_limit=CRAWL), [view], state
    ) as (live, ctx, _):
        live.barrier()
        await settle()
        live.barrier()  # a checkpoint: its state is what the restart resumes from
        await settle()
        assert ctx.trace() == [11, [(0, 100, 0), (4, 104, 0)], 12]
    saved = ctx.saved[-1]
    assert saved["vnode:0"] == {"after": [4], "rows": 2, "done": False}
    view.reads.clear()
    async with backfilling(
        SnapshotBackfill("view", batch_rows=2), [view], saved, first_prev=12
    ) as (live, again, failed):
        live.barrier()
        await settle()
        assert view.pins == {ACTOR: SNAPSHOT_EPOCH}
        assert view.reads[0] == (0, [4])
        assert again.trace() == [13, [(8, 108, 0), (1, 101, 0)], [(4, 114, 3)]]
        assert not failed
    assert reported(again)[0] == (
        False,
        2,
        {
            "phase": "snapshot",
            "snapshot_epoch": 10,
            "epochs_owed": 2,
            "vnodes_left": 4,
            "vnodes_total": 4,
        },
    )


async def test_a_restart_mid_change_log_resumes_mid_epoch() -> None:
    view = FakeView({}, {11: [(1, 1, 0), (2, 2, 0), (3, 3, 0)], 12: [(1, 1, 1)]})
    state: dict[str, Any] = {}
    async with backfilling(
        SnapshotBackfill("view", batch_rows=2, rate_limit=CRAWL), [view], state, first_prev=12
    ) as (live, ctx, _):
        live.barrier()
        await settle()
        live.barrier(Pause())  # paused: no replay held this barrier
        await settle()
        assert ctx.trace() == [13, [(1, 1, 0), (2, 2, 0)], 14]
    saved = ctx.saved[-1]
    assert saved["progress"] == {
        "phase": "change_log",
        "snapshot_epoch": 10,
        "replayed": 10,
        "log_offset": 2,
        "rows": 2,
    }
    async with backfilling(
        SnapshotBackfill("view", batch_rows=2), [view], saved, first_prev=14
    ) as (live, again, failed):
        live.barrier()
        await settle()
        assert view.pins == {ACTOR: SNAPSHOT_EPOCH}
        assert again.trace() == [15, [(3, 3, 0)], [(1, 1, 1)]]
        live.barrier()  # closes 15, the only one owed: forwards
        await settle()
        assert again.trace()[3:] == [16]
        assert not failed
    assert [r[2]["epochs_owed"] for r in reported(again)] == [3, 0]  # 11, 12, 14 (13 wrote
    # nothing), then none
    assert reported(again)[1][1] == 4


async def test_a_finished_job_forwards_from_its_first_barrier() -> None:
    view = busy_view()
    saved = state_at("forward", 13, rows=9, **ALL_DONE)
    async with backfilling(SnapshotBackfill("view"), [view], saved, first_prev=20) as (
        live,
        ctx,
        _,
    ):
        live.barrier()
        live.chunk(1)
        await settle()
        assert ctx.trace() == [21, [(1, 0, 0)]]
        assert (view.pins, view.reads, view.log_reads) == ({}, [], [])
    assert reported(ctx) == [
        (
            True,
            9,
            {
                "phase": "forward",
                "snapshot_epoch": 10,
                "epochs_owed": 0,
                "vnodes_left": 0,
                "vnodes_total": 4,
            },
        ),
    ]


async def test_a_finished_job_whose_state_has_an_unfinished_vnode_is_refused() -> None:
    saved = state_at("forward", 13, **{**ALL_DONE, "vnode_2": ([5], 1, False)})
    async with backfilling(SnapshotBackfill("view"), [busy_view()], saved) as (live, ctx, failed):
        live.barrier()
        await settle()
    (error,) = failed
    assert isinstance(error, SnapshotBackfillStateError)
    assert (error.actor, error.expected, error.found) == (
        "backfill",
        "every vnode's snapshot done in a finished job",
        "vnodes [2]",
    )
    assert ctx.emitted == []


async def test_a_job_started_paused_backfills_nothing_until_resumed() -> None:
    view = busy_view()
    async with backfilling(SnapshotBackfill("view"), [view], first_prev=12) as (live, ctx, _):
        live.barrier(Add(pause=True))
        await settle()
        live.barrier()
        await settle()
        assert ctx.trace() == [13, 14]
        live.barrier(Resume())
        await settle()
        assert ctx.trace()[:3] == [13, 14, 15]
        assert ctx.rows() == snapshot_rows(view) + view.logs[11] + view.logs[12]


async def test_pause_stops_the_backfill_and_the_lag_rule_until_resume() -> None:
    view = busy_view()
    async with backfilling(SnapshotBackfill("view"), [view], first_prev=12) as (live, ctx, _):
        live.barrier()
        live.barrier(Pause())  # before any chunk
        await settle()
        live.barrier()
        await settle()
        assert ctx.trace() == [13, 14, 15]
        live.barrier(Resume())
        await settle()
        assert ctx.trace()[3] == 16
        assert ctx.rows() == snapshot_rows(view) + view.logs[11] + view.logs[12]


async def test_a_throttle_to_zero_pauses_the_backfill_and_a_rate_resumes_it() -> None:
    view = busy_view()
    async with backfilling(SnapshotBackfill("view"), [view], first_prev=12) as (live, ctx, _):
        live.barrier()
        live.barrier(Throttle({ACTOR_ID: 0, ACTOR_ID + 1: None}))
        await settle()
        live.barrier(Throttle({ACTOR_ID + 1: None}))  # another actor's
        await settle()
        assert ctx.trace() == [13, 14, 15]
        live.barrier(Throttle({ACTOR_ID: None}))
        await settle()
        assert ctx.trace()[3] == 16
        assert ctx.rows() == snapshot_rows(view) + view.logs[11] + view.logs[12]


async def test_a_rate_limit_lets_one_chunk_go_per_its_rows_over_the_rate() -> None:
    # The first chunk goes at once; the next is due in years: one chunk between barriers.
    view = busy_view()
    async with backfilling(
        SnapshotBackfill("view", batch_rows=2, rate_limit=CRAWL), [view], first_prev=12
    ) as (live, ctx, _):
        live.barrier()
        await settle()
        live.barrier()
        await settle()
        assert ctx.trace() == [13, snapshot_rows(view)[:2], 14]


async def test_the_rate_limit_spaces_the_chunks_in_time() -> None:
    # 10 rows a chunk at 40 rows/s: the fourth chunk goes no sooner than 0.75 s after the
    # first could (a lower bound only: a slow machine makes it later, never sooner).
    view = FakeView({4 * i: i for i in range(40)})
    async with backfilling(SnapshotBackfill("view", batch_rows=10, rate_limit=40), [view]) as (
        live,
        ctx,
        _,
    ):
        started = anyio.current_time()
        live.barrier()
        await ctx.until(lambda: len(ctx.rows()) == 40)
        assert ctx.times[4] - started >= 0.75
        assert [len(c) for c in ctx.trace()[1:]] == [10, 10, 10, 10]


async def test_a_replay_a_barrier_waits_on_is_not_rate_limited_nor_counted_in_the_rate() -> None:
    # A restart in the change-log phase, paused at first: at the Resume barrier more epochs
    # are owed than the lag allows, so the barrier waits on their replay (at any rate); the
    # next chunk between barriers then goes at once (the replay used none of the rate).
    view = FakeView({}, {11: [(1, 1, 0), (2, 2, 0), (3, 3, 0)], 12: [(4, 4, 0), (5, 5, 0)]})
    saved = state_at("change_log", 10, **ALL_DONE)
    async with backfilling(
        SnapshotBackfill("view", batch_rows=1, rate_limit=0.01), [view], saved, first_prev=12
    ) as (live, ctx, _):
        live.barrier(Add(pause=True))  # owes 11 and 12: the allowed lag is 2
        await settle()
        live.barrier(Resume())  # closes 13: 3 owed, one replayed before the barrier
        await settle()
        assert ctx.trace() == [13, [(1, 1, 0)], [(2, 2, 0)], [(3, 3, 0)], 14, [(4, 4, 0)]]
        assert view.log_reads == [11, 12]  # each epoch's change log read once


async def test_the_allowed_lag_shrinks_at_every_barrier_until_the_job_forwards() -> None:
    # Paused by its rate, the job replays only what each barrier waits on: one more epoch
    # owed per barrier, and half an epoch less allowed each time.
    view = FakeView({}, {e: [(e, e, 0)] for e in range(11, 20)})
    saved = state_at("change_log", 10, **ALL_DONE)
    async with backfilling(
        SnapshotBackfill("view", rate_limit=0), [view], saved, first_prev=14
    ) as (live, ctx, _):
        live.barrier()  # owes 11 to 14: the allowed lag is 4
        for _ in range(6):
            live.barrier()
        await settle()
    assert ctx.trace() == [
        15,
        [(11, 11, 0)],
        16,  # 15 closed: 5 owed > 4, down to 4; 3.5 allowed
        [(12, 12, 0)],
        [(13, 13, 0)],
        17,  # 5 owed > 3: down to 3; 3 allowed
        [(14, 14, 0)],
        18,  # 4 owed > 3: down to 3; 2.5 allowed
        [(15, 15, 0)],
        [(16, 16, 0)],
        19,  # 4 owed > 2: down to 2; 2 allowed
        [(17, 17, 0)],
        20,  # 3 owed > 2: down to 2; 1.5 allowed
        [(18, 18, 0)],
        [(19, 19, 0)],
        21,  # 3 owed > 1: down to 1, the only one owed (20, empty): nothing owed, forwards
    ]
    assert [r[2]["epochs_owed"] for r in reported(ctx)] == [4, 4, 3, 3, 2, 2, 0]
    assert [r[2]["phase"] for r in reported(ctx)] == ["change_log"] * 6 + ["forward"]


async def test_a_vnode_bitmap_limits_the_snapshot_and_the_change_log_to_its_vnodes() -> None:
    view = busy_view()
    mine = VnodeBitmap.from_vnodes([1, 2], vnode_count=VNODES)
    async with backfilling(SnapshotBackfill("view"), [view], first_prev=12, vnode_bitmap=mine) as (
        live,
        ctx,
        _,
    ):
        live.barrier()
        await settle()
        assert ctx.trace() == [13, [(1, 101, 0), (5, 105, 0), (2, 102, 0)], view.logs[11]]
        assert view.reads == [(1, None), (2, None)]
    assert ctx.saved[0] == {
        "progress": {
            "phase": "snapshot",
            "snapshot_epoch": 10,
            "replayed": 10,
            "log_offset": 0,
            "rows": 0,
        },
        **fresh_vnodes(1, 2),
    }


async def test_a_vnode_update_before_the_job_forwards_is_refused() -> None:
    async with backfilling(SnapshotBackfill("view", rate_limit=0), [busy_view()]) as (
        live,
        ctx,
        failed,
    ):
        live.barrier()
        live.barrier(Update(vnode_bitmaps={ACTOR_ID + 1: VnodeBitmap.full(VNODES)}))
        await settle()
        assert ctx.trace() == [11, 12]  # another actor's update
        live.barrier(Update(vnode_bitmaps={ACTOR_ID: VnodeBitmap.full(VNODES)}))
        await settle()
    (error,) = failed
    assert isinstance(error, VnodeUpdateDuringBackfillError)
    assert (error.actor, error.phase) == ("backfill", "snapshot")


async def test_a_stop_mid_backfill_releases_the_pin_and_ends_the_actor() -> None:
    view = busy_view()
    async with backfilling(SnapshotBackfill("view", rate_limit=0), [view]) as (live, ctx, failed):
        live.barrier()
        live.barrier(Stop(frozenset({ACTOR_ID + 1})))  # another actor's stop
        await settle()
        assert view.pins == {ACTOR: SNAPSHOT_EPOCH}
        live.barrier(Stop(frozenset({ACTOR_ID})))
        live.chunk(1)
        await settle()
        assert view.pins == {}
        assert ctx.returned
        assert ctx.trace() == [11, 12, 13]
    assert not failed


async def test_a_stop_while_forwarding_ends_the_actor() -> None:
    saved = state_at("forward", 13, **ALL_DONE)
    async with backfilling(SnapshotBackfill("view"), [busy_view()], saved) as (live, ctx, _):
        live.barrier()
        live.barrier(Stop(frozenset({ACTOR_ID})))
        live.chunk(1)
        await settle()
        assert ctx.returned
        assert ctx.trace() == [11, 12]


@pytest.mark.parametrize("waiting", [True, False])
async def test_the_upstream_ending_mid_snapshot_fails_with_what_is_owed(waiting: bool) -> None:
    # Waiting (paused by its rate) or emitting between barriers, the end is the same error.
    view = busy_view()
    actor = SnapshotBackfill("view", rate_limit=0 if waiting else None)
    async with backfilling(actor, [view], first_prev=12) as (live, _, failed):
        live.barrier()
        if waiting:
            await settle()
            live.barrier()
            await settle()
        live.end()
        await settle()
    (error,) = failed
    assert isinstance(error, UpstreamEndedDuringBackfillError)
    owed = [11, 12, 13] if waiting else [11, 12]
    assert (error.actor, error.phase, error.epochs_owed, error.vnodes_left) == (
        "backfill",
        "snapshot",
        owed,
        [0, 1, 2, 3],
    )


async def test_the_upstream_ending_mid_change_log_fails_with_what_is_owed() -> None:
    view = FakeView({}, {11: [(1, 1, 0), (2, 2, 0)]})
    actor = SnapshotBackfill("view", batch_rows=1, rate_limit=CRAWL)
    async with backfilling(actor, [view], first_prev=12) as (live, ctx, failed):
        live.barrier()
        await settle()
        assert ctx.trace() == [13, [(1, 1, 0)]]
        live.end()
        await settle()
    (error,) = failed
    assert isinstance(error, UpstreamEndedDuringBackfillError)
    assert (error.actor, error.phase, error.epochs_owed, error.vnodes_left) == (
        "backfill",
        "change_log",
        [11, 12],
        [],
    )


async def test_the_upstream_ending_while_forwarding_ends_the_actor_cleanly() -> None:
    saved = state_at("forward", 13, **ALL_DONE)
    async with backfilling(SnapshotBackfill("view"), [busy_view()], saved) as (live, ctx, failed):
        live.barrier()
        live.chunk(1)
        live.end()
        await settle()
        assert ctx.returned
        assert ctx.trace() == [11, [(1, 0, 0)]]
    assert not failed


async def test_a_committable_polled_while_backfilling_is_passed_on_untouched() -> None:
    # Work staged for a sink downstream travels through a backfill as through any actor: the
    # backfill polls its upstream itself, so it passes a committable on by hand.
    from barrierflow.channels import Committable

    emitted: list[object] = []

    class Context:
        async def emit(self, message: object) -> None:
            emitted.append(message)

    backfill = SnapshotBackfill("view")
    committable = Committable("sink", 7)
    await backfill._on_upstream(Context(), None, committable)  # type: ignore[arg-type]
    assert emitted == [committable]
