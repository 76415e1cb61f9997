"""Sinks: the commit protocol (:mod:`.table`: writers stage manifests, a coordinator commits
them into a table), the sink task that guards one staging writer, the sink writer actor that
feeds it from the stream, and the coordinator worker that commits each epoch once."""

import typing as _typing

from barrierflow._removed import removed_names as _removed_names
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

if not _typing.TYPE_CHECKING:
    # A removed name says what replaced it (see CHANGELOG.md); a type checker does not see
    # this, so it still reports a removed or misspelt name as missing.
    __getattr__ = _removed_names(__name__)
