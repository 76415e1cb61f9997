"""PostgresTable on a real PostgreSQL server: the commit protocol with crash steps, a pipeline
of four writers, recovery by ``pg_prepared_xacts``, a server killed mid-epoch, a permanent
commit failure, the schema check at declaration, upsert by key and a changelog applied by
key; the demo writing PostgreSQL, killed mid-commit and resumed (a subprocess, with Spark).

Each test keeps to its own table (``postgres_server.unique_name()``) on the session's server.
The crash steps' children build their tables with :func:`conformance_table` (importable by
name: ``tests/`` is on the path the suite hands them), reaching the table the test names in
:data:`DSN_ENV` and :data:`TABLE_ENV`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import psycopg
import psycopg.errors
import pyarrow as pa
import pytest
from _timeouts import scaled

from barrierflow.actors import add_sink
from barrierflow.actors.sinks.table import (
    AlreadyCommitted,
    Committed,
    Failed,
    Manifest,
    RetryLater,
    TakesChanges,
)
from barrierflow.channels import Chunk, Op
from barrierflow.connectors import PostgresTable
from barrierflow.connectors._postgres_sql import classify
from barrierflow.errors import (
    ActorFailedError,
    PostgresSchemaMismatchError,
    PostgresUnavailableError,
    SinkRecoveryError,
    SinkWriterInputError,
    TableCommitFailedError,
)
from barrierflow.runtime import Fanout, Runtime, RuntimeConfig
from barrierflow.testing import PostgresServer, check_table
from barrierflow.testing._server_process import wait_exited
from barrierflow.testing.postgres_server import postgres_directory

DSN_ENV = "BARRIERFLOW_TEST_POSTGRES_DSN"
TABLE_ENV = "BARRIERFLOW_TEST_POSTGRES_TABLE"

SCHEMA = pa.schema([("id", pa.int64())])
KEYED = pa.schema([("id", pa.int64()), ("v", pa.string())])


def conformance_table() -> PostgresTable:
    """The table the crash steps' children build (and this process, as after a restart)."""
    return PostgresTable(os.environ[DSN_ENV], os.environ[TABLE_ENV], SCHEMA)


def conformance_ids() -> list[int]:
    """The ids a reader of that table sees now."""
    return select(os.environ[DSN_ENV], f'SELECT id FROM "{os.environ[TABLE_ENV]}"')


def select(dsn: str, query: str, *params: Any) -> list[Any]:
    """The first column of ``query``'s rows, read by a plain psycopg connection."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        return [row[0] for row in connection.execute(query, params).fetchall()]


def execute(dsn: str, statement: str) -> None:
    """Run ``statement`` (no result) on a plain psycopg connection."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(statement)  # type: ignore[call-overload]  # a test's own SQL


def prepared(dsn: str, table: str) -> list[str]:
    """The gids of the prepared transactions of the sink writing ``table``."""
    return select(
        dsn, "SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, %s)", f"bf:public.{table}:"
    )


def assert_holds_only(dsn: str, table: str, rows: list[int]) -> None:
    """``table`` holds exactly the ids ``rows`` (in any order), committed, and no prepared
    transaction of its sink is left behind: an epoch's end state after a crash or a replay."""
    assert sorted(select(dsn, f'SELECT id FROM "{table}"')) == rows
    assert prepared(dsn, table) == []


def ids(rows: list[int]) -> pa.RecordBatch:
    return pa.record_batch([pa.array(rows, pa.int64())], schema=SCHEMA)


async def staged(table: PostgresTable, writer: str, epoch: int, rows: list[int]) -> Manifest:
    w = table.writer(writer)
    await w.open()
    await w.begin(epoch)
    await w.write(ids(rows))
    manifest = await w.stage(epoch)
    await w.close()
    return manifest


@pytest.mark.anyio
@pytest.mark.postgres
@pytest.mark.subprocess  # the crash steps fork children
async def test_postgres_table_keeps_the_commit_protocol_through_crashes(
    postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DSN_ENV, postgres_server.dsn)
    monkeypatch.setenv(TABLE_ENV, postgres_server.unique_name())
    report = await check_table(conformance_table, conformance_ids, crash_steps=True)
    report.raise_for_failures()
    assert len(report.results) == 20  # the in-process rules and every crash rule ran
    assert prepared(postgres_server.dsn, os.environ[TABLE_ENV]) == []


