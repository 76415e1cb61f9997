"""The audit of the Spark act: its Iceberg table, read with pyiceberg, against its input files.

Read without any of the pipeline's code: the SQLite catalog under ``<workdir>/warehouse``
(``SqlCatalog``), the table ``demo.events``, and the generated input as plain Parquet files
(``<workdir>/input/part-*.parquet``, each whole: they are renamed into place). Rules:

* the rows, as a multiset of ``(key, value)``, equal the input's (:mod:`.audit`);
* every snapshot names the epoch it committed (summary ``barrierflow.epoch``), and epochs
  strictly increase from snapshot to snapshot: one snapshot per epoch;
* snapshots only append: each holds every data file of the one before, and no data file is
  referenced twice, in a snapshot or across the snapshots that added it;
* every data file the table references exists, and its record count adds up to the table's;
* nothing a reader could trip over is left once the run has finished: no staged file, and no
  Parquet file under the table's data directory that no snapshot references (a keyed step's
  state, under ``_barrierflow_state``, is its state store's, not the table's).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from barrierflow.app.chaos.audit import Audit, spark_input
from barrierflow.spark_bridge.task_state import STATE_DIRECTORY

__all__ = ["audit_iceberg"]

TABLE = "demo.events"
_EPOCH = "barrierflow.epoch"


def audit_iceberg(workdir: Path, *, complete: bool) -> Audit:
    """Audit the Spark act's table in ``workdir`` (see the module)."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    audit = Audit(complete)
    base = (workdir / "warehouse").resolve()
    expected = spark_input(workdir)
    if not (base / "catalog.db").exists():
        if complete:
            audit.add("no_table", f"no catalog in {base}")
        return audit
    catalog = SqlCatalog(
        "barrierflow",
        uri=f"sqlite:///{base / 'catalog.db'}",
        warehouse=f"file://{base / 'warehouse'}",
    )
    try:
        table = catalog.load_table(TABLE)
    except (NoSuchTableError, NoSuchNamespaceError):
        if complete:
            audit.add("no_table", f"{TABLE} is not in the catalog")
        return audit
    rows = table.scan().to_arrow()
    audit.count_against_input(expected, rows)
    referenced = _check_snapshots(table, audit)
    _check_files(table, referenced, rows.num_rows, audit)
    if complete:
        _check_leftovers(Path(table.location().removeprefix("file://")), referenced, audit)
    return audit


def _check_snapshots(table: Any, audit: Audit) -> set[str]:
    """Epochs increase one snapshot at a time and snapshots only append; the current
    snapshot's data files."""
    snapshots = sorted(table.snapshots(), key=lambda s: s.sequence_number)
    audit.facts["snapshots"] = len(snapshots)
    previous_epoch = 0
    previous: set[str] = set()
    for snapshot in snapshots:
        epoch_text = (snapshot.summary or {}).get(_EPOCH) if snapshot.summary else None
        if epoch_text is None:
            audit.add("snapshot_without_epoch", f"snapshot {snapshot.snapshot_id}")
        elif int(epoch_text) <= previous_epoch:
            audit.add(
                "epochs_not_increasing",
                f"snapshot {snapshot.snapshot_id} commits epoch {epoch_text} after "
                f"{previous_epoch}",
            )
        else:
            previous_epoch = int(epoch_text)
        tasks = table.scan(snapshot_id=snapshot.snapshot_id).plan_files()
        paths = [task.file.file_path for task in tasks]
        files = set(paths)
        if len(files) != len(paths):
            audit.add(
                "file_referenced_twice",
                f"snapshot {snapshot.snapshot_id} lists {len(paths) - len(files)} files twice",
            )
        if not previous <= files:
            audit.add(
                "snapshot_removed_files",
                f"snapshot {snapshot.snapshot_id} dropped {len(previous - files)} files",
            )
        previous = files
    audit.facts["last_epoch"] = previous_epoch
    committed = int(table.properties.get("barrierflow.committed-epoch", "0"))
    if committed != previous_epoch:
        audit.add(
            "committed_epoch_mismatch",
            f"table property says {committed}, last snapshot committed {previous_epoch}",
        )
    return previous


def _check_files(table: Any, referenced: set[str], rows: int, audit: Audit) -> None:
    """Every referenced file exists, and their record counts add up to the rows read."""
    files = table.inspect.files()
    audit.facts["data_files"] = files.num_rows
    missing = [p for p in files["file_path"].to_pylist() if not Path(_local(p)).exists()]
    if missing:
        audit.add("missing_data_file", f"{len(missing)} files, e.g. {missing[0]}")
    counted = sum(files["record_count"].to_pylist())
    if counted != rows:
        audit.add("record_count_mismatch", f"files say {counted} rows, a scan read {rows}")
    paths = set(files["file_path"].to_pylist())
    if paths != referenced:
        audit.add("file_listing_mismatch", f"{len(paths ^ referenced)} files differ")


def _check_leftovers(location: Path, referenced: set[str], audit: Audit) -> None:
    """No staged file and no unreferenced data file once the run finished."""
    data = location / "data"
    known = {_local(p) for p in referenced}
    staged = [p for p in data.rglob("*") if p.is_file() and ".staging" in p.parts]
    stray = [
        p
        for p in data.rglob("*.parquet")
        if not {".staging", STATE_DIRECTORY} & set(p.parts) and str(p) not in known
    ]
    if staged:
        audit.add("staged_leftover", f"{len(staged)} files, e.g. {staged[0]}")
    if stray:
        audit.add("unreferenced_data_file", f"{len(stray)} files, e.g. {stray[0]}")


def _local(location: str) -> str:
    return location.removeprefix("file://")
