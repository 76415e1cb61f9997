"""async_map: many calls in flight under a bound, ordered or unordered within an epoch, retries
and timeouts counted, dead letters, a barrier passed only after the calls before it were
emitted, and the same rows with crashes — against a fake service the test steers with events
(no sleeps)."""

from __future__ import annotations

import inspect
import math
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pyarrow as pa
import pytest
import sniffio
from _timeouts import scaled
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from barrierflow.channels import Barrier, Chunk, Committable, Message, Op, Watermark
from barrierflow.errors import (
    ActorFailedError,
    AsyncCallFailedError,
    ChangelogInputError,
    InvalidArgumentError,
    SchemaMismatchError,
)
from barrierflow.operators._operator import Operator
from barrierflow.operators.async_map import DEAD_LETTERS, async_map
from barrierflow.runtime import ActorContext, Placement, Runtime, RuntimeConfig, StreamActor
from barrierflow.testing.actor_conformance import check_stream_actor, check_stream_actor_kills

pytestmark = pytest.mark.anyio

INPUT = pa.schema([("n", pa.int64())])
OUTPUT = pa.schema([("n", pa.int64()), ("name", pa.string())])


def chunk(
    *ns: int, ops: Sequence[int] | None = None, visible: Sequence[bool] | None = None
) -> Chunk:
    return Chunk(pa.record_batch([pa.array(ns, pa.int64())], schema=INPUT), ops, visible)


class Changes:
    """Wakes whoever waits for a condition on a change (no polling, no sleeps)."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def changed(self) -> None:
        self._event.set()
        self._event = anyio.Event()

    async def until(self, condition: Callable[[], bool]) -> None:
        with anyio.fail_after(scaled(5)):
            while not condition():
                await self._event.wait()


class FakeService:
    """An outside service the test steers: a gated call waits until its row's gate is opened;
    a row fails as often as told; a hung row never answers; ``turns`` makes a row's answer
    take that many scheduler turns. It records every call and the most calls at once."""

    def __init__(self, *, gated: bool = False) -> None:
        self.gated = gated
        self.gates: dict[int, anyio.Event] = {}
        self.failures: dict[int, int] = {}
        self.hung: dict[int, int] = {}  # row → attempts that never answer
        self.turns: dict[int, int] = {}
        self.calls: list[int] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.backends: set[str] = set()
        self.changes = Changes()

    def open(self, *ns: int) -> None:
        for n in ns:
            self.gates.setdefault(n, anyio.Event()).set()

    async def lookup(self, row: dict[str, Any]) -> dict[str, Any]:
        n = row["n"]
        self.calls.append(n)
        self.backends.add(sniffio.current_async_library())
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.changes.changed()
        try:
            if self.hung.get(n, 0):
                self.hung[n] -= 1
                await anyio.Event().wait()  # never set: only a timeout ends it
            if self.gated:
                await self.gates.setdefault(n, anyio.Event()).wait()
            for _ in range(self.turns.get(n, 0)):
                await anyio.lowlevel.checkpoint()
            if self.failures.get(n, 0):
                self.failures[n] -= 1
                raise ConnectionError(f"service down for {n}")
            return {"n": n, "name": f"user-{n}"}
        finally:
            self.in_flight -= 1
            self.changes.changed()


class Recorder:
    """What a collecting actor read, in order."""

    def __init__(self) -> None:
        self.seen: list[Message] = []
        self.changes = Changes()

    def rows(self) -> list[list[int]]:
        """The ``n`` values of each chunk read, chunk by chunk."""
        return [m.compact().batch["n"].to_pylist() for m in self.seen if isinstance(m, Chunk)]

    def shape(self) -> list[object]:
        """The messages after the first barrier: a chunk as its ``n`` values, a barrier as
        ``"B"``, a watermark as ``("W", value)``."""
        shown: list[object] = []
        for m in self.seen[1:]:
            if isinstance(m, Chunk):
                shown.append(m.compact().batch["n"].to_pylist())
            elif isinstance(m, Barrier):
                shown.append("B")
            elif isinstance(m, Watermark):
                shown.append(("W", m.value))
            elif isinstance(m, Committable):
                shown.append(("C", m.payload))
        return shown


class Collect(StreamActor):
    """Records every message, committables included (and keeps those)."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    async def run(self, ctx: ActorContext) -> None:
        async for message in ctx.messages(committables=True):
            self.recorder.seen.append(message)
            self.recorder.changes.changed()
            if not isinstance(message, Committable):
                await ctx.emit(message)


class Stage(StreamActor):
    """Passes each chunk on followed by a committable naming its first row."""

    async def process(self, message: Message, ctx: ActorContext) -> None:
        await ctx.emit(message)
        if isinstance(message, Chunk) and message.num_rows:
            await ctx.emit(Committable("table", message.batch["n"][0].as_py()))


class Watermarks(StreamActor):
    """Passes each chunk on followed by a watermark at its largest ``n``."""

    async def process(self, message: Message, ctx: ActorContext) -> None:
        await ctx.emit(message)
        if isinstance(message, Chunk) and message.num_rows:
            await ctx.emit(Watermark("n", max(message.batch["n"].to_pylist())))


