"""The one error hierarchy of barrierflow, gathered in one place.

Every error barrierflow raises derives from :class:`BarrierflowError`, split by cause the way
trio splits its own: the caller closed the resource, the peer went away, the input was bad,
or a peer broke the protocol. Constructors take structured fields and build the message, so
that a test asserts on fields and a user reads what was expected and what arrived.

Each error is defined beside the layer that raises it (``channels/errors.py``,
``runtime/errors.py``, ``runtime/state/errors.py``, ``actors/sinks/errors.py``,
``actors/sources/errors.py``, ``connectors/errors.py``, ``spark_bridge/errors.py``); this
module re-exports them all. Channel errors also derive from anyio's matching classes, so code
written against anyio streams catches them unchanged.
"""

from barrierflow.actors.backfill.errors import (
    NotAMaterializedViewError as NotAMaterializedViewError,
)
from barrierflow.actors.backfill.errors import (
    SnapshotBackfillStateError as SnapshotBackfillStateError,
)
from barrierflow.actors.backfill.errors import (
    UnfinishedSplitMigratedError as UnfinishedSplitMigratedError,
)
from barrierflow.actors.backfill.errors import (
    UpstreamEndedDuringBackfillError as UpstreamEndedDuringBackfillError,
)
from barrierflow.actors.backfill.errors import (
    UpstreamEndedDuringSourceBackfillError as UpstreamEndedDuringSourceBackfillError,
)
from barrierflow.actors.backfill.errors import (
    VnodeUpdateDuringBackfillError as VnodeUpdateDuringBackfillError,
)
from barrierflow.actors.sinks.errors import (
    CommittedEpochsEndedError as CommittedEpochsEndedError,
)
from barrierflow.actors.sinks.errors import CoordinatorAbortedError as CoordinatorAbortedError
from barrierflow.actors.sinks.errors import CoordinatorMissingError as CoordinatorMissingError
from barrierflow.actors.sinks.errors import DuplicateVnodeError as DuplicateVnodeError
from barrierflow.actors.sinks.errors import DuplicateWriterError as DuplicateWriterError
from barrierflow.actors.sinks.errors import EpochPoisonedError as EpochPoisonedError
from barrierflow.actors.sinks.errors import SchemaChangeMismatchError as SchemaChangeMismatchError
from barrierflow.actors.sinks.errors import SinkConnectorError as SinkConnectorError
from barrierflow.actors.sinks.errors import SinkEpochError as SinkEpochError
from barrierflow.actors.sinks.errors import SinkRecordsOrderError as SinkRecordsOrderError
from barrierflow.actors.sinks.errors import SinkRecoveryError as SinkRecoveryError
from barrierflow.actors.sinks.errors import SinkWriterInputError as SinkWriterInputError
from barrierflow.actors.sinks.errors import (
    UnexpectedWriterRequestError as UnexpectedWriterRequestError,
)
from barrierflow.actors.sources.errors import BatchAbortedError as BatchAbortedError
from barrierflow.actors.sources.errors import BatchOrderError as BatchOrderError
from barrierflow.actors.sources.errors import FeedBypassedError as FeedBypassedError
from barrierflow.actors.sources.errors import FeedSharedError as FeedSharedError
from barrierflow.actors.sources.errors import OffsetOrderError as OffsetOrderError
from barrierflow.actors.sources.errors import OffsetTrimmedError as OffsetTrimmedError
from barrierflow.actors.sources.errors import UnknownSplitError as UnknownSplitError
from barrierflow.channels.errors import BarrierflowError as BarrierflowError
from barrierflow.channels.errors import BarrierMisalignedError as BarrierMisalignedError
from barrierflow.channels.errors import ChannelBrokenError as ChannelBrokenError
from barrierflow.channels.errors import ChannelClosedError as ChannelClosedError
from barrierflow.channels.errors import ConfigError as ConfigError
from barrierflow.channels.errors import DroppedOutputRowsError as DroppedOutputRowsError
from barrierflow.channels.errors import EpochOrderError as EpochOrderError
from barrierflow.channels.errors import InvalidArgumentError as InvalidArgumentError
from barrierflow.channels.errors import ProtocolError as ProtocolError
from barrierflow.channels.errors import SchemaMismatchError as SchemaMismatchError
from barrierflow.channels.errors import UnknownInputError as UnknownInputError
from barrierflow.channels.errors import VnodeOwnershipError as VnodeOwnershipError
from barrierflow.channels.errors import (
    WatermarkTypeMismatchError as WatermarkTypeMismatchError,
)
from barrierflow.connectors.errors import SchemaEvolutionError as SchemaEvolutionError
from barrierflow.connectors.errors import SinkLockedError as SinkLockedError
from barrierflow.connectors.errors import SinkPathError as SinkPathError
from barrierflow.connectors.errors import SplitLogRecordError as SplitLogRecordError
from barrierflow.connectors.errors import SplitLogUnavailableError as SplitLogUnavailableError
from barrierflow.connectors.errors import StagedEpochMismatchError as StagedEpochMismatchError
from barrierflow.connectors.errors import StagedPathError as StagedPathError
from barrierflow.connectors.errors import TwoPhaseOnlyError as TwoPhaseOnlyError
from barrierflow.runtime.errors import ActorError as ActorError
from barrierflow.runtime.errors import ActorFailedError as ActorFailedError
from barrierflow.runtime.errors import ActorGoneError as ActorGoneError
from barrierflow.runtime.errors import BarrierCollectError as BarrierCollectError
from barrierflow.runtime.errors import BarrierNotPassedError as BarrierNotPassedError
from barrierflow.runtime.errors import BarrierStuckError as BarrierStuckError
from barrierflow.runtime.errors import DuplicateJobError as DuplicateJobError
from barrierflow.runtime.errors import GraphError as GraphError
from barrierflow.runtime.errors import JobDroppingError as JobDroppingError
from barrierflow.runtime.errors import JobError as JobError
from barrierflow.runtime.errors import JobNotDeclaredError as JobNotDeclaredError
from barrierflow.runtime.errors import KeyColumnError as KeyColumnError
from barrierflow.runtime.errors import NotAwaitedError as NotAwaitedError
from barrierflow.runtime.errors import NotRunningError as NotRunningError
from barrierflow.runtime.errors import PositionOverlapError as PositionOverlapError
from barrierflow.runtime.errors import SinkError as SinkError
from barrierflow.runtime.errors import SinkSchemaError as SinkSchemaError
from barrierflow.runtime.errors import SinkStateMismatchError as SinkStateMismatchError
from barrierflow.runtime.errors import UnknownJobError as UnknownJobError
from barrierflow.runtime.state.errors import ConcurrentCommitError as ConcurrentCommitError
from barrierflow.runtime.state.errors import EpochNotSealedError as EpochNotSealedError
from barrierflow.runtime.state.errors import StateStoreError as StateStoreError
from barrierflow.runtime.state.errors import StoreCorruptedError as StoreCorruptedError
from barrierflow.runtime.state.errors import StoreFormatError as StoreFormatError
from barrierflow.runtime.state.errors import StoreIOError as StoreIOError
from barrierflow.runtime.state.errors import StoreLockedError as StoreLockedError
from barrierflow.runtime.state.errors import StorePathError as StorePathError
from barrierflow.runtime.state.errors import StoreVersionError as StoreVersionError
from barrierflow.runtime.state.errors import VersionCompactedError as VersionCompactedError
from barrierflow.spark_bridge.errors import SparkQueryFailedError as SparkQueryFailedError
from barrierflow.spark_bridge.errors import SparkUnavailableError as SparkUnavailableError

