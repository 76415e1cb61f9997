"""Errors of the operators.

Every public name is re-exported from :mod:`barrierflow.errors`.
"""

from __future__ import annotations

from typing import final

from barrierflow.channels.errors import BarrierflowError, InvalidArgumentError

__all__ = ["AsyncCallFailedError", "ChangelogInputError", "KeyedStateOrphanedError"]


@final
class ChangelogInputError(InvalidArgumentError):
    """An operator was given a changelog it cannot keep correct: a map that changes the number
    of rows of a chunk with deletes or updates (which output row would retract which?), or an
    aggregate whose functions cannot take a retraction back.

    Attributes:
        actor: the operator's actor.
        operator: its kind (``"map_batches"``, ``"aggregate"``, ...).
        what: what it was given.
    """

    def __init__(self, actor: str, operator: str, expected: str, what: str) -> None:
        super().__init__(f"{operator} {actor!r}: input", expected, what)
        self.actor = actor
        self.operator = operator
        self.what = what


@final
class AsyncCallFailedError(BarrierflowError):
    """An ``async_map`` call failed on every attempt (it raised or timed out), and the operator
    has no dead-letter output to send the row to.

    Attributes:
        actor: the operator's actor.
        key: the row's key (its ``key`` columns, or its position in the chunk without a key).
        attempts: the calls made.
        cause: the last attempt's exception (a ``TimeoutError`` for a timeout).
    """

    def __init__(self, actor: str, key: object, attempts: int, cause: BaseException) -> None:
        super().__init__(
            f"async_map {actor!r}: the call for row {key!r} failed {attempts} time(s); last: "
            f"{type(cause).__name__}: {cause}"
        )
        self.actor = actor
        self.key = key
        self.attempts = attempts
        self.cause = cause


@final
class KeyedStateOrphanedError(BarrierflowError):
    """A keyed operator restarted with fewer instances than its state was written by: rows of
    some vnodes live in the table of an instance that is no longer in the group, which nobody
    reads (refused, rather than starting those keys from nothing).

    Restart with the earlier parallelism (or more), or rescale live (an ``Update`` of the
    vnode bitmaps moves the rows) before lowering it.

    Attributes:
        actor: the instance that found it.
        owner: the instance that is gone, whose table holds the rows.
        vnodes: the vnodes it holds rows of.
        group: the group's instances now.
    """

    def __init__(
        self, actor: str, owner: str, vnodes: tuple[int, ...], group: tuple[str, ...]
    ) -> None:
        shown = list(vnodes) if len(vnodes) <= 8 else [*vnodes[:6], "...", vnodes[-1]]
        super().__init__(
            f"keyed state of {actor!r}: {owner!r} holds the rows of {len(vnodes)} vnode(s) "
            f"{shown}, and is not in the group {list(group)} any more; restart with its "
            f"parallelism, or move its vnodes live first"
        )
        self.actor = actor
        self.owner = owner
        self.vnodes = vnodes
        self.group = group
