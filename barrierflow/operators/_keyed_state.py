"""The state of a keyed operator's instance: one Arrow table of its keys in memory, durable in a
versioned table of the actor, partitioned by vnode and moved by vnode on a rescale.

**In memory** the state is one ``pa.Table`` (the key columns, then the state columns) and the
vnode of each row. :meth:`KeyedState.lookup` finds keys with one hash join, never a loop per
row; :meth:`~KeyedState.upsert` and :meth:`~KeyedState.delete` replace rows by position.

**Durable** in the actor's versioned table (:mod:`barrierflow.runtime.state.versioned_table`):
every change is written with its op when it is made, so an epoch's changes are in the table
before the barrier is passed, and the context seals them with it. When the state is not the
output (an aggregate's ``mean`` keeps a sum and a count), a second table, the **view**
(:data:`~barrierflow.actors.backfill.materialize.VIEW_TABLE`), holds exactly the output rows;
otherwise the one table is the view. Either way a snapshot backfill reads the operator like a
materialized view. A small JSON table ``<table>:meta`` records, with the same checkpoints,
the state's schema, the group's instances and the vnodes this instance holds rows of.

**Restore.** An instance loads the rows of its table as of the committed epoch, for the vnodes
it holds and owns (``ctx.vnode_bitmap``; ``None``: all of them).

**Rescale by vnode** keeps one rule: *at every committed epoch, each vnode's rows live in
exactly one table of the group.* A move writes the DELETEs in the table that loses the vnode
and the INSERTs in the table that gains it in the same epoch, so a checkpoint holds both or
neither.

* *Live* — an ``Update`` barrier gives the group new bitmaps. After passing it, an instance
  that lost vnodes drops their rows and writes their DELETEs (in the epoch the barrier opens);
  one that gained vnodes waits until the barrier completed (``ctx.wait_completed``: every
  instance sealed the epoch it closed), reads those vnodes' rows from the group's other tables
  as of the barrier's ``prev`` epoch and writes them as INSERTs, before it reads a row of them.
* *Across a restart with another parallelism* (``agg.0..1`` → ``agg.0..3``), the runtime gives
  each instance an even share of the vnodes. At restore an instance keeps the rows of the vnodes
  it still owns, and after passing its first barrier writes DELETEs for those it no longer
  owns; the vnodes it owns that another instance's table holds (their committed meta says
  which) are read after that barrier completed, as for a live move.
* *The case left open:* a restart with **fewer** instances (``agg.0..2`` → ``agg.0..1``): the
  table of ``agg.2`` belongs to no running actor and is never opened, so nobody can read its
  rows. Its committed meta is readable, though: an instance finds every earlier member of its
  group from the metas (``group``), and if one that is gone holds rows of some vnode it refuses
  to start with :class:`~barrierflow.errors.KeyedStateOrphanedError` — never starting those keys
  from nothing. (A gone instance whose vnodes were moved away live holds none: allowed.) An
  actor declared without ``parallelism`` is named ``agg``, a group ``agg.0``, ``agg.1``, …: to
  change its parallelism across restarts later, declare a group from the start (even of one).
  Live, the same holds for an instance dropped by an ``Update``: it passes its last barrier
  and writes nothing after it, so its rows stay in its table — give it an empty bitmap first
  (its rows move out in the epoch that barrier opens), and drop it at a later barrier.

**The schema** is needed before the tables open. An operator that knows its input's schema
opens them at restore; one that does not opens them at restore with the schema its meta
recorded, or else at its first chunk — or when it takes vnodes from its peers, with the schema
of their tables.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from barrierflow.actors.backfill.materialize import VIEW_TABLE
from barrierflow.channels.barrier import Barrier
from barrierflow.channels.chunk import Op
from barrierflow.channels.errors import SchemaMismatchError
from barrierflow.channels.vnode import DEFAULT_VNODE_COUNT, VnodeBitmap, vnodes_unchecked
from barrierflow.operators._operator import OperatorStats
from barrierflow.operators.errors import KeyedStateOrphanedError
from barrierflow.runtime.actor import ActorContext
from barrierflow.runtime.state.state_store import StateTable
from barrierflow.runtime.state.versioned_table import VersionedTable

__all__ = ["KeyedState", "View", "group_of", "positions", "seeded_meta"]

#: The name of an instance within a parallel group: ``<group>.<index>``.
_MEMBER = re.compile(r"^(?P<group>.+)\.(?P<index>\d+)$")
#: Tables a lookup joins on: the position of each row on either side.
_LEFT, _RIGHT = "_keyed_left", "_keyed_right"


class View(Protocol):
    """How the output rows (the view) follow from the state rows."""

    def view_schema(self, state_schema: pa.Schema) -> pa.Schema:
        """The view's schema."""
        ...

    def outputs(self, state: pa.Table) -> pa.Table:
        """The view's rows of state rows."""
        ...


