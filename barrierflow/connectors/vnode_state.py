"""A keyed operator's state on a directory the driver and the Spark executors share:
partitioned by vnode, versioned by epoch, committed once per epoch by the driver.

Stateless compute, state in shared storage (RisingWave's Hummock): a Spark task that owns some
vnodes reads their state **as of the last committed epoch** (:meth:`VnodeStateStore.read`),
applies its micro-batch, and stages the epoch's changes of its vnodes
(:meth:`VnodeStateStore.stage`) under its own attempt's name; the driver makes the kept
attempts' deltas the version of the epoch in one atomic step (:meth:`VnodeStateStore.commit`),
and folds old deltas into a base per vnode range in the background
(:meth:`VnodeStateStore.compact`). Blocking API (file I/O): call it from a Spark task, or
from async code on a worker thread.

Layout under ``root`` (epochs and staging numbers as 20 digits)::

    staged/<number>/<attempt>/delta.parquet     a task attempt's changes (invisible)
    deltas/<epoch>/<number>-<attempt>.parquet   the committed changes of an epoch
    bases/<epoch>/r<first>-<end>.parquet        the state as of an epoch, one file per range
    _manifest.json                              the committed versions (the only truth)
    .manifest.lock                              held while the manifest is replaced

Every Parquet file holds the store's columns (key + state), ``__vnode`` (int16) and
``__op`` (int8, a :class:`~barrierflow.channels.Op` code; a base holds inserts only), its
rows grouped by vnode so a read of some vnodes filters row groups by their statistics.

**Changes.** A change is an upsert (``INSERT``/``UPDATE_INSERT``) or a delete
(``DELETE``/``UPDATE_DELETE``) of a key; within a delta the last row of a key wins. Tasks of
one epoch own disjoint vnodes, so a key has at most one delta per epoch.

**Reads.** As of epoch ``A``: the newest base at or before ``A``, then the delta of each
committed epoch after it up to ``A`` in epoch order; a key's last write wins and a delete
removes it (one hash aggregation over a row sequence number: vectorized). Readers look only at
files the manifest names, so a staged delta, or the files of a commit cut short, are never
read.

**The commit of epoch E** with the deltas ``D`` (:meth:`~VnodeStateStore.commit`) runs these
steps; what a crash after each leaves, and why calling ``commit(E, D)`` again recovers:

1. *Rename each delta of D* from ``staged/`` into ``deltas/<E>/`` and fsync the directory. A
   crash midway leaves some files moved, some staged; the manifest does not name epoch E, so
   no reader sees any of them. Again: a delta already at its destination (and gone from
   ``staged/``) is skipped, the others are moved.
2. *Replace the manifest* (written to a temporary name, fsynced, ``os.replace``, directory
   fsynced) with one that names E and its files: the commit point. A crash before the rename
   leaves the old manifest (E invisible, step 1 done: again, everything is skipped up to this
   step); after it, E is committed.
3. *Delete* ``staged/<number>/`` of every staging number D names (the kept attempts' emptied
   directories and every failed or speculative attempt of the same micro-batch). A crash here
   leaves debris that no manifest names. Again: E is committed with the same deltas, so the
   call is a no-op that finishes the deletion; with *different* deltas it is refused
   (:class:`StateCommitConflictError`) — an epoch has one version.

So a driver that persisted the epoch as pending with its deltas (the coordinator's two-phase
commit) recovers by calling ``commit`` again with them, and a micro-batch that never reached
the pending state is dropped with :meth:`~VnodeStateStore.drop_staged` (its rows are replayed
and staged again). Epochs commit in increasing order (a smaller uncommitted epoch is refused).

**Compaction** (:meth:`~VnodeStateStore.compact`) folds the versions up to ``up_to`` into a
new base without the manifest lock (reads and commits go on), then, under the lock, re-reads the
manifest, adds the base, forgets what no reader can need any more — every version before
``up_to`` except the pinned ones and what they read — and only after the manifest names the new
base deletes the forgotten files. A read of an unpinned epoch folded away raises
:class:`~barrierflow.errors.VersionCompactedError`; a reader that read the manifest just before
a compaction deleted a file it needs reads the new manifest and tries again.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import re
import shutil
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from barrierflow._fs import check_path_argument, fsync_path, write_atomically
from barrierflow.channels.chunk import Op
from barrierflow.channels.errors import (
    EpochOrderError,
    InvalidArgumentError,
    VnodeOwnershipError,
)
from barrierflow.channels.schema import conform_schema
from barrierflow.channels.vnode import (
    DEFAULT_VNODE_COUNT,
    VnodeBitmap,
    check_key_columns,
    vnodes_unchecked,
)
from barrierflow.connectors.errors import ExecutorStagingError, StateCommitConflictError
from barrierflow.runtime.state.errors import VersionCompactedError
from barrierflow.runtime.state.versioned_checks import check_key_schema, op_codes

__all__ = ["StateDelta", "VnodeStateStore", "remove_staged"]

#: The vnode of each stored row.
VNODE_COLUMN = "__vnode"
#: The op of each stored row (an :class:`Op` code).
OP_COLUMN = "__op"
_SEQUENCE = "__seq"
MANIFEST = "_manifest.json"
_LOCK = ".manifest.lock"
_FORMAT = "barrierflow.vnode_state/1"
_ATTEMPT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")
_ROW_GROUP_ROWS = 64 * 1024
_UPSERTS = (int(Op.INSERT), int(Op.UPDATE_INSERT))


def _name(number: int) -> str:
    return f"{number:020d}"


@final
@dataclass(frozen=True, slots=True)
class StateDelta:
    """What a task attempt staged (:meth:`VnodeStateStore.stage`): small and JSON-friendly,
    returned by the Spark task and given to :meth:`VnodeStateStore.commit` on the driver.

    Attributes:
        number: the staging number of the micro-batch.
        attempt: the task attempt's name.
        vnodes: the vnodes the attempt owns, as ``(first, end)`` runs (``end`` excluded).
        rows: the rows (changes) staged.
        path: the staged file, relative to the store's root.
    """

    number: int
    attempt: str
    vnodes: tuple[tuple[int, int], ...]
    rows: int
    path: str

    @property
    def ident(self) -> tuple[int, str]:
        """``(number, attempt)``: what tells two deltas apart."""
        return (self.number, self.attempt)

    def committed_path(self, epoch: int) -> str:
        """Where the delta lives once ``epoch`` holds it, relative to the root."""
        return f"deltas/{_name(epoch)}/{_name(self.number)}-{self.attempt}.parquet"

    def to_json(self) -> dict[str, Any]:
        """The delta as JSON-able data (it travels in a manifest and a pending commit)."""
        return {
            "number": self.number,
            "attempt": self.attempt,
            "vnodes": [list(run) for run in self.vnodes],
            "rows": self.rows,
            "path": self.path,
        }

    @staticmethod
    def from_json(data: Any) -> StateDelta:
        """A delta from :meth:`to_json`'s data.

        Raises:
            InvalidArgumentError: ``data`` is not what :meth:`to_json` makes.
        """
        try:
            runs = tuple((int(first), int(end)) for first, end in data["vnodes"])
            delta = StateDelta(
                int(data["number"]), str(data["attempt"]), runs, int(data["rows"]),
                str(data["path"]),
            )  # fmt: skip
        except (TypeError, KeyError, ValueError) as exc:
            raise InvalidArgumentError("delta", "a StateDelta's JSON", data) from exc
        return delta


def _runs_mask(runs: Iterable[Sequence[int]], vnode_count: int) -> npt.NDArray[np.bool_]:
    mask = np.zeros(vnode_count, dtype=np.bool_)
    for first, end in runs:
        mask[first:end] = True
    return mask


def _entry(path: str, runs: Iterable[Sequence[int]], rows: int) -> dict[str, Any]:
    return {"path": path, "vnodes": [list(r) for r in runs], "rows": rows}


@final
class VnodeStateStore:
    """The state of one keyed operator on a shared directory (see the module docstring).

    Cheap to build (it reads only the manifest, to check the key, schema and vnode count it
    was made with) and picklable: a Spark task builds its own from the root, key and
    schema. Nothing is created until something is staged or committed.

    Args:
        root: the directory the driver and the executors share.
        key: the key columns (non-nullable, hashable: the vnode of a row is their hash).
        schema: the key columns and the state columns.
        vnode_count: the vnodes of the key space (must match the operator's partitioning).
        base_ranges: how many vnode ranges (one base file each) compaction writes (default:
            16, or one per vnode when there are fewer).

    Raises:
        InvalidArgumentError: a bad argument, or a ``root`` whose store was made with another
            key, schema or vnode count.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        key: Sequence[str],
        schema: pa.Schema,
        *,
        vnode_count: int = DEFAULT_VNODE_COUNT,
        base_ranges: int | None = None,
    ) -> None:
        self._root = Path(os.path.abspath(check_path_argument(root)))
        if not isinstance(schema, pa.Schema):
            raise InvalidArgumentError("schema", "a pyarrow Schema", schema)
        if {VNODE_COLUMN, OP_COLUMN, _SEQUENCE} & set(schema.names):
            raise InvalidArgumentError(
                "schema", f"no column named {VNODE_COLUMN}, {OP_COLUMN} or {_SEQUENCE}", schema
            )
        self._key = check_key_schema(schema, key, "key")
        check_key_columns(schema, self._key)
        self._schema = schema
        # VnodeBitmap checks the count (1..32768); int16 holds vnodes 0..32767.
        VnodeBitmap.empty(vnode_count)
        self._vnode_count = vnode_count
        if base_ranges is None:
            base_ranges = min(16, vnode_count)
        if type(base_ranges) is not int or not 1 <= base_ranges <= vnode_count:
            raise InvalidArgumentError("base_ranges", f"an int in 1..{vnode_count}", base_ranges)
        self._ranges = [b.runs()[0] for b in VnodeBitmap.split(base_ranges, vnode_count)]
        self._stored = schema.append(pa.field(VNODE_COLUMN, pa.int16(), nullable=False)).append(
            pa.field(OP_COLUMN, pa.int8(), nullable=False)
        )
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            self._check_identity(self._load())

    @classmethod
    def existing(cls, root: str | os.PathLike[str]) -> VnodeStateStore | None:
        """The store at ``root`` as its manifest describes it (key, schema, vnode count), or
        ``None`` before its first commit.

        Raises:
            InvalidArgumentError: ``root`` holds something else than a vnode state store.
        """
        path = Path(os.path.abspath(check_path_argument(root)))
        try:
            manifest: dict[str, Any] = json.loads((path / MANIFEST).read_bytes())
        except (FileNotFoundError, NotADirectoryError):
            return None
        except ValueError as exc:
            raise InvalidArgumentError(
                "root", f"a directory of a vnode state store ({_FORMAT})", str(path)
            ) from exc
        if manifest.get("format") != _FORMAT:
            raise InvalidArgumentError(
                "root", f"a directory of a vnode state store ({_FORMAT})", str(path)
            )
        schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(manifest["schema"])))
        return cls(path, manifest["key"], schema, vnode_count=int(manifest["vnode_count"]))

    @property
    def root(self) -> Path:
        """The store's directory."""
        return self._root

    @property
    def key(self) -> tuple[str, ...]:
        """The key columns."""
        return self._key

    @property
    def schema(self) -> pa.Schema:
        """The key and state columns."""
        return self._schema

    @property
    def vnode_count(self) -> int:
        """The vnodes of the key space."""
        return self._vnode_count

    def sizes(self) -> tuple[int, int]:
        """``(base rows, delta rows)``: the rows of the newest base, and of the committed
        deltas after it — what a read of every vnode goes through besides the base (what a
        compaction policy weighs)."""
        manifest = self._load_or_empty()
        bases = manifest["bases"]
        since = bases[-1]["epoch"] if bases else 0
        base = sum(int(f["rows"]) for f in bases[-1]["files"]) if bases else 0
        deltas = sum(
            int(entry["rows"])
            for version in manifest["versions"]
            if version["epoch"] > since and version["deltas"] is not None
            for entry in version["deltas"]
        )
        return base, deltas

    def last_committed(self) -> int:
        """The last committed epoch (0 before the first commit)."""
        return int(self._load_or_empty()["last"])

    # The manifest.

    def _identity(self) -> dict[str, Any]:
        return {
            "format": _FORMAT,
            "key": list(self._key),
            "vnode_count": self._vnode_count,
            "schema": base64.b64encode(self._schema.serialize().to_pybytes()).decode(),
        }

    def _check_identity(self, manifest: dict[str, Any]) -> None:
        if manifest.get("format") != _FORMAT:
            raise InvalidArgumentError(
                "root", f"a directory of a vnode state store ({_FORMAT})", str(self._root)
            )
        held = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(manifest["schema"])))
        for argument, want, got in (
            ("key", manifest["key"], list(self._key)),
            ("vnode_count", manifest["vnode_count"], self._vnode_count),
        ):
            if want != got:
                raise InvalidArgumentError(argument, f"{want!r}, as the store holds", got)
        if not held.equals(self._schema):
            raise InvalidArgumentError("schema", f"{held}, as the store holds", self._schema)

    def _load(self) -> dict[str, Any]:
        """The committed manifest (raises FileNotFoundError before the first commit)."""
        manifest: dict[str, Any] = json.loads((self._root / MANIFEST).read_bytes())
        return manifest

    def _load_or_empty(self) -> dict[str, Any]:
        try:
            return self._load()
        except FileNotFoundError:
            return self._identity() | {"last": 0, "floor": 0, "versions": [], "bases": []}

    @contextlib.contextmanager
    def _manifest_lock(self) -> Iterator[dict[str, Any]]:
        """The manifest, under an exclusive lock across threads and processes (held only to
        read, change and replace it)."""
        self._root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._root / _LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            manifest = self._load_or_empty()
            self._check_identity(manifest)
            yield manifest
        finally:
            os.close(fd)

    def committed_epochs(self) -> list[int]:
        """The committed epochs the store still records, ascending: every epoch after the
        oldest base (an epoch folded under it is forgotten, the base's own epoch kept)."""
        try:
            manifest = self._load()
        except FileNotFoundError:
            return []
        return [int(v["epoch"]) for v in manifest["versions"]]

    # Task side.

    def _bitmap(self, vnodes: object) -> VnodeBitmap:
        if isinstance(vnodes, VnodeBitmap):
            if vnodes.vnode_count != self._vnode_count:
                raise InvalidArgumentError(
                    "vnodes", f"a bitmap of {self._vnode_count} vnodes", vnodes
                )
            return vnodes
        if not isinstance(vnodes, list | tuple | range | np.ndarray):
            raise InvalidArgumentError("vnodes", "a VnodeBitmap or a sequence of ints", vnodes)
        return VnodeBitmap.from_vnodes(vnodes, self._vnode_count)

    def stage(
        self,
        number: int,
        attempt: str,
        vnodes: VnodeBitmap | Sequence[int],
        changes: pa.Table | pa.RecordBatch,
        ops: pa.Array | pa.ChunkedArray | Sequence[int],
    ) -> StateDelta:
        """Stage this epoch's ``changes`` of ``vnodes`` under attempt ``attempt`` of staging
        ``number``: written to a temporary name, fsynced and renamed into
        ``staged/<number>/<attempt>/``; invisible until a commit names the returned delta.
        Staging the same attempt again replaces what it staged.

        Args:
            number: the micro-batch's staging number (an int >= 0).
            attempt: the task attempt's name (letters, digits, ``_ . -``; unique per number).
            vnodes: the vnodes the attempt owns; every change must be of one of them.
            changes: rows of the store's schema.
            ops: one :class:`~barrierflow.channels.Op` code per row of ``changes``.

        Raises:
            InvalidArgumentError: a bad argument; a change of a vnode outside ``vnodes``.
            SchemaMismatchError: ``changes`` is not of the store's schema.
        """
        if type(number) is not int or number < 0:
            raise InvalidArgumentError("number", "an int >= 0", number)
        if not isinstance(attempt, str) or not _ATTEMPT.fullmatch(attempt):
            raise InvalidArgumentError(
                "attempt", "1-100 letters, digits, '_', '.', '-' (not first: '.', '-')", attempt
            )
        bitmap = self._bitmap(vnodes)
        rows = conform_schema(changes, self._schema, "changes")
        codes = _op_codes(ops, rows.num_rows)
        row_vnodes = vnodes_unchecked(rows, self._key, self._vnode_count)
        outside = ~bitmap.mask[row_vnodes]
        if outside.any():
            raise InvalidArgumentError(
                "changes",
                f"rows of the vnodes {list(bitmap.runs())}",
                f"rows of vnodes {sorted(set(row_vnodes[outside][:8].tolist()))}",
            )
        # Grouped by vnode (a stable sort keeps each key's rows in order: keys never share
        # rows across vnodes), so row-group statistics let a read skip other vnodes.
        order = np.argsort(row_vnodes.astype(np.int16), kind="stable")
        stored = pa.Table.from_arrays(
            [*rows.columns, pa.array(row_vnodes.astype(np.int16)), codes], schema=self._stored
        ).take(pa.array(order))
        delta = StateDelta(
            number,
            attempt,
            bitmap.runs(),
            rows.num_rows,
            f"staged/{_name(number)}/{attempt}/delta.parquet",
        )
        path = self._root / delta.path
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_parquet(path, stored)
        fsync_path(path.parent)
        fsync_path(path.parent.parent)
        return delta

    def read(self, vnodes: VnodeBitmap | Sequence[int], as_of: int) -> pa.Table:
        """The rows of ``vnodes`` as of the committed epoch ``as_of`` (0: before any commit),
        in the store's schema, in no particular order.

        Raises:
            InvalidArgumentError: bad ``vnodes``; ``as_of`` is not an int from 0 up to the
                last committed epoch.
            VersionCompactedError: ``as_of`` was folded away by a compaction that did not pin
                it.
        """
        bitmap = self._bitmap(vnodes)
        if type(as_of) is not int or as_of < 0:
            raise InvalidArgumentError("as_of", "an epoch (an int >= 0)", as_of)
        previous: dict[str, Any] | None = None
        while True:
            manifest = self._load_or_empty()
            try:
                return self._read(manifest, bitmap, as_of)
            except FileNotFoundError:
                # A compaction deleted a file after we read the manifest: read the new one;
                # the same manifest twice means a file is lost, not compacted.
                if manifest == previous:
                    raise
                previous = manifest

    def _read(self, manifest: dict[str, Any], bitmap: VnodeBitmap, as_of: int) -> pa.Table:
        if as_of > manifest["last"]:
            raise InvalidArgumentError(
                "as_of", f"a committed epoch (at most {manifest['last']})", as_of
            )
        if as_of < manifest["floor"]:
            raise VersionCompactedError(str(self._root), as_of, manifest["floor"])
        bases = [b for b in manifest["bases"] if b["epoch"] <= as_of]
        base = bases[-1] if bases else None
        since = base["epoch"] if base else 0
        files: list[dict[str, Any]] = list(base["files"]) if base else []
        for version in manifest["versions"]:
            if since < version["epoch"] <= as_of:
                if version["deltas"] is None:
                    later = [b["epoch"] for b in manifest["bases"] if b["epoch"] > as_of]
                    raise VersionCompactedError(str(self._root), as_of, min(later))
                files.extend(version["deltas"])
        parts = [
            part for part in (self._read_file(entry, bitmap) for entry in files) if part.num_rows
        ]
        if not parts:
            return self._schema.empty_table()
        return _latest(pa.concat_tables(parts), self._key).select(self._schema.names)

    def _read_file(self, entry: dict[str, Any], bitmap: VnodeBitmap) -> pa.Table:
        held = _runs_mask(entry["vnodes"], self._vnode_count)
        wanted = held & bitmap.mask
        if not entry["rows"] or not wanted.any():
            return self._stored.empty_table()
        path = str(self._root / entry["path"])
        if (wanted == held).all():
            table = pq.read_table(path, schema=self._stored)
        else:
            vnodes = pa.array(np.flatnonzero(wanted).astype(np.int16))
            table = pq.read_table(
                path, schema=self._stored, filters=pc.field(VNODE_COLUMN).isin(vnodes)
            )
        return table

    def change_log(self, epoch: int, vnodes: VnodeBitmap | Sequence[int] | None = None) -> pa.Table:
        """What the committed epoch ``epoch`` changed (of ``vnodes``; ``None``: all), each
        delta's rows in the order staged, with their ops in :data:`OP_COLUMN`; no rows for an
        epoch that changed nothing here.

        Raises:
            InvalidArgumentError: bad ``vnodes``; ``epoch`` is not an int from 1 up to the last
                committed epoch.
            VersionCompactedError: ``epoch``'s changes were folded into a base.
        """
        bitmap = VnodeBitmap.full(self._vnode_count) if vnodes is None else self._bitmap(vnodes)
        manifest = self._load_or_empty()
        if type(epoch) is not int or not 1 <= epoch <= manifest["last"]:
            raise InvalidArgumentError("epoch", f"a committed epoch (1..{manifest['last']})", epoch)
        version = next((v for v in manifest["versions"] if v["epoch"] == epoch), None)
        if epoch < manifest["floor"] or (version is not None and version["deltas"] is None):
            raise VersionCompactedError(str(self._root), epoch, manifest["floor"])
        entries = [] if version is None else version["deltas"]
        parts = [self._read_file(entry, bitmap) for entry in entries]
        rows = pa.concat_tables([self._stored.empty_table(), *parts])
        return rows.drop_columns([VNODE_COLUMN])

    # Readers that must keep a version (a snapshot backfill on the driver).

    def pin(self, reader: str, epoch: int) -> None:
        """Keep ``epoch``'s version and every later epoch's changes readable for ``reader``
        (one pin per reader; a new one replaces it): :meth:`compact` is given the pins by
        whoever runs it, and never folds past the oldest. Pins are files under ``pins/``, so
        they hold across processes and restarts; :meth:`unpin` when done.

        Raises:
            InvalidArgumentError: ``reader`` is not 1-100 letters, digits, ``_ . -``, or
                ``epoch`` not an int >= 0.
        """
        if not isinstance(reader, str) or not _ATTEMPT.fullmatch(reader):
            raise InvalidArgumentError("reader", "1-100 letters, digits, '_', '.', '-'", reader)
        if type(epoch) is not int or epoch < 0:
            raise InvalidArgumentError("epoch", "an int >= 0", epoch)
        (self._root / "pins").mkdir(parents=True, exist_ok=True)
        data = json.dumps({"epoch": epoch}).encode()
        write_atomically(self._root / "pins" / f"{reader}.json", data)

    def unpin(self, reader: str) -> None:
        """Release ``reader``'s pin (a no-op without one)."""
        if isinstance(reader, str) and _ATTEMPT.fullmatch(reader):
            (self._root / "pins" / f"{reader}.json").unlink(missing_ok=True)

    def pins(self) -> dict[str, int]:
        """Reader -> pinned epoch."""
        found: dict[str, int] = {}
        with contextlib.suppress(FileNotFoundError):
            for path in (self._root / "pins").glob("*.json"):
                with contextlib.suppress(FileNotFoundError, ValueError, KeyError):
                    found[path.stem] = int(json.loads(path.read_text())["epoch"])
        return found

    # Driver side.

    def commit(self, epoch: int, deltas: Sequence[StateDelta]) -> None:
        """Make ``deltas`` (the kept attempts', owning disjoint vnodes) the version ``epoch``:
        atomic, idempotent (see the module docstring for each step and its recovery).

        Raises:
            InvalidArgumentError: a bad argument; ``EpochOrderError`` for an epoch not committed
                and not above the last committed one; ``VnodeOwnershipError`` for deltas that
                own a vnode twice.
            StateCommitConflictError: ``epoch`` is committed with other deltas.
            ExecutorStagingError: a delta is neither staged nor moved (a recovery dropped it:
                stage the micro-batch again).
        """
        if type(epoch) is not int or epoch < 1:
            raise InvalidArgumentError("epoch", "an int >= 1", epoch)
        kept = self._check_deltas(deltas)
        idents = {d.ident for d in kept}
        manifest = self._load_or_empty()
        self._check_identity(manifest)
        if epoch <= manifest["last"]:
            self._replayed(manifest, epoch, kept)
            _remove_staged(self._root, {d.number for d in kept})
            return
        for delta in kept:
            _move_delta(self._root, delta, epoch)
        target = self._root / "deltas" / _name(epoch)
        if kept:
            fsync_path(target)
            fsync_path(target.parent)
        with self._manifest_lock() as current:
            if epoch <= current["last"]:  # another driver thread committed meanwhile
                self._replayed(current, epoch, kept)
            else:
                current["versions"].append(
                    {
                        "epoch": epoch,
                        "ids": sorted([n, a] for n, a in idents),
                        "deltas": [_entry(d.committed_path(epoch), d.vnodes, d.rows) for d in kept],
                    }
                )
                current["last"] = epoch
                _publish(self._root, current)
        _remove_staged(self._root, {d.number for d in kept})

    def _check_deltas(self, deltas: object) -> list[StateDelta]:
        if not isinstance(deltas, list | tuple) or not all(
            isinstance(d, StateDelta) for d in deltas
        ):
            raise InvalidArgumentError("deltas", "a list or tuple of StateDelta", deltas)
        kept = list(deltas)
        if len({d.ident for d in kept}) != len(kept):
            raise InvalidArgumentError("deltas", "each attempt's delta once", deltas)
        owners = np.zeros(self._vnode_count, dtype=np.int64)
        for delta in kept:
            owners += _runs_mask(delta.vnodes, self._vnode_count)
        if (owners > 1).any():
            raise VnodeOwnershipError("deltas", np.flatnonzero(owners > 1).tolist(), ())
        return kept

    def _replayed(self, manifest: dict[str, Any], epoch: int, kept: list[StateDelta]) -> None:
        """Accept a commit of an epoch at or below the last committed one if it is a replay
        (the same deltas); refuse it otherwise."""
        got = {d.ident for d in kept}
        for version in manifest["versions"]:
            if version["epoch"] == epoch:
                held = {(int(n), str(a)) for n, a in version["ids"]}
                if held != got:
                    raise StateCommitConflictError(str(self._root), epoch, held, got)
                return
        if epoch >= manifest["floor"]:  # every epoch from the floor on is recorded
            raise EpochOrderError("epoch", manifest["last"], epoch)
        # Folded under a base: its record is gone, but a replay's deltas were all moved.
        if any((self._root / d.path).exists() for d in kept):
            raise StateCommitConflictError(str(self._root), epoch, (), got)

    def drop_staged(self, number: int) -> None:
        """Delete everything staged under ``number`` (what a failed micro-batch staged; its
        rows are replayed and staged again under a new number)."""
        if type(number) is not int or number < 0:
            raise InvalidArgumentError("number", "an int >= 0", number)
        _remove_staged(self._root, {number})

    def staged_numbers(self) -> list[int]:
        """The staging numbers with something staged, ascending (a recovery drops those no
        pending epoch names)."""
        try:
            names = os.listdir(self._root / "staged")
        except FileNotFoundError:
            return []
        return sorted(int(n) for n in names if n.isdigit())

    def compact(self, up_to: int, pinned: Iterable[int] = ()) -> None:
        """Fold the versions up to ``up_to`` into a base, one file per vnode range, and delete
        what no reader needs any more: reads as of ``up_to`` or later and as of each of
        ``pinned`` keep working; reads of other older epochs raise VersionCompactedError.
        Reads and commits are not blocked (the manifest lock is held only to publish). With a
        base at or after ``up_to`` already, only the retention runs again (a pin released
        since the last compaction frees its files).

        Raises:
            InvalidArgumentError: ``up_to`` is not an int from 1 up to the last committed
                epoch; ``pinned`` is not an iterable of ints.
        """
        if isinstance(pinned, str | bytes) or not isinstance(pinned, Iterable):
            raise InvalidArgumentError("pinned", "an iterable of epochs (ints)", pinned)
        pins = list(pinned)
        if not all(type(p) is int for p in pins):
            raise InvalidArgumentError("pinned", "an iterable of epochs (ints)", pins)
        manifest = self._load_or_empty()
        if type(up_to) is not int or not 1 <= up_to <= manifest["last"]:
            raise InvalidArgumentError("up_to", f"a committed epoch (1..{manifest['last']})", up_to)
        files = None
        if not any(b["epoch"] >= up_to for b in manifest["bases"]):
            files = self._write_base(manifest, up_to)
        with self._manifest_lock() as current:
            if files is not None and not any(b["epoch"] >= up_to for b in current["bases"]):
                current["bases"].append({"epoch": up_to, "files": files})
                current["bases"].sort(key=lambda b: b["epoch"])
            elif files is not None and not any(b["epoch"] == up_to for b in current["bases"]):
                # Another compaction went further meanwhile (one with our epoch wrote these
                # very files: they stay).
                shutil.rmtree(self._root / "bases" / _name(up_to), ignore_errors=True)
            if not current["bases"]:
                return
            before = _referenced(current)
            _retain(current, [p for p in pins if p < current["bases"][-1]["epoch"]])
            gone = before - _referenced(current)
            if files is None and not gone and current["floor"] == manifest["floor"]:
                return
            _publish(self._root, current)
        _remove_files(self._root, gone)

    def _write_base(self, manifest: dict[str, Any], up_to: int) -> list[dict[str, Any]]:
        """Write the state as of ``up_to`` as one base file per vnode range (no lock held:
        the files are named by no manifest yet); their manifest entries."""
        directory = self._root / "bases" / _name(up_to)
        directory.mkdir(parents=True, exist_ok=True)
        files = []
        for first, end in self._ranges:
            rows = self._read(
                manifest, VnodeBitmap.from_vnodes(range(first, end), self._vnode_count), up_to
            )
            path = directory / f"r{first:05d}-{end:05d}.parquet"
            vnodes = vnodes_unchecked(rows, self._key, self._vnode_count).astype(np.int16)
            order = np.argsort(vnodes, kind="stable")
            stored = pa.Table.from_arrays(
                [*rows.columns, pa.array(vnodes), pa.array(np.zeros(len(vnodes), np.int8))],
                schema=self._stored,
            ).take(pa.array(order))
            _write_parquet(path, stored)
            files.append(_entry(str(path.relative_to(self._root)), [(first, end)], rows.num_rows))
        fsync_path(directory)
        fsync_path(directory.parent)
        return files


