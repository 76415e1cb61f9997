"""Segment files of a versioned table: Arrow IPC files with one record batch per vnode.

A **segment** holds rows of a :class:`~barrierflow.runtime.state.versioned_table.
VersionedTable` sorted by ``(vnode, primary key)``, each row with its op (:class:`~barrierflow.
channels.Op` code in ``_op``) and vnode (``_vnode``). Rows of one key keep the order they were
written in (the sort is stable), so the last row of a key is its latest write. Two kinds:

* a **delta** is the change log of one epoch (``delta-<epoch>.arrow``);
* a **base** is the table as of an epoch, folded from older segments by compaction
  (``base-<epoch>.arrow``; inserts only: deleted keys are gone).

The file's schema metadata lists the vnodes its batches hold, in order (``bf.vnodes``), so a
read of one vnode memory-maps the file and takes one batch: no scan, no copy. A file is
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
from collections.abc import Sequence
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
    "Segment",
    "after_key",
    "latest_rows",
    "sort_rows",
    "write_segment",
]

#: The op of each stored row (an :class:`Op` code).
OP_COLUMN = "_op"
#: The vnode of each stored row.
VNODE_COLUMN = "_vnode"
_VNODES_KEY = b"bf.vnodes"
_LIVE_OPS = pa.array([int(Op.INSERT), int(Op.UPDATE_INSERT)], pa.int8())


def sort_rows(rows: pa.Table, key: Sequence[str]) -> pa.Table:
    """``rows`` sorted by vnode then ``key`` (stable: a key's writes keep their order)."""
    order = [(VNODE_COLUMN, "ascending"), *((c, "ascending") for c in key)]
    return rows.take(pc.sort_indices(rows, sort_keys=order))


def write_segment(path: Path, rows: pa.Table) -> int:
    """Write ``rows`` (sorted by :func:`sort_rows`) as a segment file at ``path``: one batch
    per vnode present, written to a temporary name, fsynced, renamed; returns its size."""
    vnodes = rows.column(VNODE_COLUMN).to_numpy()
    present, starts = np.unique(vnodes, return_index=True)
    ends = np.append(starts[1:], len(vnodes))
    metadata = {_VNODES_KEY: ",".join(str(int(v)) for v in present).encode()}
    schema = rows.schema.with_metadata(metadata)
    temporary = path.with_name(f".{path.name}.tmp")
    with ipc.new_file(str(temporary), schema) as writer:
        for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
            writer.write_table(rows.slice(start, end - start), max_chunksize=end - start)
    fsync_path(temporary)
    temporary.rename(path)
    fsync_path(path.parent)
    return path.stat().st_size


@final
class Segment:
    """One segment file, memory-mapped once, read one vnode (batch) at a time."""

    __slots__ = ("_batches", "_index", "_reader", "epoch", "path", "rows")

    def __init__(self, path: Path, epoch: int) -> None:
        self.path = path
        self.epoch = epoch
        self._reader = ipc.open_file(pa.memory_map(str(path)))
        listed = (self._reader.schema.metadata or {}).get(_VNODES_KEY, b"")
        vnodes = [int(v) for v in listed.decode().split(",") if v]
        self._index = {vnode: i for i, vnode in enumerate(vnodes)}
        self.rows = sum(
            self._reader.get_batch(i).num_rows for i in range(self._reader.num_record_batches)
        )

    @property
    def schema(self) -> pa.Schema:
        """The stored schema (without the file's metadata)."""
        return self._reader.schema.remove_metadata()

    def vnode(self, vnode: int) -> pa.RecordBatch | None:
        """The rows of ``vnode`` (``None`` if it has none)."""
        i = self._index.get(vnode)
        return None if i is None else self._reader.get_batch(i)

    def table(self) -> pa.Table:
        """Every row, in file order."""
        return self._reader.read_all().replace_schema_metadata(None)


def latest_rows(parts: Sequence[pa.RecordBatch | pa.Table], key: Sequence[str]) -> pa.Table:
    """The table that ``parts`` (oldest first, each sorted by key) leave behind: for each key
    its last row, if that row is an insert; sorted by key, ``_op`` kept (all inserts)."""
    tables = [p if isinstance(p, pa.Table) else pa.Table.from_batches([p]) for p in parts]
    rows = pa.concat_tables(tables) if len(tables) != 1 else tables[0]
    if len(tables) > 1:
        rows = rows.take(pc.sort_indices(rows, sort_keys=[(c, "ascending") for c in key]))
    n = rows.num_rows
    if n == 0:
        return rows
    last = np.ones(n, dtype=bool)
    if n > 1:
        differs = np.zeros(n - 1, dtype=bool)
        for column in key:
            values = rows.column(column)
            differs |= pc.not_equal(values.slice(0, n - 1), values.slice(1)).to_numpy(
                zero_copy_only=False
            )
        last[:-1] = differs
    live = pc.is_in(rows.column(OP_COLUMN), value_set=_LIVE_OPS).to_numpy(zero_copy_only=False)
    return rows.filter(pa.array(last & live))


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
