"""Every SQL statement of the state store, in one place.

The two adapters (:mod:`.sqlite_thread_backend`, the default on every backend, and
:mod:`.sqlite_asyncio_backend` on asyncio if asked) only *run* what is here:
:class:`SqlConnection` is the whole of what they provide — read queries (not shielded: a
reader cancelled while it waits for the connection gives up its turn), and a list of
statements applied in one transaction.

Layout of a store file:

* ``bf_meta(key, value)``: ``format`` = :data:`FORMAT_TAG` identifies the file as ours,
  ``schema_version`` = :data:`SCHEMA_VERSION`, ``committed_epoch`` = the last durable
  checkpoint epoch (0 before the first).
* ``bf_state(owner, tbl, key, value, epoch)``: every state table of every actor; ``epoch`` is
  the checkpoint that last wrote the row. Values are JSON text.
* ``bf_sink_state(sink, epoch, state, metadata, schema_change)`` (schema version 2): the meta
  store of coordinated sinks — one row per epoch a coordinator pre-committed, *pending*,
  *committed* or *aborted*; metadata and schema change are JSON text (or NULL). Written in
  their own transactions, not with checkpoints.
* ``bf_segment(owner, tbl, kind, epoch, file, rows)`` (schema version 3): the manifest of
  every versioned table — which segment files (a ``delta`` per epoch with writes, at most one
  ``base``) hold its versions; written in the checkpoint's transaction (and by compaction).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

FORMAT_TAG = "barrierflow-state"
SCHEMA_VERSION = 3
#: Seconds a shielded cleanup (closing a connection) may take before it is abandoned, so that
#: a stuck disk or worker thread cannot hang a runtime's shutdown.
CLOSE_TIMEOUT = 5.0
#: Seconds a transaction may run, shielded, before its caller stops waiting: the outcome is
#: then unknown (the worker thread may still commit it), so the connection refuses every later
#: call and the runtime must reopen the store, which reads what is really durable.
COMMIT_TIMEOUT = 60.0

PRAGMAS = (
    "PRAGMA journal_mode=WAL",
    # FULL: a commit that returned survives power loss, not only a process crash.
    "PRAGMA synchronous=FULL",
    "PRAGMA foreign_keys=ON",
)

CREATE = (
    "CREATE TABLE IF NOT EXISTS bf_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS bf_state ("
    " owner TEXT NOT NULL, tbl TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,"
    " epoch INTEGER NOT NULL, PRIMARY KEY (owner, tbl, key)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS bf_sink_state ("
    " sink TEXT NOT NULL, epoch INTEGER NOT NULL,"
    " state TEXT NOT NULL CHECK (state IN ('pending', 'committed', 'aborted')),"
    " metadata TEXT, schema_change TEXT, PRIMARY KEY (sink, epoch)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS bf_segment ("
    " owner TEXT NOT NULL, tbl TEXT NOT NULL,"
    " kind TEXT NOT NULL CHECK (kind IN ('base', 'delta')), epoch INTEGER NOT NULL,"
    " file TEXT NOT NULL, rows INTEGER NOT NULL, PRIMARY KEY (owner, tbl, kind, epoch))"
    " WITHOUT ROWID",
)

#: Tables of a barrierflow store (any of them without ``bf_meta`` is a damaged store).
OWN_TABLES = ("bf_meta", "bf_state", "bf_sink_state", "bf_segment")
#: Reads every page of the file; one row ``ok``, or a row per problem found.
QUICK_CHECK = "PRAGMA quick_check"
LIST_TABLES = "SELECT name FROM sqlite_master WHERE type = 'table'"
READ_META = "SELECT key, value FROM bf_meta"
INIT_META = "INSERT OR IGNORE INTO bf_meta (key, value) VALUES (?, ?)"
SET_META = (
    "INSERT INTO bf_meta (key, value) VALUES (?, ?)"
    " ON CONFLICT(key) DO UPDATE SET value = excluded.value"
)
GET = "SELECT value FROM bf_state WHERE owner = ? AND tbl = ? AND key = ?"
SCAN = "SELECT key, value FROM bf_state WHERE owner = ? AND tbl = ? ORDER BY key"
UPSERT = (
    "INSERT INTO bf_state (owner, tbl, key, value, epoch) VALUES (?, ?, ?, ?, ?)"
    " ON CONFLICT(owner, tbl, key) DO UPDATE SET value = excluded.value, epoch = excluded.epoch"
)
DELETE = "DELETE FROM bf_state WHERE owner = ? AND tbl = ? AND key = ?"
SINK_STATES = (
    "SELECT epoch, state, metadata, schema_change FROM bf_sink_state WHERE sink = ? ORDER BY epoch"
)
SINK_PENDING = (
    "INSERT INTO bf_sink_state (sink, epoch, state, metadata, schema_change)"
    " VALUES (?, ?, 'pending', ?, ?)"
)
SINK_COMMITTED = "UPDATE bf_sink_state SET state = 'committed' WHERE sink = ? AND epoch = ?"
SINK_PRUNE = "DELETE FROM bf_sink_state WHERE sink = ? AND state = 'committed' AND epoch < ?"
SINK_DELETE = "DELETE FROM bf_sink_state WHERE sink = ? AND epoch = ?"
SEGMENTS = (
    "SELECT kind, epoch, file, rows FROM bf_segment WHERE owner = ? AND tbl = ? ORDER BY epoch"
)
SEGMENT_ADD = (
    "INSERT OR REPLACE INTO bf_segment (owner, tbl, kind, epoch, file, rows)"
    " VALUES (?, ?, ?, ?, ?, ?)"
)
SEGMENT_FOLD = "DELETE FROM bf_segment WHERE owner = ? AND tbl = ? AND epoch <= ?"
SINK_ABORT_AFTER = (
    "UPDATE bf_sink_state SET state = 'aborted' WHERE state = 'pending' AND epoch > ?"
)


@dataclass(frozen=True, slots=True)
class Statement:
    """One statement of a transaction, run once per parameter row."""

    sql: str
    rows: Sequence[Sequence[Any]]


class SqlConnection(Protocol):
    """What an adapter provides: queries, and atomic transactions of statements."""

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run a read-only query and return every row."""
        ...

    async def transaction(self, statements: Sequence[Statement]) -> None:
        """Apply ``statements`` in one ``BEGIN IMMEDIATE`` … ``COMMIT``, or none of them.

        Cancellation: shielded, for at most :data:`COMMIT_TIMEOUT` seconds — once submitted,
        the transaction runs to its end and its caller learns the outcome. Past the deadline
        the caller gets :class:`TimeoutError` (outcome unknown: the worker thread cannot be
        stopped mid-transaction) and the connection refuses every later call (see
        :func:`commit_timed_out`). Waiting for the connection before that is cancellable.
        """
        ...

    async def close(self) -> None:
        """Close the connection (idempotent).

        Cancellation: shielded, for at most :data:`CLOSE_TIMEOUT` seconds; past that the
        connection is abandoned to its worker thread (which closes it once its current call
        returns) and a warning is logged.
        """
        ...


