"""Accumulators of keyed operators: how rows of one key fold into one row of state, vectorized.

A keyed operator (an aggregate, a reduce, a window) keeps one row of *state* per key and turns
it into one row of *output*. An :class:`Accumulator` says how, in four vectorized steps over
Arrow tables (never a Python loop per row):

* :meth:`~Accumulator.partial` — the rows of a chunk (or an epoch) folded into one state row
  per key, in input order;
* :meth:`~Accumulator.combine` — partials concatenated in input order folded again (the rows of
  an epoch arrive as several chunks);
* :meth:`~Accumulator.merge` — two key-aligned state tables (the state before an epoch, the
  epoch's partial) folded into the new state;
* :meth:`~Accumulator.outputs` — the output rows of state rows.

Two kinds exist: :class:`Aggregations` (named SQL-like aggregations: ``sum``, ``count``,
``min``, ``max``, ``mean``, ``first``, ``last``) and :class:`Reduction` (a user's vectorized
combine of key-aligned batches).

**Nulls follow SQL.** ``sum`` of no non-null value is null, ``count`` counts non-null values
(0, never null), ``min``/``max`` skip nulls, ``mean`` is the sum over the count of non-null
values (null with none). ``first`` and ``last`` are the first and last *rows'* values, nulls
included: a key whose first row holds a null in the column has a null ``first``.

**The state of an aggregation** is a column per output named for it (``sum``, ``count``,
``min``, ``max``, ``first``, ``last``: the state *is* the output), except ``mean``, kept as two
columns ``<name>:sum`` (float64) and ``<name>:count`` (int64) and divided on output. The key
columns come first, declared not nullable (a state table's primary key).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Protocol, final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.channels.errors import InvalidArgumentError, SchemaMismatchError

__all__ = [
    "FUNCTIONS",
    "Accumulator",
    "Aggregations",
    "CombineFn",
    "Reduction",
    "as_batch",
    "group_rows",
    "key_schema",
]

#: The aggregation functions, in the order an error lists them.
FUNCTIONS = ("sum", "count", "min", "max", "mean", "first", "last")

#: A user's combine: two key-aligned batches (the accumulated rows, the next rows) → one.
CombineFn = Callable[[pa.RecordBatch, pa.RecordBatch], pa.RecordBatch]

# first/last keep nulls: the first *row's* value, not the first non-null one. (A count's
# default counts the non-null values.)
_ORDERED = pc.ScalarAggregateOptions(skip_nulls=False)


class Accumulator(Protocol):
    """How the rows of a key fold into one row of state (see the module)."""

    def state_schema(self, input_schema: pa.Schema, key: tuple[str, ...]) -> pa.Schema:
        """The state's schema for rows of ``input_schema`` keyed by ``key``."""
        ...

    def view_schema(self, state_schema: pa.Schema) -> pa.Schema:
        """The output's schema, from the state's (what a restarted actor knows first)."""
        ...

    def partial(self, rows: pa.Table, key: tuple[str, ...]) -> pa.Table:
        """``rows`` (input rows) folded into one state row per key, in input order."""
        ...

    def combine(self, partials: pa.Table, key: tuple[str, ...]) -> pa.Table:
        """Partials concatenated in input order, folded into one state row per key."""
        ...

    def merge(self, old: pa.Table, new: pa.Table, key: tuple[str, ...]) -> pa.Table:
        """Key-aligned state rows (``old`` came first) folded into one table of state."""
        ...

    def outputs(self, state: pa.Table) -> pa.Table:
        """The output rows of state rows (the key, then the outputs)."""
        ...


def key_schema(input_schema: pa.Schema, key: tuple[str, ...]) -> list[pa.Field]:
    """The key fields of ``input_schema``, not nullable (a state table's primary key).

    Raises:
        SchemaMismatchError: a key column is missing.
    """
    fields = []
    for name in key:
        index = input_schema.get_field_index(name)
        if index < 0:
            raise SchemaMismatchError("key", f"a schema with the key column {name!r}", input_schema)
        fields.append(input_schema.field(index).with_nullable(False))
    return fields


def as_batch(table: pa.Table) -> pa.RecordBatch:
    """``table``'s rows as one record batch (what a user's function is given)."""
    batches = table.combine_chunks().to_batches()
    if len(batches) == 1:
        return batches[0]
    return pa.RecordBatch.from_pylist([], schema=table.schema)  # no rows: no batch


