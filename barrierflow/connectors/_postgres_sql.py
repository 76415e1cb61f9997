"""What :mod:`.postgres_table`'s table, writers and committer share: the table's description,
its SQL, the Arrow ↔ PostgreSQL type map, the check of an existing table, and how a
database error is classified (may pass, or will not).

psycopg is the ``[postgres]`` extra: it is imported through :func:`psycopg`, when a table is
made, never at module import.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.csv as pacsv

from barrierflow._extras import require
from barrierflow.actors.sinks.table import Failed, RetryLater
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.connectors.errors import PostgresSchemaMismatchError

if TYPE_CHECKING:
    import psycopg as psycopg_types
    from psycopg import sql as sql_types

    Connection = psycopg_types.Connection[Any]
else:
    Connection = Any

#: The marker table: one row per sink, its last committed epoch and source positions.
COMMITS_TABLE = "bf_sink_commits"
#: One row per writer's prepared transaction, written inside it: its commit is visible here.
SHARES_TABLE = "bf_sink_shares"
#: The prefix of every global transaction id barrierflow prepares.
GID_PREFIX = "bf"
_IDENTIFIER_BYTES = 63  # NAMEDATALEN - 1
_SINK_CHARS = 100  # a gid is at most 200 bytes: "bf:<sink>:<epoch>:<writer>"

# SQLSTATE classes and codes of failures that may pass: a connection exception (08), a
# transaction rolled back by a serialization failure or a deadlock (40), insufficient
# resources (53: too many connections, disk full), operator intervention (57: a shutdown, a
# cancelled statement), a system error (58), a lock not available or an object in use.
_RETRY_CLASSES = frozenset({"08", "40", "53", "57", "58"})
_RETRY_STATES = frozenset({"55P03", "55006"})


def psycopg() -> ModuleType:
    """The psycopg module (the ``[postgres]`` extra).

    Raises:
        MissingExtraError: psycopg is not installed, naming ``barrierflow[postgres]``.
    """
    return require("postgres", "psycopg")


def sql() -> ModuleType:
    """psycopg's SQL composition module."""
    return require("postgres", "psycopg.sql")


def _pg_type(arrow: pa.DataType) -> str | None:
    """The PostgreSQL type (as ``format_type`` spells it) holding ``arrow``'s values, or
    ``None`` when the table cannot hold it."""
    t = pa.types
    if t.is_int8(arrow) or t.is_int16(arrow) or t.is_uint8(arrow):
        return "smallint"
    if t.is_int32(arrow) or t.is_uint16(arrow):
        return "integer"
    if t.is_int64(arrow) or t.is_uint32(arrow):
        return "bigint"
    if t.is_float32(arrow):
        return "real"
    if t.is_float64(arrow):
        return "double precision"
    if t.is_boolean(arrow):
        return "boolean"
    if t.is_string(arrow) or t.is_large_string(arrow):
        return "text"
    if t.is_date(arrow):
        return "date"
    if t.is_timestamp(arrow):
        zone = "with" if arrow.tz is not None else "without"
        return f"timestamp {zone} time zone"
    if t.is_decimal(arrow):
        return f"numeric({arrow.precision},{arrow.scale})"
    return None


def _accepts(table_type: str, wanted: str) -> bool:
    """Whether a column of ``table_type`` takes the values of ``wanted`` as they are."""
    if wanted == "text":
        return table_type == "text" or table_type.startswith("character varying")
    return table_type == wanted


def identifier(argument: str, value: Any) -> str:
    """``value`` as a PostgreSQL identifier (quoted when used, so any case is kept).

    Raises:
        InvalidArgumentError: not a non-empty str of at most 63 bytes without NUL.
    """
    if (
        not isinstance(value, str)
        or not value
        or "\x00" in value
        or len(value.encode()) > _IDENTIFIER_BYTES
    ):
        raise InvalidArgumentError(
            argument, f"a non-empty name of at most {_IDENTIFIER_BYTES} bytes", value
        )
    return value


@dataclass(frozen=True, slots=True)
class TableSpec:
    """Everything a writer or the committer needs to reach the table, in one immutable value.

    Attributes:
        dsn: the libpq connection string.
        db_schema: the PostgreSQL schema (namespace) holding the table and the marker tables.
        table: the table's name.
        arrow: the schema of every batch.
        key: the upsert key's columns (empty: append only).
        sink: the name the prepared transactions and marker rows carry.
        batch_rows: rows buffered by a writer before it copies them.
    """

    dsn: str
    db_schema: str
    table: str
    arrow: pa.Schema
    key: tuple[str, ...]
    sink: str
    batch_rows: int

    @property
    def qualified(self) -> str:
        """``schema.table``, for messages."""
        return f"{self.db_schema}.{self.table}"

    def gid(self, epoch: int, writer: str) -> str:
        """The global id of writer ``writer``'s prepared transaction of ``epoch``."""
        return f"{GID_PREFIX}:{self.sink}:{epoch}:{writer}"

    def gid_prefix(self, epoch: int | None = None) -> str:
        """The prefix of this sink's gids (of one epoch's if given)."""
        prefix = f"{GID_PREFIX}:{self.sink}:"
        return prefix if epoch is None else f"{prefix}{epoch}:"

    def name(self, table: str) -> sql_types.Composable:
        """``table`` of the spec's schema, quoted."""
        identifier_: Any = sql().Identifier(self.db_schema, table)
        return identifier_  # type: ignore[no-any-return]

    def columns(self, names: Sequence[str] | None = None) -> sql_types.Composable:
        """The column list (every column of the schema by default), quoted."""
        s = sql()
        return s.SQL(", ").join(s.Identifier(n) for n in names or self.arrow.names)  # type: ignore[no-any-return]


