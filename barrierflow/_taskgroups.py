"""Surfacing one failure of a task group as itself.

anyio task groups raise an exception group even when a single child failed. Our public
coroutines promise typed errors (``BarrierMisalignedError``, ``ChannelBrokenError``), so where
exactly one exception escaped we re-raise that exception, not a group around it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    found: list[BaseException] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            found.extend(_leaves(exc))
        else:
            found.append(exc)
    return found


@contextmanager
def single_error() -> Iterator[None]:
    """Re-raise a group holding exactly one exception as that exception."""
    try:
        yield
    except BaseExceptionGroup as group:
        leaves = _leaves(group)
        if len(leaves) == 1:
            raise leaves[0] from None
        raise
