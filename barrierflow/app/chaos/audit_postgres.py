"""The audit of the Spark act's PostgreSQL table (``barrierflow demo --table postgres``), read
with psycopg from the database itself, against the act's input files.

Read without any of the pipeline's code: the demo's own server (its data under
``<workdir>/postgres``) is started for the audit — it finds a server a killed run left behind
on that data and kills it first, so the audit sees what the crash left, recovered as
PostgreSQL recovers — and stopped again; the table ``barrierflow_demo.events`` is copied out
with ``COPY … TO STDOUT``, and the sink's marker row, its share rows and the prepared
transactions are read from ``bf_sink_commits``, ``bf_sink_shares`` and ``pg_prepared_xacts``.
Rules:

* the rows read, as a multiset of ``(key, value)``, equal the input's (:mod:`.audit`) — while
  a run is cut short, a subset without duplicates;
* the marker's row count never exceeds the rows read (the marker is written after every
  writer's ``COMMIT PREPARED``), and equals it once the run has finished;
* once the run has finished, nothing of the sink is left prepared and no share row is left.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv

from barrierflow.app.chaos.audit import Audit, spark_input

__all__ = ["DATA", "SCHEMA", "SINK", "audit_postgres"]

#: The demo's own server's directory, under the work directory.
DATA = Path("postgres")
#: The PostgreSQL schema of the act's table, and the sink's name (its gid prefix and marker).
SCHEMA = "barrierflow_demo"
SINK = f"{SCHEMA}.events"


def audit_postgres(workdir: Path, *, complete: bool) -> Audit:
    """Audit the Spark act's PostgreSQL table in ``workdir`` (see the module)."""
    from barrierflow.testing.postgres_server import PostgresServer

    audit = Audit(complete)
    if not (workdir / DATA / "data" / "PG_VERSION").exists():
        if complete:
            audit.add("no_table", f"no server data in {workdir / DATA}")
        return audit
    server = PostgresServer(workdir / DATA, durable=True, own_group=False)
    server.start()
    try:
        _audit(server.dsn, spark_input(workdir), audit)
    finally:
        server.stop()
    return audit


def _audit(dsn: str, expected: pa.Table | None, audit: Audit) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, autocommit=True) as connection:
        exists = connection.execute("SELECT to_regclass(%s)", [SINK]).fetchone()
        if exists is None or exists[0] is None:
            if audit.complete:
                audit.add("no_table", f"no table {SINK}")
            return
        out = bytearray()
        statement = sql.SQL("COPY {} (key, value) TO STDOUT (FORMAT csv)").format(
            sql.Identifier(SCHEMA, "events")
        )
        with connection.cursor() as cursor, cursor.copy(statement) as copy:
            for block in copy:
                out += block
        marker = connection.execute(
            sql.SQL("SELECT epoch, rows, commits FROM {} WHERE sink = %s").format(
                sql.Identifier(SCHEMA, "bf_sink_commits")
            ),
            [SINK],
        ).fetchone()
        shares = connection.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE sink = %s").format(
                sql.Identifier(SCHEMA, "bf_sink_shares")
            ),
            [SINK],
        ).fetchone()
        prepared = connection.execute(
            "SELECT count(*) FROM pg_prepared_xacts WHERE starts_with(gid, %s)", [f"bf:{SINK}:"]
        ).fetchone()
    columns = pa.schema([("key", pa.int64()), ("value", pa.float64())])
    rows = (
        pacsv.read_csv(
            pa.py_buffer(bytes(out)),
            read_options=pacsv.ReadOptions(column_names=columns.names),
            convert_options=pacsv.ConvertOptions(column_types=columns),
        )
        if out
        else columns.empty_table()  # Arrow's reader refuses an empty file
    )
    audit.count_against_input(expected, rows)
    epoch, marked, commits = marker if marker is not None else (0, 0, 0)
    audit.facts["commits"] = int(commits)
    audit.facts["last_epoch"] = int(epoch)
    if marked > rows.num_rows or (audit.complete and marked != rows.num_rows):
        audit.add(
            "marker_count_mismatch",
            f"the marker counts {marked} rows committed, a read gave {rows.num_rows}",
        )
    if audit.complete and prepared is not None and prepared[0]:
        audit.add("prepared_leftover", f"{prepared[0]} prepared transactions of {SINK}")
    if audit.complete and shares is not None and shares[0]:
        audit.add("share_leftover", f"{shares[0]} share rows of {SINK}")
