"""Split discovery (issue 24, items 0 and 2): a split source reads the splits created after it
started — rule 10 of ``barrierflow.actors.sources.split_source`` — and so does a job joining it
with a source backfill; an explicit split that does not exist fails the source, naming it,
unless the source waits for it. Every record exactly once, on asyncio and trio."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
import redis
import structlog.testing
from _timeouts import scaled

from barrierflow.actors import SourceBackfill, SplitSource, add_sink
from barrierflow.actors.backfill.source_backfill_state import (
    BackfillPhase,
    SplitBackfill,
    SplitBackfills,
)
from barrierflow.actors.sources.split_log import (
    OFFSET_MAJOR,
    OFFSET_MINOR,
    SPLIT_COLUMN,
    Offset,
    SplitLog,
)
from barrierflow.channels import Barrier, Chunk, Message
from barrierflow.channels.barrier import BarrierKind
from barrierflow.channels.mutation import Add, SourceChangeSplit, Split
from barrierflow.connectors import ParquetTable, RedisStreamLog
from barrierflow.errors import (
    ActorFailedError,
    InvalidArgumentError,
    ProtocolError,
    UnknownSplitError,
)
from barrierflow.runtime import ActorContext, Job, Runtime, RuntimeConfig, StreamActor
from barrierflow.runtime.state.state_store import StateStore
from barrierflow.testing.redis_server import RedisServer
from barrierflow.testing.split_log import MemorySplitLog

pytestmark = pytest.mark.anyio

PAYLOAD = pa.schema([("v", pa.int64())])

#: One record: (split, offset major, offset minor).
Record = tuple[str, int, int]


class Seen:
    """The records a collector saw, per incarnation of the graph."""

    def __init__(self) -> None:
        self.incarnations: list[list[Record]] = []
        self._changed = anyio.Event()

    @property
    def records(self) -> list[Record]:
        return [r for records in self.incarnations for r in records]

    def add(self, chunk: Chunk) -> None:
        batch = chunk.compact().batch
        self.incarnations[-1].extend(
            zip(
                batch.column(SPLIT_COLUMN).to_pylist(),
                batch.column(OFFSET_MAJOR).to_pylist(),
                batch.column(OFFSET_MINOR).to_pylist(),
                strict=True,
            )
        )
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_for(self, done: Callable[[], bool]) -> None:
        while not done():
            await self._changed.wait()


class Collector(StreamActor):
    def __init__(self, seen: Seen) -> None:
        self.seen = seen

    async def run(self, ctx: ActorContext) -> None:
        self.seen.incarnations.append([])
        async for message in ctx.messages():
            if isinstance(message, Chunk):
                self.seen.add(message)
            await ctx.emit(message)


class Listed(MemorySplitLog):
    """A memory log that counts its listings and its readers, and can hide splits from its
    listings (a deleted stream), or be declared with a fixed list of splits (as a
    RedisStreamLog given ``splits=``)."""

    def __init__(self, splits: list[str], declared: list[str] | None = None) -> None:
        super().__init__(PAYLOAD, splits)
        self.listings = 0
        self.reads = 0
        self.hidden: set[str] = set()
        self._declared = None if declared is None else tuple(declared)

    @property
    def declared_splits(self) -> tuple[str, ...] | None:
        return self._declared

    async def list_splits(self) -> list[str]:
        self.listings += 1
        return [s for s in await super().list_splits() if s not in self.hidden]

    def read(
        self, start: Mapping[str, Offset | None], *, batch_rows: int = 4096
    ) -> AsyncIterator[pa.RecordBatch]:
        self.reads += 1
        return super().read(start, batch_rows=batch_rows)


class Lenient(Listed):
    """Reads a split it does not have as empty, as Redis reads a stream not created yet: the
    source cannot count on its reader to refuse an unknown split."""

    def read(
        self, start: Mapping[str, Offset | None], *, batch_rows: int = 4096
    ) -> AsyncIterator[pa.RecordBatch]:
        return super().read({s: o for s, o in start.items() if self.has(s)}, batch_rows=batch_rows)

    def has(self, split: str) -> bool:
        try:
            self.records(split)
        except UnknownSplitError:
            return False
        return True


def fill(log: MemorySplitLog, split: str, count: int) -> None:
    log.append(split, {"v": list(range(count))})


def every(log: MemorySplitLog, *splits: str) -> list[Record]:
    """Every record of ``splits``, sorted."""
    return sorted((s, o.major, o.minor) for s in splits for o in log.records(s))


def config(tmp_path: Path, **kw: Any) -> RuntimeConfig:
    return RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=3600.0, **kw)


def live_runtime(tmp_path: Path, log: MemorySplitLog, seen: Seen, **source: Any) -> Runtime:
    """Source ``src`` (a SplitSource of ``log``) → collector ``sink``."""
    rt = Runtime(config(tmp_path))
    rt.add_source("src", lambda: SplitSource(log, **source))
    rt.add_actor("sink", lambda: Collector(seen), inputs=["src"])
    return rt


async def checkpoint_until(rt: Runtime, done: Callable[[], bool], most: int = 50) -> None:
    """Checkpoints until ``done()`` (each checkpoint is a barrier: discovery's clock)."""
    for _ in range(most):
        if done():
            return
        await rt.checkpoint()
    assert done()


# --- discovery by the live source ---------------------------------------------------------------


async def test_a_split_created_after_the_source_started_is_read_from_its_first_record(
    tmp_path: Path,
) -> None:
    log, seen = Listed(["a"]), Seen()
    fill(log, "a", 3)
    with anyio.fail_after(scaled(10)):
        async with live_runtime(tmp_path, log, seen, discover_every=1) as rt:
            await seen.wait_for(lambda: len(seen.records) == 3)
            fill(log, "b", 4)  # the source listed the log long ago
            await checkpoint_until(rt, lambda: len(seen.records) == 7)
            fill(log, "b", 2)
            await seen.wait_for(lambda: len(seen.records) == 9)
            await rt.checkpoint()
        async with await StateStore.open(tmp_path / "state.db") as store:
            # The discovered assignment is durable with the barrier that made it.
            assert await store.read_all("src", "assignment") == {"a": "", "b": ""}
            assert await store.read_all("src", "discovery") == {"assigned_by": "discovery"}
    assert sorted(seen.records) == every(log, "a", "b")


@pytest.mark.parametrize("discover_every", [None, 2], ids=["default-3", "two"])
async def test_the_log_is_listed_at_the_first_barrier_and_every_discover_every_barriers(
    tmp_path: Path, discover_every: int | None
) -> None:
    n = 3 if discover_every is None else discover_every  # the documented default: 3
    options = {} if discover_every is None else {"discover_every": discover_every}
    log, seen = Listed(["a"]), Seen()
    with anyio.fail_after(scaled(10)):
        async with live_runtime(tmp_path, log, seen, **options) as rt:
            await rt.checkpoint()  # barrier 1 since the listing at the first barrier (INITIAL)
            assert log.listings == 1
            fill(log, "b", 2)
            for _ in range(2, n):  # barriers 2 .. n-1 since the listing: not listed
                await rt.checkpoint()
                assert (log.listings, seen.records) == (1, [])
            await rt.checkpoint()  # barrier n: listed, b assigned at it
            assert log.listings == 2
            await seen.wait_for(lambda: len(seen.records) == 2)
            for _ in range(n - 1):
                await rt.checkpoint()
            assert log.listings == 2
            await rt.checkpoint()
            assert log.listings == 3
    assert sorted(seen.records) == every(log, "b")


async def test_a_pattern_discovers_only_the_splits_it_matches(tmp_path: Path) -> None:
    log, seen = Listed([]), Seen()
    fill(log, "events-1", 2)
    fill(log, "other", 5)
    with anyio.fail_after(scaled(10)):
        async with live_runtime(tmp_path, log, seen, pattern="events-*", discover_every=1) as rt:
            fill(log, "events-2", 3)
            fill(log, "others-2", 3)
            await checkpoint_until(rt, lambda: len(seen.records) == 5)
            await rt.checkpoint()
    assert sorted(seen.records) == every(log, "events-1", "events-2")


async def test_a_pattern_that_matches_nothing_warns_once_and_shows_zero_splits(
    tmp_path: Path,
) -> None:
    log, seen = Listed([]), Seen()
    fill(log, "events-1", 2)
    with anyio.fail_after(scaled(10)), structlog.testing.capture_logs() as logs:
        async with live_runtime(tmp_path, log, seen, pattern="evnets-*", discover_every=1) as rt:
            for _ in range(3):
                await rt.checkpoint()
            families = {f.name: f for f in rt.metrics.collect()}
            assert families["barrierflow_source_splits"].value(actor="src", kind="source") == 0
            assert log.listings >= 4  # the first barrier's listing, then one per checkpoint
    warnings = [e for e in logs if e["log_level"] == "warning" and "no split" in e["event"]]
    assert len(warnings) == 1  # once, not at every listing that found nothing
    assert warnings[0]["pattern"] == "evnets-*"
    assert warnings[0]["log"] == "MemorySplitLog(splits=['events-1'])"
    assert warnings[0]["listed"] == 1
    assert seen.records == []


async def test_the_splits_gauge_counts_the_splits_a_source_reads(tmp_path: Path) -> None:
    log, seen = Listed([]), Seen()
    fill(log, "events-1", 2)
    fill(log, "other", 1)
    with anyio.fail_after(scaled(10)):
        async with live_runtime(tmp_path, log, seen, pattern="events-*", discover_every=1) as rt:
            await rt.checkpoint()
            splits = {f.name: f for f in rt.metrics.collect()}["barrierflow_source_splits"]
            assert splits.value(actor="src", kind="source") == 1
            fill(log, "events-2", 1)
            await checkpoint_until(rt, lambda: len(seen.records) == 3)
            splits = {f.name: f for f in rt.metrics.collect()}["barrierflow_source_splits"]
            assert splits.value(actor="src", kind="source") == 2


async def test_a_split_the_log_no_longer_lists_is_dropped_with_its_offset(tmp_path: Path) -> None:
    log, seen = Listed(["a", "b"]), Seen()
    fill(log, "a", 1)
    fill(log, "b", 1)
    with anyio.fail_after(scaled(10)):
        async with live_runtime(tmp_path, log, seen, discover_every=1) as rt:
            await seen.wait_for(lambda: len(seen.records) == 2)
            await rt.checkpoint()
            log.hidden.add("b")  # deleted from the log
            await rt.checkpoint()
            fill(log, "b", 1)  # not read: the source follows the log
            fill(log, "a", 1)
            await seen.wait_for(lambda: len(seen.records) == 3)
            await rt.checkpoint()
        async with await StateStore.open(tmp_path / "state.db") as store:
            assert await store.read_all("src", "offsets") == {"a": "2-0"}
            assert await store.read_all("src", "assignment") == {"a": ""}
    assert sorted(seen.records) == [("a", 1, 0), ("a", 2, 0), ("b", 1, 0)]


async def test_a_split_change_by_mutation_ends_discovery_also_after_a_restart(
    tmp_path: Path,
) -> None:
    log, seen = Listed(["a", "b"]), Seen()
    fill(log, "a", 1)
    with anyio.fail_after(scaled(10)):
        async with live_runtime(tmp_path, log, seen, discover_every=1) as rt:
            await seen.wait_for(lambda: len(seen.records) == 1)
            await rt.mutate(SourceChangeSplit({rt.actor_id("src"): (Split("a"),)}))
            fill(log, "b", 2)  # listed, but the mutation decides the splits now
            fill(log, "c", 2)
            fill(log, "a", 1)
            await seen.wait_for(lambda: len(seen.records) == 2)
            for _ in range(3):
                await rt.checkpoint()
        again = Seen()
        fill(log, "a", 1)
        async with live_runtime(tmp_path, log, again, discover_every=1) as rt:
            await again.wait_for(lambda: len(again.records) == 1)
            for _ in range(3):
                await rt.checkpoint()
    assert sorted(seen.records) == [("a", 1, 0), ("a", 2, 0)]
    assert again.records == [("a", 3, 0)]


async def test_a_listing_that_changes_nothing_keeps_the_reader(tmp_path: Path) -> None:
    log, seen = Listed(["a"]), Seen()
    fill(log, "a", 1)
    with anyio.fail_after(scaled(10)):
        async with live_runtime(tmp_path, log, seen, discover_every=1) as rt:
            await seen.wait_for(lambda: len(seen.records) == 1)
            for _ in range(3):
                await rt.checkpoint()
            await anyio.wait_all_tasks_blocked()
            # Listed at each barrier, the same splits each time: the first reader goes on.
            assert (log.listings, log.reads) == (4, 1)
            fill(log, "b", 1)
            await checkpoint_until(rt, lambda: len(seen.records) == 2)
            assert log.reads == 2  # b assigned: the reader is rebuilt, once
    assert sorted(seen.records) == every(log, "a", "b")


async def test_a_split_the_log_no_longer_lists_at_a_restart_is_dropped_with_its_offset(
    tmp_path: Path,
) -> None:
    log, first, again, third = Listed(["a", "b"]), Seen(), Seen(), Seen()
    fill(log, "a", 1)
    fill(log, "b", 1)
    with anyio.fail_after(scaled(20)):
        async with live_runtime(tmp_path, log, first, discover_every=1) as rt:
            await first.wait_for(lambda: len(first.records) == 2)
            await rt.checkpoint()
        log.hidden.add("b")  # deleted while nothing ran
        fill(log, "a", 1)
        async with live_runtime(tmp_path, log, again, discover_every=1) as rt:
            await again.wait_for(lambda: len(again.records) == 1)
            await rt.checkpoint()
        async with await StateStore.open(tmp_path / "state.db") as store:
            assert await store.read_all("src", "offsets") == {"a": "2-0"}
            assert await store.read_all("src", "assignment") == {"a": ""}
        log.hidden.discard("b")  # it comes back: a new split, read from its first record
        async with live_runtime(tmp_path, log, third, discover_every=1) as rt:
            await third.wait_for(lambda: len(third.records) == 1)
            await rt.checkpoint()
    assert again.records == [("a", 2, 0)]
    assert third.records == [("b", 1, 0)]


class InitialAdd(StreamActor):
    """Turns the graph's INITIAL barrier into one whose ``Add`` assigns ``splits`` to the
    actor ``target()`` names (what a scheduler assigning splits would send)."""

    def __init__(self, target: Callable[[], int], splits: list[str]) -> None:
        self.target = target
        self.splits = splits

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Barrier) and message.kind is BarrierKind.INITIAL:
            assigned = {self.target(): tuple(Split(s) for s in self.splits)}
            message = message.with_mutation(Add(splits=assigned))
        await ctx.emit(message)