def check_spec(
    dsn: Any,
    table: Any,
    schema: Any,
    db_schema: Any,
    key: Any,
    sink: Any,
    batch_rows: Any,
) -> TableSpec:
    """A :class:`TableSpec` from a table's arguments, every one checked.

    Raises:
        InvalidArgumentError: naming the first bad argument.
    """
    if not isinstance(dsn, str) or not dsn.strip():
        raise InvalidArgumentError("dsn", "a libpq connection string or URI", dsn)
    identifier("table", table)
    identifier("db_schema", db_schema)
    if not isinstance(schema, pa.Schema) or len(schema) == 0:
        raise InvalidArgumentError("schema", "a pyarrow.Schema with at least one column", schema)
    for field in schema:
        identifier("schema", field.name)
        if _pg_type(field.type) is None:
            raise InvalidArgumentError(
                "schema",
                "columns of integer, float, bool, string, date, timestamp or decimal types",
                f"{field.name}: {field.type}",
            )
    if len(set(schema.names)) != len(schema.names):
        raise InvalidArgumentError("schema", "unique column names", schema.names)
    if key is None:
        columns: tuple[str, ...] = ()
    elif (
        isinstance(key, str | bytes)
        or not isinstance(key, Sequence)
        or not key
        or not all(isinstance(k, str) and k in schema.names for k in key)
        or len(set(key)) != len(key)
    ):
        raise InvalidArgumentError("key", f"None or distinct columns of {schema.names}", key)
    else:
        columns = tuple(key)
    if sink is None:
        sink = f"{db_schema}.{table}"
    if not isinstance(sink, str) or not sink or ":" in sink or len(sink) > _SINK_CHARS:
        raise InvalidArgumentError(
            "sink", f"None or a name of at most {_SINK_CHARS} characters without ':'", sink
        )
    if type(batch_rows) is not int or batch_rows <= 0:
        raise InvalidArgumentError("batch_rows", "a positive int", batch_rows)
    try:
        psycopg().conninfo.conninfo_to_dict(dsn)
    except psycopg().ProgrammingError as exc:
        raise InvalidArgumentError("dsn", "a libpq connection string or URI", dsn) from exc
    return TableSpec(dsn, db_schema, table, schema, columns, sink, batch_rows)


def check_writer(writer: Any) -> str:
    """A writer id fit for a gid.

    Raises:
        InvalidArgumentError: not a non-empty alphanumeric id (``-`` allowed).
    """
    if not isinstance(writer, str) or not writer or not writer.replace("-", "").isalnum():
        raise InvalidArgumentError("writer", "a non-empty alphanumeric id", writer)
    return writer


def connect(spec: TableSpec) -> Connection:
    """A new autocommit connection to the table's database (blocking): transactions are
    begun, prepared and ended explicitly."""
    connection: Connection = psycopg().connect(spec.dsn, autocommit=True, connect_timeout=10)
    return connection


def prepared_gids(connection: Connection, prefix: str) -> list[str]:
    """The gids of this database's prepared transactions starting with ``prefix``."""
    rows = connection.execute(
        "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() "
        "AND starts_with(gid, %s) ORDER BY gid",
        [prefix],
    ).fetchall()
    return [row[0] for row in rows]


def end_prepared(connection: Connection, verb: str, gid: str) -> None:
    """``COMMIT PREPARED`` or ``ROLLBACK PREPARED`` ``gid`` (they take no parameters)."""
    s = sql()
    connection.execute(s.SQL(verb + " PREPARED {}").format(s.Literal(gid)))


