"""A PostgreSQL table written exactly once, with the database's own two-phase commit.

:class:`PostgresTable` is what :func:`~barrierflow.actors.add_sink` needs: ``writer(id)`` gives
each parallel writer a :class:`PostgresStagingWriter`, ``committer()`` the
:class:`PostgresCommitter` the sink's coordinator drives. It is seed 002's sink task 2PC on a
real database:

* **A writer** ``COPY``s its epoch's rows into the target table inside a transaction of its
  own connection and, when it stages the epoch, ``PREPARE TRANSACTION``s it under the global
  id ``bf:<sink>:<epoch>:<writer>``. The prepared transaction *is* the staged manifest: it is
  durable (it survives a crash of the server), it holds the rows invisibly, and the
  :class:`~barrierflow.actors.sinks.table.Manifest` names it (one "file" whose path is the
  gid, with the rows and bytes copied). Inside the same transaction the writer adds a row to
  ``bf_sink_shares``, so that its commit can be told from its loss later.
* **The committer** ``COMMIT PREPARED``s every writer's transaction of the epoch once the
  coordinator's checkpoint holding it is durable, then records the epoch and its source
  positions in the sink's row of ``bf_sink_commits`` (same database, same schema as the
  table) — the committed marker: an epoch at or below it is :class:`AlreadyCommitted`.
* **Recovery** (``recover(pending)``) looks at what ``pg_prepared_xacts`` holds for the sink:
  the transactions of pending epochs (the meta store's record) stay, to be committed; every
  other one is ``ROLLBACK PREPARED`` (its rows are replayed by the upstream). ``abort`` rolls
  back an epoch's transactions.

**What a reader sees.** Each writer's rows appear at its own ``COMMIT PREPARED``: while an
epoch of four writers is being committed, a reader may see the rows of one, two, three, then
all four writers; the epoch is whole once all are — and the marker, written last, says so
(``bf_sink_commits.epoch`` ≥ the epoch). A crash in between leaves some writers' rows visible
and the rest prepared (invisible, durable): the epoch is still pending in the meta store, so
the restarted coordinator commits the rest and then writes the marker — never rolls back.
Rows are never visible twice and never lost; an epoch is only briefly partial.

**Why not an epoch that appears at once** (writers copying into per-epoch staging tables
under 2PC, the coordinator moving them into the table with the marker in one transaction):
every row would be written twice, the second time serially by the coordinator. Measured on 2
cores, fsync on, 4 writers each copying 64 batches of 4,096 rows per epoch: 2.2 to 2.5 M rows/s
copying into the table directly, 0.84 to 0.99 M rows/s staging then moving (2026-11-29). The
design above keeps the rows' only write in the writers, in parallel, and the coordinator's
commit to a few statements per epoch; the price is an epoch visible writer by writer for a
few milliseconds.

**Upsert by key.** With ``key=("id",)`` each writer copies its rows into an unlogged staging
table created inside its transaction (its role needs ``CREATE`` on the schema), and at stage
time runs ``INSERT … SELECT … ON CONFLICT (key) DO UPDATE`` (the epoch's last row of each key
wins) and drops the staging table, all before ``PREPARE`` (temporary tables cannot be
prepared). The rows of one key must reach one
writer — declare the sink with ``add_sink(..., key=[the same columns])`` — since a prepared
transaction keeps its row locks until its commit: two writers upserting one key in one epoch
would wait for each other.

**A changelog, with a key.** A keyed table's writers apply chunks with delete and update ops
too (:class:`~barrierflow.actors.sinks.table.TakesChanges`): each row reaches the staging
table with its op code, and the stage keeps the epoch's last op of each key — a ``DELETE``,
or an ``UPDATE_DELETE`` no ``UPDATE_INSERT`` followed, runs ``DELETE … USING`` by key; an
``INSERT`` or ``UPDATE_INSERT`` upserts — in one statement, inside the transaction it then
prepares (two-phase commit unchanged). A delete then an insert of a key in one epoch leaves
the row; an insert then a delete leaves none. Without a key the table is append-only: the
sink writer refuses a changelog (:class:`~barrierflow.errors.SinkWriterInputError`).

**From Spark tasks.** A table without a key can be written on Spark's executors
(``run_on="executors"``): each task attempt copies and prepares its partition as a writer
does, under a gid of its own attempt, and the driver keeps one attempt per partition
(:mod:`~barrierflow.connectors.postgres_executors`); the committer commits them as it commits
its writers' transactions.

**Declared at once.** The constructor connects, creates the schema, the table (with the key as
its primary key) and the marker tables if missing (only what is missing: a role that may
write them but create nothing declares them too), or checks an existing table's columns
and types (and the key's unique index): a mismatch is a
:class:`~barrierflow.errors.PostgresSchemaMismatchError`, before any row flows. The server
needs ``max_prepared_transactions`` at least the writers times the epochs pending at once
(twice the writers is enough for a coordinator that commits as checkpoints complete).

Blocking psycopg calls run on worker threads (``anyio.to_thread.run_sync``, one at a time per
writer and for the committer), on both backends: psycopg's async connection needs asyncio.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, final

import anyio
import anyio.lowlevel
import anyio.to_thread
import numpy as np
import pyarrow as pa

from barrierflow._taskgroups import single_error, single_leaf
from barrierflow.actors.sinks.committables import partition_writer
from barrierflow.actors.sinks.errors import SinkRecoveryError
from barrierflow.actors.sinks.table import (
    AlreadyCommitted,
    CommitMetadata,
    CommitOutcome,
    Committed,
    Failed,
    Manifest,
    SinkCommits,
    StagedFile,
    last_change_per_key,
    manifests_positions,
)
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.channels.schema import conform_schema
from barrierflow.connectors._postgres_sql import (
    COMMITS_TABLE,
    SHARES_TABLE,
    Connection,
    TableSpec,
    check_spec,
    check_writer,
    classify,
    connect,
    csv_payload,
    declare,
    end_prepared,
    positions_json,
    prepared_gids,
    psycopg,
    sql,
)
from barrierflow.connectors.errors import PostgresUnavailableError, SchemaEvolutionError
from barrierflow.connectors.postgres_executors import (
    PostgresExecutorWrites,
    enter_fence,
    scratch_root,
    task_writer,
)

__all__ = ["PostgresCommitter", "PostgresStagingWriter", "PostgresTable"]

T = TypeVar("T")

_SEQ = "bf_seq"  # the staging table's row order: the last row of a key wins
_OP = "bf_op"  # the staging table's op codes (Op: inserts 0 and 3 upsert, deletes 1 and 2 delete)
_INSERT_OP = pa.scalar(0, pa.int8())
_MAX_LANES = 8  # connections committing one epoch's prepared transactions at once


@final
class PostgresTable:
    """The PostgreSQL table ``db_schema.table`` written by parallel writers, committed by one
    coordinator with two-phase commit (see the module).

    Args:
        dsn: the libpq connection string or URI of the database.
        table: the table's name (created if missing).
        schema: the schema of every batch: integer, float, bool, string, date, timestamp and
            decimal columns (the table's columns of the same names and types).
        db_schema: the PostgreSQL schema (namespace) of the table and the marker tables.
        key: upsert by these columns (``INSERT … ON CONFLICT (key) DO UPDATE``); ``None``
            appends every row.
        sink: the name the sink's prepared transactions and marker row carry (default
            ``db_schema.table``): two pipelines writing one table need two names.
        batch_rows: rows a writer buffers before it copies them into its transaction.

    Raises:
        InvalidArgumentError: a bad argument, naming it (checked before connecting).
        MissingExtraError: psycopg is not installed (``barrierflow[postgres]``).
        PostgresUnavailableError: the database cannot be reached, or refuses to create or
            inspect the table (a missing permission).
        PostgresSchemaMismatchError: the table exists and does not fit ``schema`` or ``key``.
    """

    def __init__(
        self,
        dsn: str,
        table: str,
        schema: pa.Schema,
        *,
        db_schema: str = "public",
        key: Sequence[str] | None = None,
        sink: str | None = None,
        batch_rows: int = 65_536,
    ) -> None:
        self._spec = check_spec(dsn, table, schema, db_schema, key, sink, batch_rows)
        pg = psycopg()
        try:
            with connect(self._spec) as connection:
                declare(connection, self._spec)
        except pg.Error as exc:
            state = f" (SQLSTATE {exc.sqlstate})" if exc.sqlstate else ""
            raise PostgresUnavailableError(self._spec.qualified, f"{exc}".strip() + state) from exc

    @property
    def schema(self) -> pa.Schema:
        """The schema of every batch."""
        return self._spec.arrow

    @property
    def name(self) -> str:
        """``db_schema.table``."""
        return self._spec.qualified

    @property
    def key(self) -> tuple[str, ...]:
        """The upsert key's columns (empty: append only)."""
        return self._spec.key

    def writer(self, writer_id: str) -> PostgresStagingWriter:
        """The staging writer of writer ``writer_id`` (with a key, one that also applies a
        changelog: :class:`~barrierflow.actors.sinks.table.TakesChanges`)."""
        if self._spec.key:
            return _ChangesWriter(self._spec, writer_id)
        return PostgresStagingWriter(self._spec, writer_id)

    def committer(self) -> PostgresCommitter:
        """The coordinator's committer."""
        return PostgresCommitter(self._spec)

    def __repr__(self) -> str:
        return f"PostgresTable({self._spec.qualified!r}, sink={self._spec.sink!r})"


