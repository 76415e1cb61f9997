"""The sink task: one test per rule of LaminarDB's sink_task.rs, on asyncio and trio.

A fake connector records every call it gets (on entry, so a refused command shows up as a
call that never came) and fails or hangs on cue, so each test asserts the exact sequence of
connector calls, the task's counters and the typed fields of its errors.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import selectors
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from types import MappingProxyType
from typing import Any

import anyio
import anyio.lowlevel
import pyarrow as pa
import pytest
import structlog.testing
from _timeouts import scaled
from anyio.abc import TaskStatus
from anyio.from_thread import start_blocking_portal
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from trio.testing import MockClock

from barrierflow import (
    ActorGoneError,
    EpochPoisonedError,
    InvalidArgumentError,
    SchemaMismatchError,
    SinkConnectorError,
    SinkEpochError,
)
from barrierflow.actors import (
    CommitMetadata,
    PendingCommit,
    SinkConnector,
    SinkTask,
    SinkTaskHandle,
    start_sink_task,
)
from barrierflow.actors.sinks import sink_task
from barrierflow.actors.sinks.protocol import PositionRecorder
from barrierflow.channels.epoch import MAX_EPOCH

pytestmark = pytest.mark.anyio

SCHEMA = pa.schema([("x", pa.int32())])
OTHER_SCHEMA = pa.schema([("x", pa.int64())])
NEVER = 60.0  # a flush interval that never ticks during a test


def batch(*values: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array(values, pa.int32())], schema=SCHEMA)


class ConnectorFailedError(Exception):
    """What the fake raises when told to fail."""


class FakeConnector:
    """A connector that records its calls and fails or hangs on cue.

    ``fail[method] = n`` fails the next ``n`` calls of ``method``; ``hang[method] = event``
    makes ``method`` wait for ``event`` (never set: forever); ``entered[method]`` is set on
    each call of ``method``. A cancelled call is recorded as ``("<method> cancelled",)``.
    """

    def __init__(self, *, exactly_once: bool = True) -> None:
        self.exactly_once = exactly_once
        self.calls: list[tuple[Any, ...]] = []
        self.fail: dict[str, int] = {}
        self.raised: list[ConnectorFailedError] = []
        self.hang: dict[str, anyio.Event] = {}
        self.delay: dict[str, float] = {}
        self.entered: dict[str, anyio.Event] = {}

    @property
    def schema(self) -> pa.Schema:
        return SCHEMA

    def names(self) -> list[str]:
        return [call[0] for call in self.calls]

    def entered_event(self, method: str) -> anyio.Event:
        return self.entered.setdefault(method, anyio.Event())

    async def _enter(self, method: str, *args: Any) -> None:
        self.calls.append((method, *args))
        self.entered_event(method).set()
        try:
            if method in self.hang:
                await self.hang[method].wait()
            if self.delay.get(method):
                await anyio.sleep(self.delay[method])
        except anyio.get_cancelled_exc_class():
            self.calls.append((f"{method} cancelled",))
            raise
        if self.fail.get(method, 0) > 0:
            self.fail[method] -= 1
            error = ConnectorFailedError(f"{method} failed")
            self.raised.append(error)
            raise error

    async def open(self) -> None:
        await self._enter("open")

    async def recover(self, pending: Sequence[PendingCommit]) -> None:
        await self._enter("recover", tuple(p.epoch for p in pending))

    async def begin_epoch(self, epoch: int) -> None:
        await self._enter("begin_epoch", epoch)

    async def write_batch(self, batch: pa.RecordBatch) -> None:
        await self._enter("write_batch", batch.num_rows)

    async def flush(self) -> None:
        await self._enter("flush")

    async def pre_commit(self, epoch: int) -> CommitMetadata:
        await self._enter("pre_commit", epoch)
        return {"epoch": epoch}

    async def commit_epoch(self, epoch: int) -> None:
        await self._enter("commit_epoch", epoch)

    async def rollback_epoch(self, epoch: int) -> None:
        await self._enter("rollback_epoch", epoch)

    async def close(self) -> None:
        await self._enter("close")


def sink(connector: FakeConnector, **kwargs: Any) -> SinkTask:
    kwargs.setdefault("flush_interval", NEVER)
    return SinkTask(connector, name="orders", **kwargs)


def warnings_of(logs: list[MutableMapping[str, Any]], event: str) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == event and e["log_level"] == "warning"]


def test_fake_connector_is_a_sink_connector() -> None:
    assert isinstance(FakeConnector(), SinkConnector)


# --- a failed write poisons the epoch ------------------------------------------------------


async def test_failed_write_increments_write_errors_and_poisons_epoch() -> None:
    fake = FakeConnector()
    fake.fail["write_batch"] = 1
    with structlog.testing.capture_logs() as logs:
        async with sink(fake) as handle:
            await handle.begin_epoch(1)
            await handle.write_batch(batch(1, 2))  # fire-and-forget: the failure is not raised
            await handle.write_batch(batch(3))
            await handle.flush()  # answered after both writes were served
            stats = handle.stats()
    assert stats.write_errors == 1
    assert stats.epoch_poisoned
    assert (stats.batches_written, stats.rows_written) == (1, 1)
    assert fake.calls[1:4] == [("begin_epoch", 1), ("write_batch", 2), ("write_batch", 1)]
    [warning] = warnings_of(logs, "sink write failed; epoch poisoned")
    assert (warning["sink"], warning["epoch"], warning["write_errors"]) == ("orders", 1, 1)


async def test_poisoned_epoch_refuses_pre_commit_and_commit() -> None:
    fake = FakeConnector()
    async with sink(fake) as handle:
        await handle.begin_epoch(1)
        await handle.write_batch(batch(1))
        await handle.pre_commit(1)  # epoch 1 waits for its commit
        await handle.begin_epoch(2)
        fake.fail["write_batch"] = 1
        await handle.write_batch(batch(2))
        with pytest.raises(EpochPoisonedError) as pre:
            await handle.pre_commit(2)
        with pytest.raises(EpochPoisonedError) as commit:
            await handle.commit_epoch(1)
        stats = handle.stats()
    assert (pre.value.sink, pre.value.operation, pre.value.epoch) == ("orders", "pre_commit", 2)
    assert pre.value.write_errors == 1
    assert (commit.value.sink, commit.value.operation, commit.value.epoch) == (
        "orders",
        "commit_epoch",
        1,
    )
    # The connector saw neither command; the task's epoch state did not move either.
    assert fake.calls[1:] == [
        ("begin_epoch", 1),
        ("write_batch", 1),
        ("pre_commit", 1),
        ("begin_epoch", 2),
        ("write_batch", 1),
        ("flush",),
        ("close",),
    ]
    assert (stats.open_epoch, stats.pre_committed, stats.committed_epoch) == (2, (1,), 0)


async def test_successful_begin_epoch_clears_poison() -> None:
    fake = FakeConnector()
    fake.fail["write_batch"] = 1
    async with sink(fake) as handle:
        await handle.begin_epoch(1)
        await handle.write_batch(batch(1))
        await handle.rollback_epoch(1)
        await handle.flush()  # the write and rollback were served
        assert handle.stats().epoch_poisoned  # a rollback alone does not clear it
        await handle.begin_epoch(2)
        assert not handle.stats().epoch_poisoned
        await handle.write_batch(batch(2))
        assert await handle.pre_commit(2) == {"epoch": 2}
        await handle.commit_epoch(2)
        assert handle.stats().committed_epoch == 2
    assert fake.calls == [
        ("open",),
        ("begin_epoch", 1),
        ("write_batch", 1),
        ("rollback_epoch", 1),
        ("flush",),
        ("begin_epoch", 2),
        ("write_batch", 1),
        ("pre_commit", 2),
        ("commit_epoch", 2),
        ("flush",),
        ("close",),
    ]


async def test_failed_begin_epoch_keeps_poison() -> None:
    fake = FakeConnector()
    fake.fail["write_batch"] = 1
    async with sink(fake) as handle:
        await handle.begin_epoch(1)
        await handle.write_batch(batch(1))
        await handle.rollback_epoch(1)
        fake.fail["begin_epoch"] = 1
        with pytest.raises(SinkConnectorError) as info:
            await handle.begin_epoch(2)
        stats = handle.stats()
        assert stats.epoch_poisoned
        assert stats.open_epoch is None  # the failed begin opened nothing
        with pytest.raises(EpochPoisonedError):
            await handle.pre_commit(2)
        await handle.begin_epoch(3)  # a later successful begin clears it
        assert not handle.stats().epoch_poisoned
    assert (info.value.operation, info.value.epoch) == ("begin_epoch", 2)
    assert "pre_commit" not in fake.names()


async def test_schema_mismatch_raises_naming_both_schemas_and_poisons_epoch() -> None:
    fake = FakeConnector()
    async with sink(fake) as handle:
        await handle.begin_epoch(1)
        wrong = pa.record_batch([pa.array([1], pa.int64())], schema=OTHER_SCHEMA)
        with pytest.raises(SchemaMismatchError) as info:
            await handle.write_batch(wrong)
        await handle.flush()
        stats = handle.stats()
        with pytest.raises(EpochPoisonedError):
            await handle.pre_commit(1)
    assert info.value.argument == "batch for sink 'orders'"
    assert info.value.expected_schema == SCHEMA
    assert info.value.actual_schema == OTHER_SCHEMA
    assert info.value.got == OTHER_SCHEMA
    assert info.value.null_field is None
    assert (stats.write_errors, stats.epoch_poisoned, stats.batches_written) == (1, True, 0)
    assert "write_batch" not in fake.names()  # the connector never saw the wrong batch


async def test_write_outside_an_epoch_poisons_exactly_once_sink() -> None:
    fake = FakeConnector(exactly_once=True)
    async with sink(fake) as handle:
        await handle.write_batch(batch(1))  # nothing begun
        await handle.flush()
        assert (handle.stats().write_errors, handle.stats().epoch_poisoned) == (1, True)
        await handle.begin_epoch(1)
        await handle.pre_commit(1)
        await handle.write_batch(batch(2))  # epoch 1 pre-committed, 2 not begun
        await handle.flush()
        assert (handle.stats().write_errors, handle.stats().epoch_poisoned) == (2, True)
    assert "write_batch" not in fake.names()


async def test_write_outside_an_epoch_is_accepted_by_at_least_once_sink() -> None:
    fake = FakeConnector(exactly_once=False)
    async with sink(fake) as handle:
        assert not handle.exactly_once
        await handle.write_batch(batch(1, 2))
        await handle.flush()
        stats = handle.stats()
    assert (stats.write_errors, stats.epoch_poisoned, stats.rows_written) == (0, False, 2)
    assert fake.calls == [("open",), ("write_batch", 2), ("flush",), ("flush",), ("close",)]


# --- epoch commands are ordered -------------------------------------------------------------


async def test_begin_epoch_must_increase() -> None:
    fake = FakeConnector()
    async with sink(fake) as handle:
        await handle.begin_epoch(5)
        await handle.pre_commit(5)
        for epoch in (5, 4):
            with pytest.raises(SinkEpochError) as info:
                await handle.begin_epoch(epoch)
            assert (info.value.sink, info.value.operation, info.value.epoch) == (
                "orders",
                "begin_epoch",
                epoch,
            )
        await handle.begin_epoch(7)  # gaps are fine
    assert [c for c in fake.calls if c[0] == "begin_epoch"] == [
        ("begin_epoch", 5),
        ("begin_epoch", 7),
    ]


async def test_begin_epoch_while_previous_open_is_refused() -> None:
    fake = FakeConnector()
    async with sink(fake) as handle:
        await handle.begin_epoch(1)
        with pytest.raises(SinkEpochError) as info:
            await handle.begin_epoch(2)
        assert (info.value.operation, info.value.epoch) == ("begin_epoch", 2)
        assert handle.stats().open_epoch == 1
        await handle.rollback_epoch(1)
        await handle.begin_epoch(2)  # rolled back: no longer blocks
    assert [c for c in fake.calls if c[0] == "begin_epoch"] == [
        ("begin_epoch", 1),
        ("begin_epoch", 2),
    ]


async def test_pre_commit_of_an_epoch_that_is_not_open_is_refused() -> None:
    fake = FakeConnector()
    async with sink(fake) as handle:
        with pytest.raises(SinkEpochError) as nothing_open:
            await handle.pre_commit(1)
        await handle.begin_epoch(3)
        with pytest.raises(SinkEpochError) as other:
            await handle.pre_commit(2)
        await handle.pre_commit(3)
        with pytest.raises(SinkEpochError) as twice:
            await handle.pre_commit(3)
    for info, epoch in [(nothing_open, 1), (other, 2), (twice, 3)]:
        assert (info.value.sink, info.value.operation, info.value.epoch) == (
            "orders",
            "pre_commit",
            epoch,
        )
    assert [c for c in fake.calls if c[0] == "pre_commit"] == [("pre_commit", 3)]


async def test_commit_of_an_epoch_never_pre_committed_is_refused() -> None:
    fake = FakeConnector()
    async with sink(fake) as handle:
        with pytest.raises(SinkEpochError) as nothing:
            await handle.commit_epoch(1)
        await handle.begin_epoch(1)
        with pytest.raises(SinkEpochError) as only_open:
            await handle.commit_epoch(1)
        await handle.pre_commit(1)
        await handle.commit_epoch(1)
        with pytest.raises(SinkEpochError) as again:
            await handle.commit_epoch(1)
    for info in (nothing, only_open, again):
        assert (info.value.sink, info.value.operation, info.value.epoch) == (
            "orders",
            "commit_epoch",
            1,
        )
    assert [c for c in fake.calls if c[0] == "commit_epoch"] == [("commit_epoch", 1)]


async def test_commit_out_of_order_is_refused() -> None:
    fake = FakeConnector()
    async with sink(fake) as handle:
        for epoch in (1, 2):
            await handle.begin_epoch(epoch)
            await handle.pre_commit(epoch)
        with pytest.raises(SinkEpochError) as info:
            await handle.commit_epoch(2)  # 1 is older
        assert handle.stats().pre_committed == (1, 2)
        await handle.commit_epoch(1)
        await handle.commit_epoch(2)
        assert handle.stats().committed_epoch == 2
    assert (info.value.sink, info.value.operation, info.value.epoch) == (
        "orders",
        "commit_epoch",
        2,
    )
    assert "1" in info.value.expected  # names the epoch to commit first
    assert [c for c in fake.calls if c[0] == "commit_epoch"] == [
        ("commit_epoch", 1),
        ("commit_epoch", 2),
    ]


async def test_commit_may_come_after_the_next_epoch_began() -> None:
    fake = FakeConnector()
    async with sink(fake) as handle:
        await handle.begin_epoch(1)
        await handle.pre_commit(1)
        await handle.begin_epoch(2)
        await handle.write_batch(batch(1))
        await handle.commit_epoch(1)
        stats = handle.stats()
    assert (stats.open_epoch, stats.pre_committed, stats.committed_epoch) == (2, (), 1)


# --- the periodic flush -----------------------------------------------------------------------


# anyio has a virtual clock only on trio: trio's MockClock jumps time forward whenever every
# task is blocked, so the count is exact instead of depending on the machine's load.
@pytest.mark.parametrize(
    "anyio_backend",
    [pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}), id="trio-mockclock")],
)
async def test_periodic_flush_runs_every_interval() -> None:
    fake = FakeConnector()
    async with sink(fake, flush_interval=0.05) as handle:
        await anyio.sleep(0.325)  # ticks due at 0.05, 0.10, ..., 0.30
        flushes = handle.stats().flushes
    assert flushes == 6
    # Each tick flushed once (a tick may still come in before the release is seen), plus the
    # final flush, which the periodic counter does not count.
    assert fake.names().count("flush") == handle.stats().flushes + 1


async def test_first_immediate_tick_is_skipped() -> None:
    fake = FakeConnector()
    async with sink(fake, flush_interval=0.2) as handle:
        started = anyio.current_time()
        await anyio.sleep(0.05)
        assert handle.stats().flushes == 0
        assert "flush" not in fake.names()
        with anyio.fail_after(scaled(2)):
            await fake.entered_event("flush").wait()
        assert anyio.current_time() - started >= 0.19


async def test_missed_ticks_are_skipped_not_bursted() -> None:
    fake = FakeConnector()
    fake.delay["write_batch"] = 0.2  # one write spans four ticks of 0.05 s
    async with sink(fake, flush_interval=0.05) as handle:
        with anyio.fail_after(scaled(2)):
            await handle.begin_epoch(1)
            await handle.write_batch(batch(1))
            await fake.entered_event("write_batch").wait()
            await handle.pre_commit(1)  # queued behind the slow write
            flushes_after = handle.stats().flushes
    names = fake.names()
    after_write = names[names.index("write_batch") + 1 : names.index("pre_commit")]
    # The late tick runs once, before the queued command; the three other missed ones never.
    assert after_write == ["flush"]
    assert flushes_after == names[: names.index("pre_commit")].count("flush")


async def test_busy_inbox_does_not_starve_the_periodic_flush() -> None:
    fake = FakeConnector(exactly_once=False)
    fake.delay["write_batch"] = 0.02
    async with sink(fake, flush_interval=0.05) as handle:
        with anyio.fail_after(scaled(2)):
            for _ in range(15):  # queued at once: the inbox is never empty for 0.3 s
                await handle.write_batch(batch(1))
            await handle.flush()
    names = fake.names()
    between_writes = names[
        names.index("write_batch") : len(names) - names[::-1].index("write_batch")
    ]
    assert between_writes.count("flush") >= 2  # due ticks ran between queued writes


async def test_stuck_flush_is_reported_and_task_keeps_serving() -> None:
    fake = FakeConnector()
    fake.hang["flush"] = anyio.Event()  # never set
    with structlog.testing.capture_logs() as logs:
        async with sink(fake, flush_interval=0.05, shutdown_timeout=0.05) as handle:
            with anyio.fail_after(scaled(2)):
                await fake.entered_event("flush").wait()
                await anyio.sleep(0.08)  # more than the interval: the flush overran it
                await handle.begin_epoch(1)  # still served
                assert await handle.pre_commit(1) == {"epoch": 1}
                stats = handle.stats()
    assert stats.stuck_flushes >= 1
    assert stats.flushes == 0
    assert ("flush cancelled",) in fake.calls  # the overrunning flush was cancelled
    stuck = warnings_of(logs, "periodic sink flush timed out; the sink may be stuck")
    assert stuck
    assert stuck[0]["sink"] == "orders"
    assert fake.names()[-1] == "close"


async def test_failed_periodic_flush_is_counted_and_logged() -> None:
    fake = FakeConnector()
    fake.fail["flush"] = 1
    with structlog.testing.capture_logs() as logs:
        async with sink(fake, flush_interval=0.05) as handle:
            with anyio.fail_after(scaled(2)):
                await fake.entered_event("flush").wait()
                await handle.begin_epoch(1)  # served after the failed tick
            stats = handle.stats()
    assert (stats.flush_errors, stats.flushes) == (1, 0)
    assert warnings_of(logs, "periodic sink flush failed")[0]["sink"] == "orders"


# --- rollback ----------------------------------------------------------------------------------


async def test_rollback_is_fire_and_forget_and_its_failure_is_logged() -> None:
    fake = FakeConnector()
    fake.hang["rollback_epoch"] = release = anyio.Event()
    fake.fail["rollback_epoch"] = 1
    with structlog.testing.capture_logs() as logs:
        async with sink(fake) as handle:
            await handle.begin_epoch(1)
            with anyio.fail_after(scaled(1)):
                await handle.rollback_epoch(1)  # returns although the rollback hangs
                await fake.entered_event("rollback_epoch").wait()
            assert handle.stats().rollback_errors == 0
            release.set()
            await handle.begin_epoch(2)  # served after the failed rollback; nothing raised
            stats = handle.stats()
    assert (stats.rollbacks, stats.rollback_errors, stats.open_epoch) == (1, 1, 2)
    [warning] = warnings_of(logs, "sink rollback failed")
    assert (warning["sink"], warning["epoch"]) == ("orders", 1)
    assert fake.calls[1:4] == [("begin_epoch", 1), ("rollback_epoch", 1), ("begin_epoch", 2)]


async def test_rollback_of_a_pre_committed_epoch_drops_it() -> None:
    fake = FakeConnector()
    async with sink(fake) as handle:
        await handle.begin_epoch(1)
        await handle.pre_commit(1)
        await handle.rollback_epoch(1)
        with pytest.raises(SinkEpochError):
            await handle.commit_epoch(1)
        stats = handle.stats()
    assert (stats.pre_committed, stats.rollbacks, stats.committed_epoch) == ((), 1, 0)
    assert "commit_epoch" not in fake.names()


# --- shutdown ----------------------------------------------------------------------------------


async def test_releasing_last_handle_flushes_then_closes() -> None:
    fake = FakeConnector()
    with anyio.fail_after(scaled(2)):
        async with anyio.create_task_group() as tg:
            handle = await start_sink_task(tg, fake, name="orders", flush_interval=NEVER)
            other = handle.clone()
            handle.release()
            handle.release()  # idempotent: does not count twice
            await other.begin_epoch(1)  # still served: one handle remains
            assert "close" not in fake.names()
            assert not other.stats().finished
            other.release()
        assert other.stats().finished
    assert fake.calls == [("open",), ("begin_epoch", 1), ("flush",), ("close",)]


async def test_explicit_close_waits_and_times_out() -> None:
    fake = FakeConnector()
    async with anyio.create_task_group() as tg:
        handle = await start_sink_task(tg, fake, name="orders", flush_interval=NEVER)
        with anyio.fail_after(scaled(2)):
            assert await handle.close()
        assert handle.stats().finished
        assert fake.calls == [("open",), ("flush",), ("close",)]

    # The final flush hangs and is allowed 5 s; close gives up after 0.05 s.
    stuck = FakeConnector()
    stuck.hang["flush"] = anyio.Event()
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            handle = await start_sink_task(
                tg, stuck, name="orders", flush_interval=NEVER, shutdown_timeout=5.0
            )
            started = anyio.current_time()
            assert not await handle.close(timeout=0.05)
            assert anyio.current_time() - started < scaled(1.0)
            assert not handle.stats().finished
            tg.cancel_scope.cancel()  # the runtime stops: the connector is still closed
    assert stuck.calls == [("open",), ("flush",), ("flush cancelled",), ("close",)]
    assert warnings_of(logs, "sink did not close in time")[0]["sink"] == "orders"

    # shutdown_timeout bounds the final flush too: close then ends in time.
    bounded = FakeConnector()
    bounded.hang["flush"] = anyio.Event()
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            handle = await start_sink_task(
                tg, bounded, name="orders", flush_interval=NEVER, shutdown_timeout=0.05
            )
            with anyio.fail_after(scaled(2)):
                assert await handle.close(timeout=scaled(1.0))
    assert bounded.calls == [("open",), ("flush",), ("flush cancelled",), ("close",)]
    assert warnings_of(logs, "sink flush timed out at shutdown")[0]["sink"] == "orders"


async def test_concurrent_closes_close_the_connector_once() -> None:
    fake = FakeConnector()
    fake.hang["flush"] = release = anyio.Event()
    results: list[bool] = []

    async def close(handle: SinkTaskHandle) -> None:
        results.append(await handle.close(timeout=scaled(2.0)))

    with anyio.fail_after(scaled(3)):
        async with anyio.create_task_group() as tg:
            handle = await start_sink_task(tg, fake, name="orders", flush_interval=NEVER)
            other = handle.clone()
            async with anyio.create_task_group() as closers:
                closers.start_soon(close, handle)
                await fake.entered_event("flush").wait()
                closers.start_soon(close, other)
                await anyio.wait_all_tasks_blocked()
                release.set()
    assert results == [True, True]
    assert fake.calls == [("open",), ("flush",), ("close",)]


async def test_shutdown_flush_error_is_logged() -> None:
    fake = FakeConnector()
    fake.fail["flush"] = 1
    with structlog.testing.capture_logs() as logs:
        async with sink(fake) as handle:
            pass
    assert handle.stats().finished
    assert fake.calls == [("open",), ("flush",), ("close",)]
    assert [e["sink"] for e in warnings_of(logs, "sink flush failed at shutdown")] == ["orders"]


async def test_connector_close_error_surfaces_as_sink_connector_error() -> None:
    fake = FakeConnector()
    fake.fail["close"] = 1
    with structlog.testing.capture_logs() as logs, pytest.raises(SinkConnectorError) as caught:
        async with sink(fake) as handle:
            pass
    assert (caught.value.sink, caught.value.operation, caught.value.epoch) == (
        "orders",
        "close",
        None,
    )
    assert caught.value.__cause__ is fake.raised[0]
    assert caught.value.cause is fake.raised[0]
    assert handle.stats().finished
    assert fake.calls == [("open",), ("flush",), ("close",)]
    assert [e["sink"] for e in warnings_of(logs, "sink close failed")] == ["orders"]


async def test_close_error_of_a_cancelled_task_is_logged_not_raised() -> None:
    fake = FakeConnector()
    fake.fail["close"] = 1
    failed = pytest.RaisesGroup(ConnectorFailedError, allow_unwrapped=True, flatten_subgroups=True)
    with structlog.testing.capture_logs() as logs, failed:
        async with sink(fake):
            raise ConnectorFailedError("the runtime failed")
    assert fake.calls == [("open",), ("close",)]
    assert len(warnings_of(logs, "sink close failed")) == 1


async def test_cancelled_task_closes_connector_without_flushing() -> None:
    fake = FakeConnector()
    with pytest.RaisesGroup(ConnectorFailedError, allow_unwrapped=True, flatten_subgroups=True):
        async with sink(fake) as handle:
            await handle.begin_epoch(1)
            raise ConnectorFailedError("the runtime failed")
    assert fake.calls == [("open",), ("begin_epoch", 1), ("close",)]
    assert handle.stats().finished


async def test_an_outer_cancellation_passes_through_sink_task() -> None:
    """``SinkTask`` never swallows a cancellation of its surroundings: the code after the
    block does not run, and the connector is closed without a flush."""
    fake = FakeConnector()
    after: list[str] = []
    with anyio.CancelScope() as outer:
        async with sink(fake):
            outer.cancel()
            await anyio.lowlevel.checkpoint()  # cancelled here
        after.append("after the block")  # pragma: no cover
    assert outer.cancelled_caught
    assert after == []
    assert fake.calls == [("open",), ("close",)]


async def test_handle_after_close_raises_actor_gone_naming_sink() -> None:
    fake = FakeConnector()
    async with anyio.create_task_group() as tg:
        handle = await start_sink_task(tg, fake, name="orders", flush_interval=NEVER)
        other = handle.clone()
        assert await handle.close()
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: other.write_batch(batch(1)),
            lambda: other.begin_epoch(1),
            lambda: other.pre_commit(1),
            lambda: other.commit_epoch(1),
            lambda: other.rollback_epoch(1),
            lambda: other.flush(),
            lambda: other.recover([]),
            lambda: handle.begin_epoch(1),  # the closed handle itself
        ]
        for call in calls:
            with pytest.raises(ActorGoneError) as info:
                await call()
            assert info.value.actor == "orders"
        assert await handle.close()  # closing again is a no-op
        assert await other.close()
    assert fake.names().count("close") == 1


async def test_released_handle_raises_actor_gone_naming_sink() -> None:
    async with sink(FakeConnector()) as handle:
        other = handle.clone()
        other.release()
        with pytest.raises(ActorGoneError) as info:
            await other.begin_epoch(1)
        assert info.value.actor == "orders"
        with pytest.raises(ActorGoneError):
            other.clone()
        await handle.begin_epoch(1)  # the task itself is fine


async def test_reply_that_cannot_come_is_typed_error() -> None:
    fake = FakeConnector()
    fake.hang["flush"] = anyio.Event()
    runtime = anyio.CancelScope()
    errors: dict[str, BaseException] = {}

    async def run_sink(*, task_status: TaskStatus[SinkTaskHandle]) -> None:
        with runtime:
            async with anyio.create_task_group() as inner:
                task_status.started(await start_sink_task(inner, fake, name="orders"))

    async def ask(label: str, call: Callable[[], Awaitable[object]]) -> None:
        try:
            await call()
        except ActorGoneError as exc:
            errors[label] = exc

    with anyio.fail_after(scaled(2)):
        async with anyio.create_task_group() as tg:
            handle: SinkTaskHandle = await tg.start(run_sink)
            async with anyio.create_task_group() as asks:
                asks.start_soon(ask, "being served", handle.flush)
                await fake.entered_event("flush").wait()
                asks.start_soon(ask, "queued", lambda: handle.begin_epoch(1))
                await anyio.wait_all_tasks_blocked()
                runtime.cancel()  # the sink task dies with both unanswered
            handle.release()
    assert sorted(errors) == ["being served", "queued"]
    assert all(isinstance(e, ActorGoneError) and e.actor == "orders" for e in errors.values())
    assert fake.calls == [("open",), ("flush",), ("flush cancelled",), ("close",)]
    assert handle.stats().finished


# --- handles and the inbox ---------------------------------------------------------------


async def test_handles_are_cheap_clones_of_one_task() -> None:
    fake = FakeConnector(exactly_once=False)
    async with sink(fake) as handle:
        other = handle.clone()
        assert (other.name, other.schema, other.exactly_once) == ("orders", SCHEMA, False)

        async def write_from_another_task() -> None:
            await other.write_batch(batch(2, 3))
            await other.flush()

        await handle.write_batch(batch(1))
        async with anyio.create_task_group() as tg:
            tg.start_soon(write_from_another_task)
        assert handle.stats() == other.stats()  # one task behind both
        other.release()
        stats = handle.stats()
    assert [c for c in fake.calls if c[0] == "write_batch"] == [
        ("write_batch", 1),
        ("write_batch", 2),
    ]
    assert (stats.batches_written, stats.rows_written) == (2, 3)


@pytest.mark.parametrize("capacity", [None, 1, 3])
async def test_inbox_is_bounded_default_128(capacity: int | None) -> None:
    fake = FakeConnector(exactly_once=False)
    fake.hang["write_batch"] = release = anyio.Event()
    options: dict[str, Any] = {} if capacity is None else {"capacity": capacity}
    room = 128 if capacity is None else capacity
    with anyio.fail_after(scaled(5)):
        async with sink(fake, **options) as handle:
            await handle.write_batch(batch(1))
            await fake.entered_event("write_batch").wait()  # the task is busy with it
            for _ in range(room):
                with anyio.fail_after(scaled(1)):
                    await handle.write_batch(batch(1))  # fills the inbox without waiting
            with anyio.move_on_after(scaled(0.05)) as waited:
                await handle.write_batch(batch(1))  # one more: waits for room
            assert waited.cancelled_caught
            done = anyio.Event()

            async def write_when_room() -> None:
                await handle.write_batch(batch(1))
                done.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(write_when_room)
                await anyio.wait_all_tasks_blocked()
                assert not done.is_set()
                release.set()  # the task drains the inbox; the writer gets in
            await handle.flush()
            stats = handle.stats()
    # The cancelled write was not queued (sends are atomic): 1 + room + 1 batches arrived.
    assert stats.batches_written == room + 2


async def test_connector_failure_of_replying_commands_is_sink_connector_error() -> None:
    fake = FakeConnector()
    cases: list[tuple[str, int | None, Callable[[SinkTaskHandle], Awaitable[object]]]] = [
        ("recover", None, lambda h: h.recover([PendingCommit(1, {})])),
        ("begin_epoch", 2, lambda h: h.begin_epoch(2)),
        ("pre_commit", 2, lambda h: h.pre_commit(2)),
        ("commit_epoch", 2, lambda h: h.commit_epoch(2)),
        ("flush", None, lambda h: h.flush()),
    ]
    async with sink(fake) as handle:
        for operation, epoch, call in cases:
            fake.fail[operation] = 1
            with pytest.raises(SinkConnectorError) as info:
                await call(handle)
            assert (info.value.sink, info.value.operation, info.value.epoch) == (
                "orders",
                operation,
                epoch,
            )
            assert info.value.__cause__ is fake.raised[-1]
            assert info.value.cause is fake.raised[-1]
            await call(handle)  # the state did not move: the same command succeeds now
        stats = handle.stats()
    assert (stats.open_epoch, stats.pre_committed, stats.committed_epoch) == (None, (), 2)
    assert [c for c in fake.calls if c[0] != "flush"] == [
        ("open",),
        ("recover", (1,)),
        ("recover", (1,)),
        ("begin_epoch", 2),
        ("begin_epoch", 2),
        ("pre_commit", 2),
        ("pre_commit", 2),
        ("commit_epoch", 2),
        ("commit_epoch", 2),
        ("close",),
    ]


# --- open, recover, arguments ------------------------------------------------------------


async def test_open_failure_raises_from_start() -> None:
    fake = FakeConnector()
    fake.fail["open"] = 1
    with pytest.raises(SinkConnectorError) as info:
        async with sink(fake):
            pytest.fail("the body must not run")  # pragma: no cover
    assert (info.value.sink, info.value.operation, info.value.epoch) == ("orders", "open", None)
    assert info.value.__cause__ is fake.raised[0]
    assert info.value.cause is fake.raised[0]

    fake.fail["open"] = 1
    async with anyio.create_task_group() as tg:
        with pytest.raises(SinkConnectorError) as info:
            await start_sink_task(tg, fake, name="orders")
    assert info.value.operation == "open"


async def test_the_task_is_named_for_its_sink() -> None:
    async with sink(FakeConnector()):
        names = [task.name for task in anyio.get_running_tasks()]
    assert "sink task orders" in names


async def test_recover_commits_pending_before_the_first_epoch() -> None:
    fake = FakeConnector()
    async with sink(fake) as handle:
        await handle.recover([PendingCommit(2, {"files": []}), PendingCommit(3, {})])
        assert handle.stats().committed_epoch == 3
        await handle.begin_epoch(4)
    assert fake.calls[:3] == [("open",), ("recover", (2, 3)), ("begin_epoch", 4)]


async def test_recover_after_begin_is_refused() -> None:
    fake = FakeConnector()
    async with sink(fake) as handle:
        await handle.begin_epoch(1)
        await handle.rollback_epoch(1)
        with pytest.raises(SinkEpochError) as info:
            await handle.recover([PendingCommit(1, {})])
    assert (info.value.sink, info.value.operation) == ("orders", "recover")
    assert "recover" not in fake.names()


SECONDS = "a finite number of seconds > 0"


class NoSchema(FakeConnector):
    @property
    def schema(self) -> pa.Schema:
        return "x: int32"  # type: ignore[return-value, unused-ignore]


@pytest.mark.parametrize(
    ("connector", "options", "error"),
    [
        (object, {}, ("connector", "a SinkConnector", "object")),
        (NoSchema, {}, ("connector.schema", "a pyarrow.Schema", "str")),
        (FakeConnector, {"name": ""}, ("name", "a non-empty str", "")),
        (FakeConnector, {"name": 3}, ("name", "a non-empty str", 3)),
        (FakeConnector, {"capacity": 0}, ("capacity", "an int >= 1", 0)),
        (FakeConnector, {"capacity": 1.5}, ("capacity", "an int >= 1", 1.5)),
        (FakeConnector, {"capacity": True}, ("capacity", "an int >= 1", True)),
        (FakeConnector, {"flush_interval": 0}, ("flush_interval", SECONDS, 0)),
        (FakeConnector, {"flush_interval": -1.0}, ("flush_interval", SECONDS, -1.0)),
        (FakeConnector, {"flush_interval": math.inf}, ("flush_interval", SECONDS, math.inf)),
        (FakeConnector, {"flush_interval": True}, ("flush_interval", SECONDS, True)),
        (FakeConnector, {"shutdown_timeout": 0}, ("shutdown_timeout", SECONDS, 0)),
    ],
)
async def test_bad_start_arguments_are_refused_with_what_was_expected_and_got(
    connector: Callable[[], Any], options: dict[str, Any], error: tuple[str, str, object]
) -> None:
    """Both entry points refuse a bad argument before opening anything, with a typed error
    naming the argument, what it accepts and what it got."""
    fake = connector()
    async with anyio.create_task_group() as tg:
        with pytest.raises(InvalidArgumentError) as info:
            await start_sink_task(tg, fake, **{"name": "orders", **options})
    assert (info.value.argument, info.value.expected, info.value.got) == error
    with pytest.raises(InvalidArgumentError) as info:
        async with SinkTask(fake, **{"name": "orders", **options}):
            pass  # pragma: no cover
    assert (info.value.argument, info.value.expected, info.value.got) == error
    if isinstance(fake, FakeConnector):
        assert fake.calls == []  # refused before open


async def test_a_nan_interval_is_refused() -> None:
    async with anyio.create_task_group() as tg:
        with pytest.raises(InvalidArgumentError) as info:
            await start_sink_task(tg, FakeConnector(), name="orders", flush_interval=math.nan)
    assert (info.value.argument, info.value.expected) == ("flush_interval", SECONDS)
    assert math.isnan(info.value.got)


class PositionsRecorder(FakeConnector):
    """A connector that records the source positions of its epochs (``PositionRecorder``)."""

    async def record_positions(
        self, epoch: int, start: Mapping[str, int], end: Mapping[str, int]
    ) -> None:
        await self._enter("record_positions", epoch, start, end)


def test_positions_recorder_is_a_position_recorder() -> None:
    assert isinstance(PositionsRecorder(), PositionRecorder)
    assert not isinstance(FakeConnector(), PositionRecorder)


async def test_pre_commit_hands_positions_to_a_recorder_right_before_its_pre_commit() -> None:
    fake = PositionsRecorder()
    start = MappingProxyType({"src/0": 3})
    end = MappingProxyType({"src/0": 5, "src/1": 0})
    async with sink(fake) as handle:
        await handle.begin_epoch(1)
        assert await handle.pre_commit(1) == {"epoch": 1}  # no positions: none recorded
        await handle.begin_epoch(2)
        assert await handle.pre_commit(2, positions=(start, end)) == {"epoch": 2}
    assert fake.calls == [
        ("open",),
        ("begin_epoch", 1),
        ("pre_commit", 1),
        ("begin_epoch", 2),
        ("record_positions", 2, {"src/0": 3}, {"src/0": 5, "src/1": 0}),
        ("pre_commit", 2),
        ("flush",),
        ("close",),
    ]
    _, _, got_start, got_end = fake.calls[4]
    # The task hands on checked copies, not the caller's mappings.
    assert type(got_start) is dict
    assert type(got_end) is dict


async def test_pre_commit_positions_are_ignored_by_a_connector_that_does_not_record_them() -> None:
    fake = FakeConnector()
    async with sink(fake) as handle:
        await handle.begin_epoch(1)
        assert await handle.pre_commit(1, positions=({}, {"src/0": 1})) == {"epoch": 1}
    assert fake.calls[1:3] == [("begin_epoch", 1), ("pre_commit", 1)]


BATCH = "a pyarrow.RecordBatch"
EPOCH = f"an int epoch in 0..{MAX_EPOCH}"
PAIR = "None or a (start, end) pair"
MAPPING = "a mapping of position key to batch id"
ENTRIES = "str keys mapped to non-negative int batch ids"


async def test_bad_command_arguments_are_refused_with_what_was_expected_and_got() -> None:
    """Every command refuses a bad argument before it reaches the task, with a typed error
    naming the argument, what it accepts and what it got."""
    fake = FakeConnector()
    table = pa.table({"x": [1]})
    async with sink(fake) as handle:
        cases: list[tuple[tuple[str, str, object], Callable[[], Awaitable[object]]]] = [
            (("batch", BATCH, "list"), lambda: handle.write_batch([1, 2])),
            (("batch", BATCH, "Table"), lambda: handle.write_batch(table)),
            (("epoch", EPOCH, -1), lambda: handle.begin_epoch(-1)),
            (("epoch", EPOCH, 1.0), lambda: handle.begin_epoch(1.0)),  # type: ignore[arg-type]
            (("epoch", EPOCH, True), lambda: handle.begin_epoch(True)),
            (("epoch", EPOCH, -1), lambda: handle.pre_commit(-1)),
            (("epoch", EPOCH, -2), lambda: handle.commit_epoch(-2)),
            (("epoch", EPOCH, -1), lambda: handle.rollback_epoch(-1)),
            (("pending", "PendingCommit items", 3), lambda: handle.recover([3])),  # type: ignore[list-item]
            (
                ("pending", "PendingCommit items", 4),
                lambda: handle.recover([PendingCommit(1, {}), 4]),  # type: ignore[list-item]
            ),
            (("timeout", SECONDS, 0), lambda: handle.close(timeout=0)),
            (
                ("positions", PAIR, [{}, {}]),
                lambda: handle.pre_commit(1, positions=[{}, {}]),  # type: ignore[arg-type]
            ),
            (("positions", PAIR, ({},)), lambda: handle.pre_commit(1, positions=({},))),  # type: ignore[arg-type]
            (
                ("positions", PAIR, ({}, {}, {})),
                lambda: handle.pre_commit(1, positions=({}, {}, {})),  # type: ignore[arg-type]
            ),
            (("positions", MAPPING, "s"), lambda: handle.pre_commit(1, positions=("s", {}))),  # type: ignore[arg-type]
            (("positions", MAPPING, 7), lambda: handle.pre_commit(1, positions=({}, 7))),  # type: ignore[arg-type]
            (
                ("positions", ENTRIES, {"s/0": -1}),
                lambda: handle.pre_commit(1, positions=({"s/0": -1}, {})),
            ),
            (
                ("positions", ENTRIES, {"": 1}),
                lambda: handle.pre_commit(1, positions=({}, {"": 1})),
            ),
        ]
        for error, call in cases:
            with pytest.raises(InvalidArgumentError) as info:
                await call()
            assert type(info.value) is InvalidArgumentError
            assert (info.value.argument, info.value.expected, info.value.got) == error
        stats = handle.stats()
    assert (stats.write_errors, stats.rollbacks, stats.finished) == (0, 0, False)
    assert fake.calls == [("open",), ("flush",), ("close",)]  # nothing reached the connector


# --- the epoch state machine against a model ---------------------------------------------


class SinkTaskMachine(RuleBasedStateMachine):
    """Every command's answer, the task's counters and the connector's calls agree with a
    simple model of the rules after every step."""

    def __init__(self, backend: str, exactly_once: bool) -> None:
        super().__init__()
        self._portal_cm = start_blocking_portal(backend)
        self.portal = self._portal_cm.__enter__()
        self.fake = FakeConnector(exactly_once=exactly_once)
        self._task_cm = self.portal.wrap_async_context_manager(sink(self.fake))
        self.handle: SinkTaskHandle = self._task_cm.__enter__()
        # The model.
        self.exactly_once = exactly_once
        self.calls: list[tuple[Any, ...]] = [("open",)]
        self.last_begun: int | None = None
        self.open: int | None = None
        self.pre_committed: deque[int] = deque()
        self.committed = 0
        self.poisoned = False
        self.write_errors = 0
        self.batches = 0
        self.rows = 0
        self.flushes = 0
        self.rollbacks = 0
        self.rollback_errors = 0

    def _run(self, call: Callable[[], Awaitable[object]]) -> type[BaseException] | None:
        async def run() -> type[BaseException] | None:
            with anyio.fail_after(scaled(5)):
                try:
                    await call()
                except (EpochPoisonedError, SinkEpochError, SinkConnectorError) as exc:
                    return type(exc)
                return None

        return self.portal.call(run)

    def _sync(self) -> None:
        """Round-trip a flush so that fire-and-forget commands were served."""
        assert self._run(self.handle.flush) is None
        self.calls.append(("flush",))
        self.flushes += 1

    def _pick(self, hint: int | None, choice: int, use_hint: bool) -> int:
        return hint if use_hint and hint is not None else choice

    @rule(choice=st.integers(0, 8), use_hint=st.booleans(), fail=st.booleans())
    def begin(self, choice: int, use_hint: bool, fail: bool) -> None:
        epoch = self._pick(
            None if self.last_begun is None else self.last_begun + 1, choice, use_hint
        )
        self.fake.fail["begin_epoch"] = int(fail)
        outcome = self._run(lambda: self.handle.begin_epoch(epoch))
        self.fake.fail.clear()
        if (self.last_begun is not None and epoch <= self.last_begun) or self.open is not None:
            expected: type[BaseException] | None = SinkEpochError
        else:
            self.calls.append(("begin_epoch", epoch))
            if fail:
                expected = SinkConnectorError
            else:
                expected = None
                self.last_begun = self.open = epoch
                self.poisoned = False
        assert outcome is expected

    @rule(kind=st.sampled_from(["ok", "fail", "wrong schema"]), rows=st.integers(0, 3))
    def write(self, kind: str, rows: int) -> None:
        self.fake.fail["write_batch"] = int(kind == "fail")
        if kind == "wrong schema":
            wrong = pa.record_batch([pa.array(range(rows), pa.int64())], schema=OTHER_SCHEMA)
            with pytest.raises(SchemaMismatchError):
                self.portal.call(self.handle.write_batch, wrong)
        else:
            self.portal.call(self.handle.write_batch, batch(*range(rows)))
        self._sync_after_write(kind, rows)

    def _sync_after_write(self, kind: str, rows: int) -> None:
        if kind == "wrong schema" or (self.exactly_once and self.open is None):
            failed = True
        else:
            self.calls.append(("write_batch", rows))
            failed = kind == "fail"
        if failed:
            self.write_errors += 1
            self.poisoned = True
        else:
            self.batches += 1
            self.rows += rows
        self._sync()
        self.fake.fail.clear()

    @rule(choice=st.integers(0, 8), use_hint=st.booleans(), fail=st.booleans())
    def pre_commit(self, choice: int, use_hint: bool, fail: bool) -> None:
        epoch = self._pick(self.open, choice, use_hint)
        self.fake.fail["pre_commit"] = int(fail)
        outcome = self._run(lambda: self.handle.pre_commit(epoch))
        self.fake.fail.clear()
        expected: type[BaseException] | None
        if self.poisoned:
            expected = EpochPoisonedError
        elif epoch != self.open:
            expected = SinkEpochError
        else:
            self.calls.append(("pre_commit", epoch))
            if fail:
                expected = SinkConnectorError
            else:
                expected = None
                self.open = None
                self.pre_committed.append(epoch)
        assert outcome is expected

    @rule(choice=st.integers(0, 8), hint=st.sampled_from(["oldest", "newest"]), fail=st.booleans())
    def commit(self, choice: int, hint: str, fail: bool) -> None:
        pending = list(self.pre_committed)
        epoch = (pending[0] if hint == "oldest" else pending[-1]) if pending else choice
        self.fake.fail["commit_epoch"] = int(fail)
        outcome = self._run(lambda: self.handle.commit_epoch(epoch))
        self.fake.fail.clear()
        expected: type[BaseException] | None
        if self.poisoned:
            expected = EpochPoisonedError
        elif not pending or pending[0] != epoch:
            expected = SinkEpochError
        else:
            self.calls.append(("commit_epoch", epoch))
            if fail:
                expected = SinkConnectorError
            else:
                expected = None
                self.pre_committed.popleft()
                self.committed = epoch
        assert outcome is expected

    @rule(choice=st.integers(0, 8), use_hint=st.booleans(), fail=st.booleans())
    def rollback(self, choice: int, use_hint: bool, fail: bool) -> None:
        hint = self.open if self.open is not None else next(iter(self.pre_committed), None)
        epoch = self._pick(hint, choice, use_hint)
        self.fake.fail["rollback_epoch"] = int(fail)
        self.portal.call(self.handle.rollback_epoch, epoch)  # never raises
        self.calls.append(("rollback_epoch", epoch))
        self.rollbacks += 1
        self.rollback_errors += int(fail)
        if self.open == epoch:
            self.open = None
        if epoch in self.pre_committed:
            self.pre_committed.remove(epoch)
        self._sync()
        self.fake.fail.clear()

    @invariant()
    def agrees_with_model(self) -> None:
        stats = self.portal.call(self.handle.stats)
        assert stats.write_errors == self.write_errors
        assert stats.epoch_poisoned == self.poisoned
        assert (stats.batches_written, stats.rows_written) == (self.batches, self.rows)
        assert stats.open_epoch == self.open
        assert stats.pre_committed == tuple(self.pre_committed)
        assert stats.committed_epoch == self.committed
        assert (stats.rollbacks, stats.rollback_errors) == (self.rollbacks, self.rollback_errors)
        assert (stats.flushes, stats.flush_errors, stats.stuck_flushes) == (self.flushes, 0, 0)
        assert not stats.finished
        assert self.fake.calls == self.calls

    def teardown(self) -> None:
        try:
            self._task_cm.__exit__(None, None, None)
            assert self.fake.calls == [*self.calls, ("flush",), ("close",)]
        finally:
            self._portal_cm.__exit__(None, None, None)


@pytest.mark.parametrize("exactly_once", [True, False], ids=["exactly_once", "at_least_once"])
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_epoch_state_machine_matches_model(backend: str, exactly_once: bool) -> None:
    run_state_machine_as_test(
        lambda: SinkTaskMachine(backend, exactly_once),  # type: ignore[arg-type]
        settings=settings(max_examples=20, stateful_step_count=20, deadline=None),
    )


# --- the seed's defaults: a 5 s periodic flush, a 30 s close -----------------------------------


class _AutojumpSelector(selectors.BaseSelector):
    """A selector that, when the loop would sleep until its next timer and no file is ready,
    moves the loop's virtual clock to that timer instead (trio's ``MockClock(autojump_
    threshold=0)`` for asyncio)."""

    def __init__(self, clock: list[float]) -> None:
        self._inner = selectors.DefaultSelector()
        self._clock = clock

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._inner.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # no timer at all: only a file (another thread) can wake it
            return self._inner.select(None)
        self._clock[0] += timeout
        return []

    def get_map(self) -> Any:
        return self._inner.get_map()

    def close(self) -> None:
        self._inner.close()


class AutojumpLoop(asyncio.SelectorEventLoop):
    """An asyncio loop on a virtual clock that jumps to the next timer whenever every task
    is blocked: ``anyio.current_time()``, sleeps and timeouts all read it."""

    def __init__(self) -> None:
        self._virtual = [0.0]
        super().__init__(_AutojumpSelector(self._virtual))

    def time(self) -> float:
        return self._virtual[0]


def virtual_clocks() -> Any:
    """Both backends on a virtual clock that jumps when every task is blocked: a default of
    seconds is then checked to the exact instant, without waiting for it."""
    return pytest.mark.parametrize(
        "anyio_backend",
        [
            pytest.param(("asyncio", {"loop_factory": AutojumpLoop}), id="asyncio-autojump"),
            pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}), id="trio-autojump"),
        ],
    )


#: A flush interval or timeout that the defaults tested here never reach.
LONGER = 1000.0


def test_seed_defaults_are_a_5s_flush_a_30s_close_and_128_commands() -> None:
    # sink_task.rs: DEFAULT_FLUSH_INTERVAL = 5 s, close() waits 30 s, DEFAULT_CHANNEL_CAPACITY
    # = 128; and every entry point defaults to them.
    assert sink_task.DEFAULT_FLUSH_INTERVAL == 5.0
    assert sink_task.DEFAULT_SHUTDOWN_TIMEOUT == 30.0
    assert sink_task.DEFAULT_CAPACITY == 128
    for entry in (start_sink_task, SinkTask.__init__):
        parameters = inspect.signature(entry).parameters
        assert parameters["flush_interval"].default == 5.0
        assert parameters["shutdown_timeout"].default == 30.0
        assert parameters["capacity"].default == 128
    assert inspect.signature(SinkTaskHandle.close).parameters["timeout"].default == 30.0


@virtual_clocks()
async def test_default_periodic_flush_fires_at_5s_not_before() -> None:
    fake = FakeConnector()
    async with SinkTask(fake, name="orders") as handle:  # the default interval
        started = anyio.current_time()
        with anyio.move_on_after(4.999):
            await fake.entered_event("flush").wait()
        assert "flush" not in fake.names()  # not before 5 s
        with anyio.fail_after(1.0):
            await fake.entered_event("flush").wait()
        assert anyio.current_time() - started == pytest.approx(5.0, abs=1e-6)
        fake.entered.pop("flush")
        with anyio.fail_after(5.001):  # every 5 s after that
            await fake.entered_event("flush").wait()
        assert anyio.current_time() - started == pytest.approx(10.0, abs=1e-6)
        flushes = handle.stats().flushes
    assert flushes == 2


@virtual_clocks()
async def test_default_periodic_flush_is_cut_after_5s_as_a_stuck_sink() -> None:
    # sink_task.rs bounds each periodic flush by the interval: a stuck sink is reported.
    fake = FakeConnector()
    fake.hang["flush"] = anyio.Event()
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            handle = await start_sink_task(tg, fake, name="orders")
            started = anyio.current_time()
            await fake.entered_event("flush").wait()  # at 5 s
            tg.start_soon(handle.begin_epoch, 1)  # queued behind the stuck flush
            await fake.entered_event("begin_epoch").wait()  # served once the flush was cut
            assert anyio.current_time() - started == pytest.approx(10.0, abs=1e-6)
            assert handle.stats().stuck_flushes == 1
            tg.cancel_scope.cancel()
    stuck = warnings_of(logs, "periodic sink flush timed out; the sink may be stuck")
    assert stuck[0]["timeout_s"] == 5.0


@virtual_clocks()
async def test_default_close_gives_up_after_30s() -> None:
    # sink_task.rs: close() waits 30 s for the task, then gives up (here: returns False and
    # warns, naming the sink; the task goes on closing in the background).
    fake = FakeConnector()
    fake.hang["close"] = anyio.Event()  # a connector that never closes
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            handle = await start_sink_task(
                tg, fake, name="orders", flush_interval=LONGER, shutdown_timeout=LONGER
            )
            started = anyio.current_time()
            assert not await handle.close()  # the default timeout
            assert anyio.current_time() - started == pytest.approx(30.0, abs=1e-6)
            assert fake.names() == ["open", "flush", "close"]
            tg.cancel_scope.cancel()
    given_up = warnings_of(logs, "sink did not close in time")
    assert [(w["sink"], w["timeout_s"]) for w in given_up] == [("orders", 30.0)]


@virtual_clocks()
async def test_default_shutdown_timeout_bounds_the_final_flush_and_close_at_30s_each() -> None:
    fake = FakeConnector()
    fake.hang["flush"] = anyio.Event()
    fake.hang["close"] = anyio.Event()
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            handle = await start_sink_task(tg, fake, name="orders", flush_interval=LONGER)
            started = anyio.current_time()
            handle.release()  # the last handle: flush, then close
            await fake.entered_event("close").wait()
            assert anyio.current_time() - started == pytest.approx(30.0, abs=1e-6)
        # The task ended (its group with it) once the close was cut too.
        assert anyio.current_time() - started == pytest.approx(60.0, abs=1e-6)
    assert fake.calls == [
        ("open",),
        ("flush",),
        ("flush cancelled",),
        ("close",),
        ("close cancelled",),
    ]
    assert warnings_of(logs, "sink flush timed out at shutdown")[0]["timeout_s"] == 30.0
    assert warnings_of(logs, "sink close timed out")[0]["timeout_s"] == 30.0