def declare(connection: Connection, spec: TableSpec) -> None:
    """Create the schema, the table and the marker tables if missing, else check the table
    against the declared schema (blocking; one transaction, serialized with other
    declarations by an advisory lock, so processes declaring at once do not race).

    Raises:
        PostgresSchemaMismatchError: the table exists but does not fit the schema.
    """
    s = sql()

    def missing(table: str) -> bool:
        name = s.Identifier(spec.db_schema, table).as_string(connection)
        row = connection.execute("SELECT to_regclass(%s) IS NULL", [name]).fetchone()
        return bool(row and row[0])

    # Only what is missing is created: a role that may write the tables but not create
    # anything (no CREATE on the database or the schema) declares them too, since CREATE ...
    # IF NOT EXISTS checks that privilege even when the object exists.
    with connection.transaction():
        connection.execute("SELECT pg_advisory_xact_lock(hashtext('barrierflow declare'))")
        schema = connection.execute("SELECT to_regnamespace(%s)", [spec.db_schema]).fetchone()
        if schema is None or schema[0] is None:
            connection.execute(s.SQL("CREATE SCHEMA {}").format(s.Identifier(spec.db_schema)))
        found = connection.execute(
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
            "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped",
            [str(s.Identifier(spec.db_schema, spec.table).as_string(connection))],
        ).fetchall()
        if found:
            _check_table(connection, spec, dict(found))
        else:
            columns = [
                s.SQL("{} {}").format(s.Identifier(f.name), s.SQL(_pg_type(f.type) or ""))
                for f in spec.arrow
            ]
            if spec.key:
                columns.append(s.SQL("PRIMARY KEY ({})").format(spec.columns(spec.key)))
            connection.execute(
                s.SQL("CREATE TABLE {} ({})").format(
                    spec.name(spec.table), s.SQL(", ").join(columns)
                )
            )
        if missing(COMMITS_TABLE):
            connection.execute(
                s.SQL(
                    "CREATE TABLE {} (sink text PRIMARY KEY, epoch bigint NOT NULL, "
                    "rows bigint NOT NULL, commits bigint NOT NULL DEFAULT 1, "
                    "positions jsonb NOT NULL DEFAULT '{{}}', "
                    "positions_from jsonb NOT NULL DEFAULT '{{}}', "
                    "committed_at timestamptz NOT NULL DEFAULT now())"
                ).format(spec.name(COMMITS_TABLE))
            )
        if missing(SHARES_TABLE):
            connection.execute(
                s.SQL(
                    "CREATE TABLE {} (gid text PRIMARY KEY, sink text NOT NULL, "
                    "epoch bigint NOT NULL, writer text NOT NULL, rows bigint NOT NULL)"
                ).format(spec.name(SHARES_TABLE))
            )


def _check_table(connection: Connection, spec: TableSpec, found: dict[str, str]) -> None:
    for field in spec.arrow:
        wanted = _pg_type(field.type) or ""
        has = found.get(field.name)
        if has is None or not _accepts(has, wanted):
            raise PostgresSchemaMismatchError(
                spec.qualified, field.name, has or "no such column", wanted
            )
    if not spec.key:
        return
    s = sql()
    # ON CONFLICT (key) needs a unique index on exactly the key's columns.
    unique = connection.execute(
        "SELECT count(*) FROM pg_index i WHERE i.indrelid = to_regclass(%s) "
        "AND i.indisunique AND i.indpred IS NULL AND i.indexprs IS NULL AND ARRAY("
        "SELECT a.attname::text FROM unnest(i.indkey) k JOIN pg_attribute a "
        "ON a.attrelid = i.indrelid AND a.attnum = k ORDER BY 1) = %s",
        [str(s.Identifier(spec.db_schema, spec.table).as_string(connection)), sorted(spec.key)],
    ).fetchone()
    if not unique or not unique[0]:
        raise PostgresSchemaMismatchError(
            spec.qualified,
            ", ".join(spec.key),
            "no unique index on exactly these columns",
            "a primary key or unique index on the upsert key",
        )


def csv_payload(batches: Sequence[pa.RecordBatch]) -> pa.Buffer:
    """``batches`` as one CSV payload for ``COPY ... (FORMAT csv)``: no header; a null is an
    empty field, an empty string ``""`` — PostgreSQL's CSV reading of both. Encoded by
    Arrow's C++ writer, never a Python loop per row."""
    out = pa.BufferOutputStream()
    with pacsv.CSVWriter(
        out, batches[0].schema, write_options=pacsv.WriteOptions(include_header=False)
    ) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return out.getvalue()


def positions_json(metadata: Any, name: str) -> str:
    """The positions ``name`` of commit metadata, as JSON text for a jsonb column."""
    return json.dumps(dict(metadata.get(name) or {}), sort_keys=True)


def classify(error: Exception) -> RetryLater | Failed | None:
    """What a database error means to the coordinator: :class:`RetryLater` for one that may
    pass (a lost connection, a serialization failure or deadlock, a lock timeout, a server
    shutting down or out of connections), :class:`Failed` for one that will not (an undefined
    table, a missing permission, a data or integrity error); ``None`` for an error that is not
    the database's (let it escape).

    Classified by SQLSTATE: psycopg's exception classes follow its classes, but a connection
    that fails before the server answers carries none (then it is an ``OperationalError`` or
    an ``InterfaceError``: may pass).
    """
    pg = psycopg()
    if isinstance(error, OSError):
        return RetryLater(error)
    if not isinstance(error, pg.Error):
        return None
    state = error.sqlstate
    if state is None:
        if isinstance(error, pg.OperationalError | pg.InterfaceError):
            return RetryLater(error)
        return Failed(error)
    if state[:2] in _RETRY_CLASSES or state in _RETRY_STATES:
        return RetryLater(error)
    return Failed(error)
