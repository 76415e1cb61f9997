"""Errors of the source actors: batches out of order or aborted, a feed shared by two sources,
rows pushed past a feed.

Every public name is re-exported from :mod:`barrierflow.errors`.
"""

from __future__ import annotations

from typing import final

from barrierflow.channels.errors import InvalidArgumentError, ProtocolError

__all__ = [
    "BatchOrderError",
    "BatchAbortedError",
    "FeedSharedError",
    "FeedBypassedError",
]


@final
class BatchOrderError(InvalidArgumentError):
    """A numbered batch id went backwards or skipped ahead of the last durable one.

    A replay of the last durable batch is not an error (it is skipped); anything else out of
    sequence would lose or duplicate rows, so it is refused before any row is delivered.

    Attributes:
        stream: the batch stream (a Spark query, a pump).
        last: the last durable batch id (``None``: nothing durable yet).
        batch_id: the id that arrived.
    """

    def __init__(self, stream: str, last: int | None, batch_id: int, expected: int) -> None:
        self.stream = stream
        self.last = last
        self.batch_id = batch_id
        problem = "goes backwards" if last is not None and batch_id < last else "skips ahead"
        super().__init__(
            f"batch id of stream {stream!r}",
            f"{expected} (the last durable batch is {last}; {last} itself is a replay and is "
            f"skipped) — this id {problem}",
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
    """A second source actor attached to a :class:`~barrierflow.actors.sources.BatchFeed` while
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
