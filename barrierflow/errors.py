"""The one error hierarchy of barrierflow, gathered in one place.

Every error barrierflow raises derives from :class:`BarrierflowError`, split by cause the way
trio splits its own: the caller closed the resource, the peer went away, the input was bad,
or a peer broke the protocol. Constructors take structured fields and build the message, so
that a test asserts on fields and a user reads what was expected and what arrived.

Each error is defined beside the layer that raises it (``channels/errors.py``,
``runtime/errors.py``, ``runtime/state/errors.py``, ``actors/sinks/errors.py``,
``actors/sources/errors.py``, ``connectors/errors.py``, ``spark_bridge/errors.py``, the test
kit's modules for its own, and ``_extras.py`` for a missing optional dependency); this module
re-exports them all, and is their one public home: import an error from here (the package root
no longer re-exports them, and a layer's ``errors`` module is where it is defined, not a place
to import it from). Channel errors also derive from anyio's matching classes, so code written
against anyio streams catches them unchanged.

The re-exports are lazy: importing this module imports none of the layers, and an error's
layer is imported when the error is first looked up here. So ``import barrierflow`` (whose
root re-exports these names) stays light, and ``import barrierflow.channels`` does not drag
in the runtime, the actors or a connector's optional package.

To add an error: define it in its layer's ``errors.py``, then add one line to
``_DEFINED_IN`` and one import to the ``TYPE_CHECKING`` block below (a test checks both).
"""

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from barrierflow._extras import MissingExtraError as MissingExtraError
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
    from barrierflow.actors.sinks.errors import PartitionCoverageError as PartitionCoverageError
    from barrierflow.actors.sinks.errors import PositionOverlapError as PositionOverlapError
    from barrierflow.actors.sinks.errors import (
        SchemaChangeMismatchError as SchemaChangeMismatchError,
    )
    from barrierflow.actors.sinks.errors import SinkConnectorError as SinkConnectorError
    from barrierflow.actors.sinks.errors import SinkEpochError as SinkEpochError
    from barrierflow.actors.sinks.errors import SinkError as SinkError
    from barrierflow.actors.sinks.errors import SinkRecordsOrderError as SinkRecordsOrderError
    from barrierflow.actors.sinks.errors import SinkRecoveryError as SinkRecoveryError
    from barrierflow.actors.sinks.errors import (
        SinkStateMismatchError as SinkStateMismatchError,
    )
    from barrierflow.actors.sinks.errors import SinkWriterInputError as SinkWriterInputError
    from barrierflow.actors.sinks.errors import StagedFilesGoneError as StagedFilesGoneError
    from barrierflow.actors.sinks.errors import TableCommitFailedError as TableCommitFailedError
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
    from barrierflow.channels.errors import RemovedNameError as RemovedNameError
    from barrierflow.channels.errors import SchemaMismatchError as SchemaMismatchError
    from barrierflow.channels.errors import UnknownInputError as UnknownInputError
    from barrierflow.channels.errors import VnodeOwnershipError as VnodeOwnershipError
    from barrierflow.channels.errors import WatermarkTypeMismatchError as WatermarkTypeMismatchError
    from barrierflow.connectors.errors import ExecutorStagingError as ExecutorStagingError
    from barrierflow.connectors.errors import (
        PostgresSchemaMismatchError as PostgresSchemaMismatchError,
    )
    from barrierflow.connectors.errors import PostgresUnavailableError as PostgresUnavailableError
    from barrierflow.connectors.errors import SchemaEvolutionError as SchemaEvolutionError
    from barrierflow.connectors.errors import SinkLockedError as SinkLockedError
    from barrierflow.connectors.errors import SinkPathError as SinkPathError
    from barrierflow.connectors.errors import SplitLogRecordError as SplitLogRecordError
    from barrierflow.connectors.errors import SplitLogUnavailableError as SplitLogUnavailableError
    from barrierflow.connectors.errors import StagedEpochMismatchError as StagedEpochMismatchError
    from barrierflow.connectors.errors import StagedPathError as StagedPathError
    from barrierflow.connectors.errors import (
        StateCommitConflictError as StateCommitConflictError,
    )
    from barrierflow.operators.errors import AsyncCallFailedError as AsyncCallFailedError
    from barrierflow.operators.errors import ChangelogInputError as ChangelogInputError
    from barrierflow.operators.errors import KeyedStateOrphanedError as KeyedStateOrphanedError
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
    from barrierflow.runtime.errors import MetricsPortError as MetricsPortError
    from barrierflow.runtime.errors import NotAwaitedError as NotAwaitedError
    from barrierflow.runtime.errors import NotRunningError as NotRunningError
    from barrierflow.runtime.errors import SinkSchemaError as SinkSchemaError
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
    from barrierflow.spark_bridge.errors import (
        ExecutorChainFailedError as ExecutorChainFailedError,
    )
    from barrierflow.spark_bridge.errors import ExecutorImportError as ExecutorImportError
    from barrierflow.spark_bridge.errors import (
        ExecutorPlacementError as ExecutorPlacementError,
    )
    from barrierflow.spark_bridge.errors import (
        SparkCheckpointBehindError as SparkCheckpointBehindError,
    )
    from barrierflow.spark_bridge.errors import SparkQueryFailedError as SparkQueryFailedError
    from barrierflow.spark_bridge.errors import SparkUnavailableError as SparkUnavailableError
    from barrierflow.testing.conformance import ConformanceError as ConformanceError
    from barrierflow.testing.scripted import ScriptedCrashError as ScriptedCrashError
    from barrierflow.testing.scripted import ScriptedFailureError as ScriptedFailureError
    from barrierflow.testing.sinks import InjectedFaultError as InjectedFaultError

