"""Errors of the source actors: batches out of order or aborted, a feed shared by two sources,
rows pushed past a feed.

Every public name is re-exported from :mod:`barrierflow.errors`.
"""

from __future__ import annotations

from typing import Literal, final

from barrierflow.channels.errors import InvalidArgumentError, ProtocolError

__all__ = [
    "BatchOrderError",
    "BatchAbortedError",
    "FeedSharedError",
    "FeedBypassedError",
    "OffsetOrderError",
    "OffsetTrimmedError",
    "UnknownSplitError",
]


class BatchOrderError(InvalidArgumentError):
    """A numbered batch id went backwards or skipped ahead of the last durable one.

    A replay of the last durable batch is not an error (it is skipped); anything else out of
    sequence would lose or duplicate rows, so it is refused before any row is delivered.
    (The Spark bridge raises its subclass
    :class:`~barrierflow.spark_bridge.errors.SparkCheckpointBehindError` for ids below the last
    durable one: Spark's own checkpoint went back.)

    Attributes:
        stream: the batch stream (a Spark query, a pump).
        last: the last durable batch id (``None``: nothing durable yet).
        batch_id: the id that arrived.
        expected_id: the id that would have been accepted (``last + 1``, or the feed's first
            batch id when nothing is durable yet).
        direction: ``"backwards"`` if ``batch_id`` is below ``expected_id`` (and is not the
            replay of ``last``), ``"ahead"`` if it skips past ``expected_id``.
    """

    def __init__(self, stream: str, last: int | None, batch_id: int, expected: int) -> None:
        self.stream = stream
        self.last = last
        self.batch_id = batch_id
        self.expected_id = expected
        self.direction: Literal["backwards", "ahead"] = (
            "backwards" if batch_id < expected else "ahead"
        )
        durable = (
            "no batch is durable yet"
            if last is None
            else f"the last durable batch is {last}; {last} itself is a replay and is skipped"
        )
        problem = "goes backwards" if self.direction == "backwards" else "skips ahead"
        super().__init__(
            f"batch id of stream {stream!r}",
            f"{expected} ({durable}) — this id {problem}",
            batch_id,
        )


@final
class BatchAbortedError(ProtocolError):
    """A batch was abandoned after some of its rows went downstream; the graph fails so that
    recovery discards them (they are not covered by a durable batch id)."""

    def __init__(self, stream: str, batch_id: int) -> None:
        self.stream = stream
        self.batch_id = batch_id
        super().__init__(
            f"batch {batch_id} of stream {stream!r} was abandoned part-way: expected its end "
            "mark after its rows"
        )


@final
class FeedSharedError(ProtocolError):
    """A second source actor attached to a :class:`~barrierflow.actors.BatchFeed` while
    the first one runs: a feed's batch ids are recorded by one source, so two would deliver and
    record each batch twice.

    Attributes:
        source: the source actor that tried to attach.
        attached: the source actor already attached.
    """

    def __init__(self, source: str, attached: str) -> None:
        self.source = source
        self.attached = attached
        super().__init__(
            f"batch source {source!r}: expected one `rt.add_source(name, feed.source)` per "
            f"BatchFeed (a feed feeds one source actor), got a second source while {attached!r} "
            "runs"
        )


@final
class FeedBypassedError(ProtocolError):
    """Rows were pushed into a batch source's inbox (``rt.push``) instead of delivered through
    its feed: they would carry no batch id, so they could be neither skipped nor replayed.

    Attributes:
        source: the batch source actor.
        rows: rows of the chunk that arrived.
    """

    def __init__(self, source: str, rows: int) -> None:
        self.source = source
        self.rows = rows
        super().__init__(
            f"batch source {source!r}: expected only barriers in its inbox (rows go through its "
            f"BatchFeed), got a chunk of {rows} rows"
        )


@final
class UnknownSplitError(InvalidArgumentError):
    """A split the log does not have.

    Attributes:
        split: the split asked for.
        known: the log's splits (as far as the log can tell; may be empty).
        hint: what to do about it, when the raiser knows (``""``: nothing to add).
    """

    def __init__(self, split: str, known: list[str], hint: str = "") -> None:
        expected = f"one of the log's splits {known}" + (f" ({hint})" if hint else "")
        super().__init__("split", expected, split)
        self.split = split
        self.known = known
        self.hint = hint


@final
class OffsetTrimmedError(ProtocolError):
    """A read would start below what the log still retains: the records in between were
    trimmed, and reading on would silently lose them.

    Attributes:
        split: the split.
        start: the offset the read was to start after.
        first: the first offset the log still has.
    """

    def __init__(self, split: str, start: object, first: object) -> None:
        super().__init__(
            f"split {split!r}: expected the log to retain the records after {start}, but its "
            f"first record is {first} (the history in between was trimmed)"
        )
        self.split = split
        self.start = start
        self.first = first


@final
class OffsetOrderError(ProtocolError):
    """A split's offsets went backwards or repeated: the log (or its reader) broke the order
    every reader relies on.

    Attributes:
        split: the split.
        previous: the last offset seen.
        offset: the offset that followed it.
    """

    def __init__(self, split: str, previous: object, offset: object) -> None:
        super().__init__(
            f"split {split!r}: expected offsets strictly increasing, got {offset} after {previous}"
        )
        self.split = split
        self.previous = previous
        self.offset = offset
