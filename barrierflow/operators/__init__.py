"""Operators: the dataflow steps users expect, as actors whose nature the runtime knows.

Stateless and vectorized: ``map_batches``, ``filter_rows``. Keyed, with Arrow-native state
by vnode kept as a view: ``aggregate``, ``reduce``. The fluent :class:`Stream` declares them
one step at a time; each factory returns an :class:`Operator`, which ``Runtime.add_actor``
takes like any actor factory.
"""

from barrierflow.operators._operator import Operator
from barrierflow.operators.aggregate import aggregate, reduce
from barrierflow.operators.stream import KeyedStream, Stream
from barrierflow.operators.transform import filter_rows, map_batches

__all__ = [
    "KeyedStream",
    "Operator",
    "Stream",
    "aggregate",
    "filter_rows",
    "map_batches",
    "reduce",
]
