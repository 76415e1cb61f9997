"""The sink task: one test per rule of LaminarDB's sink_task.rs, on asyncio and trio.

A fake staging writer records every call it gets (on entry, so a refused command shows up as
a call that never came) and fails, hangs or returns a wrong manifest on cue, so each test
asserts the exact sequence of writer calls, the task's counters and the typed fields of its
errors.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import selectors
from collections.abc import Awaitable, Callable, MutableMapping
from types import SimpleNamespace
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

from barrierflow.actors import Manifest, StagedFile, StagingWriter
from barrierflow.actors.sinks import sink_task
from barrierflow.actors.sinks.sink_task import (
    SinkTask,
    SinkTaskHandle,
    SinkTaskStats,
    start_sink_task,
)
from barrierflow.channels.epoch import MAX_EPOCH
from barrierflow.errors import (
    ActorGoneError,
    EpochPoisonedError,
    InvalidArgumentError,
    SchemaMismatchError,
    SinkConnectorError,
    SinkEpochError,
)

pytestmark = pytest.mark.anyio

SCHEMA = pa.schema([("x", pa.int32())])
OTHER_SCHEMA = pa.schema([("x", pa.int64())])
NEVER = 60.0  # a flush interval that never ticks during a test


def batch(*values: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array(values, pa.int32())], schema=SCHEMA)


class WriterFailedError(Exception):
    """What the fake raises when told to fail."""


class FakeWriter:
    """A staging writer that records its calls and fails, hangs or misbehaves on cue.

    ``fail[method] = n`` fails the next ``n`` calls of ``method``; ``hang[method] = event``
    makes ``method`` wait for ``event`` (never set: forever); ``entered[method]`` is set on
    each call of ``method``. A cancelled call is recorded as ``("<method> cancelled",)`` and
    sets ``entered["<method> cancelled"]``. ``returns[epoch] = value`` makes the next
    ``stage(epoch)`` return ``value`` instead of its own manifest; ``staged`` holds the
    manifests it made, in order.
    """

    def __init__(self, writer_id: str = "w0") -> None:
        self.writer_id = writer_id
        self.calls: list[tuple[Any, ...]] = []
        self.fail: dict[str, int] = {}
        self.raised: list[WriterFailedError] = []
        self.hang: dict[str, anyio.Event] = {}
        self.delay: dict[str, float] = {}
        self.entered: dict[str, anyio.Event] = {}
        self.returns: dict[int, Any] = {}
        self.staged: list[Manifest] = []
        self.rows: dict[int, int] = {}  # rows written per epoch begun
        self.current: int | None = None

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
            self.entered_event(f"{method} cancelled").set()
            raise
        if self.fail.get(method, 0) > 0:
            self.fail[method] -= 1
            error = WriterFailedError(f"{method} failed")
            self.raised.append(error)
            raise error

    async def open(self) -> None:
        await self._enter("open")

    async def begin(self, epoch: int) -> None:
        await self._enter("begin", epoch)
        self.current = epoch
        self.rows[epoch] = 0

    async def write(self, batch: pa.RecordBatch) -> None:
        await self._enter("write", batch.num_rows)
        if self.current is not None:
            self.rows[self.current] += batch.num_rows

    async def flush(self) -> None:
        await self._enter("flush")

    async def stage(self, epoch: int) -> Manifest:
        await self._enter("stage", epoch)
        if epoch in self.returns:
            returned: Manifest = self.returns.pop(epoch)
            return returned
        rows = self.rows.get(epoch, 0)
        path = f".staging/{epoch}/{self.writer_id}/part-0.parquet"
        manifest = Manifest(self.writer_id, epoch, (StagedFile(path, rows, 8 * rows),))
        self.staged.append(manifest)
        return manifest

    async def discard(self, epoch: int) -> None:
        await self._enter("discard", epoch)

    async def close(self) -> None:
        await self._enter("close")


def sink(writer: FakeWriter, **kwargs: Any) -> SinkTask:
    kwargs.setdefault("flush_interval", NEVER)
    return SinkTask(writer, name="orders", **kwargs)


def warnings_of(logs: list[MutableMapping[str, Any]], event: str) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == event and e["log_level"] == "warning"]


# --- virtual clocks (both backends) ------------------------------------------------------


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
    """Both backends on a virtual clock that jumps when every task is blocked: an interval is
    then checked to the exact instant, without waiting for it."""
    return pytest.mark.parametrize(
        "anyio_backend",
        [
            pytest.param(("asyncio", {"loop_factory": AutojumpLoop}), id="asyncio-autojump"),
            pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}), id="trio-autojump"),
        ],
    )


def test_fake_writer_is_a_staging_writer() -> None:
    assert isinstance(FakeWriter(), StagingWriter)


# --- a failed write poisons the epoch ------------------------------------------------------


async def test_failed_write_increments_write_errors_and_poisons_epoch() -> None:
    fake = FakeWriter()
    fake.fail["write"] = 1
    with structlog.testing.capture_logs() as logs:
        async with sink(fake) as handle:
            await handle.begin(1)
            await handle.write(batch(1, 2))  # fire-and-forget: the failure is not raised
            await handle.write(batch(3))
            await handle.flush()  # answered after both writes were served
            stats = handle.stats()
    assert stats.write_errors == 1
    assert stats.epoch_poisoned
    assert (stats.batches_written, stats.rows_written) == (1, 1)
    assert fake.calls[1:4] == [("begin", 1), ("write", 2), ("write", 1)]
    [warning] = warnings_of(logs, "sink write failed; epoch poisoned")
    assert (warning["sink"], warning["epoch"], warning["write_errors"]) == ("orders", 1, 1)
    assert warning["error"] == repr(fake.raised[0])


async def test_poisoned_epoch_refuses_stage() -> None:
    fake = FakeWriter()
    async with sink(fake) as handle:
        await handle.begin(1)
        await handle.write(batch(1))
        await handle.stage(1)
        await handle.begin(2)
        fake.fail["write"] = 1
        await handle.write(batch(2))
        with pytest.raises(EpochPoisonedError) as poisoned:
            await handle.stage(2)
        with pytest.raises(EpochPoisonedError) as other:
            await handle.stage(3)  # the poison is checked before the epoch
        stats = handle.stats()
    assert (poisoned.value.sink, poisoned.value.operation, poisoned.value.epoch) == (
        "orders",
        "stage",
        2,
    )
    assert poisoned.value.write_errors == 1
    assert (other.value.operation, other.value.epoch, other.value.write_errors) == ("stage", 3, 1)
    # The writer saw neither stage; the task's epoch state did not move either.
    assert fake.calls[1:] == [
        ("begin", 1),
        ("write", 1),
        ("stage", 1),
        ("begin", 2),
        ("write", 1),
        ("flush",),
        ("close",),
    ]
    assert (stats.open_epoch, stats.staged_epochs, stats.last_staged) == (2, 1, 1)


async def test_successful_begin_clears_poison() -> None:
    fake = FakeWriter()
    fake.fail["write"] = 1
    async with sink(fake) as handle:
        await handle.begin(1)
        await handle.write(batch(1))
        await handle.discard(1)
        await handle.flush()  # the write and discard were served
        assert handle.stats().epoch_poisoned  # a discard alone does not clear it
        await handle.begin(2)
        assert not handle.stats().epoch_poisoned
        await handle.write(batch(2, 3))
        manifest = await handle.stage(2)
        assert (handle.stats().staged_epochs, handle.stats().last_staged) == (1, 2)
    assert (manifest.epoch, manifest.rows) == (2, 2)
    assert fake.calls == [
        ("open",),
        ("begin", 1),
        ("write", 1),
        ("discard", 1),
        ("flush",),
        ("begin", 2),
        ("write", 2),
        ("stage", 2),
        ("flush",),
        ("close",),
    ]


async def test_failed_begin_keeps_poison() -> None:
    fake = FakeWriter()
    fake.fail["write"] = 1
    async with sink(fake) as handle:
        await handle.begin(1)
        await handle.write(batch(1))
        await handle.discard(1)
        fake.fail["begin"] = 1
        with pytest.raises(SinkConnectorError) as info:
            await handle.begin(2)
        stats = handle.stats()
        assert stats.epoch_poisoned
        assert stats.open_epoch is None  # the failed begin opened nothing
        with pytest.raises(EpochPoisonedError):
            await handle.stage(2)
        await handle.begin(3)  # a later successful begin clears it
        assert not handle.stats().epoch_poisoned
    assert (info.value.sink, info.value.operation, info.value.epoch) == ("orders", "begin", 2)
    assert info.value.__cause__ is fake.raised[-1]
    assert "stage" not in fake.names()


async def test_schema_mismatch_raises_naming_both_schemas_and_poisons_epoch() -> None:
    fake = FakeWriter()
    with structlog.testing.capture_logs() as logs:
        async with sink(fake) as handle:
            await handle.begin(1)
            wrong = pa.record_batch([pa.array([1], pa.int64())], schema=OTHER_SCHEMA)
            with pytest.raises(SchemaMismatchError) as info:
                await handle.write(wrong)
            await handle.flush()
            stats = handle.stats()
            with pytest.raises(EpochPoisonedError):
                await handle.stage(1)
    assert info.value.argument == "batch for sink 'orders'"
    assert info.value.expected_schema == SCHEMA
    assert info.value.actual_schema == OTHER_SCHEMA
    assert info.value.got == OTHER_SCHEMA
    assert info.value.null_field is None
    # The batch still reached the task, which counted the failed write.
    assert (stats.write_errors, stats.epoch_poisoned, stats.batches_written) == (1, True, 0)
    assert stats.rows_written == 0
    assert "write" not in fake.names()  # the writer never saw the wrong batch
    [warning] = warnings_of(logs, "sink write failed; epoch poisoned")
    assert (warning["epoch"], warning["write_errors"]) == (1, 1)
    assert "SchemaMismatchError" in warning["error"]
    assert "batch for sink 'orders'" in warning["error"]


async def test_write_outside_an_epoch_poisons() -> None:
    fake = FakeWriter()
    with structlog.testing.capture_logs() as logs:
        async with sink(fake) as handle:
            await handle.write(batch(1))  # nothing begun
            await handle.flush()
            assert (handle.stats().write_errors, handle.stats().epoch_poisoned) == (1, True)
            await handle.begin(1)
            await handle.stage(1)
            await handle.write(batch(2))  # epoch 1 staged, 2 not begun
            await handle.flush()
            stats = handle.stats()
            assert (stats.write_errors, stats.epoch_poisoned) == (2, True)
            assert (stats.batches_written, stats.rows_written) == (0, 0)
    assert "write" not in fake.names()
    first, second = warnings_of(logs, "sink write failed; epoch poisoned")
    assert (first["epoch"], first["write_errors"]) == (None, 1)
    assert (second["epoch"], second["write_errors"]) == (None, 2)
    expected = "a begun epoch to write into"
    assert first["error"] == repr(SinkEpochError("orders", "write", 0, expected))
    assert second["error"] == repr(SinkEpochError("orders", "write", 1, expected))
    assert "write(1): expected a begun epoch to write into" in second["error"]


# --- epoch commands are ordered -------------------------------------------------------------


async def test_begin_must_increase() -> None:
    fake = FakeWriter()
    async with sink(fake) as handle:
        await handle.begin(5)
        await handle.stage(5)
        for epoch in (5, 4, 0):
            with pytest.raises(SinkEpochError) as info:
                await handle.begin(epoch)
            assert (info.value.sink, info.value.operation, info.value.epoch) == (
                "orders",
                "begin",
                epoch,
            )
            assert info.value.expected == "an epoch greater than 5"
        await handle.begin(7)  # gaps are fine
        assert handle.stats().open_epoch == 7
    assert [c for c in fake.calls if c[0] == "begin"] == [("begin", 5), ("begin", 7)]


async def test_the_first_begin_may_be_epoch_zero() -> None:
    fake = FakeWriter()
    async with sink(fake) as handle:
        await handle.begin(0)
        assert (await handle.stage(0)).epoch == 0
        with pytest.raises(SinkEpochError) as info:
            await handle.begin(0)
        stats = handle.stats()
    assert info.value.expected == "an epoch greater than 0"
    assert (stats.staged_epochs, stats.last_staged, stats.open_epoch) == (1, 0, None)
    assert fake.calls[1:3] == [("begin", 0), ("stage", 0)]


async def test_begin_while_previous_open_is_refused() -> None:
    fake = FakeWriter()
    async with sink(fake) as handle:
        await handle.begin(1)
        with pytest.raises(SinkEpochError) as info:
            await handle.begin(2)
        assert (info.value.sink, info.value.operation, info.value.epoch) == ("orders", "begin", 2)
        assert info.value.expected == "open epoch 1 staged or discarded first"
        assert handle.stats().open_epoch == 1
        await handle.discard(1)
        await handle.begin(2)  # discarded: no longer blocks
        with pytest.raises(SinkEpochError):
            await handle.begin(3)
        await handle.stage(2)
        await handle.begin(3)  # staged: no longer blocks
    assert [c for c in fake.calls if c[0] == "begin"] == [("begin", 1), ("begin", 2), ("begin", 3)]


async def test_stage_of_an_epoch_that_is_not_open_is_refused() -> None:
    fake = FakeWriter()
    async with sink(fake) as handle:
        with pytest.raises(SinkEpochError) as nothing_open:
            await handle.stage(1)
        await handle.begin(3)
        with pytest.raises(SinkEpochError) as other:
            await handle.stage(2)
        await handle.stage(3)
        with pytest.raises(SinkEpochError) as twice:
            await handle.stage(3)
        await handle.begin(4)
        await handle.discard(4)
        with pytest.raises(SinkEpochError) as discarded:
            await handle.stage(4)
        stats = handle.stats()
    for info, epoch, expected in [
        (nothing_open, 1, "an epoch begun first"),
        (other, 2, "the open epoch 3"),
        (twice, 3, "an epoch begun first"),
        (discarded, 4, "an epoch begun first"),
    ]:
        assert (info.value.sink, info.value.operation, info.value.epoch) == (
            "orders",
            "stage",
            epoch,
        )
        assert info.value.expected == expected
    assert [c for c in fake.calls if c[0] == "stage"] == [("stage", 3)]
    assert (stats.staged_epochs, stats.last_staged) == (1, 3)


# --- stage returns the writer's manifest ----------------------------------------------------


async def test_stage_returns_the_writers_manifest() -> None:
    fake = FakeWriter("w7")
    async with sink(fake) as handle:
        assert handle.stats().last_staged == 0  # none staged yet
        await handle.begin(4)
        await handle.write(batch(1, 2))
        await handle.write(batch(3))
        first = await handle.stage(4)
        assert handle.stats().open_epoch is None
        await handle.begin(9)
        second = await handle.stage(9)
        stats = handle.stats()
    assert first is fake.staged[0]  # the writer's own object, untouched
    assert second is fake.staged[1]
    assert first == Manifest("w7", 4, (StagedFile(".staging/4/w7/part-0.parquet", 3, 24),))
    assert (second.writer, second.epoch, second.rows) == ("w7", 9, 0)
    assert (stats.staged_epochs, stats.last_staged, stats.open_epoch) == (2, 9, None)
    assert (stats.batches_written, stats.rows_written) == (2, 3)


@pytest.mark.parametrize(
    "returned",
    [
        pytest.param(None, id="None"),
        pytest.param({"writer": "w0", "epoch": 2}, id="json"),
        pytest.param(SimpleNamespace(writer="w0", epoch=2, rows=0), id="duck"),
        pytest.param(Manifest("w0", 3), id="later-epoch"),
        pytest.param(Manifest("w0", 1), id="earlier-epoch"),
    ],
)
async def test_stage_refuses_what_is_not_a_manifest_of_the_epoch(returned: Any) -> None:
    fake = FakeWriter()
    fake.returns[2] = returned
    async with sink(fake) as handle:
        await handle.begin(2)
        await handle.write(batch(1))
        with pytest.raises(SinkConnectorError) as info:
            await handle.stage(2)
        stats = handle.stats()
        # The epoch stays open (the state did not move): staging again succeeds.
        manifest = await handle.stage(2)
        after = handle.stats()
    assert (info.value.sink, info.value.operation, info.value.epoch) == ("orders", "stage", 2)
    cause = info.value.cause
    assert type(cause) is InvalidArgumentError
    assert (cause.argument, cause.expected) == ("stage()", "a Manifest of epoch 2")
    assert cause.got is returned
    assert "stage of epoch 2 failed" in str(info.value)
    assert (stats.open_epoch, stats.staged_epochs, stats.last_staged) == (2, 0, 0)
    assert not stats.epoch_poisoned
    assert manifest is fake.staged[0]
    assert (after.open_epoch, after.staged_epochs, after.last_staged) == (None, 1, 2)
    assert fake.calls[1:5] == [("begin", 2), ("write", 1), ("stage", 2), ("stage", 2)]


async def test_a_failed_stage_leaves_the_epoch_open_to_discard() -> None:
    fake = FakeWriter()
    fake.fail["stage"] = 1
    async with sink(fake) as handle:
        await handle.begin(1)
        with pytest.raises(SinkConnectorError) as info:
            await handle.stage(1)
        assert handle.stats().open_epoch == 1
        with pytest.raises(SinkEpochError):
            await handle.begin(2)  # the failed epoch still blocks the next
        await handle.discard(1)
        await handle.begin(2)
        stats = handle.stats()
    assert (info.value.sink, info.value.operation, info.value.epoch) == ("orders", "stage", 1)
    assert info.value.__cause__ is fake.raised[0]
    assert info.value.cause is fake.raised[0]
    assert (stats.open_epoch, stats.staged_epochs, stats.last_staged, stats.discards) == (
        2,
        0,
        0,
        1,
    )
    assert fake.calls[1:5] == [("begin", 1), ("stage", 1), ("discard", 1), ("begin", 2)]


# --- discard ---------------------------------------------------------------------------------


async def test_discard_is_fire_and_forget_and_its_failure_is_logged_and_counted() -> None:
    fake = FakeWriter()
    fake.hang["discard"] = release = anyio.Event()
    fake.fail["discard"] = 1
    with structlog.testing.capture_logs() as logs:
        async with sink(fake) as handle:
            await handle.begin(1)
            with anyio.fail_after(scaled(1)):
                await handle.discard(1)  # returns although the discard hangs
                await fake.entered_event("discard").wait()
            assert (handle.stats().discards, handle.stats().discard_errors) == (1, 0)
            release.set()
            await handle.begin(2)  # served after the failed discard; nothing raised
            stats = handle.stats()
    assert (stats.discards, stats.discard_errors, stats.open_epoch) == (1, 1, 2)
    [warning] = warnings_of(logs, "sink discard failed")
    assert (warning["sink"], warning["epoch"]) == ("orders", 1)
    assert warning["error"] == repr(fake.raised[0])
    assert fake.calls[1:4] == [("begin", 1), ("discard", 1), ("begin", 2)]


async def test_discard_of_another_epoch_leaves_the_open_one_and_the_staged_count() -> None:
    fake = FakeWriter()
    with structlog.testing.capture_logs() as logs:
        async with sink(fake) as handle:
            await handle.begin(1)
            await handle.stage(1)
            await handle.begin(2)
            await handle.discard(1)  # the coordinator aborts a staged epoch
            await handle.discard(7)  # never begun: still handed to the writer
            await handle.flush()
            stats = handle.stats()
            await handle.stage(2)  # still open
    assert (stats.open_epoch, stats.staged_epochs, stats.last_staged) == (2, 1, 1)
    assert (stats.discards, stats.discard_errors) == (2, 0)
    assert warnings_of(logs, "sink discard failed") == []
    assert fake.calls[1:8] == [
        ("begin", 1),
        ("stage", 1),
        ("begin", 2),
        ("discard", 1),
        ("discard", 7),
        ("flush",),
        ("stage", 2),
    ]


async def test_discard_of_the_open_epoch_closes_it() -> None:
    fake = FakeWriter()
    async with sink(fake) as handle:
        await handle.begin(3)
        await handle.discard(3)
        await handle.flush()
        stats = handle.stats()
    assert (stats.open_epoch, stats.discards, stats.staged_epochs) == (None, 1, 0)


async def test_stats_count_every_outcome_separately() -> None:
    fake = FakeWriter()
    with structlog.testing.capture_logs():
        async with sink(fake) as handle:
            for epoch, values in ((1, (1, 2, 3)), (4, (4, 5))):
                await handle.begin(epoch)
                await handle.write(batch(*values))
                await handle.write(batch(6))
                await handle.stage(epoch)
            await handle.begin(5)
            await handle.write(batch(7))
            await handle.discard(5)
            fake.fail["discard"] = 2
            await handle.discard(2)
            await handle.discard(3)
            fake.fail["flush"] = 1
            with pytest.raises(SinkConnectorError):
                await handle.flush()  # an explicit flush that fails is raised, not counted
            for _ in range(3):
                await handle.flush()
            await handle.begin(7)
            fake.fail["write"] = 1
            await handle.write(batch(8))
            await handle.flush()
            stats = handle.stats()
    assert stats == SinkTaskStats(
        name="orders",
        batches_written=5,
        rows_written=8,
        write_errors=1,
        epoch_poisoned=True,
        flushes=4,
        flush_errors=0,
        stuck_flushes=0,
        open_epoch=7,
        staged_epochs=2,
        last_staged=4,
        discards=3,
        discard_errors=2,
        finished=False,
    )
    assert handle.stats().finished


# --- the periodic flush -----------------------------------------------------------------------


@virtual_clocks()
async def test_periodic_flush_runs_every_interval() -> None:
    fake = FakeWriter()
    async with sink(fake, flush_interval=0.05) as handle:
        await anyio.sleep(0.325)  # virtual time: ticks due at 0.05, 0.10, ..., 0.30
        flushes = handle.stats().flushes
    assert flushes == 6
    # Each tick flushed once (a tick may still come in before the release is seen), plus the
    # final flush, which the periodic counter does not count.
    assert fake.names().count("flush") == handle.stats().flushes + 1


@virtual_clocks()
async def test_first_immediate_tick_is_skipped() -> None:
    fake = FakeWriter()
    async with sink(fake, flush_interval=0.2) as handle:
        started = anyio.current_time()
        with anyio.move_on_after(0.199):
            await fake.entered_event("flush").wait()
        assert handle.stats().flushes == 0
        assert "flush" not in fake.names()
        with anyio.fail_after(0.1):
            await fake.entered_event("flush").wait()
        assert anyio.current_time() - started == pytest.approx(0.2, abs=1e-6)


async def test_missed_ticks_are_skipped_not_bursted() -> None:
    fake = FakeWriter()
    fake.delay["write"] = 0.2  # one write spans four ticks of 0.05 s
    async with sink(fake, flush_interval=0.05) as handle:
        with anyio.fail_after(scaled(2)):
            await handle.begin(1)
            await handle.write(batch(1))
            await fake.entered_event("write").wait()
            await handle.stage(1)  # queued behind the slow write
            flushes_after = handle.stats().flushes
    names = fake.names()
    after_write = names[names.index("write") + 1 : names.index("stage")]
    # The late tick runs once, before the queued command; the three other missed ones never.
    assert after_write == ["flush"]
    assert flushes_after == names[: names.index("stage")].count("flush")


async def test_busy_inbox_does_not_starve_the_periodic_flush() -> None:
    fake = FakeWriter()
    fake.delay["write"] = 0.02
    async with sink(fake, flush_interval=0.05) as handle:
        with anyio.fail_after(scaled(2)):
            await handle.begin(1)
            for _ in range(15):  # queued at once: the inbox is never empty for 0.3 s
                await handle.write(batch(1))
            await handle.flush()
    names = fake.names()
    between_writes = names[names.index("write") : len(names) - names[::-1].index("write")]
    assert between_writes.count("flush") >= 2  # due ticks ran between queued writes


async def test_stuck_flush_is_reported_and_task_keeps_serving() -> None:
    fake = FakeWriter()
    fake.hang["flush"] = anyio.Event()  # never set
    with structlog.testing.capture_logs() as logs:
        async with sink(fake, flush_interval=0.05, shutdown_timeout=0.05) as handle:
            with anyio.fail_after(scaled(2)):
                await fake.entered_event("flush").wait()
                await fake.entered_event("flush cancelled").wait()  # it overran the interval
                await handle.begin(1)  # still served
                manifest = await handle.stage(1)
                stats = handle.stats()
    assert manifest is fake.staged[0]
    assert stats.stuck_flushes >= 1
    assert (stats.flushes, stats.flush_errors) == (0, 0)
    stuck = warnings_of(logs, "periodic sink flush timed out; the sink may be stuck")
    assert stuck
    assert (stuck[0]["sink"], stuck[0]["timeout_s"], stuck[0]["stuck_flushes"]) == (
        "orders",
        0.05,
        1,
    )
    assert fake.names()[-1] == "close"


async def test_every_failed_or_stuck_periodic_flush_is_counted() -> None:
    """The counters add up (two failures are 2, not 1): a command asked after each tick is
    served once the tick is done, so the stats it reads include it."""
    fake = FakeWriter()
    fake.fail["flush"] = 2
    async with sink(fake, flush_interval=0.05) as handle:
        with anyio.fail_after(scaled(2)):
            for epoch in (1, 2):
                fake.entered.pop("flush", None)
                await fake.entered_event("flush").wait()
                await handle.begin(epoch)  # served after the failed tick
                await handle.discard(epoch)
        assert handle.stats().flush_errors == 2
    hanging = FakeWriter()
    hanging.hang["flush"] = anyio.Event()  # never set: every tick overruns its interval
    async with sink(hanging, flush_interval=0.05, shutdown_timeout=0.05) as handle:
        with anyio.fail_after(scaled(2)):
            for epoch in (1, 2):
                hanging.entered.pop("flush cancelled", None)
                await hanging.entered_event("flush cancelled").wait()
                await handle.begin(epoch)  # served after the stuck tick
                await handle.discard(epoch)
        assert handle.stats().stuck_flushes >= 2  # not reset to 1: each overrun counts


async def test_failed_periodic_flush_is_counted_and_logged() -> None:
    fake = FakeWriter()
    fake.fail["flush"] = 1
    with structlog.testing.capture_logs() as logs:
        async with sink(fake, flush_interval=0.05) as handle:
            with anyio.fail_after(scaled(2)):
                await fake.entered_event("flush").wait()
                await handle.begin(1)  # served after the failed tick
            stats = handle.stats()
    assert (stats.flush_errors, stats.flushes, stats.stuck_flushes) == (1, 0, 0)
    [warning] = warnings_of(logs, "periodic sink flush failed")
    assert warning["sink"] == "orders"
    assert warning["error"] == repr(fake.raised[0])


# --- shutdown ----------------------------------------------------------------------------------


async def test_releasing_last_handle_flushes_then_closes() -> None:
    fake = FakeWriter()
    with anyio.fail_after(scaled(2)):
        async with anyio.create_task_group() as tg:
            handle = await start_sink_task(tg, fake, name="orders", flush_interval=NEVER)
            other = handle.clone()
            handle.release()
            handle.release()  # idempotent: does not count twice
            await other.begin(1)  # still served: one handle remains
            assert "close" not in fake.names()
            assert not other.stats().finished
            other.release()
        assert other.stats().finished
    assert fake.calls == [("open",), ("begin", 1), ("flush",), ("close",)]


async def test_leaving_a_handles_block_releases_it() -> None:
    fake = FakeWriter()
    async with sink(fake) as handle:
        async with handle.clone() as other:
            assert other is not handle
            await other.begin(1)
        with pytest.raises(ActorGoneError) as info:
            await other.stage(1)
        assert info.value.actor == "orders"
        await handle.stage(1)  # the task itself is fine
    assert fake.calls == [("open",), ("begin", 1), ("stage", 1), ("flush",), ("close",)]


async def test_explicit_close_waits_and_times_out() -> None:
    fake = FakeWriter()
    async with anyio.create_task_group() as tg:
        handle = await start_sink_task(tg, fake, name="orders", flush_interval=NEVER)
        with anyio.fail_after(scaled(2)):
            assert await handle.close()
        assert handle.stats().finished
        assert fake.calls == [("open",), ("flush",), ("close",)]

    # The final flush hangs and is allowed 5 s; close gives up after 0.05 s.
    stuck = FakeWriter()
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
            with pytest.raises(ActorGoneError) as info:
                handle.clone()  # given up or not, close released this handle
            assert (info.value.actor, info.value.reason) == ("orders", "this handle was closed")
            tg.cancel_scope.cancel()  # the runtime stops: the writer is still closed
    assert stuck.calls == [("open",), ("flush",), ("flush cancelled",), ("close",)]
    [gave_up] = warnings_of(logs, "sink did not close in time")
    assert (gave_up["sink"], gave_up["timeout_s"]) == ("orders", 0.05)

    # shutdown_timeout bounds the final flush too: close then ends in time.
    bounded = FakeWriter()
    bounded.hang["flush"] = anyio.Event()
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            handle = await start_sink_task(
                tg, bounded, name="orders", flush_interval=NEVER, shutdown_timeout=0.05
            )
            with anyio.fail_after(scaled(2)):
                assert await handle.close(timeout=scaled(1.0))
    assert bounded.calls == [("open",), ("flush",), ("flush cancelled",), ("close",)]
    [timed_out] = warnings_of(logs, "sink flush timed out at shutdown")
    assert (timed_out["sink"], timed_out["timeout_s"]) == ("orders", 0.05)


async def test_close_waits_for_the_writer_to_close_when_the_task_is_cancelled() -> None:
    fake = FakeWriter()
    fake.hang["flush"] = anyio.Event()  # never set
    fake.hang["close"] = release = anyio.Event()
    runtime = anyio.CancelScope()
    results: list[bool] = []

    async def run_sink(*, task_status: TaskStatus[SinkTaskHandle]) -> None:
        with runtime:
            async with anyio.create_task_group() as inner:
                task_status.started(await start_sink_task(inner, fake, name="orders"))

    async def close(handle: SinkTaskHandle) -> None:
        results.append(await handle.close(timeout=scaled(2.0)))

    with anyio.fail_after(scaled(3)):
        async with anyio.create_task_group() as tg:
            handle: SinkTaskHandle = await tg.start(run_sink)
            tg.start_soon(close, handle)
            await fake.entered_event("flush").wait()  # the Close command is being served
            runtime.cancel()  # its reply cannot come: the closer waits for the task to end
            await fake.entered_event("close").wait()
            await anyio.wait_all_tasks_blocked()
            assert results == []
            assert not handle.stats().finished
            release.set()
    assert results == [True]
    assert fake.calls == [("open",), ("flush",), ("flush cancelled",), ("close",)]
    assert handle.stats().finished


async def test_concurrent_closes_close_the_writer_once() -> None:
    fake = FakeWriter()
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
    fake = FakeWriter()
    fake.fail["flush"] = 1
    with structlog.testing.capture_logs() as logs:
        async with sink(fake) as handle:
            pass
    assert handle.stats().finished
    assert fake.calls == [("open",), ("flush",), ("close",)]
    [warning] = warnings_of(logs, "sink flush failed at shutdown")
    assert (warning["sink"], warning["error"]) == ("orders", repr(fake.raised[0]))


async def test_writer_close_error_surfaces_as_sink_connector_error() -> None:
    fake = FakeWriter()
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
    [warning] = warnings_of(logs, "sink close failed")
    assert (warning["sink"], warning["error"]) == ("orders", repr(fake.raised[0]))


async def test_close_error_of_a_cancelled_task_is_logged_not_raised() -> None:
    fake = FakeWriter()
    fake.fail["close"] = 1
    failed = pytest.RaisesGroup(WriterFailedError, allow_unwrapped=True, flatten_subgroups=True)
    with structlog.testing.capture_logs() as logs, failed:
        async with sink(fake):
            raise WriterFailedError("the runtime failed")
    assert fake.calls == [("open",), ("close",)]
    assert len(warnings_of(logs, "sink close failed")) == 1


async def test_cancelled_task_closes_writer_without_flushing() -> None:
    fake = FakeWriter()
    fake.hang["close"] = passes = anyio.Event()
    passes.set()  # close takes a checkpoint: shielded, the cancellation does not cut it
    with pytest.RaisesGroup(WriterFailedError, allow_unwrapped=True, flatten_subgroups=True):
        async with sink(fake) as handle:
            await handle.begin(1)
            raise WriterFailedError("the runtime failed")
    assert fake.calls == [("open",), ("begin", 1), ("close",)]
    assert handle.stats().finished


async def test_an_outer_cancellation_passes_through_sink_task() -> None:
    """``SinkTask`` never swallows a cancellation of its surroundings: the code after the
    block does not run, and the writer is closed without a flush."""
    fake = FakeWriter()
    fake.hang["close"] = passes = anyio.Event()
    passes.set()  # close takes a checkpoint: shielded, the cancellation does not cut it
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
    fake = FakeWriter()
    async with anyio.create_task_group() as tg:
        handle = await start_sink_task(tg, fake, name="orders", flush_interval=NEVER)
        other = handle.clone()
        assert await handle.close()
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: other.write(batch(1)),
            lambda: other.begin(1),
            lambda: other.stage(1),
            lambda: other.discard(1),
            lambda: other.flush(),
            lambda: handle.begin(1),  # the closed handle itself
            lambda: handle.discard(1),
        ]
        for call in calls:
            with pytest.raises(ActorGoneError) as info:
                await call()
            assert info.value.actor == "orders"
        assert await handle.close()  # closing again is a no-op
        assert await other.close()
        assert handle.stats().finished
    assert fake.calls == [("open",), ("flush",), ("close",)]


async def test_released_handle_raises_actor_gone_naming_sink() -> None:
    async with sink(FakeWriter()) as handle:
        other = handle.clone()
        other.release()
        with pytest.raises(ActorGoneError) as info:
            await other.begin(1)
        assert info.value.actor == "orders"
        with pytest.raises(ActorGoneError):
            await other.discard(1)
        with pytest.raises(ActorGoneError):
            other.clone()
        await handle.begin(1)  # the task itself is fine
        assert handle.stats().discards == 0


async def test_reply_that_cannot_come_is_typed_error() -> None:
    fake = FakeWriter()
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
                asks.start_soon(ask, "queued begin", lambda: handle.begin(1))
                asks.start_soon(ask, "queued stage", lambda: handle.stage(1))
                await anyio.wait_all_tasks_blocked()
                runtime.cancel()  # the sink task dies with all three unanswered
            handle.release()
    assert sorted(errors) == ["being served", "queued begin", "queued stage"]
    assert all(isinstance(e, ActorGoneError) and e.actor == "orders" for e in errors.values())
    assert fake.calls == [("open",), ("flush",), ("flush cancelled",), ("close",)]
    assert handle.stats().finished


# --- handles and the inbox ---------------------------------------------------------------


async def test_handles_are_cheap_clones_of_one_task() -> None:
    fake = FakeWriter()
    async with sink(fake) as handle:
        other = handle.clone()
        assert (other.name, other.schema) == ("orders", SCHEMA)
        assert (handle.name, handle.schema) == ("orders", SCHEMA)
        await handle.begin(1)

        async def write_from_another_task() -> None:
            await other.write(batch(2, 3))
            await other.flush()

        await handle.write(batch(1))
        async with anyio.create_task_group() as tg:
            tg.start_soon(write_from_another_task)
        assert handle.stats() == other.stats()  # one task behind both
        assert await other.stage(1) is fake.staged[0]
        other.release()
        stats = handle.stats()
    assert [c for c in fake.calls if c[0] == "write"] == [("write", 1), ("write", 2)]
    assert (stats.batches_written, stats.rows_written, stats.name) == (2, 3, "orders")
    assert fake.staged[0].rows == 3


@pytest.mark.parametrize("capacity", [None, 1, 3])
async def test_inbox_is_bounded_default_128(capacity: int | None) -> None:
    fake = FakeWriter()
    fake.hang["write"] = release = anyio.Event()
    options: dict[str, Any] = {} if capacity is None else {"capacity": capacity}
    room = 128 if capacity is None else capacity
    with anyio.fail_after(scaled(5)):
        async with sink(fake, **options) as handle:
            await handle.begin(1)
            await handle.write(batch(1))
            await fake.entered_event("write").wait()  # the task is busy with it
            for _ in range(room):
                with anyio.fail_after(scaled(1)):
                    await handle.write(batch(1))  # fills the inbox without waiting
            with anyio.move_on_after(scaled(0.05)) as waited:
                await handle.write(batch(1))  # one more: waits for room
            assert waited.cancelled_caught
            done = anyio.Event()

            async def write_when_room() -> None:
                await handle.write(batch(1))
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


async def test_writer_failure_of_replying_commands_is_sink_connector_error() -> None:
    fake = FakeWriter()
    cases: list[tuple[str, int | None, Callable[[SinkTaskHandle], Awaitable[object]]]] = [
        ("begin", 2, lambda h: h.begin(2)),
        ("stage", 2, lambda h: h.stage(2)),
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
    assert (stats.open_epoch, stats.staged_epochs, stats.last_staged) == (None, 1, 2)
    assert (stats.flushes, stats.flush_errors) == (1, 0)  # only the explicit flush that worked
    assert fake.calls == [
        ("open",),
        ("begin", 2),
        ("begin", 2),
        ("stage", 2),
        ("stage", 2),
        ("flush",),
        ("flush",),
        ("flush",),
        ("close",),
    ]


# --- open, arguments ---------------------------------------------------------------------


async def test_open_failure_raises_from_start() -> None:
    fake = FakeWriter()
    fake.fail["open"] = 1
    with pytest.raises(SinkConnectorError) as info:
        async with sink(fake):
            pytest.fail("the body must not run")  # pragma: no cover
    assert (info.value.sink, info.value.operation, info.value.epoch) == ("orders", "open", None)
    assert info.value.__cause__ is fake.raised[0]
    assert info.value.cause is fake.raised[0]
    assert fake.calls == [("open",)]  # not closed: it never opened

    fake.fail["open"] = 1
    async with anyio.create_task_group() as tg:
        with pytest.raises(SinkConnectorError) as info:
            await start_sink_task(tg, fake, name="orders")
    assert (info.value.sink, info.value.operation) == ("orders", "open")
    assert fake.calls == [("open",), ("open",)]


async def test_the_task_is_named_for_its_sink() -> None:
    async with sink(FakeWriter()):
        names = [task.name for task in anyio.get_running_tasks()]
    assert "sink task orders" in names


SECONDS = "a finite number of seconds > 0"


class NoSchema(FakeWriter):
    @property
    def schema(self) -> pa.Schema:
        return "x: int32"  # type: ignore[return-value, unused-ignore]


@pytest.mark.parametrize(
    ("writer", "options", "error"),
    [
        (object, {}, ("writer", "a StagingWriter", "object")),
        (NoSchema, {}, ("writer.schema", "a pyarrow.Schema", "str")),
        (FakeWriter, {"name": ""}, ("name", "a non-empty str", "")),
        (FakeWriter, {"name": 3}, ("name", "a non-empty str", 3)),
        (FakeWriter, {"capacity": 0}, ("capacity", "an int >= 1", 0)),
        (FakeWriter, {"capacity": 1.5}, ("capacity", "an int >= 1", 1.5)),
        (FakeWriter, {"capacity": True}, ("capacity", "an int >= 1", True)),
        (FakeWriter, {"flush_interval": 0}, ("flush_interval", SECONDS, 0)),
        (FakeWriter, {"flush_interval": -1.0}, ("flush_interval", SECONDS, -1.0)),
        (FakeWriter, {"flush_interval": math.inf}, ("flush_interval", SECONDS, math.inf)),
        (FakeWriter, {"flush_interval": True}, ("flush_interval", SECONDS, True)),
        (FakeWriter, {"shutdown_timeout": 0}, ("shutdown_timeout", SECONDS, 0)),
    ],
)
async def test_bad_start_arguments_are_refused_with_what_was_expected_and_got(
    writer: Callable[[], Any], options: dict[str, Any], error: tuple[str, str, object]
) -> None:
    """Both entry points refuse a bad argument before opening anything, with a typed error
    naming the argument, what it accepts and what it got."""
    fake = writer()
    async with anyio.create_task_group() as tg:
        with pytest.raises(InvalidArgumentError) as info:
            await start_sink_task(tg, fake, **{"name": "orders", **options})
    assert (info.value.argument, info.value.expected, info.value.got) == error
    assert type(info.value) is InvalidArgumentError  # an argument of a call, not a ConfigError
    with pytest.raises(InvalidArgumentError) as info:
        if writer is NoSchema:  # the schema is read when the task starts
            task = SinkTask(fake, **{"name": "orders", **options})
            async with task:
                pass  # pragma: no cover
        else:
            SinkTask(fake, **{"name": "orders", **options})  # refused at the call
    assert (info.value.argument, info.value.expected, info.value.got) == error
    if isinstance(fake, FakeWriter):
        assert fake.calls == []  # refused before open


async def test_a_nan_interval_is_refused() -> None:
    async with anyio.create_task_group() as tg:
        with pytest.raises(InvalidArgumentError) as info:
            await start_sink_task(tg, FakeWriter(), name="orders", flush_interval=math.nan)
    assert (info.value.argument, info.value.expected) == ("flush_interval", SECONDS)
    assert math.isnan(info.value.got)


BATCH = "a pyarrow.RecordBatch"
EPOCH = f"an int epoch in 0..{MAX_EPOCH}"


async def test_bad_command_arguments_are_refused_with_what_was_expected_and_got() -> None:
    """Every command refuses a bad argument before it reaches the task, with a typed error
    naming the argument, what it accepts and what it got."""
    fake = FakeWriter()
    table = pa.table({"x": [1]})
    async with sink(fake) as handle:
        cases: list[tuple[tuple[str, str, object], Callable[[], Awaitable[object]]]] = [
            (("batch", BATCH, "list"), lambda: handle.write([1, 2])),  # type: ignore[arg-type]
            (("batch", BATCH, "Table"), lambda: handle.write(table)),  # type: ignore[arg-type]
            (("epoch", EPOCH, -1), lambda: handle.begin(-1)),
            (("epoch", EPOCH, 1.0), lambda: handle.begin(1.0)),  # type: ignore[arg-type]
            (("epoch", EPOCH, True), lambda: handle.begin(True)),
            (("epoch", EPOCH, MAX_EPOCH + 1), lambda: handle.begin(MAX_EPOCH + 1)),
            (("epoch", EPOCH, -1), lambda: handle.stage(-1)),
            (("epoch", EPOCH, "1"), lambda: handle.stage("1")),  # type: ignore[arg-type]
            (("epoch", EPOCH, -2), lambda: handle.discard(-2)),
            (("epoch", EPOCH, None), lambda: handle.discard(None)),  # type: ignore[arg-type]
            (("timeout", SECONDS, 0), lambda: handle.close(timeout=0)),
        ]
        for error, call in cases:
            with pytest.raises(InvalidArgumentError) as info:
                await call()
            assert type(info.value) is InvalidArgumentError
            assert (info.value.argument, info.value.expected, info.value.got) == error
        stats = handle.stats()
    assert (stats.write_errors, stats.discards, stats.finished) == (0, 0, False)
    assert fake.calls == [("open",), ("flush",), ("close",)]  # nothing reached the writer


# --- the epoch state machine against a model ---------------------------------------------


class SinkTaskMachine(RuleBasedStateMachine):
    """Every command's answer, the manifests staged, the task's counters and the writer's
    calls agree with a simple model of the rules after every step."""

    def __init__(self, backend: str) -> None:
        super().__init__()
        self._portal_cm = start_blocking_portal(backend)
        self.portal = self._portal_cm.__enter__()
        self.fake = FakeWriter()
        self._task_cm = self.portal.wrap_async_context_manager(sink(self.fake))
        self.handle: SinkTaskHandle = self._task_cm.__enter__()
        # The model.
        self.calls: list[tuple[Any, ...]] = [("open",)]
        self.last_begun: int | None = None
        self.open: int | None = None
        self.poisoned = False
        self.write_errors = 0
        self.batches = 0
        self.rows = 0
        self.epoch_rows = 0  # rows the writer accepted in the open epoch
        self.flushes = 0
        self.staged = 0
        self.last_staged = 0
        self.discards = 0
        self.discard_errors = 0

    def _run(self, call: Callable[[], Awaitable[object]]) -> tuple[type[BaseException] | None, Any]:
        async def run() -> tuple[type[BaseException] | None, Any]:
            with anyio.fail_after(scaled(5)):
                try:
                    result = await call()
                except (EpochPoisonedError, SinkEpochError, SinkConnectorError) as exc:
                    return type(exc), exc
                return None, result

        return self.portal.call(run)

    def _sync(self) -> None:
        """Round-trip a flush so that fire-and-forget commands were served."""
        assert self._run(self.handle.flush) == (None, None)
        self.calls.append(("flush",))
        self.flushes += 1

    def _pick(self, hint: int | None, choice: int, use_hint: bool) -> int:
        return hint if use_hint and hint is not None else choice

    @rule(choice=st.integers(0, 8), use_hint=st.booleans(), fail=st.booleans())
    def begin(self, choice: int, use_hint: bool, fail: bool) -> None:
        epoch = self._pick(
            None if self.last_begun is None else self.last_begun + 1, choice, use_hint
        )
        self.fake.fail["begin"] = int(fail)
        outcome, _ = self._run(lambda: self.handle.begin(epoch))
        self.fake.fail.clear()
        if (self.last_begun is not None and epoch <= self.last_begun) or self.open is not None:
            expected: type[BaseException] | None = SinkEpochError
        else:
            self.calls.append(("begin", epoch))
            if fail:
                expected = SinkConnectorError
            else:
                expected = None
                self.last_begun = self.open = epoch
                self.poisoned = False
                self.epoch_rows = 0
        assert outcome is expected

    @rule(kind=st.sampled_from(["ok", "fail", "wrong schema"]), rows=st.integers(0, 3))
    def write(self, kind: str, rows: int) -> None:
        self.fake.fail["write"] = int(kind == "fail")
        if kind == "wrong schema":
            wrong = pa.record_batch([pa.array(range(rows), pa.int64())], schema=OTHER_SCHEMA)
            with pytest.raises(SchemaMismatchError):
                self.portal.call(self.handle.write, wrong)
        else:
            self.portal.call(self.handle.write, batch(*range(rows)))
        if kind == "wrong schema" or self.open is None:
            failed = True
        else:
            self.calls.append(("write", rows))
            failed = kind == "fail"
        if failed:
            self.write_errors += 1
            self.poisoned = True
        else:
            self.batches += 1
            self.rows += rows
            self.epoch_rows += rows
        self._sync()
        self.fake.fail.clear()

    @rule(
        choice=st.integers(0, 8),
        use_hint=st.booleans(),
        outcome=st.sampled_from(["ok", "fail", "not a manifest", "another epoch"]),
    )
    def stage(self, choice: int, use_hint: bool, outcome: str) -> None:
        epoch = self._pick(self.open, choice, use_hint)
        self.fake.fail["stage"] = int(outcome == "fail")
        if outcome == "not a manifest":
            self.fake.returns[epoch] = {"writer": "w0", "epoch": epoch}
        elif outcome == "another epoch":
            self.fake.returns[epoch] = Manifest("w0", epoch + 1)
        staged_before = len(self.fake.staged)
        got, result = self._run(lambda: self.handle.stage(epoch))
        self.fake.fail.clear()
        self.fake.returns.clear()
        expected: type[BaseException] | None
        if self.poisoned:
            expected = EpochPoisonedError
        elif epoch != self.open:
            expected = SinkEpochError
        else:
            self.calls.append(("stage", epoch))
            if outcome != "ok":
                expected = SinkConnectorError
            else:
                expected = None
                self.open = None
                self.staged += 1
                self.last_staged = epoch
                assert len(self.fake.staged) == staged_before + 1
                assert result is self.fake.staged[-1]
                assert (result.epoch, result.rows) == (epoch, self.epoch_rows)
        assert got is expected
        if expected is not None:
            assert (result.sink, result.operation, result.epoch) == ("orders", "stage", epoch)

    @rule(choice=st.integers(0, 8), use_hint=st.booleans(), fail=st.booleans())
    def discard(self, choice: int, use_hint: bool, fail: bool) -> None:
        epoch = self._pick(self.open, choice, use_hint)
        self.fake.fail["discard"] = int(fail)
        self.portal.call(self.handle.discard, epoch)  # never raises
        self.calls.append(("discard", epoch))
        self.discards += 1
        self.discard_errors += int(fail)
        if self.open == epoch:
            self.open = None
        self._sync()
        self.fake.fail.clear()

    @invariant()
    def agrees_with_model(self) -> None:
        stats = self.portal.call(self.handle.stats)
        assert stats == SinkTaskStats(
            name="orders",
            batches_written=self.batches,
            rows_written=self.rows,
            write_errors=self.write_errors,
            epoch_poisoned=self.poisoned,
            flushes=self.flushes,
            flush_errors=0,
            stuck_flushes=0,
            open_epoch=self.open,
            staged_epochs=self.staged,
            last_staged=self.last_staged,
            discards=self.discards,
            discard_errors=self.discard_errors,
            finished=False,
        )
        assert self.fake.calls == self.calls

    def teardown(self) -> None:
        try:
            self._task_cm.__exit__(None, None, None)
            assert self.fake.calls == [*self.calls, ("flush",), ("close",)]
        finally:
            self._portal_cm.__exit__(None, None, None)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_epoch_state_machine_matches_model(backend: str) -> None:
    run_state_machine_as_test(
        lambda: SinkTaskMachine(backend),  # type: ignore[arg-type]
        settings=settings(max_examples=20, stateful_step_count=20, deadline=None),
    )


# --- the seed's defaults: a 5 s periodic flush, a 30 s close -----------------------------------


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
    fake = FakeWriter()
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
    fake = FakeWriter()
    fake.hang["flush"] = anyio.Event()
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            handle = await start_sink_task(tg, fake, name="orders")
            started = anyio.current_time()
            await fake.entered_event("flush").wait()  # at 5 s
            tg.start_soon(handle.begin, 1)  # queued behind the stuck flush
            await fake.entered_event("begin").wait()  # served once the flush was cut
            assert anyio.current_time() - started == pytest.approx(10.0, abs=1e-6)
            assert handle.stats().stuck_flushes == 1
            tg.cancel_scope.cancel()
    stuck = warnings_of(logs, "periodic sink flush timed out; the sink may be stuck")
    assert stuck[0]["timeout_s"] == 5.0


@virtual_clocks()
async def test_default_close_gives_up_after_30s() -> None:
    # sink_task.rs: close() waits 30 s for the task, then gives up (here: returns False and
    # warns, naming the sink; the task goes on closing in the background).
    fake = FakeWriter()
    fake.hang["close"] = anyio.Event()  # a writer that never closes
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
    fake = FakeWriter()
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
