"""The conformance suite of a split log (:class:`~barrierflow.actors.sources.split_log.
SplitLog`): what a live split source and a source backfill rely on, checked on a user's log.

``await check_split_reader(log, append, splits=(a, b))`` uses two splits the caller names —
both existing and empty (for Redis: ``XGROUP CREATE key g 0 MKSTREAM``) — which the suite
writes to with ``append(split, count)`` (appends ``count`` records, returns their offsets), and
checks, rule by rule:

* ``schema_has_split_columns`` — batches carry ``_split``, ``_offset_major``, ``_offset_minor``;
* ``empty_split_has_no_latest_offset`` — ``latest_offset`` of an empty split is ``None``;
* ``latest_offset_is_the_last_record`` — after appends, it is the last appended offset;
* ``read_from_none_starts_at_the_first_record`` — ``read({split: None})`` yields every record;
* ``read_after_an_offset_is_exclusive`` — ``read({split: o})`` starts with the record after
  ``o``, never ``o`` itself (the history of this rule has off-by-one bugs);
* ``offsets_increase_numerically`` — offsets of a split increase strictly as number pairs
  (``9-0`` < ``10-0``: 12 records are appended to show it);
* ``batches_respect_batch_rows`` — no batch holds more than ``batch_rows`` rows;
* ``a_reader_follows_new_records`` — a reader at the end yields records appended later;
* ``an_unknown_split_is_refused`` — reading or asking the latest offset of a split the log
  does not have raises :class:`~barrierflow.errors.UnknownSplitError`.

Returns a :class:`~barrierflow.testing.conformance.ConformanceReport`.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Sequence
from contextlib import aclosing
from typing import Any

import anyio
import pyarrow as pa

from barrierflow.actors.sources.errors import UnknownSplitError
from barrierflow.actors.sources.split_log import (
    OFFSET_MAJOR,
    OFFSET_MINOR,
    SPLIT_COLUMN,
    Offset,
    SplitLog,
)
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.testing.conformance import ConformanceReport, RuleResult

__all__ = ["check_split_reader"]

Append = Callable[[str, int], Awaitable[Sequence[Offset]] | Sequence[Offset]]


async def check_split_reader(
    log: SplitLog,
    append: Append,
    *,
    splits: tuple[str, str],
    wait_seconds: float = 10.0,
) -> ConformanceReport:
    """Check ``log`` against the split-log contract (see the module).

    Args:
        log: the log under test.
        append: appends ``count`` records to a split and returns their offsets.
        splits: two splits of the log, both empty.
        wait_seconds: how long a read may wait for records that should come.

    Raises:
        InvalidArgumentError: ``log`` is not a SplitLog, or ``splits`` not two names.
    """
    if not isinstance(log, SplitLog):
        raise InvalidArgumentError("log", "a SplitLog", type(log).__name__)
    if (
        not isinstance(splits, tuple)
        or len(splits) != 2
        or not all(isinstance(s, str) and s for s in splits)
    ):
        raise InvalidArgumentError("splits", "two split names", splits)
    report = ConformanceReport()
    first, second = splits

    def rule(name: str, passed: bool, detail: str = "") -> None:
        report.results.append(RuleResult(name, passed, "" if passed else detail))

    latest = await log.latest_offset(first)
    rule("empty_split_has_no_latest_offset", latest is None, f"got {latest}")
    written = list(await _call(append, first, 12))
    latest = await log.latest_offset(first)
    rule(
        "latest_offset_is_the_last_record",
        latest == written[-1],
        f"expected {written[-1]}, got {latest}",
    )
    batches = await _read(log, {first: None}, len(written), batch_rows=5, wait=wait_seconds)
    got = _offsets(batches)
    rule(
        "schema_has_split_columns",
        all({SPLIT_COLUMN, OFFSET_MAJOR, OFFSET_MINOR} <= set(b.schema.names) for b in batches),
        f"got columns {batches[0].schema.names if batches else []}",
    )
    rule(
        "read_from_none_starts_at_the_first_record",
        got == written,
        f"expected {_show(written)}, got {_show(got)}",
    )
    rule(
        "batches_respect_batch_rows",
        all(b.num_rows <= 5 for b in batches),
        f"batch sizes {[b.num_rows for b in batches]} for batch_rows=5",
    )
    ordered = all(a < b for a, b in itertools.pairwise(got))
    rule("offsets_increase_numerically", ordered, f"offsets in read order {_show(got)}")
    after = await _read(log, {first: written[3]}, len(written) - 4, wait=wait_seconds)
    rule(
        "read_after_an_offset_is_exclusive",
        _offsets(after) == written[4:],
        f"from after {written[3]}: expected {_show(written[4:])}, got {_show(_offsets(after))}",
    )
    more = await _follow(log, append, second, wait_seconds)
    rule("a_reader_follows_new_records", more[0] == more[1], f"appended {more[1]}, read {more[0]}")
    refused = await _refuses_unknown(log)
    rule("an_unknown_split_is_refused", refused == "", refused)
    return report


async def _call(append: Append, split: str, count: int) -> Sequence[Offset]:
    result = append(split, count)
    if isinstance(result, Awaitable):
        return await result
    return result


async def _read(
    log: SplitLog,
    start: dict[str, Offset | None],
    expected: int,
    *,
    batch_rows: int = 4096,
    wait: float,
) -> list[pa.RecordBatch]:
    """Batches of ``log.read(start)`` until ``expected`` rows came (or ``wait`` seconds)."""
    batches: list[pa.RecordBatch] = []
    with anyio.move_on_after(wait):
        async with aclosing(log.read(start, batch_rows=batch_rows)) as reader:  # type: ignore[type-var]
            async for batch in reader:
                if batch.num_rows:
                    batches.append(batch)
                if sum(b.num_rows for b in batches) >= expected:
                    break
    return batches


async def _follow(
    log: SplitLog, append: Append, split: str, wait: float
) -> tuple[list[Offset], list[Offset]]:
    """Start a reader on an empty split, append 3 records, return (read, appended)."""
    got: list[Offset] = []
    appended: list[Offset] = []
    with anyio.move_on_after(wait):
        async with aclosing(log.read({split: None})) as reader:  # type: ignore[type-var]
            appended = list(await _call(append, split, 3))
            async for batch in reader:
                got += _offsets([batch])
                if len(got) >= len(appended):
                    break
    return got, appended


async def _refuses_unknown(log: SplitLog) -> str:
    missing = "barrierflow-conformance-no-such-split"
    try:
        await log.latest_offset(missing)
        return "latest_offset of an unknown split returned"
    except UnknownSplitError:
        pass
    try:
        with anyio.fail_after(5):
            async with aclosing(log.read({missing: None})) as reader:  # type: ignore[type-var]
                async for _ in reader:
                    break
        return "read of an unknown split yielded"
    except UnknownSplitError:
        return ""
    except TimeoutError:
        return "read of an unknown split waited instead of refusing"


def _offsets(batches: list[pa.RecordBatch]) -> list[Offset]:
    found: list[Offset] = []
    for batch in batches:
        found += [
            Offset(int(a), int(b))
            for a, b in zip(
                batch.column(OFFSET_MAJOR).to_pylist(),
                batch.column(OFFSET_MINOR).to_pylist(),
                strict=True,
            )
        ]
    return found


def _show(offsets: Sequence[Any]) -> str:
    return "[" + ", ".join(str(o) for o in offsets) + "]"