class _Worker:
    """One connection used from worker threads, one call at a time (a limiter of one; a call
    is not abandoned on cancellation, so the next one never finds a statement running)."""

    def __init__(self, spec: TableSpec) -> None:
        self.spec = spec
        self.connection: Connection | None = None
        self._closer: weakref.finalize[Any, Any] | None = None
        self._limiter: anyio.CapacityLimiter | None = None

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(1)
        return await anyio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    def live(self) -> Connection:
        """The connection, (re)opened if it is missing or broken (the server restarted)."""
        connection = self.connection
        if connection is None or connection.closed or connection.broken:
            self.close()
            self.connection = connection = connect(self.spec)
            # A committer has no close in its protocol: its connection is closed when it is
            # collected, not left to warn.
            self._closer = weakref.finalize(self, connection.close)
        return connection

    def close(self) -> None:
        connection, self.connection = self.connection, None
        if self._closer is not None:
            self._closer.detach()
            self._closer = None
        if connection is not None:
            connection.close()  # the server rolls back an open transaction; prepared stay


class PostgresStagingWriter:
    """Stages one writer's rows of each epoch in a prepared transaction (see the module).

    Life (the :class:`~barrierflow.actors.sinks.table.StagingWriter` contract): ``open``
    connects; ``begin`` rolls back a leftover prepared transaction of the same epoch and
    writer (an earlier incarnation's, never pending: its rows are being replayed); ``write``
    buffers and copies every ``batch_rows`` rows inside the epoch's transaction; ``stage``
    prepares it; ``discard`` rolls it back (prepared or not); ``close`` closes the connection
    (an open transaction is rolled back by the server; prepared ones stay for the committer).

    Cancellation: a call cancelled while its statement runs finishes the statement on its
    thread before the next call starts; rows a cancelled flush took are copied by it.

    Raises:
        InvalidArgumentError: ``writer`` is not a non-empty alphanumeric id.
    """

    def __init__(self, spec: TableSpec, writer: str) -> None:
        self._spec = spec
        self._writer = check_writer(writer)
        self._worker = _Worker(spec)
        self._buffer: list[pa.RecordBatch] = []
        self._buffered = 0
        self._buffer_lock = threading.Lock()
        self._epoch: int | None = None
        # The connection holding the open epoch's transaction: its rows live there only, so
        # every statement of the epoch goes to it — never to a connection reopened since
        # (that would prepare an empty transaction and lose the rows without a word).
        self._transaction: Connection | None = None
        self._rows = 0
        self._bytes = 0

    @property
    def schema(self) -> pa.Schema:
        """The schema of every batch."""
        return self._spec.arrow

    @property
    def writer(self) -> str:
        """This writer's id."""
        return self._writer

    def _staging_name(self, epoch: int) -> str:
        """The upsert staging table of ``epoch`` (created and dropped in its transaction)."""
        digest = hashlib.sha1(f"{self._spec.sink}:{self._writer}".encode()).hexdigest()[:16]
        return f"bf_stage_{digest}_{epoch}"

    async def open(self) -> None:
        """Connect to the database."""
        await self._worker.run(self._worker.live)

    async def begin(self, epoch: int) -> None:
        """Start staging ``epoch``: roll back what an earlier epoch left open, and a leftover
        prepared transaction of this epoch and writer."""
        self._take()  # dropped
        self._epoch, self._rows, self._bytes = epoch, 0, 0
        await self._worker.run(self._begin, epoch)

    def _begin(self, epoch: int) -> None:
        self._rollback_open()
        connection = self._worker.live()
        gid = self._spec.gid(epoch, self._writer)
        if gid in prepared_gids(connection, gid):
            end_prepared(connection, "ROLLBACK", gid)

    def _rollback_open(self) -> None:
        """Roll back the open epoch's transaction, if any (a lost connection lost it)."""
        connection, self._transaction = self._transaction, None
        if connection is not None and not connection.closed and not connection.broken:
            connection.execute("ROLLBACK")

    async def write(self, batch: pa.RecordBatch) -> None:
        """Buffer ``batch``; copy the buffer once ``batch_rows`` rows are buffered."""
        if self._spec.key:  # inserts, in the staging table's op column
            batch = batch.append_column(_OP, pa.repeat(_INSERT_OP, batch.num_rows))
        await self._buffer_rows(batch)

    async def _buffer_rows(self, batch: pa.RecordBatch) -> None:
        if self._buffer_add(batch):
            await self.flush()
        else:
            await anyio.lowlevel.checkpoint()

    def _buffer_add(self, batch: pa.RecordBatch) -> bool:
        """Buffer ``batch``; whether ``batch_rows`` rows are buffered (time to copy)."""
        with self._buffer_lock:
            self._buffer.append(batch)
            self._buffered += batch.num_rows
            return self._buffered >= self._spec.batch_rows

    async def flush(self) -> None:
        """Copy the buffered rows into the epoch's transaction (nothing becomes visible)."""
        if not self._buffer:
            await anyio.lowlevel.checkpoint()
            return
        # Taken on the thread: rows of a flush cancelled before its thread started stay
        # buffered for the next call.
        await self._worker.run(self._copy_taken)

    def _take(self) -> list[pa.RecordBatch]:
        with self._buffer_lock:
            batches, self._buffer, self._buffered = self._buffer, [], 0
        return batches

    def _copy_taken(self) -> None:
        batches = self._take()
        if not batches or self._epoch is None:
            return
        spec, s = self._spec, sql()
        target = spec.name(spec.table)
        columns = spec.columns()
        connection = self._transaction
        if connection is None:
            connection = self._worker.live()
            connection.execute("BEGIN")
            self._transaction = connection
            if spec.key:
                connection.execute(
                    s.SQL(
                        "CREATE UNLOGGED TABLE {} (LIKE {} INCLUDING DEFAULTS, {} smallint, "
                        "{} bigint)"
                    ).format(
                        spec.name(self._staging_name(self._epoch)),
                        target,
                        s.Identifier(_OP),
                        s.Identifier(_SEQ),
                    )
                )
        if spec.key:
            target = spec.name(self._staging_name(self._epoch))
            # Each row's order in the epoch, so the last row of a key wins at stage time.
            first, numbered = self._rows, []
            for b in batches:
                order = np.arange(first, first + b.num_rows, dtype=np.int64)
                numbered.append(b.append_column(_SEQ, pa.array(order)))
                first += b.num_rows
            batches = numbered
            columns = spec.columns([*spec.arrow.names, _OP, _SEQ])
        payload = csv_payload(batches)
        with connection.cursor() as cursor:
            statement = s.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(target, columns)
            with cursor.copy(statement) as copy:
                copy.write(memoryview(payload))
        self._rows += sum(b.num_rows for b in batches)
        self._bytes += payload.size

    async def stage(self, epoch: int) -> Manifest:
        """Copy what is buffered and prepare the epoch's transaction; its manifest names the
        prepared transaction (none when the epoch has no rows)."""
        if epoch != self._epoch:
            raise SinkRecoveryError(
                self._spec.qualified,
                f"writer {self._writer} was asked to stage epoch {epoch}, but its open epoch "
                f"is {self._epoch}",
            )
        await self.flush()
        staged: StagedFile | None = await self._worker.run(self._prepare, epoch)
        return Manifest(self._writer, epoch, () if staged is None else (staged,))

    def _prepare(self, epoch: int) -> StagedFile | None:
        connection, self._transaction = self._transaction, None
        if connection is None:
            return None
        spec, s = self._spec, sql()
        try:
            if spec.key:
                self._upsert(connection, spec.name(self._staging_name(epoch)))
            gid = spec.gid(epoch, self._writer)
            # One round trip (values inlined as literals: a query of two statements takes no
            # parameters): the share row, then the prepare.
            share = [s.Literal(v) for v in (gid, spec.sink, epoch, self._writer, self._rows)]
            connection.execute(
                s.SQL(
                    "INSERT INTO {} (gid, sink, epoch, writer, rows) VALUES ({}); "
                    "PREPARE TRANSACTION {}"
                ).format(spec.name(SHARES_TABLE), s.SQL(", ").join(share), s.Literal(gid))
            )
        except Exception:
            if not connection.closed and not connection.broken:
                connection.execute("ROLLBACK")
            raise
        return StagedFile(gid, self._rows, self._bytes)

    def _upsert(self, connection: Connection, staging: Any) -> None:
        spec, s = self._spec, sql()
        updated = [n for n in spec.arrow.names if n not in spec.key]
        action = (
            s.SQL("DO UPDATE SET {}").format(
                s.SQL(", ").join(
                    s.SQL("{} = EXCLUDED.{}").format(s.Identifier(n), s.Identifier(n))
                    for n in updated
                )
            )
            if updated
            else s.SQL("DO NOTHING")
        )
        keys = spec.columns(spec.key)
        # The epoch's last op of each key decides (TakesChanges): a delete (or an update's
        # delete half left last) removes the key, an insert upserts its row. The two halves
        # touch distinct keys, so one statement does both.
        matches = s.SQL(" AND ").join(
            s.SQL("t.{} = last.{}").format(s.Identifier(k), s.Identifier(k)) for k in spec.key
        )
        connection.execute(
            s.SQL(
                "WITH last AS (SELECT DISTINCT ON ({keys}) * FROM {staging} "
                "ORDER BY {keys}, {seq} DESC), "
                "gone AS (DELETE FROM {target} AS t USING last "
                "WHERE last.{op} IN (1, 2) AND {matches}) "
                "INSERT INTO {target} ({columns}) SELECT {columns} FROM last "
                "WHERE last.{op} IN (0, 3) ON CONFLICT ({keys}) {action}"
            ).format(
                target=spec.name(spec.table),
                columns=spec.columns(),
                keys=keys,
                staging=staging,
                seq=s.Identifier(_SEQ),
                op=s.Identifier(_OP),
                matches=matches,
                action=action,
            )
        )
        connection.execute(s.SQL("DROP TABLE {}").format(staging))

    async def discard(self, epoch: int) -> None:
        """Roll back what ``epoch`` staged: its open transaction, or its prepared one."""
        if self._epoch == epoch:
            self._take()  # dropped
        await self._worker.run(self._discard, epoch)

    def _discard(self, epoch: int) -> None:
        if self._epoch == epoch:
            self._rollback_open()
        connection = self._worker.live()
        gid = self._spec.gid(epoch, self._writer)
        if gid in prepared_gids(connection, gid):
            end_prepared(connection, "ROLLBACK", gid)

    async def close(self) -> None:
        """Close the connection; prepared epochs stay for the committer."""
        self._take()  # dropped
        self._transaction = None
        await self._worker.run(self._worker.close)

    def __repr__(self) -> str:
        return f"<PostgresStagingWriter {self._spec.qualified!r} w{self._writer}>"

    def executor_staging(self) -> PostgresExecutorWrites:
        """How Spark tasks write this table: each task attempt prepares a transaction of its
        own (:mod:`~barrierflow.connectors.postgres_executors`).

        Raises:
            InvalidArgumentError: the table has a key (tasks upserting one key would wait on
                each other's prepared transactions; see that module).
        """
        if self._spec.key:
            raise InvalidArgumentError(
                "table",
                "a PostgreSQL table without a key to write from Spark tasks (a prepared "
                "transaction keeps its row locks: tasks upserting one key would wait on each "
                "other)",
                f"{self._spec.qualified} keyed by {list(self._spec.key)}",
            )
        return PostgresExecutorWrites(self._spec, scratch_root(self._spec), _TaskWrite)


