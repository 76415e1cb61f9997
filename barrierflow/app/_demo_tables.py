"""The Spark demo's two tables: an Iceberg table (pyiceberg, a local SQLite catalog) or a Delta
Lake table (deltalake), chosen with ``barrierflow demo --table iceberg|delta``.

Both are coordinated exactly-once tables: 4 parallel writers stage Parquet files and the
coordinator commits each epoch once — one Iceberg snapshot, or one Delta commit carrying the
application transaction ``(app id, epoch)``. What differs is where they live in the work
directory and how the demo reads them back, which is what :class:`DemoTable` holds. The read-back
uses each format's own reader (pyiceberg's scan, deltalake's ``to_pyarrow_table``), never the
sink's code.
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
    "TableChoice",
    "open_table",
]

#: The Iceberg table, in the SQLite catalog under ``<workdir>/warehouse``.
ICEBERG_TABLE = "demo.events"
#: The Delta table's directory, under the work directory.
DELTA_PATH = Path("delta", "events")
#: The application id of the Delta table's transactions: the sink's name.
DELTA_APP_ID = "events"


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


def open_table(choice: TableChoice, workdir: Path) -> DemoTable:
    """The demo's table ``choice`` in ``workdir``, created if new (blocking)."""
    if choice == "delta":
        return DeltaDemoTable(workdir)
    return IcebergDemoTable(workdir)
