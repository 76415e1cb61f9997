"""Public names that were removed: looking one up says what replaced it.

A program written against an earlier release that imports a removed name
(``from barrierflow.connectors import ParquetFileSink``) gets a :class:`RemovedNameError`
naming the release that removed it and its replacement, rather than Python's bare
``cannot import name``. :data:`REMOVED` lists them by the module that exported them, and each
of those modules sets its module-level ``__getattr__`` (PEP 562: consulted only for a name the
module does not have) to ``removed_names(__name__)``. ``CHANGELOG.md`` lists the same removals.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, final

from barrierflow.channels.errors import BarrierflowError

__all__ = ["DEPRECATED", "REMOVED", "Deprecated", "Removed", "RemovedNameError", "removed_names"]


@final
class RemovedNameError(BarrierflowError, ImportError):
    """A public name that was removed was looked up.

    An ``ImportError``, so that ``from module import Name`` shows this message (an
    ``AttributeError`` raised by a module's ``__getattr__`` would be replaced by Python's
    ``cannot import name``), and code guarding an import the usual way still catches it.

    Attributes:
        module: the module the name was looked up in (``"barrierflow.connectors"``).
        removed: the name (``"ParquetFileSink"``).
        version: the release that removed it (``"0.1.0"``).
        replacement: what to use instead, as the message says it.
    """

    def __init__(self, module: str, removed: str, version: str, replacement: str) -> None:
        self.module = module
        self.removed = removed
        self.version = version
        self.replacement = replacement
        super().__init__(
            f"{module}.{removed} was removed in {version}; use {replacement} (see CHANGELOG.md)",
            name=module,
        )


@dataclass(frozen=True, slots=True)
class Removed:
    """A removed name's release and replacement (one entry of a module's table)."""

    #: The release that removed it.
    version: str
    #: What to use instead, in words a reader can act on: a name and where to import it from,
    #: or what to do when nothing replaces it.
    replacement: str


_V010 = "0.1.0"
_TABLE = "barrierflow.actors.sinks.Table, declared with barrierflow.actors.add_sink"
_COMMITTER = "barrierflow.actors.sinks.Committer"
_PENDING = (
    "the mapping epoch -> CommitMetadata that barrierflow.actors.sinks.Committer.recover takes"
)
_SINK_CONNECTOR = (
    f"{_TABLE}: its barrierflow.actors.sinks.StagingWriter stages each epoch and its "
    "Committer commits it"
)
_PARQUET_TABLE = (
    "barrierflow.connectors.ParquetTable(path, schema), declared with barrierflow.actors.add_sink"
)
_SINK_STATES = {
    name: Removed(_V010, f"barrierflow.actors.sinks.{name}")
    for name in ("SinkState", "SinkStateRecord", "SinkStates")
}
_SINK_PROTOCOL = {
    "PendingCommit": Removed(_V010, _PENDING),
    "SinkConnector": Removed(_V010, _SINK_CONNECTOR),
    "CommitCoordinator": Removed(_V010, _COMMITTER),
    "CoordinatedTable": Removed(_V010, _TABLE),
}

#: Module → its removed public names. Keep it in step with ``CHANGELOG.md``.
_V020 = "0.2.0"

_STAGED_IN_THE_STREAM = (
    "barrierflow.errors.StagedFilesGoneError (files staged on Spark executors travel to their "
    "sink in the stream as a barrierflow.channels.Committable, in the epoch that commits them: "
    "no hand-over can be stale or missing)"
)

REMOVED: Mapping[str, Mapping[str, Removed]] = {
    "barrierflow.errors": {
        "StaleStagingError": Removed(_V020, _STAGED_IN_THE_STREAM),
        "StagedBatchMissingError": Removed(_V020, _STAGED_IN_THE_STREAM),
    },
    "barrierflow.connectors": {"ParquetFileSink": Removed(_V010, _PARQUET_TABLE)},
    "barrierflow.actors": {
        **_SINK_PROTOCOL,
        "ParquetFileSink": Removed(_V010, _PARQUET_TABLE),
        **{
            name: Removed(_V010, f"barrierflow.connectors.{name}")
            for name in (
                "IcebergCommitter",
                "ParquetCommitter",
                "PrintSink",
                "open_local_catalog",
            )
        },
        "IcebergSink": Removed(_V010, "barrierflow.connectors.IcebergTable"),
    },
    "barrierflow.actors.sinks": _SINK_PROTOCOL,
    "barrierflow.actors.sinks.coordinator": {
        "CommitCoordinator": Removed(_V010, _COMMITTER),
        "SchemaChange": Removed(_V010, "barrierflow.actors.sinks.SchemaChange"),
    },
    "barrierflow.runtime": {
        **{
            name: Removed(_V010, f"barrierflow.runtime.barrier_manager.{name}")
            for name in ("BarrierManager", "InFlightBarrier")
        },
        **{
            name: Removed(_V010, f"barrierflow.runtime.state.{name}")
            for name in ("EpochRecord", "EpochRecords", "RecordStatus")
        },
        **_SINK_STATES,
    },
    "barrierflow.runtime.state": _SINK_STATES,
    "barrierflow.testing": {
        "ListSink": Removed(_V010, "barrierflow.testing.ListTable"),
        "FailingConnector": Removed(_V010, "barrierflow.testing.FailingTable"),
        "check_sink_connector": Removed(_V010, "barrierflow.testing.check_table"),
    },
}


@dataclass(frozen=True, slots=True)
class Deprecated:
    """A renamed public name, still served for one release under its old name with a
    ``DeprecationWarning`` naming the new one."""

    #: The release that renamed it.
    version: str
    #: Its new name, in the same module.
    new: str



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
    names.

    Returns:
        A function Python calls only for a name the module does not have: it returns a
        deprecated name's new object with a ``DeprecationWarning``, raises
        :class:`RemovedNameError` for a removed name, and ``AttributeError`` for any other
        (as a module without ``__getattr__`` would).
    """
    table = REMOVED.get(module, {})
    renamed = DEPRECATED.get(module, {})

    def lookup(name: str) -> Any:
        old = renamed.get(name)
        if old is not None:
            warnings.warn(
                f"{module}.{name} is deprecated since {old.version}: use {module}.{old.new} "
                "(the old name goes in the next release)",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(sys.modules[module], old.new)
        entry = table.get(name)
        if entry is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        raise RemovedNameError(module, name, entry.version, entry.replacement)

    return lookup
