"""Sources: the batch feed that drivers such as the Spark bridge push numbered batches into
and the live split source (:class:`SplitSource`) that reads a split log (:class:`SplitLog`, a
partitioned log addressed by :class:`Offset`)."""

from barrierflow.actors.sources.batch_feed import BatchFeed as BatchFeed
from barrierflow.actors.sources.batch_feed import BatchFeedStats as BatchFeedStats
from barrierflow.actors.sources.batch_source import BatchSource as BatchSource
from barrierflow.actors.sources.split_log import Offset as Offset
from barrierflow.actors.sources.split_log import SplitLog as SplitLog
from barrierflow.actors.sources.split_source import SplitSource as SplitSource

__all__ = ["BatchFeed", "BatchFeedStats", "BatchSource", "Offset", "SplitLog", "SplitSource"]