def group_rows(
    rows: pa.Table, key: tuple[str, ...]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]:
    """The rows of ``rows`` grouped by ``key``: ``(order, lengths)`` — the row indices, each
    key's rows together in input order, keys in order of first appearance; and each key's row
    count. One hash aggregation, no loop per row."""
    indexed = rows.select(list(key)).append_column("_row", pa.array(np.arange(rows.num_rows)))
    lists = indexed.group_by(list(key), use_threads=False).aggregate([("_row", "list")])
    column = lists.column("_row_list").combine_chunks()
    order: npt.NDArray[np.int64] = np.asarray(pc.list_flatten(column))
    lengths: npt.NDArray[np.int32] = np.asarray(pc.list_value_length(column))
    return order, lengths


# Aggregations.


def _sum_type(typ: pa.DataType) -> pa.DataType | None:
    if pa.types.is_signed_integer(typ):
        return pa.int64()
    if pa.types.is_unsigned_integer(typ):
        return pa.uint64()
    if pa.types.is_floating(typ):
        return pa.float64()
    return None


def _orderable(typ: pa.DataType) -> bool:
    return bool(
        pa.types.is_integer(typ)
        or pa.types.is_floating(typ)
        or pa.types.is_temporal(typ)
        or pa.types.is_string(typ)
        or pa.types.is_large_string(typ)
        or pa.types.is_binary(typ)
        or pa.types.is_large_binary(typ)
    )