# The steps of a commit (module functions: one place each, and what a crash test interrupts).


def _write_parquet(path: Path, table: pa.Table) -> None:
    """Write ``table`` at ``path``: temporary name, fsync, rename (the directory is fsynced by
    the caller, once for all its files). The temporary name is the writer's own (process and
    thread): two compactions to the same epoch write the same files side by side, and the
    second rename replaces the first with the same rows."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    pq.write_table(table, temporary, row_group_size=_ROW_GROUP_ROWS)
    fsync_path(temporary)
    os.replace(temporary, path)


def _move_delta(root: Path, delta: StateDelta, epoch: int) -> None:
    """Step 1: rename a staged delta into the epoch's directory (done already: skipped)."""
    source = root / delta.path
    target = root / delta.committed_path(epoch)
    if target.exists() and not source.exists():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(source, target)
    except FileNotFoundError as exc:
        raise ExecutorStagingError(
            str(root), f"the state delta {delta.path} is gone (a recovery dropped it)"
        ) from exc


def _publish(root: Path, manifest: dict[str, Any]) -> None:
    """Step 2: replace the manifest (the commit point)."""
    write_atomically(root / MANIFEST, json.dumps(manifest, sort_keys=True).encode())


def remove_staged(root: str | os.PathLike[str], number: int) -> None:
    """Delete what is staged under ``number`` in the store at ``root``, whatever its key and
    schema (:meth:`VnodeStateStore.drop_staged` without building the store: before its first
    commit nothing records them)."""
    _remove_staged(Path(root), {number})


