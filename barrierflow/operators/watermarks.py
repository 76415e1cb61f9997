"""Watermarks from a column: :func:`with_watermark` says, after each chunk, that no row older
than the latest event time seen minus a delay will follow (a *bounded-out-of-orderness*
watermark, Flink's ``forBoundedOutOfOrderness``).

**What it emits.** Every message passes on unchanged, in order. After a chunk whose visible
rows hold a ``column`` value above every one seen before, it emits
``Watermark(column, max_seen - delay)``: the watermark only grows (a chunk of older rows emits
nothing), and it is this instance's own — run in parallel (it is *partition-local*), each
instance watermarks the rows it sees. Nulls (and NaN) in the column are ignored; so are the
ops (a delete's event time is an event time too). Watermarks of ``column`` arriving from
upstream are dropped — this operator owns that column's watermarks — and those of other
columns pass on.

**After each barrier** it emits its current watermark again (if it has one): a merge or a
window downstream that restarted, or a job that joined, learns it without waiting for a newer
row; a repeated watermark is ignored downstream (a merge and a window act only on one that
advances).

**Several inputs.** A merge downstream — an actor reading several upstreams, or a parallel
group of these — emits the *minimum* of its inputs' latest watermarks, and only once every
input has sent one (see :mod:`barrierflow.channels.merge`): a window after two watermarked
sources closes when the slower one passes its end, and an input that never sees a row holds the
merged watermark back (Flink's idle-source problem; give every instance rows, or fewer
instances).

**State.** The largest value seen is kept in the actor's state table ``watermark`` and
restored after a crash, so the watermarks emitted after a restart are those of the run without
it (the replayed rows see the same maximum) — what makes a window downstream decide late rows
the same way both times.

**Values.** On a timestamp column the watermark is a ``numpy.datetime64`` in nanoseconds (UTC),
on an integer column an int, on a floating one a float (see :mod:`._windows`). ``delay`` is a
``datetime.timedelta`` or a number — seconds on a timestamp column, the column's unit on a
numeric one (an int on an integer column) — checked against the column at the first chunk.
"""

from __future__ import annotations

from typing import Any, ClassVar, final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.channels.barrier import Barrier
from barrierflow.channels.chunk import Chunk
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.channels.messages import Message, Watermark
from barrierflow.operators._operator import Operator, OperatorActor
from barrierflow.operators._windows import Duration, EventTime, check_non_negative
from barrierflow.runtime.actor import ActorContext
from barrierflow.runtime.placement import Placement
from barrierflow.runtime.state.state_store import StateTable

__all__ = ["with_watermark"]

#: The state table: the largest value seen, in ticks, and whether it is a time.
_TABLE = "watermark"


def with_watermark(column: str, *, delay: Duration) -> Operator:
    """Emit watermarks on ``column``: the largest value seen minus ``delay`` (see the module).

    Args:
        column: a timestamp, integer or floating column of the input.
        delay: how far behind the newest row a row may still come: a ``timedelta`` or a
            number >= 0 (seconds on a timestamp column, the column's unit on a numeric one).

    Raises:
        InvalidArgumentError: ``column`` is not a non-empty str, or ``delay`` is not a
            non-negative timedelta or number.
    """
    if not isinstance(column, str) or not column:
        raise InvalidArgumentError("column", "a column name", column)
    check_non_negative("delay", delay)
    return Operator(
        "with_watermark", Placement.PARTITION_LOCAL, lambda: _WithWatermark(column, delay)
    )


@final
class _WithWatermark(OperatorActor):
    kind: ClassVar[str] = "with_watermark"

    def __init__(self, column: str, delay: Duration) -> None:
        super().__init__()
        self._column = column
        self._delay = delay
        self._time: EventTime
        self._lag: int | float
        self._max: int | float | None = None
        self._table: StateTable

    async def restore(self, ctx: ActorContext) -> None:
        """Restore the largest value seen (with a stand-in type of its kind until a chunk shows
        the column)."""
        self._table = ctx.table(_TABLE)
        saved = await self._table.get("max")
        if saved is not None:
            ticks, is_time = saved
            stand_in = pa.timestamp("ns") if is_time else pa.array([ticks]).type
            self._bind(EventTime(self._column, stand_in))
            self._max = ticks

    def _bind(self, time: EventTime) -> None:
        self._time = time
        self._lag = time.span("delay", self._delay)

    async def process(self, message: Message, ctx: ActorContext) -> None:
        """Pass ``message`` on; after a chunk, the watermark if it advanced; after a barrier,
        the watermark again."""
        if isinstance(message, Chunk):
            rows = message.cardinality
            self.stats.rows_in += rows
            await ctx.emit(message)
            self.stats.rows_out += rows
            top = self._top(message)
            if top is not None and (self._max is None or top > self._max):
                self._max = top
                await self._emit(ctx)
        elif isinstance(message, Barrier):
            if self._max is not None:
                self._table.put("max", [self._max, self._time.is_time])
            await ctx.emit(message)
            if self._max is not None and not ctx.finished:
                await self._emit(ctx)
        elif not (isinstance(message, Watermark) and message.column == self._column):
            await ctx.emit(message)

    async def _emit(self, ctx: ActorContext) -> None:
        assert self._max is not None
        await ctx.emit(Watermark(self._column, self._time.watermark_value(self._max - self._lag)))

    def _top(self, chunk: Chunk) -> int | float | None:
        """The largest visible, non-null value of the column in ``chunk``, in ticks."""
        if not chunk.cardinality:
            return None
        batch = chunk.batch
        time = EventTime.of(batch.schema, self._column, "with_watermark column")
        self._bind(time)
        values: Any = batch.column(self._column)
        if chunk.visibility is not None:
            values = pc.filter(values, chunk.visibility)
        top = pc.max(values)
        if not top.is_valid:
            return None
        value = time.ticks(pa.array([top]))[0]
        if np.isnan(value):  # only NaN left in a floating column
            return None
        return value.item()  # type: ignore[no-any-return]
