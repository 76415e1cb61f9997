"""The live split source: one test per rule of ``barrierflow.actors.sources.split_source``."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import hypothesis.strategies as st
import pyarrow as pa
import pytest
import trio.lowlevel
import trio.testing
from _timeouts import scaled
from hypothesis import given, settings
from trio.testing import MockClock

from barrierflow.actors import SplitSource
from barrierflow.actors.sources.split_log import (
    OFFSET_MAJOR,
    OFFSET_MINOR,
    SPLIT_COLUMN,
)
from barrierflow.channels import Barrier, Chunk, Message, Watermark
from barrierflow.channels.barrier import BarrierKind
from barrierflow.channels.epoch import EpochPair
from barrierflow.channels.mutation import (
    Add,
    Pause,
    Resume,
    SourceChangeSplit,
    Split,
    Stop,
    Throttle,
)
from barrierflow.errors import (
    ActorFailedError,
    InvalidArgumentError,
    ProtocolError,
    UnknownSplitError,
)
from barrierflow.runtime import ActorContext, Job, Runtime, RuntimeConfig, StreamActor
from barrierflow.runtime.state.state_store import StateStore
from barrierflow.testing.split_log import MemorySplitLog

pytestmark = pytest.mark.anyio

PAYLOAD = pa.schema([("v", pa.int64())])

#: One record as the collector saw it: (split, offset major, payload v).
Record = tuple[str, int, int]


def log_with(**splits: Sequence[int]) -> MemorySplitLog:
    log = MemorySplitLog(PAYLOAD)
    for split, values in splits.items():
        log.append(split, {"v": list(values)})
    return log


class Seen:
    """What the collectors downstream saw: the records of each incarnation, chunk sizes."""

    def __init__(self) -> None:
        self.incarnations: list[list[Record]] = []
        self.chunks: list[Chunk] = []
        self.barriers: list[Barrier] = []
        self.fail_on: int | None = None  # a collector fails once on a chunk holding this v
        self._changed = anyio.Event()

    @property
    def latest(self) -> list[Record]:
        """The records of the latest incarnation (none before the first collector runs)."""
        return self.incarnations[-1] if self.incarnations else []

    @property
    def records(self) -> list[Record]:
        """Every record seen, all incarnations."""
        return [r for records in self.incarnations for r in records]

    def add(self, chunk: Chunk) -> None:
        batch = chunk.batch
        self.chunks.append(chunk)
        self.incarnations[-1].extend(
            zip(
                batch.column(SPLIT_COLUMN).to_pylist(),
                batch.column(OFFSET_MAJOR).to_pylist(),
                batch.column("v").to_pylist(),
                strict=True,
            )
        )
        self.changed()

    def changed(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_for(self, done: Callable[[], bool]) -> None:
        """Wait until ``done()`` holds (checked each time a collector sees rows)."""
        while not done():
            await self._changed.wait()

    async def wait_count(self, rows: int) -> None:
        await self.wait_for(lambda: len(self.records) >= rows)


class Collector(StreamActor):
    """Records the rows it sees (one list per incarnation); may fail once on a value."""

    def __init__(self, seen: Seen) -> None:
        self.seen = seen

    async def run(self, ctx: ActorContext) -> None:
        self.seen.incarnations.append([])
        async for message in ctx.messages():
            if isinstance(message, Chunk):
                fail_on = self.seen.fail_on
                if fail_on is not None and fail_on in message.batch.column("v").to_pylist():
                    self.seen.fail_on = None
                    raise RuntimeError(f"collector fails on {fail_on}")
                self.seen.add(message)
            elif isinstance(message, Barrier):
                self.seen.barriers.append(message)
            await ctx.emit(message)


class InitialAdd(StreamActor):
    """A control source that turns the graph's INITIAL barrier into one carrying ``add``
    (what a scheduler assigning splits would send), for the split source behind it."""

    def __init__(self, add: Callable[[], Add]) -> None:
        self.add = add

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Barrier) and message.kind is BarrierKind.INITIAL:
            message = message.with_mutation(self.add())
        await ctx.emit(message)


class Gate:
    """Holds barriers back on their way to the split source while closed."""

    def __init__(self) -> None:
        self.open = anyio.Event()
        self.open.set()

    def close(self) -> None:
        self.open = anyio.Event()


class GateActor(StreamActor):
    def __init__(self, gate: Gate) -> None:
        self.gate = gate

    async def process(self, message: Message, ctx: ActorContext) -> None:
        await self.gate.open.wait()
        await ctx.emit(message)


class Ending(StreamActor):
    """Runs ``inner`` and records the epoch it had reached when its run returned, finished."""

    def __init__(self, inner: StreamActor, ended: list[int]) -> None:
        self.inner = inner
        self.ended = ended

    async def run(self, ctx: ActorContext) -> None:
        await self.inner.run(ctx)
        if ctx.finished:
            self.ended.append(ctx.epoch)


def config(tmp_path: Path, **kw: Any) -> RuntimeConfig:
    options: dict[str, Any] = {"barrier_interval": 3600.0, "max_restarts": 5}
    options.update(restart_backoff=0.001, **kw)
    return RuntimeConfig(state_path=tmp_path / "state.db", **options)


def build(
    tmp_path: Path, log: MemorySplitLog, seen: Seen, /, *, recovery: bool = False, **kw: Any
) -> Runtime:
    """A runtime: source ``src`` (a SplitSource of ``log``) → collector ``sink``."""
    rt = Runtime(config(tmp_path, recovery=recovery))
    rt.add_source("src", lambda: SplitSource(log, **kw))
    rt.add_actor("sink", lambda: Collector(seen), inputs=["src"])
    return rt


def build_behind(
    tmp_path: Path, log: MemorySplitLog, seen: Seen, control: Callable[[], StreamActor], **kw: Any
) -> Runtime:
    """A runtime: control source ``ctl`` → ``src`` (a SplitSource) → collector ``sink``."""
    rt = Runtime(config(tmp_path))
    rt.add_source("ctl", control)
    rt.add_actor("src", lambda: SplitSource(log, **kw), inputs=["ctl"])
    rt.add_actor("sink", lambda: Collector(seen), inputs=["src"])
    return rt


def values(records: list[Record], split: str | None = None) -> list[int]:
    return [v for s, _, v in records if split is None or s == split]


# --- 1. assignment ------------------------------------------------------------------------------


async def test_assignment_defaults_to_every_split_of_the_log(tmp_path: Path) -> None:
    log, seen = log_with(a=[1, 2], b=[10]), Seen()
    with anyio.fail_after(scaled(10)):
        async with build(tmp_path, log, seen) as rt:
            await seen.wait_count(3)
            await rt.checkpoint()
    assert sorted(seen.records) == [("a", 1, 1), ("a", 2, 2), ("b", 1, 10)]


async def test_assignment_from_the_constructor_when_add_names_none(tmp_path: Path) -> None:
    log, seen = log_with(a=[1, 2], b=[10, 20, 30]), Seen()
    with anyio.fail_after(scaled(10)):
        async with build(tmp_path, log, seen, splits=["a", Split("b", 2)]) as rt:
            await seen.wait_count(3)
            await rt.checkpoint()
            await rt.checkpoint()
    # b starts after its offset 2.
    assert sorted(seen.records) == [("a", 1, 1), ("a", 2, 2), ("b", 3, 30)]


async def test_assignment_from_the_add_barrier_wins_over_the_constructor(tmp_path: Path) -> None:
    log, seen = log_with(a=[1, 2], b=[10, 20, 30], c=[100]), Seen()
    ids: dict[str, int] = {}
    add = lambda: Add(splits={ids["src"]: (Split("b", 1), Split("c"))})  # noqa: E731
    rt = build_behind(tmp_path, log, seen, lambda: InitialAdd(add), splits=["a"])
    ids["src"] = rt.actor_id("src")
    with anyio.fail_after(scaled(10)):
        async with rt:
            await seen.wait_count(3)
            await rt.checkpoint()
            await rt.checkpoint()
    assert sorted(seen.records) == [("b", 2, 20), ("b", 3, 30), ("c", 1, 100)]


# --- 2. offsets in state ------------------------------------------------------------------------


async def test_committed_offsets_win_over_the_split_offset_on_a_new_run(tmp_path: Path) -> None:
    log = log_with(a=[1, 2, 3])
    first, second = Seen(), Seen()
    with anyio.fail_after(scaled(10)):
        async with build(tmp_path, log, first, splits=[Split("a", 1)]) as rt:
            await first.wait_count(2)
            await rt.checkpoint()
        log.append("a", {"v": [4, 5]})
        async with build(tmp_path, log, second, splits=[Split("a", 1)]) as rt:
            await second.wait_count(2)
            await rt.checkpoint()
    assert values(first.records) == [2, 3]
    assert values(second.records) == [4, 5]
    async with await StateStore.open(tmp_path / "state.db") as store:
        assert await store.read_all("src", "offsets") == {"a": "5-0"}


async def test_a_crash_replays_exactly_what_followed_the_last_checkpoint(tmp_path: Path) -> None:
    log, seen = log_with(a=[1, 2], b=[10]), Seen()
    with anyio.fail_after(scaled(10)):
        async with build(tmp_path, log, seen, recovery=True) as rt:
            await seen.wait_count(3)
            await rt.checkpoint()  # a → 2, b → 1 durable
            log.append("a", {"v": [3, 4]})
            log.append("b", {"v": [20]})
            await seen.wait_count(6)  # emitted, not committed
            seen.fail_on = 5
            log.append("a", {"v": [5]})  # the collector fails on it: the graph is rebuilt
            await seen.wait_for(lambda: 5 in values(seen.latest))
            await rt.checkpoint()
            assert rt.stats().restarts == 1
    before, after = seen.incarnations
    assert sorted(before) == [
        ("a", 1, 1), ("a", 2, 2), ("a", 3, 3), ("a", 4, 4), ("b", 1, 10), ("b", 2, 20),
    ]  # fmt: skip
    # The rebuilt graph restarted after the committed offsets: the uncommitted records once
    # more (each exactly once), nothing committed again, nothing skipped.
    assert sorted(after) == [("a", 3, 3), ("a", 4, 4), ("a", 5, 5), ("b", 2, 20)]


# --- 3. rows ------------------------------------------------------------------------------------


async def test_each_reader_batch_is_one_insert_chunk_with_split_and_offset_columns(
    tmp_path: Path,
) -> None:
    log, seen = log_with(a=[1, 2, 3, 4, 5]), Seen()
    with anyio.fail_after(scaled(10)):
        async with build(tmp_path, log, seen, batch_rows=2) as rt:
            await seen.wait_count(5)
            await rt.checkpoint()
    assert [c.num_rows for c in seen.chunks] == [2, 2, 1]
    for chunk in seen.chunks:
        assert chunk.batch.schema.equals(log.schema)
        assert chunk.ops is None  # all inserts
        assert chunk.visibility is None
    assert seen.chunks[2].batch.column(OFFSET_MINOR).to_pylist() == [0]
    assert values(seen.records) == [1, 2, 3, 4, 5]


# --- 4. pause, resume, throttle -----------------------------------------------------------------


async def test_pause_stops_reading_and_resume_reads_again(tmp_path: Path) -> None:
    log, seen = log_with(a=[1]), Seen()
    with anyio.fail_after(scaled(10)):
        async with build(tmp_path, log, seen) as rt:
            await seen.wait_count(1)
            await rt.mutate(Pause())
            log.append("a", {"v": [2, 3]})
            await rt.checkpoint()
            await rt.checkpoint()
            assert values(seen.records) == [1]  # barriers flowed, rows did not
            await rt.mutate(Resume())
            await seen.wait_count(3)
    assert values(seen.records) == [1, 2, 3]


async def test_an_add_with_pause_starts_the_source_paused(tmp_path: Path) -> None:
    log, seen = log_with(a=[1, 2]), Seen()
    rt = build_behind(tmp_path, log, seen, lambda: InitialAdd(lambda: Add(pause=True)))
    with anyio.fail_after(scaled(10)):
        async with rt:
            await rt.checkpoint()
            await rt.checkpoint()
            assert seen.records == []
            await rt.mutate(Resume())
            await seen.wait_count(2)
    assert values(seen.records) == [1, 2]


async def test_throttle_zero_pauses_a_rate_limits_and_none_is_unlimited(tmp_path: Path) -> None:
    log, seen = log_with(a=[1]), Seen()
    with anyio.fail_after(scaled(10)):
        async with build(tmp_path, log, seen, batch_rows=2) as rt:
            source = rt.actor_id("src")
            await seen.wait_count(1)
            await rt.mutate(Throttle({source: 0}))
            log.append("a", {"v": [2, 3]})
            await rt.checkpoint()
            await rt.checkpoint()
            assert values(seen.records) == [1]
            await rt.mutate(Throttle({source: 200.0}))  # 2 rows per batch: 10 ms per batch
            await seen.wait_count(3)
            await rt.mutate(Throttle({source: None}))
            log.append("a", {"v": [4]})
            await seen.wait_count(4)
    assert values(seen.records) == [1, 2, 3, 4]


@pytest.mark.parametrize(
    "anyio_backend",
    [pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}), id="trio-mockclock")],
)
async def test_a_throttled_reader_sleeps_rows_over_rate_seconds() -> None:
    """Rule 4's arithmetic on a virtual clock: 4 batches of 2 rows at 2 rows/s take 3 s of
    sleeping between them (the last sleep comes after the last hand-over)."""
    # Checked on the runtime in the test above; here the reader alone, without a runtime.
    log = log_with(a=list(range(8)))
    source = SplitSource(log, batch_rows=2)
    times: list[float] = []
    with anyio.fail_after(scaled(10)):
        send, receive = anyio.create_memory_object_stream[Any](0)
        async with anyio.create_task_group() as tg:
            reading = _bare_reading(source, send)
            reading.positions = {"a": None}
            reading.rate = 2.0
            reading.task_group = tg
            reading.last_barrier = float("inf")  # never late
            reading.start_reader()
            async with send, receive:
                for _ in range(4):
                    await receive.receive()
                    times.append(anyio.current_time())
            tg.cancel_scope.cancel()
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert gaps == [1.0, 1.0, 1.0]


# --- 5. split changes ---------------------------------------------------------------------------


async def test_a_split_change_keeps_adds_and_drops_splits_after_its_barrier(
    tmp_path: Path,
) -> None:
    log, seen = log_with(a=[1, 2], b=[10], c=[100, 200, 300]), Seen()
    with anyio.fail_after(scaled(10)):
        async with build(tmp_path, log, seen, splits=["a", "b"]) as rt:
            source = rt.actor_id("src")
            await seen.wait_count(3)
            await rt.mutate(SourceChangeSplit({source: (Split("a"), Split("c", 1))}))
            log.append("a", {"v": [3]})
            log.append("b", {"v": [20]})
            await seen.wait_count(6)
            await rt.checkpoint()
            await rt.checkpoint()
        async with await StateStore.open(tmp_path / "state.db") as store:
            # b's entry was deleted; the assignment is durable.
            assert await store.read_all("src", "offsets") == {"a": "3-0", "c": "3-0"}
            assert await store.read_all("src", "assignment") == {"a": "", "c": "1-0"}
        log.append("a", {"v": [4]})
        log.append("b", {"v": [30]})
        log.append("c", {"v": [400]})
        again = Seen()
        async with build(tmp_path, log, again, splits=["a", "b"]) as rt:
            await again.wait_count(2)
            await rt.checkpoint()
            await rt.checkpoint()
    # a kept its offset (1 and 2 not again), c started after 1, b stopped.
    assert sorted(seen.records[3:]) == [("a", 3, 3), ("c", 2, 200), ("c", 3, 300)]
    assert sorted(seen.records[:3]) == [("a", 1, 1), ("a", 2, 2), ("b", 1, 10)]
    # A restart keeps the changed assignment over the constructor's.
    assert sorted(again.records) == [("a", 4, 4), ("c", 4, 400)]


# --- 6. self-pause ------------------------------------------------------------------------------


# anyio has a virtual clock only on trio: a MockClock that stands still until the test jumps
# it makes "N barrier intervals without a barrier" exact, with no real waiting.
@pytest.mark.parametrize(
    "anyio_backend",
    [pytest.param(("trio", {"clock": MockClock()}), id="trio-mockclock")],
)
async def test_the_reader_pauses_itself_when_barriers_stop_coming(tmp_path: Path) -> None:
    log, seen, gate = log_with(a=[1]), Seen(), Gate()
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=1.0))
    rt.add_source("ctl", lambda: GateActor(gate))
    rt.add_actor("src", lambda: SplitSource(log, wait_barrier_intervals=2), inputs=["ctl"])
    rt.add_actor("sink", lambda: Collector(seen), inputs=["src"])
    clock = trio.lowlevel.current_clock()
    assert isinstance(clock, MockClock)
    # Virtual seconds: the clock stands still but for the jump below (pytest-timeout guards
    # real time).
    with anyio.fail_after(scaled(10_000)):
        async with rt:
            await seen.wait_count(1)
            gate.close()  # barriers stop reaching the source
            clock.jump(10)  # 10 barrier intervals without a barrier at the source
            log.append("a", {"v": [2, 3]})
            await trio.testing.wait_all_tasks_blocked()
            # Had the reader not paused itself, the rows would be downstream by now: nothing
            # but the reader and the channels stands between the log and the collector.
            assert values(seen.records) == [1]
            gate.open.set()  # the held barriers arrive: the reader goes on
            await seen.wait_count(3)
    assert values(seen.records) == [1, 2, 3]


# --- 7. stop ------------------------------------------------------------------------------------


async def test_a_stop_barrier_is_passed_and_the_source_finishes(tmp_path: Path) -> None:
    # A job of its own, dropped at a barrier carrying Stop for its actors (the runtime's way
    # to stop a source).
    log, seen = log_with(a=[1]), Seen()
    ended: list[int] = []
    rt = Runtime(config(tmp_path))
    rt.add_source("idle")
    with anyio.fail_after(scaled(10)):
        async with rt:
            job = Job("reader")
            job.add_source("src", lambda: Ending(SplitSource(log), ended))
            job.add_actor("sink", lambda: Collector(seen), inputs=["src"])
            await rt.add_job(job)
            source = rt.actor_id("src")
            await seen.wait_count(1)
            epoch = await rt.drop_job("reader")
            assert ended == [epoch]  # run() returned after passing the Stop barrier
            assert seen.barriers[-1].is_stop(source)  # the Stop went downstream
            log.append("a", {"v": [2]})
            await rt.checkpoint()
            await rt.checkpoint()
    assert values(seen.records) == [1]


# --- 8. shared ----------------------------------------------------------------------------------


async def test_a_job_added_later_shares_the_records_after_its_add_barrier(tmp_path: Path) -> None:
    log, seen, late = log_with(a=[1, 2]), Seen(), Seen()
    with anyio.fail_after(scaled(10)):
        async with build(tmp_path, log, seen) as rt:
            await seen.wait_count(2)
            job = Job("late")
            job.add_actor("late_sink", lambda: Collector(late), inputs=["src"])
            await rt.add_job(job)
            log.append("a", {"v": [3, 4]})
            await seen.wait_count(4)
            await late.wait_count(2)
            await rt.checkpoint()
    assert values(seen.records) == [1, 2, 3, 4]
    assert late.records == seen.records[2:]


# --- 9. bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "argument", "expected", "got"),
    [
        ({"log": "not a log"}, "log", "a SplitLog", "str"),
        ({"batch_rows": 0}, "batch_rows", "an int >= 1", 0),
        ({"batch_rows": True}, "batch_rows", "an int >= 1", True),
        ({"batch_rows": 2.0}, "batch_rows", "an int >= 1", 2.0),
        ({"splits": "a"}, "splits", "None or a list or tuple of split names", "a"),
        ({"splits": ["a", ""]}, "splits", "non-empty split names or Splits", ""),
        ({"splits": ["a", 3]}, "splits", "non-empty split names or Splits", 3),
        ({"splits": ["a", Split("a")]}, "splits", "distinct splits", ["a", "a"]),
        ({"wait_barrier_intervals": 0}, "wait_barrier_intervals", "an int >= 1", 0),
        ({"wait_barrier_intervals": None}, "wait_barrier_intervals", "an int >= 1", None),
    ],
)
async def test_bad_constructor_arguments_are_typed_errors(
    kwargs: dict[str, Any], argument: str, expected: str, got: Any
) -> None:
    options: dict[str, Any] = {"log": log_with(a=[1]), **kwargs}
    log = options.pop("log")
    with pytest.raises(InvalidArgumentError) as info:
        SplitSource(log, **options)
    error = info.value
    assert (error.argument, error.expected, error.got) == (argument, expected, got)
    assert type(error.got) is type(got)


async def test_a_batch_of_one_row_and_a_wait_of_one_interval_are_accepted() -> None:
    # Accepted means taken as given: the reader hands over one row at a time (what a wait of
    # N intervals does has its own tests on a virtual clock).
    source = SplitSource(log_with(a=[1, 2]), batch_rows=1, wait_barrier_intervals=1)
    assert (await first_reader_batch(source)).num_rows == 1


async def test_an_unknown_split_fails_the_actor(tmp_path: Path) -> None:
    log, seen = log_with(a=[1]), Seen()
    with anyio.fail_after(scaled(10)), pytest.raises(ActorFailedError) as info:
        async with build(tmp_path, log, seen, splits=["a", "zz"]) as rt:
            await rt.checkpoint()
    assert info.value.actor == "src"
    assert isinstance(info.value.cause, UnknownSplitError)
    assert (info.value.cause.split, info.value.cause.known) == ("zz", ["a"])


class FailingRead(MemorySplitLog):
    """A log whose reads fail once they start (a server gone for good, a bad record)."""

    def read(self, start: Any, *, batch_rows: int = 4096) -> Any:
        async def failing() -> Any:
            await anyio.lowlevel.checkpoint()
            raise RuntimeError("the log's read failed")
            yield  # an async generator

        return failing()


async def test_a_read_that_fails_fails_the_actor_with_its_error(tmp_path: Path) -> None:
    log, seen = FailingRead(PAYLOAD, splits=["a"]), Seen()
    with anyio.fail_after(scaled(10)), pytest.raises(ActorFailedError) as info:
        async with build(tmp_path, log, seen) as rt:
            await rt.checkpoint()
            await rt.checkpoint()
    assert info.value.actor == "src"
    assert type(info.value.cause) is RuntimeError  # the read's own error, not a stray item
    assert str(info.value.cause) == "the log's read failed"


async def test_a_chunk_pushed_into_the_inbox_fails_the_actor(tmp_path: Path) -> None:
    log, seen = log_with(a=[1]), Seen()
    with anyio.fail_after(scaled(10)), pytest.raises(ActorFailedError) as info:
        async with build(tmp_path, log, seen) as rt:
            await rt.push("src", Chunk.from_pydict({"v": [1]}))
            await rt.checkpoint()
    assert info.value.actor == "src"
    assert type(info.value.cause) is ProtocolError
    # The message is the only place the error says what was wrong and what was expected.
    assert str(info.value.cause) == (
        "split source 'src': expected only barriers in its inbox (rows come from its split "
        "log), got a chunk of 1 rows"
    )


class FakeTable:
    """A state table's interface over a dict (what the actor put, not yet sealed)."""

    def __init__(self) -> None:
        self.rows: dict[str, Any] = {}

    def put(self, key: str, value: Any) -> None:
        self.rows[key] = value

    def delete(self, key: str) -> None:
        self.rows.pop(key, None)

    async def items(self) -> dict[str, Any]:
        return dict(self.rows)


