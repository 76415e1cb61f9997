"""Chunks: the rows that travel between barriers.

A :class:`Chunk` is a ``pyarrow.RecordBatch`` plus, optionally, an *ops* column (what each row
means to a changelog consumer: insert, delete, or the two halves of an update) and a
*visibility* mask. Filtering a chunk only replaces its mask — the Arrow buffers are shared, not
copied — and :meth:`Chunk.compact` materializes the visible rows when a boundary needs them
(a sink, a channel to another process).
"""

from __future__ import annotations

import enum
from typing import Any, final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.channels._enum import TypedEnumType
from barrierflow.channels.errors import InvalidArgumentError

__all__ = ["Op", "Chunk"]


class Op(enum.IntEnum, metaclass=TypedEnumType):
    """The meaning of one row of a changelog chunk (stored as ``int8`` codes).

    ``Op(7)`` raises :class:`~barrierflow.errors.InvalidArgumentError` (still a ``ValueError``,
    as for any enum) naming the valid codes.
    """

    INSERT = 0
    DELETE = 1
    UPDATE_DELETE = 2
    UPDATE_INSERT = 3


_MAX_OP = max(Op)


def _as_ops(ops: Any, num_rows: int) -> pa.Array:
    """Validate op codes without a loop per row.

    The type is inferred, never forced: ``pa.array([1.5], type=int8)`` truncates to 1, so a
    float (or bool) sequence is refused rather than silently read as other op codes.
    """
    if isinstance(ops, pa.ChunkedArray):
        arr = ops.combine_chunks()
    elif isinstance(ops, pa.Array):
        arr = ops
    elif isinstance(ops, str | bytes | dict):
        raise InvalidArgumentError("ops", "a sequence of Op codes (int8 0..3)", ops)
    else:
        try:
            arr = pa.array(ops)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
            raise InvalidArgumentError("ops", "a sequence of Op codes (int8 0..3)", ops) from exc
        if pa.types.is_null(arr.type) and len(arr) == 0:
            arr = pa.array([], pa.int8())  # an empty list infers the null type
    if not pa.types.is_integer(arr.type):
        raise InvalidArgumentError("ops", "an integer array of Op codes", arr.type)
    if len(arr) != num_rows:
        raise InvalidArgumentError(
            "ops", f"{num_rows} op codes (one per row)", f"{len(arr)} op codes"
        )
    if arr.null_count:
        raise InvalidArgumentError("ops", "op codes without nulls", f"{arr.null_count} nulls")
    if len(arr):
        lo, hi = pc.min_max(arr).values()
        if lo.as_py() < 0 or hi.as_py() > _MAX_OP:
            bad = lo.as_py() if lo.as_py() < 0 else hi.as_py()
            raise InvalidArgumentError("ops", f"op codes in 0..{int(_MAX_OP)} ({list(Op)})", bad)
    return arr if arr.type == pa.int8() else arr.cast(pa.int8())


def _as_mask(mask: Any, num_rows: int) -> pa.BooleanArray:
    if isinstance(mask, np.ndarray):
        if mask.dtype != np.bool_:
            raise InvalidArgumentError("visibility", "a boolean mask", f"numpy {mask.dtype}")
        if mask.ndim != 1:
            raise InvalidArgumentError(
                "visibility", "a one-dimensional mask", f"shape {mask.shape}"
            )
        arr = pa.array(mask)
    elif isinstance(mask, pa.ChunkedArray):
        arr = mask.combine_chunks()
    elif isinstance(mask, pa.Array):
        arr = mask
    elif isinstance(mask, list | tuple):
        try:
            arr = pa.array(mask, type=pa.bool_())
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
            raise InvalidArgumentError("visibility", "a sequence of bools", mask) from exc
    else:
        raise InvalidArgumentError(
            "visibility", "a BooleanArray, numpy bool array or list of bools", type(mask).__name__
        )
    if not pa.types.is_boolean(arr.type):
        raise InvalidArgumentError("visibility", "a boolean mask", arr.type)
    if len(arr) != num_rows:
        raise InvalidArgumentError(
            "visibility", f"a mask of {num_rows} entries", f"{len(arr)} entries"
        )
    if arr.null_count:
        raise InvalidArgumentError("visibility", "a mask without nulls", f"{arr.null_count} nulls")
    return arr


