"""Source positions on the sink side: deciding, at commit, whether an epoch's rows are in
the table already.

The runtime carries positions (:mod:`barrierflow.runtime.positions`: sources report them
with their barriers, writers read them at a checkpoint barrier and put them in their
manifests); what a sink makes of them is decided here, by the committers, in the same atomic
commit as the rows.
"""

from __future__ import annotations

from typing import Any

import anyio.lowlevel

from barrierflow.actors.sinks.errors import PositionOverlapError
from barrierflow.actors.sinks.table import HoldsCommits, SinkCommits
from barrierflow.runtime.positions import SourcePositions

__all__ = ["epoch_already_held", "table_commits"]


async def table_commits(committer: Any) -> SinkCommits | None:
    """What a table holds, as its committer tells (:class:`~.table.HoldsCommits`, optional: a
    committer that cannot tell, or holds nothing yet, gives ``None``). Asked on an empty
    state store, through the sink writer, and passed on by the committers that wrap another."""
    if not isinstance(committer, HoldsCommits):
        await anyio.lowlevel.checkpoint()
        return None
    return await committer.sink_commits()


def epoch_already_held(
    sink: str,
    epoch: int,
    held: SourcePositions,
    start: SourcePositions,
    end: SourcePositions,
) -> bool:
    """Whether the rows of ``epoch`` — batches after ``start`` up to ``end``, per key — are all
    already in a sink whose last commit recorded ``held``.

    ``True`` means the epoch is a replay of committed rows (the runtime's store went back in
    time and the upstream delivered them again): the sink skips its commit. ``False`` means
    every batch of the epoch is new. An epoch without positions is never held.

    Raises:
        PositionOverlapError: some of the epoch's batches are held and others are not, so
            neither committing nor skipping it is exact.
    """
    held_parts: list[str] = []
    new_parts: list[str] = []
    for key, last in end.items():
        first = start.get(key, -1)
        if last <= first:
            continue  # no batch of this key in the epoch
        have = held.get(key, -1)
        if last <= have:
            held_parts.append(key)
        elif first >= have:
            new_parts.append(key)
        else:
            raise PositionOverlapError(sink, epoch, key, first + 1, last, have)
    if held_parts and new_parts:
        key = held_parts[0]
        raise PositionOverlapError(
            sink, epoch, key, start.get(key, -1) + 1, end[key], held.get(key, -1)
        )
    return bool(held_parts)
