"""The runtime: graph validation, barriers and checkpoints, supervision, recovery, embedding."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import anyio
import pyarrow as pa
import pytest
import structlog
import structlog.testing
from _timeouts import scaled

from barrierflow.channels import Barrier, BarrierKind, Chunk, Message, Pause, Stop
from barrierflow.errors import (
    ActorFailedError,
    ActorGoneError,
    ConfigError,
    GraphError,
    InvalidArgumentError,
)
from barrierflow.runtime import (
    ActorContext,
    BlockingRuntime,
    Fanout,
    Runtime,
    RuntimeConfig,
    StateStore,
    StreamActor,
    configure_logging,
    open_command_actor,
    serve_commands,
)

pytestmark = pytest.mark.anyio


def chunk(*ids: int) -> Chunk:
    return Chunk(pa.record_batch({"id": pa.array(ids, pa.int64())}))


class Counter(StreamActor):
    """Counts visible rows in a state table; remembers the barriers it saw."""

    def __init__(self) -> None:
        self.barriers: list[Barrier] = []

    async def restore(self, ctx: ActorContext) -> None:
        self.table = ctx.table("count")
        self.rows = await self.table.get("rows", 0)

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk):
            self.rows += message.cardinality
            self.table.put("rows", self.rows)
        elif isinstance(message, Barrier):
            self.barriers.append(message)
        await ctx.emit(message)


class FailOn(StreamActor):
    """Raises when it sees id ``bad`` (mid-epoch), at most ``times`` times overall."""

    failures = 0

    def __init__(self, bad: int, times: int = 1_000) -> None:
        self.bad = bad
        self.times = times

    async def process(self, message: Message, ctx: ActorContext) -> None:
        ids = message.batch.column("id").to_pylist() if isinstance(message, Chunk) else []
        if self.bad in ids and FailOn.failures < self.times:
            FailOn.failures += 1
            raise RuntimeError(f"bad row {self.bad}")
        await ctx.emit(message)


def config(tmp_path: Path, **kwargs: object) -> RuntimeConfig:
    return RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=60.0, **kwargs)  # type: ignore[arg-type]


async def read(tmp_path: Path, owner: str) -> object:
    async with await StateStore.open(tmp_path / "state.db") as store:
        return await store.read(owner, "count", "rows")


async def test_checkpoint_returns_once_state_is_durable(tmp_path: Path) -> None:
    rt = Runtime(config(tmp_path))
    rt.add_source("src", fanout=Fanout("hash", ("id",)))
    rt.add_actor("left", Counter, inputs=["src"])
    rt.add_actor("right", Counter, inputs=["src"])
    rt.add_actor("sink", Counter, inputs=["left", "right"])
    async with rt:
        for i in range(10):
            await rt.push("src", chunk(*range(i * 10, i * 10 + 10)))
        epoch = await rt.checkpoint()
        assert rt.committed_epoch == epoch
        stats = rt.stats()
        assert stats.actors["sink"].rows_in == 100
        assert stats.actors["left"].rows_in + stats.actors["right"].rows_in == 100
        assert stats.channels["src inbox"].rows_sent == 100
        assert stats.committed_epoch == epoch
    assert await read(tmp_path, "sink") == 100


async def test_barriers_complete_in_epoch_order_and_every_kth_is_checkpoint(
    tmp_path: Path,
) -> None:
    seen: list[Counter] = []

    def factory() -> Counter:
        seen.append(Counter())
        return seen[-1]

    rt = Runtime(config(tmp_path, checkpoint_frequency=3))
    rt.add_source("src")
    rt.add_actor("count", factory, inputs=["src"])
    async with rt:
        for _ in range(7):
            await rt.mutate(Pause())  # an injected barrier each, frequency decides the kind
    kinds = [b.kind for b in seen[0].barriers]
    assert kinds[0] is BarrierKind.INITIAL
    assert kinds[1:8] == [
        BarrierKind.CHECKPOINT if i % 3 == 0 else BarrierKind.BARRIER for i in range(1, 8)
    ]
    # The mutation rides the barrier injected for it.
    assert [b.mutation for b in seen[0].barriers[1:8]] == [Pause()] * 7
    epochs = [b.epoch.curr for b in seen[0].barriers]
    assert epochs == sorted(epochs)
    assert all(
        b.epoch.prev == a.epoch.curr
        for a, b in zip(seen[0].barriers, seen[0].barriers[1:], strict=False)
    )


async def test_in_flight_bound_holds_injection(tmp_path: Path) -> None:
    gate = anyio.Event()

    class Slow(StreamActor):
        async def process(self, message: Message, ctx: ActorContext) -> None:
            if isinstance(message, Barrier) and message.kind is not BarrierKind.INITIAL:
                await gate.wait()
            await ctx.emit(message)

    rt = Runtime(config(tmp_path, max_in_flight=2))
    rt.add_source("src")
    rt.add_actor("slow", Slow, inputs=["src"])
    async with rt:
        injected = 0

        async def inject() -> None:
            nonlocal injected
            await rt.checkpoint()
            injected += 1

        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(inject)
            await anyio.wait_all_tasks_blocked()
            assert rt.stats().barriers_in_flight == 2  # the other two are held back
            gate.set()
        assert injected == 4


async def test_failing_actor_stops_graph_and_is_named(tmp_path: Path) -> None:
    FailOn.failures = 0
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    rt.add_actor("checker", lambda: FailOn(13), inputs=["src"])
    with pytest.raises(ActorFailedError) as info:
        async with rt:
            await rt.push("src", chunk(1, 13))
            await rt.checkpoint()
    assert info.value.actor == "checker"
    assert info.value.actor_id == rt.actor_id("checker")
    assert isinstance(info.value.cause, RuntimeError)
    assert isinstance(info.value.__cause__, RuntimeError)


async def test_recovery_rebuilds_from_last_checkpoint(tmp_path: Path) -> None:
    FailOn.failures = 0
    rt = Runtime(config(tmp_path, recovery=True, max_restarts=2, restart_backoff=0.01))
    rt.add_source("src")
    rt.add_actor("count", Counter, inputs=["src"])
    rt.add_actor("checker", lambda: FailOn(13, times=1), inputs=["count"])
    async with rt:
        await rt.push("src", chunk(1, 2, 3))
        await rt.checkpoint()
        await rt.push("src", chunk(4, 13))  # counted by "count" (uncommitted), then fails
        with pytest.raises(ActorFailedError):
            await rt.checkpoint()
        # The graph was rebuilt from the checkpoint: the 2 uncommitted rows are forgotten.
        await rt.push("src", chunk(4, 13))  # the driver replays; no failure this time
        await rt.checkpoint()
        assert rt.stats().restarts == 1
    assert await read(tmp_path, "count") == 5


async def test_restarts_are_bounded(tmp_path: Path) -> None:
    FailOn.failures = 0
    rt = Runtime(config(tmp_path, recovery=True, max_restarts=1, restart_backoff=0.01))
    rt.add_source("src")
    rt.add_actor("checker", lambda: FailOn(13), inputs=["src"])
    with pytest.raises(ActorFailedError):
        async with rt:
            for _ in range(3):
                with pytest.raises(ActorFailedError):
                    await rt.push("src", chunk(13))
                    await rt.checkpoint()
            await anyio.sleep_forever()
    assert rt.stats().restarts == 1


async def test_committed_epochs_are_published(tmp_path: Path) -> None:
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    async with rt:
        epochs = rt.committed_epochs()
        first = await epochs.__anext__()
        durable = await rt.checkpoint()
        assert first < durable
        assert await epochs.__anext__() == durable


async def test_restart_resumes_at_committed_epoch(tmp_path: Path) -> None:
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    rt.add_actor("count", Counter, inputs=["src"])
    async with rt:
        await rt.push("src", chunk(1, 2))
    committed = rt.committed_epoch
    seen: list[Counter] = []
    again = Runtime(config(tmp_path))
    again.add_source("src")
    again.add_actor("count", lambda: seen.append(Counter()) or seen[-1], inputs=["src"])
    async with again:
        assert again.committed_epoch == committed
        await again.checkpoint()
    assert seen[0].barriers[0].epoch.prev == committed
    assert seen[0].rows == 2


async def test_a_clean_exit_commits_the_final_checkpoint_even_when_the_commit_is_slow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The actors finish as soon as they pass the Stop barrier, while its commit is still
    # ahead: the runtime must let that commit finish instead of cancelling it. The commit
    # holds until the actor finished and the runtime did all it does about that (every other
    # task waits): a runtime that cancels the commit then cancels it here.
    commit = StateStore.commit
    finished = anyio.Event()

    class FinishingCounter(Counter):
        async def run(self, ctx: ActorContext) -> None:
            await super().run(ctx)
            finished.set()

    async def slow_commit(self: StateStore, epoch: int) -> None:
        await finished.wait()
        await anyio.wait_all_tasks_blocked()
        await commit(self, epoch)

    monkeypatch.setattr(StateStore, "commit", slow_commit)
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    rt.add_actor("count", FinishingCounter, inputs=["src"])
    with anyio.fail_after(scaled(20)):
        async with rt:
            await rt.push("src", chunk(1, 2, 3))
        async with await StateStore.open(tmp_path / "state.db") as store:
            assert await store.read_all("count", "count") == {"rows": 3}


async def test_a_source_stopped_by_a_stop_mutation_ends_its_downstream_and_the_exit(
    tmp_path: Path,
) -> None:
    # The counter's input ends when its only source stops: it finishes too, and no later
    # barrier (the exit's final checkpoint) waits for either of them.
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    rt.add_actor("count", Counter, inputs=["src"])
    with anyio.fail_after(scaled(10)):
        async with rt:
            await rt.push("src", chunk(1, 2))
            await rt.mutate(Stop(frozenset({rt.actor_id("src")})))
        async with await StateStore.open(tmp_path / "state.db") as store:
            assert await store.read_all("count", "count") == {"rows": 2}


def test_blocking_handle_from_a_plain_thread(tmp_path: Path) -> None:
    results: dict[str, object] = {}

    def driver(backend: str) -> None:
        rt = Runtime(config(tmp_path / backend))
        rt.add_source("src")
        rt.add_actor("count", Counter, inputs=["src"])
        with BlockingRuntime(rt, backend=backend) as handle:  # type: ignore[arg-type]
            handle.push("src", chunk(1, 2, 3))
            results[backend] = handle.checkpoint() == handle.committed_epoch
            results[backend + "-rows"] = handle.stats().actors["count"].rows_in

    for backend in ("asyncio", "trio"):
        (tmp_path / backend).mkdir()
        thread = threading.Thread(target=driver, args=(backend,))
        thread.start()
        thread.join(timeout=scaled(60))
        assert results[backend] is True
        assert results[backend + "-rows"] == 3


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"barrier_interval": 0}, "barrier_interval"),
        ({"barrier_interval": -1.0}, "barrier_interval"),
        ({"checkpoint_frequency": 0}, "checkpoint_frequency"),
        ({"max_in_flight": 0}, "max_in_flight"),
        ({"restart_backoff": 0}, "restart_backoff"),
        ({"max_restarts": -1}, "max_restarts"),
    ],
)
def test_config_out_of_range_is_rejected(kwargs: dict[str, object], argument: str) -> None:
    with pytest.raises(ConfigError) as info:
        RuntimeConfig(state_path="x.db", **kwargs)  # type: ignore[arg-type]
    assert info.value.argument == argument


def test_bad_graphs_are_rejected() -> None:
    rt = Runtime(RuntimeConfig(state_path="unused.db"))
    rt.add_source("src")
    rt.add_actor("a", Counter, inputs=["src"])
    with pytest.raises(GraphError) as twice:
        rt.connect("src", "a")
    assert twice.value.argument == "edge"
    rt.add_actor("b", Counter, inputs=["a"])
    with pytest.raises(GraphError) as cycle:
        rt.connect("b", "a")  # refused when declared, not when the runtime starts
    assert (cycle.value.argument, cycle.value.got) == ("graph", "b -> a -> b")
    assert rt._graph.nodes["a"].inputs == ["src"]
    rt._graph.nodes["a"].inputs.append("b")  # a cycle smuggled past connect()
    with pytest.raises(GraphError) as validated:
        rt._graph.validate()
    assert "a -> b -> a" in str(validated.value.got)
    lonely = Runtime(RuntimeConfig(state_path="unused.db"))
    lonely.add_source("src")
    lonely.add_actor("x", Counter, inputs=["src"])
    lonely._graph.nodes["x"].inputs.clear()
    with pytest.raises(GraphError) as no_input:
        lonely._graph.validate()
    assert no_input.value.argument == "inputs"


async def test_mutation_naming_unknown_actor_is_rejected(tmp_path: Path) -> None:
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    async with rt:
        with pytest.raises(InvalidArgumentError) as info:
            await rt.mutate(Stop(frozenset({99})))
        assert info.value.got == [99]


async def test_command_actor_answers_asks_and_reports_gone() -> None:
    class Doubler:
        async def handle(self, request: int) -> int:
            if request < 0:
                raise ValueError("negative")
            return request * 2

    ref, inbox = open_command_actor("doubler", capacity=4)
    async with anyio.create_task_group() as tg:
        tg.start_soon(serve_commands, "doubler", Doubler(), inbox)
        assert await ref.ask(21) == 42
        with pytest.raises(ValueError, check=lambda e: type(e) is ValueError):  # Doubler's error
            await ref.ask(-1)
        await ref.tell(-1)  # logged, not raised
        assert await ref.ask(1) == 2
        tg.cancel_scope.cancel()
    with pytest.raises(ActorGoneError) as info:
        await ref.ask(1)
    assert info.value.actor == "doubler"
    ref.close()
    with pytest.raises(ActorGoneError):
        await ref.tell(1)


RUNTIME_CHILD = """
import sys, anyio, pyarrow as pa
sys.path.insert(0, sys.argv[3])
from test_runtime import Counter
from barrierflow.channels import Chunk
from barrierflow.runtime import Runtime, RuntimeConfig

