"""A versioned table: rows of a primary key, partitioned by vnode, kept as a change log per
epoch, readable as of any epoch a reader still needs.

The materialize actor writes a job's output into one (a *materialized view*); a snapshot
backfill reads it: every vnode's rows **as of** an epoch, in primary-key order, resuming after
a key, then the **change log** of each later epoch.

**Writes.** :meth:`VersionedTable.write` takes Arrow rows with their ops (:class:`~barrierflow.
channels.Op`); the rows of an epoch are sealed at the barrier (:meth:`~VersionedTable.seal`,
done by the owning actor's context) and become durable **in the store's checkpoint commit**:
each sealed epoch's rows are written as a segment file (see :mod:`._segments`) first, and the
files enter the table's manifest in the same SQLite transaction as every state table and the
committed epoch. A crash leaves exactly the last checkpoint: files the manifest does not name
are deleted when the table opens again. Sealed epochs that are not durable yet are readable in
this process (a backfill reading the change log of the epoch that just closed never waits for a
checkpoint); recovery forgets them with everything else that was not durable.

**The rule for conflicting writes** is *upsert*: a key's last write in write order decides —
an ``INSERT`` or ``UPDATE_INSERT`` of a key that exists replaces its row, a ``DELETE`` or
``UPDATE_DELETE`` removes it (of a key that does not exist: nothing). The change log keeps the
ops as written, so replaying it by the same rule rebuilds every version.

**Versions and compaction.** A read as of epoch ``E`` merges the *base* (the table as of the
last compaction) with the deltas of the epochs after it up to ``E``: for each key its last row,
if that is an insert. :meth:`~VersionedTable.pin` keeps an epoch readable — its version and
every later change log — until :meth:`~VersionedTable.unpin`. After a checkpoint, once more than
``compact_after`` deltas are durable, the deltas
up to the oldest pin (or the committed epoch, with no pins) are folded into a new base. A read
of an epoch folded away raises :class:`~barrierflow.errors.VersionCompactedError` naming it —
never wrong rows.

Reads return Arrow tables; the merge is vectorized (a stable sort per vnode and one pass of
column comparisons), and a vnode is read from memory-mapped files, so a table may be much
larger than memory: only one vnode's rows are in memory at a time.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, final

import anyio.to_thread
import numpy as np
import pyarrow as pa

from barrierflow.channels.errors import EpochOrderError, InvalidArgumentError, SchemaMismatchError
from barrierflow.channels.vnode import VnodeBitmap, vnodes_unchecked
from barrierflow.runtime.state import _segments, _sql
from barrierflow.runtime.state._segments import OP_COLUMN, VNODE_COLUMN, MemorySegment, Segment
from barrierflow.runtime.state.errors import EpochNotSealedError, VersionCompactedError
from barrierflow.runtime.state.table import CommittedState
from barrierflow.runtime.state.versioned_checks import op_codes

__all__ = ["OP_COLUMN", "VersionedTable", "rows_after", "stored_tables", "table_directory"]


@final
class VersionedTable:
    """One versioned table (see the module). Open with :meth:`StateStore.versioned_table`."""

    def __init__(
        self,
        store: CommittedState,
        owner: str,
        name: str,
        directory: Path,
        schema: pa.Schema,
        primary_key: tuple[str, ...],
        distribution_key: tuple[str, ...],
        vnode_count: int,
        compact_after: int,
    ) -> None:
        self._store = store
        self.owner = owner
        self.name = name
        self.directory = directory
        self.schema = schema
        self.primary_key = primary_key
        self.distribution_key = distribution_key
        self.vnode_count = vnode_count
        self.compact_after = compact_after
        self._stored = schema.append(pa.field(VNODE_COLUMN, pa.int32(), nullable=False)).append(
            pa.field(OP_COLUMN, pa.int8(), nullable=False)
        )
        self._buffer: list[pa.RecordBatch] = []
        self._sealed: dict[int, MemorySegment] = {}
        self._deltas: dict[int, Segment] = {}
        self._base: Segment | None = None
        self._base_epoch = 0
        self._last_sealed = store.committed_epoch
        #: reader → pinned epoch (what compaction must keep).
        self._pins: dict[str, int] = {}

    @property
    def label(self) -> str:
        return f"{self.owner}/{self.name}"

    # Opening (the store calls this once, from its manifest).

    def _load(self, segments: list[tuple[Any, ...]]) -> None:
        """Map the manifest's files and delete the files it does not name.

        Raises:
            SchemaMismatchError: the files hold another schema than the one asked for.
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        named = set()
        for kind, epoch, file, _rows in segments:
            segment = Segment(self.directory / file, int(epoch))
            if not segment.schema.equals(self._stored):
                raise SchemaMismatchError("schema", self._stored, segment.schema)
            named.add(file)
            if kind == "base":
                self._base, self._base_epoch = segment, int(epoch)
            else:
                self._deltas[int(epoch)] = segment
        for path in self.directory.iterdir():
            if path.name not in named:
                _segments.remove_quietly(path)

    # Writing (the owning actor).

    def write(self, batch: pa.RecordBatch | pa.Table, ops: Any = None) -> None:
        """Buffer ``batch``'s rows with their ``ops`` (one :class:`Op` code per row; ``None``:
        all inserts) in the current epoch.

        Raises:
            SchemaMismatchError: ``batch`` has another schema, or a key column holds nulls.
            InvalidArgumentError: ``ops`` has the wrong length or a code outside :class:`Op`.
        """
        if not isinstance(batch, pa.RecordBatch | pa.Table):
            raise InvalidArgumentError("batch", "a pyarrow RecordBatch or Table", batch)
        if batch.schema.names != self.schema.names or batch.schema.types != self.schema.types:
            raise SchemaMismatchError("batch", self.schema, batch.schema)
        for column in self.primary_key:
            if batch.column(column).null_count:
                raise SchemaMismatchError("batch", self.schema, batch.schema, null_field=column)
        n = batch.num_rows
        if n == 0:
            return
        codes = op_codes(ops, n)
        vnodes = vnodes_unchecked(batch, self.distribution_key, self.vnode_count)
        table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
        table = table.cast(self.schema).append_column(
            self._stored.field(VNODE_COLUMN), pa.array(vnodes.astype(np.int32))
        )
        table = table.append_column(self._stored.field(OP_COLUMN), codes)
        self._buffer.extend(table.combine_chunks().to_batches())

    def seal(self, epoch: int) -> None:
        """Close ``epoch``: its buffered rows become its sealed change log (readable now,
        durable with the next checkpoint).

        Raises:
            EpochOrderError: ``epoch`` is not after the last sealed epoch.
        """
        if type(epoch) is not int or epoch <= self._last_sealed:
            raise EpochOrderError("epoch", self._last_sealed, epoch)
        if self._buffer:
            rows = pa.Table.from_batches(self._buffer, self._stored)
            self._sealed[epoch] = MemorySegment(_segments.by_vnode(rows), self.vnode_count)
            self._buffer = []
        self._last_sealed = epoch

    # Reading.

    @property
    def last_sealed_epoch(self) -> int:
        """The newest epoch that can be read (sealed; maybe not durable yet)."""
        return self._last_sealed

    @property
    def oldest_epoch(self) -> int:
        """The oldest epoch the table can be read as of (0 until a compaction)."""
        return self._base_epoch

    def epochs_after(self, epoch: int) -> list[int]:
        """The sealed epochs after ``epoch`` that wrote rows, oldest first.

        Raises:
            VersionCompactedError: ``epoch`` is older than :attr:`oldest_epoch`.
        """
        self._check_readable(epoch, change_log=False)
        return sorted(e for e in (*self._deltas, *self._sealed) if e > epoch)

    def _check_readable(self, epoch: int, *, change_log: bool) -> None:
        if type(epoch) is not int or epoch < 0:
            raise InvalidArgumentError("epoch", "an int >= 0", epoch)
        if epoch > self._last_sealed:
            raise EpochNotSealedError(self.label, epoch, self._last_sealed)
        # A change log is folded with its epoch; a version as of the base's epoch is the base.
        folded = epoch <= self._base_epoch if change_log else epoch < self._base_epoch
        if self._base is not None and folded:
            raise VersionCompactedError(self.label, epoch, self._base_epoch)

    def _versions(self, epoch: int) -> list[Segment | MemorySegment]:
        """The segments a read as of ``epoch`` merges, oldest first (taken on the event loop:
        commits and compactions change the lists, the segments themselves never change)."""
        found: list[Segment | MemorySegment] = [] if self._base is None else [self._base]
        for e in sorted(e for e in (*self._deltas, *self._sealed) if e <= epoch):
            found.append(self._deltas.get(e) or self._sealed[e])
        return found

    def _merge(
        self, versions: Sequence[Segment | MemorySegment], vnode: int, after: Sequence[Any] | None
    ) -> pa.Table:
        """One vnode's rows as ``versions`` leave them (on a worker thread)."""
        rows = self._latest(versions, vnode, self.schema.names)
        if rows is None:
            return self.schema.empty_table()
        if after is not None:
            rows = _segments.after_key(rows, self.primary_key, after)
        return rows

    def _latest(
        self,
        versions: Sequence[Segment | MemorySegment],
        vnode: int,
        columns: Sequence[str] | None = None,
    ) -> pa.Table | None:
        """``vnode``'s rows as ``versions`` (oldest first) leave them, ``_op`` kept; ``None``
        if none of them holds the vnode. A base alone is the answer as it is."""
        parts = [rows for v in versions if (rows := v.vnode(vnode)) is not None]
        if not parts:
            return None
        first = versions[0]
        based = first is self._base and first.vnode(vnode) is not None
        return _segments.latest_rows(parts, self.primary_key, base=based, columns=columns)

    async def read_vnode(
        self, vnode: int, epoch: int, *, after: Sequence[Any] | None = None
    ) -> pa.Table:
        """The rows of ``vnode`` as of ``epoch``, in primary-key order; with ``after`` (a key,
        one value per key column) only the rows after it — how a reader resumes.

        Raises:
            InvalidArgumentError: a bad vnode, or ``after`` of the wrong length.
            EpochNotSealedError: ``epoch`` is not sealed yet.
            VersionCompactedError: ``epoch`` is older than :attr:`oldest_epoch`.
        """
        self._check_vnode(vnode)
        self._check_readable(epoch, change_log=False)
        if after is not None and (
            not isinstance(after, list | tuple) or len(after) != len(self.primary_key)
        ):
            raise InvalidArgumentError(
                "after", f"None or one value per key column {self.primary_key}", after
            )
        versions = self._versions(epoch)
        return await anyio.to_thread.run_sync(self._merge, versions, vnode, after)

    async def change_log(self, epoch: int, vnodes: VnodeBitmap | None = None) -> pa.Table:
        """What ``epoch`` wrote (the ops in column ``_op``), by vnode, each vnode's rows in the
        order written; only the rows of ``vnodes`` if given.

        Raises:
            EpochNotSealedError: ``epoch`` is not sealed yet.
            VersionCompactedError: ``epoch``'s change log was folded by a compaction.
        """
        self._check_readable(epoch, change_log=True)
        segment = self._deltas.get(epoch) or self._sealed.get(epoch)
        if segment is None:
            return self._stored.empty_table().drop_columns([VNODE_COLUMN])
        rows = await anyio.to_thread.run_sync(segment.table)
        if vnodes is not None:
            mask = vnodes.mask[rows.column(VNODE_COLUMN).to_numpy()]
            rows = rows.filter(pa.array(mask))
        return rows.drop_columns([VNODE_COLUMN])

    def _check_vnode(self, vnode: object) -> None:
        if type(vnode) is not int or not 0 <= vnode < self.vnode_count:
            raise InvalidArgumentError("vnode", f"an int in 0..{self.vnode_count - 1}", vnode)

    # Pins.

    def pin(self, reader: str, epoch: int) -> None:
        """Keep ``epoch``'s version and every later change log readable for ``reader`` (one
        pin per reader; a new one replaces it).

        Pins live in memory, not in the store: compaction only runs in a checkpoint's commit,
        which waits for every actor to pass the checkpoint's barrier, and a reader pins at its
        first barrier, before it passes it — so after a restart every reader has pinned again
        before anything can be folded, and a pin of a job that never became durable (or was
        dropped) cannot outlive it and hold compaction back for ever.

        Raises:
            InvalidArgumentError: ``reader`` is not a non-empty str.
            VersionCompactedError: ``epoch`` was already folded away.
        """
        if not isinstance(reader, str) or not reader:
            raise InvalidArgumentError("reader", "a non-empty str", reader)
        self._check_readable(epoch, change_log=False)
        self._pins[reader] = epoch

    def unpin(self, reader: str) -> None:
        """Release ``reader``'s pin (a no-op without one)."""
        self._pins.pop(reader, None)

    @property
    def pins(self) -> dict[str, int]:
        """Reader → pinned epoch."""
        return dict(self._pins)

    # The store's side: checkpoints, compaction, recovery.

    async def _persist_through(self, epoch: int) -> list[_sql.Statement]:
        """Write the segment files of the sealed epochs up to ``epoch``; the manifest rows
        that the checkpoint's transaction must hold with them."""
        rows: list[tuple[Any, ...]] = []
        for e in sorted(e for e in self._sealed if e <= epoch):
            file = f"delta-{e:020d}.arrow"
            count = await anyio.to_thread.run_sync(
                _segments.write_delta, self.directory / file, self._stored, self._sealed[e].rows
            )
            rows.append((self.owner, self.name, "delta", e, file, count))
        return [_sql.Statement(_sql.SEGMENT_ADD, rows)]

    def _committed_through(self, epoch: int) -> None:
        """The checkpoint of ``epoch`` is durable: its epochs are read from their files now."""
        for e in sorted(e for e in self._sealed if e <= epoch):
            self._deltas[e] = Segment(self.directory / f"delta-{e:020d}.arrow", e)
            del self._sealed[e]

    def _discard_uncommitted(self, committed: int) -> None:
        """Recovery: forget what is not durable (buffer, sealed epochs)."""
        self._buffer = []
        self._sealed.clear()
        self._last_sealed = committed

    def _fold_through(self, committed: int) -> int | None:
        """The epoch a compaction would fold through now, or ``None`` if it is not due."""
        if len(self._deltas) <= self.compact_after:
            return None
        through = min([committed, *self._pins.values()])
        folded = [e for e in self._deltas if e <= through]
        return through if folded and through > self._base_epoch else None

    def _write_base(self, versions: Sequence[Segment | MemorySegment], through: int) -> int:
        """Fold ``versions`` into the base file of ``through``, one vnode at a time (memory
        holds one vnode's rows); returns its row count."""
        vnodes = sorted({v for version in versions for v in version.vnodes()})

        def merged() -> Iterator[pa.Table]:
            for vnode in vnodes:
                rows = self._latest(versions, vnode)
                yield self._stored.empty_table() if rows is None else rows

        path = self.directory / f"base-{through:020d}.arrow"
        return _segments.write_segment(path, self._stored, vnodes, merged())

    async def _compact(self, through: int, transaction: Any) -> None:
        """Fold every durable version up to ``through`` into a new base; the manifest swaps in
        one transaction, then the old files go."""
        file = f"base-{through:020d}.arrow"
        versions = [v for v in self._versions(through) if isinstance(v, Segment)]
        count = await anyio.to_thread.run_sync(self._write_base, versions, through)
        await transaction(
            [
                _sql.Statement(_sql.SEGMENT_FOLD, [(self.owner, self.name, through)]),
                _sql.Statement(
                    _sql.SEGMENT_ADD, [(self.owner, self.name, "base", through, file, count)]
                ),
            ]
        )
        old = [s for e, s in self._deltas.items() if e <= through]
        if self._base is not None:
            old.append(self._base)
        self._base, self._base_epoch = Segment(self.directory / file, through), through
        self._deltas = {e: s for e, s in self._deltas.items() if e > through}
        for segment in old:
            _segments.remove_quietly(segment.path)

    def __repr__(self) -> str:
        return (
            f"<VersionedTable {self.label} key={list(self.primary_key)} "
            f"oldest={self._base_epoch} sealed={self._last_sealed}>"
        )


