"""Sinks: the commit protocol (:mod:`.table`: writers stage manifests, a coordinator commits
them into a table), the sink task that guards one staging writer, the sink writer actor that
feeds it from the stream, and the coordinator worker that commits each epoch once."""

from barrierflow.actors.sinks.add_sink import DeclaredSink as DeclaredSink
from barrierflow.actors.sinks.add_sink import add_sink as add_sink
from barrierflow.actors.sinks.coordinator import Coordinator as Coordinator
from barrierflow.actors.sinks.coordinator import CoordinatorStats as CoordinatorStats
from barrierflow.actors.sinks.coordinator import SinkState as SinkState
from barrierflow.actors.sinks.coordinator import SinkStateRecord as SinkStateRecord
from barrierflow.actors.sinks.coordinator import SinkStates as SinkStates
from barrierflow.actors.sinks.coordinator import WriterHandle as WriterHandle
from barrierflow.actors.sinks.sink_task import SinkTask as SinkTask
from barrierflow.actors.sinks.sink_task import SinkTaskHandle as SinkTaskHandle
from barrierflow.actors.sinks.sink_task import SinkTaskStats as SinkTaskStats
from barrierflow.actors.sinks.sink_task import start_sink_task as start_sink_task
from barrierflow.actors.sinks.sink_writer import SinkWriter as SinkWriter
from barrierflow.actors.sinks.table import CommitMetadata as CommitMetadata
from barrierflow.actors.sinks.table import Committer as Committer
from barrierflow.actors.sinks.table import Manifest as Manifest
from barrierflow.actors.sinks.table import SchemaChange as SchemaChange
from barrierflow.actors.sinks.table import StagedFile as StagedFile
from barrierflow.actors.sinks.table import StagingWriter as StagingWriter
from barrierflow.actors.sinks.table import Table as Table

__all__ = [
    "Committer",
    "CommitMetadata",
    "DeclaredSink",
    "Manifest",
    "Coordinator",
    "CoordinatorStats",
    "SchemaChange",
    "SinkState",
    "SinkStateRecord",
    "SinkStates",
    "SinkTask",
    "SinkTaskHandle",
    "SinkTaskStats",
    "SinkWriter",
    "StagedFile",
    "StagingWriter",
    "Table",
    "WriterHandle",
    "add_sink",
    "start_sink_task",
]
