"""The split log: a partitioned, offset-addressed log that sources read and backfills replay.

A *split* is one partition of the log (a Kafka partition; a Redis/Valkey stream key), named by
a str. Each record of a split has an **offset**, strictly increasing within the split. Offsets
are pairs of non-negative ints, ``(major, minor)`` — Redis entry ids ``<ms>-<seq>``; a Kafka
offset is ``(offset, 0)`` — and they are compared **as numbers, never as text**
(``"9-0" < "10-0"``): :class:`Offset` orders by the pair, and in batches the two halves are
two int64 columns, compared column-wise with NumPy.

**Where a read starts.** A reader is given, per split, the offset of the *last record already
read* (``None``: none was, read from the first record): reading is **exclusive** of it. That
is what a source keeps in its state at a barrier — the last offset it emitted — so a restart
resumes right after it, with nothing read twice and nothing skipped. ``None`` reads from the
first record the log still retains (a log trimmed by retention has no older history to offer);
a start *offset* below what the log retains is refused
(:class:`~barrierflow.actors.sources.errors.OffsetTrimmedError`): records after it are lost.

**Batches.** A reader yields Arrow record batches of the log's payload columns followed by
three columns: :data:`SPLIT_COLUMN` (string), :data:`OFFSET_MAJOR` and :data:`OFFSET_MINOR`
(int64). Rows of one split are in offset order; a batch may mix splits.

**Declared splits.** A log may be *declared* with a fixed list of splits (a
:class:`~barrierflow.connectors.RedisStreamLog` given ``splits=``) while it lists only the ones
that exist now (a Redis stream exists from its first ``XADD``). Such a log also implements
:class:`DeclaredSplits`, so that a source reading "every split" of it knows which ones it was
meant to read: one that does not exist is a typo or not created yet, and the source says so
(:class:`~barrierflow.actors.sources.errors.UnknownSplitError`) instead of reading nothing.

**Lag.** A log that can count its records cheaply also implements :class:`CountsRecords`:
:meth:`~CountsRecords.records_after` is how many records of a split come after an offset —
the lag, in records, of a reader at it (Kafka's ``high watermark - offset``; Flink's
``pendingRecords``). A source and a source backfill report it per split as a metric.

**The backfill target.** :meth:`SplitLog.latest_offset` is the offset of a split's last record
now (``None`` when the split is empty: nothing to backfill). A backfill of the split's history
is done once it has read that offset — or once the live source shows a later one, since the
last record may be deleted before anyone reads it.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Protocol, final, runtime_checkable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.actors.sources.errors import OffsetOrderError
from barrierflow.channels.errors import InvalidArgumentError

__all__ = [
    "OFFSET_MAJOR",
    "OFFSET_MINOR",
    "SPLIT_COLUMN",
    "CountsRecords",
    "DeclaredSplits",
    "Offset",
    "SplitLog",
    "check_increasing",
    "split_ends",
    "split_log_schema",
]

#: The split of each row (string).
SPLIT_COLUMN = "_split"
#: The two halves of each row's offset (int64, compared as a pair).
OFFSET_MAJOR = "_offset_major"
OFFSET_MINOR = "_offset_minor"

_TEXT = re.compile(r"(\d+)(?:-(\d+))?")
_MAX = (1 << 63) - 1


@final
@dataclass(frozen=True, order=True, slots=True)
class Offset:
    """The offset of a record in its split: a pair compared as numbers.

    Raises:
        InvalidArgumentError: a half is not an int in 0..2**63-1.
    """

    major: int
    minor: int = 0

    def __post_init__(self) -> None:
        for name, value in (("major", self.major), ("minor", self.minor)):
            if type(value) is not int or not 0 <= value <= _MAX:
                raise InvalidArgumentError(f"Offset.{name}", "an int in 0..2**63-1", value)

    @classmethod
    def parse(cls, text: str) -> Offset:
        """``"<major>-<minor>"`` (a Redis entry id) or ``"<major>"``.

        Raises:
            InvalidArgumentError: ``text`` is not of that form.
        """
        match = _TEXT.fullmatch(text) if isinstance(text, str) else None
        if match is None:
            raise InvalidArgumentError("offset", "'<major>-<minor>' or '<major>'", text)
        return cls(int(match.group(1)), int(match.group(2) or 0))

    def __str__(self) -> str:
        return f"{self.major}-{self.minor}"


def split_log_schema(payload: pa.Schema, argument: str = "schema") -> pa.Schema:
    """The schema of a split log's batches: ``payload`` then the split and offset columns.

    Raises:
        InvalidArgumentError: ``payload`` is not a schema, or already has one of those names
            (naming ``argument``, the caller's name for it).
    """
    if not isinstance(payload, pa.Schema):
        raise InvalidArgumentError(argument, "a pyarrow.Schema", type(payload).__name__)
    taken = {SPLIT_COLUMN, OFFSET_MAJOR, OFFSET_MINOR} & set(payload.names)
    if taken:
        raise InvalidArgumentError(argument, "no column named like a split log's own", taken)
    return (
        payload.append(pa.field(SPLIT_COLUMN, pa.string(), nullable=False))
        .append(pa.field(OFFSET_MAJOR, pa.int64(), nullable=False))
        .append(pa.field(OFFSET_MINOR, pa.int64(), nullable=False))
    )


def check_increasing(
    split: str, major: np.ndarray, minor: np.ndarray, previous: Offset | None = None
) -> None:
    """One split's offsets (two int64 arrays) must increase strictly, after ``previous`` too
    (checked with NumPy; every reader and the backfill rely on it).

    Raises:
        OffsetOrderError: one does not, naming the split and both offsets.
    """
    if previous is not None:
        major = np.concatenate([np.array([previous.major], np.int64), major])
        minor = np.concatenate([np.array([previous.minor], np.int64), minor])
    ok = (major[1:] > major[:-1]) | ((major[1:] == major[:-1]) & (minor[1:] > minor[:-1]))
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        before = Offset(int(major[i]), int(minor[i]))
        raise OffsetOrderError(split, before, Offset(int(major[i + 1]), int(minor[i + 1])))


def split_ends(batch: pa.RecordBatch) -> dict[str, tuple[Offset, int]]:
    """Per split of ``batch``: the offset of its last row and how many rows it has
    (vectorized: a loop per split, not per row; rows of one split are in offset order)."""
    if batch.num_rows == 0:
        return {}
    encoded = pc.dictionary_encode(batch.column(SPLIT_COLUMN))
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    found, first_from_end, counts = np.unique(codes[::-1], return_index=True, return_counts=True)
    rows = len(codes) - 1 - first_from_end
    major = batch.column(OFFSET_MAJOR).to_numpy(zero_copy_only=False)[rows]
    minor = batch.column(OFFSET_MINOR).to_numpy(zero_copy_only=False)[rows]
    names = encoded.dictionary.to_pylist()
    ends = zip(found.tolist(), major.tolist(), minor.tolist(), counts.tolist(), strict=True)
    return {names[code]: (Offset(int(a), int(b)), int(n)) for code, a, b, n in ends}


@runtime_checkable
class SplitLog(Protocol):
    """A partitioned, offset-addressed log (see the module)."""

    @property
    def schema(self) -> pa.Schema:
        """The batches' schema: :func:`split_log_schema` of the payload."""
        ...

    async def list_splits(self) -> list[str]:
        """The log's splits now."""
        ...

    async def latest_offset(self, split: str) -> Offset | None:
        """The offset of ``split``'s last record now, ``None`` if it is empty.

        Raises:
            UnknownSplitError: the log has no such split.
        """
        ...

    def read(
        self, start: Mapping[str, Offset | None], *, batch_rows: int = 4096
    ) -> AsyncIterator[pa.RecordBatch]:
        """Read ``start``'s splits, each from *after* its offset (``None``: from its first
        record), then follow them as records are appended, for ever. Each batch holds at most
        ``batch_rows`` rows. The caller closes the iterator when done with it
        (``async with contextlib.aclosing(log.read(...)) as reader:``), so its resources (a
        connection, a worker thread's call) are released on the caller's backend.

        Raises:
            UnknownSplitError: a split the log does not have.
            OffsetTrimmedError: a start offset is below what the log still retains.
        """
        ...


@runtime_checkable
class DeclaredSplits(Protocol):
    """A split log that may be declared with a fixed list of splits (see the module)."""

    @property
    def declared_splits(self) -> tuple[str, ...] | None:
        """The splits the log was declared with, whether they exist or not (``None``: the log
        was declared by a pattern or some other rule; its splits are what it lists)."""
        ...


@runtime_checkable
class CountsRecords(Protocol):
    """A split log that can tell how far behind a reader is (see the module)."""

    async def records_after(self, split: str, offset: Offset | None) -> int | None:
        """How many of ``split``'s records are after ``offset`` now (``None``: all of them —
        every record it retains), or ``None`` when the log cannot tell without reading them
        (it never reads them to count).

        Raises:
            UnknownSplitError: the log has no such split.
        """
        ...