async def main(path):
    rt = Runtime(RuntimeConfig(state_path=path, barrier_interval=3600.0))
    rt.add_source("src")
    rt.add_actor("count", Counter, inputs=["src"])
    async with rt:
        while True:
            await rt.push("src", Chunk(pa.record_batch({"id": pa.array(range(10), pa.int64())})))
            epoch = await rt.checkpoint()
            print("DURABLE", epoch, flush=True)
            await rt.push("src", Chunk(pa.record_batch({"id": pa.array(range(5), pa.int64())})))

anyio.run(main, sys.argv[1], backend=sys.argv[2])
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.subprocess
def test_runtime_killed_restarts_from_last_checkpoint(tmp_path: Path, backend: str) -> None:
    import signal
    import subprocess
    import sys

    path = tmp_path / "state.db"
    child = subprocess.Popen(
        [sys.executable, "-c", RUNTIME_CHILD, str(path), backend, str(Path(__file__).parent)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    try:
        lines = [child.stdout.readline().split() for _ in range(5)]
    finally:
        child.send_signal(signal.SIGKILL)  # often between a push and the next checkpoint
        child.wait(timeout=scaled(30))
        child.stdout.close()
    assert all(line[0] == "DURABLE" for line in lines)

    async def check() -> None:
        async with await StateStore.open(path) as store:
            rows = await store.read("count", "count", "rows")
            # Each durable checkpoint k holds 10 rows of its epoch plus 5 of the one before it.
            checkpoints = (rows + 5) // 15
            assert rows == 15 * checkpoints - 5
            assert checkpoints >= 5
            assert store.committed_epoch >= int(lines[-1][1])

    anyio.run(check, backend=backend)


async def test_actor_log_is_bound_with_name_id_and_epoch(tmp_path: Path) -> None:
    FailOn.failures = 0
    rt = Runtime(config(tmp_path))
    rt.add_source("src")
    rt.add_actor("checker", lambda: FailOn(13), inputs=["src"])
    with structlog.testing.capture_logs() as logs, pytest.raises(ActorFailedError):
        async with rt:
            await rt.checkpoint()
            await rt.push("src", chunk(13))
            await rt.checkpoint()
    (raised,) = [e for e in logs if e["event"] == "actor raised"]
    assert raised["actor"] == "checker"
    assert raised["actor_id"] == rt.actor_id("checker")
    assert raised["epoch"] > 0


def test_json_log_format_writes_json_lines(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("json")
    try:
        structlog.get_logger("barrierflow.test").bind(actor="a", actor_id=1, epoch=7).info("hi")
        record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert record["event"] == "hi"
        assert (record["actor"], record["actor_id"], record["epoch"]) == ("a", 1, 7)
        configure_logging("console")
        structlog.get_logger("barrierflow.test").info("plain")
        assert "plain" in capsys.readouterr().out
    finally:
        structlog.reset_defaults()
