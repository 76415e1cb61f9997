"""Redis stream entries as Arrow batches: ids parsed into offsets with Arrow, each payload column
cast once per batch (see :mod:`barrierflow.connectors.redis_streams`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.actors.sources.split_log import Offset, check_increasing
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.connectors.errors import SplitLogRecordError

__all__ = ["decode_entries", "entry_text"]


def decode_entries(
    split: str,
    entries: list[Any],
    previous: Offset | None,
    fields: Sequence[tuple[bytes, pa.Field]],
    schema: pa.Schema,
) -> tuple[pa.RecordBatch, Offset]:
    """One split's entries (``(id, {field: value})`` as redis-py returns them) as a batch of
    ``schema`` — payload columns cast per column, then split and offsets — and its last offset.

    Raises:
        OffsetOrderError: an id not after the one before it (or ``previous``).
        SplitLogRecordError: an id that is not ``<ms>-<seq>``, a missing non-nullable field, or
            a value that does not parse as its column's type.
    """
    ids = [entry[0] for entry in entries]
    n = len(ids)
    major, minor = _offsets(split, ids)
    check_increasing(split, major, minor, previous)
    columns: list[pa.Array] = []
    for key, field in fields:
        raw = pa.array([None if f is None else f.get(key) for _, f in entries], type=pa.binary())
        column = _cast(split, ids, field, raw)
        if not field.nullable and column.null_count:
            row = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
            raise SplitLogRecordError(
                split,
                entry_text(ids[row]),
                field.name,
                "a value (the column is not nullable)",
                None,
            )
        columns.append(column)
    columns.append(pa.repeat(pa.scalar(split, pa.string()), n))
    columns.append(pa.array(major, pa.int64()))
    columns.append(pa.array(minor, pa.int64()))
    batch = pa.RecordBatch.from_arrays(columns, schema=schema)
    return batch, Offset(int(major[-1]), int(minor[-1]))


def entry_text(entry_id: Any) -> str:
    """An entry id as text (for errors)."""
    return bytes(entry_id).decode(errors="replace")


def _offsets(split: str, ids: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """The ids' two halves as int64 arrays (one Arrow parse for the batch)."""
    try:
        parts = pc.split_pattern(pa.array(ids, pa.binary()).cast(pa.string()), "-")
        major = pc.list_element(parts, 0).cast(pa.int64())
        minor = pc.list_element(parts, 1).cast(pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        bad = next((i for i in ids if not _is_offset(i)), ids[0])
        raise SplitLogRecordError(
            split, entry_text(bad), "<entry id>", "'<ms>-<seq>' below 2**63", entry_text(bad)
        ) from exc
    return major.to_numpy(), minor.to_numpy()


def _is_offset(entry_id: Any) -> bool:
    try:
        Offset.parse(entry_text(entry_id))
    except InvalidArgumentError:
        return False
    return True


def _cast(split: str, ids: list[Any], field: pa.Field, raw: pa.Array) -> pa.Array:
    """``raw`` (binary) as ``field``'s type: bytes kept, UTF-8 checked, else parsed from text."""
    target = field.type
    try:
        if pa.types.is_binary(target) or pa.types.is_large_binary(target):
            return raw.cast(target)
        text = raw.cast(pa.string())
        return text if target == pa.string() else cast(pa.Array, text.cast(target))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        row, value = _first_bad(raw, target)
        raise SplitLogRecordError(
            split, entry_text(ids[row]), field.name, f"a value readable as {target}", value
        ) from exc


def _first_bad(raw: pa.Array, target: pa.DataType) -> tuple[int, Any]:
    """The first value that does not cast (only on the error path: one cast per value)."""
    for row, value in enumerate(raw.to_pylist()):
        if value is None:
            continue
        try:
            pa.array([value], pa.binary()).cast(pa.string()).cast(target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return row, value
    return 0, None
