"""Hypothesis strategies for barrierflow's data: schemas, chunks, barriers and message streams.

Rows of :func:`message_streams` carry an ``id`` column that is unique across a generated
stream, so a test can check that nothing was lost, duplicated or reordered, and a ``key``
column with few distinct values, so dispatch by key groups rows. :func:`schemas`,
:func:`chunks` and :func:`barriers` draw any valid schema, chunk (ops with update pairs kept
adjacent, visibility masks) and barrier (with a valid mutation); whole schedules over a small
graph are in :mod:`barrierflow.testing.graph_strategies`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from hypothesis import strategies as st

from barrierflow.channels.barrier import Barrier, BarrierKind
from barrierflow.channels.chunk import Chunk, Op
from barrierflow.channels.epoch import EPOCH_PHYSICAL_SHIFT, EpochPair
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.channels.messages import Message, Watermark
from barrierflow.channels.mutation import (
    Add,
    Mutation,
    Pause,
    Resume,
    SourceChangeSplit,
    Split,
    Stop,
    Throttle,
    Update,
)

__all__ = [
    "SCHEMA",
    "FIELD_TYPES",
    "MUTATION_KINDS",
    "schemas",
    "chunks",
    "barriers",
    "StreamSpec",
    "chunk_sizes",
    "epoch_pairs",
    "message_streams",
    "aligned_streams",
]

#: The schema of generated chunks.
SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.int64()), ("name", pa.string())])


def epoch_pairs(count: int, start: int = 1) -> list[EpochPair]:
    """``count`` consecutive epoch pairs, one millisecond apart.

    Raises:
        InvalidArgumentError: ``count`` is not an int >= 0 or ``start`` not an int >= 1.
    """
    if type(count) is not int or count < 0:
        raise InvalidArgumentError("count", "an int >= 0", count)
    if type(start) is not int or start < 1:
        raise InvalidArgumentError("start", "an int >= 1 (milliseconds)", start)
    epochs = [(start + i) << EPOCH_PHYSICAL_SHIFT for i in range(count + 1)]
    return [EpochPair(epochs[i + 1], epochs[i]) for i in range(count)]


def _chunk(
    first_id: int, rows: int, keys: list[int], ops: list[int] | None, mask: list[bool] | None
) -> Chunk:
    ids = np.arange(first_id, first_id + rows, dtype=np.int64)
    batch = pa.RecordBatch.from_arrays(
        [pa.array(ids), pa.array(keys, pa.int64()), pa.array([f"n{i}" for i in ids])],
        schema=SCHEMA,
    )
    return Chunk(batch, ops, mask)


def chunk_sizes(max_rows: int = 40) -> st.SearchStrategy[int]:
    """Chunk sizes, biased towards small ones and including empty chunks.

    Raises:
        InvalidArgumentError: ``max_rows`` is not an int >= 0.
    """
    if type(max_rows) is not int or max_rows < 0:
        raise InvalidArgumentError("max_rows", "an int >= 0", max_rows)
    return st.integers(min_value=0, max_value=max_rows)


@st.composite
def _chunk_at(
    draw: st.DrawFn, first_id: int, max_rows: int, with_ops: bool, with_masks: bool
) -> Chunk:
    rows = draw(chunk_sizes(max_rows))
    keys = draw(st.lists(st.integers(0, 20), min_size=rows, max_size=rows))
    ops = (
        draw(st.lists(st.sampled_from([int(o) for o in Op]), min_size=rows, max_size=rows))
        if with_ops and draw(st.booleans())
        else None
    )
    mask = (
        draw(st.lists(st.booleans(), min_size=rows, max_size=rows))
        if with_masks and draw(st.booleans())
        else None
    )
    return _chunk(first_id, rows, keys, ops, mask)


@dataclass(frozen=True)
class StreamSpec:
    """A generated stream and what it contains."""

    #: The messages, in order.
    messages: list[Message]
    #: The barriers, in order.
    barriers: list[Barrier]


@st.composite
def message_streams(
    draw: st.DrawFn,
    *,
    max_epochs: int = 5,
    max_chunks_per_epoch: int = 4,
    max_rows: int = 40,
    first_id: int = 0,
    barriers: list[Barrier] | None = None,
    with_ops: bool = False,
    with_masks: bool = False,
    with_watermarks: bool = False,
) -> StreamSpec:
    """A stream of chunks cut by barriers with strictly increasing epochs.

    Ids are unique within the stream, starting at ``first_id``. Pass ``barriers`` to make
    several streams share one barrier sequence (as the inputs of an aligned merge do).
    """
    if barriers is None:
        count = draw(st.integers(0, max_epochs))
        kinds = draw(
            st.lists(
                st.sampled_from([BarrierKind.BARRIER, BarrierKind.CHECKPOINT]),
                min_size=count,
                max_size=count,
            )
        )
        barriers = [
            Barrier(pair, kind) for pair, kind in zip(epoch_pairs(count), kinds, strict=True)
        ]
    messages: list[Message] = []
    next_id = first_id
    watermark = 0
    for index in range(len(barriers) + 1):
        for _ in range(draw(st.integers(0, max_chunks_per_epoch))):
            chunk = draw(_chunk_at(next_id, max_rows, with_ops, with_masks))
            next_id += chunk.num_rows
            messages.append(chunk)
            if with_watermarks and draw(st.booleans()):
                watermark += draw(st.integers(0, 5))
                messages.append(Watermark("ts", watermark))
        if index < len(barriers):
            messages.append(barriers[index])
    return StreamSpec(messages, list(barriers))


@st.composite
def aligned_streams(
    draw: st.DrawFn,
    *,
    min_inputs: int = 1,
    max_inputs: int = 4,
    max_epochs: int = 5,
    max_rows: int = 30,
    with_watermarks: bool = False,
) -> list[StreamSpec]:
    """Several streams with the same barriers and disjoint ids: the inputs of a merge."""
    count = draw(st.integers(min_inputs, max_inputs))
    epochs = draw(st.integers(0, max_epochs))
    barriers = [Barrier(pair, BarrierKind.BARRIER) for pair in epoch_pairs(epochs)]
    return [
        draw(
            message_streams(
                barriers=barriers,
                first_id=i * 1_000_000,
                max_rows=max_rows,
                with_watermarks=with_watermarks,
            )
        )
        for i in range(count)
    ]


#: The column types :func:`schemas` draws from: what every part of the runtime carries (the
#: state store, the sinks, the hash dispatch).
FIELD_TYPES: tuple[pa.DataType, ...] = (
    pa.int64(),
    pa.float64(),
    pa.string(),
    pa.bool_(),
    pa.timestamp("us", tz="UTC"),
)


@st.composite
def schemas(
    draw: st.DrawFn, *, min_fields: int = 1, max_fields: int = 5, nullable: bool = True
) -> pa.Schema:
    """Arrow schemas of :data:`FIELD_TYPES` with unique, lower-case column names; a field is
    nullable or not at random when ``nullable`` (else never).

    Raises:
        InvalidArgumentError: ``min_fields`` is not an int >= 0, ``max_fields`` not an int
            >= ``min_fields``, or ``nullable`` not a bool.
    """
    if type(min_fields) is not int or min_fields < 0:
        raise InvalidArgumentError("min_fields", "an int >= 0", min_fields)
    if type(max_fields) is not int or max_fields < min_fields:
        raise InvalidArgumentError("max_fields", f"an int >= min_fields ({min_fields})", max_fields)
    if type(nullable) is not bool:
        raise InvalidArgumentError("nullable", "a bool", nullable)
    names = draw(
        st.lists(
            st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8),
            min_size=min_fields,
            max_size=max_fields,
            unique=True,
        )
    )
    return pa.schema(
        [
            pa.field(
                name,
                draw(st.sampled_from(FIELD_TYPES)),
                nullable=nullable and draw(st.booleans()),
            )
            for name in names
        ]
    )


def _values(data_type: pa.DataType) -> st.SearchStrategy[object]:
    """Values of one column type (floats without NaN: rows must compare equal to themselves)."""
    if pa.types.is_int64(data_type):
        return st.integers(-(2**63), 2**63 - 1)
    if pa.types.is_float64(data_type):
        return st.floats(allow_nan=False)
    if pa.types.is_string(data_type):
        return st.text(max_size=10)
    if pa.types.is_boolean(data_type):
        return st.booleans()
    # Timestamps as microseconds: a year 1..9999 range any engine can render.
    return st.integers(-62_135_596_800_000_000, 253_402_300_799_999_999)


@st.composite
def _column(draw: st.DrawFn, field: pa.Field, rows: int) -> pa.Array:
    values = draw(st.lists(_values(field.type), min_size=rows, max_size=rows))
    if field.nullable and draw(st.booleans()):
        nulls = draw(st.lists(st.booleans(), min_size=rows, max_size=rows))
        values = [None if null else value for value, null in zip(values, nulls, strict=True)]
    if pa.types.is_timestamp(field.type):
        return pa.array(values, pa.int64()).cast(field.type)
    return pa.array(values, field.type)


@st.composite
def chunks(
    draw: st.DrawFn,
    schema: pa.Schema | None = None,
    *,
    max_rows: int = 20,
    with_ops: bool = True,
    with_visibility: bool = True,
) -> Chunk:
    """Chunks of ``schema`` (drawn by :func:`schemas` when ``None``).

    With ``with_ops``, rows are inserts, deletes and update pairs, each ``UPDATE_DELETE``
    directly followed by its ``UPDATE_INSERT`` (what a changelog consumer relies on), or the
    chunk has no ops column (all inserts). With ``with_visibility`` a mask may hide rows; an
    update pair is hidden or shown whole. Non-nullable fields hold no nulls.

    Raises:
        InvalidArgumentError: ``schema`` is neither ``None`` nor a Schema of
            :data:`FIELD_TYPES`, or ``max_rows`` is not an int >= 0.
    """
    if schema is not None and (
        not isinstance(schema, pa.Schema) or any(f.type not in FIELD_TYPES for f in schema)
    ):
        raise InvalidArgumentError("schema", f"None or a Schema of {list(FIELD_TYPES)}", schema)
    if type(max_rows) is not int or max_rows < 0:
        raise InvalidArgumentError("max_rows", "an int >= 0", max_rows)
    if schema is None:
        schema = draw(schemas())
    # A unit is one row (insert or delete) or an update pair (two rows).
    units = draw(
        st.lists(
            st.sampled_from(["insert", "delete", "update"] if with_ops else ["insert"]),
            max_size=max_rows,
        )
    )
    sizes = np.array([2 if unit == "update" else 1 for unit in units], dtype=np.int64)
    keep = int(np.searchsorted(np.cumsum(sizes), max_rows, side="right"))
    units, sizes = units[:keep], sizes[:keep]
    codes = {"insert": [Op.INSERT], "delete": [Op.DELETE]}
    codes["update"] = [Op.UPDATE_DELETE, Op.UPDATE_INSERT]
    op_list = [int(op) for unit in units for op in codes[unit]]
    rows = len(op_list)
    columns = [draw(_column(field, rows)) for field in schema]
    batch = pa.RecordBatch.from_arrays(columns, schema=schema)
    ops = op_list if with_ops and (op_list != [0] * rows or draw(st.booleans())) else None
    mask = None
    if with_visibility and draw(st.booleans()):
        shown = draw(st.lists(st.booleans(), min_size=len(units), max_size=len(units)))
        mask = np.repeat(np.array(shown, dtype=np.bool_), sizes)
    return Chunk(batch, ops, mask)


#: The mutations :func:`barriers` may carry, by name.
MUTATION_KINDS = ("pause", "resume", "throttle", "stop", "change_split", "add", "update")


def _ids(actor_ids: tuple[int, ...], min_size: int = 0) -> st.SearchStrategy[list[int]]:
    return st.lists(st.sampled_from(actor_ids), min_size=min_size, unique=True)


def _splits(actor_ids: tuple[int, ...]) -> st.SearchStrategy[dict[int, tuple[Split, ...]]]:
    split = st.builds(
        Split,
        st.sampled_from(["p0", "p1", "p2", "p3"]),
        st.none() | st.integers(-1, 2**63 - 1),
    )
    return st.dictionaries(
        st.sampled_from(actor_ids),
        st.lists(split, max_size=3, unique_by=lambda s: s.split_id).map(tuple),
        max_size=len(actor_ids),
    )


def _mutation(kind: str, actor_ids: tuple[int, ...]) -> st.SearchStrategy[Mutation]:
    rate = st.none() | st.floats(0, 1e9, allow_nan=False, allow_infinity=False)
    if kind == "pause":
        return st.just(Pause())
    if kind == "resume":
        return st.just(Resume())
    if kind == "throttle":
        return st.builds(Throttle, st.dictionaries(st.sampled_from(actor_ids), rate))
    if kind == "stop":
        return st.builds(Stop, _ids(actor_ids, 1).map(frozenset))
    if kind == "change_split":
        return st.builds(SourceChangeSplit, _splits(actor_ids))
    if kind == "add":
        return st.builds(Add, _splits(actor_ids), st.booleans(), _ids(actor_ids).map(frozenset))
    return st.builds(Update, _splits(actor_ids), st.just({}), _ids(actor_ids).map(frozenset))


@st.composite
def barriers(
    draw: st.DrawFn,
    *,
    actor_ids: tuple[int, ...] = (1, 2, 3),
    checkpoint: bool | None = None,
    mutations: tuple[str, ...] = MUTATION_KINDS,
    mutation_probability: float = 0.5,
) -> Barrier:
    """Barriers between two epochs ``prev < curr``, a checkpoint or not (``checkpoint``:
    always, never, or at random when ``None``), carrying a mutation of one of ``mutations``
    (:data:`MUTATION_KINDS`) naming only ``actor_ids``, or none.

    ``Update`` carries splits and dropped actors, never vnode bitmaps (which must cover the
    vnodes of a real graph).

    Raises:
        InvalidArgumentError: ``actor_ids`` is not a non-empty tuple of ints >= 0,
            ``checkpoint`` not ``None`` or a bool, ``mutations`` not a tuple of
            :data:`MUTATION_KINDS`, or ``mutation_probability`` not in 0..1.
    """
    if (
        not isinstance(actor_ids, tuple)
        or not actor_ids
        or not all(type(a) is int and a >= 0 for a in actor_ids)
    ):
        raise InvalidArgumentError("actor_ids", "a non-empty tuple of ints >= 0", actor_ids)
    if checkpoint is not None and type(checkpoint) is not bool:
        raise InvalidArgumentError("checkpoint", "None or a bool", checkpoint)
    if not isinstance(mutations, tuple) or not set(mutations) <= set(MUTATION_KINDS):
        raise InvalidArgumentError("mutations", f"a tuple of {list(MUTATION_KINDS)}", mutations)
    p = mutation_probability
    if isinstance(p, bool) or not isinstance(p, int | float) or not 0 <= p <= 1:
        raise InvalidArgumentError("mutation_probability", "a number in 0..1", p)
    prev = draw(st.integers(0, 2**40)) << EPOCH_PHYSICAL_SHIFT
    curr = prev + draw(st.integers(1, 2**20))
    if checkpoint is None:
        checkpoint = draw(st.booleans())
    kind = BarrierKind.CHECKPOINT if checkpoint else BarrierKind.BARRIER
    mutation: Mutation | None = None
    if mutations and draw(st.floats(0, 1, exclude_max=True)) < p:
        mutation = draw(_mutation(draw(st.sampled_from(mutations)), actor_ids))
    return Barrier(EpochPair(curr, prev), kind, mutation)
