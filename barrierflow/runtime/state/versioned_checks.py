"""The checks a versioned table makes of what it is given: its key columns, its options, the
ops of a write (see :mod:`.versioned_table`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.channels.chunk import Op
from barrierflow.channels.errors import InvalidArgumentError

__all__ = ["check_key_schema", "check_options", "op_codes"]


def check_key_schema(schema: pa.Schema, key: Sequence[str], argument: str) -> tuple[str, ...]:
    """``key`` as a tuple of columns of ``schema`` that are declared not nullable.

    Raises:
        InvalidArgumentError: ``key`` is empty or not a list/tuple of names, or names a column
            ``schema`` lacks or declares nullable.
    """
    if not isinstance(key, list | tuple) or not key or not all(isinstance(c, str) for c in key):
        raise InvalidArgumentError(argument, "a non-empty list or tuple of column names", key)
    for column in key:
        index = schema.get_field_index(column)
        if index < 0:
            raise InvalidArgumentError(argument, f"columns of the schema {schema.names}", column)
        if schema.field(index).nullable:
            raise InvalidArgumentError(
                argument, "key columns declared not nullable", f"{column!r} is nullable"
            )
    return tuple(key)


def check_options(
    schema: object,
    primary_key: Sequence[str],
    distribution_key: Sequence[str] | None,
    vnode_count: int,
    compact_after: int,
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The primary and distribution keys of a versioned table, checked with its options.

    Raises:
        InvalidArgumentError: a schema that is not a pyarrow Schema, key columns missing or
            nullable, a distribution key outside the primary key, or a bad count.
    """
    if not isinstance(schema, pa.Schema):
        raise InvalidArgumentError("schema", "a pyarrow Schema", schema)
    key = check_key_schema(schema, primary_key, "primary_key")
    dist = key if distribution_key is None else tuple(distribution_key)
    if not dist or not set(dist) <= set(key):
        raise InvalidArgumentError(
            "distribution_key", f"None or columns of the primary key {list(key)}", dist
        )
    for argument, value in (("vnode_count", vnode_count), ("compact_after", compact_after)):
        if type(value) is not int or not 1 <= value <= 1 << 15:
            raise InvalidArgumentError(argument, "an int in 1..32768", value)
    return key, dist


def op_codes(ops: Any, n: int) -> pa.Array:
    """``ops`` as ``n`` int8 :class:`Op` codes (``None``: all inserts).

    Raises:
        InvalidArgumentError: the wrong length, nulls, or a code outside :class:`Op`.
    """
    if ops is None:
        return pa.array(np.zeros(n, dtype=np.int8))
    try:
        codes = pa.array(ops) if not isinstance(ops, pa.Array | pa.ChunkedArray) else ops
        if isinstance(codes, pa.ChunkedArray):
            codes = codes.combine_chunks()
        codes = pc.cast(codes, pa.int8())
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
        raise InvalidArgumentError("ops", "a sequence of Op codes (int8 0..3)", ops) from exc
    if len(codes) != n or codes.null_count:
        raise InvalidArgumentError("ops", f"{n} op codes without nulls", ops)
    if not n:
        return codes  # no row: no range to check (min_max of nothing is null)
    low, high = pc.min_max(codes).values()
    if low.as_py() < 0 or high.as_py() > int(max(Op)):
        raise InvalidArgumentError("ops", f"op codes in 0..{int(max(Op))}", ops)
    return codes
