"""The stream-actor conformance suite: an actor whose state lives in its state tables commits
the same rows with crashes as without; one that keeps it in memory is caught."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from barrierflow.channels import Chunk, Message
from barrierflow.errors import InvalidArgumentError
from barrierflow.runtime import ActorContext, StreamActor
from barrierflow.testing.actor_conformance import check_stream_actor

pytestmark = pytest.mark.anyio

INPUT = pa.schema([("n", pa.int64())])
OUTPUT = pa.schema([("total", pa.int64())])
CHUNKS = [Chunk(pa.record_batch({"n": [i, i + 1]}, schema=INPUT)) for i in range(0, 40, 2)]


class RunningTotal(StreamActor):
    """Emits the running total after each chunk; the total is state (restored at restart)."""

    async def restore(self, ctx: ActorContext) -> None:
        self.table = ctx.table("total")
        self.total = int(await self.table.get("total", 0))

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk):
            self.total += int(pc.sum(message.compact().batch.column("n")).as_py() or 0)
            self.table.put("total", self.total)
            message = Chunk(pa.record_batch({"total": [self.total]}, schema=OUTPUT))
        await ctx.emit(message)


class ForgetfulTotal(StreamActor):
    """The same, with the total only in memory: a restart starts it from 0 again."""

    total = 0

    def __init__(self) -> None:
        self.total = 0

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk):
            self.total += int(pc.sum(message.compact().batch.column("n")).as_py() or 0)
            message = Chunk(pa.record_batch({"total": [self.total]}, schema=OUTPUT))
        await ctx.emit(message)


async def test_an_actor_with_its_state_in_tables_passes(tmp_path: Path) -> None:
    report = await check_stream_actor(RunningTotal, CHUNKS, output=OUTPUT, state_dir=tmp_path)
    report.raise_for_failures()
    # Passing means every rule was checked and held, not that none was.
    assert [r.rule for r in report.results] == ["same_rows_with_crashes", "same_rows_in_order"]


async def test_an_actor_keeping_state_in_memory_is_caught(tmp_path: Path) -> None:
    report = await check_stream_actor(
        ForgetfulTotal, CHUNKS, output=OUTPUT, state_dir=tmp_path, crashes=2, seed=3
    )
    assert "same_rows_with_crashes" in {r.rule for r in report.failures}


async def test_bad_input_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError) as empty:
        await check_stream_actor(RunningTotal, [], output=OUTPUT, state_dir=tmp_path)
    assert empty.value.argument == "chunks"
    with pytest.raises(InvalidArgumentError) as every:
        await check_stream_actor(
            RunningTotal, CHUNKS, output=OUTPUT, state_dir=tmp_path, checkpoint_every=0
        )
    assert every.value.argument == "checkpoint_every"
