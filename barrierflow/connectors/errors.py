"""Errors of the connectors (the systems behind the sink and split log protocols).

Every public name is re-exported from :mod:`barrierflow.errors`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, final

from barrierflow.actors.sinks.errors import SinkError
from barrierflow.channels.errors import ChannelBrokenError, InvalidArgumentError, ProtocolError

__all__ = [
    "ExecutorStagingError",
    "PostgresSchemaMismatchError",
    "PostgresUnavailableError",
    "SchemaEvolutionError",
    "SinkLockedError",
    "SinkPathError",
    "SplitLogRecordError",
    "SplitLogUnavailableError",
    "StagedEpochMismatchError",
    "StagedPathError",
    "StateCommitConflictError",
]


@final
class SinkLockedError(SinkError):
    """A sink's table directory (or an Iceberg table's staging area) is held by another writer
    group — another process, or another sink of this one.

    Attributes:
        sink: the sink (its path).
        holder: who holds it, as far as known (``"another process"``, a writer group).
    """

    def __init__(self, sink: str, holder: str) -> None:
        self.sink = sink
        self.holder = holder
        super().__init__(
            f"sink {sink!r}: expected to be its only writer group, but {holder} holds its lock; "
            "stop it first or write to another location"
        )


@final
class StagedEpochMismatchError(ProtocolError):
    """The writers of one epoch staged their files under different sink epochs.

    Attributes:
        sink: the sink (its table or path).
        epoch: the checkpoint epoch being pre-committed.
        staged: the sink epochs the writers reported, sorted as text.
    """

    def __init__(self, sink: str, epoch: int, staged: Iterable[Any]) -> None:
        self.sink = sink
        self.epoch = epoch
        self.staged = tuple(sorted(map(str, staged)))
        super().__init__(
            f"sink {sink!r}: expected every writer to stage one sink epoch for epoch {epoch}, "
            f"got {list(self.staged)}"
        )


@final
class SchemaEvolutionError(ProtocolError):
    """A schema change reached a sink whose files cannot evolve (Parquet).

    Attributes:
        sink: the sink (its path).
        epoch: the epoch that carried the change.
        change: the schema change.
    """

    def __init__(self, sink: str, epoch: int, change: Mapping[str, Any]) -> None:
        self.sink = sink
        self.epoch = epoch
        self.change = dict(change)
        super().__init__(
            f"sink {sink!r}: expected no schema change (Parquet files cannot evolve), got "
            f"{self.change!r} at epoch {epoch}"
        )


@final
class StagedPathError(ProtocolError):
    """Commit metadata named a file outside the sink's staging area.

    Attributes:
        path: the path it named.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(f"expected a staged file path, got {path!r}")


@final
class ExecutorStagingError(SinkError):
    """Files Spark tasks staged for a micro-batch cannot be adopted (see
    :mod:`barrierflow.connectors.executor_staging`): the batch must be staged again.

    Attributes:
        table: the table's directory.
        reason: what was wrong.
    """

    def __init__(self, table: str, reason: str) -> None:
        self.table = table
        self.reason = reason
        super().__init__(f"table {table!r}: expected files staged by Spark tasks, but {reason}")


@final
class SplitLogUnavailableError(ChannelBrokenError):
    """A split log's server stayed unreachable past the reader's retry bound (the connection
    error that ended the retries is the ``__cause__``).

    Attributes:
        log: the log (its server address).
        attempts: the calls made, the first one included.
        elapsed: seconds from the first failure to giving up.
    """

    def __init__(self, log: str, attempts: int, elapsed: float) -> None:
        self.log = log
        self.attempts = attempts
        self.elapsed = elapsed
        super().__init__(
            f"split log {log}",
            f"expected the server to answer within the retry bound, got no answer after "
            f"{attempts} attempts over {elapsed:.2f} s",
        )


