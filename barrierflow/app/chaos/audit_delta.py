"""The audit of the Spark act's Delta Lake table (``barrierflow demo --table delta``), read with
deltalake and the Delta log itself, against the act's input files.

Read without any of the pipeline's code: the table at ``<workdir>/delta/events`` opened with
``deltalake.DeltaTable``, its commits' metadata from ``history()``, and the generated input as
plain Parquet files (:func:`~barrierflow.app.chaos.audit.spark_input`). Which files each
commit added comes from the log's commit files (``_delta_log/<version>.json``, the Delta
protocol's own record): deltalake's reader merges the ``add`` actions by path, so a file added
twice would show once there and only the log shows it. Rules:

* the rows deltalake reads, as a multiset of ``(key, value)``, equal the input's
  (:mod:`.audit`);
* every commit that adds files is barrierflow's: it names the app id and the epoch it
  committed (commit info ``barrierflow.app-id`` / ``barrierflow.epoch``), and epochs strictly
  increase from commit to commit — one commit per epoch — up to the app id's transaction
  version, Delta's own committed-epoch marker;
* commits only append (no ``remove``), and no data file is added twice, in one commit or
  across commits;
* every file a reader sees was added by one of those commits, exists, and the record counts
  the log gives add up to the rows read;
* nothing is left once the run has finished: no staged file (under ``.staging``), and no
  Parquet file in the table directory that the table does not reference (a keyed step's
  state, under ``_barrierflow_state``, is its state store's, not the table's).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.app.chaos.audit import Audit, spark_input
from barrierflow.spark_bridge.task_state import STATE_DIRECTORY

__all__ = ["APP_ID", "PATH", "audit_delta", "audit_delta_table"]

#: The Spark act's Delta table, under its work directory, and the app id its commits carry.
PATH = Path("delta", "events")
APP_ID = "events"
#: The commit info keys a barrierflow commit carries.
_APP_ID = "barrierflow.app-id"
_EPOCH = "barrierflow.epoch"


def audit_delta(workdir: Path, *, complete: bool) -> Audit:
    """Audit the Spark act's Delta table in ``workdir`` (see the module)."""
    return audit_delta_table(workdir / PATH, spark_input(workdir), APP_ID, complete=complete)


def audit_delta_table(
    path: Path, expected: pa.Table | None, app_id: str, *, complete: bool
) -> Audit:
    """Audit the Delta table at ``path``, written by the app id ``app_id``, against the rows
    ``expected`` (``None``: the input is not whole yet; see the module)."""
    from deltalake import DeltaTable

    audit = Audit(complete)
    path = path.resolve()
    if not (path / "_delta_log").is_dir():
        if complete:
            audit.add("no_table", f"no Delta log in {path}")
        return audit
    table = DeltaTable(str(path))
    added = _check_commits(path, table, app_id, audit)
    seen, records = _check_files(path, table, added, audit)
    if any(not p.exists() for p in seen):
        return audit  # deltalake cannot read the table: the missing files are the finding
    audit.count_against_input(expected, table.to_pyarrow_table(columns=["key", "value"]))
    if records != audit.rows_out:
        audit.add(
            "record_count_mismatch", f"the log says {records} rows, a read gave {audit.rows_out}"
        )
    if complete:
        _check_leftovers(path, seen, audit)
    return audit


def _commit_actions(path: Path, version: int) -> list[dict[str, Any]] | None:
    """The actions of commit ``version`` from its log file (``None``: the file is gone)."""
    try:
        text = (path / "_delta_log" / f"{version:020d}.json").read_text()
    except FileNotFoundError:
        return None
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _check_commits(path: Path, table: Any, app_id: str, audit: Audit) -> set[str]:
    """One commit per epoch, epochs increasing, append only, no file added twice; the files
    the app id's commits added."""
    history = sorted(table.history(), key=lambda info: int(info["version"]))
    previous_epoch = 0
    commits = 0
    adds: Counter[str] = Counter()
    ours: set[str] = set()
    for info in history:
        version = int(info["version"])
        actions = _commit_actions(path, version)
        if actions is None:
            audit.add("log_incomplete", f"the commit file of version {version} is gone")
            continue
        paths = [a["add"]["path"] for a in actions if "add" in a]
        removed = [a["remove"]["path"] for a in actions if "remove" in a]
        adds.update(paths)
        if removed:
            audit.add("commit_removed_files", f"version {version} removes {len(removed)} files")
        epoch_text = info.get(_EPOCH)
        if info.get(_APP_ID) != app_id or epoch_text is None:
            if paths:
                audit.add("commit_without_epoch", f"version {version} adds {len(paths)} files")
            continue
        commits += 1
        ours.update(paths)
        if int(epoch_text) <= previous_epoch:
            audit.add(
                "epochs_not_increasing",
                f"version {version} commits epoch {epoch_text} after {previous_epoch}",
            )
        else:
            previous_epoch = int(epoch_text)
    audit.facts["commits"] = commits
    audit.facts["last_epoch"] = previous_epoch
    twice = [p for p, n in adds.items() if n > 1]
    if twice:
        audit.add("file_referenced_twice", f"{len(twice)} files added twice, e.g. {twice[0]}")
    committed = table.transaction_version(app_id) or 0
    if committed != previous_epoch:
        audit.add(
            "committed_epoch_mismatch",
            f"the app transaction says {committed}, the last commit committed {previous_epoch}",
        )
    return ours


def _check_files(path: Path, table: Any, added: set[str], audit: Audit) -> tuple[set[Path], int]:
    """Every file a reader sees was added by a commit of the app id and exists; the files
    seen and the rows the log counts in them."""
    actions = pa.table(table.get_add_actions(flatten=True))
    relative = actions["path"].to_pylist()
    audit.facts["data_files"] = len(relative)
    seen = {(path / p).resolve() for p in relative}
    missing = [p for p in seen if not p.exists()]
    if missing:
        audit.add("missing_data_file", f"{len(missing)} files, e.g. {missing[0]}")
    unaccounted = set(relative) - added
    if unaccounted:
        audit.add(
            "file_not_committed_by_an_epoch",
            f"{len(unaccounted)} files a reader sees, e.g. {sorted(unaccounted)[0]}",
        )
    return seen, int(pc.sum(actions["num_records"]).as_py() or 0)


def _check_leftovers(path: Path, seen: set[Path], audit: Audit) -> None:
    """No staged file and no unreferenced data file once the run finished."""
    staged = [p for p in (path / ".staging").rglob("*") if p.is_file()]
    stray = [
        p
        for p in path.rglob("*.parquet")
        if not {".staging", "_delta_log", STATE_DIRECTORY} & set(p.relative_to(path).parts)
        and p.resolve() not in seen
    ]
    if staged:
        audit.add("staged_leftover", f"{len(staged)} files, e.g. {staged[0]}")
    if stray:
        audit.add("unreferenced_data_file", f"{len(stray)} files, e.g. {stray[0]}")