def assigned_runtime(tmp_path: Path, log: MemorySplitLog, seen: Seen, splits: list[str]) -> Runtime:
    """Control ``ctl`` (its first barrier's ``Add`` assigns ``splits`` to ``src``) → source
    ``src`` (a SplitSource of ``log`` that would discover at every barrier) → ``sink``."""
    rt = Runtime(config(tmp_path))
    rt.add_source("ctl", lambda: InitialAdd(lambda: rt.actor_id("src"), splits))
    rt.add_actor("src", lambda: SplitSource(log, discover_every=1), inputs=["ctl"])
    rt.add_actor("sink", lambda: Collector(seen), inputs=["src"])
    return rt


async def test_an_add_assignment_ends_discovery_also_after_a_restart(tmp_path: Path) -> None:
    log, seen, again = Listed(["a"]), Seen(), Seen()
    fill(log, "a", 1)
    with anyio.fail_after(scaled(20)):
        async with assigned_runtime(tmp_path, log, seen, ["a"]) as rt:
            await seen.wait_for(lambda: len(seen.records) == 1)
            fill(log, "b", 2)  # listed, but the Add decided the splits
            for _ in range(3):
                await rt.checkpoint()
            assert log.listings == 1  # the Add's splits checked at the first barrier, no more
        async with await StateStore.open(tmp_path / "state.db") as store:
            assert await store.read_all("src", "assignment") == {"a": ""}
            assert await store.read_all("src", "discovery") == {"assigned_by": "mutation"}
        fill(log, "a", 1)
        fill(log, "c", 1)
        # Restarted without the Add: the assignment the mutation wrote is kept, no discovery.
        async with live_runtime(tmp_path, log, again, discover_every=1) as rt:
            await again.wait_for(lambda: len(again.records) == 1)
            for _ in range(3):
                await rt.checkpoint()
        async with await StateStore.open(tmp_path / "state.db") as store:
            assert await store.read_all("src", "assignment") == {"a": ""}
            assert await store.read_all("src", "discovery") == {"assigned_by": "mutation"}
    assert seen.records == [("a", 1, 0)]
    assert again.records == [("a", 2, 0)]