def group_of(name: str) -> str:
    """The group an instance belongs to: ``agg`` for ``agg.2`` (and for ``agg`` alone)."""
    match = _MEMBER.match(name)
    return match.group("group") if match else name


def _encode_schema(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def _decode_schema(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def _runs(mask: npt.NDArray[np.bool_]) -> list[list[int]]:
    return [[a, b] for a, b in VnodeBitmap(mask).runs()]


def _mask(runs: Sequence[Sequence[int]], vnode_count: int) -> npt.NDArray[np.bool_]:
    mask = np.zeros(vnode_count, dtype=np.bool_)
    for first, end in runs:
        mask[first:end] = True
    return mask


def seeded_meta(
    tables: Mapping[str, pa.Schema], vnodes: VnodeBitmap, owner: str
) -> tuple[str, dict[str, Any]]:
    """The meta table (its name and items) of an instance ``owner``, alone in its group,
    whose versioned tables ``tables`` (name -> schema) hold rows of ``vnodes``: what a Spark
    task writes beside the state it loaded, so that the operator restores it as its own.
    The state is kept in the table that is not the view, if there is one (see
    :class:`KeyedState`)."""
    table = next((name for name in sorted(tables) if name != VIEW_TABLE), VIEW_TABLE)
    items = {
        "held": [list(run) for run in vnodes.runs()],
        "group": [owner],
        "schema": _encode_schema(tables[table]),
    }
    return f"{table}:meta", items


def positions(keys: pa.Table, rows: pa.Table, key: tuple[str, ...]) -> npt.NDArray[np.int64]:
    """The position in ``rows`` of each row of ``keys`` (their ``key`` columns; unique on
    either side), or -1 for a key ``rows`` does not hold: one hash join, no loop per row (on
    the calling thread: the join of an epoch's keys is short, and Acero's threads cost more
    than they save when the machine is busy)."""
    left = keys.select(list(key)).append_column(_LEFT, pa.array(np.arange(keys.num_rows)))
    right = rows.select(list(key)).append_column(_RIGHT, pa.array(np.arange(rows.num_rows)))
    joined = left.join(right, list(key), join_type="inner", use_threads=False)
    found = np.full(keys.num_rows, -1)
    found[joined.column(_LEFT).to_numpy()] = joined.column(_RIGHT).to_numpy()
    return found


@final
class KeyedState:
    """One instance's keyed state (see the module).

    Args:
        key: the key columns (unique per row).
        table: the state table's name; :data:`VIEW_TABLE` when the state is the output.
        view: how the output follows from the state, when it is not the state (written to
            the :data:`VIEW_TABLE` table); ``None`` otherwise.
        stats: the operator's counters (``state_rows`` is kept).
        distribution_key: the columns the input is hash-dispatched by (default: ``key``).
    """

    def __init__(
        self,
        key: tuple[str, ...],
        *,
        table: str,
        view: View | None,
        stats: OperatorStats,
        distribution_key: tuple[str, ...] | None = None,
    ) -> None:
        self.key = key
        self.distribution_key = key if distribution_key is None else distribution_key
        self.table_name = table
        self.view = view
        self.stats = stats
        self.schema: pa.Schema | None = None
        self._rows: pa.Table | None = None
        self._vnodes: npt.NDArray[np.int64] = np.zeros(0, np.int64)
        self._table: VersionedTable | None = None
        self._view_table: VersionedTable | None = None
        self._meta: StateTable | None = None
        self._vnode_count = DEFAULT_VNODE_COUNT
        self._owned: npt.NDArray[np.bool_] = np.ones(0, np.bool_)
        self._held: npt.NDArray[np.bool_] = np.zeros(0, np.bool_)
        self._recorded: dict[str, Any] = {}
        # Set at restore, done after the first barrier: rows to delete, vnodes to fetch.
        self._lost: pa.Table | None = None
        self._fetch: npt.NDArray[np.bool_] | None = None

    # Reading.

    @property
    def is_open(self) -> bool:
        """Whether the tables are open (the schema is known)."""
        return self._table is not None

    @property
    def rows(self) -> pa.Table:
        """The state rows in memory (no order)."""
        assert self._rows is not None, "the state is not open"
        return self._rows

    def lookup(self, keys: pa.Table) -> npt.NDArray[np.int64]:
        """The position in :attr:`rows` of each row of ``keys`` (see :func:`positions`)."""
        return positions(keys, self.rows, self.key)

    # Opening and restoring.

    async def restore(self, ctx: ActorContext, schema: pa.Schema | None) -> None:
        """Load this instance's state as of the committed epoch (see the module): open the
        tables if the schema is known (``schema``, or the one the meta recorded), and plan
        what the first barrier moves.

        Raises:
            SchemaMismatchError: ``schema`` is not the one the state was written with.
            KeyedStateOrphanedError: an instance gone from the group holds rows.
        """
        self._meta = ctx.table(f"{self.table_name}:meta")
        self._recorded = await self._meta.items()
        bitmap = ctx.vnode_bitmap
        self._vnode_count = DEFAULT_VNODE_COUNT if bitmap is None else bitmap.vnode_count
        self._owned = np.ones(self._vnode_count, np.bool_) if bitmap is None else bitmap.mask
        held = self._recorded.get("held", [])
        self._held = _mask(held, self._vnode_count)
        recorded = self._recorded.get("schema")
        if recorded is not None:
            written = _decode_schema(recorded)
            if schema is not None and not schema.equals(written):
                raise SchemaMismatchError(f"keyed state of {ctx.name!r}", written, schema)
            schema = written
        peers = await self._peer_metas(ctx)
        fetch = np.zeros(self._vnode_count, np.bool_)
        for meta in peers.values():
            fetch |= _mask(meta["held"], self._vnode_count) & self._owned
        # Taken after the first barrier; an instance whose schema is unknown (it never held
        # a row) opens its tables then, with the schema of the tables it reads.
        self._fetch = fetch if fetch.any() else None
        if schema is not None:
            await self.open(ctx, schema)

    async def _peer_metas(self, ctx: ActorContext) -> dict[str, dict[str, Any]]:
        """The committed metas of the group's other instances, checking that no instance gone
        from the group holds rows.

        The instances of the last run are found in two rounds: the metas of the peers, of
        ``<group>`` and ``<group>.0`` (one of which ran in any earlier group) and of the group
        this instance recorded, then of every instance their metas list. (An instance gone
        earlier than the last run held nothing when that run started, or it was refused.)
        """
        group = group_of(ctx.name)
        name = f"{self.table_name}:meta"
        first = [*ctx.peers, group, f"{group}.0", *self._recorded.get("group", [])]
        metas = {o: await ctx.read_table(o, name).items() for o in dict.fromkeys(first)}
        listed = [m for meta in metas.values() for m in meta.get("group", [])]
        metas |= {o: await ctx.read_table(o, name).items() for o in listed if o not in metas}
        for owner, meta in metas.items():
            if owner in ctx.peers or not meta:
                continue
            held = _mask(meta["held"], self._vnode_count)
            if held.any():
                vnodes = tuple(int(v) for v in np.flatnonzero(held))
                raise KeyedStateOrphanedError(ctx.name, owner, vnodes, ctx.peers)
        return {o: meta for o, meta in metas.items() if o in ctx.peers and o != ctx.name and meta}

    async def open(self, ctx: ActorContext, schema: pa.Schema) -> None:
        """Open the tables with the state's ``schema`` and load the rows of the vnodes this
        instance holds (as of the committed epoch): those it owns into memory, the others kept
        to be deleted after the first barrier. A no-op once open.

        Raises:
            SchemaMismatchError: the table's files hold another schema.
        """
        if self._table is not None:
            return
        self.schema = schema
        common: dict[str, Any] = {
            "primary_key": self.key,
            "distribution_key": self.distribution_key,
        }
        self._table = await ctx.versioned_table(self.table_name, schema=schema, **common)
        if self.view is not None:
            self._view_table = await ctx.versioned_table(
                VIEW_TABLE, schema=self.view.view_schema(schema), **common
            )
        epoch = self._table.last_sealed_epoch
        parts = [await self._table.read_vnode(int(v), epoch) for v in np.flatnonzero(self._held)]
        rows = pa.concat_tables([schema.empty_table(), *parts]).combine_chunks()
        vnodes = self._vnodes_of(rows)
        keep = self._owned[vnodes]
        self._rows = rows.filter(pa.array(keep))
        self._vnodes = vnodes[keep]
        if not keep.all():
            self._lost = rows.filter(pa.array(~keep))
        self.stats.state_rows = self._rows.num_rows

    def _vnodes_of(self, rows: pa.Table) -> npt.NDArray[np.int64]:
        return vnodes_unchecked(rows, self.distribution_key, self._vnode_count)

    # Writing.

    def upsert(
        self,
        rows: pa.Table,
        at: npt.NDArray[np.int64],
        changes: tuple[pa.Table, pa.Array] | None = None,
    ) -> None:
        """Put ``rows`` (state rows of distinct keys) in the state: each replaces the row at
        its position in ``at`` (-1: a new key). The state table is written the rows as
        upserts, the view ``changes`` (its rows and ops; default: the rows' outputs as
        upserts) — the one table of a state that is its view gets ``changes``."""
        if not rows.num_rows:
            return
        table, state = self._table, self.rows
        assert table is not None
        assert self.schema is not None
        rows = rows.cast(self.schema)
        replaced = at[at >= 0]
        vnodes = self._vnodes_of(rows)
        if len(replaced):
            state = self._drop(replaced)
        self._rows = pa.concat_tables([state, rows])
        if self._rows.num_rows and len(self._rows.columns[0].chunks) > 16:
            self._rows = self._rows.combine_chunks()
        self._vnodes = np.concatenate([self._vnodes, vnodes])
        if self._view_table is None:
            table.write(*(changes or (rows, None)))
        else:
            table.write(rows)
            self._view_table.write(*(changes or (self._outputs(rows), None)))
        self.stats.state_rows = self._rows.num_rows

    def delete(self, at: npt.NDArray[np.int64]) -> None:
        """Remove the rows at positions ``at`` (distinct); their DELETEs are written."""
        if not len(at):
            return
        gone = self.rows.take(pa.array(at))
        self._rows = self._drop(at)
        self._write_deletes(gone)
        self.stats.state_rows = self._rows.num_rows

    def _drop(self, at: npt.NDArray[np.int64]) -> pa.Table:
        """The state without the rows at positions ``at`` (their vnodes dropped too)."""
        dropped = np.zeros(self.rows.num_rows, np.bool_)
        dropped[at] = True
        self._vnodes = self._vnodes[~dropped]
        return self.rows.filter(pa.array(~dropped))

    def _write_deletes(self, gone: pa.Table) -> None:
        table = self._table
        assert table is not None
        deletes = pa.array(np.full(gone.num_rows, int(Op.DELETE)))
        table.write(gone, deletes)
        if self._view_table is not None:
            self._view_table.write(self._outputs(gone), deletes)

    def _outputs(self, rows: pa.Table) -> pa.Table:
        assert self.view is not None
        assert self._view_table is not None
        return self.view.outputs(rows).cast(self._view_table.schema)

    def _record(self, ctx: ActorContext) -> None:
        """Write the meta if it changed (with the epoch's rows)."""
        meta = self._meta
        assert meta is not None
        held = np.zeros(self._vnode_count, np.bool_)
        held[self._vnodes] = True
        if self._lost is not None:
            # Their DELETEs come after the first barrier: until then the table holds them.
            held[self._vnodes_of(self._lost)] = True
        wanted: dict[str, Any] = {"held": _runs(held), "group": list(ctx.peers)}
        if self.schema is not None:
            wanted["schema"] = _encode_schema(self.schema)
        for name, value in wanted.items():
            if self._recorded.get(name) != value:
                meta.put(name, value)
                self._recorded[name] = value

    # Barriers.

    async def pass_barrier(self, barrier: Barrier, ctx: ActorContext) -> None:
        """Pass ``barrier`` on for the keyed operator: the meta of the epoch it closes recorded
        first (sealed with it), then the moves it orders."""
        self._record(ctx)
        await ctx.emit(barrier)
        await self._after_barrier(barrier, ctx)

    async def _after_barrier(self, barrier: Barrier, ctx: ActorContext) -> None:
        """After passing ``barrier``: the moves it orders (see the module) — the first
        barrier's after a restore, or a new vnode bitmap's. Writes in the epoch it opens.

        Cancellation: the moves are not made; the actor fails and restarts from the
        checkpoint.
        """
        lost, self._lost = self._lost, None
        if lost is not None:
            self._write_deletes(lost)
        fetch, self._fetch = self._fetch, None
        bitmap = barrier.new_vnode_bitmap(ctx.actor_id)
        if bitmap is not None:
            gained = bitmap.mask & ~self._owned
            dropped = self._owned & ~bitmap.mask
            self._owned = bitmap.mask
            if dropped.any() and self._rows is not None:
                leaving = dropped[self._vnodes]
                self.delete(np.flatnonzero(leaving))
            fetch = gained if fetch is None else fetch | gained
        if fetch is not None and fetch.any():
            await ctx.wait_completed(barrier)
            await self._take(ctx, fetch, barrier.epoch.prev)
        self._record(ctx)

    async def _take(self, ctx: ActorContext, vnodes: npt.NDArray[np.bool_], epoch: int) -> None:
        """Read ``vnodes``' rows as of ``epoch`` from the group's other tables and make them
        this instance's (INSERTs in its tables)."""
        others = [
            t for t in ctx.read_view(group_of(ctx.name), self.table_name) if t.owner != ctx.name
        ]
        if not others:
            return
        if self._table is None:
            await self.open(ctx, others[0].schema)
        parts = []
        for table in others:
            for vnode in np.flatnonzero(vnodes):
                part = await table.read_vnode(int(vnode), epoch)
                if part.num_rows:
                    parts.append(part)
        if parts:
            rows = pa.concat_tables(parts).combine_chunks()
            self.upsert(rows, np.full(rows.num_rows, -1, np.int64))