@asynccontextmanager
async def running(
    tmp_path: Path, operator: Operator, *, watermarks: bool = False, committables: bool = False
) -> AsyncIterator[tuple[Runtime, Recorder, Recorder]]:
    """source → (watermarks or committables →) op → collect, and op:dead_letters → dead if
    declared."""
    out, dead = Recorder(), Recorder()
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=3600))
    rt.add_source("events")
    upstream = "events"
    if watermarks:
        rt.add_actor("marks", Watermarks, inputs=["events"])
        upstream = "marks"
    if committables:
        rt.add_actor("stage", Stage, inputs=["events"])
        upstream = "stage"
    rt.add_actor("op", operator, inputs=[upstream])
    rt.add_actor("collect", lambda: Collect(out), inputs=["op"])
    if operator.side_outputs:
        rt.add_actor("dead", lambda: Collect(dead), inputs=[f"op:{DEAD_LETTERS}"])
    # A deadline for the whole run: a graph that hangs (a call never emitted) fails fast.
    with anyio.fail_after(scaled(5)):
        async with rt:
            yield rt, out, dead


def metric(rt: Runtime, name: str) -> float | None:
    return rt.stats().metric(f"barrierflow_operator_{name}", actor="op", operator="async_map")


async def settle() -> None:
    """Let every task run until all wait (the runtime's and the calls')."""
    await anyio.wait_all_tasks_blocked()


# Order.


async def test_ordered_output_keeps_input_order_when_answers_come_out_of_order(
    tmp_path: Path,
) -> None:
    service = FakeService(gated=True)
    async with running(tmp_path, async_map(service.lookup, schema=OUTPUT)) as (rt, out, _):
        await rt.push("events", chunk(1, 2, 3))
        await service.changes.until(lambda: len(service.calls) == 3)
        service.open(2)
        await settle()
        assert out.rows() == []  # row 2 waits for row 1
        service.open(1)
        await out.changes.until(lambda: len(out.rows()) == 1)
        assert out.rows() == [[1, 2]]  # the completed prefix, as one chunk
        service.open(3)
        await rt.checkpoint()
        assert out.shape() == [[1, 2], [3], "B"]
    names = [r for m in out.seen if isinstance(m, Chunk) for r in m.batch["name"].to_pylist()]
    assert names == ["user-1", "user-2", "user-3"]


async def test_unordered_output_emits_each_result_as_it_arrives(tmp_path: Path) -> None:
    service = FakeService(gated=True)
    operator = async_map(service.lookup, schema=OUTPUT, ordered=False)
    async with running(tmp_path, operator) as (rt, out, _):
        await rt.push("events", chunk(1, 2, 3))
        await service.changes.until(lambda: len(service.calls) == 3)
        for n, expected in ((3, [[3]]), (1, [[3], [1]]), (2, [[3], [1], [2]])):
            service.open(n)
            count = len(expected)
            await out.changes.until(lambda: len(out.rows()) == count)  # noqa: B023
            assert out.rows() == expected


async def test_unordered_output_never_crosses_a_barrier(tmp_path: Path) -> None:
    service = FakeService(gated=True)
    operator = async_map(service.lookup, schema=OUTPUT, ordered=False)
    async with running(tmp_path, operator) as (rt, out, _), anyio.create_task_group() as tg:
        await rt.push("events", chunk(1, 2))
        await service.changes.until(lambda: len(service.calls) == 2)
        service.open(1)
        await out.changes.until(lambda: out.rows() == [[1]])
        tg.start_soon(rt.checkpoint)
        await settle()  # the barrier waits at the operator for row 2
        await rt.push("events", chunk(3))
        service.open(3)
        await settle()
        assert service.calls == [1, 2]  # nothing after the barrier was read
        assert out.shape() == [[1]]
        service.open(2)
        await out.changes.until(lambda: len(out.rows()) == 3)
    assert out.shape()[:4] == [[1], [2], "B", [3]]


# Barriers and watermarks.


async def test_a_barrier_waits_for_the_calls_in_flight_and_follows_their_results(
    tmp_path: Path,
) -> None:
    service = FakeService(gated=True)
    async with running(tmp_path, async_map(service.lookup, schema=OUTPUT)) as (rt, out, _):
        await rt.push("events", chunk(1, 2))
        await service.changes.until(lambda: len(service.calls) == 2)
        done = anyio.Event()

        async def checkpoint() -> None:
            await rt.checkpoint()
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(checkpoint)
            await settle()
            assert out.shape() == []
            assert not done.is_set()
            service.open(2, 1)
        assert out.shape() == [[1, 2], "B"]


async def test_a_watermark_waits_for_the_calls_before_it(tmp_path: Path) -> None:
    service = FakeService(gated=True)
    operator = async_map(service.lookup, schema=OUTPUT)
    async with running(tmp_path, operator, watermarks=True) as (rt, out, _):
        await rt.push("events", chunk(4, 7))
        await service.changes.until(lambda: len(service.calls) == 2)
        service.open(7)
        await settle()
        assert out.shape() == []  # the watermark waits for row 4's result
        service.open(4)
        await out.changes.until(lambda: len(out.shape()) == 2)
        assert out.shape() == [[4, 7], ("W", 7)]


async def test_a_committable_passes_at_once_ahead_of_the_calls_in_flight(
    tmp_path: Path,
) -> None:
    service = FakeService(gated=True)
    operator = async_map(service.lookup, schema=OUTPUT)
    async with running(tmp_path, operator, committables=True) as (rt, out, _):
        await rt.push("events", chunk(5))
        await out.changes.until(lambda: len(out.shape()) == 1)
        assert out.shape() == [("C", 5)]  # row 5's call is still waiting
        service.open(5)
        await rt.checkpoint()
        # It belongs to the epoch of the barrier after it, as the row does.
        assert out.shape() == [("C", 5), [5], "B"]


# The window.