def _remove_staged(root: Path, numbers: Iterable[int]) -> None:
    """Step 3: delete the staging directories of ``numbers``."""
    for number in numbers:
        shutil.rmtree(root / "staged" / _name(number), ignore_errors=True)


def _referenced(manifest: dict[str, Any]) -> set[str]:
    paths = {f["path"] for b in manifest["bases"] for f in b["files"]}
    for version in manifest["versions"]:
        paths.update(d["path"] for d in version["deltas"] or ())
    return paths


def _retain(manifest: dict[str, Any], pins: Sequence[int]) -> None:
    """Forget what no read needs once the newest base exists: reads as of the newest base or
    later need it and the deltas after it; a read as of a pin (below the newest base) needs
    the newest base at or before the pin and the deltas after that base up to the pin. The
    floor becomes the oldest base kept (0 if a pin needs every delta from the start)."""
    bases = manifest["bases"]
    newest = bases[-1]["epoch"]
    keep_bases = {newest}
    keep_deltas: set[int] = set()
    floor = newest
    for pin in pins:
        if pin < manifest["floor"]:
            continue  # folded away already: nothing a read of it could use
        under = [b["epoch"] for b in bases if b["epoch"] <= pin]
        since = under[-1] if under else 0
        keep_bases.update(under[-1:])
        keep_deltas.update(v["epoch"] for v in manifest["versions"] if since < v["epoch"] <= pin)
        floor = min(floor, since)
    manifest["bases"] = [b for b in bases if b["epoch"] in keep_bases]
    manifest["floor"] = floor
    manifest["versions"] = [
        v if v["epoch"] > newest or v["epoch"] in keep_deltas else v | {"deltas": None}
        for v in manifest["versions"]
        if v["epoch"] >= floor
    ]


