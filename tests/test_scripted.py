"""Scripted sources: data and sentinels played into a running graph, each sentinel doing what it
names (a durable checkpoint, a recovered crash, a typed failure, pause and resume barriers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from barrierflow.actors import add_sink
from barrierflow.channels import Barrier, Chunk, Message
from barrierflow.errors import ActorFailedError, InvalidArgumentError
from barrierflow.runtime import ActorContext, Runtime, RuntimeConfig, StreamActor
from barrierflow.testing import ListTable
from barrierflow.testing.scripted import (
    CHECKPOINT,
    CRASH,
    FAIL,
    PAUSE,
    RESUME,
    Item,
    ScriptedFailureError,
    ScriptedSource,
    play,
)

pytestmark = pytest.mark.anyio

SCHEMA = pa.schema([("n", pa.int64())])


def batch(*values: int) -> pa.RecordBatch:
    return pa.record_batch({"n": list(values)}, schema=SCHEMA)


def config(path: Path, *, recovery: bool = True) -> RuntimeConfig:
    return RuntimeConfig(
        state_path=path, barrier_interval=3600, recovery=recovery, restart_backoff=0.001
    )


def scripted_graph(path: Path, sink: ListTable, *, recovery: bool = True) -> Runtime:
    rt = Runtime(config(path, recovery=recovery))
    rt.add_source("src", ScriptedSource)
    add_sink(rt, "out", sink, input="src")
    return rt


def committed(sink: ListTable) -> list[int]:
    return sorted(sink.rows().column("n").to_pylist())


async def run(path: Path, script: list[Item]) -> tuple[ListTable, Runtime, Any]:
    sink = ListTable(SCHEMA)
    rt = scripted_graph(path, sink)
    async with rt:
        playback = await play(rt, "src", script)
        await rt.checkpoint()  # the sink commits what the script's last checkpoint sealed
    return sink, rt, playback


async def test_a_crash_recovers_to_the_same_committed_rows(tmp_path: Path) -> None:
    table = pa.Table.from_batches([batch(3, 4), batch(5)])
    calm = [batch(1, 2), CHECKPOINT, table, Chunk(batch(6)), CHECKPOINT, batch(7), CHECKPOINT]
    shaken = [*calm[:4], CRASH, *calm[4:]]
    expected, _, _ = await run(tmp_path / "calm.db", calm)
    sink, rt, playback = await run(tmp_path / "crash.db", shaken)
    assert committed(sink) == committed(expected) == [1, 2, 3, 4, 5, 6, 7]
    assert playback.crashes == 1
    assert rt.stats().restarts == 1
    assert playback.pushed == 1 + 3 + 3 + 1  # the table and the chunk were pushed twice
    assert len(playback.checkpoints) == 3


@pytest.mark.parametrize("every", [1, 2])
async def test_rows_a_runtime_checkpoint_sealed_are_not_pushed_again(
    tmp_path: Path, every: int
) -> None:
    # every=1: the Pause barrier is a checkpoint (row 1 is durable, not pushed again);
    # every=2: it is not (row 1 is lost with the crash and pushed again).
    sink = ListTable(SCHEMA)
    rt = Runtime(
        RuntimeConfig(
            state_path=tmp_path / "s.db",
            barrier_interval=3600,
            checkpoint_frequency=every,
            recovery=True,
            restart_backoff=0.001,
        )
    )
    rt.add_source("src", ScriptedSource)
    add_sink(rt, "out", sink, input="src")
    async with rt:
        playback = await play(rt, "src", [batch(1), PAUSE, CRASH, RESUME, batch(2), CHECKPOINT])
        await rt.checkpoint()
    assert committed(sink) == [1, 2]
    assert playback.pushed == (2 if every == 1 else 3)


async def test_fail_ends_the_run_with_the_typed_error(tmp_path: Path) -> None:
    sink = ListTable(SCHEMA)
    rt = scripted_graph(tmp_path / "s.db", sink)  # recovery on: FAIL still ends the run
    with pytest.raises(ActorFailedError) as failed:
        async with rt:
            await play(rt, "src", [batch(1), CHECKPOINT, batch(2), FAIL, batch(3)])
    assert failed.value.actor == "src"
    assert isinstance(failed.value.cause, ScriptedFailureError)
    assert failed.value.cause.position == 3


class RunningTotal(StreamActor):
    """Keeps the sum of ``n`` in a state table; records what each restore found."""

    restored: ClassVar[list[int]] = []

    async def restore(self, ctx: ActorContext) -> None:
        self.table = ctx.table("total")
        self.total = int(await self.table.get("total", 0))
        RunningTotal.restored.append(self.total)

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk):
            self.total += int(pc.sum(message.batch.column("n")).as_py() or 0)
            self.table.put("total", self.total)
        await ctx.emit(message)


async def test_a_checkpoint_sentinel_is_durable_across_a_restart(tmp_path: Path) -> None:
    RunningTotal.restored = []
    path = tmp_path / "s.db"
    for attempt in range(2):
        rt = Runtime(config(path, recovery=False))
        rt.add_source("src", ScriptedSource)
        rt.add_actor("total", RunningTotal, inputs=["src"])
        if attempt == 0:
            # Durable: 1 + 2; lost with the failure: 40 (no checkpoint after it).
            with pytest.raises(ActorFailedError):
                async with rt:
                    await play(rt, "src", [batch(1, 2), CHECKPOINT, batch(40), FAIL])
        else:
            async with rt:
                pass
    assert RunningTotal.restored == [0, 3]


class Recorder(StreamActor):
    """Records the chunks' values and the pause/resume barriers it sees, in order."""

    seen: ClassVar[list[object]] = []

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk):
            Recorder.seen.extend(message.batch.column("n").to_pylist())
        elif isinstance(message, Barrier) and (message.is_pause() or message.is_resume()):
            Recorder.seen.append("pause" if message.is_pause() else "resume")
        await ctx.emit(message)


