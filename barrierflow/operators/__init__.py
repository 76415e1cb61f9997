"""Operators: the dataflow steps users expect, as actors whose nature the runtime knows.

``map_batches`` and ``filter_rows`` (vectorized, stateless), and the fluent :class:`Stream` that
declares them one step at a time. Each factory returns an :class:`Operator`, which
``Runtime.add_actor`` takes like any actor factory.
"""

from barrierflow.operators._operator import Operator
from barrierflow.operators.stream import KeyedStream, Stream
from barrierflow.operators.transform import filter_rows, map_batches

__all__ = ["KeyedStream", "Operator", "Stream", "filter_rows", "map_batches"]