@final
class Aggregations:
    """Named aggregations ``out_name=(column, function)`` (see the module).

    Args:
        aggregations: output name → ``(input column, function)``, a function of
            :data:`FUNCTIONS`.

    Raises:
        InvalidArgumentError: no aggregation, an output name that is not a non-empty str (or
            holds ``:``, which names ``mean``'s hidden columns), an entry that is not a
            ``(column, function)`` pair of strs, or an unknown function — naming the entry
            and the valid functions.
    """

    #: Functions whose state is not the output (kept in hidden columns).
    hidden: ClassVar[frozenset[str]] = frozenset({"mean"})

    def __init__(self, aggregations: Mapping[str, tuple[str, str]]) -> None:
        if not isinstance(aggregations, Mapping) or not aggregations:
            raise InvalidArgumentError(
                "aggregations", "at least one out_name=(column, function)", aggregations
            )
        checked: dict[str, tuple[str, str]] = {}
        for name, entry in aggregations.items():
            if not isinstance(name, str) or not name or ":" in name:
                raise InvalidArgumentError(
                    "aggregations", "output names that are non-empty strs without ':'", name
                )
            if (
                not isinstance(entry, tuple)
                or len(entry) != 2
                or not all(isinstance(part, str) and part for part in entry)
            ):
                raise InvalidArgumentError(
                    f"aggregations[{name!r}]", "a (column, function) pair of strs", entry
                )
            if entry[1] not in FUNCTIONS:
                raise InvalidArgumentError(
                    f"aggregations[{name!r}]", f"a function of {list(FUNCTIONS)}", entry[1]
                )
            checked[name] = entry
        self.aggregations: dict[str, tuple[str, str]] = checked

    @property
    def needs_state(self) -> bool:
        """Whether some state is not an output (``mean``'s sum and count)."""
        return any(function in self.hidden for _, function in self.aggregations.values())

    def __repr__(self) -> str:
        return f"Aggregations({self.aggregations!r})"

    def check_key(self, key: tuple[str, ...]) -> None:
        """Refuse an output named like a key column (both would be columns of the output).

        Raises:
            InvalidArgumentError: naming the output.
        """
        for name in self.aggregations:
            if name in key:
                raise InvalidArgumentError(
                    "aggregations", f"output names other than the key columns {list(key)}", name
                )

    # Schemas.

    def _value_fields(self, input_schema: pa.Schema) -> list[pa.Field]:
        fields: list[pa.Field] = []
        for name, (column, function) in self.aggregations.items():
            index = input_schema.get_field_index(column)
            if index < 0:
                raise SchemaMismatchError(
                    f"aggregations[{name!r}]", f"a schema with the column {column!r}", input_schema
                )
            typ = input_schema.field(index).type
            if function == "count":
                fields.append(pa.field(name, pa.int64(), nullable=False))
            elif function in ("sum", "mean"):
                total = _sum_type(typ)
                if total is None:
                    raise SchemaMismatchError(
                        f"aggregations[{name!r}]",
                        f"a numeric column {column!r} to {function}",
                        f"{column}: {typ}",
                    )
                if function == "sum":
                    fields.append(pa.field(name, total))
                else:
                    fields.append(pa.field(f"{name}:sum", pa.float64()))
                    fields.append(pa.field(f"{name}:count", pa.int64(), nullable=False))
            elif function in ("min", "max") and not _orderable(typ):
                raise SchemaMismatchError(
                    f"aggregations[{name!r}]",
                    f"an orderable column {column!r} (number, time, string, binary)",
                    f"{column}: {typ}",
                )
            else:
                fields.append(pa.field(name, typ))
        return fields

    def state_schema(self, input_schema: pa.Schema, key: tuple[str, ...]) -> pa.Schema:
        """The key columns (not nullable), then each aggregation's state columns.

        Raises:
            SchemaMismatchError: a key or input column missing from ``input_schema``, a
                ``sum``/``mean`` of a column that is not numeric, a ``min``/``max`` of one
                that is not orderable.
            InvalidArgumentError: an output named like a key column.
        """
        self.check_key(key)
        return pa.schema([*key_schema(input_schema, key), *self._value_fields(input_schema)])

    def view_schema(self, state_schema: pa.Schema) -> pa.Schema:
        """The output's schema: the key, then each output (``mean``: float64)."""
        state = self._state_columns
        keys = [f for f in state_schema if f.name not in state]
        outputs = [
            pa.field(name, pa.float64()) if function == "mean" else state_schema.field(name)
            for name, (_, function) in self.aggregations.items()
        ]
        return pa.schema([*keys, *outputs])

    def output_schema(self, input_schema: pa.Schema, key: tuple[str, ...]) -> pa.Schema:
        """The output's schema for rows of ``input_schema`` (see :meth:`state_schema`)."""
        return self.view_schema(self.state_schema(input_schema, key))

    # Folding.

    def partial(self, rows: pa.Table, key: tuple[str, ...]) -> pa.Table:
        """One state row per key of ``rows``, keys in order of first appearance."""
        schema = self.state_schema(rows.schema, key)
        columns: dict[str, Any] = {name: rows.column(name) for name in key}
        specs: list[tuple[str, str, Any]] = []
        # Arrow's sums widen (int64, uint64, float64) and the fold casts to the state's types.
        for name, (column, function) in self.aggregations.items():
            values = rows.column(column)
            if function == "mean":
                columns[f"{name}:sum"] = values
                columns[f"{name}:count"] = values
                specs.append((f"{name}:sum", "sum", None))
                specs.append((f"{name}:count", "count", None))
            else:
                columns[name] = values
                specs.append((name, function, _ORDERED if function in ("first", "last") else None))
        return self._fold(pa.table(columns), key, specs, schema)

    def combine(self, partials: pa.Table, key: tuple[str, ...]) -> pa.Table:
        """Partials (in input order) folded into one state row per key."""
        specs: list[tuple[str, str, Any]] = []
        for name, (_, function) in self.aggregations.items():
            if function == "mean":
                specs.append((f"{name}:sum", "sum", None))
                specs.append((f"{name}:count", "sum", None))
            elif function == "count":
                specs.append((name, "sum", None))
            else:
                specs.append((name, function, _ORDERED if function in ("first", "last") else None))
        return self._fold(partials, key, specs, partials.schema)

    @staticmethod
    def _fold(
        rows: pa.Table, key: tuple[str, ...], specs: list[tuple[str, str, Any]], schema: pa.Schema
    ) -> pa.Table:
        # use_threads=False keeps the rows' order: first/last and the keys' order are defined.
        folded = rows.group_by(list(key), use_threads=False).aggregate(
            [(column, function, options) for column, function, options in specs]
        )
        arrays = [folded.column(name) for name in key]
        arrays += [folded.column(f"{column}_{function}") for column, function, _ in specs]
        names = [*key, *(column for column, _, _ in specs)]
        return pa.table(arrays, names=names).cast(schema)

    def merge(self, old: pa.Table, new: pa.Table, key: tuple[str, ...]) -> pa.Table:
        """Key-aligned state rows folded: sums and counts added (a null sum is no value),
        min/max of both, ``first`` kept, ``last`` taken."""
        columns = {}
        for field in old.schema:
            name = field.name
            if name not in self._state_columns:
                columns[name] = old.column(name)  # a key column
                continue
            a, b = old.column(name), new.column(name)
            function = self._state_columns[name]
            if function in ("sum", "count"):
                columns[name] = pc.coalesce(pc.add(a, b), a, b)
            elif function == "min":
                columns[name] = pc.min_element_wise(a, b)
            elif function == "max":
                columns[name] = pc.max_element_wise(a, b)
            elif function == "first":
                columns[name] = a
            else:
                columns[name] = b
        return pa.table(columns).cast(old.schema)

    @property
    def _state_columns(self) -> dict[str, str]:
        """State column → how it merges (``sum``, ``count``, ``min``, ``max``, ``first``,
        ``last``)."""
        found = {}
        for name, (_, function) in self.aggregations.items():
            if function == "mean":
                found[f"{name}:sum"] = "sum"
                found[f"{name}:count"] = "count"
            else:
                found[name] = function
        return found

    def outputs(self, state: pa.Table) -> pa.Table:
        """The key and each output (``mean`` = sum / count, null for no value)."""
        schema = self.view_schema(state.schema)
        columns = []
        for field in schema:
            name = field.name
            function = self.aggregations[name][1] if name in self.aggregations else None
            if function == "mean":
                total = state.column(f"{name}:sum")
                count = state.column(f"{name}:count").cast(pa.float64())
                columns.append(pc.divide(total, count))
            else:
                columns.append(state.column(name))
        return pa.table(columns, schema=schema)


