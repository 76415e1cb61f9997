"""Segment files of a versioned table: Arrow IPC files with one record batch per vnode.

A **segment** holds rows of a :class:`~barrierflow.runtime.state.versioned_table.
VersionedTable` grouped by vnode, each row with its op (:class:`~barrierflow.channels.Op` code in
``_op``) and vnode (``_vnode``). Two kinds:

* a **delta** is the change log of one epoch (``delta-<epoch>.arrow``), each vnode's rows in
  the order they were written (grouping by vnode is a stable radix sort: cheap at a barrier);
* a **base** is the table as of an epoch, folded from older segments by compaction
  (``base-<epoch>.arrow``): each vnode's rows sorted by primary key, one insert per key.

A read merges a vnode's base with its deltas: a stable sort by key keeps each key's writes in
order (base first, then the epochs, then write order), so a key's last row is its latest.

The file's schema metadata lists the vnodes it holds (``bf.vnodes``): a base has one batch per
vnode, a delta one batch and the row offset of each vnode in it (``bf.bounds``). A read of one
vnode memory-maps the file and takes a batch or a slice of one: no scan, no copy. A file is
written under a temporary name, fsynced and renamed into place; the store's manifest (a SQL
table, written in the checkpoint's transaction) says which files belong to the table, so a
file the manifest does not name is debris of a crash and is deleted when the table opens.

Why IPC files rather than typed SQLite rows or Parquet (measured on this machine, 1 M rows
of four columns, 256 vnodes): writing runs at 10.5 M rows/s as IPC, 4.3 M as Parquet and 0.3
M as SQLite rows (one Python tuple per row); reading every vnode back runs at 34 M rows/s from
memory-mapped IPC (with the sort a merge needs), 12 M from Parquet row groups and 0.7 M from
SQLite. Everything here is vectorized: no Python loop per row.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from barrierflow._fs import fsync_path
from barrierflow.channels.chunk import Op

__all__ = [
    "OP_COLUMN",
    "VNODE_COLUMN",
    "MemorySegment",
    "Segment",
    "after_key",
    "by_vnode",
    "latest_rows",
    "write_delta",
    "write_segment",
]

#: The op of each stored row (an :class:`Op` code).
OP_COLUMN = "_op"
#: The vnode of each stored row.
VNODE_COLUMN = "_vnode"
_VNODES_KEY = b"bf.vnodes"
_BOUNDS_KEY = b"bf.bounds"


def by_vnode(rows: pa.Table) -> pa.Table:
    """``rows`` grouped by vnode, each vnode's rows in the order written (a stable radix sort
    on the small vnode numbers: cheap enough to run at every barrier)."""
    vnodes = rows.column(VNODE_COLUMN).to_numpy()
    order = np.argsort(vnodes.astype(np.int16), kind="stable")
    return rows.take(pa.array(order))


def write_segment(
    path: Path, schema: pa.Schema, vnodes: Sequence[int], tables: Iterable[pa.Table]
) -> int:
    """Write a segment file at ``path``: the batch of each of ``vnodes`` (the next of
    ``tables``), under a temporary name, fsynced, renamed; returns its row count. ``tables``
    may be a generator: a file larger than memory is written one vnode at a time."""
    temporary = path.with_name(f".{path.name}.tmp")
    metadata = {_VNODES_KEY: ",".join(str(v) for v in vnodes).encode()}
    rows = 0
    with ipc.new_file(str(temporary), schema.with_metadata(metadata)) as writer:
        for table in tables:
            # Exactly one batch per vnode (the index maps vnodes to batches): the columns
            # combined into one chunk each; a vnode folded to nothing gets an empty batch.
            columns = [column.combine_chunks() for column in table.columns]
            writer.write_batch(pa.record_batch(columns, schema=table.schema))
            rows += table.num_rows
    fsync_path(temporary)
    temporary.rename(path)
    fsync_path(path.parent)
    return rows


def write_delta(path: Path, schema: pa.Schema, rows: pa.Table) -> int:
    """Write ``rows`` (grouped by vnode: :func:`by_vnode`) as a delta file at ``path``: one
    batch, its vnodes and their row offsets in the metadata (a read of a vnode is a zero-copy
    slice; one batch per vnode would cost a batch header per vnode at every checkpoint)."""
    vnodes = rows.column(VNODE_COLUMN).to_numpy()
    present, starts = np.unique(vnodes, return_index=True)
    metadata = {
        _VNODES_KEY: ",".join(str(int(v)) for v in present).encode(),
        _BOUNDS_KEY: ",".join(str(int(b)) for b in [*starts.tolist(), len(vnodes)]).encode(),
    }
    temporary = path.with_name(f".{path.name}.tmp")
    columns = [column.combine_chunks() for column in rows.columns]
    with ipc.new_file(str(temporary), schema.with_metadata(metadata)) as writer:
        writer.write_batch(pa.record_batch(columns, schema=schema))
    fsync_path(temporary)
    temporary.rename(path)
    fsync_path(path.parent)
    return int(rows.num_rows)


@final
class MemorySegment:
    """An epoch's rows, sealed and grouped by vnode, in memory until its checkpoint is durable
    (the same reads as a :class:`Segment`)."""

    __slots__ = ("_bounds", "rows")

    def __init__(self, rows: pa.Table, vnode_count: int) -> None:
        self.rows = rows
        vnodes = rows.column(VNODE_COLUMN).to_numpy()
        self._bounds = np.searchsorted(vnodes, np.arange(vnode_count + 1))

    def vnode(self, vnode: int) -> pa.Table | None:
        start, end = int(self._bounds[vnode]), int(self._bounds[vnode + 1])
        return self.rows.slice(start, end - start) if end > start else None

    def vnodes(self) -> list[int]:
        return [int(v) for v in np.flatnonzero(np.diff(self._bounds))]

    def table(self) -> pa.Table:
        return self.rows


@final
class Segment:
    """One segment file, memory-mapped once, read one vnode (batch) at a time."""

    __slots__ = ("_bounds", "_index", "_reader", "_single", "epoch", "path")

    def __init__(self, path: Path, epoch: int) -> None:
        self.path = path
        self.epoch = epoch
        self._reader = ipc.open_file(pa.memory_map(str(path)))
        metadata = self._reader.schema.metadata or {}
        vnodes = [int(v) for v in metadata.get(_VNODES_KEY, b"").decode().split(",") if v]
        self._index = {vnode: i for i, vnode in enumerate(vnodes)}
        bounds = metadata.get(_BOUNDS_KEY)
        # A delta: one batch, sliced by the row offsets of its vnodes; a base: a batch each.
        self._bounds = None if bounds is None else [int(b) for b in bounds.decode().split(",")]
        self._single = self._reader.get_batch(0) if self._bounds is not None else None

    @property
    def schema(self) -> pa.Schema:
        """The stored schema (without the file's metadata)."""
        return self._reader.schema.remove_metadata()

    def vnodes(self) -> list[int]:
        """The vnodes the file holds a batch of."""
        return list(self._index)

    def vnode(self, vnode: int) -> pa.RecordBatch | None:
        """The rows of ``vnode`` (``None`` if it has none)."""
        i = self._index.get(vnode)
        if i is None:
            return None
        if self._single is not None and self._bounds is not None:
            start, end = self._bounds[i], self._bounds[i + 1]
            return self._single.slice(start, end - start)
        return self._reader.get_batch(i)

    def table(self) -> pa.Table:
        """Every row, in file order."""
        return self._reader.read_all().replace_schema_metadata(None)


def latest_rows(
    parts: Sequence[pa.RecordBatch | pa.Table],
    key: Sequence[str],
    *,
    base: bool = False,
    columns: Sequence[str] | None = None,
) -> pa.Table:
    """The rows ``parts`` (oldest first; each a key's writes in write order) leave behind: for
    each key its last row, if that row is an insert; sorted by key. With ``base``, the first
    part is a base (sorted, one insert per key): alone, it is the answer as it is. (Merging
    deltas into a base by ``searchsorted`` instead of a timsort of the runs was measured
    slower: timsort merges sorted runs in a few passes.) With ``columns``, only those are
    returned (and gathered: a read leaves the vnode and op columns behind)."""
    tables = [p if isinstance(p, pa.Table) else pa.Table.from_batches([p]) for p in parts]
    if base and len(tables) == 1:
        return tables[0] if columns is None else tables[0].select(list(columns))
    rows = pa.concat_tables(tables) if len(tables) != 1 else tables[0]
    n = rows.num_rows
    if n == 0:
        return rows
    order, sorted_key = _stable_order(rows, key)
    ops = rows.column(OP_COLUMN).to_numpy()[order]
    last = np.ones(n, dtype=bool)
    if n > 1 and sorted_key is not None:
        last[:-1] = sorted_key[1:] != sorted_key[:-1]
    elif n > 1:
        differs = np.zeros(n - 1, dtype=bool)
        for column in key:
            values = rows.column(column).take(pa.array(order))
            differs |= pc.not_equal(values.slice(0, n - 1), values.slice(1)).to_numpy(
                zero_copy_only=False
            )
        last[:-1] = differs
    keep = last & ((ops == int(Op.INSERT)) | (ops == int(Op.UPDATE_INSERT)))
    kept = rows if columns is None else rows.select(list(columns))
    # One contiguous chunk per column: a take over several chunks resolves each index's chunk.
    return kept.combine_chunks().take(pa.array(order[keep]))


def _stable_order(
    rows: pa.Table, key: Sequence[str]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[Any] | None]:
    """The stable sort order of ``rows`` by ``key``, and for one integer key the sorted keys
    (NumPy's timsort: the parts are sorted runs it merges cheaply; Arrow's sort otherwise)."""
    if len(key) == 1:
        column = rows.column(key[0])
        if pa.types.is_integer(column.type) and not column.null_count:
            values = column.to_numpy()
            timsorted: npt.NDArray[np.int64] = np.argsort(values, kind="stable")
            return timsorted, values[timsorted]
    arrow_sorted = pc.sort_indices(rows, sort_keys=[(c, "ascending") for c in key])
    result: npt.NDArray[np.int64] = arrow_sorted.to_numpy().astype(np.int64)
    return result, None


def after_key(rows: pa.Table, key: Sequence[str], after: Sequence[Any]) -> pa.Table:
    """The rows of ``rows`` whose key is greater than ``after`` (compared column by column,
    as the sort compares them)."""
    greater: npt.NDArray[np.bool_] = np.zeros(rows.num_rows, dtype=bool)
    equal: npt.NDArray[np.bool_] = np.ones(rows.num_rows, dtype=bool)
    for column, bound in zip(key, after, strict=True):
        values = rows.column(column)
        scalar = pa.scalar(bound, values.type)
        greater |= equal & pc.greater(values, scalar).to_numpy(zero_copy_only=False)
        equal &= pc.equal(values, scalar).to_numpy(zero_copy_only=False)
    return rows.filter(pa.array(greater))


def remove_quietly(path: Path) -> None:
    """Delete ``path`` if it exists (a reader that mapped it keeps its pages)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
