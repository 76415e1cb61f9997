"""Virtual nodes: the fixed partitioning of the key space that parallel actors own.

Rows are hashed into ``vnode_count`` virtual nodes (256 by default); each parallel actor owns a
:class:`VnodeBitmap`. Hash dispatch routes a row to the owner of its vnode, and the sink
coordinator knows every writer reported an epoch when their bitmaps cover every vnode exactly
once. The hash is stable across processes and runs; see :mod:`barrierflow.channels._hash`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from barrierflow.channels._hash import hash_columns, hashable_type
from barrierflow.channels.errors import InvalidArgumentError, VnodeOwnershipError

__all__ = ["DEFAULT_VNODE_COUNT", "VnodeBitmap", "compute_vnodes", "vnode_owners"]

#: Vnodes per table or stream unless configured otherwise (RisingWave's default).
DEFAULT_VNODE_COUNT = 256


def _is_index(value: object) -> bool:
    """An int or NumPy integer, but not a bool (``True`` is no vnode)."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def _check_vnode_count(vnode_count: int) -> None:
    if type(vnode_count) is not int or not 1 <= vnode_count <= 1 << 15:
        raise InvalidArgumentError("vnode_count", "an int in 1..32768", vnode_count)


@final
class VnodeBitmap:
    """An immutable set of vnodes out of ``vnode_count``.

    Build one with :meth:`from_vnodes`, :meth:`full`, :meth:`empty` or :meth:`split` (an even
    partition among N owners), or from a boolean mask of exactly ``vnode_count`` entries.
    """

    __slots__ = ("_bits",)

    def __init__(self, mask: Sequence[bool] | npt.NDArray[np.bool_]) -> None:
        try:
            bits = np.asarray(mask)
        except (ValueError, TypeError) as exc:  # a ragged or otherwise unconvertible mask
            raise InvalidArgumentError("mask", "a one-dimensional sequence of bools", mask) from exc
        if bits.ndim != 1 or bits.dtype != np.bool_:
            raise InvalidArgumentError("mask", "a one-dimensional sequence of bools", mask)
        _check_vnode_count(len(bits))
        self._bits = bits.copy()
        self._bits.flags.writeable = False

    @classmethod
    def from_vnodes(
        cls, vnodes: Iterable[int], vnode_count: int = DEFAULT_VNODE_COUNT
    ) -> VnodeBitmap:
        """The bitmap holding exactly ``vnodes``.

        Raises:
            InvalidArgumentError: ``vnodes`` is not an iterable of ints (a str is refused), or a
                vnode is outside ``0..vnode_count-1``.
        """
        _check_vnode_count(vnode_count)
        candidate: object = vnodes
        if isinstance(candidate, str | bytes) or not isinstance(candidate, Iterable):
            raise InvalidArgumentError("vnodes", "an iterable of int vnodes", vnodes)
        bits = np.zeros(vnode_count, dtype=np.bool_)
        for vnode in vnodes:
            if not _is_index(vnode) or not 0 <= vnode < vnode_count:
                raise InvalidArgumentError("vnodes", f"ints in 0..{vnode_count - 1}", vnode)
            bits[int(vnode)] = True
        return cls(bits)

    @classmethod
    def full(cls, vnode_count: int = DEFAULT_VNODE_COUNT) -> VnodeBitmap:
        """Every vnode."""
        _check_vnode_count(vnode_count)
        return cls(np.ones(vnode_count, dtype=np.bool_))

    @classmethod
    def empty(cls, vnode_count: int = DEFAULT_VNODE_COUNT) -> VnodeBitmap:
        """No vnode."""
        _check_vnode_count(vnode_count)
        return cls(np.zeros(vnode_count, dtype=np.bool_))

    @classmethod
    def split(cls, parts: int, vnode_count: int = DEFAULT_VNODE_COUNT) -> list[VnodeBitmap]:
        """``parts`` bitmaps of contiguous, near-equal vnode ranges that cover every vnode once.

        Raises:
            InvalidArgumentError: ``parts`` is < 1 or more than ``vnode_count``.
        """
        _check_vnode_count(vnode_count)
        if type(parts) is not int or not 1 <= parts <= vnode_count:
            raise InvalidArgumentError("parts", f"an int in 1..{vnode_count}", parts)
        bounds = np.linspace(0, vnode_count, parts + 1).astype(np.int64)
        bitmaps = []
        for lo, hi in itertools.pairwise(bounds):
            bits = np.zeros(vnode_count, dtype=np.bool_)
            bits[lo:hi] = True
            bitmaps.append(cls(bits))
        return bitmaps

    @property
    def vnode_count(self) -> int:
        """How many vnodes exist (the bitmap's size)."""
        return len(self._bits)

    @property
    def mask(self) -> npt.NDArray[np.bool_]:
        """A read-only boolean view, one entry per vnode."""
        return self._bits

    def vnodes(self) -> list[int]:
        """The vnodes in the set, ascending."""
        return [int(v) for v in np.flatnonzero(self._bits)]

    def runs(self) -> tuple[tuple[int, int], ...]:
        """The set as ``(first, end)`` runs of consecutive vnodes (``end`` excluded),
        ascending: the compact form a sink writer's manifest records."""
        padded = np.concatenate(([False], self._bits, [False])).astype(np.int8)
        edges = np.flatnonzero(np.diff(padded))
        return tuple((int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True))

    def count(self) -> int:
        """How many vnodes are in the set."""
        return int(self._bits.sum())

    def is_full(self) -> bool:
        """Whether every vnode is in the set."""
        return bool(self._bits.all())

    def __contains__(self, vnode: object) -> bool:
        return (
            _is_index(vnode)
            and 0 <= int(vnode) < len(self._bits)  # type: ignore[call-overload]
            and bool(self._bits[int(vnode)])  # type: ignore[call-overload]
        )

    def _same_size(self, other: VnodeBitmap) -> None:
        if other.vnode_count != self.vnode_count:
            raise InvalidArgumentError(
                "other", f"a bitmap of {self.vnode_count} vnodes", f"{other.vnode_count} vnodes"
            )

    def __or__(self, other: VnodeBitmap) -> VnodeBitmap:
        if not isinstance(other, VnodeBitmap):
            return NotImplemented
        self._same_size(other)
        return VnodeBitmap(self._bits | other._bits)

    def __and__(self, other: VnodeBitmap) -> VnodeBitmap:
        if not isinstance(other, VnodeBitmap):
            return NotImplemented
        self._same_size(other)
        return VnodeBitmap(self._bits & other._bits)

    def __sub__(self, other: VnodeBitmap) -> VnodeBitmap:
        if not isinstance(other, VnodeBitmap):
            return NotImplemented
        self._same_size(other)
        return VnodeBitmap(self._bits & ~other._bits)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, VnodeBitmap) and np.array_equal(self._bits, other._bits)

    def __hash__(self) -> int:
        return hash(self._bits.tobytes())

    def __repr__(self) -> str:
        vnodes = self.vnodes()
        shown = vnodes if len(vnodes) <= 8 else [*vnodes[:4], "...", *vnodes[-2:]]
        return f"VnodeBitmap({self.count()}/{self.vnode_count}: {shown})"


