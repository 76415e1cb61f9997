"""The audits of the backfill acts: their exactly-once Parquet tables, read with pyarrow.

A table directory is read as a reader sees it — ``pyarrow.dataset`` discovery, which skips
names starting with ``.`` or ``_`` — and checked against its own commit records, all plain
JSON and Parquet:

* every file a reader sees is ``epoch=<E>/w<writer>/<name>.parquet``, and each epoch directory
  holds exactly the files its commit record (``_PRECOMMITTED.json``, renamed in with them)
  lists, with the rows it says: one commit per epoch, no data file in two;
* once the run has finished: no epoch above the manifest's ``committed_epoch``, the manifest's
  row and file totals equal what a reader sees, and nothing is left staged.

The rows are then compared with the input the act generated:

* **backfill act** — both tables it writes, the ``live`` table (the live job's) and the
  ``history`` table (the backfill job's), must each hold every record of every stream once:
  stream ``s``'s ``i``-th record is ``(key = i * streams + s, value = i)`` (the formula the
  producer documents, restated here, not imported). The streams are the producer's — the
  run's manifest (``demo-backfill.json``) says how many it writes and how many records each
  gets — never the ones a table happens to hold: a stream no reader ever listed is missing
  from a table entirely, and only the producer's side knows it exists. Once the run has
  finished, each stream with records missing from a table is a finding of its own
  (``<table>.stream_incomplete``, its subject the stream), on top of the rows lost;
* **views act** — the copy's table is a change log of per-key totals. Replayed per key in
  commit order, each retraction must retract the value the key had, and each key's net value
  must be its total over the input. Counts are in *keys* here: a key whose net falls short is
  *lost* (a change missing), one that overshoots or is inserted twice is *duplicated*, a key
  the input never had is *foreign*.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from barrierflow.app.chaos.audit import Audit, Finding, lost_by

__all__ = ["audit_backfill", "audit_views", "read_table_dir"]

_INSERTS = (0, 3)  # INSERT, UPDATE_INSERT
_RETRACTS = (1, 2)  # DELETE, UPDATE_DELETE


def _visible(path: Path) -> list[Path]:
    """The files under ``path`` a pyarrow dataset reader sees (no ``.``/``_`` names)."""
    return sorted(
        p
        for p in path.rglob("*")
        if p.is_file() and not any(part[0] in "._" for part in p.relative_to(path).parts)
    )


def read_table_dir(path: Path, audit: Audit, *, complete: bool) -> pa.Table | None:
    """The rows a reader of the table directory ``path`` sees, in commit order (epochs, files,
    rows), with its rules checked into ``audit``; ``None`` if there is no table yet."""
    if not path.exists():
        if complete:
            audit.add("no_table", f"{path} does not exist")
        return None
    for file in _visible(path):
        where = file.relative_to(path).parts
        if len(where) != 3 or not _epoch_dir(where[0]) or file.suffix != ".parquet":
            audit.add("stray_visible_file", str(file.relative_to(path)))
    parts: list[pa.Table] = []
    epochs: list[int] = []
    files_seen = 0
    for directory in sorted(d for d in path.iterdir() if _epoch_dir(d.name)):
        epoch = int(directory.name.removeprefix("epoch="))
        epochs.append(epoch)
        files = sorted(directory.glob("w*/*.parquet"))
        tables = [pq.read_table(f) for f in files]
        _check_record(directory, epoch, files, tables, audit)
        parts.extend(tables)
        files_seen += len(files)
    audit.facts["epochs"] = len(epochs)
    rows = pa.concat_tables(parts) if parts else None
    if complete:
        _check_manifest(path, epochs, files_seen, rows, audit)
    return rows


def _epoch_dir(name: str) -> bool:
    """``epoch=<digits>``: a committed epoch's directory."""
    return name.startswith("epoch=") and name.removeprefix("epoch=").isdigit()


