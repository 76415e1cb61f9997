"""The actors: the sink task, the sink writer and the coordinator worker, with their
connectors, and the batch source that drivers such as the Spark bridge feed (the backfills
come next)."""

from barrierflow.actors.batch_source import BatchFeed as BatchFeed
from barrierflow.actors.batch_source import BatchFeedStats as BatchFeedStats
from barrierflow.actors.batch_source import BatchSource as BatchSource
from barrierflow.actors.coordinator import CommitCoordinator as CommitCoordinator
from barrierflow.actors.coordinator import Coordinator as Coordinator
from barrierflow.actors.coordinator import CoordinatorStats as CoordinatorStats
from barrierflow.actors.coordinator import SchemaChange as SchemaChange
from barrierflow.actors.coordinator import WriterHandle as WriterHandle
from barrierflow.actors.iceberg_sink import IcebergCommitter as IcebergCommitter
from barrierflow.actors.iceberg_sink import IcebergSink as IcebergSink
from barrierflow.actors.iceberg_sink import open_local_catalog as open_local_catalog
from barrierflow.actors.parquet_committer import ParquetCommitter as ParquetCommitter
from barrierflow.actors.parquet_sink import ParquetFileSink as ParquetFileSink
from barrierflow.actors.print_sink import PrintSink as PrintSink
from barrierflow.actors.sink import CommitMetadata as CommitMetadata
from barrierflow.actors.sink import PendingCommit as PendingCommit
from barrierflow.actors.sink import SinkConnector as SinkConnector
from barrierflow.actors.sink_task import SinkTask as SinkTask
from barrierflow.actors.sink_task import SinkTaskHandle as SinkTaskHandle
from barrierflow.actors.sink_task import SinkTaskStats as SinkTaskStats
from barrierflow.actors.sink_task import start_sink_task as start_sink_task
from barrierflow.actors.sink_writer import SinkWriter as SinkWriter

__all__ = [
    "BatchFeed",
    "BatchFeedStats",
    "BatchSource",
    "CommitCoordinator",
    "CommitMetadata",
    "Coordinator",
    "CoordinatorStats",
    "IcebergCommitter",
    "IcebergSink",
    "ParquetCommitter",
    "ParquetFileSink",
    "PendingCommit",
    "PrintSink",
    "SchemaChange",
    "SinkConnector",
    "SinkTask",
    "SinkTaskHandle",
    "SinkTaskStats",
    "SinkWriter",
    "WriterHandle",
    "open_local_catalog",
    "start_sink_task",
]
