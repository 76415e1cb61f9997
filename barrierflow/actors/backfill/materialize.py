"""The materialize actor (after RisingWave's materialize executor): a job's output kept as a
**materialized view** — a versioned table of the state store keyed by the view's primary key —
and forwarded downstream, so that other jobs can read it live or join it later with a snapshot
backfill (:mod:`.snapshot_backfill`).

Every chunk is written to the view's table with its ops and passed on unchanged; every barrier
seals the epoch it closes (the context does it), so the epoch's change log is readable at once
and durable with the next checkpoint.

**Conflicting writes** follow the table's *upsert* rule, documented in
:mod:`barrierflow.runtime.state.versioned_table`: a key's last write decides, an insert of a
key that exists replaces its row, a delete of a key that does not exist does nothing. The view
trusts its input's ops (a correct upstream — an aggregation, a deduplicated feed — sends an
``UPDATE_DELETE``/``UPDATE_INSERT`` pair for a changed key); no point lookup is made per row, so
writing stays vectorized and the view may be far larger than memory.

**Parallelism.** Declared with ``parallelism=N, key=[...]`` (the key columns, or a subset:
the distribution key), each actor ``view.i`` keeps the vnodes its input's hash dispatch sends
it, in its own table; a snapshot backfill reads every actor of the group.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import final

import pyarrow as pa

from barrierflow.channels.chunk import Chunk
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.channels.messages import Message
from barrierflow.runtime.actor import ActorContext, StreamActor
from barrierflow.runtime.placement import Placement
from barrierflow.runtime.state.versioned_checks import check_options
from barrierflow.runtime.state.versioned_table import VersionedTable

__all__ = ["VIEW_TABLE", "Materialize", "ViewActor"]

#: The name of a materialize actor's versioned table.
VIEW_TABLE = "view"


class ViewActor(StreamActor):
    """The base of the actors that keep a materialized view: a versioned table
    :data:`VIEW_TABLE`, keyed by the view's primary key, that holds exactly the rows the actor
    emitted, its change log the changes it emitted — what a snapshot backfill reads
    (:class:`Materialize`, a keyed aggregate)."""


@final
class Materialize(ViewActor):
    """Keeps its input as a materialized view and forwards it (see the module).

    Args:
        schema: the input's schema (the view's rows).
        primary_key: the view's key columns (declared not nullable in ``schema``).
        distribution_key: the columns the input is hash-dispatched by, when the view is
            parallel (default: the primary key).
        compact_after: durable epochs kept before a checkpoint folds them into the base (a
            pinned epoch is always kept).

    Raises:
        InvalidArgumentError: a schema that is not a pyarrow Schema, key columns missing
            from it or nullable, a distribution key that is not columns of the primary key,
            or a ``compact_after`` that is not an int in 1..32768 (all checked here, as the
            view's table checks them when the actor starts).
    """

    #: Rows by key: parallel instances are hash-dispatched by the key add_actor names.
    placement = Placement.KEYED

    def __init__(
        self,
        schema: pa.Schema,
        primary_key: Sequence[str],
        *,
        distribution_key: Sequence[str] | None = None,
        compact_after: int = 32,
    ) -> None:
        if distribution_key is not None and (
            not isinstance(distribution_key, list | tuple)
            or not all(isinstance(c, str) for c in distribution_key)
        ):
            raise InvalidArgumentError(
                "distribution_key", "None or a list or tuple of column names", distribution_key
            )
        # The versioned table's own checks, now rather than when the graph starts (any vnode
        # count will do here: the actor's comes from its input's dispatch).
        self.primary_key, _ = check_options(schema, primary_key, distribution_key, 1, compact_after)
        self.schema = schema
        self.distribution_key = None if distribution_key is None else tuple(distribution_key)
        self.compact_after = compact_after
        self._table: VersionedTable | None = None

    @property
    def table(self) -> VersionedTable:
        """The view's table (open once the actor runs)."""
        assert self._table is not None, "the actor has not started"
        return self._table

    async def restore(self, ctx: ActorContext) -> None:
        """Open the view's table at its last checkpoint."""
        self._table = await ctx.versioned_table(
            VIEW_TABLE,
            schema=self.schema,
            primary_key=self.primary_key,
            distribution_key=self.distribution_key,
            compact_after=self.compact_after,
        )

    async def process(self, message: Message, ctx: ActorContext) -> None:
        """Write a chunk's visible rows to the view, then pass every message on."""
        if isinstance(message, Chunk):
            rows = message.compact()
            if rows.cardinality:
                self.table.write(rows.batch, rows.ops)
        await ctx.emit(message)