async def test_an_add_assignment_naming_a_split_the_log_does_not_have_fails_the_source(
    tmp_path: Path,
) -> None:
    log = Lenient(["a"])  # its reader would read the unknown split as empty, for ever
    with anyio.fail_after(scaled(10)), pytest.raises(ActorFailedError) as info:
        async with assigned_runtime(tmp_path, log, Seen(), ["a", "evnts"]) as rt:
            await rt.checkpoint()
    error = info.value.cause
    assert isinstance(error, UnknownSplitError)
    assert (info.value.actor, error.split, error.known) == ("src", "evnts", ["a"])


async def test_a_restored_add_assignment_naming_a_split_the_log_lost_fails_the_source(
    tmp_path: Path,
) -> None:
    log = Listed(["a", "b"])
    with anyio.fail_after(scaled(20)):
        async with assigned_runtime(tmp_path, log, Seen(), ["a", "b"]) as rt:
            await rt.checkpoint()
        log.hidden.add("b")  # deleted while nothing ran; its reader would still read it
        with pytest.raises(ActorFailedError) as info:
            async with live_runtime(tmp_path, log, Seen(), discover_every=1) as rt:
                await rt.checkpoint()
    error = info.value.cause
    assert isinstance(error, UnknownSplitError)
    assert (info.value.actor, error.split, error.known) == ("src", "b", ["a"])


