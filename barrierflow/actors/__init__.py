"""The actors, one subpackage per family: :mod:`.sinks` (sink task, sink writer, coordinator
worker), :mod:`.sources` (the batch feed, the split source) and :mod:`.backfill`. The systems
behind the sink protocol (Parquet, Iceberg, print) are in :mod:`barrierflow.connectors`.

This package is the one home of the families' public names (the subpackages export nothing):
declaring a sink (:func:`add_sink`), the table protocol a table implements (:class:`Table`,
:class:`StagingWriter`, :class:`Committer` and what they exchange, and the outcomes of a
commit), and the sources and backfills a graph declares."""

import typing as _typing

from barrierflow._removed import removed_names as _removed_names
from barrierflow.actors.backfill.materialize import Materialize as Materialize
from barrierflow.actors.backfill.snapshot_backfill import SnapshotBackfill as SnapshotBackfill
from barrierflow.actors.backfill.source_backfill import SourceBackfill as SourceBackfill
from barrierflow.actors.sinks.add_sink import DeclaredSink as DeclaredSink
from barrierflow.actors.sinks.add_sink import add_sink as add_sink
from barrierflow.actors.sinks.coordinator.coordinator import Coordinator as Coordinator
from barrierflow.actors.sinks.coordinator.stats import CoordinatorStats as CoordinatorStats
from barrierflow.actors.sinks.table import AlreadyCommitted as AlreadyCommitted
from barrierflow.actors.sinks.table import ColumnStats as ColumnStats
from barrierflow.actors.sinks.table import CommitMetadata as CommitMetadata
from barrierflow.actors.sinks.table import CommitOutcome as CommitOutcome
from barrierflow.actors.sinks.table import Committed as Committed
from barrierflow.actors.sinks.table import Committer as Committer
from barrierflow.actors.sinks.table import Failed as Failed
from barrierflow.actors.sinks.table import Manifest as Manifest
from barrierflow.actors.sinks.table import RetryLater as RetryLater
from barrierflow.actors.sinks.table import SchemaChange as SchemaChange
from barrierflow.actors.sinks.table import StagedFile as StagedFile
from barrierflow.actors.sinks.table import StagingWriter as StagingWriter
from barrierflow.actors.sinks.table import Table as Table
from barrierflow.actors.sources.batch_feed import BatchFeed as BatchFeed
from barrierflow.actors.sources.batch_feed import BatchFeedStats as BatchFeedStats
from barrierflow.actors.sources.split_log import Offset as Offset
from barrierflow.actors.sources.split_log import SplitLog as SplitLog
from barrierflow.actors.sources.split_source import SplitSource as SplitSource

__all__ = [
    "AlreadyCommitted",
    "BatchFeed",
    "BatchFeedStats",
    "ColumnStats",
    "CommitMetadata",
    "CommitOutcome",
    "Committed",
    "Committer",
    "Coordinator",
    "CoordinatorStats",
    "DeclaredSink",
    "Failed",
    "Manifest",
    "Materialize",
    "Offset",
    "RetryLater",
    "SchemaChange",
    "SnapshotBackfill",
    "SourceBackfill",
    "SplitLog",
    "SplitSource",
    "StagedFile",
    "StagingWriter",
    "Table",
    "add_sink",
]

if not _typing.TYPE_CHECKING:
    # A removed name says what replaced it (see CHANGELOG.md); a type checker does not see
    # this, so it still reports a removed or misspelt name as missing.
    __getattr__ = _removed_names(__name__)
