"""A keyed step's state inside a Spark task: loaded from the shared store before the task's
runtime starts, its epoch's changes staged back after the partition's checkpoint.

A chain with a keyed step (an ``aggregate`` or ``reduce``) runs after the micro-batch was
repartitioned by barrierflow's vnodes (:func:`~barrierflow.spark_bridge.executors.
partition_by_vnode`): task *p* of *N* gets exactly the rows of the vnodes
``VnodeBitmap.split(N)[p]``, so every key is in one task. Its state lives in one
:class:`~barrierflow.connectors.vnode_state.VnodeStateStore` per state table of the operator,
``<root>/<table>/``, on a directory the driver and the executors share.

**The operator runs unchanged.** The task runtime's state store is a scratch file. Before the
runtime starts, :func:`seed_state` writes into it, as its committed checkpoint
(:data:`SEEDED`), the rows of the task's vnodes as of the epoch the driver gave (the last one
committed), and the operator's meta saying it holds those vnodes. The operator then restores
them as after any restart (:mod:`barrierflow.operators._keyed_state`). After the partition's
checkpoint, :func:`stage_state` reads what every epoch after :data:`SEEDED` wrote into each of
the operator's versioned tables — the change log of the task's vnodes — and stages it in the
shared store under the task attempt's own name. The records it returns travel in the task's
manifest, and the table's commit of the epoch makes them visible
(:mod:`barrierflow.connectors.state_commit`).

A task that fails, or an attempt Spark does not keep, staged under its own name only: the
driver never commits it, so the state no reader sees is never read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, final

import pyarrow as pa

from barrierflow.channels.vnode import VnodeBitmap
from barrierflow.connectors.state_commit import state_record
from barrierflow.connectors.vnode_state import VnodeStateStore, remove_staged
from barrierflow.operators._keyed_state import seeded_meta
from barrierflow.runtime.state.state_store import StateStore
from barrierflow.runtime.state.versioned_table import OP_COLUMN, stored_tables

__all__ = [
    "COMPACT_AFTER",
    "compact_state",
    "SEEDED",
    "STATE_DIRECTORY",
    "KeyedStep",
    "drop_staged_state",
    "seed_state",
    "stage_state",
    "state_stores",
]

#: Where a bridge keeps its keyed steps' state by default: under the sink's table root (a
#: directory the executors see; a name starting with ``_`` is not a table file to readers),
#: one directory per step.
STATE_DIRECTORY = "_barrierflow_state"

#: The epoch the loaded state is committed at in a task's scratch store (the runtime's own
#: epochs, taken from the clock, all come after it).
SEEDED = 1


@final
@dataclass(frozen=True, slots=True)
class KeyedStep:
    """Where a chain's keyed step keeps its state, and what a task of it reads.

    Attributes:
        name: the step's actor name (the owner of its tables in the task).
        key: the key columns (the repartition's and the state's).
        root: the shared directory; each state table is a store at ``<root>/<table>``.
        as_of: the committed epoch the tasks read (0: no state yet).
        tasks: how many tasks, and vnode ranges, the micro-batch has.
    """

    name: str
    key: tuple[str, ...]
    root: str
    as_of: int
    tasks: int

    def vnodes(self, partition: int) -> VnodeBitmap:
        """The vnodes task ``partition`` owns."""
        return VnodeBitmap.split(self.tasks)[partition]


def state_stores(root: str | Path) -> dict[str, VnodeStateStore]:
    """The committed state stores under ``root``, by table name (none before the first
    commit)."""
    found: dict[str, VnodeStateStore] = {}
    directory = Path(root)
    if not directory.is_dir():
        return found
    for table in sorted(directory.iterdir()):
        store = VnodeStateStore.existing(table)
        if store is not None:
            found[table.name] = store
    return found


async def seed_state(step: KeyedStep, path: Path, vnodes: VnodeBitmap) -> int:
    """Write ``vnodes``' state as of ``step.as_of`` into a new scratch store at ``path`` as its
    committed checkpoint; returns the rows loaded."""
    stores = state_stores(step.root) if step.as_of else {}
    if not stores:
        return 0
    loaded = 0
    async with await StateStore.open(path) as scratch:
        for name, store in stores.items():
            rows = store.read(vnodes, min(step.as_of, store.last_committed()))
            table = await scratch.versioned_table(
                step.name, name, schema=store.schema, primary_key=store.key
            )
            if rows.num_rows:
                table.write(rows)
            table.seal(SEEDED)
            loaded += rows.num_rows
        meta_name, items = seeded_meta(
            {name: store.schema for name, store in stores.items()}, vnodes, step.name
        )
        meta = scratch.table(step.name, meta_name)
        for key, value in items.items():
            meta.put(key, value)
        meta.seal(SEEDED)
        await scratch.commit(SEEDED)
    return loaded


async def stage_state(
    step: KeyedStep, path: Path, number: int, attempt: str, vnodes: VnodeBitmap
) -> tuple[dict[str, Any], ...]:
    """Stage what the task's runtime wrote into ``step``'s versioned tables after
    :data:`SEEDED` (in the scratch store at ``path``) in the shared stores, under staging
    ``number`` and ``attempt``; returns the records its manifest carries (one per table with
    changes)."""
    records: list[dict[str, Any]] = []
    tables = stored_tables(str(path), step.name)
    async with await StateStore.open(path) as scratch:
        for name, schema in tables.items():
            table = await scratch.versioned_table(
                step.name, name, schema=schema, primary_key=step.key
            )
            logs = [await table.change_log(e) for e in table.epochs_after(SEEDED)]
            logs = [log for log in logs if log.num_rows]
            if not logs:
                continue
            changes = pa.concat_tables(logs)
            store = VnodeStateStore(Path(step.root, name), step.key, schema)
            ops = changes.column(OP_COLUMN)
            delta = store.stage(number, attempt, vnodes, changes.drop_columns([OP_COLUMN]), ops)
            records.append(state_record(store, delta))
    return tuple(records)


def drop_staged_state(step: KeyedStep, number: int) -> None:
    """Delete what every task attempt of staging ``number`` staged for ``step`` (a failed
    Spark job's; its micro-batch is staged again under a new number)."""
    directory = Path(step.root)
    if directory.is_dir():
        for table in sorted(directory.iterdir()):
            remove_staged(table, number)


#: Committed versions a state store keeps before the driver folds them into a base, at most.
COMPACT_AFTER = 16


def compact_state(root: str | Path, after: int = COMPACT_AFTER) -> list[str]:
    """Fold the versions of the state stores under ``root`` into a base as of the last
    committed epoch, for each store that holds more than ``after`` of them, or at least two
    whose changes hold as many rows as its base (blocking: the driver runs it on a worker
    thread of its own, beside the micro-batches; a store's commits and reads go on meanwhile,
    see :meth:`~barrierflow.connectors.vnode_state.VnodeStateStore.compact`); returns the
    tables compacted.

    Why rows: every task of every micro-batch reads its vnodes' base and each delta after it,
    and keeps each key's last row. Folding once the deltas weigh as much as the base keeps that
    read within twice the state, for a rewrite of the state every time its size changed hands
    — a constant share of the rows written, as in a log-structured merge. The tasks read as of
    the last committed epoch, which a base keeps readable; a reader that pinned an older epoch
    (a job following the view from the driver,
    :class:`~barrierflow.spark_bridge.shared_view.SharedView`) holds the fold at its pin, so
    the changes it has still to replay stay."""
    done = []
    for name, store in state_stores(root).items():
        pins = list(store.pins().values())
        up_to = min([store.last_committed(), *pins])
        versions = len([e for e in store.committed_epochs() if e <= up_to])
        base, deltas = store.sizes()
        if up_to >= 1 and (versions > after or (versions >= 2 and deltas >= max(base, 1))):
            store.compact(up_to, pins)
            done.append(name)
    return done
