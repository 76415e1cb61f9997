"""The measurement behind the versioned table's storage choice (``python -m
benchmarks.storage_shapes``): 1 M rows of a materialized view (a key, a float, an int, their
vnode and op), sorted by vnode then key, written and read back per vnode in three shapes:

* typed SQLite rows (``WITHOUT ROWID``, primary key ``(vnode, key, epoch)``, WAL, synchronous
  FULL) — written with ``executemany`` from Python tuples, read with one ``SELECT`` per vnode;
* Parquet, one row group per vnode — written by ``pyarrow.parquet``, read a row group at a time;
* Arrow IPC, one record batch per vnode, fsynced — read memory-mapped, a batch at a time, with
  the sort by key a merge of versions needs.

The versioned table (``barrierflow/runtime/state/versioned_table.py``) keeps IPC files: on this
2-core machine the three wrote 0.3, 4.3 and 10.5 M rows/s and read 0.7, 12 and 34 M rows/s.
Not part of ``python -m benchmarks`` (it compares shapes, not barrierflow with a baseline).
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

ROWS = 1_000_000
VNODES = 256


def _table() -> pa.Table:
    rng = np.random.default_rng(1)
    key = rng.permutation(ROWS).astype(np.int64)
    table = pa.table(
        {
            "_vnode": (key * 2654435761 % VNODES).astype(np.int16),
            "k": key,
            "total": rng.random(ROWS),
            "cnt": rng.integers(0, 100, ROWS),
            "_op": np.zeros(ROWS, np.int8),
        }
    )
    return table.sort_by([("_vnode", "ascending"), ("k", "ascending")])


def _sqlite(table: pa.Table, directory: str) -> tuple[float, float]:
    db = sqlite3.connect(os.path.join(directory, "rows.db"))
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute(
        "CREATE TABLE v (vnode INT, k INT, epoch INT, op INT, total REAL, cnt INT,"
        " PRIMARY KEY (vnode, k, epoch)) WITHOUT ROWID"
    )
    started = time.perf_counter()
    vnode, key, total, cnt, op = (
        table.column(n).to_numpy().tolist() for n in ("_vnode", "k", "total", "cnt", "_op")
    )
    rows = zip(vnode, key, [1] * ROWS, op, total, cnt, strict=True)
    db.executemany("INSERT INTO v VALUES (?, ?, ?, ?, ?, ?)", rows)
    db.commit()
    written = time.perf_counter() - started
    started = time.perf_counter()
    for v in range(VNODES):
        db.execute("SELECT k, total, cnt FROM v WHERE vnode = ? ORDER BY k", (v,)).fetchall()
    read = time.perf_counter() - started
    db.close()
    return written, read


def _parquet(table: pa.Table, directory: str) -> tuple[float, float]:
    path = os.path.join(directory, "rows.parquet")
    started = time.perf_counter()
    pq.write_table(table, path, row_group_size=ROWS // VNODES)
    written = time.perf_counter() - started
    started = time.perf_counter()
    reader = pq.ParquetFile(path)
    for group in range(reader.num_row_groups):
        reader.read_row_group(group)
    return written, time.perf_counter() - started


def _ipc(table: pa.Table, directory: str) -> tuple[float, float]:
    path = os.path.join(directory, "rows.arrow")
    started = time.perf_counter()
    bounds = np.searchsorted(table.column("_vnode").to_numpy(), np.arange(VNODES + 1))
    with ipc.new_file(path, table.schema) as writer:
        for v in range(VNODES):
            part = table.slice(int(bounds[v]), int(bounds[v + 1] - bounds[v])).combine_chunks()
            writer.write_table(part)
    descriptor = os.open(path, os.O_RDONLY)
    os.fsync(descriptor)
    os.close(descriptor)
    written = time.perf_counter() - started
    started = time.perf_counter()
    reader = ipc.open_file(pa.memory_map(path))
    for i in range(reader.num_record_batches):
        batch = reader.get_batch(i)
        pc.sort_indices(batch, sort_keys=[("k", "ascending")])
    return written, time.perf_counter() - started


def main() -> None:
    table = _table()
    with tempfile.TemporaryDirectory() as directory:
        for name, shape in (("sqlite rows", _sqlite), ("parquet", _parquet), ("arrow ipc", _ipc)):
            written, read = shape(table, directory)
            print(
                f"{name:12} write {ROWS / written / 1e6:5.1f} M rows/s, "
                f"read per vnode {ROWS / read / 1e6:5.1f} M rows/s"
            )


if __name__ == "__main__":
    main()
