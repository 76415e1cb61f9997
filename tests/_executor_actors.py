"""Actors the Spark executor tests run in Spark's tasks.

The tests' own modules are not importable on Spark's Python workers, so a test pickles this
module by value (``pyspark.cloudpickle.register_pickle_by_value``), the way a user ships a
module of their own without installing it.
"""

from __future__ import annotations

from typing import Any

import anyio
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.channels.messages import Barrier, Message
from barrierflow.runtime import Placement
from barrierflow.runtime.actor import ActorContext, StreamActor


def on_driver() -> bool:
    """Whether this runs on the driver (not in a Spark task)."""
    from pyspark import TaskContext

    return TaskContext.get() is None


class FailOnFirstDriverBarrier(StreamActor):
    """Passes everything on, but fails once on the first checkpoint barrier it sees on the
    driver (class-level: survives the graph's rebuild); in Spark's tasks it only passes."""

    placement = Placement.PARTITION_LOCAL
    failed = False

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if (
            isinstance(message, Barrier)
            and message.is_checkpoint
            and on_driver()
            and not FailOnFirstDriverBarrier.failed
        ):
            FailOnFirstDriverBarrier.failed = True
            raise RuntimeError("injected fault")
        await ctx.emit(message)


class Passes(StreamActor):
    """A partition-local actor of a user's that passes everything on."""

    placement = Placement.PARTITION_LOCAL


class Global(StreamActor):
    """An actor that declares nothing: global, never in a Spark task."""


async def fails_on_seven(row: dict[str, object]) -> dict[str, object]:
    """An async_map call that fails for id 7, every time."""
    if row["id"] == 7:
        raise ValueError("id 7 is cursed")
    return row


#: What the chains of the executor tests write.
OUT = pa.schema([pa.field("id", pa.int64()), pa.field("twice", pa.int64())])


def not_a_third(batch: pa.RecordBatch) -> pa.Array:
    """Keep the ids not divisible by 3."""
    return pc.not_equal(_mod3(batch["id"]), 0)


def _mod3(ids: pa.Array) -> pa.Array:
    return pc.subtract(ids, pc.multiply(pc.divide(ids, 3), 3))


def twice(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The id and twice the id."""
    return pa.record_batch([batch["id"], pc.multiply(batch["id"], 2)], schema=OUT)


async def slow_twice(row: dict[str, Any]) -> dict[str, Any]:
    """``twice`` of one row, after a short wait that differs by row (out of order)."""
    await anyio.sleep(0.001 * (row["id"] % 5))
    return {"id": row["id"], "twice": 2 * row["id"]}
