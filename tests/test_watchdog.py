"""No hang without a name: a barrier an actor holds is named, with the actor, in a warning, in
``checkpoint(timeout=...)`` and when leaving ``async with`` (issue 24, item 1)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pytest
import structlog.testing
from _timeouts import scaled

from barrierflow.actors import add_sink
from barrierflow.channels import Barrier, Chunk, Message
from barrierflow.errors import (
    ActorFailedError,
    BarrierNotPassedError,
    BarrierStuckError,
    ConfigError,
)
from barrierflow.runtime import ActorContext, Runtime, RuntimeConfig, StreamActor
from barrierflow.testing import ListTable

pytestmark = pytest.mark.anyio


def chunk(*ids: int) -> Chunk:
    return Chunk(pa.record_batch({"id": pa.array(ids, pa.int64())}))


class Swallow(StreamActor):
    """Forgets to pass barriers on: emits rows only."""

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk):
            await ctx.emit(message)


class KeepsFirstBarrier(StreamActor):
    """Passes barriers on, then from its second one keeps it and reads on without passing it."""

    def __init__(self) -> None:
        self.seen = 0

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Barrier):
            self.seen += 1
            if self.seen > 1:
                return
        await ctx.emit(message)


class Blocked(StreamActor):
    """Passes its first barrier, then blocks in its own code on the second one."""

    def __init__(self) -> None:
        self.barriers = 0

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Barrier):
            self.barriers += 1
            if self.barriers == 2:
                await anyio.sleep_forever()
        await ctx.emit(message)


def runtime(tmp_path: Path, middle: type[StreamActor], **config: object) -> Runtime:
    settings: dict[str, object] = {"barrier_interval": 3600.0}  # barriers only on demand
    settings.update(config)
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", **settings))  # type: ignore[arg-type]
    rt.add_source("events")
    rt.add_actor("middle", middle, inputs=["events"])
    rt.add_actor("after", StreamActor, inputs=["middle"])
    return rt


async def test_an_actor_that_emits_rows_without_passing_its_first_barrier_is_named(
    tmp_path: Path,
) -> None:
    rt = runtime(tmp_path, Swallow)
    with anyio.fail_after(scaled(30)), pytest.raises(ActorFailedError) as failed:
        async with rt:
            await rt.push("events", chunk(1, 2))
            await rt.checkpoint()
    assert failed.value.actor == "middle"
    assert isinstance(failed.value.cause, BarrierNotPassedError)
    assert failed.value.cause.actor == "middle"
    assert "actor 'middle' emitted rows before passing on its first barrier" in str(
        failed.value.cause
    )


async def test_an_actor_that_keeps_a_barrier_and_emits_rows_past_it_is_named_not_its_downstream(
    tmp_path: Path,
) -> None:
    rt = runtime(tmp_path, KeepsFirstBarrier, barrier_interval=0.05, stop_timeout=scaled(0.5))
    with anyio.fail_after(scaled(30)), pytest.raises(BarrierStuckError):
        async with rt:
            # The initial barrier went through; every later one is kept while rows go on.
            with pytest.raises(BarrierStuckError) as held:
                await rt.checkpoint(timeout=scaled(0.5))
            await rt.push("events", chunk(1))
    assert held.value.culprits == ("middle",)
    assert held.value.waiting == ("after",)
    assert rt.stats().actors["after"].rows_in == 1  # its rows went on; its barriers did not


async def test_checkpoint_with_a_timeout_names_the_actor_holding_the_barrier(
    tmp_path: Path,
) -> None:
    rt = runtime(tmp_path, Blocked, stop_timeout=scaled(1.0))
    timeout = scaled(0.5)
    with pytest.raises(BarrierStuckError) as stuck:  # the exit's deadline, below
        async with rt:
            started = anyio.current_time()
            with pytest.raises(BarrierStuckError) as held:
                await rt.checkpoint(timeout=timeout)
            assert anyio.current_time() - started < timeout + scaled(5)
            error = held.value
            assert error.culprits == ("middle",)
            assert error.waiting == ("after",)
            assert "'middle' (busy in its own code" in str(error)
    # Leaving ``async with`` does not hang either: it fails with the same typed error.
    assert stuck.value.culprits == ("middle",)


async def test_leaving_async_with_past_stop_timeout_fails_naming_the_actor(
    tmp_path: Path,
) -> None:
    rt = runtime(tmp_path, Blocked, stop_timeout=scaled(0.5))
    with anyio.fail_after(scaled(30)), pytest.raises(BarrierStuckError) as stuck:
        async with rt:
            await rt.push("events", chunk(1))
    assert stuck.value.culprits == ("middle",)
    assert "downstream still waiting: ['after']" in str(stuck.value)


async def test_the_watchdog_warns_once_per_doubling_naming_the_actor(tmp_path: Path) -> None:
    rt = runtime(
        tmp_path,
        Blocked,
        barrier_interval=0.05,
        stuck_barrier_intervals=2,
        stop_timeout=scaled(0.5),
    )
    counted = CountStuckWarnings(4)
    with structlog.testing.capture_logs([counted]) as logs, pytest.raises(BarrierStuckError):
        async with rt:
            with anyio.fail_after(scaled(30)):
                await counted.enough.wait()
    warnings = stuck_warnings(logs)
    assert all(w["culprits"] == ["middle"] for w in warnings)
    assert "'middle' (busy in its own code" in str(warnings[0]["event"])
    # Not once per check (every 0.05 s): each warning waits for the wait to double.
    waits = [float(str(w["waited_s"])) for w in warnings]
    assert waits[0] >= 0.1
    assert all(later >= 2 * earlier - 0.001 for earlier, later in itertools.pairwise(waits))


def is_stuck_warning(entry: Mapping[str, object]) -> bool:
    return entry["log_level"] == "warning" and str(entry["event"]).startswith("barrier of epoch")


def stuck_warnings(logs: list[dict[str, object]]) -> list[dict[str, object]]:
    return [e for e in logs if is_stuck_warning(e)]


class CountStuckWarnings:
    """A structlog processor that sets :attr:`enough` once ``n`` stuck-barrier warnings went by."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.enough = anyio.Event()

    def __call__(self, _logger: object, method: str, entry: MutableMapping[str, Any]) -> Any:
        if method == "warning" and str(entry["event"]).startswith("barrier of epoch"):
            self.n -= 1
            if self.n <= 0:
                self.enough.set()
        return entry