# Reduction.


@final
class Reduction:
    """A user's combine as an accumulator: the state of a key is a row of the input's schema,
    and ``fn(acc, rows)`` folds key-aligned batches (see :func:`~barrierflow.operators.
    aggregate.reduce`).

    **Order and associativity.** The rows of a key are combined in input order, pairwise —
    ``fn(fn(r0, r1), fn(r2, r3))`` — so that an epoch's rows take ``log2(rows per key)`` calls
    of ``fn`` on whole batches, never one per row: ``fn`` must be associative (as Spark's
    ``reduceByKey`` requires), not commutative: the left batch is always the earlier rows.

    The key columns of the result are the left batch's (``fn`` cannot move a row to another
    key).

    Raises:
        InvalidArgumentError: ``fn`` is not callable.
    """

    def __init__(self, fn: CombineFn) -> None:
        if not callable(fn):
            raise InvalidArgumentError(
                "fn", "a function (acc: RecordBatch, rows: RecordBatch) -> RecordBatch", fn
            )
        self.fn = fn
        #: The actor's name, for errors (set by the actor).
        self.actor = "reduce"

    def state_schema(self, input_schema: pa.Schema, key: tuple[str, ...]) -> pa.Schema:
        """The input's schema, its key columns not nullable.

        Raises:
            SchemaMismatchError: a key column is missing.
        """
        keys = {f.name: f for f in key_schema(input_schema, key)}
        return pa.schema([keys.get(f.name, f) for f in input_schema])

    def view_schema(self, state_schema: pa.Schema) -> pa.Schema:
        """The state's schema: the output is the state."""
        return state_schema

    def partial(self, rows: pa.Table, key: tuple[str, ...]) -> pa.Table:
        """One row per key: its rows combined pairwise in input order."""
        return self._tree(rows.cast(self.state_schema(rows.schema, key)), key)

    def combine(self, partials: pa.Table, key: tuple[str, ...]) -> pa.Table:
        """Partials combined pairwise in input order (as :meth:`partial`)."""
        return self._tree(partials, key)

    def _tree(self, rows: pa.Table, key: tuple[str, ...]) -> pa.Table:
        order, lengths = group_rows(rows, key)
        rows = rows.take(pa.array(order))
        while len(lengths) and int(lengths.max()) > 1:
            starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
            rank = np.arange(len(starts)) - starts
            size = np.repeat(lengths, lengths)
            left = np.flatnonzero((rank % 2 == 0) & (rank + 1 < size))
            alone = np.flatnonzero((rank % 2 == 0) & (rank + 1 >= size))
            combined = self._call(rows.take(pa.array(left)), rows.take(pa.array(left + 1)), key)
            merged = pa.concat_tables([combined, rows.take(pa.array(alone))])
            rows = merged.take(pa.array(np.argsort(np.concatenate([left, alone]))))  # distinct
            lengths = (lengths + 1) // 2
        return rows

    def merge(self, old: pa.Table, new: pa.Table, key: tuple[str, ...]) -> pa.Table:
        """``fn(old, new)``: the state, then the epoch's rows."""
        return self._call(old, new, key)

    def outputs(self, state: pa.Table) -> pa.Table:
        """The state (the output is the state)."""
        return state

    def _call(self, acc: pa.Table, rows: pa.Table, key: tuple[str, ...]) -> pa.Table:
        """``fn`` on key-aligned rows, its result checked and given the left rows' keys.

        Raises:
            InvalidArgumentError: ``fn`` returned no RecordBatch, or another number of rows.
            SchemaMismatchError: its result has other column names or types than the state.
        """
        out = self.fn(as_batch(acc), as_batch(rows))
        if not isinstance(out, pa.RecordBatch):
            raise InvalidArgumentError(
                f"reduce {self.actor!r}: fn's result", "a pyarrow.RecordBatch", out
            )
        if out.num_rows != acc.num_rows:
            raise InvalidArgumentError(
                f"reduce {self.actor!r}: fn's result",
                f"{acc.num_rows} rows (one per key-aligned row)",
                f"{out.num_rows} rows",
            )
        schema = acc.schema
        if out.schema.names != schema.names or out.schema.types != schema.types:
            raise SchemaMismatchError(f"reduce {self.actor!r}: fn's result", schema, out.schema)
        table = pa.Table.from_batches([out])
        for name in key:
            table = table.set_column(table.schema.get_field_index(name), name, acc.column(name))
        return table.cast(schema)