@final
class _TaskWrite(PostgresStagingWriter):
    """One Spark task attempt's write of its partition (a
    :class:`~barrierflow.connectors.executor_staging.TaskWrite`; blocking, on an executor): the
    writer's own copy and prepare, under the writer id ``p<partition>a<attempt>`` and the
    staging number as the epoch, the fence checked just before the ``PREPARE`` (see
    :mod:`~barrierflow.connectors.postgres_executors`). Connected when made; the connection is
    closed by :meth:`finish` (or, after a failure, when the write is collected: the server
    rolls back what was not prepared).

    Raises:
        PostgresUnavailableError: the database cannot be reached.
    """

    def __init__(self, spec: TableSpec, number: int, partition: int, attempt: int) -> None:
        super().__init__(spec, task_writer(partition, attempt))
        self._partition = partition
        self._epoch = number  # the open "epoch" the copy and the prepare use
        pg = psycopg()
        try:
            self._worker.live()
        except pg.Error as exc:
            raise PostgresUnavailableError(spec.qualified, f"{exc}".strip()) from exc

    def add(self, batch: pa.RecordBatch) -> None:
        """Buffer ``batch`` (conformed to the table's schema); copy the buffer into the
        attempt's transaction once ``batch_rows`` rows are buffered."""
        if not batch.num_rows:
            return
        what = f"partition {self._partition} of a micro-batch"
        full = False
        for piece in conform_schema(batch, self._spec.arrow, what).to_batches():
            full = self._buffer_add(piece)
        if full:
            self._copy_taken()

    def finish(self) -> Manifest:
        """Copy what is buffered and prepare the attempt's transaction (none without rows);
        its manifest is writer ``p<partition>``'s, naming the prepared transaction."""
        number = self._epoch
        assert number is not None
        try:
            self._copy_taken()
            staged = self._prepare(number)
        finally:
            self._worker.close()  # the fence lock goes with the session
        return Manifest(
            partition_writer(self._partition), number, () if staged is None else (staged,)
        )

    def _prepare(self, epoch: int) -> StagedFile | None:
        if self._transaction is not None:
            enter_fence(self._transaction, self._spec, epoch)
        return super()._prepare(epoch)