def vnode_owners(bitmaps: Sequence[VnodeBitmap], argument: str = "bitmaps") -> npt.NDArray[np.intp]:
    """For each vnode, the index of the bitmap that owns it.

    Raises:
        InvalidArgumentError: ``bitmaps`` is not a non-empty list or tuple of VnodeBitmaps of
            one size.
        VnodeOwnershipError: a vnode is owned twice or by nobody.
    """
    if not isinstance(bitmaps, list | tuple) or not bitmaps:
        raise InvalidArgumentError(argument, "at least one vnode bitmap", bitmaps)
    if not isinstance(bitmaps[0], VnodeBitmap):
        raise InvalidArgumentError(argument, "VnodeBitmaps", bitmaps[0])
    vnode_count = bitmaps[0].vnode_count
    for bitmap in bitmaps:
        if not isinstance(bitmap, VnodeBitmap) or bitmap.vnode_count != vnode_count:
            raise InvalidArgumentError(argument, f"VnodeBitmaps of {vnode_count} vnodes", bitmap)
    stacked = np.stack([b.mask for b in bitmaps])
    owners_per_vnode = stacked.sum(axis=0)
    if (owners_per_vnode != 1).any():
        raise VnodeOwnershipError(
            argument,
            overlapping=np.flatnonzero(owners_per_vnode > 1).tolist(),
            missing=np.flatnonzero(owners_per_vnode == 0).tolist(),
        )
    owners: npt.NDArray[np.intp] = np.argmax(stacked, axis=0)
    return owners


