"""barrierflow: streaming dataflow for Python.

Actors talk over bounded channels, exchanging Arrow chunks and barriers that cut the stream
into epochs. Start with :mod:`barrierflow.channels`.
"""

from barrierflow.errors import ActorError as ActorError
from barrierflow.errors import ActorFailedError as ActorFailedError
from barrierflow.errors import ActorGoneError as ActorGoneError
from barrierflow.errors import BarrierflowError as BarrierflowError
from barrierflow.errors import BarrierMisalignedError as BarrierMisalignedError
from barrierflow.errors import BatchAbortedError as BatchAbortedError
from barrierflow.errors import BatchOrderError as BatchOrderError
from barrierflow.errors import ChannelBrokenError as ChannelBrokenError
from barrierflow.errors import ChannelClosedError as ChannelClosedError
from barrierflow.errors import ConcurrentCommitError as ConcurrentCommitError
from barrierflow.errors import ConfigError as ConfigError
from barrierflow.errors import CoordinatorAbortedError as CoordinatorAbortedError
from barrierflow.errors import CoordinatorMissingError as CoordinatorMissingError
from barrierflow.errors import DuplicateJobError as DuplicateJobError
from barrierflow.errors import DuplicateVnodeError as DuplicateVnodeError
from barrierflow.errors import DuplicateWriterError as DuplicateWriterError
from barrierflow.errors import EpochOrderError as EpochOrderError
from barrierflow.errors import EpochPoisonedError as EpochPoisonedError
from barrierflow.errors import FeedBypassedError as FeedBypassedError
from barrierflow.errors import FeedSharedError as FeedSharedError
from barrierflow.errors import GraphError as GraphError
from barrierflow.errors import InvalidArgumentError as InvalidArgumentError
from barrierflow.errors import JobDroppingError as JobDroppingError
from barrierflow.errors import JobError as JobError
from barrierflow.errors import JobNotDeclaredError as JobNotDeclaredError
from barrierflow.errors import NotRunningError as NotRunningError
from barrierflow.errors import PositionOverlapError as PositionOverlapError
from barrierflow.errors import ProtocolError as ProtocolError
from barrierflow.errors import SchemaChangeMismatchError as SchemaChangeMismatchError
from barrierflow.errors import SchemaEvolutionError as SchemaEvolutionError
from barrierflow.errors import SchemaMismatchError as SchemaMismatchError
from barrierflow.errors import SinkConnectorError as SinkConnectorError
from barrierflow.errors import SinkEpochError as SinkEpochError
from barrierflow.errors import SinkError as SinkError
from barrierflow.errors import SinkLockedError as SinkLockedError
from barrierflow.errors import SinkRecordsOrderError as SinkRecordsOrderError
from barrierflow.errors import SinkRecoveryError as SinkRecoveryError
from barrierflow.errors import SinkStateMismatchError as SinkStateMismatchError
from barrierflow.errors import SinkWriterInputError as SinkWriterInputError
from barrierflow.errors import SparkUnavailableError as SparkUnavailableError
from barrierflow.errors import StagedEpochMismatchError as StagedEpochMismatchError
from barrierflow.errors import StagedPathError as StagedPathError
from barrierflow.errors import StateStoreError as StateStoreError
from barrierflow.errors import StoreCorruptedError as StoreCorruptedError
from barrierflow.errors import StoreFormatError as StoreFormatError
from barrierflow.errors import StoreIOError as StoreIOError
from barrierflow.errors import StoreLockedError as StoreLockedError
from barrierflow.errors import StorePathError as StorePathError
from barrierflow.errors import StoreVersionError as StoreVersionError
from barrierflow.errors import TwoPhaseOnlyError as TwoPhaseOnlyError
from barrierflow.errors import UnexpectedWriterRequestError as UnexpectedWriterRequestError
from barrierflow.errors import UnknownInputError as UnknownInputError
from barrierflow.errors import UnknownJobError as UnknownJobError
from barrierflow.errors import VnodeOwnershipError as VnodeOwnershipError

__version__ = "0.1.0"

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
    "BarrierMisalignedError",
    "BarrierflowError",
    "BatchAbortedError",
    "BatchOrderError",
    "ChannelBrokenError",
    "ChannelClosedError",
    "ConcurrentCommitError",
    "ConfigError",
    "CoordinatorAbortedError",
    "CoordinatorMissingError",
    "DuplicateVnodeError",
    "DuplicateWriterError",
    "EpochOrderError",
    "EpochPoisonedError",
    "FeedBypassedError",
    "FeedSharedError",
    "GraphError",
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
    "SinkRecordsOrderError",
    "SinkRecoveryError",
    "SinkStateMismatchError",
    "SinkWriterInputError",
    "SparkUnavailableError",
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
    "VnodeOwnershipError",
    "__version__",
]
