"""Schema checks for data handed over from outside a graph (a driver's batch, a Spark frame).

Field names and types must match; nullability and metadata may differ, because engines such
as Spark declare columns ``not null`` that a graph declares nullable.
"""

from __future__ import annotations

import pyarrow as pa

from barrierflow.channels.errors import InvalidArgumentError, SchemaMismatchError

__all__ = ["cast_fixes", "check_schema", "conform_schema"]


def check_schema(got: pa.Schema, schema: pa.Schema, what: str) -> None:
    """Check that ``got`` has ``schema``'s field names and types, in order (nullability and
    metadata may differ).

    Raises:
        SchemaMismatchError: they differ (names both schemas).
    """
    if got.names != schema.names or any(a.type != b.type for a, b in zip(got, schema, strict=True)):
        raise SchemaMismatchError(what, schema, got)


def conform_schema(table: pa.Table | pa.RecordBatch, schema: pa.Schema, what: str) -> pa.Table:
    """``table`` as a table of ``schema``, without copying data.

    Field names and types must match exactly; nullability and metadata may differ (Spark marks
    columns ``not null`` that a graph declares nullable), but a column holding nulls cannot
    become a non-nullable field.

    Raises:
        SchemaMismatchError: names or types differ, or nulls in a non-nullable field (names
            both schemas).
    """
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    if not isinstance(table, pa.Table):
        raise InvalidArgumentError(what, "a pyarrow Table or RecordBatch", type(table).__name__)
    got = table.schema
    check_schema(got, schema, what)
    if got.equals(schema, check_metadata=True):
        return table
    for field, column in zip(schema, table.columns, strict=True):
        if not field.nullable and column.null_count:
            raise SchemaMismatchError(what, schema, f"{got} ({field.name!r} holds nulls)")
    return pa.Table.from_arrays(table.columns, schema=schema)


def cast_fixes(want: pa.DataType, have: pa.DataType) -> bool:
    """Whether a plain cast turns ``have`` into ``want`` because they differ only in a
    timestamp's time zone (same unit) or an integer's width or sign — the two differences users
    meet most (Spark and pandas hand out UTC or naive timestamps and 32-bit integers where a
    table declares them otherwise), and the ones an error message can say how to fix."""
    if pa.types.is_timestamp(want) and pa.types.is_timestamp(have):
        return bool(want.unit == have.unit)
    return bool(pa.types.is_integer(want) and pa.types.is_integer(have))
