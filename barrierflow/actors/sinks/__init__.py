"""Sinks: the connector protocol, the sink task that drives one connector, the sink writer
that feeds it from the stream, and the coordinator worker that commits across writers."""

from barrierflow.actors.sinks.add_sink import CoordinatedTable as CoordinatedTable
from barrierflow.actors.sinks.add_sink import DeclaredSink as DeclaredSink
from barrierflow.actors.sinks.add_sink import add_sink as add_sink
from barrierflow.actors.sinks.coordinator import CommitCoordinator as CommitCoordinator
from barrierflow.actors.sinks.coordinator import Coordinator as Coordinator
from barrierflow.actors.sinks.coordinator import CoordinatorStats as CoordinatorStats
from barrierflow.actors.sinks.coordinator import SchemaChange as SchemaChange
from barrierflow.actors.sinks.coordinator import SinkState as SinkState
from barrierflow.actors.sinks.coordinator import SinkStateRecord as SinkStateRecord
from barrierflow.actors.sinks.coordinator import SinkStates as SinkStates
from barrierflow.actors.sinks.coordinator import WriterHandle as WriterHandle
from barrierflow.actors.sinks.protocol import CommitMetadata as CommitMetadata
from barrierflow.actors.sinks.protocol import PendingCommit as PendingCommit
from barrierflow.actors.sinks.protocol import SinkConnector as SinkConnector
from barrierflow.actors.sinks.sink_task import SinkTask as SinkTask
from barrierflow.actors.sinks.sink_task import SinkTaskHandle as SinkTaskHandle
from barrierflow.actors.sinks.sink_task import SinkTaskStats as SinkTaskStats
from barrierflow.actors.sinks.sink_task import start_sink_task as start_sink_task
from barrierflow.actors.sinks.sink_writer import SinkWriter as SinkWriter

__all__ = [
    "CommitCoordinator",
    "CommitMetadata",
    "CoordinatedTable",
    "DeclaredSink",
    "Coordinator",
    "CoordinatorStats",
    "PendingCommit",
    "SchemaChange",
    "SinkConnector",
    "SinkState",
    "SinkStateRecord",
    "SinkStates",
    "SinkTask",
    "SinkTaskHandle",
    "SinkTaskStats",
    "SinkWriter",
    "WriterHandle",
    "add_sink",
    "start_sink_task",
]