# --- explicit splits ----------------------------------------------------------------------------


@pytest.mark.parametrize("declared", ["by the source", "by the log"])
async def test_an_explicit_split_the_log_does_not_have_fails_the_source_naming_it(
    tmp_path: Path, declared: str
) -> None:
    if declared == "by the source":
        log, source = Listed(["a"]), {"splits": ["a", "evnts"]}
    else:
        log, source = Listed(["a"], declared=["a", "evnts"]), {}
    fill(log, "a", 1)
    seen = Seen()
    with anyio.fail_after(scaled(10)), pytest.raises(ActorFailedError) as info:
        async with live_runtime(tmp_path, log, seen, **source) as rt:
            await rt.checkpoint()
    assert info.value.actor == "src"
    error = info.value.cause
    assert isinstance(error, UnknownSplitError)
    assert (error.split, error.known) == ("evnts", ["a"])
    assert "wait_for_splits=True" in error.hint
    assert "'evnts'" in str(error)
    assert "['a']" in str(error)


@pytest.mark.parametrize("declared", ["by the source", "by the log"])
async def test_wait_for_splits_reads_an_explicit_split_once_it_is_created(
    tmp_path: Path, declared: str
) -> None:
    if declared == "by the source":
        log = Listed([])
        source: dict[str, Any] = {"splits": ["a", Split("b", 1)]}
    else:
        log = Listed([], declared=["a", "b"])
        source = {}
    seen = Seen()
    fill(log, "c", 1)  # not one of the explicit splits: never read
    with anyio.fail_after(scaled(10)):
        async with live_runtime(
            tmp_path, log, seen, wait_for_splits=True, discover_every=1, **source
        ) as rt:
            await rt.checkpoint()
            fill(log, "a", 2)
            await checkpoint_until(rt, lambda: len(seen.records) == 2)
            fill(log, "b", 3)
            expected = 5 if declared == "by the log" else 4  # Split("b", 1): after 1-0
            await checkpoint_until(rt, lambda: len(seen.records) == expected)
            await rt.checkpoint()
    first_b = 1 if declared == "by the log" else 2
    b = [("b", n, 0) for n in range(first_b, 4)]
    assert sorted(seen.records) == [("a", 1, 0), ("a", 2, 0), *b]


