"""Public names that were removed: looking one up says what replaced it.

A program written against an earlier release that imports a removed name
(``from barrierflow.connectors import ParquetFileSink``) gets a :class:`RemovedNameError`
naming the release that removed it and its replacement, rather than Python's bare
``cannot import name``. :data:`REMOVED` lists them by the module that exported them, and each
of those modules sets its module-level ``__getattr__`` (PEP 562: consulted only for a name the
module does not have) to ``removed_names(__name__)``. ``CHANGELOG.md`` lists the same removals.
The error and the lookup are the channel layer's (:mod:`barrierflow.channels.errors`, which
also keeps that layer's own table, since the channels cannot import this module); the errors
the package root no longer re-exports are named by the root's ``__getattr__``
(:data:`ERRORS_LEFT_THE_ROOT`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from barrierflow.channels.errors import CHANNELS_REMOVED, Deprecated, Removed, removed_name_lookup
from barrierflow.channels.errors import RemovedNameError as RemovedNameError

__all__ = [
    "DEPRECATED",
    "ERRORS_LEFT_THE_ROOT",
    "REMOVED",
    "Deprecated",
    "Removed",
    "RemovedNameError",
    "removed_names",
]


_V010 = "0.1.0"
_V020 = "0.2.0"

#: The release from which the errors are exported from :mod:`barrierflow.errors` only: the
#: package root re-exported them before (its ``__getattr__`` names their home).
ERRORS_LEFT_THE_ROOT = _V020

_TABLE = "barrierflow.actors.Table, declared with barrierflow.actors.add_sink"
_COMMITTER = "barrierflow.actors.Committer"
_PENDING = "the mapping epoch -> CommitMetadata that barrierflow.actors.Committer.recover takes"
_SINK_CONNECTOR = (
    f"{_TABLE}: its barrierflow.actors.StagingWriter stages each epoch and its Committer commits it"
)
_PARQUET_TABLE = (
    "barrierflow.connectors.ParquetTable(path, schema), declared with barrierflow.actors.add_sink"
)
_SINK_PROTOCOL = {
    "PendingCommit": Removed(_V010, _PENDING),
    "SinkConnector": Removed(_V010, _SINK_CONNECTOR),
    "CommitCoordinator": Removed(_V010, _COMMITTER),
    "CoordinatedTable": Removed(_V010, _TABLE),
}


def _homes(home: str, *names: str) -> dict[str, Removed]:
    """``names``, exported from more than one place before 0.2.0, now from ``home`` only."""
    return {name: Removed(_V020, f"{home}.{name}") for name in names}


def _own(use: str) -> str:
    """A name that left the public surface in 0.2.0 (the library's own part now): ``use`` says
    what a user reaches instead."""
    return f"{use} (the name itself is the library's own now)"


_SINK_PARTS = _own("barrierflow.actors.add_sink, which declares a sink's writers and coordinator")
_SINK_RECORDS = _own("barrierflow.actors.Coordinator.stats() for what a sink committed")
_EPOCH_RECORDS = _own("barrierflow.actors.add_sink, whose coordinator keeps these records")
_BACKFILL_STATE = _own("barrierflow.runtime.JobHandle.progress() for a backfill's phase")
_PRIVATE_ACTORS: dict[str, Removed] = {
    **{
        name: Removed(_V020, _SINK_PARTS)
        for name in (
            "SinkTask",
            "SinkTaskHandle",
            "SinkTaskStats",
            "SinkWriter",
            "WriterHandle",
            "start_sink_task",
        )
    },
    **{
        name: Removed(_V020, _SINK_RECORDS)
        for name in ("SinkState", "SinkStateRecord", "SinkStates")
    },
    **{name: Removed(_V020, _BACKFILL_STATE) for name in ("BackfillPhase", "SplitBackfill")},
    "BatchSource": Removed(
        _V020, _own("barrierflow.actors.BatchFeed.source, a feed's source actor")
    ),
}
# (Not ``add_sink``: ``barrierflow.actors.sinks.add_sink`` is the module that defines it.)
_ACTORS_PUBLIC = (
    "AlreadyCommitted", "CommitMetadata", "CommitOutcome", "Committed", "Committer",
    "Coordinator", "CoordinatorStats", "DeclaredSink", "Failed", "Manifest", "RetryLater",
    "SchemaChange", "StagedFile", "StagingWriter", "Table",
)  # fmt: skip
_COMMITTERS = {
    name: Removed(
        _V020, _own(f"barrierflow.connectors.{table}.committer(), which makes the table's")
    )
    for name, table in (
        ("DeltaCommitter", "DeltaLakeTable"),
        ("IcebergCommitter", "IcebergTable"),
        ("ParquetCommitter", "ParquetTable"),
    )
}

#: Module → its removed public names. Keep it in step with ``CHANGELOG.md``.
REMOVED: Mapping[str, Mapping[str, Removed]] = {
    "barrierflow.channels": CHANNELS_REMOVED,
    "barrierflow.connectors": {
        "ParquetFileSink": Removed(_V010, _PARQUET_TABLE),
        **_COMMITTERS,
    },
    "barrierflow.actors": {
        **_SINK_PROTOCOL,
        "ParquetFileSink": Removed(_V010, _PARQUET_TABLE),
        **{
            name: Removed(_V010, f"barrierflow.connectors.{name}")
            for name in ("PrintSink", "open_local_catalog")
        },
        **{
            name: Removed(_V010, _COMMITTERS[name].replacement)
            for name in ("IcebergCommitter", "ParquetCommitter")
        },
        "IcebergSink": Removed(_V010, "barrierflow.connectors.IcebergTable"),
        **_PRIVATE_ACTORS,
    },
    "barrierflow.actors.sinks": {
        **_SINK_PROTOCOL,
        **_homes("barrierflow.actors", *_ACTORS_PUBLIC),
        **_PRIVATE_ACTORS,
    },
    "barrierflow.actors.sinks.coordinator": {
        "CommitCoordinator": Removed(_V010, _COMMITTER),
        "SchemaChange": Removed(_V010, "barrierflow.actors.SchemaChange"),
        **_homes("barrierflow.actors", "Coordinator", "CoordinatorStats"),
        **{
            name: _PRIVATE_ACTORS[name]
            for name in ("SinkState", "SinkStateRecord", "SinkStates", "WriterHandle")
        },
    },
    "barrierflow.actors.sources": {
        **_homes("barrierflow.actors", "BatchFeed", "BatchFeedStats", "Offset", "SplitLog"),
        **_homes("barrierflow.actors", "SplitSource"),
        "BatchSource": _PRIVATE_ACTORS["BatchSource"],
    },
    "barrierflow.actors.backfill": {
        **_homes("barrierflow.actors", "Materialize", "SnapshotBackfill", "SourceBackfill"),
        "BackfillPhase": _PRIVATE_ACTORS["BackfillPhase"],
        "SplitBackfill": _PRIVATE_ACTORS["SplitBackfill"],
    },
    "barrierflow.runtime": {
        **{
            name: Removed(_V010, f"barrierflow.runtime.barrier_manager.{name}")
            for name in ("BarrierManager", "InFlightBarrier")
        },
        **{
            name: Removed(_V010, _EPOCH_RECORDS)
            for name in ("EpochRecord", "EpochRecords", "RecordStatus")
        },
        **{
            name: Removed(_V010, _SINK_RECORDS)
            for name in ("SinkState", "SinkStateRecord", "SinkStates")
        },
        "CommittedEpochs": Removed(
            _V020,
            _own("barrierflow.runtime.Runtime.checkpoint(), which returns each committed epoch"),
        ),
        "PushSource": Removed(
            _V020, _own("barrierflow.runtime.Runtime.add_source, which declares one")
        ),
    },
    "barrierflow.runtime.state": {
        **{
            name: Removed(_V010, _SINK_RECORDS)
            for name in ("SinkState", "SinkStateRecord", "SinkStates")
        },
        **_homes("barrierflow.runtime", "StateStore", "StateTable"),
        **{
            name: Removed(_V020, _EPOCH_RECORDS)
            for name in ("EpochRecord", "EpochRecords", "RecordStatus")
        },
        "CommittedEpochs": Removed(
            _V020,
            _own("barrierflow.runtime.Runtime.checkpoint(), which returns each committed epoch"),
        ),
        "VersionedTable": Removed(
            _V020, _own("barrierflow.actors.Materialize, which keeps a view in one")
        ),
    },
    "barrierflow.spark_bridge": {
        "DEFAULT_MASTER": Removed(
            _V020, _own("barrierflow.spark_bridge.spark_session, whose default master it is")
        ),
        "require_spark": Removed(
            _V020,
            _own("barrierflow.spark_bridge.spark_session, which requires pyspark itself"),
        ),
        "unwrap_spark_error": Removed(
            _V020,
            _own(
                "barrierflow.errors.SparkQueryFailedError, a failed query with Spark's error "
                "as its cause"
            ),
        ),
    },
    "barrierflow.testing": {
        "ListSink": Removed(_V010, "barrierflow.testing.ListTable"),
        "FailingConnector": Removed(_V010, "barrierflow.testing.FailingTable"),
        "check_sink_connector": Removed(_V010, "barrierflow.testing.check_table"),
        **_homes(
            "barrierflow.errors",
            "ConformanceError",
            "InjectedFaultError",
            "ScriptedCrashError",
            "ScriptedFailureError",
        ),
        "Playback": Removed(_V020, _own("barrierflow.testing.play, which returns one")),
    },
    "barrierflow.app.chaos": {
        name: Removed(
            _V020,
            _own("the command `barrierflow chaos` (barrierflow.app.cli)"),
        )
        for name in ("ChaosConfig", "ChaosReport", "run_chaos")
    },
}


#: Module → its old names still served (the renames of ``CHANGELOG.md``); each is removed in
#: the release after :attr:`Deprecated.version`, and then belongs in :data:`REMOVED`.
DEPRECATED: Mapping[str, Mapping[str, Deprecated]] = {
    "barrierflow.connectors": {
        "IcebergSink": Deprecated(_V020, "IcebergTable"),
        "DeltaSink": Deprecated(_V020, "DeltaLakeTable"),
    },
}


def removed_names(module: str) -> Callable[[str], Any]:
    """The module-level ``__getattr__`` of ``module``, which no longer exports the names
    :data:`REMOVED` lists for it, and serves those :data:`DEPRECATED` lists under their old
    names (see :func:`~barrierflow.channels.errors.removed_name_lookup`)."""
    return removed_name_lookup(module, REMOVED.get(module, {}), DEPRECATED.get(module, {}))
