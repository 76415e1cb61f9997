"""The in-memory split log of ``barrierflow.testing``: the split log protocol without a server."""

from __future__ import annotations

from contextlib import aclosing

import anyio
import pyarrow as pa
import pytest
from _timeouts import scaled

from barrierflow.actors.sources.split_log import (
    OFFSET_MAJOR,
    OFFSET_MINOR,
    SPLIT_COLUMN,
    Offset,
    SplitLog,
)
from barrierflow.errors import OffsetOrderError, OffsetTrimmedError, UnknownSplitError
from barrierflow.testing.split_log import MemorySplitLog

pytestmark = pytest.mark.anyio

PAYLOAD = pa.schema([("v", pa.int64())])


def log_with(**splits: list[int]) -> MemorySplitLog:
    log = MemorySplitLog(PAYLOAD)
    for split, values in splits.items():
        log.append(split, {"v": values})
    return log


async def take(
    log: MemorySplitLog, start: dict[str, Offset | None], rows: int, **kw: int
) -> list[tuple[str, Offset, int]]:
    """The first ``rows`` records a read from ``start`` delivers: (split, offset, v)."""
    got: list[tuple[str, Offset, int]] = []
    with anyio.fail_after(scaled(5)):
        async with aclosing(log.read(start, **kw)) as reader:
            async for batch in reader:
                got.extend(
                    (s, Offset(a, b), v)
                    for s, a, b, v in zip(
                        batch.column(SPLIT_COLUMN).to_pylist(),
                        batch.column(OFFSET_MAJOR).to_pylist(),
                        batch.column(OFFSET_MINOR).to_pylist(),
                        batch.column("v").to_pylist(),
                        strict=True,
                    )
                )
                if len(got) >= rows:
                    return got
    return got


async def test_it_implements_the_split_log_protocol() -> None:
    log = log_with(a=[1, 2])
    assert isinstance(log, SplitLog)
    assert log.schema.names == ["v", SPLIT_COLUMN, OFFSET_MAJOR, OFFSET_MINOR]
    assert await log.list_splits() == ["a"]


async def test_a_read_starts_after_the_given_offset() -> None:
    log = log_with(a=[10, 20, 30], b=[40])
    assert await take(log, {"a": None}, 3) == [
        ("a", Offset(1), 10),
        ("a", Offset(2), 20),
        ("a", Offset(3), 30),
    ]
    assert await take(log, {"a": Offset(2), "b": None}, 2) == [
        ("a", Offset(3), 30),
        ("b", Offset(1), 40),
    ]


async def test_batches_hold_at_most_batch_rows_rows() -> None:
    log = log_with(a=list(range(10)))
    sizes = []
    with anyio.fail_after(scaled(5)):
        async with aclosing(log.read({"a": None}, batch_rows=4)) as reader:
            async for batch in reader:
                sizes.append(batch.num_rows)
                if sum(sizes) == 10:
                    break
    assert sizes == [4, 4, 2]


async def test_a_read_follows_records_appended_after_it_started() -> None:
    log = log_with(a=[1])
    got: list[int] = []
    with anyio.fail_after(scaled(5)):
        async with aclosing(log.read({"a": None})) as reader:
            async for batch in reader:
                got.extend(batch.column("v").to_pylist())
                if got == [1]:
                    log.append("a", {"v": [2, 3]})
                if len(got) == 3:
                    break
    assert got == [1, 2, 3]


async def test_latest_offset_is_the_last_record_or_none() -> None:
    log = MemorySplitLog(PAYLOAD, splits=["empty"])
    assert await log.latest_offset("empty") is None
    log.append("a", {"v": [1, 2]}, offsets=[Offset(9, 0), Offset(10, 0)])
    assert await log.latest_offset("a") == Offset(10, 0)  # numeric: 10-0 after 9-0
    log.delete("a", Offset(10, 0))
    assert await log.latest_offset("a") == Offset(9, 0)


async def test_an_unknown_split_is_refused_by_name() -> None:
    log = log_with(a=[1])
    with pytest.raises(UnknownSplitError) as unknown:
        await log.latest_offset("z")
    assert (unknown.value.split, unknown.value.known) == ("z", ["a"])
    with pytest.raises(UnknownSplitError):
        log.read({"z": None})


async def test_offsets_must_increase_within_a_split() -> None:
    log = log_with(a=[1, 2])
    with pytest.raises(OffsetOrderError) as order:
        log.append("a", {"v": [3]}, offsets=[Offset(2)])
    assert (order.value.split, order.value.previous, order.value.offset) == (
        "a",
        Offset(2),
        Offset(2),
    )


async def test_reading_below_trimmed_history_is_refused() -> None:
    log = log_with(a=[1, 2, 3])
    log.trim("a", Offset(2))
    assert log.records("a") == [Offset(3)]
    with pytest.raises(OffsetTrimmedError) as trimmed:
        log.read({"a": Offset(1)})
    assert (trimmed.value.split, trimmed.value.first) == ("a", Offset(2))
    assert await take(log, {"a": Offset(2)}, 1) == [("a", Offset(3), 3)]
    assert await take(log, {"a": None}, 1) == [("a", Offset(3), 3)]  # what is retained
