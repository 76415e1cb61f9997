"""The actors, one subpackage per family: :mod:`.sinks` (sink task, sink writer, coordinator
worker), :mod:`.sources` (the batch feed, the split source) and :mod:`.backfill`. The systems
behind the sink protocol (Parquet, Iceberg, print) are in :mod:`barrierflow.connectors`."""

import typing as _typing

from barrierflow._removed import removed_names as _removed_names
from barrierflow.actors.backfill import BackfillPhase as BackfillPhase
from barrierflow.actors.backfill import Materialize as Materialize
from barrierflow.actors.backfill import SnapshotBackfill as SnapshotBackfill
from barrierflow.actors.backfill import SourceBackfill as SourceBackfill
from barrierflow.actors.backfill import SplitBackfill as SplitBackfill
from barrierflow.actors.sinks import CommitMetadata as CommitMetadata
from barrierflow.actors.sinks import Committer as Committer
from barrierflow.actors.sinks import Coordinator as Coordinator
from barrierflow.actors.sinks import CoordinatorStats as CoordinatorStats
from barrierflow.actors.sinks import DeclaredSink as DeclaredSink
from barrierflow.actors.sinks import Manifest as Manifest
from barrierflow.actors.sinks import SchemaChange as SchemaChange
from barrierflow.actors.sinks import SinkState as SinkState
from barrierflow.actors.sinks import SinkStateRecord as SinkStateRecord
from barrierflow.actors.sinks import SinkStates as SinkStates
from barrierflow.actors.sinks import SinkTask as SinkTask
from barrierflow.actors.sinks import SinkTaskHandle as SinkTaskHandle
from barrierflow.actors.sinks import SinkTaskStats as SinkTaskStats
from barrierflow.actors.sinks import SinkWriter as SinkWriter
from barrierflow.actors.sinks import StagedFile as StagedFile
from barrierflow.actors.sinks import StagingWriter as StagingWriter
from barrierflow.actors.sinks import Table as Table
from barrierflow.actors.sinks import WriterHandle as WriterHandle
from barrierflow.actors.sinks import add_sink as add_sink
from barrierflow.actors.sinks import start_sink_task as start_sink_task
from barrierflow.actors.sources import BatchFeed as BatchFeed
from barrierflow.actors.sources import BatchFeedStats as BatchFeedStats
from barrierflow.actors.sources import BatchSource as BatchSource
from barrierflow.actors.sources import Offset as Offset
from barrierflow.actors.sources import SplitLog as SplitLog
from barrierflow.actors.sources import SplitSource as SplitSource

__all__ = [
    "BackfillPhase",
    "BatchFeed",
    "BatchFeedStats",
    "BatchSource",
    "Committer",
    "CommitMetadata",
    "Coordinator",
    "CoordinatorStats",
    "DeclaredSink",
    "Manifest",
    "Materialize",
    "Offset",
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
    "SnapshotBackfill",
    "SourceBackfill",
    "SplitBackfill",
    "SplitLog",
    "SplitSource",
    "WriterHandle",
    "add_sink",
    "start_sink_task",
]

if not _typing.TYPE_CHECKING:
    # A removed name says what replaced it (see CHANGELOG.md); a type checker does not see
    # this, so it still reports a removed or misspelt name as missing.
    __getattr__ = _removed_names(__name__)
