"""Event-time windows closed by watermarks: :func:`window_aggregate` folds the rows of each key
and window (:class:`Tumbling` or :class:`Sliding`, see :mod:`._windows`) and emits a window's
row when the watermark passes its end, with Flink's allowed lateness.

**When a window is emitted.** A window ``[start, end)`` *closes* when the watermark on ``on``
reaches its end (``watermark >= end``): its row — the key, ``window_start``, ``window_end``,
then the aggregations — is emitted as an ``INSERT``. The windows a watermark closes are
emitted together, in order of ``window_start`` then key, before the watermark is passed on.
A window that got no row emits nothing.

**Late rows** are those that reach a window after it closed (``end <= watermark``, the
watermark before their chunk):

* *within the allowed lateness* (``watermark < end + allowed_lateness``) a row updates its
  window's row at once, after its chunk: an ``UPDATE_DELETE`` of the row emitted before and an
  ``UPDATE_INSERT`` of the new one (nothing if the outputs did not change — a ``max`` not
  beaten), or an ``INSERT`` if the window had no row yet;
* *beyond it* (``end + allowed_lateness <= watermark``) the row is dropped, or, with
  ``late="output"``, sent on the side output ``"late"`` (read downstream as
  ``"<actor>:late"``) as it came, the chunk's rows hidden by a visibility mask (no copy).

Counted either way: ``late_rows`` counts every late row, ``late_rows_dropped`` those beyond the
lateness (dropped or sent aside). On sliding windows a row falls in several windows: it is
*late* when its first window had closed, and *beyond* when its last one is beyond the
lateness; in between, it updates the windows still within it and skips the others (as Flink).
A window's state is deleted once the watermark reaches ``end + allowed_lateness``; with no
lateness, when it closes.

**Watermarks** of ``on`` advance the operator's own watermark (the largest seen: one that does
not advance it is ignored, and not passed on); after closing the windows it passes the
watermark on as it came — a row it emits later for a window before it is a late update, which
a downstream window would count as late too. Watermarks of other columns pass on untouched.
Before any watermark, no window closes and no row is late.

**State** (a :class:`~._keyed_state.KeyedState` keyed by the key and ``window_start``, the
aggregations' state per window, Arrow-native, moved by vnode on a rescale) and the operator's
watermark are checkpointed together (the watermark in the state table ``window``), so a
restarted operator decides late rows as before; a restarted instance takes the largest
watermark its group checkpointed (every instance sees the same watermarks). Rows of open
windows are folded into the state in batches — at a barrier, before a watermark that closes
one of their windows — never one at a time.

**Placement.** With a key the operator is *keyed* (rows hash-dispatched by the key, each
instance keeps its keys' windows); with ``key=None`` (or ``()``) it is one window over the whole
stream, *global*: one instance.

**The input** is insert-only (a changelog is refused with
:class:`~barrierflow.errors.ChangelogInputError`), with no null in the key or in ``on``
(refused with :class:`~barrierflow.errors.InvalidArgumentError`). The output is a changelog of
the windows' rows; to read the results later, materialize it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal, final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.channels.barrier import Barrier
from barrierflow.channels.chunk import Chunk, Op
from barrierflow.channels.errors import InvalidArgumentError, SchemaMismatchError
from barrierflow.channels.messages import Message, Watermark
from barrierflow.operators._accumulators import Aggregations, as_batch
from barrierflow.operators._keyed_state import KeyedState
from barrierflow.operators._operator import (
    Operator,
    OperatorActor,
    check_columns,
    refuse_changes,
)
from barrierflow.operators._windows import (
    Assigner,
    Duration,
    EventTime,
    Sliding,
    Tumbling,
    Window,
    check_non_negative,
    watermark_ticks,
)
from barrierflow.runtime.actor import ActorContext
from barrierflow.runtime.placement import Placement
from barrierflow.runtime.state.state_store import StateTable

__all__ = ["LATE", "WINDOW_END", "WINDOW_START", "Sliding", "Tumbling", "window_aggregate"]

#: The output's window columns.
WINDOW_START, WINDOW_END = "window_start", "window_end"
#: The side output of rows beyond the allowed lateness (``late="output"``).
LATE = "late"
#: The state tables: the windows' state, and the operator's watermark.
_STATE, _WATERMARK = "state", "window"
_RESERVED = (WINDOW_START, WINDOW_END)


def window_aggregate(
    key: str | Sequence[str] | None,
    window: Window,
    *,
    on: str,
    allowed_lateness: Duration = 0,
    late: Literal["drop", "output"] = "drop",
    schema: pa.Schema | None = None,
    **aggregations: tuple[str, str],
) -> Operator:
    """Aggregate the rows of each key and event-time window, emitted when a watermark closes
    the window: ``window_aggregate("user", Tumbling(timedelta(minutes=1)), on="ts",
    clicks=("clicks", "sum"))`` (see the module).

    Args:
        key: the key column(s); ``None`` or ``()``: one window over the whole stream.
        window: :class:`Tumbling` or :class:`Sliding`.
        on: the event-time column (timestamp, integer or floating).
        allowed_lateness: how long after its end a window still takes late rows: a timedelta
            or a number >= 0 (seconds on a timestamp column, the column's unit on a numeric
            one).
        late: what becomes of a row beyond the lateness: ``"drop"``, or ``"output"`` to the
            side output ``"late"``.
        schema: the input's schema, if known (checked now; the state opens at start).
        aggregations: ``out_name=(column, function)`` as for
            :func:`~barrierflow.operators.aggregate.aggregate`.

    Raises:
        InvalidArgumentError: a bad key, window, ``on``, lateness or ``late``; no aggregation
            or a bad one; a key column or an output named ``window_start`` or ``window_end``;
            ``schema`` not a Schema; with ``schema``, a window size or lateness that does not
            fit ``on``'s type.
        SchemaMismatchError: with ``schema``: ``on``, a key or an input column missing, or of
            a type its use does not take.
    """
    columns = () if key is None else check_columns("key", key, allow_empty=True)
    if not isinstance(window, Tumbling | Sliding):
        raise InvalidArgumentError("window", "a Tumbling or Sliding window", window)
    if not isinstance(on, str) or not on:
        raise InvalidArgumentError("on", "the event-time column's name", on)
    check_non_negative("allowed_lateness", allowed_lateness)
    if not isinstance(late, str) or late not in ("drop", "output"):
        raise InvalidArgumentError("late", "'drop' or 'output'", late)
    spec = Aggregations(aggregations)
    spec.check_key((*columns, *_RESERVED))
    for name in _RESERVED:
        if name in columns:
            raise InvalidArgumentError("key", f"key columns other than {list(_RESERVED)}", name)
        if any(column == name for column, _ in spec.aggregations.values()):
            raise InvalidArgumentError(
                "aggregations", f"input columns other than {list(_RESERVED)}", name
            )
    if schema is not None:
        if not isinstance(schema, pa.Schema):
            raise InvalidArgumentError("schema", "None or a pyarrow.Schema", schema)
        _Plan.of(schema, columns, window, on, allowed_lateness, spec)

    def make() -> _WindowAggregate:
        return _WindowAggregate(columns, window, on, allowed_lateness, late, spec, schema)

    return Operator(
        "window_aggregate",
        Placement.KEYED if columns else Placement.GLOBAL,
        make,
        key=columns or None,
        side_outputs=(LATE,) if late == "output" else (),
    )


@final
class _Plan:
    """What a schema decides: the event time, the windows in ticks, the lateness in ticks,
    and the schemas of the rows folded and of the state."""

    def __init__(
        self,
        time: EventTime,
        windows: Assigner,
        lateness: int | float,
        rows: pa.Schema | None,
        state: pa.Schema | None,
    ) -> None:
        self.time = time
        self.windows = windows
        self.lateness = lateness
        #: The rows folded (key, window_start, the aggregations' inputs), if the input is known.
        self.rows = rows
        self.state = state

    @staticmethod
    def of(
        schema: pa.Schema,
        key: tuple[str, ...],
        window: Window,
        on: str,
        lateness: Duration,
        spec: Aggregations,
    ) -> _Plan:
        """The plan of an input of ``schema``.

        Raises:
            SchemaMismatchError: as :func:`window_aggregate` with ``schema``.
            InvalidArgumentError: a size or lateness that does not fit ``on``.
        """
        timed = _Plan.timed(EventTime.of(schema, on, "on"), window, lateness)
        time = timed.time
        inputs = list(dict.fromkeys(column for column, _ in spec.aggregations.values()))
        fields: list[pa.Field] = []
        for name in [*key, *inputs]:
            index = schema.get_field_index(name)
            if index < 0:
                raise SchemaMismatchError("window_aggregate", f"a column {name!r}", schema)
            if name not in (f.name for f in fields):
                fields.append(schema.field(index))
        fields.insert(len(key), pa.field(WINDOW_START, time.type))
        rows = pa.schema(fields)
        state = spec.state_schema(rows, (*key, WINDOW_START))
        return _Plan(time, timed.windows, timed.lateness, rows, state)

    @staticmethod
    def timed(time: EventTime, window: Window, lateness: Duration) -> _Plan:
        """The plan's event-time part (what a restored state's ``window_start`` tells)."""
        return _Plan(
            time, window.assigner(time), time.span("allowed_lateness", lateness), None, None
        )


@final
class _WindowAggregate(OperatorActor):
    """The actor of :func:`window_aggregate` (see the module)."""

    kind: ClassVar[str] = "window_aggregate"

    def __init__(
        self,
        key: tuple[str, ...],
        window: Window,
        on: str,
        lateness: Duration,
        late: str,
        spec: Aggregations,
        schema: pa.Schema | None,
    ) -> None:
        super().__init__()
        self.columns = key
        self.window = window
        self.on = on
        self.lateness = lateness
        self.late = late
        self.spec = spec
        self.input_schema = schema
        self.state_key = (*key, WINDOW_START)
        self.state = KeyedState(
            self.state_key,
            table=_STATE,
            view=None,
            stats=self.stats,
            distribution_key=key or (WINDOW_START,),
        )
        self._plan: _Plan | None = None
        #: The watermark in ticks, and whether it is a time (``None``: none yet).
        self._watermark: int | float | None = None
        self._is_time: bool
        self._table: StateTable
        #: Rows of open windows not folded into the state yet, and their first window's end.
        self._pending: list[pa.Table] = []
        self._pending_end: int | float | None = None

    def _plan_for(self, schema: pa.Schema) -> _Plan:
        return _Plan.of(schema, self.columns, self.window, self.on, self.lateness, self.spec)

    # Restoring.

    async def restore(self, ctx: ActorContext) -> None:
        """Restore the windows' state and the watermark (the largest its group checkpointed)."""
        schema = self.input_schema
        if schema is not None:
            self._plan = self._plan_for(schema)
        await self.state.restore(ctx, None if self._plan is None else self._plan.state)
        if self._plan is None and self.state.is_open:
            assert self.state.schema is not None
            start = self.state.schema.field(WINDOW_START).type
            self._plan = _Plan.timed(EventTime(self.on, start), self.window, self.lateness)
        self._table = ctx.table(_WATERMARK)
        saved = [await ctx.read_table(peer, _WATERMARK).get("watermark") for peer in ctx.peers]
        found = [mark for mark in saved if mark is not None]
        if found:  # [ticks, is_time]: the largest ticks
            self._watermark, self._is_time = max(found)

    # Messages.

    async def process(self, message: Message, ctx: ActorContext) -> None:
        """Fold a chunk (emitting late updates), close windows at a watermark, write the state
        and the watermark at a barrier before passing it."""
        if isinstance(message, Chunk):
            await self._take(message, ctx)
        elif isinstance(message, Watermark) and message.column == self.on:
            await self._advance(message, ctx)
        elif isinstance(message, Barrier):
            self._fold_pending()
            if self._watermark is not None:
                self._table.put("watermark", [self._watermark, self._is_time])
            await self.state.pass_barrier(message, ctx)
        else:
            await ctx.emit(message)

    async def _take(self, chunk: Chunk, ctx: ActorContext) -> None:
        chunk = chunk.compact()
        n = chunk.num_rows
        if not n:
            return
        refuse_changes(chunk.ops, ctx.name, self.kind, "an insert-only input")
        batch = chunk.batch
        plan = await self._bind(batch.schema, ctx)
        for name in (*self.columns, self.on):
            nulls = batch.column(name).null_count
            if nulls:
                raise InvalidArgumentError(
                    f"{self.kind} {ctx.name!r}: column {name!r}", "no nulls", f"{nulls} null(s)"
                )
        self.stats.rows_in += n
        time, windows = plan.time, plan.windows
        ticks = time.ticks(batch.column(self.on))
        rows, starts = windows.assign(ticks)
        ends = starts + windows.size
        watermark = self._watermark
        if watermark is None:
            self._hold(batch, rows, starts, ends)
            return
        last = windows.last_start(ticks)
        lateness = plan.lateness
        self.stats.late_rows += int(np.count_nonzero(last + windows.every <= watermark))
        beyond = last + windows.size + lateness <= watermark
        dropped = int(np.count_nonzero(beyond))
        self.stats.late_rows_dropped += dropped
        kept = ends + lateness > watermark
        closed = kept & (ends <= watermark)
        if closed.any():
            await self._update_closed(batch, rows[closed], starts[closed], ctx)
        opened = kept & ~closed
        self._hold(batch, rows[opened], starts[opened], ends[opened])
        if dropped and self.late == "output":
            await ctx.emit(Chunk(batch).with_visibility(pa.array(beyond)), output=LATE)

    async def _bind(self, schema: pa.Schema, ctx: ActorContext) -> _Plan:
        """The plan of the input: the first chunk's schema opens the state; every later chunk
        must have it."""
        if self.input_schema is None:
            first = self._plan_for(schema)
            assert first.state is not None
            if self.state.is_open and not first.state.equals(self.state.schema):
                raise SchemaMismatchError(
                    f"{self.kind} {ctx.name!r}: input", self.state.schema, first.state
                )
            await self.state.open(ctx, first.state)
            self.input_schema, self._plan = schema, first
        elif not schema.equals(self.input_schema):
            raise SchemaMismatchError(f"{self.kind} {ctx.name!r}: input", self.input_schema, schema)
        plan = self._plan
        assert plan is not None  # (made from the schema, given or first seen)
        if self._watermark is not None:
            plan.time.check_watermark(self._is_time, self._watermark)
        return plan

    def _rows(
        self, batch: pa.RecordBatch, rows: npt.NDArray[np.int64], starts: npt.NDArray[Any]
    ) -> pa.Table:
        """The rows folded: each (row, window) pair's key, window start and inputs."""
        plan = self._plan
        assert plan is not None
        assert plan.rows is not None
        taken = batch.take(pa.array(rows))
        columns = [
            plan.time.column_of(starts) if f.name == WINDOW_START else taken.column(f.name)
            for f in plan.rows
        ]
        return pa.Table.from_arrays(columns, schema=plan.rows)

    def _hold(
        self,
        batch: pa.RecordBatch,
        rows: npt.NDArray[np.int64],
        starts: npt.NDArray[Any],
        ends: npt.NDArray[Any],
    ) -> None:
        """Keep rows of open windows to fold later."""
        if not len(rows):
            return
        self._pending.append(self._rows(batch, rows, starts))
        first = ends.min()
        self._pending_end = first if self._pending_end is None else min(first, self._pending_end)

    def _fold_pending(self) -> None:
        """Fold the rows of open windows into the state (no output: their windows are open)."""
        if not self._pending:
            return
        rows = pa.concat_tables(self._pending)
        self._pending, self._pending_end = [], None
        self._merge(self.spec.partial(rows, self.state_key))

    def _merge(self, partial: pa.Table) -> tuple[pa.Table, pa.Table, npt.NDArray[np.int64]]:
        """Fold ``partial`` (one state row per window) into the state: returns the windows'
        state before (for those the state held), the new state (the fresh windows first, then
        those it held), and how many are fresh."""
        state, spec, key = self.state, self.spec, self.state_key
        at = state.lookup(partial)
        fresh = np.flatnonzero(at < 0)
        known = np.flatnonzero(at >= 0)
        old = state.rows.take(pa.array(at[known]))
        merged = spec.merge(old, partial.take(pa.array(known)), key).cast(partial.schema)
        new = pa.concat_tables([partial.take(pa.array(fresh)), merged])
        state.upsert(new, np.concatenate([at[fresh], at[known]]))
        return old, new, fresh

    async def _update_closed(
        self,
        batch: pa.RecordBatch,
        rows: npt.NDArray[np.int64],
        starts: npt.NDArray[Any],
        ctx: ActorContext,
    ) -> None:
        """Late rows within the lateness: fold them and emit their windows' changes (see the
        module)."""
        old, new, fresh = self._merge(
            self.spec.partial(self._rows(batch, rows, starts), self.state_key)
        )
        old_out, new_out = self._outputs(old), self._outputs(new)
        nf = len(fresh)
        changed = np.flatnonzero(~_same_rows(old_out, new_out.slice(nf)))
        # One entry per emitted row: its window's rank in window order, and where its row is in
        # new_out + old_out; a stable sort by rank puts each UPDATE_DELETE before its
        # UPDATE_INSERT.
        windows = pa.concat_tables([new_out.slice(0, nf), new_out.take(pa.array(nf + changed))])
        rank = np.argsort(_window_order(windows, self.columns).to_numpy())
        m = len(changed)
        group = np.concatenate([rank[:nf], rank[nf:], rank[nf:]])
        take = np.concatenate([np.arange(nf), new_out.num_rows + changed, nf + changed])
        ops = np.concatenate(
            [
                np.full(nf, Op.INSERT),
                np.full(m, Op.UPDATE_DELETE),
                np.full(m, Op.UPDATE_INSERT),
            ]
        )
        sequence = np.lexsort([group])
        out = pa.concat_tables([new_out, old_out]).take(pa.array(take[sequence]))
        await self._emit(out, ops[sequence], ctx)

    async def _emit(self, rows: pa.Table, ops: npt.NDArray[Any], ctx: ActorContext) -> None:
        """Emit ``rows`` with ``ops`` (op codes; the chunk keeps them as int8)."""
        if rows.num_rows:
            self.stats.rows_out += rows.num_rows
            await ctx.emit(Chunk(as_batch(rows), pa.array(ops)))

    def _outputs(self, state: pa.Table) -> pa.Table:
        """The output rows of windows' state rows: the key, the window, the aggregations."""
        plan = self._plan
        assert plan is not None
        out = self.spec.outputs(state)
        start = out.column(WINDOW_START)
        end = plan.time.column_of(plan.time.ticks(start) + plan.windows.size)
        at = out.schema.get_field_index(WINDOW_START) + 1
        return out.add_column(at, pa.field(WINDOW_END, start.type, nullable=False), end)

    async def _advance(self, watermark: Watermark, ctx: ActorContext) -> None:
        """A watermark of ``on``: if it advances the operator's, close the windows it passes,
        delete those beyond the lateness, and pass it on."""
        ticks, is_time = watermark_ticks(self.on, watermark.value)
        plan = self._plan
        if plan is not None:
            plan.time.check_watermark(is_time, watermark.value)
        elif self._watermark is not None and is_time != self._is_time:
            raise InvalidArgumentError(
                f"Watermark({self.on!r}).value",
                "a time" if self._is_time else "a number",
                watermark.value,
            )
        before = self._watermark
        if before is not None and ticks <= before:
            return
        self._watermark, self._is_time = ticks, is_time
        if plan is not None:  # (a plan known, the state is open)
            if self._pending_end is not None and self._pending_end <= ticks:
                self._fold_pending()
            await self._close(before, ticks, plan, ctx)
        await ctx.emit(watermark)

    async def _close(
        self, before: int | float | None, now: int | float, plan: _Plan, ctx: ActorContext
    ) -> None:
        """Emit the windows whose end the watermark passed (``before < end <= now``), and
        delete the state of those beyond the lateness."""
        state = self.state.rows
        if not state.num_rows:
            return
        ends = plan.time.ticks(state.column(WINDOW_START)) + plan.windows.size
        closing = ends <= now
        if before is not None:
            closing &= ends > before
        if closing.any():
            out = self._outputs(state.filter(pa.array(closing)))
            out = out.take(_window_order(out, self.columns))
            await self._emit(out, np.full(out.num_rows, Op.INSERT), ctx)
        self.state.delete(np.flatnonzero(ends + plan.lateness <= now))


def _window_order(rows: pa.Table, key: tuple[str, ...]) -> pa.Array:
    """The order of windows' rows: by window start, then key."""
    keys = [(WINDOW_START, "ascending"), *((name, "ascending") for name in key)]
    return pc.sort_indices(rows, sort_keys=keys)


def _same_rows(a: pa.Table, b: pa.Table) -> npt.NDArray[np.bool_]:
    """Whether each aligned row of ``a`` and ``b`` holds the same values (nulls alike)."""
    same = np.ones(a.num_rows, np.bool_)
    for name in a.column_names:
        x, y = a.column(name), b.column(name)
        equal = pc.fill_null(pc.equal(x, y), False)
        both = pc.and_(pc.is_null(x), pc.is_null(y))
        same &= np.asarray(pc.or_(equal, both))
    return same