class FakeLog:
    """Records the warnings an actor logs."""

    def __init__(self) -> None:
        self.warnings: list[tuple[str, dict[str, Any]]] = []
        self.infos: list[tuple[str, dict[str, Any]]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.warnings.append((event, fields))

    def info(self, event: str, **fields: Any) -> None:
        self.infos.append((event, fields))


class FakeCtx:
    """An actor context without a runtime: an inbox the test feeds, state tables over dicts,
    the messages emitted (a chunk's emit blocks while ``blocked`` is not set)."""

    actor_id = 7
    name = "src"
    barrier_interval = 1.0

    def __init__(self) -> None:
        self.tables: dict[str, FakeTable] = {}
        self.emitted: list[Message] = []
        self.log = FakeLog()
        self.finished = False
        self.unblocked = anyio.Event()
        self.unblocked.set()
        self._inbox: Any = None

    def __enter__(self) -> FakeCtx:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._inbox is not None:
            for stream in self._inbox:
                stream.close()

    @property
    def inbox(self) -> Any:
        """The sending end of the inbox (closed when the ``with`` block ends)."""
        if self._inbox is None:
            self._inbox = anyio.create_memory_object_stream[Message](16)
        return self._inbox[0]

    def table(self, name: str) -> FakeTable:
        return self.tables.setdefault(name, FakeTable())

    def messages(self) -> Any:
        # The stream itself, not an async generator: a reader cancelled between two messages
        # leaves no generator suspended at a yield (as the runtime's Messages does).
        assert self._inbox is not None
        return self._inbox[1]

    async def emit(self, message: Message) -> None:
        if isinstance(message, Chunk):
            await self.unblocked.wait()
        self.emitted.append(message)
        if isinstance(message, Barrier) and message.is_stop(self.actor_id):
            self.finished = True

    def rows(self) -> list[int]:
        return [v for m in self.emitted if isinstance(m, Chunk) for v in m.batch["v"].to_pylist()]


_epochs = itertools.count(1)


def barrier(mutation: Any = None) -> Barrier:
    epoch = next(_epochs)
    return Barrier(EpochPair(epoch + 1, epoch), BarrierKind.BARRIER, mutation)


def _bare_reading(source: SplitSource, send: Any, ctx: FakeCtx | None = None) -> Any:
    """The reader half of a split source without a runtime."""
    from barrierflow.actors.sources.split_source import _Reading

    return _Reading(source._settings, ctx or FakeCtx(), send)


# --- without a runtime: the actor's run and its reader on a fake context ------------------------


async def test_watermarks_in_the_inbox_are_passed_on_in_order() -> None:
    with FakeCtx() as ctx:
        first, mark = barrier(), Watermark("v", 5)
        stop = barrier(Stop(frozenset({ctx.actor_id})))
        for message in (first, mark, stop):
            await ctx.inbox.send(message)
        log = MemorySplitLog(PAYLOAD, splits=["a"])
        with anyio.fail_after(scaled(10)):
            await SplitSource(log).run(ctx)  # type: ignore[arg-type]
    assert ctx.emitted == [first, mark, stop]


async def test_a_split_change_to_an_unknown_split_fails_the_source() -> None:
    with FakeCtx() as ctx:
        change = SourceChangeSplit({ctx.actor_id: (Split("a"), Split("zz"))})
        first = barrier()
        await ctx.inbox.send(first)
        await ctx.inbox.send(barrier(change))
        with anyio.fail_after(scaled(10)), pytest.raises(UnknownSplitError) as info:
            await SplitSource(log_with(a=[1])).run(ctx)  # type: ignore[arg-type]
    assert (info.value.split, info.value.known) == ("zz", ["a"])
    # The change's barrier is not passed: its checkpoint would make the bad assignment durable.
    assert [m for m in ctx.emitted if isinstance(m, Barrier)] == [first]


async def test_each_split_change_replaces_the_durable_assignment() -> None:
    with FakeCtx() as ctx:
        for mutation in (
            None,
            SourceChangeSplit({ctx.actor_id: (Split("a"), Split("b", 1))}),
            SourceChangeSplit({ctx.actor_id: (Split("a"), Split("c"))}),
            Stop(frozenset({ctx.actor_id})),
        ):
            await ctx.inbox.send(barrier(mutation))
        log = log_with(a=[1], b=[10, 20], c=[100])
        with anyio.fail_after(scaled(10)):
            await SplitSource(log).run(ctx)  # type: ignore[arg-type]
    # b, assigned by the first change, is gone from the assignment and from the offsets.
    assert ctx.tables["assignment"].rows == {"a": "", "c": ""}
    assert "b" not in ctx.tables["offsets"].rows


class CountingLog(MemorySplitLog):
    """Counts the batches its readers handed out."""

    yielded = 0

    def read(self, start: Any, *, batch_rows: int = 4096) -> Any:
        inner = super().read(start, batch_rows=batch_rows)

        async def counted() -> Any:
            async with contextlib.aclosing(inner) as batches:
                async for batch in batches:
                    self.yielded += 1
                    yield batch

        return counted()


async def test_a_blocked_output_holds_the_reader_one_batch_ahead() -> None:
    log = CountingLog(PAYLOAD)
    log.append("a", {"v": [1, 2, 3, 4]})
    with FakeCtx() as ctx, anyio.fail_after(scaled(10)):
        ctx.unblocked = anyio.Event()  # the output takes no chunk
        await ctx.inbox.send(barrier())
        async with anyio.create_task_group() as tg:
            tg.start_soon(SplitSource(log, batch_rows=1).run, ctx)
            await anyio.wait_all_tasks_blocked()
            # One batch is being emitted, the reader holds the next; it reads no further.
            assert log.yielded == 2
            tg.cancel_scope.cancel()


def batch_of(log: MemorySplitLog, split: str, offset: int, v: int) -> pa.RecordBatch:
    columns = {"v": [v], SPLIT_COLUMN: [split], OFFSET_MAJOR: [offset], OFFSET_MINOR: [0]}
    return pa.RecordBatch.from_pydict(columns, schema=log.schema)


async def test_a_batch_of_a_reader_stopped_by_a_barrier_is_never_emitted_after_it() -> None:
    from barrierflow.actors.sources.split_source import _Batch

    log, ctx = MemorySplitLog(PAYLOAD, splits=["a"]), FakeCtx()
    send, receive = anyio.create_memory_object_stream[Any](0)
    reading = _bare_reading(SplitSource(log), send, ctx)
    await reading.restore()
    with send, receive, anyio.fail_after(scaled(10)):
        async with anyio.create_task_group() as tg:
            reading.task_group = tg
            tg.start_soon(reading.loop, receive)
            await send.send(barrier())
            await send.send(barrier(Throttle({ctx.actor_id: 100.0})))
            await anyio.wait_all_tasks_blocked()
            stopped = reading.generation  # the reader started at the first Throttle
            await send.send(barrier(Throttle({ctx.actor_id: 200.0})))
            # That reader's batch arrives after the second Throttle (it was handed over as
            # the barrier came): dropped. The new reader's batch is emitted.
            await send.send(_Batch(stopped, batch_of(log, "a", 1, 1)))
            await send.send(_Batch(reading.generation, batch_of(log, "a", 1, 2)))
            await send.send(None)
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()
    assert ctx.rows() == [2]


async def first_reader_batch(source: SplitSource) -> pa.RecordBatch:
    """The first batch ``source``'s reader hands over, reading split ``a`` from its start."""
    send, receive = anyio.create_memory_object_stream[Any](0)
    with anyio.fail_after(scaled(10)):
        async with anyio.create_task_group() as tg:
            reading = _bare_reading(source, send)
            reading.positions = {"a": None}
            reading.task_group = tg
            reading.last_barrier = float("inf")  # never late
            reading.start_reader()
            async with send, receive:
                first = await receive.receive()
                tg.cancel_scope.cancel()  # before the reader hands over the next batch
    batch: pa.RecordBatch = first.batch
    return batch


async def test_a_reader_batch_holds_4096_rows_by_default() -> None:
    assert (await first_reader_batch(SplitSource(log_with(a=range(4097))))).num_rows == 4096


@pytest.mark.parametrize(
    "anyio_backend",
    [pytest.param(("trio", {"clock": MockClock()}), id="trio-mockclock")],
)
async def test_the_reader_pauses_itself_at_five_barrier_intervals_by_default() -> None:
    """Rule 6 on a virtual clock that moves only when jumped (whole seconds: exact floats):
    the default is 5 intervals, reached exactly at 5; a reader that a barrier woke but that
    runs only 5 intervals after it waits for the next one."""
    log, ctx = log_with(a=[1]), FakeCtx()
    clock = trio.lowlevel.current_clock()
    assert isinstance(clock, MockClock)
    send, receive = anyio.create_memory_object_stream[Any](0)
    with send, receive, anyio.fail_after(scaled(10_000)):
        async with anyio.create_task_group() as tg:
            reading = _bare_reading(SplitSource(log), send, ctx)
            reading.positions = {"a": None}
            reading.task_group = tg
            reading.last_barrier = anyio.current_time()
            clock.jump(4)
            reading.start_reader()
            await anyio.wait_all_tasks_blocked()
            assert receive.receive_nowait().batch["v"].to_pylist() == [1]  # 4: not late
            clock.jump(1)
            log.append("a", {"v": [2]})
            await anyio.wait_all_tasks_blocked()
            with pytest.raises(anyio.WouldBlock):
                receive.receive_nowait()  # 5 intervals without a barrier: held
            assert ctx.log.warnings == [
                ("split source paused itself: no barrier for a while", {"seconds": 5.0})
            ]
            await reading.on_barrier(barrier())
            clock.jump(5)  # the reader runs only now, 5 intervals after that barrier
            await anyio.wait_all_tasks_blocked()
            with pytest.raises(anyio.WouldBlock):
                receive.receive_nowait()
            await reading.on_barrier(barrier())
            await anyio.wait_all_tasks_blocked()
            assert receive.receive_nowait().batch["v"].to_pylist() == [2]
            tg.cancel_scope.cancel()


# --- a property: a crash at a random point ------------------------------------------------------

#: One scripted step: ("append", split, rows) or ("checkpoint", "", 0).
Step = tuple[str, str, int]

steps_strategy = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.sampled_from(["a", "b"]), st.integers(1, 5)),
        st.just(("checkpoint", "", 0)),
    ),
    max_size=8,
)


