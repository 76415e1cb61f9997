"""Loud API misuse (issue 24, item 3): a runtime call made without ``await`` is logged naming
the call and fails the runtime's exit, instead of exiting 0 with rows missing."""

from __future__ import annotations

import gc
from pathlib import Path

import anyio
import pyarrow as pa
import pytest
import structlog.testing
from _timeouts import scaled

from barrierflow.channels import Chunk
from barrierflow.errors import NotAwaitedError
from barrierflow.runtime import Runtime, RuntimeConfig, StreamActor
from barrierflow.runtime.state.table import StateTable

pytestmark = pytest.mark.anyio


def chunk(*ids: int) -> Chunk:
    return Chunk(pa.record_batch({"id": pa.array(ids, pa.int64())}))


def runtime(tmp_path: Path) -> Runtime:
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=3600.0))
    rt.add_source("events")
    rt.add_actor("forward", StreamActor, inputs=["events"])
    return rt


# Python's own warning about the collected coroutine comes too; the runtime's error is asserted.
never_awaited = pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")


@never_awaited
async def test_a_push_without_await_is_logged_naming_it_and_fails_the_exit(
    tmp_path: Path,
) -> None:
    rt = runtime(tmp_path)
    with (
        anyio.fail_after(scaled(30)),
        structlog.testing.capture_logs() as logs,
        pytest.raises(NotAwaitedError) as failed,
    ):
        async with rt:
            rt.push("events", chunk(1))  # type: ignore[unused-coroutine]
            gc.collect()
            await rt.push("events", chunk(2))
    assert failed.value.calls == ("rt.push('events', ...)",)
    assert "rt.push('events', ...) was called without `await`" in str(failed.value)
    errors = [e for e in logs if e["log_level"] == "error"]
    assert [e["call"] for e in errors] == ["rt.push('events', ...)"]


@never_awaited
async def test_a_checkpoint_without_await_fails_the_exit_too(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    with anyio.fail_after(scaled(30)), pytest.raises(NotAwaitedError, match=r"rt\.checkpoint"):
        async with rt:
            rt.checkpoint()  # type: ignore[unused-coroutine]
            gc.collect()


async def test_awaited_calls_and_started_tasks_are_not_reported(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    with anyio.fail_after(scaled(30)):
        async with rt:
            await rt.push("events", chunk(1))
            async with anyio.create_task_group() as tg:
                tg.start_soon(rt.checkpoint)
                tg.start_soon(rt.push, "events", chunk(2))
            assert await rt.checkpoint() > 0
    gc.collect()
    assert rt.unawaited_calls.calls == []


def test_state_table_reads_are_awaited_and_writes_are_not() -> None:
    """The rule of StateTable's docstring, checked on the class itself."""
    import inspect

    for name in ("get", "items"):
        assert inspect.iscoroutinefunction(getattr(StateTable, name)), name
    for name in ("put", "delete"):
        assert not inspect.iscoroutinefunction(getattr(StateTable, name)), name
    assert "reads are awaited, writes are not" in (StateTable.__doc__ or "")