@final
class SplitLogRecordError(ProtocolError):
    """A record of a split log does not fit the log's payload schema: a field of a
    non-nullable column is missing, or a value cannot be read as its column's type.

    Attributes:
        split: the split (a stream key).
        offset: the record's offset (a Redis entry id, ``"<ms>-<seq>"``).
        field: the field (column) at fault.
        expected: what the column needs (``"a value (the column is not nullable)"``, ...).
        got: what the record holds (``None`` for a missing field, else the raw value).
    """

    def __init__(self, split: str, offset: str, field: str, expected: str, got: Any) -> None:
        self.split = split
        self.offset = offset
        self.field = field
        self.expected = expected
        self.got = got
        shown = "no such field" if got is None else repr(got)
        super().__init__(
            f"split {split!r}, record {offset}, field {field!r}: expected {expected}, got {shown}"
        )


@final
class SinkPathError(SinkError, InvalidArgumentError):
    """A file sink's directory cannot be used: under a regular file, a file itself, in a place
    where nothing can be created (``/proc``), or not writable — refused when the connector is
    made (what a ``stat`` can tell) or when the graph starts (creating it), before any row
    flows, in the words the state store uses for ``state_path``.

    Attributes:
        argument: ``"path"``.
        sink: the sink's name (a sink writer's) or, before it has one, the connector's kind.
        path: the directory as resolved (absolute, symlinks followed).
        expected: what would have been accepted, in words.
        got: what was found, in words.
    """

    def __init__(self, sink: str, path: str, expected: str, got: str) -> None:
        self.argument = "path"
        self.sink = sink
        self.path = path
        self.expected = expected
        self.got = got
        Exception.__init__(self, f"sink {sink!r}: path {path!r}: expected {expected}, got {got}")


@final
class PostgresSchemaMismatchError(SinkError):
    """A PostgreSQL table a :class:`~barrierflow.connectors.PostgresTable` declares exists, but
    does not fit the table's schema: a column is missing or has another type, or the upsert key
    has no unique index — refused when the table is declared, before any row flows.

    Attributes:
        sink: the table (``schema.table``).
        column: the column at fault (for a key: the key's columns, comma-separated).
        table_has: what the database's table has (``"bigint"``, ``"no such column"``, ...).
        schema_wants: what the declared schema needs (``"text"``, ``"a unique index"``, ...).
    """

    def __init__(self, sink: str, column: str, table_has: str, schema_wants: str) -> None:
        self.sink = sink
        self.column = column
        self.table_has = table_has
        self.schema_wants = schema_wants
        super().__init__(
            f"table {sink!r}, column {column!r}: expected {schema_wants} (the declared "
            f"schema's), the table has {table_has}; alter the table or declare its schema"
        )


@final
class PostgresUnavailableError(SinkError):
    """A :class:`~barrierflow.connectors.PostgresTable` could not be declared in its database:
    the connection failed, or the database refused to create or inspect the table (a missing
    permission). psycopg's error is the ``__cause__``.

    Attributes:
        sink: the table (``schema.table``).
        reason: what the database said (with its SQLSTATE when it gave one).
    """

    def __init__(self, sink: str, reason: str) -> None:
        self.sink = sink
        self.reason = reason
        super().__init__(
            f"table {sink!r}: expected its database to accept a connection and the table's "
            f"declaration, got: {reason}"
        )


@final
class StateCommitConflictError(ProtocolError):
    """An epoch already committed was committed again with other deltas: an epoch has one
    state version (a replay with the same deltas is a no-op).

    Attributes:
        store: the store's directory.
        epoch: the epoch.
        committed: the ``(number, attempt)`` of the deltas it holds (empty when compaction
            folded the epoch's record away).
        got: those of the deltas this commit named.
    """

    def __init__(
        self,
        store: str,
        epoch: int,
        committed: Iterable[tuple[int, str]],
        got: Iterable[tuple[int, str]],
    ) -> None:
        self.store = store
        self.epoch = epoch
        self.committed = tuple(sorted(committed))
        self.got = tuple(sorted(got))
        super().__init__(
            f"state store {store!r}: expected epoch {epoch} again with its committed deltas "
            f"{list(self.committed)}, got {list(self.got)}"
        )