async def test_explicit_splits_that_do_not_wait_are_listed_once_and_no_assignment_is_written(
    tmp_path: Path,
) -> None:
    log, seen = Listed(["a", "b"]), Seen()
    fill(log, "a", 1)
    with anyio.fail_after(scaled(10)):
        async with live_runtime(tmp_path, log, seen, splits=["a"], discover_every=1) as rt:
            await seen.wait_for(lambda: len(seen.records) == 1)
            fill(log, "c", 1)
            for _ in range(3):
                await rt.checkpoint()
            assert log.listings == 1
        async with await StateStore.open(tmp_path / "state.db") as store:
            # The constructor's splits never change: nothing to make durable but offsets.
            assert await store.read_all("src", "assignment") == {}
            assert await store.read_all("src", "discovery") == {}
            assert await store.read_all("src", "offsets") == {"a": "1-0"}
    assert seen.records == [("a", 1, 0)]


async def test_a_waited_for_split_once_read_stays_assigned_when_the_log_no_longer_lists_it(
    tmp_path: Path,
) -> None:
    log, seen = Listed([]), Seen()
    fill(log, "a", 2)
    with anyio.fail_after(scaled(10)):
        async with live_runtime(
            tmp_path, log, seen, splits=["a", "b"], wait_for_splits=True, discover_every=1
        ) as rt:
            await seen.wait_for(lambda: len(seen.records) == 2)
            log.hidden.add("a")
            for _ in range(2):  # listed at each: b is still awaited, a is kept
                await rt.checkpoint()
            fill(log, "a", 1)
            await checkpoint_until(rt, lambda: len(seen.records) == 3)
            fill(log, "b", 1)
            await checkpoint_until(rt, lambda: len(seen.records) == 4)
            await rt.checkpoint()
        async with await StateStore.open(tmp_path / "state.db") as store:
            assert await store.read_all("src", "assignment") == {"a": "", "b": ""}
            assert await store.read_all("src", "discovery") == {"assigned_by": "discovery"}
    assert sorted(seen.records) == every(log, "a", "b")


NOT_DISCOVERING = (
    "False for a source that discovers its splits (True needs splits= or a log declared with "
    "splits)"
)


@pytest.mark.parametrize(
    ("kwargs", "argument", "expected", "got"),
    [
        ({"wait_for_splits": True}, "wait_for_splits", NOT_DISCOVERING, True),
        ({"splits": ["a"], "wait_for_splits": 1}, "wait_for_splits", "a bool", 1),
        (
            {"splits": ["a"], "pattern": "a*"},
            "pattern",
            "None when splits= names the splits (one or the other)",
            "a*",
        ),
        ({"pattern": ""}, "pattern", "None or a non-empty glob", ""),
        ({"pattern": 3}, "pattern", "None or a non-empty glob", 3),
        ({"discover_every": 0}, "discover_every", "an int >= 1", 0),
        ({"discover_every": True}, "discover_every", "an int >= 1", True),
    ],
)
def test_bad_discovery_arguments_are_refused_with_what_was_expected_and_what_came(
    kwargs: dict[str, Any], argument: str, expected: str, got: object
) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        SplitSource(Listed(["a"]), **kwargs)
    error = info.value
    assert (error.argument, error.expected, error.got) == (argument, expected, got)
    assert type(error.got) is type(got)  # 1 is not True


def test_a_backfill_state_machine_refuses_a_non_bool_adopt_new_splits() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        SplitBackfills({}, adopt_new_splits=1)  # type: ignore[arg-type]
    error = info.value
    assert (error.argument, error.expected, error.got) == ("adopt_new_splits", "a bool", 1)


# --- a joining backfill job ---------------------------------------------------------------------


def history_job(log: SplitLog, seen: Seen) -> Job:
    job = Job("history")
    job.add_actor("backfill", lambda: SourceBackfill(log), inputs={"upstream": "src"})
    job.add_actor("history_sink", lambda: Collector(seen), inputs=["backfill"])
    return job