def run_with_crash(tmp_path: Path, backend: str, before: list[Step], after: list[Step]) -> None:
    """Run ``before``, crash the collector, run ``after``; check what each incarnation saw."""
    log, seen = MemorySplitLog(PAYLOAD, splits=["a", "b"]), Seen()
    counter = itertools.count()
    appended: list[Record] = []
    committed: set[Record] = set()  # seen before a checkpoint that completed: durable

    def append(split: str, vs: list[int]) -> None:
        offsets = log.append(split, {"v": vs})
        appended.extend((split, o.major, v) for o, v in zip(offsets, vs, strict=True))

    async def play(rt: Runtime, steps: list[Step]) -> None:
        for kind, split, rows in steps:
            if kind == "append":
                append(split, [next(counter) for _ in range(rows)])
            else:
                emitted = set(seen.records)
                await rt.checkpoint()
                if len(seen.incarnations) == 1:
                    committed.update(emitted)

    async def main() -> None:
        with anyio.fail_after(scaled(20)):
            async with build(tmp_path, log, seen, recovery=True, batch_rows=3) as rt:
                await play(rt, before)
                crash = next(counter)
                seen.fail_on = crash
                append("a", [crash])
                await seen.wait_for(lambda: crash in values(seen.latest))
                await play(rt, after)
                # A last record per split, appended after the crash: only the rebuilt graph
                # can emit it, after everything before it in its split.
                ends = [next(counter), next(counter)]
                append("a", ends[:1])
                append("b", ends[1:])
                await seen.wait_for(lambda: set(ends) <= set(values(seen.latest)))

    anyio.run(main, backend=backend)
    first, second = seen.incarnations
    for split in ("a", "b"):
        everything = [r for r in appended if r[0] == split]
        mine = [r for r in first if r[0] == split]
        again = [r for r in second if r[0] == split]
        assert mine == everything[: len(mine)]  # a prefix, in order, once
        assert again == everything[len(everything) - len(again) :]  # a suffix, in order, once
        assert len(mine) + len(again) >= len(everything)  # nothing skipped
        assert not set(again) & committed  # nothing committed was emitted again


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@settings(max_examples=10, deadline=None)
@given(before=steps_strategy, after=steps_strategy)
def test_a_crash_at_a_random_point_delivers_each_record_once_per_incarnation(
    tmp_path_factory: pytest.TempPathFactory, backend: str, before: list[Step], after: list[Step]
) -> None:
    run_with_crash(tmp_path_factory.mktemp("crash"), backend, before, after)
