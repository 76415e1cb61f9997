"""The stable, vectorized row hash behind vnode assignment.

The hash must give the same vnode for the same key in every process and every run (state is
partitioned by it and persisted), so it depends only on the key's *value*, never on Python's
randomized ``hash()`` or on how Arrow happens to lay the data out:

* integers of any width, dates, times, timestamps and durations: the value as a signed 64-bit
  integer (so ``int32`` 5 and ``int64`` 5 land together), then mixed with splitmix64;
* floats: the IEEE-754 bits of the value as ``float64``, with ``-0.0`` folded into ``0.0`` and
  every NaN into one NaN, mixed with splitmix64;
* booleans: 0 or 1, mixed;
* strings and binaries: the bytes (UTF-8 for strings). Byte *i* of a value contributes
  ``splitmix64(byte | i << 8)``; the contributions are summed modulo 2**64 and the sum is mixed
  with the length. This is vectorizable over the whole data buffer (a cumulative sum, no loop
  per row);
* dictionary arrays hash their dictionary once and take by index, so they hash like their values;
* null: the constant :data:`NULL_HASH`.

Several key columns combine left to right: ``h = splitmix64(h * 31 + h_column)``.
The vnode is ``h % vnode_count``. Changing any of this re-partitions persisted state: treat it
as a file format.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

U64 = npt.NDArray[np.uint64]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_S8 = np.uint64(8)
_MUL = np.uint64(31)
#: The hash of a null key, in any column.
NULL_HASH = np.uint64(0x6A09E667F3BCC909)
_NAN_BITS = np.float64("nan").view(np.uint64)
_NEG_ZERO_BITS = np.uint64(0x8000000000000000)
_EXPONENT = np.uint64(0x7FF0000000000000)
_MANTISSA = np.uint64(0x000FFFFFFFFFFFFF)


def splitmix64(x: U64) -> U64:
    """The splitmix64 finalizer, elementwise on uint64 (wraps modulo 2**64)."""
    # In place on one temporary: this kernel runs per row on the dispatch hot path.
    z: U64 = x + _GOLDEN
    t: U64 = z >> _S30
    z ^= t
    z *= _M1
    np.right_shift(z, _S27, out=t)
    z ^= t
    z *= _M2
    np.right_shift(z, _S31, out=t)
    z ^= t
    return z


def _fixed_width_bits(arr: pa.Array) -> U64:
    """The 64-bit value of each slot of an integer-like or float array (nulls arbitrary)."""
    typ = arr.type
    if pa.types.is_floating(typ):
        values = pc.fill_null(arr.cast(pa.float64()), 0.0).to_numpy(zero_copy_only=False)
        # Work on the bits, not the floats: arithmetic on a signaling NaN warns.
        bits: U64 = values.view(np.uint64).copy()
        bits[bits == _NEG_ZERO_BITS] = 0
        is_nan = ((bits & _EXPONENT) == _EXPONENT) & ((bits & _MANTISSA) != 0)
        bits[is_nan] = _NAN_BITS
        return bits
    if pa.types.is_boolean(typ):
        flags = pc.fill_null(arr, False).to_numpy(zero_copy_only=False)
        return np.asarray(flags, dtype=np.uint64)
    if pa.types.is_integer(typ):
        filled = pc.fill_null(arr, 0) if arr.null_count else arr
        values = filled.to_numpy(zero_copy_only=False)
        if pa.types.is_unsigned_integer(typ):
            return values.astype(np.uint64, copy=False)  # type: ignore[no-any-return]
        return values.astype(np.int64, copy=False).view(np.uint64)  # type: ignore[no-any-return]
    if pa.types.is_temporal(typ):
        # Temporal types are integers underneath; hash the integer of their own unit.
        width = typ.bit_width
        storage = pa.int32() if width == 32 else pa.int64()
        return _fixed_width_bits(arr.view(storage))
    raise TypeError(f"cannot hash a column of type {typ}")


def _bytes_hash(arr: pa.Array) -> U64:
    """Hash each value of a string/binary array by its bytes, vectorized over the buffer."""
    if pa.types.is_string_view(arr.type) or pa.types.is_binary_view(arr.type):
        arr = arr.cast(pa.large_binary())
    elif pa.types.is_string(arr.type):
        arr = arr.view(pa.binary())
    elif pa.types.is_large_string(arr.type):
        arr = arr.view(pa.large_binary())
    offset_type = np.int64 if pa.types.is_large_binary(arr.type) else np.int32
    n = len(arr)
    buffers = arr.buffers()
    offsets = np.frombuffer(buffers[1], dtype=offset_type)[arr.offset : arr.offset + n + 1]
    offsets = offsets.astype(np.int64)
    start, end = int(offsets[0]), int(offsets[-1])
    data = (
        np.frombuffer(buffers[2], dtype=np.uint8)[start:end]
        if buffers[2] is not None
        else np.zeros(0, np.uint8)
    )
    lengths = np.diff(offsets)
    # Position of every byte within its own value: global index minus its value's start.
    row_start = np.repeat(offsets[:-1] - start, lengths)
    position = np.arange(end - start, dtype=np.int64) - row_start
    contrib = splitmix64(data.astype(np.uint64) | (position.astype(np.uint64) << _S8))
    cumulative = np.zeros(end - start + 1, dtype=np.uint64)
    np.cumsum(contrib, dtype=np.uint64, out=cumulative[1:])
    rel = offsets - start
    sums = cumulative[rel[1:]] - cumulative[rel[:-1]]
    return splitmix64(sums ^ splitmix64(lengths.astype(np.uint64)))


def hash_column(arr: pa.Array | pa.ChunkedArray) -> U64:
    """The stable 64-bit hash of every value of ``arr`` (see the module docstring)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    typ = arr.type
    if pa.types.is_dictionary(typ):
        dictionary_hash = hash_column(arr.dictionary)
        indices = pc.fill_null(arr.indices, 0).to_numpy(zero_copy_only=False)
        hashed = (
            dictionary_hash[indices.astype(np.int64)]
            if len(dictionary_hash)
            else (np.zeros(len(arr), np.uint64))
        )
    elif (
        pa.types.is_string(typ)
        or pa.types.is_large_string(typ)
        or pa.types.is_binary(typ)
        or pa.types.is_large_binary(typ)
        or pa.types.is_string_view(typ)
        or pa.types.is_binary_view(typ)
    ):
        hashed = _bytes_hash(arr)
    else:
        hashed = splitmix64(_fixed_width_bits(arr))
    if arr.null_count:
        nulls = arr.is_null().to_numpy(zero_copy_only=False)
        hashed = np.where(nulls, NULL_HASH, hashed)
    return hashed


def hash_columns(columns: Sequence[pa.Array | pa.ChunkedArray], num_rows: int) -> U64:
    """Combine the hashes of several key columns, left to right."""
    combined = np.zeros(num_rows, dtype=np.uint64)
    for column in columns:
        combined = splitmix64(combined * _MUL + hash_column(column))
    return combined


def hashable_type(typ: pa.DataType) -> bool:
    """Whether :func:`hash_column` accepts a column of this type."""
    if pa.types.is_dictionary(typ):
        return hashable_type(typ.value_type)
    return bool(
        pa.types.is_integer(typ)
        or pa.types.is_floating(typ)
        or pa.types.is_boolean(typ)
        or (pa.types.is_temporal(typ) and not pa.types.is_interval(typ))
        or pa.types.is_string(typ)
        or pa.types.is_large_string(typ)
        or pa.types.is_binary(typ)
        or pa.types.is_large_binary(typ)
        or pa.types.is_string_view(typ)
        or pa.types.is_binary_view(typ)
    )