def test_the_new_deadlines_are_checked_when_the_config_is_made(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="stop_timeout"):
        RuntimeConfig(state_path=tmp_path / "s.db", stop_timeout=0)
    with pytest.raises(ConfigError, match="stuck_barrier_intervals"):
        RuntimeConfig(state_path=tmp_path / "s.db", stuck_barrier_intervals=0)


async def test_checkpoint_refuses_a_bad_timeout(tmp_path: Path) -> None:
    rt = runtime(tmp_path, StreamActor)
    async with rt:
        with pytest.raises(ConfigError, match="timeout"):
            await rt.checkpoint(timeout=-1)
        assert await rt.checkpoint(timeout=scaled(30)) > 0


async def test_an_actor_waiting_on_its_input_with_a_barrier_kept_is_named_as_such(
    tmp_path: Path,
) -> None:
    rt = runtime(tmp_path, KeepsFirstBarrier)
    # (Leaving fails too: the actor keeps the Stop as well and finishes once its input ends.)
    with pytest.raises(BarrierStuckError):
        async with rt:
            with pytest.raises(BarrierStuckError) as held:
                await rt.checkpoint(timeout=scaled(0.5))
            assert held.value.culprits == ("middle",)
            assert "'middle' (waiting on input 'events' after reading the barrier)" in str(
                held.value
            )


async def test_a_stop_an_actor_finished_without_passing_on_fails_the_exit_naming_it(
    tmp_path: Path,
) -> None:
    # The actor keeps every barrier after the first, the Stop too, and finishes once the
    # source's Stop ends its input: every actor finished, yet the sink never got the Stop, so
    # the two acknowledged rows behind it were never committed. Leaving right after the push
    # must say so, not exit cleanly (nor wait for the stop timeout to say it).
    rt = runtime(tmp_path, KeepsFirstBarrier, stop_timeout=scaled(60))
    table = ListTable(pa.schema([("id", pa.int64())]))
    add_sink(rt, "out", table, input="middle")
    with anyio.fail_after(scaled(30)), pytest.raises(BarrierStuckError) as stuck:
        async with rt:
            await rt.push("events", chunk(1, 2))
    assert stuck.value.culprits == ("middle",)
    assert set(stuck.value.waiting) == {"after", "out"}
    assert stuck.value.waited < scaled(60)  # said at once, not at the stop timeout
    assert "'middle' (finished without passing it on)" in str(stuck.value)
    assert table.committed == {}  # what the error stands for