async def test_the_window_bounds_the_calls_in_flight_and_stops_reading_input(
    tmp_path: Path,
) -> None:
    service = FakeService(gated=True)
    operator = async_map(service.lookup, schema=OUTPUT, concurrency=3)
    async with running(tmp_path, operator) as (rt, out, _):
        await rt.push("events", chunk(1, 2, 3, 4, 5))
        await rt.push("events", chunk(6))
        await service.changes.until(lambda: len(service.calls) == 3)
        await settle()
        assert service.calls == [1, 2, 3]
        assert metric(rt, "calls_in_flight") == 3
        # The initial barrier and the first chunk: the second chunk is not read.
        assert rt.stats().actors["op"].messages_in == 2
        service.open(1)
        await service.changes.until(lambda: len(service.calls) == 4)
        await settle()
        assert service.calls == [1, 2, 3, 4]
        service.open(2, 3, 4, 5, 6)
        await rt.checkpoint()
        assert metric(rt, "calls_in_flight") == 0
        assert metric(rt, "rows_in") == 6
        assert metric(rt, "rows_out") == 6
    assert service.max_in_flight == 3
    assert [n for rows in out.rows() for n in rows] == [1, 2, 3, 4, 5, 6]


async def test_results_waiting_for_an_earlier_row_are_bounded_by_the_concurrency(
    tmp_path: Path,
) -> None:
    service = FakeService(gated=True)
    operator = async_map(service.lookup, schema=OUTPUT, concurrency=3)
    async with running(tmp_path, operator) as (rt, out, _):
        await rt.push("events", chunk(1, 2, 3, 4, 5, 6, 7))
        await service.changes.until(lambda: len(service.calls) == 3)
        service.open(3, 4, 5, 6, 7)
        await service.changes.until(lambda: len(service.calls) == 5)
        await settle()
        # Rows 3, 4 and 5 answered and wait for rows 1 and 2: three results waiting, no
        # room for row 6 although two workers are free.
        assert service.calls == [1, 2, 3, 4, 5]
        assert service.in_flight == 2
        service.open(1, 2)
        await rt.checkpoint()
    assert out.rows()[0] == [1, 2, 3, 4, 5]
    assert [n for rows in out.rows() for n in rows] == [1, 2, 3, 4, 5, 6, 7]


async def test_a_new_chunk_wakes_every_free_worker(tmp_path: Path) -> None:
    service = FakeService(gated=True)
    operator = async_map(service.lookup, schema=OUTPUT, concurrency=3)
    async with running(tmp_path, operator) as (rt, _, _):
        await rt.push("events", chunk(1))
        await service.changes.until(lambda: len(service.calls) == 1)
        await rt.push("events", chunk(2, 3, 4, 5))
        await service.changes.until(lambda: len(service.calls) == 3)
        await settle()
        assert service.calls == [1, 2, 3]  # the two idle workers both took a row
        service.open(1, 2, 3, 4, 5)
        await rt.checkpoint()


# Retries, timeouts, failures.


async def test_a_failed_call_is_retried_then_succeeds(tmp_path: Path) -> None:
    service = FakeService()
    service.failures[2] = 2
    operator = async_map(service.lookup, schema=OUTPUT, retries=2, retry_delay=0)
    async with running(tmp_path, operator) as (rt, out, _):
        await rt.push("events", chunk(1, 2, 3))
        await rt.checkpoint()
        assert metric(rt, "call_retries") == 2
        assert metric(rt, "call_timeouts") == 0
    assert sorted(service.calls) == [1, 2, 2, 2, 3]
    assert [n for rows in out.rows() for n in rows] == [1, 2, 3]


async def test_spent_retries_fail_the_actor_naming_the_key_and_the_cause(tmp_path: Path) -> None:
    service = FakeService(gated=True)
    service.open(2)
    service.failures[2] = 9
    operator = async_map(service.lookup, schema=OUTPUT, retries=2, retry_delay=0, key="n")
    with pytest.raises(ActorFailedError) as caught:
        async with running(tmp_path, operator) as (rt, _, _):
            # Row 1 never answers: the failure of row 2 cancels it.
            await rt.push("events", chunk(1, 2))
            await rt.checkpoint()
    error = caught.value.cause
    assert isinstance(error, AsyncCallFailedError)
    assert (error.actor, error.key, error.attempts) == ("op", 2, 3)
    assert isinstance(error.cause, ConnectionError)
    assert error.__cause__ is error.cause
    assert service.calls.count(2) == 3


async def test_calls_failing_for_good_at_once_fail_the_actor_with_the_first_one_not_a_group(
    tmp_path: Path,
) -> None:
    # Eight workers run out of retries in the same turn of the loop: each raises before the
    # first one's cancellation reaches the others. The actor fails with one error, the
    # first call's to fail for good, on both backends (asyncio gathered them in a group).
    async def fail(row: dict[str, Any]) -> dict[str, Any]:
        await anyio.lowlevel.checkpoint()
        raise ConnectionError(f"503 for {row['n']}")

    operator = async_map(fail, schema=OUTPUT, concurrency=8, retries=1, retry_delay=0, key="n")
    with pytest.raises(ActorFailedError) as caught:
        async with running(tmp_path, operator) as (rt, _, _):
            await rt.push("events", chunk(*range(32)))
            await rt.checkpoint()
    error = caught.value.cause
    assert isinstance(error, AsyncCallFailedError)
    assert error.attempts == 2
    assert str(error.cause) == f"503 for {error.key}"


