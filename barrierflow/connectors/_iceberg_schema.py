"""The Arrow and Iceberg schemas of an :class:`~barrierflow.connectors.iceberg_table.IcebergTable`:
whether a table's schema is the sink's, and the schema changes a commit may carry.

Apart from the sink because they are about types, not about files or transactions: the sink
checks an opened table with :func:`same_fields`; its committer checks a schema change at
pre-commit (:func:`check_schema_change`), before the epoch is persisted as pending, and applies
it in the commit's transaction (:func:`evolve`). pyiceberg is imported only when a change is
applied.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from barrierflow._extras import require
from barrierflow.actors.sinks.table import SchemaChange
from barrierflow.channels.errors import InvalidArgumentError

__all__ = ["ICEBERG_TYPES", "check_schema_change", "evolve", "same_fields"]

#: The column types a schema change may add: their names, and pyiceberg's type classes.
ICEBERG_TYPES = {
    "int32": "IntegerType",
    "int64": "LongType",
    "float": "FloatType",
    "double": "DoubleType",
    "string": "StringType",
    "bool": "BooleanType",
}


def _plain(type_: pa.DataType) -> pa.DataType:
    """Iceberg reads strings and binaries back as their large Arrow forms; either is fine."""
    if pa.types.is_large_string(type_):
        return pa.string()
    if pa.types.is_large_binary(type_):
        return pa.binary()
    return type_


def same_fields(a: pa.Schema, b: pa.Schema) -> bool:
    """Whether two schemas have the same names, types and nullability, in order (a large
    string or binary matching its plain form)."""

    def fields(schema: pa.Schema) -> list[tuple[str, pa.DataType, bool]]:
        return [(f.name, _plain(f.type), f.nullable) for f in schema]

    return fields(a) == fields(b)


def check_schema_change(change: SchemaChange) -> None:
    """Check that ``change`` is ``{"add_columns": [{"name": ..., "type": ...}, ...]}`` with
    types among :data:`ICEBERG_TYPES`.

    Raises:
        InvalidArgumentError: any other shape or type.
    """
    columns = change.get("add_columns")
    if set(change) != {"add_columns"} or not isinstance(columns, list) or not columns:
        raise InvalidArgumentError(
            "schema_change", "{'add_columns': [{'name': ..., 'type': ...}, ...]}", dict(change)
        )
    for column in columns:
        if (
            not isinstance(column, Mapping)
            or not isinstance(column.get("name"), str)
            or column.get("type") not in ICEBERG_TYPES
        ):
            raise InvalidArgumentError(
                "schema_change",
                f"columns with a name and a type in {sorted(ICEBERG_TYPES)}",
                column,
            )


def evolve(tx: Any, change: SchemaChange) -> None:
    """Add ``change``'s columns (checked already) in the pyiceberg transaction ``tx``."""
    types = require("iceberg", "pyiceberg.types")
    with tx.update_schema() as update:
        for column in change["add_columns"]:
            update.add_column(column["name"], getattr(types, ICEBERG_TYPES[column["type"]])())
