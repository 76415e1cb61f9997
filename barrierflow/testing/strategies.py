"""Hypothesis strategies for barrierflow's data: batches, chunks and message streams.

Rows carry an ``id`` column that is unique across a generated stream, so a test can check that
nothing was lost, duplicated or reordered, and a ``key`` column with few distinct values, so
dispatch by key groups rows.
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

__all__ = [
    "SCHEMA",
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
