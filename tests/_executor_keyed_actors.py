"""Functions and actors the keyed executor tests (``test_executor_keyed.py``) run in Spark's
tasks.

The tests' own modules are not importable on Spark's Python workers, so the test pickles this
module by value (``pyspark.cloudpickle.register_pickle_by_value``), as ``_executor_actors`` is.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.channels import Barrier, Chunk, Message
from barrierflow.runtime import Placement
from barrierflow.runtime.actor import ActorContext, StreamActor

#: The feed's rows: a key and a value.
IN = pa.schema(
    [pa.field("k", pa.int64(), nullable=False), pa.field("v", pa.int64(), nullable=False)]
)

#: What ``aggregate(total=("v", "sum"), n=("v", "count"), top=("v", "max"))`` then
#: ``changelog_rows()`` writes.
TOTALS = pa.schema(
    [
        pa.field("k", pa.int64(), nullable=False),
        pa.field("total", pa.int64()),
        pa.field("n", pa.int64(), nullable=False),
        pa.field("top", pa.int64()),
        pa.field("op", pa.string()),
    ]
)

#: What ``aggregate(avg=("v", "mean"))`` then ``changelog_rows()`` writes.
MEANS = pa.schema(
    [
        pa.field("k", pa.int64(), nullable=False),
        pa.field("avg", pa.float64()),
        pa.field("op", pa.string()),
    ]
)

#: What ``reduce(running_sum)`` then ``changelog_rows()`` writes: the input's columns.
SUMS = pa.schema([*IN, pa.field("op", pa.string())])

#: The key a deterministic failure is tied to (see :func:`fails_on_key_five`).
CURSED_KEY = 5

#: The partition whose first attempt fails (see :class:`FailsFirstAttempt`).
FLAKY_PARTITION = 1

#: The values from which :class:`FailsFirstAttempt` fails (ids of the second micro-batch on).
FLAKY_FROM = 300


def running_sum(acc: pa.RecordBatch, rows: pa.RecordBatch) -> pa.RecordBatch:
    """A reduce's combine: the key and the sum of the values."""
    return pa.record_batch([acc["k"], pc.add(acc["v"], rows["v"])], schema=IN)


def even_values(batch: pa.RecordBatch) -> pa.Array:
    """Keep the rows of an even value."""
    return pc.equal(pc.bit_wise_and(batch["v"], 1), 0)


def doubled(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The key and twice the value (a map that changes values)."""
    return pa.record_batch([batch["k"], pc.multiply(batch["v"], 2)], schema=IN)


def fails_on_key_five(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Passes a batch on, but fails on any batch holding key :data:`CURSED_KEY`, every time."""
    if pc.any(pc.equal(batch["k"], CURSED_KEY)).as_py():
        raise ValueError(f"key {CURSED_KEY} is cursed")
    return batch


def first_attempt_of_flaky_partition() -> bool:
    """Whether this runs in the first attempt of :data:`FLAKY_PARTITION`'s task (never on the
    driver)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return (
        context is not None
        and context.partitionId() == FLAKY_PARTITION
        and context.attemptNumber() == 0
    )


class FailsFirstAttempt(StreamActor):
    """Passes everything on, but fails on the partition's end (its checkpoint barrier) in the
    first attempt of :data:`FLAKY_PARTITION`'s task of a micro-batch that brought a ``top`` of
    :data:`FLAKY_FROM` or more: after the keyed step before it emitted the attempt's changes.
    Passes everything on the driver and in every other attempt."""

    placement = Placement.PARTITION_LOCAL

    def __init__(self) -> None:
        super().__init__()
        self._armed = False

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk) and message.num_rows:
            top = pc.max(message.batch["top"]).as_py()
            self._armed = self._armed or (top is not None and top >= FLAKY_FROM)
        if (
            isinstance(message, Barrier)
            and message.is_checkpoint
            and self._armed
            and first_attempt_of_flaky_partition()
        ):
            raise RuntimeError("the first attempt of the flaky partition fails at its end")
        await ctx.emit(message)
