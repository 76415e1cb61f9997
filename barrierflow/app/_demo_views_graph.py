"""The actors and the check of the demo's third act (:mod:`barrierflow.app.demo_views`).

* :func:`events` — batch ``i`` of the input, a pure function of ``i`` (so a resumed run
  delivers exactly what the first would have).
* :class:`Totals` — per-key running totals of the events: an ``INSERT`` for a key seen for
  the first time, else an ``UPDATE_DELETE``/``UPDATE_INSERT`` pair; its totals are state,
  committed with checkpoints. Vectorized per chunk (a group-by); the loop is per changed key.
* :class:`OpsColumn` — a change stream made into rows: its ops become an ``_op`` column, so
  that an exactly-once Parquet table can hold it.
* :func:`check_changes` — the verification: the copied change stream, replayed per key in
  order, is a chain (each update retracts the value the key had, inserts only for absent keys)
  ending at the expected totals — none missing, none twice.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from barrierflow.channels.chunk import Chunk, Op
from barrierflow.channels.messages import Message
from barrierflow.runtime.actor import ActorContext, StreamActor

__all__ = ["EVENTS", "TOTALS", "WITH_OPS", "ChangeCheck", "OpsColumn", "Totals", "events"]

EVENTS = pa.schema([pa.field("key", pa.int64(), nullable=False), ("amount", pa.int64())])
TOTALS = pa.schema([pa.field("key", pa.int64(), nullable=False), ("total", pa.int64())])
WITH_OPS = TOTALS.append(pa.field("_op", pa.int8(), nullable=False))


def events(batch: int, rows: int, keys: int) -> pa.Table:
    """Batch ``batch`` of the input: ``rows`` events over ``keys`` keys, amounts 1..97."""
    ids = np.arange(batch * rows, (batch + 1) * rows, dtype=np.uint64)
    mixed = (ids * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(17)
    return pa.table(
        {
            "key": (mixed % np.uint64(keys)).astype(np.int64),
            "amount": (ids % np.uint64(97)).astype(np.int64) + 1,
        },
        schema=EVENTS,
    )


def expected_totals(batches: int, rows: int, keys: int) -> dict[int, int]:
    """Every key's total over the whole input."""
    totals = np.zeros(keys, dtype=np.int64)
    for batch in range(batches):
        table = events(batch, rows, keys)
        np.add.at(totals, table.column("key").to_numpy(), table.column("amount").to_numpy())
    return {int(k): int(t) for k, t in enumerate(totals) if t}


class Totals(StreamActor):
    """Per-key running totals as a change stream (see the module)."""

    async def restore(self, ctx: ActorContext) -> None:
        self._table = ctx.table("totals")
        self._totals = {int(k): int(v) for k, v in (await self._table.items()).items()}

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if not isinstance(message, Chunk):
            await ctx.emit(message)
            return
        rows = pa.Table.from_batches([message.compact().batch])
        sums = rows.group_by("key").aggregate([("amount", "sum")])
        keys = sums.column("key").to_pylist()
        amounts = sums.column("amount_sum").to_pylist()
        out_keys: list[int] = []
        out_totals: list[int] = []
        ops: list[int] = []
        for key, amount in zip(keys, amounts, strict=True):
            old = self._totals.get(key)
            new = amount if old is None else old + amount
            if old is None:
                out_keys.append(key)
                out_totals.append(new)
                ops.append(Op.INSERT)
            else:
                out_keys += [key, key]
                out_totals += [old, new]
                ops += [Op.UPDATE_DELETE, Op.UPDATE_INSERT]
            self._totals[key] = new
            self._table.put(str(key), new)
        if out_keys:
            batch = pa.record_batch({"key": out_keys, "total": out_totals}, schema=TOTALS)
            await ctx.emit(Chunk(batch, ops))


class OpsColumn(StreamActor):
    """Writes each chunk's ops into an ``_op`` column (inserts when it has none)."""

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk):
            rows = message.compact()
            ops = (
                rows.ops if rows.ops is not None else pa.array(np.zeros(rows.cardinality, np.int8))
            )
            batch = rows.batch.append_column(WITH_OPS.field("_op"), pc.cast(ops, pa.int8()))
            message = Chunk(batch)
        await ctx.emit(message)


@dataclass(frozen=True, slots=True)
class ChangeCheck:
    """What the check of the copied change stream found."""

    rows: int
    keys: int
    expected_keys: int
    broken: int
    wrong: int

    @property
    def verified(self) -> bool:
        return self.broken == 0 and self.wrong == 0 and self.keys == self.expected_keys


def read_changes(table: Path) -> pa.Table:
    """The committed rows of the copy's Parquet table, in commit order (epoch directories in
    order, files in order, rows in order)."""
    parts = []
    manifest = json.loads((table / "_manifest.json").read_text()) if table.exists() else None
    if manifest is None:
        return WITH_OPS.empty_table()
    for directory in sorted(table.glob("epoch=*")):
        for file in sorted(directory.glob("w*/*.parquet")):
            parts.append(pq.read_table(file, schema=WITH_OPS))
    return pa.concat_tables(parts) if parts else WITH_OPS.empty_table()


def check_changes(changes: pa.Table, expected: dict[int, int]) -> ChangeCheck:
    """Replay ``changes`` per key, in order (vectorized): a row breaks the chain if it
    retracts a value the key did not have, inserts a key that exists, or an update insert
    follows no retraction; a key is wrong if its last value is not its expected total."""
    n = changes.num_rows
    order = np.lexsort((np.arange(n), changes.column("key").to_numpy()))
    key = changes.column("key").to_numpy()[order]
    total = changes.column("total").to_numpy()[order]
    op = changes.column("_op").to_numpy()[order]
    first = np.ones(n, dtype=bool)
    first[1:] = key[1:] != key[:-1]
    prev_total = np.roll(total, 1)
    prev_op = np.roll(op, 1)
    live_before = ~first & np.isin(prev_op, [Op.INSERT, Op.UPDATE_INSERT])
    retract = np.isin(op, [Op.DELETE, Op.UPDATE_DELETE])
    broken = (
        (retract & ~(live_before & (prev_total == total)))
        | ((op == Op.INSERT) & live_before)
        | ((op == Op.UPDATE_INSERT) & (first | (prev_op != Op.UPDATE_DELETE)))
    )
    last = np.ones(n, dtype=bool)
    last[:-1] = key[1:] != key[:-1]
    final_keys, final_totals, final_ops = key[last], total[last], op[last]
    alive = np.isin(final_ops, [Op.INSERT, Op.UPDATE_INSERT])
    got = dict(zip(final_keys[alive].tolist(), final_totals[alive].tolist(), strict=True))
    wrong = sum(1 for k, t in expected.items() if got.get(k) != t) + len(set(got) - set(expected))
    return ChangeCheck(n, len(got), len(expected), int(broken.sum()), wrong)