def _check_record(
    directory: Path, epoch: int, files: list[Path], tables: list[pa.Table], audit: Audit
) -> None:
    """The epoch's commit record lists exactly its files and rows."""
    try:
        record: dict[str, Any] = json.loads((directory / "_PRECOMMITTED.json").read_text())
    except FileNotFoundError:
        audit.add("epoch_without_record", directory.name)
        return
    # The record lists the files' staged paths, ``.staging/<epoch>/w<id>/<name>``.
    listed = sorted("/".join(Path(f).parts[-2:]) for f in record.get("files", []))
    found = ["/".join(f.parts[-2:]) for f in files]
    if listed != found:
        audit.add("files_not_as_recorded", f"{directory.name}: {listed} vs {found}")
    if int(record.get("rows", -1)) != sum(t.num_rows for t in tables):
        audit.add("rows_not_as_recorded", f"{directory.name}: record says {record.get('rows')}")
    if int(record.get("epoch", epoch)) != epoch:
        audit.add("epoch_mismatch", f"{directory.name} holds the record of {record.get('epoch')}")


def _check_manifest(
    path: Path, epochs: list[int], files: int, rows: pa.Table | None, audit: Audit
) -> None:
    """Once finished: the manifest accounts for everything a reader sees, nothing staged."""
    try:
        manifest = json.loads((path / "_manifest.json").read_text())
    except FileNotFoundError:
        audit.add("no_manifest", str(path))
        return
    committed = int(manifest["committed_epoch"])
    above = [e for e in epochs if e > committed]
    if above:
        audit.add("epoch_not_recorded", f"{len(above)} epochs above committed {committed}")
    seen = 0 if rows is None else rows.num_rows
    if int(manifest["rows"]) != seen or int(manifest["files"]) != files:
        audit.add(
            "manifest_mismatch",
            f"manifest {manifest['rows']} rows / {manifest['files']} files, "
            f"a reader sees {seen} / {files}",
        )
    staged = [p for p in (path / ".staging").rglob("*") if p.is_file()]
    if staged:
        audit.add("staged_leftover", f"{len(staged)} files, e.g. {staged[0].relative_to(path)}")


def _backfill_input(workdir: Path) -> pa.Table | None:
    try:
        asked = json.loads((workdir / "demo-backfill.json").read_text())
    except FileNotFoundError:
        return None
    streams, per_stream = int(asked["streams"]), int(asked["history"]) + int(asked["live"])
    i = np.tile(np.arange(per_stream, dtype=np.int64), streams)
    s = np.repeat(np.arange(streams, dtype=np.int64), per_stream)
    split = pc.binary_join_element_wise("demo:events:", pc.cast(pa.array(s), pa.string()), "")
    return pa.table({"_split": split, "key": i * streams + s, "value": i})


#: The tables the backfill act writes: the backfill job's and the live job's.
BACKFILL_TABLES = ("history", "live")
_RECORD = ("_split", "key", "value")


def audit_backfill(workdir: Path, *, complete: bool) -> Audit:
    """Audit the backfill act's two tables in ``workdir`` against every stream its producer
    writes (see the module)."""
    audit = Audit(complete)
    expected = _backfill_input(workdir)
    for name in BACKFILL_TABLES:
        part = Audit(complete)
        rows = read_table_dir(workdir / name, part, complete=complete)
        if expected is not None:
            got = (rows if rows is not None else expected.schema.empty_table()).select(_RECORD)
            part.count_rows(expected, got, _RECORD)
            if complete:
                _streams_complete(name, expected, got, part)
        elif rows is not None and rows.num_rows:
            part.add("rows_without_input", f"{rows.num_rows} rows and no manifest")
        audit.rows_in += part.rows_in
        audit.rows_out += part.rows_out
        audit.lost += part.lost
        audit.duplicated += part.duplicated
        audit.foreign += part.foreign
        audit.findings += [Finding(f"{name}.{f.rule}", f.detail, f.subject) for f in part.findings]
        audit.facts[f"{name}_epochs"] = part.facts.get("epochs", 0)
    return audit