async def backfill_states(tmp_path: Path) -> dict[str, str]:
    async with await StateStore.open(tmp_path / "state.db") as store:
        states = await store.read_all("backfill", "backfill")
    return {split: state["phase"] for split, state in states.items()}


@pytest.mark.parametrize("given", ["listed", "add", "splits="])
async def test_only_a_backfill_that_listed_its_splits_adopts_a_split_it_does_not_own(
    tmp_path: Path, given: str
) -> None:
    # Push source src → (ctl, whose first barrier's Add assigns a to the backfill) → backfill.
    log, seen = Listed(["a"]), Seen()
    fill(log, "a", 2)
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    upstream = "src"
    if given == "add":
        control = lambda: InitialAdd(lambda: rt.actor_id("backfill"), ["a"])  # noqa: E731
        rt.add_actor("ctl", control, inputs=["src"])
        upstream = "ctl"
    splits = ["a"] if given == "splits=" else None
    backfill = lambda: SourceBackfill(log, splits=splits)  # noqa: E731
    rt.add_actor("backfill", backfill, inputs={"upstream": upstream})
    rt.add_actor("sink", lambda: Collector(seen), inputs=["backfill"])
    live_b = Chunk(upstream_rows("b", [1, 2]))
    if given == "listed":
        with anyio.fail_after(scaled(10)):
            async with rt:
                await rt.checkpoint()
                fill(log, "b", 2)  # created after the backfill listed the log
                await rt.push("src", live_b)
                await checkpoint_until(rt, lambda: ("b", 2, 0) in seen.records)
        # b had no history before the job: adopted as finished, its live rows emitted.
        assert sorted(r for r in seen.records if r[0] == "b") == every(log, "b")
        assert (await backfill_states(tmp_path))["b"] == "finished"
        return
    with anyio.fail_after(scaled(10)), pytest.raises(ActorFailedError) as info:
        async with rt:
            await rt.checkpoint()
            fill(log, "b", 2)
            await rt.push("src", live_b)
            await checkpoint_until(rt, lambda: False)
    assert info.value.actor == "backfill"
    assert isinstance(info.value.cause, ProtocolError)
    assert "got a row of split 'b'" in str(info.value.cause)


async def test_a_joining_job_adopts_a_split_created_after_it_listed_the_log(
    tmp_path: Path,
) -> None:
    log, live, history = Listed(["a"]), Seen(), Seen()
    fill(log, "a", 5)
    with anyio.fail_after(scaled(20)):
        async with live_runtime(tmp_path, log, live, discover_every=1) as rt:
            await live.wait_for(lambda: len(live.records) == 5)
            handle = await rt.add_job(history_job(log, history))
            fill(log, "b", 3)  # after the job listed the log
            fill(log, "a", 2)
            await checkpoint_until(rt, lambda: len(history.records) == 10)
            await handle.wait_ready()
            fill(log, "a", 1)  # a split caching up finishes on a live record past its end
            fill(log, "b", 1)
            fill(log, "c", 2)
            await checkpoint_until(rt, lambda: len(history.records) == 14)
            for _ in range(2):
                await rt.checkpoint()
    assert sorted(live.records) == every(log, "a", "b", "c")
    assert sorted(history.records) == every(log, "a", "b", "c")
    assert await backfill_states(tmp_path) == {"a": "finished", "b": "finished", "c": "finished"}


async def test_a_split_the_job_listed_before_the_source_discovered_it_is_emitted_once(
    tmp_path: Path,
) -> None:
    log, live, history = Listed(["a"]), Seen(), Seen()
    fill(log, "a", 2)
    with anyio.fail_after(scaled(20)):
        async with live_runtime(tmp_path, log, live, discover_every=4) as rt:
            await live.wait_for(lambda: len(live.records) == 2)
            fill(log, "b", 30)  # before the job lists the log; the source lists it later
            await rt.add_job(history_job(log, history))  # the first barrier since the listing
            assert log.listings == 2  # the source's and the job's
            # The job backfills b from its first record while the live source has not
            # started it; then the source reads b from its first record too.
            await history.wait_for(lambda: len(history.records) >= 32)
            fill(log, "b", 5)
            await checkpoint_until(rt, lambda: len(live.records) == 37)
            await checkpoint_until(rt, lambda: len(history.records) >= 37)
            for _ in range(2):
                await rt.checkpoint()
    assert log.listings >= 3  # the source discovered b
    assert sorted(history.records) == every(log, "a", "b")
    assert sorted(live.records) == every(log, "a", "b")


# --- both tables, with and without a restart ----------------------------------------------------


class CrashError(Exception):
    """Ends a run the way a kill does: no final checkpoint, what followed the last one is
    lost."""


def table_rows(path: Path, schema: pa.Schema) -> list[Record]:
    if not path.exists():
        return []
    table = ds.dataset(path, schema, format="parquet").to_table()
    columns = (table[c].to_pylist() for c in (SPLIT_COLUMN, OFFSET_MAJOR, OFFSET_MINOR))
    return sorted(zip(*columns, strict=True))


