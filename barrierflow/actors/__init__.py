"""The actors: the sink task and sink writer with their connectors (the coordinator and the
backfills come next)."""

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
    "CommitMetadata",
    "ParquetFileSink",
    "PendingCommit",
    "PrintSink",
    "SinkConnector",
    "SinkTask",
    "SinkTaskHandle",
    "SinkTaskStats",
    "SinkWriter",
    "start_sink_task",
]