def build(dsn: str, table: str, state: str) -> tuple[Runtime, Any]:
    rt = Runtime(RuntimeConfig(state_path=state, barrier_interval=3600.0))
    rt.add_source("src", fanout=Fanout("hash", ("id",)), schema=SCHEMA)
    sink = add_sink(rt, "pg", PostgresTable(dsn, table, SCHEMA), input="src", parallelism=4)
    return rt, sink


@pytest.mark.anyio
@pytest.mark.postgres
async def test_four_writers_commit_every_row_exactly_once_across_a_restart(
    postgres_server: PostgresServer, tmp_path: Any
) -> None:
    dsn, table = postgres_server.dsn, postgres_server.unique_name()
    state = str(tmp_path / "state.db")
    rt, sink = build(dsn, table, state)
    async with rt:
        for start in range(0, 400, 100):
            await rt.push("src", Chunk(ids(list(range(start, start + 100)))))
            epoch = await rt.checkpoint()
            with anyio.fail_after(scaled(20)):
                await sink.coordinator.wait_committed(epoch)
        # Every writer's share of each epoch was its own prepared transaction.
        assert sorted(select(dsn, f'SELECT id FROM "{table}"')) == list(range(400))
        await rt.push("src", Chunk(ids(list(range(400, 450)))))
    rt, sink = build(dsn, table, state)
    async with rt:
        await rt.push("src", Chunk(ids(list(range(450, 500)))))
        epoch = await rt.checkpoint()
        with anyio.fail_after(scaled(20)):
            await sink.coordinator.wait_committed(epoch)
    assert sorted(select(dsn, f'SELECT id FROM "{table}"')) == list(range(500))
    assert prepared(dsn, table) == []
    marker = select(dsn, "SELECT epoch FROM bf_sink_commits WHERE sink = %s", f"public.{table}")
    assert marker == [epoch]


@pytest.mark.anyio
@pytest.mark.postgres
async def test_recovery_commits_the_pending_epoch_and_rolls_back_the_unknown_one(
    postgres_server: PostgresServer,
) -> None:
    dsn, name = postgres_server.dsn, postgres_server.unique_name()
    table = PostgresTable(dsn, name, SCHEMA)
    committer = table.committer()
    await committer.recover({})
    pending = await committer.prepare(
        5, [await staged(table, "0", 5, [1, 2]), await staged(table, "1", 5, [3])]
    )
    # Epoch 6 was prepared by its writers but never reached the meta store.
    await committer.prepare(6, [await staged(table, "0", 6, [4]), await staged(table, "1", 6, [5])])
    assert pending is not None
    assert len(prepared(dsn, name)) == 4
    restarted = PostgresTable(dsn, name, SCHEMA).committer()
    await restarted.recover({5: pending})
    assert sorted(prepared(dsn, name)) == sorted(pending["gids"])
    assert await restarted.commit(5, pending) == Committed()
    assert await restarted.commit(5, pending) == AlreadyCommitted()
    assert_holds_only(dsn, name, [1, 2, 3])


@pytest.mark.anyio
@pytest.mark.postgres
async def test_a_server_killed_mid_epoch_keeps_prepared_epochs_and_loses_the_open_one(
    postgres_restartable: PostgresServer,
) -> None:
    server = postgres_restartable
    dsn, name = server.dsn, server.unique_name()
    table = PostgresTable(dsn, name, SCHEMA)
    committer = table.committer()
    await committer.recover({})
    writer = table.writer("0")
    await writer.open()
    await writer.begin(1)
    await writer.write(ids([1, 2]))
    metadata = await committer.prepare(1, [await writer.stage(1)])
    assert metadata is not None
    await writer.begin(2)
    await writer.write(ids([3]))
    await writer.flush()  # epoch 2's rows are in an open transaction when the server dies
    await anyio.to_thread.run_sync(server.stop)
    outcome = await committer.commit(1, metadata)
    assert isinstance(outcome, RetryLater)  # the coordinator retries after its backoff
    await anyio.to_thread.run_sync(server.start)
    with pytest.raises(psycopg.OperationalError):
        await writer.stage(2)  # its transaction died with the server: the epoch is replayed
    await writer.discard(2)
    await writer.begin(2)
    await writer.write(ids([3]))
    replayed = await committer.prepare(2, [await writer.stage(2)])
    await writer.close()
    assert replayed is not None
    assert await committer.commit(1, metadata) == Committed()
    assert await committer.commit(2, replayed) == Committed()
    assert_holds_only(dsn, name, [1, 2, 3])


