"""Fan-out: one actor's output stream split over several downstream channels.

Three strategies, all with the same contract: chunks are routed by the strategy, while barriers
and watermarks go to **every** output, so each downstream sees every epoch boundary. Messages
are sent to outputs one after the other; a full output therefore blocks the dispatcher (and its
upstream) — backpressure travels upstream from the slowest output.

* :class:`HashDispatcher` routes each visible row to the owner of its vnode (stable hash of the
  key columns; see :mod:`barrierflow.channels.vnode`). The chunk is split with one vectorized
  ``take`` by a computed index and zero-copy slices — never a Python loop per row. An update
  pair (``UPDATE_DELETE`` then ``UPDATE_INSERT``) whose halves land on different outputs, or
  whose other half is hidden, becomes a plain ``DELETE`` / ``INSERT``, so each output still
  receives a well-formed changelog.
* :class:`BroadcastDispatcher` sends every chunk to every output.
* :class:`RoundRobinDispatcher` sends whole chunks to the outputs in turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from barrierflow.channels.barrier import Barrier
from barrierflow.channels.chunk import Chunk, Op
from barrierflow.channels.endpoints import Sender
from barrierflow.channels.errors import (
    ChannelBrokenError,
    DroppedOutputRowsError,
    InvalidArgumentError,
)
from barrierflow.channels.messages import MESSAGE_EXPECTED, Committable, Message, Watermark
from barrierflow.channels.vnode import (
    VnodeBitmap,
    check_key_columns,
    vnode_owners,
    vnodes_unchecked,
)

__all__ = ["Dispatcher", "HashDispatcher", "BroadcastDispatcher", "RoundRobinDispatcher"]


def _check_outputs(outputs: Sequence[Sender[Message]]) -> list[Sender[Message]]:
    if not isinstance(outputs, list | tuple) or not outputs:
        raise InvalidArgumentError("outputs", "a non-empty sequence of senders", outputs)
    for output in outputs:
        if not isinstance(output, Sender):
            raise InvalidArgumentError("outputs", "senders with send() and close()", output)
    return list(outputs)


def _check_chunk(chunk: object) -> None:
    if not isinstance(chunk, Chunk):
        raise InvalidArgumentError("chunk", "a Chunk", type(chunk).__name__)


class Dispatcher:
    """Base of the fan-out strategies: barriers and watermarks go to every output.

    Subclasses decide where a chunk goes in :meth:`dispatch_chunk`; the base itself routes no
    chunk, so it cannot be instantiated (use one of the strategies).

    Raises:
        InvalidArgumentError: ``outputs`` is not a non-empty list or tuple of senders, or the
            base class itself is instantiated.
    """

    def __init__(self, outputs: Sequence[Sender[Message]]) -> None:
        if type(self) is Dispatcher:
            raise InvalidArgumentError(
                "Dispatcher",
                "a strategy (HashDispatcher, BroadcastDispatcher, RoundRobinDispatcher)",
                "the abstract base class",
            )
        self._outputs = _check_outputs(outputs)
        self._dropped: set[int] = set()

    @property
    def outputs(self) -> list[Sender[Message]]:
        """The outputs, in the order given."""
        return list(self._outputs)

    def drop_output(self, index: int) -> None:
        """Close output ``index`` and send it nothing more (its actor was dropped by a
        rescale). A hash dispatcher must have given it an empty bitmap first.

        Raises:
            InvalidArgumentError: no such output.
        """
        if type(index) is not int or not 0 <= index < len(self._outputs):
            raise InvalidArgumentError(
                "index", f"an output index in 0..{len(self._outputs) - 1}", index
            )
        self._dropped.add(index)
        self._outputs[index].close()

    def _live(self) -> list[Sender[Message]]:
        return [o for i, o in enumerate(self._outputs) if i not in self._dropped]

    async def dispatch(self, message: Message) -> None:
        """Send ``message`` on: a chunk as the strategy routes it, a committable to the first
        output, anything else to all.

        Raises:
            ChannelBrokenError: an output's receiver is gone.
            InvalidArgumentError: ``message`` is not a Message (Chunk, Barrier, Watermark or
                Committable); nothing was sent.
        """
        if isinstance(message, Chunk):
            await self.dispatch_chunk(message)
        elif isinstance(message, Committable):
            # One copy per group: every output is a writer of the same sink, whose
            # coordinator collects all of them, and a copy to each would commit it twice.
            live = self._live() if self._dropped else self._outputs
            if live:
                await live[0].send(message)
        elif not isinstance(message, Barrier | Watermark):
            raise InvalidArgumentError("message", MESSAGE_EXPECTED, type(message).__name__)
        else:
            for output in self._live() if self._dropped else self._outputs:
                await output.send(message)

    async def dispatch_chunk(self, chunk: Chunk) -> None:
        """Route one chunk (overridden by each strategy; :meth:`dispatch` checked its type)."""
        raise NotImplementedError

    def close(self) -> None:
        """Close every output, ending their streams."""
        for output in self._outputs:
            output.close()


@final
class BroadcastDispatcher(Dispatcher):
    """Every message, chunks included, to every output."""

    async def dispatch_chunk(self, chunk: Chunk) -> None:
        """Send ``chunk`` to every live output.

        Raises:
            InvalidArgumentError: ``chunk`` is not a Chunk.
        """
        _check_chunk(chunk)
        for output in self._live() if self._dropped else self._outputs:
            await output.send(chunk)


@final
class RoundRobinDispatcher(Dispatcher):
    """Whole chunks to the outputs in turn; barriers and watermarks to all."""

    def __init__(self, outputs: Sequence[Sender[Message]]) -> None:
        super().__init__(outputs)
        self._next = 0

    async def dispatch_chunk(self, chunk: Chunk) -> None:
        """Send ``chunk`` to the next live output in turn.

        Raises:
            InvalidArgumentError: ``chunk`` is not a Chunk.
            ChannelBrokenError: every output was dropped.
        """
        _check_chunk(chunk)
        live = self._live() if self._dropped else self._outputs
        if not live:
            raise ChannelBrokenError("round-robin dispatch", "every output was dropped")
        output = live[self._next % len(live)]
        self._next = (self._next + 1) % len(live)
        await output.send(chunk)


def _fix_update_pairs(
    ops: npt.NDArray[np.int8], dest: npt.NDArray[np.int16]
) -> npt.NDArray[np.int8]:
    """Turn update pairs split across outputs (or half hidden, dest -1) into delete + insert."""
    if len(ops) < 2:
        return ops
    firsts = np.flatnonzero(ops[:-1] == Op.UPDATE_DELETE)
    firsts = firsts[ops[firsts + 1] == Op.UPDATE_INSERT]
    broken = firsts[dest[firsts] != dest[firsts + 1]]
    if len(broken) == 0:
        return ops
    fixed = ops.copy()
    fixed[broken] = Op.DELETE
    fixed[broken + 1] = Op.INSERT
    return fixed


@final
class HashDispatcher(Dispatcher):
    """Each visible row to the output owning its vnode.

    Args:
        outputs: the downstream senders.
        bitmaps: one vnode bitmap per output; together they must cover every vnode exactly
            once. Their size is the vnode count.
        key_columns: the columns hashed to a vnode.

    Raises:
        InvalidArgumentError: no outputs, a different number of bitmaps than outputs, bitmaps
            of different sizes, or no key columns.
        VnodeOwnershipError: a vnode is owned by two outputs or by none.
    """

    def __init__(
        self,
        outputs: Sequence[Sender[Message]],
        bitmaps: Sequence[VnodeBitmap],
        key_columns: Sequence[str],
    ) -> None:
        super().__init__(outputs)
        # A str is refused where the sequence of names is expected: "key" would be read as the
        # columns "k", "e", "y".
        if (
            not isinstance(key_columns, list | tuple)
            or not key_columns
            or not all(isinstance(c, str) and c for c in key_columns)
        ):
            raise InvalidArgumentError(
                "key_columns", "a non-empty list or tuple of column names", key_columns
            )
        self._key_columns = tuple(key_columns)
        self._checked_schema: pa.Schema | None = None
        self._set_bitmaps(bitmaps)

    @property
    def key_columns(self) -> tuple[str, ...]:
        """The columns hashed to a vnode."""
        return self._key_columns

    @property
    def bitmaps(self) -> list[VnodeBitmap]:
        """Each output's vnodes, in output order."""
        return list(self._bitmaps)

    def _set_bitmaps(self, bitmaps: Sequence[VnodeBitmap]) -> None:
        if not isinstance(bitmaps, list | tuple):
            raise InvalidArgumentError("bitmaps", "a list or tuple of VnodeBitmaps", bitmaps)
        if len(bitmaps) != len(self._outputs):
            raise InvalidArgumentError(
                "bitmaps",
                f"{len(self._outputs)} bitmaps (one per output)",
                f"{len(bitmaps)} bitmaps",
            )
        self._owners = vnode_owners(bitmaps).astype(np.int16)
        self._bitmaps = list(bitmaps)
        self._vnode_count = bitmaps[0].vnode_count

    def update_bitmaps(self, bitmaps: Sequence[VnodeBitmap]) -> None:
        """Re-scale: new vnode ownership, effective for the next chunk (apply at a barrier).

        Raises:
            InvalidArgumentError, VnodeOwnershipError: as for the constructor.
        """
        self._set_bitmaps(bitmaps)

    def route(self, chunk: Chunk) -> list[Chunk | None]:
        """Split ``chunk`` into one compacted chunk per output (``None`` where it has no rows).

        Raises:
            InvalidArgumentError: ``chunk`` is not a Chunk, or a key column is missing from its
                schema or unhashable.
        """
        _check_chunk(chunk)
        batch = chunk.batch
        if self._checked_schema is None or not batch.schema.equals(self._checked_schema):
            try:
                check_key_columns(batch.schema, self._key_columns)
            except InvalidArgumentError as exc:
                # Raised in the upstream, whose name is all the error would otherwise carry:
                # name the readers whose key it is (the channels are named "up->reader").
                readers = [getattr(o, "name", "?") for o in self._outputs]
                raise InvalidArgumentError(
                    "key_columns", f"{exc.expected} (the key the readers {readers} need)", exc.got
                ) from None
            self._checked_schema = batch.schema
        vnodes = vnodes_unchecked(batch, self._key_columns, self._vnode_count)
        dest = self._owners[vnodes]
        if chunk.visibility is not None:
            visible = chunk.visibility.to_numpy(zero_copy_only=False)
            dest = np.where(visible, dest, np.int16(-1))
        ops = None if chunk.ops is None else _fix_update_pairs(chunk.ops_numpy(), dest)
        n_out = len(self._outputs)
        if chunk.visibility is None:
            order = np.argsort(dest, kind="stable")  # radix sort on int16: linear
            sorted_dest = dest[order]
        else:
            kept = np.flatnonzero(dest >= 0)
            order = kept[np.argsort(dest[kept], kind="stable")]
            sorted_dest = dest[order]
        bounds = np.searchsorted(sorted_dest, np.arange(n_out + 1, dtype=np.int16))
        if len(order) == batch.num_rows and bounds[1] - bounds[0] == len(order):
            # Everything goes to output 0 in its original order: no take needed.
            taken, taken_ops = batch, ops
        else:
            indices = pa.array(order)
            taken = batch.take(indices)
            taken_ops = None if ops is None else ops[order]
        arrow_ops = None if taken_ops is None else pa.array(taken_ops, type=pa.int8())
        routed: list[Chunk | None] = []
        for i in range(n_out):
            lo, hi = int(bounds[i]), int(bounds[i + 1])
            if lo == hi:
                routed.append(None)
                continue
            part_ops = None if arrow_ops is None else arrow_ops.slice(lo, hi - lo)
            routed.append(Chunk._trusted(taken.slice(lo, hi - lo), part_ops))
        return routed

    async def dispatch_chunk(self, chunk: Chunk) -> None:
        """Send each output its part of ``chunk``.

        Raises:
            InvalidArgumentError: as for :meth:`route`.
            DroppedOutputRowsError: rows were routed to a dropped output.
        """
        parts = self.route(chunk)
        for index in self._dropped:
            stray = parts[index]
            if stray is not None:
                raise DroppedOutputRowsError(index, stray.num_rows)
        for output, part in zip(self._outputs, parts, strict=True):
            if part is not None:
                await output.send(part)