def _streams_complete(table: str, expected: pa.Table, got: pa.Table, audit: Audit) -> None:
    """A finding per stream of ``expected`` with records missing from ``got`` (the rows of
    ``table``)."""
    for stream, (lost, records) in sorted(lost_by(expected, got, _RECORD, "_split").items()):
        if lost:
            audit.add(
                "stream_incomplete",
                f"table '{table}' misses {lost} of the {records} records of stream '{stream}'",
                subject=str(stream),
            )


def audit_views(workdir: Path, *, complete: bool) -> Audit:
    """Audit the views act's copy table in ``workdir`` (see the module)."""
    from barrierflow.app._demo_views_graph import (
        events,  # the input generator, as for Spark's files
    )

    audit = Audit(complete)
    try:
        asked = json.loads((workdir / "demo-views.json").read_text())
    except FileNotFoundError:
        asked = None
    rows = read_table_dir(workdir / "copy", audit, complete=complete)
    if asked is None or rows is None:
        if rows is not None and rows.num_rows:
            audit.add("rows_without_input", f"{rows.num_rows} rows and no manifest")
        return audit
    batches, keys = int(asked["batches"]), int(asked["keys"])
    per_batch = int(asked["rows"]) // batches
    # Summed here from the input, not by the demo's own check (expected_totals), so that a
    # mistake there cannot hide one in the table.
    totals = np.zeros(keys, dtype=np.int64)
    for batch in range(batches):
        table = events(batch, per_batch, keys)
        np.add.at(totals, table["key"].to_numpy(), table["amount"].to_numpy())
    _replay(rows, totals, audit)
    return audit


def _replay(rows: pa.Table, totals: np.ndarray[Any, Any], audit: Audit) -> None:
    """Replay the change log per key (vectorized; see the module)."""
    n = rows.num_rows
    key = rows["key"].to_numpy()
    order = np.lexsort((np.arange(n), key))
    key, total, op = key[order], rows["total"].to_numpy()[order], rows["_op"].to_numpy()[order]
    sign = np.where(np.isin(op, _INSERTS), 1, -1)
    first = np.ones(n, dtype=bool)
    first[1:] = key[1:] != key[:-1]
    prev_live = ~first & np.isin(np.roll(op, 1), _INSERTS)
    broken = np.isin(op, _RETRACTS) & ~(prev_live & (np.roll(total, 1) == total))
    starts = np.flatnonzero(first)
    uniq = key[starts]
    alive = np.add.reduceat(sign, starts) if n else np.zeros(0, np.int64)
    net = np.add.reduceat(sign * total, starts) if n else np.zeros(0, np.int64)
    known = (uniq >= 0) & (uniq < len(totals))
    want = np.zeros(len(uniq), np.int64)
    want[known] = totals[uniq[known]]
    expected_keys = int(np.count_nonzero(totals))
    audit.rows_in, audit.rows_out = expected_keys, int(np.count_nonzero(known & (alive == 1)))
    audit.foreign = int(np.count_nonzero(~known | (known & (want == 0))))
    ok = known & (want > 0)
    short = ok & ((net < want) | (alive < 1))
    over = ok & ((net > want) | (alive > 1))
    absent = expected_keys - int(np.count_nonzero(ok))
    if audit.complete:
        audit.lost = int(np.count_nonzero(short)) + absent
    audit.duplicated = int(np.count_nonzero(over))
    audit.facts["changes"] = n
    audit.facts["broken_chains"] = int(np.count_nonzero(broken))
    for rule, count in (("lost", audit.lost), ("duplicated", audit.duplicated)):
        if count:
            audit.add(rule, f"{count} keys")
    if audit.foreign:
        audit.add("foreign", f"{audit.foreign} keys the input does not have")
    if broken.any():
        audit.add(
            "broken_chain", f"{int(broken.sum())} retractions of a value the key did not have"
        )