@pytest.mark.anyio
@pytest.mark.postgres
async def test_an_epoch_whose_connection_was_lost_never_continues_on_a_new_one(
    postgres_restartable: PostgresServer,
) -> None:
    server = postgres_restartable
    dsn, name = server.dsn, server.unique_name()
    writer = PostgresTable(dsn, name, SCHEMA).writer("0")
    await writer.open()
    await writer.begin(1)
    await writer.write(ids([1]))
    await writer.flush()  # row 1 lives in the transaction the server's crash ends
    await anyio.to_thread.run_sync(server.stop)
    await anyio.to_thread.run_sync(server.start)
    for row in (2, 3):  # a retried flush must not copy into a connection opened since
        await writer.write(ids([row]))
        with pytest.raises(psycopg.OperationalError):
            await writer.flush()
    with pytest.raises(psycopg.OperationalError):
        await writer.stage(1)
    await writer.close()
    assert_holds_only(dsn, name, [])  # nothing committed on the side


@pytest.mark.anyio
@pytest.mark.postgres
async def test_a_commit_whose_marker_table_was_dropped_fails_for_good(
    postgres_server: PostgresServer,
) -> None:
    dsn, name = postgres_server.dsn, postgres_server.unique_name()
    table = PostgresTable(dsn, name, SCHEMA, db_schema=name)  # its own marker tables
    committer = table.committer()
    await committer.recover({})
    metadata = await committer.prepare(3, [await staged(table, "0", 3, [7])])
    assert metadata is not None
    execute(dsn, f'DROP TABLE "{name}".bf_sink_commits')
    outcome = await committer.commit(3, metadata)
    assert isinstance(outcome, Failed)
    assert isinstance(outcome.cause, psycopg.errors.UndefinedTable)
    # Refused before anything became visible: the epoch stays prepared for a restart.
    assert select(dsn, f'SELECT id FROM "{name}"."{name}"') == []
    restarted = PostgresTable(dsn, name, SCHEMA, db_schema=name).committer()
    await restarted.recover({3: metadata})  # the marker table is declared again
    assert await restarted.commit(3, metadata) == Committed()
    assert select(dsn, f'SELECT id FROM "{name}"."{name}"') == [7]


@pytest.mark.anyio
@pytest.mark.postgres
async def test_a_commit_on_a_dropped_marker_table_fails_the_pipeline(
    postgres_server: PostgresServer, tmp_path: Any
) -> None:
    dsn, name = postgres_server.dsn, postgres_server.unique_name()
    rt = Runtime(RuntimeConfig(state_path=str(tmp_path / "state.db"), barrier_interval=3600.0))
    rt.add_source("src", schema=SCHEMA)
    sink = add_sink(rt, "pg", PostgresTable(dsn, name, SCHEMA, db_schema=name), input="src")
    drop = f'DROP TABLE "{name}".bf_sink_commits'
    with anyio.fail_after(scaled(30)), pytest.raises(ActorFailedError) as info:
        async with rt:
            await rt.push("src", Chunk(ids([1])))
            await sink.coordinator.wait_committed(await rt.checkpoint())
            await anyio.to_thread.run_sync(execute, dsn, drop)
            await rt.push("src", Chunk(ids([2])))
            failed = await rt.checkpoint()  # durable: its commit finds no marker table
            await anyio.sleep_forever()  # the runtime fails and cancels this
    assert info.value.actor == "pg.coordinator"
    error = info.value.cause
    assert isinstance(error, TableCommitFailedError)
    assert (error.sink, error.epoch, error.permanent) == ("pg", failed, True)
    assert isinstance(error.cause, psycopg.errors.UndefinedTable)
    assert select(dsn, f'SELECT id FROM "{name}"."{name}"') == [1]


