"""Keyed aggregation: :func:`aggregate` (named aggregations per key) and :func:`reduce` (a
user's vectorized combine per key), emitted as a changelog, kept as a materialized view.

Both are *keyed*: run in parallel (``parallelism=N``) each instance is given the rows of the
vnodes it owns (hash dispatch by the key) and keeps their state — Arrow-native, in memory and
in its versioned tables, moved by vnode on a rescale (see :mod:`._keyed_state`).

**Emission** (as RisingWave's hash aggregation). The rows of an epoch are folded per key as they
come (:mod:`._accumulators`), and at the barrier that closes the epoch, before it is passed on,
the epoch's changes are emitted as one changelog chunk, keys in the order they first came in
the epoch: an ``INSERT`` for a key seen the first time, an ``UPDATE_DELETE`` of its old row then
an ``UPDATE_INSERT`` of its new one for a key whose output changed, nothing for a key whose
output is unchanged (a ``max`` that was not beaten). An epoch without rows emits nothing.

**The output is a view.** The operator's versioned table
:data:`~barrierflow.actors.backfill.materialize.VIEW_TABLE` holds exactly the output rows (the
key, then the outputs) and its change log is the emitted changelog: a job added later reads the
aggregate with ``SnapshotBackfill("<its name>")`` as it reads a ``Materialize`` view. The state
that is not an output (``mean``'s sum and count) lives in a second table, ``state``, only when
some aggregation needs it.

**The input.** Inserts only: a chunk with deletes or updates is refused with
:class:`~barrierflow.errors.ChangelogInputError` (aggregates over a changelog — retractions —
are for later); a null in a key column with :class:`~barrierflow.errors.InvalidArgumentError`
(the key is the view's primary key). Its schema is needed to open the state tables: given as
``schema=``, the tables open when the actor starts (and a wrong schema is refused when the
operator is made); otherwise they open at the first chunk (or, after a restart, from the schema
the state recorded), and every chunk after it must have the same schema. Declare ``schema=``
for an aggregate a job will read with a snapshot backfill: its view must exist before the first
row comes. A restart whose aggregations give the state another schema (an output added, a type
changed) is refused with :class:`~barrierflow.errors.SchemaMismatchError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.actors.backfill.materialize import VIEW_TABLE, ViewActor
from barrierflow.channels.barrier import Barrier
from barrierflow.channels.chunk import Chunk, Op
from barrierflow.channels.errors import InvalidArgumentError, SchemaMismatchError
from barrierflow.channels.messages import Message
from barrierflow.operators._accumulators import (
    Accumulator,
    Aggregations,
    CombineFn,
    Reduction,
    as_batch,
)
from barrierflow.operators._keyed_state import KeyedState
from barrierflow.operators._operator import (
    Operator,
    OperatorActor,
    check_columns,
    refuse_changes,
)
from barrierflow.runtime.actor import ActorContext
from barrierflow.runtime.placement import Placement

__all__ = ["aggregate", "reduce"]

#: Rows of an epoch buffered before they are folded into a partial (memory stays bounded by
#: the keys, not by the epoch's rows).
FOLD_ROWS = 1 << 20


def aggregate(
    key: str | Sequence[str], *, schema: pa.Schema | None = None, **aggregations: tuple[str, str]
) -> Operator:
    """Aggregate the rows of each key: ``aggregate("user", clicks=("clicks", "sum"),
    last_seen=("ts", "max"))`` (see the module for what is emitted and kept).

    Args:
        key: the key column(s).
        schema: the input's schema, if known (the state opens at start, and the aggregations
            are checked against it now).
        aggregations: ``out_name=(column, function)``, a function of ``sum``, ``count``,
            ``min``, ``max``, ``mean``, ``first``, ``last`` (nulls as SQL: see
            :mod:`._accumulators`).

    Raises:
        InvalidArgumentError: a bad key, no aggregation or a bad one (naming it and the valid
            functions), an output named like a key column, or ``schema`` not a Schema.
        SchemaMismatchError: with ``schema``: a column missing from it, or of a type the
            function does not take.
    """
    columns = check_columns("key", key)
    spec = Aggregations(aggregations)
    spec.check_key(columns)
    _check_schema(schema, spec, columns)
    return Operator(
        "aggregate",
        Placement.KEYED,
        lambda: _Aggregate(columns, spec, schema),
        key=columns,
    )


def reduce(key: str | Sequence[str], fn: CombineFn, *, schema: pa.Schema | None = None) -> Operator:
    """Fold the rows of each key with ``fn(acc, rows) -> rows``: two key-aligned
    ``pyarrow.RecordBatch`` es of the input's schema (the accumulated rows, then the next
    ones) combined into one, vectorized — e.g. a running maximum
    ``lambda acc, rows: pa.record_batch([acc["k"], pc.max_element_wise(acc["v"],
    rows["v"])], names=["k", "v"])``. The output has the input's schema (see the module).

    ``fn`` must be associative (rows are combined pairwise in input order, never reordered;
    see :class:`~._accumulators.Reduction`) and pure (it is called again after a restart). The
    key columns of its result are the left rows'.

    Raises:
        InvalidArgumentError: a bad key, ``fn`` not callable, ``schema`` not a Schema.
        SchemaMismatchError: ``schema`` lacks a key column.
    """
    columns = check_columns("key", key)
    spec = Reduction(fn)
    _check_schema(schema, spec, columns)
    return Operator(
        "reduce",
        Placement.KEYED,
        lambda: _Reduce(columns, Reduction(fn), schema),
        key=columns,
    )


def _check_schema(schema: object, spec: Accumulator, key: tuple[str, ...]) -> None:
    if schema is None:
        return
    if not isinstance(schema, pa.Schema):
        raise InvalidArgumentError("schema", "None or a pyarrow.Schema", schema)
    spec.state_schema(schema, key)


def _same(a: pa.ChunkedArray, b: pa.ChunkedArray) -> npt.NDArray[np.bool_]:
    """Equal or both null, per row."""
    equal = pc.fill_null(pc.equal(a, b), False)
    both = pc.and_(pc.is_null(a), pc.is_null(b))
    same: npt.NDArray[np.bool_] = np.asarray(pc.or_(equal, both))
    return same


def _unchanged(old: pa.Table, new: pa.Table, key: tuple[str, ...]) -> npt.NDArray[np.bool_]:
    """Whether each key-aligned row of ``old`` and ``new`` holds the same values."""
    same = np.ones(old.num_rows, np.bool_)
    for name in old.column_names:
        if name not in key:
            same &= _same(old.column(name), new.column(name))
    return same


class _KeyedFold(OperatorActor, ViewActor):
    """The actor of :func:`aggregate` and :func:`reduce` (see the module)."""

    placement: ClassVar[Placement] = Placement.KEYED

    def __init__(self, key: tuple[str, ...], spec: Accumulator, schema: pa.Schema | None) -> None:
        super().__init__()
        self._key = key
        self.spec = spec
        self.input_schema = schema
        needs_state = isinstance(spec, Aggregations) and spec.needs_state
        self.state = KeyedState(
            key,
            table="state" if needs_state else VIEW_TABLE,
            view=spec if needs_state else None,
            stats=self.stats,
        )
        self._rows: list[pa.Table] = []
        self._buffered = 0
        self._partials: list[pa.Table] = []

    async def restore(self, ctx: ActorContext) -> None:
        """Load the state of the vnodes this instance owns (see :mod:`._keyed_state`)."""
        if isinstance(self.spec, Reduction):
            self.spec.actor = ctx.name
        schema = self.input_schema
        state_schema = None if schema is None else self.spec.state_schema(schema, self._key)
        await self.state.restore(ctx, state_schema)

    async def process(self, message: Message, ctx: ActorContext) -> None:
        """Fold a chunk's rows; at a barrier, emit the epoch's changelog, then pass it on."""
        if isinstance(message, Chunk):
            await self._take(message, ctx)
        elif isinstance(message, Barrier):
            await self._emit_changes(ctx)
            await self.state.pass_barrier(message, ctx)
        else:
            await ctx.emit(message)

    async def _take(self, chunk: Chunk, ctx: ActorContext) -> None:
        chunk = chunk.compact()
        n = chunk.num_rows
        if not n:
            return
        refuse_changes(
            chunk.ops,
            ctx.name,
            self.kind,
            "an insert-only input (aggregates over a changelog are for later)",
        )
        rows = pa.Table.from_batches([chunk.batch])
        for name in self._key:
            nulls = rows.column(name).null_count if name in rows.column_names else 0
            if nulls:
                raise InvalidArgumentError(
                    f"{self.kind} {ctx.name!r}: key column {name!r}", "no nulls", f"{nulls} null(s)"
                )
        await self._bind(rows.schema, ctx)
        self.stats.rows_in += n
        self._rows.append(rows)
        self._buffered += n
        if self._buffered >= FOLD_ROWS:
            self._fold()

    async def _bind(self, schema: pa.Schema, ctx: ActorContext) -> None:
        """Check the chunk's schema: the first one known opens the state."""
        if self.input_schema is None:
            state_schema = self.spec.state_schema(schema, self._key)
            if self.state.is_open and not state_schema.equals(self.state.schema):
                raise SchemaMismatchError(
                    f"{self.kind} {ctx.name!r}: input", self.state.schema, state_schema
                )
            self.input_schema = schema
            await self.state.open(ctx, state_schema)
        elif not schema.equals(self.input_schema):
            raise SchemaMismatchError(f"{self.kind} {ctx.name!r}: input", self.input_schema, schema)

    def _fold(self) -> None:
        if self._rows:
            self._partials.append(self.spec.partial(pa.concat_tables(self._rows), self._key))
            self._rows, self._buffered = [], 0

    async def _emit_changes(self, ctx: ActorContext) -> None:
        """The epoch's changelog, emitted and written (see the module)."""
        self._fold()
        partials, self._partials = self._partials, []
        if not partials:
            return
        epoch = (
            partials[0]
            if len(partials) == 1
            else self.spec.combine(pa.concat_tables(partials), self._key)
        )
        state, spec, key = self.state, self.spec, self._key
        at = state.lookup(epoch)
        fresh = np.flatnonzero(at < 0)
        known = np.flatnonzero(at >= 0)
        old = state.rows.take(pa.array(at[known]))
        merged = spec.merge(old, epoch.take(pa.array(known)), key).cast(epoch.schema)
        # The new state, aligned with the epoch's keys (their order of first appearance).
        final = pa.concat_tables([epoch.take(pa.array(fresh)), merged]).take(
            pa.array(np.argsort(np.concatenate([fresh, known])))
        )
        new_out = spec.outputs(final)
        old_out = spec.outputs(old)
        kept = _unchanged(old_out, new_out.take(pa.array(known)), key)
        changed = known[~kept]
        # The rows emitted, in the epoch's key order: an INSERT of each fresh key (one row),
        # an UPDATE_DELETE of the old row then an UPDATE_INSERT of the new one of each changed
        # key (two rows); rows of new_out, then of old_out (at n + its place among the known).
        n = epoch.num_rows
        count = np.zeros(n, np.int64)
        count[fresh] = 1
        count[changed] = 2
        start = np.cumsum(count) - count
        take = np.zeros(int(count.sum()), np.int64)
        ops = np.zeros(len(take), np.int8)
        take[start[fresh]] = fresh
        ops[start[fresh]] = Op.INSERT
        take[start[changed]] = n + np.flatnonzero(~kept)
        ops[start[changed]] = Op.UPDATE_DELETE
        take[start[changed] + 1] = changed
        ops[start[changed] + 1] = Op.UPDATE_INSERT
        rows = pa.concat_tables([new_out, old_out]).take(pa.array(take))
        ops_array = pa.array(ops)
        # The state changes where any state column does (mean's count may grow while the mean
        # stays): those rows are written; the view gets the changelog.
        moved = np.concatenate([fresh, known[~_unchanged(old, merged, key)]])
        state.upsert(final.take(pa.array(moved)), at[moved], (rows, ops_array))
        if rows.num_rows:
            self.stats.rows_out += rows.num_rows
            await ctx.emit(Chunk(as_batch(rows), ops_array))


@final
class _Aggregate(_KeyedFold):
    kind: ClassVar[str] = "aggregate"


@final
class _Reduce(_KeyedFold):
    kind: ClassVar[str] = "reduce"
