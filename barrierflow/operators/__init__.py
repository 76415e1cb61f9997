"""Operators: the dataflow steps users expect, as actors whose nature the runtime knows.

Stateless and vectorized: ``map_batches``, ``filter_rows``. Many calls to an outside service
at once, results exactly once: ``async_map``. Keyed, with Arrow-native state by vnode kept as
a view: ``aggregate``, ``reduce``. Event time: ``with_watermark``, and ``window_aggregate``
over ``Tumbling`` or ``Sliding`` windows closed by watermarks. The fluent :class:`Stream`
declares them one step at a time; each factory returns an :class:`Operator`, which
``Runtime.add_actor`` takes like any actor factory.
"""

from barrierflow.operators._operator import Operator
from barrierflow.operators.aggregate import aggregate, reduce
from barrierflow.operators.async_map import async_map
from barrierflow.operators.stream import KeyedStream, Stream, WindowedStream
from barrierflow.operators.transform import changelog_rows, filter_rows, map_batches
from barrierflow.operators.watermarks import with_watermark
from barrierflow.operators.window import Sliding, Tumbling, window_aggregate

__all__ = [
    "KeyedStream",
    "Operator",
    "Sliding",
    "Stream",
    "Tumbling",
    "WindowedStream",
    "aggregate",
    "async_map",
    "changelog_rows",
    "filter_rows",
    "map_batches",
    "reduce",
    "window_aggregate",
    "with_watermark",
]