async def test_pause_and_resume_barriers_arrive_where_scripted(tmp_path: Path) -> None:
    Recorder.seen = []
    rt = Runtime(config(tmp_path / "s.db"))
    rt.add_source("src", ScriptedSource)
    rt.add_actor("rec", Recorder, inputs=["src"])
    async with rt:
        await play(rt, "src", [batch(1), PAUSE, CHECKPOINT, RESUME, batch(2), CHECKPOINT])
    assert Recorder.seen == [1, "pause", "resume", 2]


async def test_a_pause_in_force_at_the_checkpoint_is_applied_after_a_crash(
    tmp_path: Path,
) -> None:
    Recorder.seen = []
    rt = Runtime(config(tmp_path / "s.db"))
    rt.add_source("src", ScriptedSource)
    rt.add_actor("rec", Recorder, inputs=["src"])
    async with rt:
        playback = await play(rt, "src", [batch(1), PAUSE, CHECKPOINT, CRASH, RESUME, batch(2)])
    assert playback.crashes == 1
    assert Recorder.seen == [1, "pause", "pause", "resume", 2]


async def test_crash_needs_a_scripted_source(tmp_path: Path) -> None:
    sink = ListTable(SCHEMA)
    rt = Runtime(config(tmp_path / "s.db"))
    rt.add_source("src")  # a plain push source lets the poison through
    add_sink(rt, "out", sink, input="src")
    async with rt:
        with pytest.raises(InvalidArgumentError) as refused:
            await play(rt, "src", [batch(1), CRASH])
    assert refused.value.argument == "source"


@pytest.mark.parametrize(
    ("rt_ok", "source", "script", "argument"),
    [
        (False, "src", [], "rt"),
        (True, 7, [], "source"),
        (True, "src", "not a list", "script"),
        (True, "src", [batch(1), {"n": [1]}], "script"),
        (True, "src", [RESUME], "script"),
        (True, "src", [PAUSE, PAUSE], "script"),
        (True, "src", [PAUSE, batch(1), RESUME], "script"),
    ],
)
async def test_bad_input_is_refused_before_anything_is_played(
    tmp_path: Path, rt_ok: bool, source: Any, script: Any, argument: str
) -> None:
    sink = ListTable(SCHEMA)
    rt = scripted_graph(tmp_path / "s.db", sink)
    async with rt:
        with pytest.raises(InvalidArgumentError) as refused:
            await play(rt if rt_ok else object(), source, script)  # type: ignore[arg-type]
        await rt.checkpoint()
    assert refused.value.argument == argument
    assert sink.rows().num_rows == 0  # nothing of a refused script was pushed