def table_directory(store_path: str, owner: str, name: str) -> Path:
    """Where the segment files of ``owner``'s table ``name`` live, beside the store file."""
    quote = urllib.parse.quote
    return Path(f"{store_path}.versions") / quote(owner, safe="") / quote(name, safe="")


def stored_tables(store_path: str, owner: str) -> dict[str, pa.Schema]:
    """The versioned tables of ``owner`` that have segment files beside the store at
    ``store_path``, each with the schema of its rows (read from a file's header; the
    columns the table adds, ``_vnode`` and ``_op``, left out): what to open a table with when
    only its files say what it holds."""
    owned = table_directory(store_path, owner, "-").parent
    found: dict[str, pa.Schema] = {}
    if not owned.is_dir():
        return found
    for directory in sorted(owned.iterdir()):
        files = sorted(directory.glob("*.arrow"))
        if files:
            schema = Segment(files[0], 0).schema
            stored = [i for i, n in enumerate(schema.names) if n in (VNODE_COLUMN, OP_COLUMN)]
            for index in reversed(stored):
                schema = schema.remove(index)
            found[urllib.parse.unquote(directory.name)] = schema.remove_metadata()
    return found


def rows_after(rows: pa.Table, key: Sequence[str], after: Sequence[Any]) -> pa.Table:
    """The rows of ``rows`` whose ``key`` is greater than ``after``, compared column by column
    as a read in key order sorts them: how a reader of rows in key order resumes (what
    :meth:`VersionedTable.read_vnode` does with ``after``, for rows read elsewhere)."""
    return _segments.after_key(rows, key, after)
