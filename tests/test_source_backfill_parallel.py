"""A source backfill run by several actors (``parallelism=N`` keyed by the split column): each
owns the splits its input routes to, and none leaves the backfill stage before every split of
every actor is finished; watermarks are dropped while backfilling."""

from __future__ import annotations

from pathlib import Path

import anyio
import pyarrow.compute as pc
import pytest
from _timeouts import scaled
from test_source_backfill import Collect, by_split, live, make_log

from barrierflow.actors.backfill.source_backfill import SourceBackfill
from barrierflow.actors.sources.split_log import OFFSET_MAJOR, SPLIT_COLUMN
from barrierflow.channels import Chunk, Message, Watermark
from barrierflow.errors import GraphError
from barrierflow.runtime import ActorContext, Job, Runtime, RuntimeConfig, StreamActor
from barrierflow.testing.split_log import MemorySplitLog

pytestmark = pytest.mark.anyio

SPLITS = ("s0", "s1", "s2", "s3", "s4", "s5")


class Marks(StreamActor):
    """The live source's stand-in downstream: forwards each chunk, then a watermark on the
    offset column at the chunk's largest offset."""

    async def process(self, message: Message, ctx: ActorContext) -> None:
        await ctx.emit(message)
        if isinstance(message, Chunk) and message.batch.num_rows:
            top = pc.max(message.batch.column(OFFSET_MAJOR)).as_py()
            await ctx.emit(Watermark(OFFSET_MAJOR, top))


class Observe(Collect):
    """:class:`Collect`, also recording the watermarks it reads."""

    def __init__(self, seen: list[tuple[str, int]], marks: list[Watermark]) -> None:
        super().__init__(seen)
        self.marks = marks

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Watermark):
            self.marks.append(message)
        await super().process(message, ctx)


def runtime(tmp_path: Path) -> Runtime:
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=0.05))
    rt.add_source("src")
    rt.add_actor("marks", Marks, inputs=["src"])
    return rt


def parallel_job(
    log: MemorySplitLog,
    seen: list[list[tuple[str, int]]],
    marks: list[list[Watermark]],
    *,
    parallelism: int = 2,
    key: list[str] | None = None,
) -> Job:
    """``backfill.0..N-1`` reading ``marks``, each observed by its own ``observe.i``."""
    job = Job("history")
    job.add_actor(
        "backfill",
        lambda i: SourceBackfill(log),
        inputs={"upstream": "marks"},
        parallelism=parallelism,
        key=[SPLIT_COLUMN] if key is None else key,
    )
    for i in range(parallelism):
        seen.append([])
        marks.append([])
        job.add_actor(
            f"observe.{i}",
            lambda i=i: Observe(seen[i], marks[i]),  # type: ignore[misc]
            inputs=[f"backfill.{i}"],
        )
    return job


def owned(handle: object, i: int) -> set[str]:
    return set(handle.progress().actors[f"backfill.{i}"].detail)  # type: ignore[attr-defined]


async def push_new(rt: Runtime, log: MemorySplitLog, splits: object, sent: dict[str, int]) -> None:
    """The live source emits every record of ``splits`` it has not emitted yet (records are
    numbered 1.. per split, see ``make_log``)."""
    for split in sorted(splits):  # type: ignore[call-overload]
        end = len(log.records(split))
        if end > sent.get(split, 0):
            await rt.push("src", await live(log, split, sent.get(split, 0), end))
            sent[split] = end


async def test_parallel_actors_own_the_splits_their_input_routes_to_and_see_each_once(
    tmp_path: Path,
) -> None:
    log = make_log(**dict.fromkeys(SPLITS, 4))
    seen: list[list[tuple[str, int]]] = []
    marks: list[list[Watermark]] = []
    sent: dict[str, int] = {}
    rt = runtime(tmp_path)
    with anyio.fail_after(scaled(30)):
        async with rt:
            await push_new(rt, log, SPLITS[:3], sent)  # some history was live before the job
            handle = await rt.add_job(parallel_job(log, seen, marks))
            for split in SPLITS:
                log.append(split, {"v": [5, 6]})
            await push_new(rt, log, SPLITS, sent)
            await handle.wait_ready()
            await rt.checkpoint()
            first, second = owned(handle, 0), owned(handle, 1)
    # Disjoint, covering, both non-empty: the hash of the split name decides.
    assert first
    assert second
    assert not first & second
    assert first | second == set(SPLITS)
    for i, mine in enumerate((first, second)):
        assert by_split(seen[i]) == {split: [1, 2, 3, 4, 5, 6] for split in mine}