@final
class Chunk:
    """A batch of rows with optional ops and visibility; immutable.

    Args:
        batch: the rows.
        ops: one :class:`Op` code per row (any integer sequence or Arrow array); ``None`` means
            every row is an insert.
        visibility: one bool per row; ``None`` means every row is visible.

    Raises:
        InvalidArgumentError: ``batch`` is not a RecordBatch; ``ops`` or ``visibility`` has the
            wrong length, nulls, or (ops) a code outside :class:`Op` / (visibility) a non-boolean
            type.
    """

    __slots__ = ("_batch", "_cardinality", "_nbytes", "_ops", "_visibility")

    def __init__(self, batch: pa.RecordBatch, ops: Any = None, visibility: Any = None) -> None:
        if not isinstance(batch, pa.RecordBatch):
            raise InvalidArgumentError("batch", "a pyarrow.RecordBatch", type(batch).__name__)
        self._batch = batch
        self._ops = None if ops is None else _as_ops(ops, batch.num_rows)
        self._visibility = None if visibility is None else _as_mask(visibility, batch.num_rows)
        self._cardinality: int | None = None
        self._nbytes: int | None = None

    @classmethod
    def from_pydict(cls, data: dict[str, Any], schema: pa.Schema | None = None) -> Chunk:
        """An insert-only chunk from a dict of columns (a convenience for tests and examples).

        Raises:
            InvalidArgumentError: ``data`` is not a dict of equally long columns that Arrow can
                convert (to ``schema``, if given), or ``schema`` is not a ``pyarrow.Schema``.
        """
        if not isinstance(data, dict):
            raise InvalidArgumentError("data", "a dict of column name to values", data)
        if schema is not None and not isinstance(schema, pa.Schema):
            raise InvalidArgumentError("schema", "None or a pyarrow.Schema", schema)
        try:
            batch = pa.RecordBatch.from_pydict(data, schema=schema)
        except (pa.ArrowException, TypeError, ValueError, KeyError, OverflowError) as exc:
            raise InvalidArgumentError(
                "data", "equally long columns that Arrow can convert", data
            ) from exc
        return cls(batch)

    @property
    def batch(self) -> pa.RecordBatch:
        """The rows, including hidden ones."""
        return self._batch

    @property
    def schema(self) -> pa.Schema:
        """The batch's schema (ops and visibility are not columns of it)."""
        return self._batch.schema

    @property
    def ops(self) -> pa.Array | None:
        """The ``int8`` op codes, or ``None`` when every row is an insert."""
        return self._ops

    @property
    def visibility(self) -> pa.BooleanArray | None:
        """The visibility mask, or ``None`` when every row is visible."""
        return self._visibility

    @property
    def num_rows(self) -> int:
        """Rows in the batch, visible or not: what the chunk costs in memory and permits."""
        return int(self._batch.num_rows)

    @property
    def cardinality(self) -> int:
        """How many rows are visible."""
        if self._cardinality is None:
            if self._visibility is None:
                self._cardinality = self.num_rows
            else:
                self._cardinality = self.num_rows - self._visibility.false_count
        return self._cardinality

    @property
    def nbytes(self) -> int:
        """Bytes of the Arrow buffers the chunk keeps alive (computed once).

        A slice counts the whole buffers it references — that is the memory it holds — and
        this is O(buffers), unlike ``RecordBatch.nbytes`` which walks slices (≈ 7 µs a batch).
        """
        if self._nbytes is None:
            total = self._batch.get_total_buffer_size()
            for extra in (self._ops, self._visibility):
                if extra is not None:
                    total += extra.get_total_buffer_size()
            self._nbytes = int(total)
        return self._nbytes

    def ops_numpy(self) -> npt.NDArray[np.int8]:
        """The op codes as a NumPy array (all ``Op.INSERT`` when there is no ops column)."""
        if self._ops is None:
            return np.zeros(self.num_rows, dtype=np.int8)
        return self._ops.to_numpy(zero_copy_only=False)  # type: ignore[no-any-return]

    @classmethod
    def _trusted(
        cls, batch: pa.RecordBatch, ops: pa.Array | None, visibility: pa.BooleanArray | None = None
    ) -> Chunk:
        """Build without validation, for parts derived from an already-valid chunk."""
        chunk = cls.__new__(cls)
        chunk._batch = batch
        chunk._ops = ops
        chunk._visibility = visibility
        chunk._cardinality = None
        chunk._nbytes = None
        return chunk

    def with_visibility(self, visibility: Any) -> Chunk:
        """The same rows and ops under a new mask (replacing the old one); no data is copied.

        To narrow an existing mask, combine first: ``pc.and_(chunk.visibility, mask)``.

        Raises:
            InvalidArgumentError: the mask has the wrong length or type, or nulls.
        """
        return Chunk._trusted(self._batch, self._ops, _as_mask(visibility, self.num_rows))

    def with_ops(self, ops: Any) -> Chunk:
        """The same rows and mask with new op codes.

        Raises:
            InvalidArgumentError: as for the constructor's ``ops``.
        """
        return Chunk(self._batch, ops, self._visibility)

    def compact(self) -> Chunk:
        """A chunk of the visible rows only, with no mask; ``self`` if all rows are visible."""
        if self._visibility is None:
            return self
        if self.cardinality == self.num_rows:
            return Chunk._trusted(self._batch, self._ops)
        batch = self._batch.filter(self._visibility)
        ops = None if self._ops is None else self._ops.filter(self._visibility)
        return Chunk._trusted(batch, ops)

    def __repr__(self) -> str:
        return (
            f"Chunk(rows={self.num_rows}, visible={self.cardinality}, "
            f"ops={'yes' if self._ops is not None else 'insert-only'}, "
            f"columns={self._batch.schema.names})"
        )

    def equals(self, other: Chunk) -> bool:
        """Whether both chunks hold the same visible rows with the same ops, in order.

        Raises:
            InvalidArgumentError: ``other`` is not a Chunk.
        """
        if not isinstance(other, Chunk):
            raise InvalidArgumentError("other", "a Chunk", type(other).__name__)
        a, b = self.compact(), other.compact()
        return bool(a.batch.equals(b.batch) and np.array_equal(a.ops_numpy(), b.ops_numpy()))