__all__ = [
    "UnknownJobError",
    "JobNotDeclaredError",
    "JobError",
    "JobDroppingError",
    "DuplicateJobError",
    "UnknownInputError",
    "ActorError",
    "ActorFailedError",
    "ActorGoneError",
    "BarrierCollectError",
    "BarrierNotPassedError",
    "BarrierStuckError",
    "NotAwaitedError",
    "BarrierMisalignedError",
    "BarrierflowError",
    "BatchAbortedError",
    "BatchOrderError",
    "ChannelBrokenError",
    "ChannelClosedError",
    "ConcurrentCommitError",
    "EpochNotSealedError",
    "ConfigError",
    "CoordinatorAbortedError",
    "CoordinatorMissingError",
    "DroppedOutputRowsError",
    "DuplicateVnodeError",
    "DuplicateWriterError",
    "EpochOrderError",
    "EpochPoisonedError",
    "FeedBypassedError",
    "FeedSharedError",
    "OffsetOrderError",
    "OffsetTrimmedError",
    "UnknownSplitError",
    "GraphError",
    "KeyColumnError",
    "InvalidArgumentError",
    "NotRunningError",
    "PositionOverlapError",
    "ProtocolError",
    "SchemaChangeMismatchError",
    "SchemaEvolutionError",
    "SchemaMismatchError",
    "SinkConnectorError",
    "SinkEpochError",
    "SinkError",
    "SinkLockedError",
    "SinkPathError",
    "SinkRecordsOrderError",
    "SinkRecoveryError",
    "SinkStateMismatchError",
    "SinkSchemaError",
    "SinkWriterInputError",
    "SparkQueryFailedError",
    "SparkUnavailableError",
    "SplitLogRecordError",
    "SplitLogUnavailableError",
    "StagedEpochMismatchError",
    "StagedPathError",
    "StateStoreError",
    "StoreCorruptedError",
    "StoreFormatError",
    "StoreIOError",
    "StoreLockedError",
    "StorePathError",
    "StoreVersionError",
    "TwoPhaseOnlyError",
    "UnexpectedWriterRequestError",
    "NotAMaterializedViewError",
    "SnapshotBackfillStateError",
    "VnodeUpdateDuringBackfillError",
    "UnfinishedSplitMigratedError",
    "UpstreamEndedDuringBackfillError",
    "UpstreamEndedDuringSourceBackfillError",
    "CommittedEpochsEndedError",
    "VersionCompactedError",
    "VnodeOwnershipError",
    "WatermarkTypeMismatchError",
]