def both_tables(tmp_path: Path, log: MemorySplitLog, *, declare_job: bool) -> Runtime:
    """The live job's exactly-once table ``live`` from the start; the history job's table
    ``history`` (declared again when restarting a run that added it)."""
    rt = Runtime(config(tmp_path))
    rt.add_source("src", lambda: SplitSource(log, discover_every=1, batch_rows=3))
    add_sink(rt, "live", ParquetTable(tmp_path / "live", log.schema), input="src")
    if declare_job:
        rt.declare_job(history_table_job(tmp_path, log))
    return rt


def history_table_job(tmp_path: Path, log: MemorySplitLog) -> Job:
    job = Job("history")
    job.add_actor("backfill", lambda: SourceBackfill(log), inputs={"upstream": "src"})
    add_sink(job, "history", ParquetTable(tmp_path / "history", log.schema), input="backfill")
    return job


def phases(handle: Any) -> dict[str, str]:
    """The backfill's split phases, as it reported them with the last barrier."""
    actor = handle.progress().actors.get("backfill")
    return dict(actor.detail) if actor is not None and actor.detail else {}


async def fill_tables(rt: Runtime, tmp_path: Path, log: MemorySplitLog, splits: list[str]) -> None:
    """Checkpoint until both tables hold every record of ``splits``."""
    expected = every(log, *splits)

    def done() -> bool:
        return all(table_rows(tmp_path / t, log.schema) == expected for t in ("live", "history"))

    for _ in range(100):
        if await anyio.to_thread.run_sync(done):
            return
        await rt.checkpoint()
    assert table_rows(tmp_path / "live", log.schema) == expected
    assert table_rows(tmp_path / "history", log.schema) == expected


@pytest.mark.parametrize("crash", [False, True], ids=["no-kill", "killed-and-restarted"])
async def test_splits_created_after_the_start_are_in_both_tables_exactly_once(
    tmp_path: Path, crash: bool
) -> None:
    log = Listed(["a"])
    fill(log, "a", 10)
    with anyio.fail_after(scaled(30)):
        try:
            async with both_tables(tmp_path, log, declare_job=False) as rt:
                fill(log, "b", 7)  # created after the live source listed the log
                await rt.checkpoint()
                handle = await rt.add_job(history_table_job(tmp_path, log))
                fill(log, "c", 5)  # created after the history job listed the log
                await fill_tables(rt, tmp_path, log, ["a", "b", "c"])
                await handle.wait_ready()
                fill(log, "a", 1)  # splits caching up finish on a live record past their end
                fill(log, "b", 1)
                await checkpoint_until(rt, lambda: set(phases(handle).values()) == {"finished"})
                for _ in range(3):  # every split finished: the job forwards the upstream
                    await rt.checkpoint()
                fill(log, "d", 4)  # created while the job forwards
                await fill_tables(rt, tmp_path, log, ["a", "b", "c", "d"])
                fill(log, "d", 3)
                fill(log, "e", 3)
                if crash:
                    # Read, maybe emitted, never committed: the restart reads them again.
                    await anyio.wait_all_tasks_blocked()
                    raise CrashError
                await fill_tables(rt, tmp_path, log, ["a", "b", "c", "d", "e"])
        except CrashError:
            fill(log, "f", 2)  # created while nothing ran
            async with both_tables(tmp_path, log, declare_job=True) as rt:
                fill(log, "g", 2)
                await fill_tables(rt, tmp_path, log, ["a", "b", "c", "d", "e", "f", "g"])
    splits = ["a", "b", "c", "d", "e"] + (["f", "g"] if crash else [])
    expected = every(log, *splits)
    for table in ("live", "history"):
        rows = table_rows(tmp_path / table, log.schema)
        assert not [r for r, n in Counter(rows).items() if n > 1], table  # no duplicate
        assert rows == expected, table


# --- a real Redis server ------------------------------------------------------------------------


def xadd(conn: redis.Redis, key: str, count: int) -> None:
    for i in range(count):
        conn.xadd(key, {"v": str(i)})


def redis_ids(conn: redis.Redis, keys: list[str]) -> list[Record]:
    found: list[Record] = []
    for key in keys:
        entries: Any = conn.xrange(key)
        offsets = [Offset.parse(bytes(i).decode()) for i, _ in entries]
        found += [(key, o.major, o.minor) for o in offsets]
    return sorted(found)


