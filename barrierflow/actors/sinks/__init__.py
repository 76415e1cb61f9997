"""Sinks: the commit protocol (:mod:`.table`: writers stage manifests, a coordinator commits
them into a table), the connector protocol, the sink task that drives one connector, the sink
writer that feeds it from the stream, and the coordinator worker that commits across
writers."""

from barrierflow.actors.sinks.add_sink import DeclaredSink as DeclaredSink
from barrierflow.actors.sinks.add_sink import add_sink as add_sink
from barrierflow.actors.sinks.coordinator import Coordinator as Coordinator
from barrierflow.actors.sinks.coordinator import CoordinatorStats as CoordinatorStats
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
from barrierflow.actors.sinks.table import Committer as Committer
from barrierflow.actors.sinks.table import Manifest as Manifest
from barrierflow.actors.sinks.table import SchemaChange as SchemaChange
from barrierflow.actors.sinks.table import StagedFile as StagedFile
from barrierflow.actors.sinks.table import Table as Table

__all__ = [
    "Committer",
    "CommitMetadata",
    "DeclaredSink",
    "Manifest",
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
    "StagedFile",
    "Table",
    "WriterHandle",
    "add_sink",
    "start_sink_task",
]
