"""The Spark demo's keyed step (``barrierflow demo spark --keyed``): the events pass a keyed
aggregate on their way to the table — ``key_by key → aggregate → changelog_rows → map_batches``
— which, with ``--run-on executors``, runs inside Spark's tasks with its state in vnode stores
beside the table (:mod:`barrierflow.spark_bridge.task_state`), committed with the epoch's rows
(:mod:`barrierflow.connectors.state_commit`).

Every key of the demo's input is one event, so the aggregate (``value``: the max of the key's
values) inserts each key once ("+I"), with the event's value, and the map keeps the "+I" rows
in the table's columns: the demo's verification and the chaos harness's audit stay what they
are — every key exactly once, with its value. They also check the state against the rows: a
micro-batch whose state was committed but whose rows were not would, replayed, find its keys in
the state and emit updates ("-U"/"+U"), which the map drops — keys missing from the table;
rows committed without their state would, replayed, insert the keys again — duplicates. That
is the point of the act ``spark-keyed`` of :mod:`barrierflow.app.chaos.acts`: a kill lands
while Spark's tasks read, apply and stage the state, or between the two halves of a commit.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.app._demo_input import SCHEMA
from barrierflow.operators.stream import Stream

__all__ = ["declare_keyed"]

#: The op of a key's first aggregate row (:meth:`Stream.changelog_rows`).
INSERT = "+I"


def inserts_in_table_order(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The changelog's inserts, with the table's columns in its order (the map_batches step)."""
    inserted = batch.filter(pc.equal(batch["op"], INSERT))
    columns = [inserted[f.name].cast(f.type) for f in SCHEMA]
    return pa.RecordBatch.from_arrays(columns, schema=SCHEMA)


def declare_keyed(rt: Any, source: str) -> str:
    """Declare the keyed step reading ``source`` on ``rt`` (see the module); returns the name
    of its last step, the sink's input."""
    keyed = (
        Stream(rt, source)
        .key_by("key")
        .aggregate(name="keyed.aggregate", value=("value", "max"))
        .changelog_rows(name="keyed.changelog")
        .map_batches(inserts_in_table_order, schema=SCHEMA, name="keyed.map")
    )
    return keyed.name