@pytest.mark.redis
async def test_redis_streams_created_after_the_start_reach_the_live_and_the_joining_job(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    prefix = redis_server.key_prefix()
    keys = [f"{prefix}s{i}" for i in range(3)]
    live, history = Seen(), Seen()
    with redis_server.client() as conn:
        xadd(conn, keys[0], 5)
        log = RedisStreamLog(redis_server.url, payload=PAYLOAD, pattern=f"{prefix}s*", block_ms=50)
        rt = Runtime(config(tmp_path))
        rt.add_source("src", lambda: SplitSource(log, pattern=f"{prefix}s*", discover_every=1))
        rt.add_actor("sink", lambda: Collector(live), inputs=["src"])
        with anyio.fail_after(scaled(30)):
            async with log, rt:
                await live.wait_for(lambda: len(live.records) == 5)
                await anyio.to_thread.run_sync(xadd, conn, keys[1], 4)
                await rt.add_job(history_job(log, history))
                await anyio.to_thread.run_sync(xadd, conn, keys[2], 3)
                await anyio.to_thread.run_sync(xadd, conn, keys[0], 2)
                await checkpoint_until(rt, lambda: len(live.records) == 14, most=200)
                await checkpoint_until(rt, lambda: len(history.records) == 14, most=200)
                for _ in range(2):
                    await rt.checkpoint()
        expected = redis_ids(conn, keys)
    assert sorted(live.records) == expected
    assert sorted(history.records) == expected


@pytest.mark.redis
async def test_a_misspelled_redis_stream_fails_the_source_naming_it(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    prefix = redis_server.key_prefix()
    with redis_server.client() as conn:
        xadd(conn, f"{prefix}events", 1)
    typo = f"{prefix}evnts"
    log = RedisStreamLog(redis_server.url, payload=PAYLOAD, splits=[typo], block_ms=50)
    rt = Runtime(config(tmp_path))
    rt.add_source("src", lambda: SplitSource(log))
    rt.add_actor("sink", lambda: Collector(Seen()), inputs=["src"])
    with anyio.fail_after(scaled(10)), pytest.raises(ActorFailedError) as info:
        async with log, rt:
            await rt.checkpoint()
    error = info.value.cause
    assert isinstance(error, UnknownSplitError)
    assert (info.value.actor, error.split, error.known) == ("src", typo, [])
    assert typo in str(error)
    assert "wait_for_splits=True" in str(error)


@pytest.mark.redis
@pytest.mark.slow
async def test_redis_streams_created_around_a_sigkill_are_in_both_tables_exactly_once(
    tmp_path: Path, redis_server: RedisServer, anyio_backend: str
) -> None:
    # A real kill: the child process SIGKILLs itself with a stream discovered but not
    # committed and another never listed; restarted on the same store, tables and streams,
    # with one more stream created after the restart.
    from _discovery_child import HISTORY, NEW, make_log, runtime
    from _discovery_child import xadd as child_xadd
    from _killed_child import run_killed_child

    prefix = redis_server.key_prefix()
    keys = [f"{prefix}s{i}" for i in range(5)]
    with redis_server.client() as conn:
        child_xadd(conn, keys[0], HISTORY)
        child = Path(__file__).with_name("_discovery_child.py")
        args = [str(tmp_path), redis_server.url, prefix, anyio_backend]
        await run_killed_child(child, args, "after_new_streams")
        log = make_log(redis_server.url, prefix)
        rt = runtime(tmp_path, log, declare_job=True)
        schema = log.schema
        with anyio.fail_after(scaled(60)):
            async with log, rt:
                await rt.checkpoint()  # the source listed the log: s4 is created after it
                await anyio.to_thread.run_sync(child_xadd, conn, keys[4], NEW)
                for key in keys:  # a split caching up finishes on a record past its end
                    await anyio.to_thread.run_sync(child_xadd, conn, key, 1)
                expected = await anyio.to_thread.run_sync(redis_ids, conn, keys)
                for _ in range(200):
                    tables = [table_rows(tmp_path / t, schema) for t in ("live", "history")]
                    if tables == [expected, expected]:
                        break
                    await rt.checkpoint()
    for table in ("live", "history"):
        rows = table_rows(tmp_path / table, schema)
        assert not [r for r, n in Counter(rows).items() if n > 1], table  # no duplicate
        assert rows == expected, table


# --- the state machine's adoption ---------------------------------------------------------------


def upstream_rows(split: str, offsets: list[int]) -> pa.RecordBatch:
    log = MemorySplitLog(PAYLOAD)
    return pa.record_batch(
        [
            pa.array(offsets, pa.int64()),
            pa.array([split] * len(offsets), pa.string()),
            pa.array(offsets, pa.int64()),
            pa.array([0] * len(offsets), pa.int64()),
        ],
        schema=log.schema,
    )


async def test_an_actor_that_listed_its_splits_adopts_a_new_one_as_finished() -> None:
    listed = SplitBackfills({"a": SplitBackfill()}, adopt_new_splits=True)
    visible = listed.on_upstream(upstream_rows("b", [1, 2, 3]))
    assert visible.tolist() == [True, True, True]  # no history the job missed: all emitted
    assert listed.states["b"].phase is BackfillPhase.FINISHED
    assert listed.adopt(["a", "b", "c"]) == ["c"]
    given = SplitBackfills({"a": SplitBackfill()})  # splits given explicitly: no adoption
    with pytest.raises(ProtocolError, match="'b'"):
        given.on_upstream(upstream_rows("b", [1]))
    assert set(given.states) == {"a"}
