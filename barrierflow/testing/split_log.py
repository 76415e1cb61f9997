"""An in-memory split log, scripted by a test: the :class:`~barrierflow.actors.sources.
split_log.SplitLog` protocol without a server.

Records are appended per split with :meth:`MemorySplitLog.append` (offsets ``(n, 0)`` counting
from 1, or explicit ones); :meth:`~MemorySplitLog.delete` removes one record (what compaction
does), :meth:`~MemorySplitLog.trim` every record up to an offset (what retention does). Readers
follow appends as they happen, so a property test can interleave writing and reading at will.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, final

import anyio
import numpy as np
import pyarrow as pa

from barrierflow._sync import Notifier
from barrierflow.actors.sources.errors import (
    OffsetOrderError,
    OffsetTrimmedError,
    UnknownSplitError,
)
from barrierflow.actors.sources.split_log import Offset, split_log_schema
from barrierflow.channels.errors import InvalidArgumentError

__all__ = ["MemorySplitLog"]


@final
class _Split:
    """One split's records: offsets (two int64 arrays, increasing) and payload rows."""

    __slots__ = ("major", "minor", "payload", "trimmed_to")

    def __init__(self, schema: pa.Schema) -> None:
        self.major = np.zeros(0, dtype=np.int64)
        self.minor = np.zeros(0, dtype=np.int64)
        self.payload = schema.empty_table()
        #: The last offset removed by trimming (reads must start at or after it).
        self.trimmed_to: Offset | None = None

    def last(self) -> Offset | None:
        if not len(self.major):
            return None
        return Offset(int(self.major[-1]), int(self.minor[-1]))

    def first_after(self, offset: Offset | None) -> int:
        """The index of the first record after ``offset``."""
        if offset is None:
            return 0
        after = (self.major > offset.major) | (
            (self.major == offset.major) & (self.minor > offset.minor)
        )
        hits = np.flatnonzero(after)
        return int(hits[0]) if len(hits) else len(self.major)


