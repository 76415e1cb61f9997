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


def single_leaf(exc: BaseException) -> BaseException:
    """``exc`` itself, or, if it is a group holding exactly one exception at any depth (a
    group of a group of one error), that exception; a group of several stays a group."""
    if isinstance(exc, BaseExceptionGroup):
        leaves = _leaves(exc)
        if len(leaves) == 1:
            return leaves[0]
    return exc


@contextmanager
def single_error() -> Iterator[None]:
    """Re-raise a group holding exactly one exception (at any depth) as that exception.

    The exception is re-raised as it was: its own ``__cause__``, ``__context__`` and traceback
    are kept (``raise leaf from None`` would drop the cause — often the one clue to what went
    wrong), and the group around it is not chained on.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        leaf = single_leaf(group)
        if leaf is group:
            raise
        cause, context = leaf.__cause__, leaf.__context__
        suppress = leaf.__suppress_context__
        try:
            raise leaf
        finally:
            # Raising inside this handler set the group as the leaf's context: undo that.
            leaf.__cause__, leaf.__context__ = cause, context
            leaf.__suppress_context__ = suppress