def compute_vnodes(
    batch: pa.RecordBatch | pa.Table,
    key_columns: Sequence[str],
    vnode_count: int = DEFAULT_VNODE_COUNT,
) -> npt.NDArray[np.int64]:
    """The vnode of every row of ``batch``, hashed over ``key_columns`` (vectorized).

    The result is stable across processes and runs: the same key values always give the
    same vnode (see :mod:`barrierflow.channels._hash` for the exact hash).

    Raises:
        InvalidArgumentError: no key columns, a key column missing from the schema or of a
            type that cannot be hashed, or a bad ``vnode_count``.
    """
    if not isinstance(batch, pa.RecordBatch | pa.Table):
        raise InvalidArgumentError("batch", "a pyarrow RecordBatch or Table", type(batch).__name__)
    check_key_columns(batch.schema, key_columns)
    _check_vnode_count(vnode_count)
    return vnodes_unchecked(batch, key_columns, vnode_count)


def vnodes_unchecked(
    batch: pa.RecordBatch | pa.Table, key_columns: Sequence[str], vnode_count: int
) -> npt.NDArray[np.int64]:
    """:func:`compute_vnodes` for callers that validated the schema already (hot path)."""
    hashed = hash_columns([batch.column(name) for name in key_columns], batch.num_rows)
    return (hashed % np.uint64(vnode_count)).astype(np.int64)


def check_key_columns(schema: pa.Schema, key_columns: Sequence[str]) -> None:
    """Validate that ``key_columns`` name hashable columns of ``schema``.

    A str is refused where the sequence of names is expected (it is a sequence of one-letter
    names); so is anything but a list or tuple.

    Raises:
        InvalidArgumentError: as described for :func:`compute_vnodes`.
    """
    if not isinstance(key_columns, list | tuple) or not key_columns:
        raise InvalidArgumentError(
            "key_columns", "a non-empty sequence of column names", key_columns
        )
    for name in key_columns:
        index = schema.get_field_index(name) if isinstance(name, str) else -1
        if index < 0:
            raise InvalidArgumentError(
                "key_columns", f"names of columns of the schema {schema.names}", name
            )
        typ = schema.field(index).type
        if not hashable_type(typ):
            raise InvalidArgumentError(
                "key_columns",
                "columns of integer, float, bool, temporal, string or binary type",
                f"{name}: {typ}",
            )


def owners_from_mapping(bitmaps: Mapping[int, VnodeBitmap]) -> dict[int, VnodeBitmap]:
    """Copy an actor→bitmap mapping, checking each value is a :class:`VnodeBitmap`."""
    if not isinstance(bitmaps, Mapping):
        raise InvalidArgumentError("vnode_bitmaps", "a mapping of actor id to bitmap", bitmaps)
    out = {}
    for key, bitmap in bitmaps.items():
        if not isinstance(bitmap, VnodeBitmap):
            raise InvalidArgumentError("vnode_bitmaps", "VnodeBitmap values", bitmap)
        out[key] = bitmap
    return out
