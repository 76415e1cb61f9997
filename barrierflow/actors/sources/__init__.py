"""Sources: the batch feed that drivers such as the Spark bridge push numbered batches into
(the split-log protocol and the live split source come with the source backfill)."""

from barrierflow.actors.sources.batch_feed import BatchFeed as BatchFeed
from barrierflow.actors.sources.batch_feed import BatchFeedStats as BatchFeedStats
from barrierflow.actors.sources.batch_source import BatchSource as BatchSource

__all__ = ["BatchFeed", "BatchFeedStats", "BatchSource"]