def _remove_files(root: Path, paths: Iterable[str]) -> None:
    """Delete ``paths`` (relative to ``root``) and then their directories if empty (only
    directories of forgotten versions: no commit is moving a delta into them)."""
    directories = set()
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(root / path)
        directories.add((root / path).parent)
    for directory in directories:
        with contextlib.suppress(OSError):
            directory.rmdir()


def _op_codes(ops: object, n: int) -> pa.Array:
    """``ops`` as ``n`` int8 :class:`Op` codes (the versioned table's check); a delta names
    its ops, so ``None`` (the versioned table's "all inserts") is refused."""
    if ops is None or isinstance(ops, str | bytes):
        raise InvalidArgumentError("ops", "a sequence of Op codes (int8 0..3)", ops)
    return op_codes(ops, n)


def _latest(rows: pa.Table, key: Sequence[str]) -> pa.Table:
    """What ``rows`` (oldest first) leave behind: each key's last row, if it is an upsert (one
    hash aggregation: the largest row number per key)."""
    sequence = pa.array(np.arange(rows.num_rows, dtype=np.int64))
    numbered = rows.select(list(key)).append_column(_SEQUENCE, sequence)
    last = numbered.group_by(list(key)).aggregate([(_SEQUENCE, "max")])
    # Each key's last row taken first, then the upserts among them: the filter runs over the
    # keys, not over every row of every delta.
    latest = rows.take(last.column(f"{_SEQUENCE}_max"))
    return latest.filter(
        pc.is_in(latest.column(OP_COLUMN), value_set=pa.array(_UPSERTS, pa.int8()))
    )
