"""The stateless operators: :func:`map_batches` (a vectorized function of a batch) and
:func:`filter_rows` (a predicate that becomes the chunk's visibility mask).

Both are *partition-local*: any instance can take any row, so run in parallel they are fed
round robin (and the next step may run them on Spark's executors). Neither keeps state, so a
restart needs nothing restored; barriers, watermarks and committables pass through in order.

**What a map sees.** ``fn`` gets the chunk's *visible* rows as a ``pyarrow.RecordBatch`` — a
chunk with a visibility mask (a filter upstream) is compacted first, which copies the visible
rows once, as a sink would; a map before a filter never copies. A map that returns as many
rows as it was given is *row for row*: the output keeps the input's ops, so a changelog stays a
changelog (``fn`` must not reorder rows — the ops are matched by position). A map that returns
another number of rows (an explode, a dedup) makes new rows: allowed on an insert-only input
(the output is insert-only), refused on a changelog with :class:`~barrierflow.errors.
ChangelogInputError` — which output row would retract which input row is unknowable.

**What a filter does.** The predicate's mask is ANDed with the chunk's own and becomes the new
visibility mask: the Arrow buffers are shared, not copied (:meth:`~barrierflow.channels.Chunk.
with_visibility`). The predicate is either a ``pyarrow.compute`` expression
(``pc.field("clicks") > 0``; evaluated with Acero, ≈ 0.15 ms a batch) or a function of the
batch returning a boolean mask (the cheaper path for hot pipelines: the compute calls alone).
A null in the mask drops the row (SQL's ``WHERE``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, final

import numpy as np
import pyarrow as pa
import pyarrow.acero as acero
import pyarrow.compute as pc

from barrierflow.channels.chunk import Chunk
from barrierflow.channels.errors import InvalidArgumentError, SchemaMismatchError
from barrierflow.channels.messages import Message
from barrierflow.operators._operator import Operator, OperatorActor
from barrierflow.operators.errors import ChangelogInputError
from barrierflow.runtime.actor import ActorContext
from barrierflow.runtime.placement import Placement

__all__ = ["CHANGE_KINDS", "changelog_rows", "filter_rows", "map_batches"]

#: A batch function: visible rows in, rows out.
BatchFn = Callable[[pa.RecordBatch], pa.RecordBatch]
#: A predicate function: rows in, one bool per row out.
MaskFn = Callable[[pa.RecordBatch], Any]


def map_batches(fn: BatchFn, *, schema: pa.Schema | None = None) -> Operator:
    """A vectorized map: ``fn(batch) -> batch`` over each chunk's visible rows (see the
    module for ops and row counts).

    Args:
        fn: the function (pure: it may be called again for the same rows after a restart).
        schema: the schema ``fn`` returns, if known: every result is checked against it, so a
            wrong result fails the actor at once, naming both schemas.

    Raises:
        InvalidArgumentError: ``fn`` is not callable, or ``schema`` not a Schema.
    """
    if not callable(fn):
        raise InvalidArgumentError("fn", "a function of a pyarrow.RecordBatch", fn)
    if schema is not None and not isinstance(schema, pa.Schema):
        raise InvalidArgumentError("schema", "None or a pyarrow.Schema", schema)
    return Operator("map_batches", Placement.PARTITION_LOCAL, lambda: _Map(fn, schema))


def filter_rows(predicate: pc.Expression | MaskFn) -> Operator:
    """Keep the rows where ``predicate`` holds, as a new visibility mask (see the module).

    Args:
        predicate: a ``pyarrow.compute`` expression over the columns, or a function of a
            ``pyarrow.RecordBatch`` returning a boolean mask (an Arrow or NumPy array, one
            entry per row).

    Raises:
        InvalidArgumentError: ``predicate`` is neither.
    """
    if not isinstance(predicate, pc.Expression) and not callable(predicate):
        raise InvalidArgumentError(
            "predicate", "a pyarrow.compute Expression or a function returning a mask", predicate
        )
    return Operator("filter", Placement.PARTITION_LOCAL, lambda: _Filter(predicate))


#: How :func:`changelog_rows` names each op: Flink's ``RowKind`` short strings.
CHANGE_KINDS = ("+I", "-D", "-U", "+U")


def changelog_rows(column: str = "op") -> Operator:
    """A changelog as plain rows: each visible row becomes an insert with one more column,
    ``column``, saying what it was — ``"+I"`` (insert), ``"-U"`` / ``"+U"`` (the old and the
    new row of an update), ``"-D"`` (delete), as Flink's ``RowKind`` prints them. What an
    append-only table (Parquet, Iceberg, Delta) keeps of an ``aggregate``'s output: the full
    history of its changes, from which the last ``+I``/``+U`` of each key is the current row.
    An insert-only input gets ``"+I"`` on every row.

    Raises:
        InvalidArgumentError: ``column`` is not a non-empty str.
    """
    if not isinstance(column, str) or not column:
        raise InvalidArgumentError("column", "a non-empty column name", column)
    return Operator("changelog_rows", Placement.PARTITION_LOCAL, lambda: _ChangelogRows(column))


@final
class _ChangelogRows(OperatorActor):
    kind: ClassVar[str] = "changelog_rows"

    def __init__(self, column: str) -> None:
        super().__init__()
        self._column = column
        self._kinds = pa.array(CHANGE_KINDS, pa.string())

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if not isinstance(message, Chunk):
            await ctx.emit(message)
            return
        chunk = message.compact()
        batch = chunk.batch
        if self._column in batch.schema.names:
            raise InvalidArgumentError(
                f"changelog_rows {ctx.name!r}: column",
                f"a name the input does not have ({batch.schema.names})",
                self._column,
            )
        codes = np.zeros(batch.num_rows, np.int8) if chunk.ops is None else chunk.ops_numpy()
        kinds = self._kinds.take(pa.array(codes.astype(np.int64)))
        self.stats.rows_in += batch.num_rows
        self.stats.rows_out += batch.num_rows
        await ctx.emit(Chunk(batch.append_column(self._column, kinds)))


@final
class _Map(OperatorActor):
    kind: ClassVar[str] = "map_batches"

    def __init__(self, fn: BatchFn, schema: pa.Schema | None) -> None:
        super().__init__()
        self._fn = fn
        self._schema = schema

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if not isinstance(message, Chunk):
            await ctx.emit(message)
            return
        chunk = message.compact()
        rows = chunk.num_rows
        self.stats.rows_in += rows
        out = self._fn(chunk.batch)
        if not isinstance(out, pa.RecordBatch):
            raise InvalidArgumentError(
                f"map_batches {ctx.name!r}: fn's result", "a pyarrow.RecordBatch", out
            )
        if self._schema is not None and not out.schema.equals(self._schema):
            raise SchemaMismatchError(
                f"map_batches {ctx.name!r}: fn's result", self._schema, out.schema
            )
        ops = chunk.ops
        if out.num_rows != rows:
            if ops is not None and bool(pc.any(pc.not_equal(ops, 0)).as_py()):
                raise ChangelogInputError(
                    ctx.name,
                    "map_batches",
                    "a function that returns one row per input row on a changelog",
                    f"{out.num_rows} rows for {rows} rows with deletes or updates",
                )
            ops = None
        self.stats.rows_out += out.num_rows
        await ctx.emit(Chunk(out, ops))


@final
class _Filter(OperatorActor):
    kind: ClassVar[str] = "filter"

    def __init__(self, predicate: pc.Expression | MaskFn) -> None:
        super().__init__()
        self._predicate = predicate

    def _mask(self, batch: pa.RecordBatch, actor: str) -> pa.BooleanArray:
        predicate = self._predicate
        if isinstance(predicate, pc.Expression):
            plan = acero.Declaration.from_sequence(
                [
                    acero.Declaration(
                        "table_source",
                        acero.TableSourceNodeOptions(pa.Table.from_batches([batch])),
                    ),
                    acero.Declaration("project", acero.ProjectNodeOptions([predicate], ["m"])),
                ]
            )
            mask: Any = plan.to_table().column(0).combine_chunks()
        else:
            mask = predicate(batch)
        if isinstance(mask, np.ndarray):
            mask = pa.array(mask)
        if isinstance(mask, pa.ChunkedArray):
            mask = mask.combine_chunks()
        if (
            not isinstance(mask, pa.Array)
            or not pa.types.is_boolean(mask.type)
            or len(mask) != batch.num_rows
        ):
            raise InvalidArgumentError(
                f"filter {actor!r}: the predicate's result",
                f"a boolean mask of {batch.num_rows} entries",
                mask if not isinstance(mask, pa.Array) else f"{mask.type}[{len(mask)}]",
            )
        return mask.fill_null(False) if mask.null_count else mask

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if not isinstance(message, Chunk):
            await ctx.emit(message)
            return
        self.stats.rows_in += message.cardinality
        mask = self._mask(message.batch, ctx.name)
        if message.visibility is not None:
            mask = pc.and_(mask, message.visibility)
        out = message.with_visibility(mask)
        self.stats.rows_out += out.cardinality
        await ctx.emit(out)
