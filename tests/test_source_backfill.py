"""The source backfill actor in a running graph: a job joining a live source sees its history,
then its live records, each exactly once (the upstream here is a push source that delivers
what a live split source would)."""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path

import anyio
import pyarrow as pa
import pytest
from _timeouts import scaled

from barrierflow.actors.backfill.source_backfill import SourceBackfill
from barrierflow.actors.backfill.source_backfill_state import BackfillPhase, SplitBackfill
from barrierflow.actors.sources.split_log import OFFSET_MAJOR, SPLIT_COLUMN, Offset
from barrierflow.channels import (
    Chunk,
    Message,
    Pause,
    Resume,
    SourceChangeSplit,
    Split,
    Throttle,
    Update,
)
from barrierflow.errors import ActorFailedError, InvalidArgumentError, UnknownSplitError
from barrierflow.runtime import ActorContext, Job, Runtime, RuntimeConfig, StateStore, StreamActor
from barrierflow.testing.split_log import MemorySplitLog

pytestmark = pytest.mark.anyio

PAYLOAD = pa.schema([("v", pa.int64())])


class Collect(StreamActor):
    """Records (split, offset major) of every visible row it reads."""

    seen: list[tuple[str, int]]

    def __init__(self, seen: list[tuple[str, int]]) -> None:
        self.seen = seen

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk):
            rows = message.compact().batch
            self.seen.extend(
                zip(
                    rows.column(SPLIT_COLUMN).to_pylist(),
                    rows.column(OFFSET_MAJOR).to_pylist(),
                    strict=True,
                )
            )
        await ctx.emit(message)


def make_log(**splits: int) -> MemorySplitLog:
    """A log whose split ``s`` holds records 1..n (offsets ``k-0``, payload ``v = k``)."""
    log = MemorySplitLog(PAYLOAD, splits=list(splits))
    for split, count in splits.items():
        if count:
            log.append(split, {"v": list(range(1, count + 1))})
    return log


async def live(log: MemorySplitLog, split: str, after: int, upto: int) -> Chunk:
    """What the live source emits for ``split``'s records after..upto: the log's own rows."""
    rows: list[pa.RecordBatch] = []
    want = upto - after
    async with aclosing(log.read({split: Offset(after) if after else None})) as reader:
        async for batch in reader:
            rows.append(batch.slice(0, want - sum(b.num_rows for b in rows)))
            if sum(b.num_rows for b in rows) >= want:
                break
    return Chunk(pa.Table.from_batches(rows).combine_chunks().to_batches()[0])


def runtime(tmp_path: Path) -> Runtime:
    # Barriers keep coming (progress and readiness ride on them), 20 per second.
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=0.05))
    rt.add_source("src")
    return rt


def backfill_job(log: MemorySplitLog, seen: list[tuple[str, int]], **options: object) -> Job:
    job = Job("history")
    job.add_actor("backfill", lambda: SourceBackfill(log, **options), inputs={"upstream": "src"})  # type: ignore[arg-type]
    job.add_actor("collect", lambda: Collect(seen), inputs=["backfill"])
    return job


def by_split(seen: list[tuple[str, int]]) -> dict[str, list[int]]:
    result: dict[str, list[int]] = {}
    for split, offset in seen:
        result.setdefault(split, []).append(offset)
    return result


async def test_a_joining_job_sees_history_and_live_records_exactly_once(tmp_path: Path) -> None:
    log = make_log(a=10, b=6)
    seen: list[tuple[str, int]] = []
    rt = runtime(tmp_path)
    with anyio.fail_after(scaled(30)):
        async with rt:
            # The live source read a..4 and b..2 before the job existed.
            await rt.push("src", await live(log, "a", 0, 4))
            await rt.push("src", await live(log, "b", 0, 2))
            handle = await rt.add_job(backfill_job(log, seen))
            # It goes on: the rest of the history, then records appended after the job began.
            log.append("a", {"v": [11, 12]})
            log.append("b", {"v": [7]})
            await rt.push("src", await live(log, "a", 4, 12))
            await rt.push("src", await live(log, "b", 2, 7))
            await handle.wait_ready()
            await rt.checkpoint()
    assert by_split(seen) == {"a": list(range(1, 13)), "b": list(range(1, 8))}


