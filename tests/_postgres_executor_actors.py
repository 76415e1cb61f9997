"""Actors the PostgreSQL executor tests run in Spark's tasks.

Pickled by value (``pyspark.cloudpickle.register_pickle_by_value``): the tests' own modules
are not importable on Spark's Python workers.
"""

from __future__ import annotations

from barrierflow.channels.messages import Barrier, Message
from barrierflow.runtime import Placement
from barrierflow.runtime.actor import ActorContext, StreamActor

#: The partition whose first attempt fails.
FLAKY_PARTITION = 1


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


class FailsFirstAttemptAtItsEnd(StreamActor):
    """Passes everything on, but in the first attempt of :data:`FLAKY_PARTITION`'s task fails
    on the partition's end (its checkpoint barrier): every row of the attempt has been passed
    on, and copied into its transaction, by then. Passes everything on the driver."""

    placement = Placement.PARTITION_LOCAL

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if (
            isinstance(message, Barrier)
            and message.is_checkpoint
            and first_attempt_of_flaky_partition()
        ):
            raise RuntimeError("the first attempt of the flaky partition fails at its end")
        await ctx.emit(message)
