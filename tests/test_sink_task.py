"""The sink task: one test per rule of LaminarDB's sink_task.rs, on asyncio and trio."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import pyarrow as pa
import pytest
import structlog.testing

from barrierflow import (
    ActorGoneError,
    EpochPoisonedError,
    InvalidArgumentError,
    SchemaMismatchError,
    SinkConnectorError,
    SinkEpochError,
)
from barrierflow.actors import CommitMetadata, PendingCommit, SinkTask, start_sink_task

pytestmark = pytest.mark.anyio

SCHEMA = pa.schema([("x", pa.int32())])


def batch(*values: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array(values, pa.int32())], schema=SCHEMA)


class Fake:
    """A connector that records its calls and fails or hangs on cue."""

    def __init__(self, exactly_once: bool = True) -> None:
        self.exactly_once = exactly_once
        self.calls: list[tuple[Any, ...]] = []
        self.fail: dict[str, int] = {}  # method → failures left
        self.write_delay = 0.0
        self.hang_flush = False
        self.flushed: anyio.Event | None = None

    @property
    def schema(self) -> pa.Schema:
        return SCHEMA

    def _maybe_fail(self, method: str) -> None:
        if self.fail.get(method, 0):
            self.fail[method] -= 1
            raise OSError(f"{method} failed")

    async def open(self) -> None:
        self.calls.append(("open",))
        self._maybe_fail("open")

    async def recover(self, pending: Sequence[PendingCommit]) -> None:
        self.calls.append(("recover", tuple(p.epoch for p in pending)))

    async def begin_epoch(self, epoch: int) -> None:
        self._maybe_fail("begin_epoch")
        self.calls.append(("begin", epoch))

    async def write_batch(self, batch: pa.RecordBatch) -> None:
        if self.write_delay:
            await anyio.sleep(self.write_delay)
        self._maybe_fail("write_batch")
        self.calls.append(("write", batch.num_rows))

    async def flush(self) -> None:
        if self.hang_flush:
            await anyio.sleep_forever()
        self._maybe_fail("flush")
        self.calls.append(("flush",))
        if self.flushed is not None:
            self.flushed.set()

    async def pre_commit(self, epoch: int) -> CommitMetadata:
        self._maybe_fail("pre_commit")
        self.calls.append(("pre_commit", epoch))
        return {"epoch": epoch}

    async def commit_epoch(self, epoch: int) -> None:
        self._maybe_fail("commit_epoch")
        self.calls.append(("commit", epoch))

    async def rollback_epoch(self, epoch: int) -> None:
        self._maybe_fail("rollback_epoch")
        self.calls.append(("rollback", epoch))

    async def close(self) -> None:
        self._maybe_fail("close")
        self.calls.append(("close",))

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


def sink(connector: Fake, **kwargs: Any) -> SinkTask:
    kwargs.setdefault("flush_interval", 60.0)
    return SinkTask(connector, name="orders", **kwargs)


async def test_failed_write_increments_write_errors_and_poisons_epoch() -> None:
    fake = Fake()
    fake.fail["write_batch"] = 1
    async with sink(fake) as handle:
        await handle.begin_epoch(1)
        await handle.write_batch(batch(1))  # fire-and-forget: the failure is not raised here
        await handle.flush()  # a reply after the write: the write was served
        stats = handle.stats()
        assert stats.write_errors == 1
        assert stats.epoch_poisoned


async def test_poisoned_epoch_refuses_pre_commit_and_commit() -> None:
    fake = Fake()
    async with sink(fake) as handle:
        await handle.begin_epoch(1)
        await handle.write_batch(batch(1))
        await handle.pre_commit(1)  # epoch 1 pre-committed, waiting for its commit
        await handle.begin_epoch(2)
        fake.fail["write_batch"] = 1
        await handle.write_batch(batch(2))
        with pytest.raises(EpochPoisonedError) as pre:
            await handle.pre_commit(2)
        with pytest.raises(EpochPoisonedError) as commit:
            await handle.commit_epoch(1)
        assert (pre.value.sink, pre.value.operation, pre.value.epoch) == ("orders", "pre_commit", 2)
        assert commit.value.operation == "commit_epoch"
        assert commit.value.write_errors == 1
    assert ("pre_commit", 2) not in fake.calls
    assert ("commit", 1) not in fake.calls  # the connector never saw either


async def test_successful_begin_epoch_clears_poison() -> None:
    fake = Fake()
    fake.fail["write_batch"] = 1
    async with sink(fake) as handle:
        await handle.begin_epoch(1)
        await handle.write_batch(batch(1))
        await handle.rollback_epoch(1)
        await handle.begin_epoch(2)
        assert not handle.stats().epoch_poisoned
        await handle.write_batch(batch(2))
        assert await handle.pre_commit(2) == {"epoch": 2}
        await handle.commit_epoch(2)
    assert ("commit", 2) in fake.calls


async def test_failed_begin_epoch_keeps_poison() -> None:
    fake = Fake()
    fake.fail["write_batch"] = 1
    async with sink(fake) as handle:
        await handle.begin_epoch(1)
        await handle.write_batch(batch(1))
        await handle.rollback_epoch(1)
        fake.fail["begin_epoch"] = 1
        with pytest.raises(SinkConnectorError) as info:
            await handle.begin_epoch(2)
        assert info.value.operation == "begin_epoch"
        assert isinstance(info.value.__cause__, OSError)
        assert handle.stats().epoch_poisoned
        with pytest.raises(EpochPoisonedError):
            await handle.pre_commit(2)


async def test_schema_mismatch_names_both_schemas_and_poisons_epoch() -> None:
    async with sink(Fake()) as handle:
        await handle.begin_epoch(1)
        wrong = pa.record_batch([pa.array([1], pa.int64())], names=["x"])
        with pytest.raises(SchemaMismatchError) as info:
            await handle.write_batch(wrong)
        assert info.value.expected_schema == SCHEMA
        assert info.value.actual_schema == wrong.schema
        with pytest.raises(EpochPoisonedError):
            await handle.pre_commit(1)
        assert handle.stats().write_errors == 1


async def test_write_outside_an_epoch_poisons_only_an_exactly_once_sink() -> None:
    async with sink(Fake(exactly_once=True)) as handle:
        await handle.write_batch(batch(1))
        await handle.flush()
        assert handle.stats().epoch_poisoned
    loose = Fake(exactly_once=False)
    async with sink(loose) as handle:
        await handle.write_batch(batch(1))
        await handle.flush()
        assert not handle.stats().epoch_poisoned
    assert ("write", 1) in loose.calls


async def test_epoch_commands_out_of_order_are_refused() -> None:
    async with sink(Fake()) as handle:
        with pytest.raises(SinkEpochError) as info:
            await handle.pre_commit(1)  # nothing begun
        assert (info.value.sink, info.value.operation) == ("orders", "pre_commit")
        await handle.begin_epoch(5)
        with pytest.raises(SinkEpochError):
            await handle.begin_epoch(6)  # epoch 5 still open
        with pytest.raises(SinkEpochError):
            await handle.pre_commit(4)  # not the open epoch
        await handle.pre_commit(5)
        with pytest.raises(SinkEpochError):
            await handle.begin_epoch(5)  # not increasing
        await handle.begin_epoch(6)
        await handle.pre_commit(6)
        with pytest.raises(SinkEpochError) as order:
            await handle.commit_epoch(6)  # 5 first
        assert "5" in order.value.expected
        with pytest.raises(SinkEpochError):
            await handle.commit_epoch(9)  # never pre-committed
        await handle.commit_epoch(5)
        await handle.commit_epoch(6)
        assert handle.stats().committed_epoch == 6


async def test_periodic_flush_runs_every_interval() -> None:
    fake = Fake()
    async with sink(fake, flush_interval=0.05) as handle:
        await anyio.sleep(0.33)
        flushes = handle.stats().flushes
    assert 4 <= flushes <= 7


async def test_first_immediate_tick_is_skipped() -> None:
    fake = Fake()
    fake.flushed = anyio.Event()
    async with sink(fake, flush_interval=0.2):
        started = anyio.current_time()
        with anyio.fail_after(2):
            await fake.flushed.wait()
        assert anyio.current_time() - started >= 0.19


async def test_missed_ticks_are_skipped_not_bursted() -> None:
    fake = Fake()
    fake.write_delay = 0.35  # one command spans about seven ticks of 0.05 s
    async with sink(fake, flush_interval=0.05) as handle:
        await handle.begin_epoch(1)
        await handle.write_batch(batch(1))
        await handle.pre_commit(1)  # answered once the slow write is done
        after_write = handle.stats().flushes
        await anyio.sleep(0.02)
        assert handle.stats().flushes - after_write <= 1  # one catch-up tick, not seven


async def test_stuck_flush_is_reported_and_the_task_keeps_serving() -> None:
    fake = Fake()
    fake.hang_flush = True
    with structlog.testing.capture_logs() as logs:
        async with sink(fake, flush_interval=0.05, shutdown_timeout=0.05) as handle:
            with anyio.fail_after(2):
                while handle.stats().stuck_flushes == 0:  # noqa: ASYNC110 - a counter
                    await anyio.sleep(0.01)
                await handle.begin_epoch(1)  # still served
                assert await handle.pre_commit(1) == {"epoch": 1}
    stuck = [e for e in logs if "stuck" in e["event"]]
    assert stuck
    assert stuck[0]["sink"] == "orders"


async def test_rollback_is_fire_and_forget_and_its_failure_is_logged() -> None:
    fake = Fake()
    fake.fail["rollback_epoch"] = 1
    with structlog.testing.capture_logs() as logs:
        async with sink(fake) as handle:
            await handle.begin_epoch(1)
            await handle.rollback_epoch(1)  # does not raise
            await handle.flush()
            assert handle.stats().rollback_errors == 1
            await handle.begin_epoch(2)  # the rolled-back epoch no longer blocks
    assert any(e["event"] == "sink rollback failed" and e["epoch"] == 1 for e in logs)


async def test_releasing_the_last_handle_flushes_then_closes() -> None:
    fake = Fake()
    async with anyio.create_task_group() as tg:
        handle = await start_sink_task(tg, fake, name="orders", flush_interval=60.0)
        other = handle.clone()
        handle.release()
        await other.flush()  # still open: one handle remains
        assert "close" not in fake.names()
        other.release()
    assert fake.names()[-2:] == ["flush", "close"]


async def test_explicit_close_waits_and_times_out() -> None:
    fake = Fake()
    async with anyio.create_task_group() as tg:
        handle = await start_sink_task(tg, fake, name="orders", flush_interval=60.0)
        assert await handle.close()
        assert fake.names()[-2:] == ["flush", "close"]
        assert handle.stats().finished
    stuck = Fake()
    stuck.hang_flush = True
    async with anyio.create_task_group() as tg:
        handle = await start_sink_task(
            tg, stuck, name="orders", flush_interval=60.0, shutdown_timeout=5.0
        )
        with anyio.fail_after(2):
            assert not await handle.close(timeout=0.05)
        tg.cancel_scope.cancel()


async def test_shutdown_flush_and_close_errors_are_logged() -> None:
    fake = Fake()
    fake.fail["flush"] = 1
    fake.fail["close"] = 1
    with structlog.testing.capture_logs() as logs:
        async with sink(fake):
            pass
    events = [e["event"] for e in logs]
    assert "sink flush failed at shutdown" in events
    assert "sink close failed" in events


async def test_handle_after_close_raises_actor_gone_naming_the_sink() -> None:
    async with anyio.create_task_group() as tg:
        handle = await start_sink_task(tg, Fake(), name="orders", flush_interval=60.0)
        other = handle.clone()
        await handle.close()
        for call in (other.begin_epoch(1), other.write_batch(batch(1)), other.pre_commit(1)):
            with pytest.raises(ActorGoneError) as info:
                await call
            assert info.value.actor == "orders"
        assert await handle.close()  # closing again is a no-op


async def test_a_reply_that_cannot_come_is_a_typed_error() -> None:
    fake = Fake()
    fake.hang_flush = True
    async with anyio.create_task_group() as tg:
        handle = await start_sink_task(tg, fake, name="orders", flush_interval=60.0)

        async def cancel_soon() -> None:
            await anyio.sleep(0.05)
            tg.cancel_scope.cancel()  # the task dies with the flush unanswered

        tg.start_soon(cancel_soon)
        with (
            anyio.CancelScope(shield=True),
            anyio.fail_after(2),
            pytest.raises(ActorGoneError) as info,
        ):
            await handle.flush()
    assert info.value.actor == "orders"


async def test_handles_are_cheap_clones_of_one_task() -> None:
    fake = Fake(exactly_once=False)
    async with sink(fake) as handle:
        other = handle.clone()
        await handle.write_batch(batch(1))
        await other.write_batch(batch(2, 3))
        await other.flush()
        other.release()
    assert [c for c in fake.calls if c[0] == "write"] == [("write", 1), ("write", 2)]


async def test_the_inbox_is_bounded_at_128_by_default() -> None:
    fake = Fake(exactly_once=False)
    fake.write_delay = 10.0
    async with anyio.create_task_group() as tg:
        handle = await start_sink_task(tg, fake, name="orders", flush_interval=60.0)
        queued = 0
        with anyio.move_on_after(0.3):
            while True:
                await handle.write_batch(batch(1))
                queued += 1
        # One write is being served, 128 wait in the inbox; the next one waited.
        assert queued == 129
        tg.cancel_scope.cancel()


async def test_connector_failures_of_replying_commands_are_sink_connector_errors() -> None:
    fake = Fake()
    async with sink(fake) as handle:
        await handle.begin_epoch(1)
        fake.fail["pre_commit"] = 1
        with pytest.raises(SinkConnectorError) as info:
            await handle.pre_commit(1)
        assert (info.value.sink, info.value.operation, info.value.epoch) == (
            "orders",
            "pre_commit",
            1,
        )
        assert handle.stats().open_epoch == 1  # still open, to be rolled back
        await handle.pre_commit(1)
        fake.fail["commit_epoch"] = 1
        with pytest.raises(SinkConnectorError):
            await handle.commit_epoch(1)
        assert handle.stats().pre_committed == (1,)  # still pending: commit can be retried
        await handle.commit_epoch(1)


async def test_open_failure_is_raised_from_start() -> None:
    fake = Fake()
    fake.fail["open"] = 1
    with pytest.raises(SinkConnectorError) as info:
        async with sink(fake):
            pass
    assert info.value.operation == "open"


async def test_recover_must_come_before_the_first_epoch() -> None:
    fake = Fake()
    async with sink(fake) as handle:
        await handle.recover([PendingCommit(3, {"files": []})])
        assert handle.stats().committed_epoch == 3
        await handle.begin_epoch(4)
        with pytest.raises(SinkEpochError):
            await handle.recover([])
    assert ("recover", (3,)) in fake.calls


async def test_bad_arguments_are_refused_naming_them() -> None:
    async with anyio.create_task_group() as tg:
        for kwargs, argument in [
            ({"capacity": 0}, "capacity"),
            ({"flush_interval": 0}, "flush_interval"),
            ({"flush_interval": float("nan")}, "flush_interval"),
            ({"name": ""}, "name"),
        ]:
            options: dict[str, Any] = {"name": "orders", **kwargs}
            with pytest.raises(InvalidArgumentError) as info:
                await start_sink_task(tg, Fake(), **options)
            assert info.value.argument == argument
        with pytest.raises(InvalidArgumentError) as info:
            await start_sink_task(tg, object(), name="x")  # type: ignore[arg-type]
        assert info.value.argument == "connector"
        handle = await start_sink_task(tg, Fake(), name="orders", flush_interval=60.0)
        with pytest.raises(InvalidArgumentError) as info:
            await handle.write_batch([1, 2])  # type: ignore[arg-type]
        assert info.value.argument == "batch"
        with pytest.raises(InvalidArgumentError) as info:
            await handle.begin_epoch(-1)
        assert info.value.argument == "epoch"
        handle.release()