async def test_without_a_key_a_failed_row_is_named_by_its_position_in_its_chunk(
    tmp_path: Path,
) -> None:
    service = FakeService()
    service.failures[7] = 9
    operator = async_map(service.lookup, schema=OUTPUT, retries=0)
    with pytest.raises(ActorFailedError) as caught:
        async with running(tmp_path, operator) as (rt, _, _):
            await rt.push("events", chunk(5, 6, 7, 8, visible=[False, True, True, True]))
            await rt.checkpoint()
    error = caught.value.cause
    assert isinstance(error, AsyncCallFailedError)
    assert (error.key, error.attempts) == (2, 1)


async def test_a_key_of_two_columns_names_a_row_by_a_tuple(tmp_path: Path) -> None:
    async def fail(row: dict[str, Any]) -> dict[str, Any]:
        raise LookupError(row["n"])

    batch = pa.record_batch({"n": [4, 5], "m": ["a", "b"]})
    operator = async_map(fail, schema=OUTPUT, retries=0, key=["m", "n"], concurrency=1)
    with pytest.raises(ActorFailedError) as caught:
        async with running(tmp_path, operator) as (rt, _, _):
            await rt.push("events", Chunk(batch))
            await rt.checkpoint()
    error = caught.value.cause
    assert isinstance(error, AsyncCallFailedError)
    assert error.key == ("a", 4)


async def test_a_call_that_times_out_is_counted_and_retried(tmp_path: Path) -> None:
    service = FakeService()
    service.hung[2] = 2  # its first two attempts never answer
    operator = async_map(service.lookup, schema=OUTPUT, timeout=0.001, retry_delay=0)
    async with running(tmp_path, operator) as (rt, out, _):
        await rt.push("events", chunk(1, 2))
        await rt.checkpoint()
        assert metric(rt, "call_timeouts") == 2
        assert metric(rt, "call_retries") == 2
    assert [n for rows in out.rows() for n in rows] == [1, 2]
    assert service.calls.count(2) == 3


async def test_without_a_timeout_calls_are_awaited_as_long_as_they_take(tmp_path: Path) -> None:
    service = FakeService(gated=True)
    operator = async_map(service.lookup, schema=OUTPUT, timeout=math.inf)
    async with running(tmp_path, operator) as (rt, out, _):
        await rt.push("events", chunk(1, 2))
        await service.changes.until(lambda: len(service.calls) == 2)
        service.open(2, 1)
        await rt.checkpoint()
        assert metric(rt, "call_timeouts") == 0
    assert out.rows() == [[1, 2]]
    names = [m.batch["name"].to_pylist() for m in out.seen if isinstance(m, Chunk)]
    assert names == [["user-1", "user-2"]]


async def test_a_call_that_always_times_out_fails_with_a_timeout_cause(tmp_path: Path) -> None:
    service = FakeService()
    service.hung[1] = 99
    operator = async_map(service.lookup, schema=OUTPUT, timeout=0.001, retries=1, retry_delay=0)
    with pytest.raises(ActorFailedError) as caught:
        async with running(tmp_path, operator) as (rt, _, _):
            await rt.push("events", chunk(1))
            await rt.checkpoint()
    error = caught.value.cause
    assert isinstance(error, AsyncCallFailedError)
    assert error.attempts == 2
    assert isinstance(error.cause, TimeoutError)
    assert "0.001 s" in str(error.cause)


async def test_the_backoff_waits_between_attempts(tmp_path: Path) -> None:
    service = FakeService()
    service.failures[1] = 1
    # A cap of 0 keeps the wait at nothing while the retry still goes through the backoff.
    operator = async_map(
        service.lookup, schema=OUTPUT, retry_delay=0.001, max_retry_delay=0.001, retries=1
    )
    async with running(tmp_path, operator) as (rt, out, _):
        await rt.push("events", chunk(1))
        await rt.checkpoint()
    assert service.calls == [1, 1]
    assert out.rows() == [[1]]


# Dead letters.


async def test_dead_letters_go_to_the_side_output_with_the_error_and_attempts(
    tmp_path: Path,
) -> None:
    service = FakeService()
    service.failures[2] = 9
    operator = async_map(service.lookup, schema=OUTPUT, retries=1, retry_delay=0, dead_letters=True)
    assert operator.side_outputs == (DEAD_LETTERS,)
    async with running(tmp_path, operator) as (rt, out, dead):
        await rt.push("events", chunk(1, 2, 3))
        await rt.checkpoint()
        assert metric(rt, "dead_letters") == 1
        assert metric(rt, "rows_out") == 2
    assert [n for rows in out.rows() for n in rows] == [1, 3]
    [letter] = [m for m in dead.seen if isinstance(m, Chunk)]
    assert letter.batch.schema.names == ["n", "error", "attempts"]
    assert letter.batch.schema.field("attempts").type == pa.int32()
    assert letter.batch.to_pylist() == [
        {"n": 2, "error": "ConnectionError: service down for 2", "attempts": 2}
    ]


async def test_dead_letters_are_counted_over_every_emission(tmp_path: Path) -> None:
    service = FakeService()
    service.failures.update({1: 9, 2: 9})
    operator = async_map(service.lookup, schema=OUTPUT, retries=0, dead_letters=True)
    async with running(tmp_path, operator) as (rt, _, dead):
        await rt.push("events", chunk(1))
        await rt.checkpoint()
        await rt.push("events", chunk(2))
        await rt.checkpoint()
        assert metric(rt, "dead_letters") == 2
    assert dead.rows() == [[1], [2]]


async def test_a_chunk_whose_calls_all_failed_emits_no_main_rows(tmp_path: Path) -> None:
    service = FakeService()
    service.failures.update({1: 9, 2: 9})
    operator = async_map(service.lookup, schema=OUTPUT, retries=0, dead_letters=True)
    async with running(tmp_path, operator) as (rt, out, dead):
        await rt.push("events", chunk(1, 2))
        await rt.checkpoint()
    assert out.rows() == []
    assert sorted(n for rows in dead.rows() for n in rows) == [1, 2]