async def test_a_quiet_split_lets_the_job_become_ready(tmp_path: Path) -> None:
    # The live source has read everything and nothing new comes: the backfill reaches its
    # target and waits in CACHING_UP for ever; the job must still be ready.
    log = make_log(a=5)
    seen: list[tuple[str, int]] = []
    rt = runtime(tmp_path)
    with anyio.fail_after(scaled(30)):
        async with rt:
            await rt.push("src", await live(log, "a", 0, 5))
            handle = await rt.add_job(backfill_job(log, seen))
            await handle.wait_ready()
            progress = handle.progress().actors["backfill"]
            assert progress.finished
            assert progress.detail == {"a": "caching_up"}
            assert progress.rows == 5
    assert by_split(seen) == {"a": [1, 2, 3, 4, 5]}


async def test_an_empty_split_needs_no_backfill(tmp_path: Path) -> None:
    log = make_log(a=0)
    seen: list[tuple[str, int]] = []
    rt = runtime(tmp_path)
    with anyio.fail_after(scaled(30)):
        async with rt:
            handle = await rt.add_job(backfill_job(log, seen))
            await handle.wait_ready()
            assert handle.progress().actors["backfill"].detail == {"a": "finished"}
            log.append("a", {"v": [1, 2]})
            await rt.push("src", await live(log, "a", 0, 2))  # live rows flow at once
            await rt.checkpoint()
    assert by_split(seen) == {"a": [1, 2]}


async def test_states_are_committed_with_checkpoints_and_finished_at_the_end(
    tmp_path: Path,
) -> None:
    log = make_log(a=3, b=3)
    seen: list[tuple[str, int]] = []
    rt = runtime(tmp_path)
    with anyio.fail_after(scaled(30)):
        async with rt:
            handle = await rt.add_job(backfill_job(log, seen))
            await handle.wait_ready()
            log.append("a", {"v": [4]})
            log.append("b", {"v": [4]})
            # The live source passes the backfill's stop: every split finishes.
            await rt.push("src", await live(log, "a", 0, 4))
            await rt.push("src", await live(log, "b", 0, 4))
            for _ in range(3):  # ready, the checkpoint everyone's state is in, then leave
                await rt.checkpoint()
    async with await StateStore.open(tmp_path / "state.db") as store:
        states = await store.read_all("backfill", "backfill")
    assert {s: SplitBackfill.from_json(v).phase for s, v in states.items()} == {
        "a": BackfillPhase.FINISHED,
        "b": BackfillPhase.FINISHED,
    }
    assert by_split(seen) == {"a": [1, 2, 3, 4], "b": [1, 2, 3, 4]}


async def test_throttle_zero_stops_the_history_reader_and_a_rate_restarts_it(
    tmp_path: Path,
) -> None:
    log = make_log(a=6)
    seen: list[tuple[str, int]] = []
    rt = runtime(tmp_path)
    with anyio.fail_after(scaled(30)):
        async with rt:
            handle = await rt.add_job(backfill_job(log, seen, rate_limit=0))
            await rt.checkpoint()
            await rt.checkpoint()
            assert seen == []  # paused by its rate
            await rt.mutate(Throttle({rt.actor_id("backfill"): None}))
            await handle.wait_ready()
    assert by_split(seen) == {"a": [1, 2, 3, 4, 5, 6]}


async def test_a_split_the_log_does_not_have_fails_the_actor(tmp_path: Path) -> None:
    log = make_log(a=1)
    rt = runtime(tmp_path)
    with anyio.fail_after(scaled(30)), pytest.raises(ActorFailedError) as failed:
        async with rt:
            await rt.add_job(backfill_job(log, [], splits=["nope"]))
            await rt.checkpoint()
    assert isinstance(failed.value.cause, UnknownSplitError)
    assert failed.value.cause.split == "nope"