#: Where each public error is defined: its module, by name. ``__getattr__`` imports the
#: module on first use; the ``TYPE_CHECKING`` imports above say the same to a type checker
#: (``tests/test_layout.py`` checks that the two agree).
_DEFINED_IN: dict[str, str] = {
    "MissingExtraError": "barrierflow._extras",
    "AsyncCallFailedError": "barrierflow.operators.errors",
    "ChangelogInputError": "barrierflow.operators.errors",
    "KeyedStateOrphanedError": "barrierflow.operators.errors",
    "RemovedNameError": "barrierflow.channels.errors",
    "NotAMaterializedViewError": "barrierflow.actors.backfill.errors",
    "SnapshotBackfillStateError": "barrierflow.actors.backfill.errors",
    "UnfinishedSplitMigratedError": "barrierflow.actors.backfill.errors",
    "UpstreamEndedDuringBackfillError": "barrierflow.actors.backfill.errors",
    "UpstreamEndedDuringSourceBackfillError": "barrierflow.actors.backfill.errors",
    "VnodeUpdateDuringBackfillError": "barrierflow.actors.backfill.errors",
    "CommittedEpochsEndedError": "barrierflow.actors.sinks.errors",
    "CoordinatorAbortedError": "barrierflow.actors.sinks.errors",
    "CoordinatorMissingError": "barrierflow.actors.sinks.errors",
    "DuplicateVnodeError": "barrierflow.actors.sinks.errors",
    "DuplicateWriterError": "barrierflow.actors.sinks.errors",
    "EpochPoisonedError": "barrierflow.actors.sinks.errors",
    "SchemaChangeMismatchError": "barrierflow.actors.sinks.errors",
    "SinkConnectorError": "barrierflow.actors.sinks.errors",
    "SinkEpochError": "barrierflow.actors.sinks.errors",
    "SinkRecordsOrderError": "barrierflow.actors.sinks.errors",
    "SinkRecoveryError": "barrierflow.actors.sinks.errors",
    "SinkWriterInputError": "barrierflow.actors.sinks.errors",
    "PartitionCoverageError": "barrierflow.actors.sinks.errors",
    "StagedFilesGoneError": "barrierflow.actors.sinks.errors",
    "TableCommitFailedError": "barrierflow.actors.sinks.errors",
    "ExecutorStagingError": "barrierflow.connectors.errors",
    "UnexpectedWriterRequestError": "barrierflow.actors.sinks.errors",
    "BatchAbortedError": "barrierflow.actors.sources.errors",
    "BatchOrderError": "barrierflow.actors.sources.errors",
    "FeedBypassedError": "barrierflow.actors.sources.errors",
    "FeedSharedError": "barrierflow.actors.sources.errors",
    "OffsetOrderError": "barrierflow.actors.sources.errors",
    "OffsetTrimmedError": "barrierflow.actors.sources.errors",
    "UnknownSplitError": "barrierflow.actors.sources.errors",
    "BarrierMisalignedError": "barrierflow.channels.errors",
    "BarrierflowError": "barrierflow.channels.errors",
    "ChannelBrokenError": "barrierflow.channels.errors",
    "ChannelClosedError": "barrierflow.channels.errors",
    "ConfigError": "barrierflow.channels.errors",
    "DroppedOutputRowsError": "barrierflow.channels.errors",
    "EpochOrderError": "barrierflow.channels.errors",
    "InvalidArgumentError": "barrierflow.channels.errors",
    "ProtocolError": "barrierflow.channels.errors",
    "SchemaMismatchError": "barrierflow.channels.errors",
    "UnknownInputError": "barrierflow.channels.errors",
    "VnodeOwnershipError": "barrierflow.channels.errors",
    "WatermarkTypeMismatchError": "barrierflow.channels.errors",
    "PostgresSchemaMismatchError": "barrierflow.connectors.errors",
    "PostgresUnavailableError": "barrierflow.connectors.errors",
    "SchemaEvolutionError": "barrierflow.connectors.errors",
    "SinkLockedError": "barrierflow.connectors.errors",
    "SinkPathError": "barrierflow.connectors.errors",
    "SplitLogRecordError": "barrierflow.connectors.errors",
    "SplitLogUnavailableError": "barrierflow.connectors.errors",
    "StagedEpochMismatchError": "barrierflow.connectors.errors",
    "StagedPathError": "barrierflow.connectors.errors",
    "StateCommitConflictError": "barrierflow.connectors.errors",
    "ActorError": "barrierflow.runtime.errors",
    "ActorFailedError": "barrierflow.runtime.errors",
    "ActorGoneError": "barrierflow.runtime.errors",
    "BarrierCollectError": "barrierflow.runtime.errors",
    "BarrierNotPassedError": "barrierflow.runtime.errors",
    "BarrierStuckError": "barrierflow.runtime.errors",
    "DuplicateJobError": "barrierflow.runtime.errors",
    "GraphError": "barrierflow.runtime.errors",
    "JobDroppingError": "barrierflow.runtime.errors",
    "JobError": "barrierflow.runtime.errors",
    "JobNotDeclaredError": "barrierflow.runtime.errors",
    "KeyColumnError": "barrierflow.runtime.errors",
    "MetricsPortError": "barrierflow.runtime.errors",
    "NotAwaitedError": "barrierflow.runtime.errors",
    "NotRunningError": "barrierflow.runtime.errors",
    "PositionOverlapError": "barrierflow.actors.sinks.errors",
    "SinkError": "barrierflow.actors.sinks.errors",
    "SinkSchemaError": "barrierflow.runtime.errors",
    "SinkStateMismatchError": "barrierflow.actors.sinks.errors",
    "UnknownJobError": "barrierflow.runtime.errors",
    "ConcurrentCommitError": "barrierflow.runtime.state.errors",
    "EpochNotSealedError": "barrierflow.runtime.state.errors",
    "StateStoreError": "barrierflow.runtime.state.errors",
    "StoreCorruptedError": "barrierflow.runtime.state.errors",
    "StoreFormatError": "barrierflow.runtime.state.errors",
    "StoreIOError": "barrierflow.runtime.state.errors",
    "StoreLockedError": "barrierflow.runtime.state.errors",
    "StorePathError": "barrierflow.runtime.state.errors",
    "StoreVersionError": "barrierflow.runtime.state.errors",
    "VersionCompactedError": "barrierflow.runtime.state.errors",
    "SparkQueryFailedError": "barrierflow.spark_bridge.errors",
    "ExecutorImportError": "barrierflow.spark_bridge.errors",
    "ExecutorChainFailedError": "barrierflow.spark_bridge.errors",
    "ExecutorPlacementError": "barrierflow.spark_bridge.errors",
    "SparkCheckpointBehindError": "barrierflow.spark_bridge.errors",
    "SparkUnavailableError": "barrierflow.spark_bridge.errors",
    "ConformanceError": "barrierflow.testing.conformance",
    "InjectedFaultError": "barrierflow.testing.sinks",
    "ScriptedCrashError": "barrierflow.testing.scripted",
    "ScriptedFailureError": "barrierflow.testing.scripted",
}

if not _typing.TYPE_CHECKING:
    # A type checker reads the names from the imports above (each ``X as X``) and sees no
    # ``__getattr__``, so that a misspelt error is still an error to it.
    __all__ = list(_DEFINED_IN)

    def __getattr__(name: str) -> object:
        """Import the error ``name`` from the module that defines it (first use only: it is
        cached in this module's namespace afterwards).

        Raises:
            RemovedNameError: ``name`` is an error that was removed (naming what replaced it).
            AttributeError: ``name`` is not a public error of barrierflow.
        """
        try:
            module = _DEFINED_IN[name]
        except KeyError:
            # A removed error says what replaced it (imported on a miss only: it is light).
            from barrierflow._removed import removed_names

            return removed_names(__name__)(name)
        value = getattr(_importlib.import_module(module), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})