async def test_dead_letters_refuse_a_changelog_input(tmp_path: Path) -> None:
    service = FakeService()
    operator = async_map(service.lookup, schema=OUTPUT, dead_letters=True)
    with pytest.raises(ActorFailedError) as caught:
        async with running(tmp_path, operator) as (rt, _, _):
            await rt.push("events", chunk(1, 2, ops=[Op.INSERT, Op.DELETE]))
            await rt.checkpoint()
    error = caught.value.cause
    assert isinstance(error, ChangelogInputError)
    assert (error.actor, error.operator) == ("op", "async_map")
    assert error.expected == (
        "an insert-only input with dead_letters=True (it would break the changelog)"
    )
    assert error.what == "a chunk with 1 delete(s) or update(s)"
    assert service.calls == []


async def test_an_input_with_the_dead_letter_columns_is_refused(tmp_path: Path) -> None:
    service = FakeService()
    operator = async_map(service.lookup, schema=OUTPUT, dead_letters=True)
    with pytest.raises(ActorFailedError) as caught:
        async with running(tmp_path, operator) as (rt, _, _):
            await rt.push("events", Chunk(pa.record_batch({"n": [1], "attempts": [1]})))
            await rt.checkpoint()
    error = caught.value.cause
    assert isinstance(error, InvalidArgumentError)
    assert error.argument == "async_map 'op': input"
    assert error.expected == "no column named 'error' or 'attempts' (a dead letter adds them)"
    assert error.got == ["n", "attempts"]


# Ops and visibility.


async def test_ordered_output_keeps_the_ops_row_for_row(tmp_path: Path) -> None:
    service = FakeService()
    ops = [Op.INSERT, Op.UPDATE_DELETE, Op.UPDATE_INSERT, Op.DELETE]
    async with running(tmp_path, async_map(service.lookup, schema=OUTPUT)) as (rt, out, _):
        await rt.push("events", chunk(1, 2, 2, 3, ops=ops))
        await rt.push("events", chunk(4))  # no ops: inserts
        await rt.checkpoint()
    got = [(n, op) for m in out.seen if isinstance(m, Chunk) for n, op in _with_ops(m)]
    assert got == [(1, 0), (2, 2), (2, 3), (3, 1), (4, 0)]


async def test_one_emitted_run_joins_chunks_with_and_without_ops(tmp_path: Path) -> None:
    service = FakeService(gated=True)
    async with running(tmp_path, async_map(service.lookup, schema=OUTPUT)) as (rt, out, _):
        await rt.push("events", chunk(1, 2, ops=[Op.INSERT, Op.DELETE]))
        await rt.push("events", chunk(3, 4))  # no ops: inserts
        await service.changes.until(lambda: len(service.calls) == 4)
        service.open(2, 3, 4)
        await service.changes.until(lambda: service.in_flight == 1)
        service.open(1)
        await rt.checkpoint()
    [result] = [m for m in out.seen if isinstance(m, Chunk)]
    assert _with_ops(result) == [(1, 0), (2, 1), (3, 0), (4, 0)]
    assert result.ops is not None
    assert result.ops.type == pa.int8()


def _with_ops(message: Chunk) -> list[tuple[int, int]]:
    return list(zip(message.batch["n"].to_pylist(), message.ops_numpy().tolist(), strict=True))


async def test_an_insert_only_input_has_no_ops_in_its_output(tmp_path: Path) -> None:
    service = FakeService()
    async with running(tmp_path, async_map(service.lookup, schema=OUTPUT)) as (rt, out, _):
        await rt.push("events", chunk(1, 2))
        await rt.checkpoint()
    results = [m for m in out.seen if isinstance(m, Chunk)]
    assert results
    assert all(m.ops is None for m in results)


async def test_unordered_output_refuses_a_changelog_input(tmp_path: Path) -> None:
    service = FakeService()
    operator = async_map(service.lookup, schema=OUTPUT, ordered=False)
    with pytest.raises(ActorFailedError) as caught:
        async with running(tmp_path, operator) as (rt, _, _):
            await rt.push("events", chunk(1, 2, ops=[Op.UPDATE_DELETE, Op.UPDATE_INSERT]))
            await rt.checkpoint()
    error = caught.value.cause
    assert isinstance(error, ChangelogInputError)
    assert (
        error.expected == "an insert-only input with ordered=False (it would break the changelog)"
    )
    assert error.what == "a chunk with 2 delete(s) or update(s)"


async def test_hidden_rows_are_not_called_and_their_ops_are_not_judged(tmp_path: Path) -> None:
    service = FakeService()
    operator = async_map(service.lookup, schema=OUTPUT, ordered=False)
    async with running(tmp_path, operator) as (rt, out, _):
        # The hidden DELETE is no changelog for an unordered map: only visible rows count.
        pushed = chunk(1, 2, 3, ops=[Op.INSERT, Op.DELETE, Op.INSERT], visible=[True, False, True])
        await rt.push("events", pushed)
        await rt.checkpoint()
    assert sorted(service.calls) == [1, 3]
    assert sorted(n for rows in out.rows() for n in rows) == [1, 3]


async def test_an_empty_chunk_makes_no_calls(tmp_path: Path) -> None:
    service = FakeService()
    async with running(tmp_path, async_map(service.lookup, schema=OUTPUT)) as (rt, out, _):
        await rt.push("events", chunk(1, visible=[False]))
        await rt.checkpoint()
        assert metric(rt, "rows_in") == 0
    assert service.calls == []
    assert out.rows() == []