@final
class MemorySplitLog:
    """A split log held in memory (see the module).

    Args:
        payload: the schema of the records' payload columns.
        splits: the splits that exist from the start (more appear on first append).

    Raises:
        InvalidArgumentError: ``payload`` is not a schema, or names a split log column;
            ``splits`` is not a list or tuple of non-empty names.
    """

    def __init__(self, payload: pa.Schema, splits: Sequence[str] = ()) -> None:
        self._schema = split_log_schema(payload, "payload")
        if not isinstance(splits, list | tuple) or not all(
            isinstance(s, str) and s for s in splits
        ):
            raise InvalidArgumentError("splits", "a list or tuple of non-empty split names", splits)
        self._payload = payload
        self._splits: dict[str, _Split] = {s: _Split(payload) for s in splits}
        # Made on first wait: an anyio event needs a running event loop.
        self._appended: Notifier | None = None

    def __repr__(self) -> str:
        """The splits it has now, as a log line names the log."""
        return f"MemorySplitLog(splits={sorted(self._splits)!r})"

    @property
    def schema(self) -> pa.Schema:
        """The payload columns, then the split and offset columns."""
        return self._schema

    # Scripting the log.

    def append(
        self, split: str, rows: pa.RecordBatch | pa.Table | Mapping[str, Any],
        offsets: Sequence[Offset] | None = None,
    ) -> list[Offset]:  # fmt: skip
        """Append ``rows`` to ``split`` (created if new), at ``offsets`` or at the next
        ``(n, 0)``; returns their offsets.

        Raises:
            InvalidArgumentError: rows not of the payload schema, or a count of offsets that
                does not match.
            OffsetOrderError: offsets not strictly increasing past the split's last one.
        """
        table = pa.Table.from_pydict(dict(rows), self._payload) if isinstance(rows, Mapping) else (
            pa.Table.from_batches([rows]) if isinstance(rows, pa.RecordBatch) else rows
        )  # fmt: skip
        if not isinstance(table, pa.Table) or not table.schema.equals(self._payload):
            raise InvalidArgumentError("rows", f"rows of schema {self._payload}", rows)
        state = self._splits.setdefault(split, _Split(self._payload))
        last = state.last()
        if offsets is None:
            start = (last.major + 1) if last is not None else 1
            offsets = [Offset(start + i) for i in range(table.num_rows)]
        if len(offsets) != table.num_rows:
            raise InvalidArgumentError("offsets", f"{table.num_rows} offsets", len(offsets))
        previous = last
        for offset in offsets:
            if previous is not None and offset <= previous:
                raise OffsetOrderError(split, previous, offset)
            previous = offset
        state.major = np.concatenate([state.major, [o.major for o in offsets]]).astype(np.int64)
        state.minor = np.concatenate([state.minor, [o.minor for o in offsets]]).astype(np.int64)
        state.payload = pa.concat_tables([state.payload, table]).combine_chunks()
        if self._appended is not None:
            self._appended.notify()
        return list(offsets)

    def delete(self, split: str, offset: Offset) -> None:
        """Remove the record at ``offset`` of ``split`` (compaction); no record there: nothing.

        Raises:
            UnknownSplitError: no such split.
        """
        state = self._split(split)
        keep = ~((state.major == offset.major) & (state.minor == offset.minor))
        self._keep(state, keep)

    def trim(self, split: str, up_to: Offset) -> None:
        """Remove every record of ``split`` at or before ``up_to`` (retention).

        Raises:
            UnknownSplitError: no such split.
        """
        state = self._split(split)
        keep = np.arange(len(state.major)) >= state.first_after(up_to)
        self._keep(state, keep)
        if state.trimmed_to is None or up_to > state.trimmed_to:
            state.trimmed_to = up_to

    @staticmethod
    def _keep(state: _Split, keep: np.ndarray) -> None:
        state.major, state.minor = state.major[keep], state.minor[keep]
        state.payload = state.payload.filter(pa.array(keep))

    def _split(self, split: str) -> _Split:
        state = self._splits.get(split)
        if state is None:
            raise UnknownSplitError(split, sorted(self._splits))
        return state

    def records(self, split: str) -> list[Offset]:
        """The offsets ``split`` holds now."""
        state = self._split(split)
        return [Offset(int(a), int(b)) for a, b in zip(state.major, state.minor, strict=True)]

    # The protocol.

    async def list_splits(self) -> list[str]:
        """The splits, sorted."""
        await anyio.lowlevel.checkpoint()
        return sorted(self._splits)

    async def latest_offset(self, split: str) -> Offset | None:
        """The offset of ``split``'s last record, ``None`` if it holds none.

        Raises:
            UnknownSplitError: no such split.
        """
        await anyio.lowlevel.checkpoint()
        return self._split(split).last()

    async def records_after(self, split: str, offset: Offset | None) -> int:
        """How many of ``split``'s records are after ``offset`` (exact: a bisection).

        Raises:
            UnknownSplitError: no such split.
        """
        await anyio.lowlevel.checkpoint()
        state = self._split(split)
        return len(state.major) - state.first_after(offset)

    def read(
        self, start: Mapping[str, Offset | None], *, batch_rows: int = 4096
    ) -> AsyncIterator[pa.RecordBatch]:
        """Follow ``start``'s splits from after their offsets (see the protocol).

        Raises:
            InvalidArgumentError: ``batch_rows`` is not a positive int.
            UnknownSplitError: a split the log does not have.
            OffsetTrimmedError: a start offset below what was trimmed (``None`` reads from the
                first record retained: there is no position to have lost records after).
        """
        if type(batch_rows) is not int or batch_rows < 1:
            raise InvalidArgumentError("batch_rows", "a positive int", batch_rows)
        for split, offset in start.items():
            state = self._split(split)
            if state.trimmed_to is not None and offset is not None and offset < state.trimmed_to:
                raise OffsetTrimmedError(split, offset, state.trimmed_to)
        return self._follow(dict(start), batch_rows)

    async def _follow(
        self, positions: dict[str, Offset | None], batch_rows: int
    ) -> AsyncIterator[pa.RecordBatch]:
        while True:
            delivered = False
            for split in list(positions):
                state = self._splits[split]
                begin = state.first_after(positions[split])
                end = min(begin + batch_rows, len(state.major))
                if begin == end:
                    continue
                batch = self._batch(split, state, begin, end)
                positions[split] = Offset(int(state.major[end - 1]), int(state.minor[end - 1]))
                delivered = True
                yield batch
            if not delivered:
                if self._appended is None:
                    self._appended = Notifier()
                await self._appended.wait()

    def _batch(self, split: str, state: _Split, begin: int, end: int) -> pa.RecordBatch:
        payload = state.payload.slice(begin, end - begin).combine_chunks()
        columns = [payload.column(i).combine_chunks() for i in range(payload.num_columns)]
        columns += [
            pa.repeat(pa.scalar(split, pa.string()), end - begin),
            pa.array(state.major[begin:end], pa.int64()),
            pa.array(state.minor[begin:end], pa.int64()),
        ]
        return pa.record_batch(columns, schema=self._schema)