async def test_pause_stops_the_history_reader_and_resume_restarts_it(tmp_path: Path) -> None:
    log = make_log(a=4)
    seen: list[tuple[str, int]] = []
    rt = runtime(tmp_path)
    with anyio.fail_after(scaled(30)):
        async with rt:
            handle = await rt.add_job(backfill_job(log, seen, rate_limit=0))
            await rt.mutate(Pause())
            # Unthrottled while paused: still nothing may be read.
            await rt.mutate(Throttle({rt.actor_id("backfill"): None}))
            await rt.checkpoint()
            await rt.checkpoint()
            assert seen == []
            await rt.mutate(Resume())
            await handle.wait_ready()
    assert by_split(seen) == {"a": [1, 2, 3, 4]}


class FailingLog:
    """A split log whose first ``failures`` reads fail: after delivering one batch, or at
    once (``at_once``)."""

    def __init__(self, inner: MemorySplitLog, failures: int, *, at_once: bool = False) -> None:
        self.inner = inner
        self.failures = failures
        self.at_once = at_once
        self.reads = 0

    @property
    def schema(self) -> pa.Schema:
        return self.inner.schema

    async def list_splits(self) -> list[str]:
        return await self.inner.list_splits()

    async def latest_offset(self, split: str) -> Offset | None:
        return await self.inner.latest_offset(split)

    async def read(self, start: dict[str, Offset | None], *, batch_rows: int = 4096):  # type: ignore[no-untyped-def]
        self.reads += 1
        fail = self.reads <= self.failures
        if fail and self.at_once:
            raise ConnectionError("injected: the log is unreachable")
        async with aclosing(self.inner.read(start, batch_rows=batch_rows)) as reader:
            async for batch in reader:
                yield batch
                if fail:
                    raise ConnectionError("injected: the log went away")


async def test_a_failed_reader_is_rebuilt_from_the_latest_states(tmp_path: Path) -> None:
    log = FailingLog(make_log(a=9), failures=3)
    seen: list[tuple[str, int]] = []
    rt = runtime(tmp_path)
    with anyio.fail_after(scaled(30)):
        async with rt:
            handle = await rt.add_job(
                backfill_job(log, seen, batch_rows=2, retry_delay=0.001)  # type: ignore[arg-type]
            )
            await handle.wait_ready()
    assert by_split(seen) == {"a": list(range(1, 10))}  # nothing twice, nothing skipped
    assert log.reads == 4


async def test_a_reader_failing_past_its_retries_fails_the_actor(tmp_path: Path) -> None:
    log = FailingLog(make_log(a=9), failures=100, at_once=True)
    rt = runtime(tmp_path)
    with anyio.fail_after(scaled(30)), pytest.raises(ActorFailedError) as failed:
        async with rt:
            handle = await rt.add_job(
                backfill_job(log, [], batch_rows=1, retry_delay=0.001, max_reader_retries=2)  # type: ignore[arg-type]
            )
            await handle.wait_ready()
    assert isinstance(failed.value.cause, ConnectionError)
    assert log.reads == 3


async def test_a_split_change_finishes_new_splits_and_trims_dropped_ones(tmp_path: Path) -> None:
    log = make_log(a=3, b=3, c=2)
    seen: list[tuple[str, int]] = []
    rt = runtime(tmp_path)
    with anyio.fail_after(scaled(30)):
        async with rt:
            handle = await rt.add_job(backfill_job(log, seen, splits=["a", "b"], rate_limit=0))
            actor = rt.actor_id("backfill")
            # c is new to the job: the live source has all of it, no backfill; b is dropped.
            await rt.mutate(SourceChangeSplit({actor: (Split("a"), Split("c"))}))
            await rt.push("src", await live(log, "c", 0, 2))
            await rt.mutate(Throttle({actor: None}))
            await handle.wait_ready()
            await rt.checkpoint()
    assert by_split(seen) == {"a": [1, 2, 3], "c": [1, 2]}
    async with await StateStore.open(tmp_path / "state.db") as store:
        states = await store.read_all("backfill", "backfill")
    assert sorted(states) == ["a", "c"]
    assert SplitBackfill.from_json(states["c"]).phase is BackfillPhase.FINISHED