async def test_fn_runs_on_the_running_backend(tmp_path: Path, anyio_backend_name: str) -> None:
    service = FakeService()
    async with running(tmp_path, async_map(service.lookup, schema=OUTPUT)) as (rt, _, _):
        await rt.push("events", chunk(1))
        await rt.checkpoint()
    assert service.backends == {anyio_backend_name}


# Batch mode.


async def test_batch_mode_calls_fn_with_batches_of_at_most_batch_size_rows(
    tmp_path: Path,
) -> None:
    sizes: list[int] = []

    async def names(rows: pa.RecordBatch) -> pa.RecordBatch:
        sizes.append(rows.num_rows)
        await anyio.lowlevel.checkpoint()
        n = rows["n"]
        return pa.record_batch([n, pa.array([f"user-{v}" for v in n.to_pylist()])], OUTPUT)

    operator = async_map(names, schema=OUTPUT, batch_size=2)
    async with running(tmp_path, operator) as (rt, out, _):
        pushed = chunk(
            1,
            2,
            3,
            4,
            5,
            6,
            ops=[0, 0, Op.DELETE, 0, 0, Op.DELETE],
            visible=[True, True, True, False, True, True],
        )
        await rt.push("events", pushed)
        await rt.checkpoint()
    assert sizes == [2, 2, 1]
    got = [(n, op) for m in out.seen if isinstance(m, Chunk) for n, op in _with_ops(m)]
    assert got == [(1, 0), (2, 0), (3, 1), (5, 0), (6, 1)]


async def test_a_failed_batch_names_every_row_of_it(tmp_path: Path) -> None:
    async def fail(rows: pa.RecordBatch) -> pa.RecordBatch:
        raise ConnectionError("down")

    operator = async_map(fail, schema=OUTPUT, batch_size=3, retries=0, key="n")
    with pytest.raises(ActorFailedError) as caught:
        async with running(tmp_path, operator) as (rt, _, _):
            await rt.push("events", chunk(1, 2))
            await rt.checkpoint()
    error = caught.value.cause
    assert isinstance(error, AsyncCallFailedError)
    assert error.key == [1, 2]


async def test_without_a_key_a_failed_batch_is_named_by_its_rows_positions(
    tmp_path: Path,
) -> None:
    async def fail_on_3(rows: pa.RecordBatch) -> pa.RecordBatch:
        if 3 in rows["n"].to_pylist():
            raise ConnectionError("down")
        return pa.record_batch([rows["n"], pa.array(["x"] * rows.num_rows)], OUTPUT)

    operator = async_map(fail_on_3, schema=OUTPUT, batch_size=2, retries=0)
    with pytest.raises(ActorFailedError) as caught:
        async with running(tmp_path, operator) as (rt, _, _):
            await rt.push("events", chunk(1, 2, 3))
            await rt.checkpoint()
    error = caught.value.cause
    assert isinstance(error, AsyncCallFailedError)
    assert error.key == [2]


async def test_a_failed_batch_sends_all_its_rows_to_the_dead_letters(tmp_path: Path) -> None:
    async def fail_odd(rows: pa.RecordBatch) -> pa.RecordBatch:
        if rows["n"][0].as_py() % 2:
            raise ConnectionError("down")
        return pa.record_batch([rows["n"], pa.array(["x"] * rows.num_rows)], OUTPUT)

    operator = async_map(fail_odd, schema=OUTPUT, batch_size=2, retries=0, dead_letters=True)
    async with running(tmp_path, operator) as (rt, out, dead):
        await rt.push("events", chunk(1, 2, 4, 5))
        await rt.checkpoint()
    assert out.rows() == [[4, 5]]
    [letters] = [m.batch for m in dead.seen if isinstance(m, Chunk)]
    assert letters.to_pylist() == [
        {"n": 1, "error": "ConnectionError: down", "attempts": 1},
        {"n": 2, "error": "ConnectionError: down", "attempts": 1},
    ]


# Results that break fn's promise: a bug, failed at once and never retried.


async def _fails_with(tmp_path: Path, operator: Operator) -> BaseException:
    with pytest.raises(ActorFailedError) as caught:
        async with running(tmp_path, operator) as (rt, _, _):
            await rt.push("events", chunk(1, 2))
            await rt.checkpoint()
    return caught.value.cause


async def test_a_row_result_that_is_not_a_dict_fails_unretried(tmp_path: Path) -> None:
    calls: list[int] = []

    async def bad(row: dict[str, Any]) -> Any:
        calls.append(row["n"])
        return [row["n"]]

    error = await _fails_with(tmp_path, async_map(bad, schema=OUTPUT, concurrency=1))
    assert isinstance(error, InvalidArgumentError)
    assert (error.argument, error.expected) == (
        "async_map 'op': fn's result",
        "a dict of the output's columns",
    )
    assert error.got == [1]
    assert calls == [1]


async def test_row_results_that_do_not_convert_fail(tmp_path: Path) -> None:
    async def bad(row: dict[str, Any]) -> dict[str, Any]:
        return {"n": "not a number", "name": "x"}

    error = await _fails_with(tmp_path, async_map(bad, schema=OUTPUT))
    assert isinstance(error, InvalidArgumentError)
    assert (error.argument, error.expected) == (
        "async_map 'op': fn's results",
        "rows of ['n', 'name']",
    )
    assert "not a number" in error.got


