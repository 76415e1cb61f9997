"""The coordinator worker of a sink: exactly-once commits across its parallel writers.

One module per idea: :mod:`.handles` (what writers hold and send), :mod:`.coverage` (rounds
that collect requests until every vnode is covered), :mod:`.commit_queue` (two-phase commits
waiting for durability, retried with backoff), :mod:`.recovery` (the records found at a
restart), :mod:`.meta_store` (those records, persisted) and :mod:`.coordinator` (the service).
"""

from barrierflow.actors.sinks.coordinator.committer import CommitCoordinator as CommitCoordinator
from barrierflow.actors.sinks.coordinator.committer import SchemaChange as SchemaChange
from barrierflow.actors.sinks.coordinator.coordinator import Coordinator as Coordinator
from barrierflow.actors.sinks.coordinator.handles import WriterHandle as WriterHandle
from barrierflow.actors.sinks.coordinator.meta_store import SinkState as SinkState
from barrierflow.actors.sinks.coordinator.meta_store import SinkStateRecord as SinkStateRecord
from barrierflow.actors.sinks.coordinator.meta_store import SinkStates as SinkStates
from barrierflow.actors.sinks.coordinator.stats import CoordinatorStats as CoordinatorStats

__all__ = [
    "CommitCoordinator",
    "Coordinator",
    "CoordinatorStats",
    "SchemaChange",
    "SinkState",
    "SinkStateRecord",
    "SinkStates",
    "WriterHandle",
]