async def test_a_target_deleted_before_it_was_read_still_ends_the_backfill(
    tmp_path: Path,
) -> None:
    log = make_log(a=5)
    seen: list[tuple[str, int]] = []
    rt = runtime(tmp_path)
    with anyio.fail_after(scaled(30)):
        async with rt:
            handle = await rt.add_job(backfill_job(log, seen, rate_limit=0))  # target: a 5-0
            log.delete("a", Offset(5))  # the target will never be delivered
            await rt.mutate(Throttle({rt.actor_id("backfill"): None}))
            await handle.wait_ready()  # a quiet split: no live row will ever show past it
            assert handle.progress().actors["backfill"].detail == {"a": "caching_up"}
    assert by_split(seen) == {"a": [1, 2, 3, 4]}


async def test_a_split_change_after_every_split_finished_forwards_a_new_split_at_once(
    tmp_path: Path,
) -> None:
    log = make_log(a=2, b=2, c=1)
    seen: list[tuple[str, int]] = []
    rt = runtime(tmp_path)
    with anyio.fail_after(scaled(30)):
        async with rt:
            handle = await rt.add_job(backfill_job(log, seen, splits=["a", "b"]))
            await handle.wait_ready()
            log.append("a", {"v": [3]})
            log.append("b", {"v": [3]})
            await rt.push("src", await live(log, "a", 0, 3))  # the upstream passes both stops
            await rt.push("src", await live(log, "b", 0, 3))
            for _ in range(3):  # every split FINISHED, committed, seen by the actor: it leaves
                await rt.checkpoint()
            actor = rt.actor_id("backfill")
            await rt.mutate(SourceChangeSplit({actor: (Split("a"), Split("c"))}))
            await rt.push("src", await live(log, "c", 0, 1))  # forwarded: c is new to the job
            await rt.checkpoint()
    assert by_split(seen) == {"a": [1, 2, 3], "b": [1, 2, 3], "c": [1]}
    async with await StateStore.open(tmp_path / "state.db") as store:
        states = await store.read_all("backfill", "backfill")
    assert {s: SplitBackfill.from_json(v).phase for s, v in states.items()} == {
        "a": BackfillPhase.FINISHED,
        "c": BackfillPhase.FINISHED,
    }


async def test_an_unfinished_split_that_moved_away_and_back_is_backfilled(
    tmp_path: Path,
) -> None:
    # z moves away unfinished (Update keeps its committed state): the actor must not leave the
    # backfill stage while any committed state is unfinished, and when z comes back its
    # backfill resumes from that state.
    log = make_log(a=2, z=3)
    seen: list[tuple[str, int]] = []
    rt = runtime(tmp_path)
    with anyio.fail_after(scaled(30)):
        async with rt:
            handle = await rt.add_job(backfill_job(log, seen, rate_limit=0))
            actor = rt.actor_id("backfill")
            await rt.mutate(Update(splits={actor: (Split("a"),)}))
            await rt.mutate(Throttle({actor: None}))
            await handle.wait_ready()
            log.append("a", {"v": [3]})
            await rt.push("src", await live(log, "a", 0, 3))
            for _ in range(3):
                await rt.checkpoint()
            await rt.mutate(SourceChangeSplit({actor: (Split("a"), Split("z"))}))
            while len(by_split(seen).get("z", [])) < 3:  # its backfill resumes
                await rt.checkpoint()
    assert by_split(seen) == {"a": [1, 2, 3], "z": [1, 2, 3]}


def test_bad_arguments_are_refused_with_what_was_expected() -> None:
    log = make_log(a=1)
    for kwargs, argument in (
        ({"log": "redis://"}, "log"),
        ({"splits": "a"}, "splits"),
        ({"batch_rows": 0}, "batch_rows"),
        ({"rate_limit": -1}, "rate_limit"),
        ({"wait_barrier_intervals": 0}, "wait_barrier_intervals"),
        ({"retry_delay": 0}, "retry_delay"),
        ({"clock": 5}, "clock"),
    ):
        arguments: dict[str, object] = {"log": log, **kwargs}
        with pytest.raises(InvalidArgumentError) as bad:
            SourceBackfill(**arguments)  # type: ignore[arg-type]
        assert bad.value.argument == argument
