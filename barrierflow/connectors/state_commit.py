"""One commit for a micro-batch's rows and its keyed state: the state deltas Spark tasks staged
travel in the epoch's manifests and are made visible by the table's commit of the same epoch.

A keyed operator run in Spark's tasks keeps its state in a
:class:`~barrierflow.connectors.vnode_state.VnodeStateStore` per state table, on a directory
the driver and the executors share. A task reads its vnodes as of the last committed epoch,
applies its partition and stages its delta (:meth:`~.VnodeStateStore.stage`); the delta's
:func:`state_record` rides in the task's manifest (:attr:`Manifest.state`) beside the files it
wrote. The coordinator gathers the manifests of the epoch, and the table's committer
(:class:`~barrierflow.connectors.FileCommitter`, every file table's) does the rest:

* ``prepare`` records the epoch's :func:`gather_state` in the commit metadata, which the
  coordinator persists as *pending* before it acknowledges the epoch;
* ``commit`` runs :func:`commit_state` **first**, then publishes the files;
* ``abort`` (an epoch whose checkpoint never became durable) runs :func:`drop_state`.

**Why this order is enough.** The coordinator commits an epoch only after its checkpoint is
durable, and recovery commits every pending epoch again, with the same metadata, before any
new one. Each half is idempotent: a state commit of an epoch with the same deltas is a no-op
(:meth:`~.VnodeStateStore.commit`), a table commit of an epoch the table holds is
``AlreadyCommitted``. So whatever a crash cuts short — the state committed and not the rows,
or neither — the recovery's commit finishes it, and state and output stand at the same epoch
before the next micro-batch runs. The state goes first so that the reverse never happens: a
table that shows an epoch whose state is missing would let the next micro-batch's tasks read
the state from before it and count its rows twice. In between, a state version may be
readable before the rows are; its readers (the next micro-batch's tasks, a snapshot backfill)
read as of an epoch the coordinator has committed, never a newer one, so they never see it
early. A replayed epoch the table already holds (``AlreadyCommitted``) only drops what its
tasks staged: its state was committed with it the first time.

A failed, retried or speculative attempt's delta is never read: Spark returns one manifest per
partition, only the deltas they name are committed, and the others stay under ``staged/``
until :func:`drop_state` or the commit of their staging number deletes them.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from barrierflow.actors.sinks.table import Manifest
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.connectors.vnode_state import StateDelta, VnodeStateStore

__all__ = ["commit_state", "commits_state", "drop_state", "gather_state", "state_record"]


def commits_state(committer: object) -> bool:
    """Whether ``committer`` makes the state its manifests carry visible with their epoch:
    it says so with ``commits_state = True`` (every file table's committer does; a wrapper
    says what the committer it wraps says)."""
    return getattr(committer, "commits_state", False) is True


def state_record(store: VnodeStateStore, delta: StateDelta) -> dict[str, Any]:
    """What travels for ``delta`` staged in ``store``: the store's identity (root, key, schema,
    vnode count), so that a recovery can commit it without anything else, and the delta."""
    return {
        "root": str(store.root),
        "key": list(store.key),
        "schema": base64.b64encode(store.schema.serialize().to_pybytes()).decode(),
        "vnode_count": store.vnode_count,
        "delta": delta.to_json(),
    }


def gather_state(manifests: Sequence[Manifest]) -> list[dict[str, Any]]:
    """The state records of an epoch's manifests, in manifest order."""
    return [dict(record) for manifest in manifests for record in manifest.state]


def _by_store(
    records: Iterable[Mapping[str, Any]],
) -> list[tuple[VnodeStateStore, list[StateDelta]]]:
    """The records grouped by store, stores in the order they first come.

    Raises:
        InvalidArgumentError: a record that :func:`state_record` did not make.
    """
    stores: dict[str, tuple[VnodeStateStore, list[StateDelta]]] = {}
    for record in records:
        try:
            root = str(record["root"])
            if root not in stores:
                schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(record["schema"])))
                store = VnodeStateStore(
                    root, record["key"], schema, vnode_count=int(record["vnode_count"])
                )
                stores[root] = (store, [])
            stores[root][1].append(StateDelta.from_json(record["delta"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidArgumentError("state", "records made by state_record", record) from exc
    return list(stores.values())


def commit_state(epoch: int, records: Iterable[Mapping[str, Any]]) -> None:
    """Make the deltas of ``records`` each store's version ``epoch`` (blocking; idempotent:
    see :meth:`~.VnodeStateStore.commit`). A store without a delta this epoch is left as it
    is: reads as of ``epoch`` see its last version before it.

    Raises:
        InvalidArgumentError: a damaged record.
        StateCommitConflictError: a store holds ``epoch`` with other deltas.
        ExecutorStagingError: a delta is neither staged nor committed.
    """
    for store, deltas in _by_store(records):
        store.commit(epoch, deltas)


def drop_state(records: Iterable[Mapping[str, Any]]) -> None:
    """Delete what the tasks behind ``records`` staged, every attempt of their staging
    numbers (blocking; a commit that went through deleted them already)."""
    for store, deltas in _by_store(records):
        for number in sorted({d.number for d in deltas}):
            store.drop_staged(number)