async def test_a_batch_result_of_another_row_count_fails(tmp_path: Path) -> None:
    async def bad(rows: pa.RecordBatch) -> pa.RecordBatch:
        return pa.record_batch([pa.array([1]), pa.array(["x"])], OUTPUT)

    error = await _fails_with(tmp_path, async_map(bad, schema=OUTPUT, batch_size=2))
    assert isinstance(error, InvalidArgumentError)
    assert error.argument == "async_map 'op': fn's result"
    assert (error.expected, error.got) == ("a pyarrow.RecordBatch of 2 rows", "1 rows")


async def test_a_batch_result_that_is_not_a_batch_fails(tmp_path: Path) -> None:
    async def bad(rows: pa.RecordBatch) -> Any:
        return rows.to_pylist()

    error = await _fails_with(tmp_path, async_map(bad, schema=OUTPUT, batch_size=2))
    assert isinstance(error, InvalidArgumentError)
    assert error.got == [{"n": 1}, {"n": 2}]


async def test_a_batch_result_of_another_schema_fails_naming_both(tmp_path: Path) -> None:
    async def bad(rows: pa.RecordBatch) -> pa.RecordBatch:
        return rows

    error = await _fails_with(tmp_path, async_map(bad, schema=OUTPUT, batch_size=2))
    assert isinstance(error, SchemaMismatchError)
    assert error.argument == "async_map 'op': fn's result"
    assert error.expected_schema == OUTPUT
    assert error.actual_schema == INPUT


async def test_a_key_column_missing_from_the_input_fails(tmp_path: Path) -> None:
    service = FakeService()
    error = await _fails_with(tmp_path, async_map(service.lookup, schema=OUTPUT, key="user"))
    assert isinstance(error, InvalidArgumentError)
    assert (error.argument, error.expected) == ("async_map 'op': key", "columns of the input ['n']")
    assert error.got == ["user"]
    assert service.calls == []


# Declaration.


async def _row(row: dict[str, Any]) -> dict[str, Any]:
    return row


class _Callable:
    async def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        return row


@pytest.mark.parametrize(
    ("argument", "overrides"),
    [
        ("fn", {"fn": lambda row: row}),
        ("fn", {"fn": 3}),
        ("fn", {"fn": _Callable}),
        ("schema", {"schema": ["n"]}),
        ("concurrency", {"concurrency": 0}),
        ("concurrency", {"concurrency": True}),
        ("concurrency", {"concurrency": 2.0}),
        ("ordered", {"ordered": 1}),
        ("dead_letters", {"dead_letters": "yes"}),
        ("timeout", {"timeout": 0}),
        ("timeout", {"timeout": -1}),
        ("timeout", {"timeout": math.nan}),
        ("timeout", {"timeout": True}),
        ("timeout", {"timeout": "30"}),
        ("retries", {"retries": -1}),
        ("retries", {"retries": 1.0}),
        ("batch_size", {"batch_size": 0}),
        ("batch_size", {"batch_size": False}),
        ("key", {"key": 3}),
        ("key", {"key": []}),
        ("retry_delay", {"retry_delay": 0.0005}),
        ("retry_delay", {"retry_delay": -0.01}),
        ("retry_delay", {"retry_delay": math.inf}),
        ("retry_delay", {"retry_delay": "0.01"}),
        ("max_retry_delay", {"max_retry_delay": 0.005}),
        ("max_retry_delay", {"max_retry_delay": math.inf}),
        ("max_retry_delay", {"max_retry_delay": None}),
    ],
)
def test_bad_arguments_are_refused_when_called(argument: str, overrides: dict[str, Any]) -> None:
    arguments: dict[str, Any] = {"fn": _row, "schema": OUTPUT}
    arguments.update(overrides)
    with pytest.raises(InvalidArgumentError) as refused:
        async_map(**arguments)
    assert refused.value.argument == argument
    assert refused.value.expected == EXPECTED[argument]
    assert refused.value.got is overrides[argument]


#: What each refusal says was expected.
EXPECTED = {
    "fn": "an async function of a row dict",
    "schema": "a pyarrow.Schema of the output rows",
    "concurrency": "an int >= 1",
    "ordered": "a bool",
    "dead_letters": "a bool",
    "timeout": "a number of seconds > 0",
    "retries": "an int >= 0",
    "batch_size": "None or an int >= 1",
    "key": "a column name or a list of column names",
    "retry_delay": "0 or a finite number >= 0.001",
    "max_retry_delay": "a finite number >= retry_delay (0.01)",
}


def test_a_batch_function_that_is_not_async_is_refused_naming_a_batch() -> None:
    with pytest.raises(InvalidArgumentError) as refused:
        async_map(lambda rows: rows, schema=OUTPUT, batch_size=10)
    assert refused.value.expected == "an async function of a RecordBatch"


@pytest.mark.parametrize(
    "overrides",
    [
        {"fn": _Callable()},
        {"timeout": math.inf},
        {"timeout": 1},
        {"retries": 0},
        {"batch_size": 1},
        {"concurrency": 1},
        {"retry_delay": 0, "max_retry_delay": 0},
        {"retry_delay": 0.001, "max_retry_delay": 0.001},
        {"key": ("a", "b")},
    ],
)
def test_edge_arguments_are_accepted(overrides: dict[str, Any]) -> None:
    arguments: dict[str, Any] = {"fn": _row, "schema": OUTPUT}
    arguments.update(overrides)
    assert async_map(**arguments).kind == "async_map"


def test_the_defaults_are_the_documented_ones() -> None:
    defaults = {
        name: p.default
        for name, p in inspect.signature(async_map).parameters.items()
        if p.default is not p.empty
    }
    assert defaults == {
        "concurrency": 16,
        "ordered": True,
        "timeout": 30.0,
        "retries": 3,
        "batch_size": None,
        "key": None,
        "dead_letters": False,
        "retry_delay": 0.01,
        "max_retry_delay": 1.0,
    }