async def test_a_parallel_actor_stays_in_the_backfill_stage_until_every_peer_finished(
    tmp_path: Path,
) -> None:
    log = make_log(**dict.fromkeys(SPLITS, 3))
    seen: list[list[tuple[str, int]]] = []
    marks: list[list[Watermark]] = []
    sent: dict[str, int] = {}
    rt = runtime(tmp_path)
    with anyio.fail_after(scaled(30)):
        async with rt:
            await push_new(rt, log, SPLITS, sent)  # the live source read the whole history
            handle = await rt.add_job(parallel_job(log, seen, marks))
            await handle.wait_ready()  # every split caching up: nothing new upstream
            first, second = owned(handle, 0), owned(handle, 1)
            # Actor 0's splits finish (the live source passes their stops); 1's stay quiet.
            for split in first:
                log.append(split, {"v": [4]})
            await push_new(rt, log, first, sent)
            while set(handle.progress().actors["backfill.0"].detail.values()) != {"finished"}:
                await rt.checkpoint()
            for _ in range(3):
                await rt.checkpoint()
            # Actor 1 still caching up: actor 0 is still in the backfill stage and drops
            # the upstream's watermarks.
            for split in first:
                log.append(split, {"v": [5]})
            await push_new(rt, log, first, sent)
            await rt.checkpoint()
            assert marks == [[], []]
            # Now actor 1's splits finish too: both leave, and forward watermarks.
            for split in second:
                log.append(split, {"v": [4]})
            await push_new(rt, log, second, sent)
            while set(handle.progress().actors["backfill.1"].detail.values()) != {"finished"}:
                await rt.checkpoint()
            for _ in range(3):
                await rt.checkpoint()
            for split in SPLITS:
                log.append(split, {"v": [6]})
            await push_new(rt, log, SPLITS, sent)
            await rt.checkpoint()
    assert marks[0]
    assert marks[1]
    assert all(mark.column == OFFSET_MAJOR for mark in marks[0] + marks[1])
    expected = {split: list(range(1, 7 if split in first else 6)) for split in SPLITS}
    for i, mine in enumerate((first, second)):
        assert by_split(seen[i]) == {split: expected[split] for split in mine}


async def test_watermarks_are_dropped_while_backfilling_and_forwarded_after(
    tmp_path: Path,
) -> None:
    log = make_log(a=3)
    seen: list[list[tuple[str, int]]] = []
    marks: list[list[Watermark]] = []
    sent: dict[str, int] = {}
    rt = runtime(tmp_path)
    with anyio.fail_after(scaled(30)):
        async with rt:
            handle = await rt.add_job(parallel_job(log, seen, marks, parallelism=1))
            log.append("a", {"v": [4]})
            await push_new(rt, log, ["a"], sent)  # live rows (and a watermark) while backfilling
            await handle.wait_ready()
            await rt.checkpoint()
            assert marks == [[]]
            while set(handle.progress().actors["backfill.0"].detail.values()) != {"finished"}:
                await rt.checkpoint()
            for _ in range(3):
                await rt.checkpoint()
            log.append("a", {"v": [5]})
            await push_new(rt, log, ["a"], sent)
            await rt.checkpoint()
    assert marks == [[Watermark(OFFSET_MAJOR, 5)]]
    assert by_split(seen[0]) == {"a": [1, 2, 3, 4, 5]}


async def test_a_parallel_group_keyed_by_another_column_is_refused(tmp_path: Path) -> None:
    log = make_log(**dict.fromkeys(SPLITS, 2))
    rt = runtime(tmp_path)
    with anyio.fail_after(scaled(30)):
        async with rt:
            with pytest.raises(GraphError) as refused:
                await rt.add_job(parallel_job(log, [], [], key=["v"]))
            assert refused.value.argument == "key"
            assert refused.value.got == ["v"]
            assert rt.jobs() == ["main"]  # nothing was added


async def test_a_parallel_group_dispatched_round_robin_is_refused(tmp_path: Path) -> None:
    log = make_log(**dict.fromkeys(SPLITS, 2))
    job = Job("history")
    job.add_actor(
        "backfill", lambda i: SourceBackfill(log), inputs={"upstream": "marks"}, parallelism=2
    )
    rt = runtime(tmp_path)
    with anyio.fail_after(scaled(30)):
        async with rt:
            with pytest.raises(GraphError) as refused:
                await rt.add_job(job)
            assert (refused.value.argument, refused.value.got) == ("key", "a round-robin input")
            assert rt.jobs() == ["main"]
