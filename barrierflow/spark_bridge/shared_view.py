"""An aggregate maintained in Spark's tasks, read from the driver like a materialized view.

A keyed step run on the executors keeps its output rows in the ``view`` store of its state
directory (:mod:`barrierflow.spark_bridge.task_state`), committed with the epoch's files. A
:class:`SharedView` reads that store the way a snapshot backfill reads a view's versioned
table — a vnode as of an epoch in key order, the change log of a committed epoch, pins that
hold compaction back — so that a new job joins the aggregate from the driver::

    job.add_actor("join", bridge.shared_view("events.aggregate").backfill(),
                  inputs=["events.aggregate"])

:meth:`SharedView.backfill` declares a
:class:`~barrierflow.actors.backfill.snapshot_backfill.SnapshotBackfill` that follows the view
(see that module); the executors' chain planner knows it reads the store, not the rows.

Before the step's first commit the store does not exist yet: the view reads as empty, at
epoch 0, and its first committed epoch is owed like any later one.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, final

import anyio.to_thread
import pyarrow as pa

from barrierflow.actors.backfill.materialize import VIEW_TABLE
from barrierflow.actors.backfill.snapshot_backfill import SnapshotBackfill, ViewTable
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.channels.vnode import DEFAULT_VNODE_COUNT, VnodeBitmap
from barrierflow.connectors.vnode_state import OP_COLUMN, VnodeStateStore
from barrierflow.runtime.placement import Placement
from barrierflow.runtime.state.versioned_table import OP_COLUMN as VIEW_OP
from barrierflow.runtime.state.versioned_table import rows_after

__all__ = ["Follow", "SharedView"]

#: What a view without a store yet reads: no row (a table of no column would slice to any
#: length in pyarrow, so it has one).
_NOTHING = pa.table({"_": pa.array([], pa.null())})

#: What a reader's name may hold in a pin file's name.
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


@final
class SharedView:
    """The view of keyed step ``step`` run on the executors, whose state is under ``root``
    (``SparkBridge.shared_view(step)`` gives it; see the module).

    Raises:
        InvalidArgumentError: ``root`` is not a path or ``step`` not a name.
    """

    def __init__(self, root: str | os.PathLike[str], step: str) -> None:
        if not isinstance(root, str | os.PathLike) or not str(root):
            raise InvalidArgumentError("root", "the keyed step's state directory", root)
        if not isinstance(step, str) or not step:
            raise InvalidArgumentError("step", "the keyed step's actor name", step)
        self.root = Path(root)
        self.step = step

    def backfill(self, *, batch_rows: int = 4096, rate_limit: float | None = None) -> Follow:
        """The factory of a snapshot backfill that follows this view (declare it reading the
        step: ``inputs=[step]``).

        Raises:
            InvalidArgumentError: a bad ``batch_rows`` or ``rate_limit`` (as SnapshotBackfill).
        """
        SnapshotBackfill(self.step, batch_rows=batch_rows, rate_limit=rate_limit, shared=self)
        return Follow(self, batch_rows, rate_limit)

    def tables(self) -> list[ViewTable]:
        """The view's one table."""
        return [_StoreTable(self.root / VIEW_TABLE)]

    def committed_epoch(self) -> int:
        """The view's last committed epoch (0 before its first commit)."""
        store = VnodeStateStore.existing(self.root / VIEW_TABLE)
        return 0 if store is None else store.last_committed()

    def __repr__(self) -> str:
        return f"SharedView({str(self.root)!r}, {self.step!r})"


@final
@dataclass(frozen=True, slots=True)
class Follow:
    """Makes a :class:`SnapshotBackfill` that follows ``view`` (:meth:`SharedView.backfill`)."""

    #: Rows by key, as every snapshot backfill.
    placement: ClassVar[Placement] = Placement.KEYED

    view: SharedView
    batch_rows: int = 4096
    rate_limit: float | None = None

    def __call__(self, index: int | None = None) -> SnapshotBackfill:
        """A fresh backfill actor."""
        return SnapshotBackfill(
            self.view.step, batch_rows=self.batch_rows, rate_limit=self.rate_limit, shared=self.view
        )


@final
class _StoreTable:
    """One view store, read as a :class:`ViewTable` (opened when first needed: it may not
    exist yet)."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._store: VnodeStateStore | None = None

    def _opened(self) -> VnodeStateStore | None:
        if self._store is None:
            self._store = VnodeStateStore.existing(self._root)
        return self._store

    @property
    def vnode_count(self) -> int:
        store = self._opened()
        return DEFAULT_VNODE_COUNT if store is None else store.vnode_count

    @property
    def primary_key(self) -> tuple[str, ...]:
        store = self._opened()
        return () if store is None else store.key

    def pin(self, reader: str, epoch: int) -> None:
        store = self._opened()
        if store is not None:
            store.pin(_UNSAFE.sub("_", reader), epoch)

    def unpin(self, reader: str) -> None:
        store = self._opened()
        if store is not None:
            store.unpin(_UNSAFE.sub("_", reader))

    def epochs_after(self, epoch: int) -> list[int]:
        store = self._opened()
        return [] if store is None else [e for e in store.committed_epochs() if e > epoch]

    async def change_log(self, epoch: int, vnodes: VnodeBitmap | None = None) -> pa.Table:
        store = self._opened()
        if store is None:
            return _NOTHING
        rows = await anyio.to_thread.run_sync(store.change_log, epoch, vnodes)
        return rows.rename_columns([VIEW_OP if n == OP_COLUMN else n for n in rows.column_names])

    async def read_vnode(
        self, vnode: int, epoch: int, *, after: Sequence[Any] | None = None
    ) -> pa.Table:
        store = self._opened()
        if store is None:
            return _NOTHING
        rows = await anyio.to_thread.run_sync(store.read, [vnode], epoch)
        rows = rows.sort_by([(column, "ascending") for column in store.key])
        return rows if after is None else rows_after(rows, store.key, after)
