"""The snapshot backfill actor in a running graph: a job added over a materialized view sees
the view as of its snapshot epoch, then every later change once, then the live view."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pytest
from _timeouts import scaled

from barrierflow import (
    ActorFailedError,
    NotAMaterializedViewError,
    SnapshotBackfillStateError,
    VnodeUpdateDuringBackfillError,
)
from barrierflow.actors.backfill.errors import UpstreamEndedDuringBackfillError
from barrierflow.actors.backfill.materialize import Materialize
from barrierflow.actors.backfill.snapshot_backfill import SnapshotBackfill
from barrierflow.channels import Chunk, Message, Op, Pause, Resume, Throttle, Update
from barrierflow.channels.vnode import VnodeBitmap
from barrierflow.runtime import (
    ActorContext,
    Job,
    Runtime,
    RuntimeConfig,
    StateStore,
    StreamActor,
)

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