async def test_by_default_sixteen_calls_are_in_flight(tmp_path: Path) -> None:
    service = FakeService(gated=True)
    async with running(tmp_path, async_map(service.lookup, schema=OUTPUT)) as (rt, _, _):
        await rt.push("events", chunk(*range(20)))
        await service.changes.until(lambda: len(service.calls) == 16)
        await settle()
        assert service.calls == list(range(16))
        service.open(*range(20))
        await rt.checkpoint()


async def test_by_default_a_call_is_retried_three_times(tmp_path: Path) -> None:
    service = FakeService()
    service.failures[1] = 9
    error = await _fails_with(tmp_path, async_map(service.lookup, schema=OUTPUT, retry_delay=0))
    assert isinstance(error, AsyncCallFailedError)
    assert error.attempts == 4
    assert service.calls.count(1) == 4


def test_async_map_is_partition_local_and_makes_a_fresh_actor_each_call() -> None:
    operator = async_map(_row, schema=OUTPUT, key="n")
    assert operator.kind == "async_map"
    assert operator.placement is Placement.PARTITION_LOCAL
    assert operator.key is None  # the key names rows in errors; it does not dispatch
    assert operator.side_outputs == ()
    assert operator() is not operator(1)


# Properties: the same rows as a plain-Python reference, with and without crashes.


def _reference(batches: list[list[int]]) -> list[tuple[int, str]]:
    return [(n, f"user-{n}") for rows in batches for n in rows]


_batches = st.lists(st.lists(st.integers(0, 40), min_size=0, max_size=6), min_size=1, max_size=5)
_settings = settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@_settings
@given(
    batches=_batches,
    turns=st.lists(st.integers(0, 6), min_size=41, max_size=41),
    concurrency=st.integers(1, 5),
    ordered=st.booleans(),
    checkpoints=st.lists(st.booleans(), min_size=5, max_size=5),
)
async def test_async_map_equals_a_plain_python_reference(
    tmp_path_factory: pytest.TempPathFactory,
    batches: list[list[int]],
    turns: list[int],
    concurrency: int,
    ordered: bool,
    checkpoints: list[bool],
) -> None:
    service = FakeService()
    service.turns = dict(enumerate(turns))  # latency in scheduler turns: out-of-order answers
    operator = async_map(service.lookup, schema=OUTPUT, concurrency=concurrency, ordered=ordered)
    async with running(tmp_path_factory.mktemp("s"), operator) as (rt, out, _):
        for rows, checkpoint in zip(batches, checkpoints, strict=False):
            await rt.push("events", chunk(*rows))
            if checkpoint:
                await rt.checkpoint()
        await rt.checkpoint()
    assert service.max_in_flight <= concurrency
    # Each epoch's rows, as the reference puts them: exactly (ordered) or as a multiset.
    epochs: list[list[tuple[int, str]]] = [[]]
    for message in out.seen[1:]:
        if isinstance(message, Barrier):
            epochs.append([])
        elif isinstance(message, Chunk):
            epochs[-1].extend(zip(*message.batch.to_pydict().values(), strict=True))
    expected: list[list[tuple[int, str]]] = [[]]
    for rows, checkpoint in zip(batches, [*checkpoints[: len(batches) - 1], True], strict=True):
        expected[-1].extend(_reference([rows]))
        if checkpoint:
            expected.append([])
    epochs = [e for e in epochs if e]
    expected = [e for e in expected if e]
    if not ordered:
        epochs, expected = [sorted(e) for e in epochs], [sorted(e) for e in expected]
    assert epochs == expected


async def _enrich(row: dict[str, Any]) -> dict[str, Any]:
    """A service answering after ``n % 5`` scheduler turns: out of order, no sleep."""
    for _ in range(row["n"] % 5):
        await anyio.lowlevel.checkpoint()
    return {"n": row["n"], "name": f"user-{row['n']}"}


#: Declared at module level: a child process imports it by its "module:name".
ENRICH = async_map(_enrich, schema=OUTPUT, concurrency=4)


@_settings
@given(
    batches=st.lists(st.lists(st.integers(0, 40), min_size=1, max_size=6), min_size=2, max_size=6),
    seed=st.integers(0, 1000),
    ordered=st.booleans(),
)
async def test_async_map_commits_the_same_rows_with_crashes_while_calls_are_in_flight(
    tmp_path_factory: pytest.TempPathFactory, batches: list[list[int]], seed: int, ordered: bool
) -> None:
    operator = async_map(_enrich, schema=OUTPUT, concurrency=3, ordered=ordered)
    report = await check_stream_actor(
        operator,
        [chunk(*rows) for rows in batches],
        output=OUTPUT,
        state_dir=tmp_path_factory.mktemp("conformance"),
        crashes=2,
        seed=seed,
    )
    rules = {r.rule: r for r in report.results}
    assert rules["same_rows_with_crashes"].passed, rules["same_rows_with_crashes"].detail
    if ordered:
        assert rules["same_rows_in_order"].passed


@pytest.mark.subprocess
async def test_async_map_commits_the_same_rows_with_sigkills(tmp_path: Path) -> None:
    chunks = [chunk(*range(i * 5, i * 5 + 5)) for i in range(6)]
    report = await check_stream_actor_kills(
        f"{__name__}:ENRICH", chunks, output=OUTPUT, state_dir=tmp_path, kills=2, seed=3
    )
    report.raise_for_failures()