@final
class _ChangesWriter(PostgresStagingWriter):
    """The staging writer of a keyed table, which also applies a changelog
    (:class:`~barrierflow.actors.sinks.table.TakesChanges`): its rows reach the epoch's
    staging table with their op codes, and the stage deletes and upserts by key."""

    async def write_changes(self, batch: pa.RecordBatch, ops: pa.Array) -> None:
        """Buffer the last change of each key in ``batch`` (the only one that counts; the
        stage reduces the whole epoch the same way) with its op code."""
        batch, ops = last_change_per_key(batch, ops, self._spec.key)
        await self._buffer_rows(batch.append_column(_OP, ops.cast(pa.int8())))


@final
class PostgresCommitter:
    """Commits the epochs of a :class:`PostgresTable` (see the module): ``COMMIT PREPARED``
    of every writer's transaction, then the marker.

    Autocommit connections (``COMMIT PREPARED`` cannot run in a transaction): one for the
    checks and the marker, and one per transaction committed at once (up to 8), each opened
    at its first use and again after it broke; closed by :meth:`aclose`, or when the
    committer is collected.
    """

    def __init__(self, spec: TableSpec) -> None:
        self._spec = spec
        self._worker = _Worker(spec)
        self._lanes: list[_Worker] = []  # the connections committing prepared transactions

    async def recover(self, pending: Mapping[int, CommitMetadata]) -> None:
        """Create the marker tables if missing; roll back every prepared transaction of the
        sink that no pending epoch's metadata names (their rows are replayed)."""
        keep = {gid for metadata in pending.values() for gid in metadata.get("gids", ())}
        await self._worker.run(self._recover, keep)

    def _recover(self, keep: set[str]) -> None:
        connection = self._worker.live()
        declare(connection, self._spec)
        for gid in prepared_gids(connection, self._spec.gid_prefix()):
            if gid not in keep:
                end_prepared(connection, "ROLLBACK", gid)

    async def prepare(self, epoch: int, manifests: Sequence[Manifest]) -> CommitMetadata | None:
        """The epoch's prepared transactions, from every writer's manifest (``None`` if no
        writer prepared one).

        Raises:
            SchemaEvolutionError: a schema change (the table's columns are declared).
        """
        await anyio.lowlevel.checkpoint()
        change = manifests[0].schema_change if manifests else None
        if change is not None:
            raise SchemaEvolutionError(self._spec.qualified, epoch, change)
        gids = [f.path for m in manifests for f in m.files]
        if not gids:
            return None
        return {
            "gids": gids,
            "rows": sum(m.rows for m in manifests),
            **manifests_positions(manifests),
        }

    async def commit(self, epoch: int, metadata: CommitMetadata) -> CommitOutcome:
        """``COMMIT PREPARED`` each of the epoch's transactions still prepared — in parallel,
        one connection each, so that their WAL flushes share a group commit and the epoch is
        partial for as short a time as possible — then record the epoch and its positions in
        the marker (idempotent: an epoch at or below the marker is
        :class:`AlreadyCommitted`). A connection error, serialization failure or deadlock is
        :class:`RetryLater`; an undefined table, a missing permission or a transaction
        neither prepared nor committed (its rows lost: a
        :class:`~barrierflow.errors.SinkRecoveryError`) is :class:`Failed`."""
        gids = [str(g) for g in metadata.get("gids", ())]
        try:
            checked = await self._worker.run(self._check, epoch, gids)
            if not isinstance(checked, list):
                return checked
            await self._commit_prepared(checked)
            await self._worker.run(self._mark, epoch, gids, dict(metadata))
        except Exception as error:
            outcome = classify(single_leaf(error))  # type: ignore[arg-type]
            if outcome is None:
                raise
            return outcome
        return Committed()

    def _check(self, epoch: int, gids: list[str]) -> list[str] | AlreadyCommitted | Failed:
        """The gids to commit, or what the commit already is."""
        spec, s = self._spec, sql()
        marker, prepared, shared = self._worker.live().execute(
            s.SQL(
                "SELECT (SELECT epoch FROM {} WHERE sink = %s), "
                "ARRAY(SELECT gid FROM pg_prepared_xacts WHERE database = current_database() "
                "AND gid = ANY(%s)), ARRAY(SELECT gid FROM {} WHERE gid = ANY(%s))"
            ).format(spec.name(COMMITS_TABLE), spec.name(SHARES_TABLE)),
            [spec.sink, gids, gids],
        ).fetchone() or (None, [], [])
        if marker is not None and marker >= epoch:
            return AlreadyCommitted()
        # Each transaction is prepared (commit it) or was committed by an earlier call cut
        # short (its share row is visible); anything else lost its rows: refused before any
        # of the epoch becomes visible.
        lost = sorted(set(gids) - set(prepared) - set(shared))
        if lost:
            return Failed(
                SinkRecoveryError(
                    spec.qualified,
                    f"epoch {epoch} is pending with the prepared transactions {lost}, which "
                    "are neither prepared nor committed (rolled back outside barrierflow?)",
                )
            )
        return [gid for gid in gids if gid in prepared]

    async def _commit_prepared(self, gids: list[str]) -> None:
        while len(self._lanes) < min(len(gids), _MAX_LANES):
            self._lanes.append(_Worker(self._spec))
        lanes = self._lanes

        async def lane(index: int) -> None:
            for gid in gids[index :: len(lanes)]:
                await lanes[index].run(self._finish_on, lanes[index], gid)

        with single_error():
            async with anyio.create_task_group() as tg:
                for index in range(min(len(gids), len(lanes))):
                    tg.start_soon(lane, index)

    @staticmethod
    def _finish_on(lane: _Worker, gid: str) -> None:
        end_prepared(lane.live(), "COMMIT", gid)

    def _mark(self, epoch: int, gids: list[str], metadata: dict[str, Any]) -> None:
        """The marker, written last, and the epoch's share rows gone, in one statement."""
        spec, s = self._spec, sql()
        self._worker.live().execute(
            s.SQL(
                "WITH gone AS (DELETE FROM {} WHERE gid = ANY(%s)) "
                "INSERT INTO {} AS c (sink, epoch, rows, positions, positions_from) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (sink) DO UPDATE SET "
                "epoch = EXCLUDED.epoch, rows = c.rows + EXCLUDED.rows, "
                "commits = c.commits + 1, positions = EXCLUDED.positions, "
                "positions_from = EXCLUDED.positions_from, committed_at = now()"
            ).format(spec.name(SHARES_TABLE), spec.name(COMMITS_TABLE)),
            [
                gids,
                spec.sink,
                epoch,
                int(metadata.get("rows", 0)),
                positions_json(metadata, "positions"),
                positions_json(metadata, "positions_from"),
            ],
        )

    async def abort(self, epoch: int, metadata: CommitMetadata | None) -> None:
        """Roll back the epoch's prepared transactions (those its metadata names, and any
        other of the sink's for the same epoch)."""
        names = {str(g) for g in (metadata or {}).get("gids", ())}
        await self._worker.run(self._abort, epoch, names)

    def _abort(self, epoch: int, names: set[str]) -> None:
        connection = self._worker.live()
        prepared = set(prepared_gids(connection, self._spec.gid_prefix()))
        ours = {g for g in prepared if g.startswith(self._spec.gid_prefix(epoch))}
        for gid in sorted((names & prepared) | ours):
            end_prepared(connection, "ROLLBACK", gid)

    async def sink_commits(self) -> SinkCommits | None:
        """What the table holds: the marker's epoch and positions (``None``: none yet)."""
        found: SinkCommits | None = await self._worker.run(self._read_marker)
        return found

    def _read_marker(self) -> SinkCommits | None:
        spec, s = self._spec, sql()
        row = (
            self._worker.live()
            .execute(
                s.SQL("SELECT epoch, positions FROM {} WHERE sink = %s").format(
                    spec.name(COMMITS_TABLE)
                ),
                [spec.sink],
            )
            .fetchone()
        )
        if row is None or row[0] <= 0:
            return None
        return SinkCommits(spec.qualified, int(row[0]), {k: int(v) for k, v in row[1].items()})

    async def aclose(self) -> None:
        """Close the committer's connections."""
        for worker in (self._worker, *self._lanes):
            await worker.run(worker.close)
