"""Where a :class:`~barrierflow.actors.sources.split_source.SplitSource` is in each of its
splits: the start of an assigned split, and the last offset a batch reaches per split.

A source's position in a split is the offset of the last record it emitted (or the offset to
start after); ``None`` means the split's first record. Positions come from two places: an
assignment (:func:`check_splits` for the constructor's ``splits=``, :func:`start_of` for a
:class:`~barrierflow.channels.mutation.Split` — ``Split.offset`` ``n`` starts after
``Offset(n)``), and the batches emitted (:func:`~.split_log.split_ends`, vectorized so that
a batch costs one loop per split, not per row). They live apart from the actor, which only
stores and applies them (rules 1, 2, 3 and 5 of :mod:`~barrierflow.actors.sources.split_source`).
"""

from __future__ import annotations

from barrierflow.actors.sources.split_log import Offset
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.channels.mutation import Split

__all__ = ["Positions", "check_splits", "start_of"]

#: Where each assigned split is: the last offset emitted (or to start after); ``None``: the
#: first record.
Positions = dict[str, Offset | None]


def check_splits(splits: object) -> tuple[Split, ...]:
    """The constructor's ``splits`` as Splits.

    Raises:
        InvalidArgumentError: not a list or tuple of distinct names or Splits.
    """
    if not isinstance(splits, list | tuple):
        raise InvalidArgumentError("splits", "None or a list or tuple of split names", splits)
    checked: list[Split] = []
    for split in splits:
        if isinstance(split, str) and split:
            checked.append(Split(split))
        elif isinstance(split, Split):
            checked.append(split)
        else:
            raise InvalidArgumentError("splits", "non-empty split names or Splits", split)
    names = [s.split_id for s in checked]
    if len(set(names)) != len(names):
        raise InvalidArgumentError("splits", "distinct splits", names)
    return tuple(checked)


def start_of(split: Split) -> Offset | None:
    """Where a split assigned by a mutation starts: after ``Offset(n)``, or its first record."""
    return None if split.offset is None or split.offset < 0 else Offset(split.offset)