@pytest.mark.anyio
@pytest.mark.postgres
async def test_a_prepared_transaction_lost_outside_barrierflow_fails_the_commit(
    postgres_server: PostgresServer,
) -> None:
    dsn, name = postgres_server.dsn, postgres_server.unique_name()
    table = PostgresTable(dsn, name, SCHEMA)
    committer = table.committer()
    await committer.recover({})
    metadata = await committer.prepare(
        4, [await staged(table, "0", 4, [1]), await staged(table, "1", 4, [2])]
    )
    assert metadata is not None
    execute(dsn, f"ROLLBACK PREPARED '{metadata['gids'][1]}'")
    outcome = await committer.commit(4, metadata)
    assert isinstance(outcome, Failed)
    assert isinstance(outcome.cause, SinkRecoveryError)
    assert select(dsn, f'SELECT id FROM "{name}"') == []  # no writer's rows went in


@pytest.mark.postgres
def test_a_server_left_dead_on_the_data_does_not_stop_the_next_start(
    postgres_restartable: PostgresServer,
) -> None:
    left = postgres_restartable.pid
    assert left is not None
    # Killed and never reaped (its parent gone, say): a zombie still holding its pid, which
    # its lock files name.
    os.killpg(left, signal.SIGKILL)
    again = PostgresServer(postgres_restartable.directory)
    again.start()
    try:
        assert select(again.dsn, "SELECT 1") == [1]
    finally:
        again.stop()