def commit_timed_out() -> TimeoutError:
    """The error of a transaction that outlived :data:`COMMIT_TIMEOUT`, and of every later
    call on its connection: whether it committed is unknown, so nothing may build on it (an
    ``OSError``, so the store reports it as a :class:`~barrierflow.errors.StoreIOError`)."""
    return TimeoutError(
        f"a transaction did not finish within {COMMIT_TIMEOUT} s: its outcome is unknown and "
        "the connection is unusable (reopen the store to read what is durable)"
    )


def bootstrap_statements() -> list[Statement]:
    """Create the schema and the meta rows of a new store (no-ops on an existing one)."""
    statements = [Statement(sql, [()]) for sql in CREATE]
    statements.append(
        Statement(
            INIT_META,
            [
                ("format", FORMAT_TAG),
                ("schema_version", str(SCHEMA_VERSION)),
                ("committed_epoch", "0"),
            ],
        )
    )
    return statements


def migrate_statements(version: int) -> list[Statement]:
    """Bring a store of schema ``version`` to :data:`SCHEMA_VERSION` (tables are only added)."""
    if version >= SCHEMA_VERSION:
        return []
    statements = [Statement(sql, [()]) for sql in CREATE]
    statements.append(Statement(SET_META, [("schema_version", str(SCHEMA_VERSION))]))
    return statements


def checkpoint_statements(
    upserts: Sequence[tuple[str, str, str, str]],
    deletes: Sequence[tuple[str, str, str]],
    epoch: int,
) -> list[Statement]:
    """Everything a checkpoint writes: the rows, and the new committed epoch, together."""
    return [
        Statement(UPSERT, [(*row, epoch) for row in upserts]),
        Statement(DELETE, deletes),
        Statement(SET_META, [("committed_epoch", str(epoch))]),
    ]