@pytest.mark.postgres
@pytest.mark.subprocess
def test_a_server_in_its_callers_group_dies_with_that_group() -> None:
    from barrierflow.testing.postgres_server import postgres_directory

    directory = postgres_directory()
    code = (
        "import sys\n"
        "from barrierflow.testing.postgres_server import PostgresServer\n"
        "server = PostgresServer(sys.argv[1], own_group=False)\n"
        "server.start()\n"
        "print(server.pid, flush=True)\n"
        "sys.stdin.read()\n"
    )
    try:
        with subprocess.Popen(
            [sys.executable, "-c", code, str(directory)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,  # the demo's group, as a crash harness kills it
        ) as child:
            assert child.stdout is not None
            postmaster = int(child.stdout.readline())
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(timeout=scaled(10))
        # The server is not our child: its exit is waited for through a pidfd.
        still = wait_exited([postmaster], scaled(10))
        assert not still, "the server outlived the kill of its caller's group"
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.postgres
def test_an_existing_table_of_another_column_type_is_refused_at_declaration(
    postgres_server: PostgresServer,
) -> None:
    dsn, name = postgres_server.dsn, postgres_server.unique_name()
    execute(dsn, f'CREATE TABLE "{name}" (id text, v text)')
    with pytest.raises(PostgresSchemaMismatchError) as info:
        PostgresTable(dsn, name, SCHEMA)
    assert (info.value.column, info.value.table_has, info.value.schema_wants) == (
        "id",
        "text",
        "bigint",
    )
    with pytest.raises(PostgresSchemaMismatchError) as missing:
        PostgresTable(dsn, name, pa.schema([("v", pa.string()), ("w", pa.int32())]))
    assert (missing.value.column, missing.value.table_has) == ("w", "no such column")
    with pytest.raises(PostgresSchemaMismatchError) as keyless:
        PostgresTable(dsn, name, pa.schema([("v", pa.string())]), key=["v"])
    assert keyless.value.column == "v"
    assert keyless.value.schema_wants == "a primary key or unique index on the upsert key"
    PostgresTable(dsn, name, pa.schema([("v", pa.string())]))  # a fitting subset is fine


@pytest.mark.postgres
def test_a_declaration_the_database_refuses_is_a_typed_error(
    postgres_server: PostgresServer,
) -> None:
    role = postgres_server.unique_name("reader")
    execute(postgres_server.dsn, f"CREATE ROLE {role} LOGIN")
    dsn = postgres_server.dsn.replace("user=postgres", f"user={role}")
    with pytest.raises(PostgresUnavailableError) as info:
        PostgresTable(dsn, "t", SCHEMA, db_schema=postgres_server.unique_name())
    assert isinstance(info.value.__cause__, psycopg.errors.InsufficientPrivilege)
    assert "42501" in info.value.reason


@pytest.mark.anyio
@pytest.mark.postgres
async def test_a_role_that_may_write_but_not_create_declares_and_commits(
    postgres_server: PostgresServer,
) -> None:
    owner_dsn, namespace = postgres_server.dsn, postgres_server.unique_name()
    role = postgres_server.unique_name("writer")
    PostgresTable(owner_dsn, "t", SCHEMA, db_schema=namespace)  # made by its owner
    for statement in (
        f"CREATE ROLE {role} LOGIN",
        f"GRANT USAGE ON SCHEMA {namespace} TO {role}",
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {namespace} TO {role}",
    ):
        execute(owner_dsn, statement)
    # No CREATE on the database or the schema: the declaration only checks what exists.
    table = PostgresTable(
        owner_dsn.replace("user=postgres", f"user={role}"), "t", SCHEMA, db_schema=namespace
    )
    committer = table.committer()
    await committer.recover({})
    metadata = await committer.prepare(1, [await staged(table, "0", 1, [1, 2])])
    assert metadata is not None
    assert await committer.commit(1, metadata) == Committed()
    await committer.aclose()
    assert sorted(select(owner_dsn, f"SELECT id FROM {namespace}.t")) == [1, 2]


@pytest.mark.anyio
@pytest.mark.postgres
async def test_upsert_by_key_keeps_the_last_row_of_each_key(
    postgres_server: PostgresServer,
) -> None:
    dsn, name = postgres_server.dsn, postgres_server.unique_name()
    table = PostgresTable(dsn, name, KEYED, key=("id",), batch_rows=2)
    committer = table.committer()
    await committer.recover({})
    writer = table.writer("0")
    await writer.open()

    async def epoch(number: int, rows: list[tuple[int, str]]) -> None:
        await writer.begin(number)
        for key, value in rows:  # one batch per row: copied in several rounds
            await writer.write(pa.record_batch([[key], [value]], schema=KEYED))
        metadata = await committer.prepare(number, [await writer.stage(number)])
        assert metadata is not None
        assert await committer.commit(number, metadata) == Committed()

    await epoch(1, [(1, "a"), (2, "b"), (1, "c")])
    await epoch(2, [(2, "d"), (3, "e")])
    await writer.close()
    with psycopg.connect(dsn) as connection:
        rows = connection.execute(f'SELECT id, v FROM "{name}" ORDER BY id').fetchall()
    assert rows == [(1, "c"), (2, "d"), (3, "e")]
    assert prepared(dsn, name) == []


def test_commit_errors_are_classified_by_sqlstate() -> None:
    assert isinstance(classify(psycopg.errors.UndefinedTable("gone")), Failed)
    assert isinstance(classify(psycopg.errors.InsufficientPrivilege("no")), Failed)
    assert isinstance(classify(psycopg.errors.NumericValueOutOfRange("big")), Failed)
    assert isinstance(classify(psycopg.errors.SerializationFailure("race")), RetryLater)
    assert isinstance(classify(psycopg.errors.DeadlockDetected("cycle")), RetryLater)
    assert isinstance(classify(psycopg.errors.AdminShutdown("bye")), RetryLater)
    assert isinstance(classify(psycopg.OperationalError("connection refused")), RetryLater)
    assert isinstance(classify(ConnectionResetError()), RetryLater)
    assert classify(ValueError("not the database's")) is None


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_postgres_demo_killed_mid_commit_then_resumed_holds_every_row_once() -> None:
    from test_demo import demo

    from barrierflow.app.chaos.audit_postgres import audit_postgres

    # Not under pytest's temporary directory: as root, the demo's server runs as another user,
    # and any pytest session starting meanwhile makes pytest's directory private to root again.
    base = postgres_directory()
    try:
        _demo_killed_then_resumed(base / "pg", demo, audit_postgres)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _demo_killed_then_resumed(workdir: Path, demo: Any, audit_postgres: Any) -> None:
    common = ["--rows", "20000", "--batches", "4", "--table", "postgres"]
    crashed = demo(workdir, *common, "--crash-after", "1", "--crash-point", "mid-commit")
    assert crashed.returncode == -9, crashed.stdout[-2000:] + crashed.stderr[-3000:]
    assert crashed.stdout.strip().splitlines()[-2].startswith("CRASH mid-commit")
    # The killed driver's server outlived it; the resume kills it and recovers its data.
    resumed = demo(workdir, "--resume")  # the manifest says which table
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    *_, totals, last = resumed.stdout.strip().splitlines()
    assert totals.startswith("20,000 of 20,000 rows asked are in the PostgreSQL table")
    # Read back with psycopg on the demo's server (started by the audit, and stopped).
    audit = audit_postgres(workdir, complete=True)
    assert audit.clean, audit.summary()
    epochs = audit.facts["commits"]
    assert epochs in (3, 4)  # one per micro-batch; a restart may plan fewer
    assert last == f"VERIFIED rows_in=20000 rows_out=20000 duplicates=0 epochs={epochs}"


def test_the_chaos_spark_act_writes_postgres_in_turn_and_audits_it_with_psycopg(
    tmp_path: Path,
) -> None:
    from barrierflow.app.chaos.acts import ACTS, audit_spark

    assert "postgres" in ACTS["spark"].tables
    assert "postgres" not in ACTS["spark-executors"].tables  # Spark tasks stage files only
    round_ = ACTS["spark"].writing("postgres")
    assert round_.sizes[-2:] == ("--table", "postgres")
    # A finished run that left no server data is a finding, not a silent pass.
    audit = audit_spark(tmp_path, complete=True, table="postgres")
    assert [f.rule for f in audit.findings] == ["no_table"]


@pytest.mark.postgres
def test_the_chaos_audit_reads_an_empty_postgres_table() -> None:
    from barrierflow.app._demo_input import SCHEMA as EVENTS
    from barrierflow.app.chaos.audit_postgres import DATA, audit_postgres
    from barrierflow.testing.postgres_server import postgres_directory

    # Under the system's temporary directory, as the fixture's servers: a path the server's
    # user reaches whatever another pytest session does to its own base directory meanwhile.
    workdir = postgres_directory()
    server = PostgresServer(workdir / DATA, durable=True)
    server.start()
    try:  # killed before the first commit: the table declared, no row yet
        PostgresTable(server.dsn, "events", EVENTS, db_schema="barrierflow_demo")
        server.stop()
        audit = audit_postgres(workdir, complete=False)
    finally:
        server.remove()
        shutil.rmtree(workdir, ignore_errors=True)
    assert audit.clean, audit.summary()
    assert (audit.rows_out, audit.facts["commits"]) == (0, 0)


def changes(rows: list[tuple[int, str, Op]]) -> Chunk:
    """A changelog chunk of ``(id, v, op)`` rows."""
    ids_, values, ops = zip(*rows, strict=True)
    return Chunk(pa.record_batch([list(ids_), list(values)], schema=KEYED)).with_ops(list(ops))


def applied(model: dict[int, str], rows: list[tuple[int, str, Op]]) -> None:
    """The reference: ``rows`` applied to ``model`` one at a time, in order."""
    for key, value, op in rows:
        if op in (Op.INSERT, Op.UPDATE_INSERT):
            model[key] = value
        else:
            model.pop(key, None)


def keyed_rows(dsn: str, table: str) -> dict[int, str]:
    with psycopg.connect(dsn) as connection:
        return dict(connection.execute(f'SELECT id, v FROM "{table}"').fetchall())


# Each epoch's changelog: updates as UPDATE_DELETE + UPDATE_INSERT pairs, deletes, a delete
# then an insert of one key and an insert then a delete of another within the epoch, and an
# update's delete half left last (its insert half went to another key).
CHANGELOG: list[list[tuple[int, str, Op]]] = [
    [(1, "a", Op.INSERT), (2, "b", Op.INSERT), (3, "c", Op.INSERT), (4, "d", Op.INSERT)],
    [
        (1, "a", Op.UPDATE_DELETE),
        (1, "a2", Op.UPDATE_INSERT),
        (2, "b", Op.DELETE),
        (3, "c", Op.DELETE),
        (3, "c2", Op.INSERT),  # deleted then inserted: present
        (5, "e", Op.INSERT),
        (5, "e", Op.DELETE),  # inserted then deleted: absent
        (6, "f", Op.DELETE),  # a key never written
    ],
    [
        (4, "d", Op.UPDATE_DELETE),
        (4, "d2", Op.UPDATE_INSERT),
        (1, "a2", Op.DELETE),
        (3, "c2", Op.UPDATE_DELETE),  # an update moving the row to another key
        (7, "c2", Op.UPDATE_INSERT),
    ],
]


def build_changes(dsn: str, table: str, state: str, *, key: bool = True) -> tuple[Runtime, Any]:
    rt = Runtime(RuntimeConfig(state_path=state, barrier_interval=3600.0))
    rt.add_source("src", fanout=Fanout("hash", ("id",)), schema=KEYED)
    pg = PostgresTable(dsn, table, KEYED, key=("id",) if key else None)
    sink = add_sink(rt, "pg", pg, input="src", parallelism=2, key=["id"])
    return rt, sink


@pytest.mark.anyio
@pytest.mark.postgres
async def test_a_changelog_upserts_and_deletes_by_key_in_order_within_each_epoch(
    postgres_server: PostgresServer, tmp_path: Any
) -> None:
    dsn, table = postgres_server.dsn, postgres_server.unique_name()
    rt, sink = build_changes(dsn, table, str(tmp_path / "state.db"))
    model: dict[int, str] = {}
    async with rt:
        for rows in CHANGELOG:
            # Split in two chunks: an epoch's order spans its chunks.
            await rt.push("src", changes(rows[: len(rows) // 2]))
            await rt.push("src", changes(rows[len(rows) // 2 :]))
            applied(model, rows)
            epoch = await rt.checkpoint()
            with anyio.fail_after(scaled(20)):
                await sink.coordinator.wait_committed(epoch)
            assert keyed_rows(dsn, table) == model
    assert model == {4: "d2", 7: "c2"}
    assert prepared(dsn, table) == []


@pytest.mark.anyio
@pytest.mark.postgres
async def test_a_changelog_epoch_replayed_after_a_crash_is_applied_once(
    postgres_server: PostgresServer,
) -> None:
    dsn, name = postgres_server.dsn, postgres_server.unique_name()
    table = PostgresTable(dsn, name, KEYED, key=("id",))
    committer = table.committer()
    await committer.recover({})

    async def stage(epoch: int, rows: list[tuple[int, str, Op]]) -> Manifest:
        writer = table.writer("0")
        assert isinstance(writer, TakesChanges)
        await writer.open()
        await writer.begin(epoch)
        chunk = changes(rows)
        await writer.write_changes(chunk.batch, pa.array(chunk.ops_numpy()))
        manifest = await writer.stage(epoch)
        await writer.close()
        return manifest

    first = await committer.prepare(1, [await stage(1, CHANGELOG[0])])
    assert first is not None
    assert await committer.commit(1, first) == Committed()
    # Epoch 2 is pending when the process dies: the restarted committer commits it, once.
    pending = await committer.prepare(2, [await stage(2, CHANGELOG[1])])
    assert pending is not None
    restarted = PostgresTable(dsn, name, KEYED, key=("id",)).committer()
    await restarted.recover({2: pending})
    assert await restarted.commit(2, pending) == Committed()
    assert await restarted.commit(2, pending) == AlreadyCommitted()
    # Epoch 3 was prepared but never reached the meta store: rolled back, then replayed.
    # (Staged only now: a prepared epoch keeps its keys' row locks until its commit.)
    await restarted.prepare(3, [await stage(3, CHANGELOG[2])])
    restarted = PostgresTable(dsn, name, KEYED, key=("id",)).committer()
    await restarted.recover({})
    replayed = await restarted.prepare(3, [await stage(3, CHANGELOG[2])])
    assert replayed is not None
    assert await restarted.commit(3, replayed) == Committed()
    model: dict[int, str] = {}
    for rows in CHANGELOG:
        applied(model, rows)
    assert keyed_rows(dsn, name) == model
    assert prepared(dsn, name) == []


@pytest.mark.anyio
@pytest.mark.postgres
async def test_a_table_without_key_refuses_a_changelog(
    postgres_server: PostgresServer, tmp_path: Any
) -> None:
    dsn, table = postgres_server.dsn, postgres_server.unique_name()
    assert not isinstance(PostgresTable(dsn, table, KEYED).writer("0"), TakesChanges)
    rt, _ = build_changes(dsn, table, str(tmp_path / "state.db"), key=False)
    with pytest.raises(ActorFailedError) as info:
        async with rt:
            await rt.push("src", changes(CHANGELOG[1]))
            await rt.checkpoint()
    cause = info.value.cause
    assert isinstance(cause, SinkWriterInputError)
    assert cause.expected == "insert-only chunks (the sink is append-only)"
    assert keyed_rows(dsn, table) == {}
