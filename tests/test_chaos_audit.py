"""The crash harness's audits find what they promise: each rule is broken on purpose in a table
that passes, and the audit names it (and counts lost, duplicated and foreign rows; for the
backfill act, each table's streams with records missing)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from barrierflow.app._demo_input import RunManifest, complete_input
from barrierflow.app.chaos.acts import audit_spark
from barrierflow.app.chaos.audit import compare_rows, lost_by
from barrierflow.app.chaos.audit_delta import APP_ID, PATH, audit_delta
from barrierflow.app.chaos.audit_iceberg import TABLE, audit_iceberg
from barrierflow.app.chaos.audit_parquet import BACKFILL_TABLES, audit_backfill, audit_views
from barrierflow.app.demo_backfill import BackfillDemoConfig, run_backfill_demo
from barrierflow.app.demo_views import ViewsDemoConfig, run_views_demo

BACKENDS = ["asyncio", "trio"]


def rules(audit: object) -> set[str]:
    return {f.rule for f in audit.findings}  # type: ignore[attr-defined]


def test_rows_are_compared_as_multisets() -> None:
    expected = pa.table({"k": [1, 2, 3, 4], "v": [1.0, 2.0, 3.0, 4.0]})
    got = pa.table({"k": [1, 1, 2, 5, 3], "v": [1.0, 1.0, 2.0, 5.0, 3.5]})
    # lost: (3, 3.0) and (4, 4.0); duplicated: (1, 1.0) once more; foreign: (5, 5.0), (3, 3.5)
    assert compare_rows(expected, got, ["k", "v"]) == (2, 1, 2)
    assert compare_rows(expected, expected, ["k", "v"]) == (0, 0, 0)


# -- the Spark act's Iceberg table ------------------------------------------------------------


def iceberg_run(workdir: Path, epochs: int = 3) -> object:
    """A work directory as the Spark act leaves it: input files, and the table holding them,
    one snapshot per epoch (written with pyiceberg, as the sink's commit does)."""
    from barrierflow.connectors import open_local_catalog

    manifest = RunManifest(rows=300, batches=epochs)
    manifest.write(workdir)
    complete_input(workdir / "input", manifest)
    catalog = open_local_catalog(workdir / "warehouse")
    catalog.create_namespace("demo")
    inputs = sorted((workdir / "input").glob("part-*.parquet"))
    table = catalog.create_table(TABLE, schema=pq.read_schema(inputs[0]))
    for epoch, path in enumerate(inputs, start=1):
        with table.transaction() as tx:
            tx.append(pq.read_table(path), snapshot_properties={"barrierflow.epoch": str(epoch)})
            tx.set_properties({"barrierflow.committed-epoch": str(epoch)})
    return table


def test_a_whole_iceberg_table_is_clean(tmp_path: Path) -> None:
    iceberg_run(tmp_path)
    audit = audit_iceberg(tmp_path, complete=True)
    assert audit.clean, audit.summary()
    assert (audit.rows_in, audit.rows_out, audit.facts["snapshots"]) == (300, 300, 3)


def test_an_epoch_committed_twice_is_duplicated_rows_and_a_non_increasing_epoch(
    tmp_path: Path,
) -> None:
    table = iceberg_run(tmp_path)
    first = pq.read_table(sorted((tmp_path / "input").glob("part-*.parquet"))[0])
    table.append(first, snapshot_properties={"barrierflow.epoch": "2"})  # type: ignore[attr-defined]
    audit = audit_iceberg(tmp_path, complete=True)
    assert audit.duplicated == first.num_rows
    assert "epochs_not_increasing" in rules(audit)


def test_a_data_file_referenced_twice_is_found(tmp_path: Path) -> None:
    table = iceberg_run(tmp_path)
    path = table.inspect.files()["file_path"][0].as_py()  # type: ignore[attr-defined]
    table.add_files(  # type: ignore[attr-defined]
        [path], snapshot_properties={"barrierflow.epoch": "4"}, check_duplicate_files=False
    )
    audit = audit_iceberg(tmp_path, complete=True)
    assert "file_referenced_twice" in rules(audit)
    assert audit.duplicated > 0


def test_rows_missing_from_a_finished_run_are_lost_but_not_mid_run(tmp_path: Path) -> None:
    iceberg_run(tmp_path)
    extra = pa.table({"key": pa.array([10**9], pa.int64()), "value": [0.5]})
    pq.write_table(extra, tmp_path / "input" / "part-99999.parquet")  # an input row never sent
    assert audit_iceberg(tmp_path, complete=True).lost == 1
    assert audit_iceberg(tmp_path, complete=False).clean


def test_stray_and_staged_files_are_leftovers_once_finished(tmp_path: Path) -> None:
    table = iceberg_run(tmp_path)
    data = Path(table.location().removeprefix("file://")) / "data"  # type: ignore[attr-defined]
    pq.write_table(pa.table({"key": [1]}), data / "stray.parquet")
    (data / ".staging" / "7" / "w0").mkdir(parents=True)
    (data / ".staging" / "7" / "w0" / "part.parquet").write_bytes(b"x")
    assert {"unreferenced_data_file", "staged_leftover"} <= rules(
        audit_iceberg(tmp_path, complete=True)
    )
    assert audit_iceberg(tmp_path, complete=False).clean


def test_no_table_is_a_finding_only_for_a_finished_run(tmp_path: Path) -> None:
    assert audit_iceberg(tmp_path, complete=False).clean
    assert rules(audit_iceberg(tmp_path, complete=True)) == {"no_table"}


# -- the Spark act's Delta table -------------------------------------------------------------


def delta_commit(path: Path, rows: pa.Table, epoch: int) -> None:
    """Append ``rows`` in one Delta commit as the sink's committer makes it: the app
    transaction ``(app id, epoch)`` and the epoch in the commit info."""
    from deltalake import CommitProperties, Transaction, write_deltalake

    info = {"barrierflow.app-id": APP_ID, "barrierflow.epoch": str(epoch)}
    properties = CommitProperties(
        custom_metadata=info, app_transactions=[Transaction(app_id=APP_ID, version=epoch)]
    )
    write_deltalake(path, rows, mode="append", commit_properties=properties)


def delta_run(workdir: Path, epochs: int = 3, drop: int = 0) -> Path:
    """A work directory as the Spark act leaves it with ``--table delta``: input files, and
    the Delta table holding them, one commit per epoch (the last epoch without its last
    ``drop`` rows). Returns the table's directory."""
    from deltalake import DeltaTable

    manifest = RunManifest(rows=300, batches=epochs, table="delta")
    manifest.write(workdir)
    complete_input(workdir / "input", manifest)
    path = workdir / PATH
    inputs = sorted((workdir / "input").glob("part-*.parquet"))
    DeltaTable.create(path, pq.read_schema(inputs[0]))  # as the sink does: a CREATE TABLE first
    for epoch, file in enumerate(inputs, start=1):
        rows = pq.read_table(file)
        if epoch == epochs and drop:
            rows = rows.slice(0, rows.num_rows - drop)
        delta_commit(path, rows, epoch)
    return path


def test_a_whole_delta_table_is_clean(tmp_path: Path) -> None:
    delta_run(tmp_path)
    audit = audit_delta(tmp_path, complete=True)
    assert audit.clean, audit.summary()
    assert (audit.rows_in, audit.rows_out) == (300, 300)
    assert (audit.facts["commits"], audit.facts["last_epoch"], audit.facts["data_files"]) == (
        3, 3, 3
    )  # fmt: skip


def test_a_row_missing_from_a_finished_delta_run_is_lost_but_not_mid_run(tmp_path: Path) -> None:
    delta_run(tmp_path, drop=1)
    audit = audit_delta(tmp_path, complete=True)
    assert (audit.lost, audit.duplicated, audit.foreign) == (1, 0, 0)
    assert "lost" in rules(audit)
    assert audit_delta(tmp_path, complete=False).clean


def test_a_delta_epoch_committed_twice_is_duplicated_rows_and_a_non_increasing_epoch(
    tmp_path: Path,
) -> None:
    path = delta_run(tmp_path)
    first = pq.read_table(sorted((tmp_path / "input").glob("part-*.parquet"))[0])
    delta_commit(path, first, 3)  # the last epoch again, a replay that missed the transaction
    audit = audit_delta(tmp_path, complete=True)
    assert audit.duplicated == first.num_rows
    assert "epochs_not_increasing" in rules(audit)


def test_a_delta_data_file_added_twice_is_found(tmp_path: Path) -> None:
    from deltalake import CommitProperties, DeltaTable, Transaction
    from deltalake.transaction import AddAction

    path = delta_run(tmp_path)
    table = DeltaTable(path)
    files = pa.table(table.get_add_actions(flatten=True))
    again = AddAction(
        path=files["path"][0].as_py(), size=files["size_bytes"][0].as_py(), partition_values={},
        modification_time=0, data_change=True,
        stats=json.dumps({"numRecords": files["num_records"][0].as_py()}),
    )  # fmt: skip
    info = {"barrierflow.app-id": APP_ID, "barrierflow.epoch": "4"}
    table.create_write_transaction(
        [again], "append", table.schema(), commit_properties=CommitProperties(
            custom_metadata=info, app_transactions=[Transaction(app_id=APP_ID, version=4)]
        ),
    )  # fmt: skip
    audit = audit_delta(tmp_path, complete=True)
    # deltalake's reader merges the two adds of one path: only the log shows the file twice.
    assert audit.duplicated == 0
    assert rules(audit) == {"file_referenced_twice"}


def test_a_delta_commit_without_an_epoch_is_found(tmp_path: Path) -> None:
    from deltalake import write_deltalake

    path = delta_run(tmp_path)
    extra = pa.table({"key": pa.array([10**9], pa.int64()), "value": [0.5]})
    write_deltalake(path, extra, mode="append")  # not a barrierflow commit
    audit = audit_delta(tmp_path, complete=True)
    assert audit.foreign == 1
    assert {"commit_without_epoch", "file_not_committed_by_an_epoch"} <= rules(audit)


def test_staged_and_unreferenced_delta_files_are_leftovers_once_finished(tmp_path: Path) -> None:
    path = delta_run(tmp_path)
    (path / "7" / "w0").mkdir(parents=True)
    pq.write_table(pa.table({"key": [1]}), path / "7" / "w0" / "moved-not-committed.parquet")
    (path / ".staging" / "8" / "w1").mkdir(parents=True)
    (path / ".staging" / "8" / "w1" / "part.parquet").write_bytes(b"x")
    audit = audit_delta(tmp_path, complete=True)
    assert rules(audit) == {"unreferenced_data_file", "staged_leftover"}
    assert audit_delta(tmp_path, complete=False).clean  # mid-run: a commit may be under way


def test_a_deleted_delta_data_file_is_found(tmp_path: Path) -> None:
    path = delta_run(tmp_path)
    next(path.glob("*.parquet")).unlink()
    # deltalake cannot read the table any more: the audit says why instead of failing.
    assert "missing_data_file" in rules(audit_delta(tmp_path, complete=False))


def test_no_delta_table_is_a_finding_only_for_a_finished_run(tmp_path: Path) -> None:
    assert audit_delta(tmp_path, complete=False).clean
    assert rules(audit_delta(tmp_path, complete=True)) == {"no_table"}


def test_a_spark_run_audited_as_another_table_than_it_wrote_is_found(tmp_path: Path) -> None:
    delta_run(tmp_path)
    assert audit_spark(tmp_path, complete=True, table="delta").clean
    assert "table_not_as_asked" in rules(audit_spark(tmp_path, complete=True, table="iceberg"))


# -- the views act's change log ---------------------------------------------------------------


@pytest.fixture(params=BACKENDS)
def views_run(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    config = ViewsDemoConfig(tmp_path, batches=6, rows=6000, keys=200, backend=request.param)
    assert run_views_demo(config).verified
    return tmp_path


def epoch_dirs(table: Path) -> list[Path]:
    return sorted(table.glob("epoch=*"))


def test_a_finished_views_run_is_clean(views_run: Path) -> None:
    audit = audit_views(views_run, complete=True)
    assert audit.clean, audit.summary()
    assert audit.rows_in == audit.rows_out == 200


def test_an_epoch_replayed_into_the_change_log_is_duplicated_keys(views_run: Path) -> None:
    last = epoch_dirs(views_run / "copy")[-1]
    again = last.with_name(f"epoch={int(last.name.removeprefix('epoch=')) + 1:020d}")
    shutil.copytree(last, again)
    audit = audit_views(views_run, complete=True)
    assert audit.duplicated > 0
    assert {"broken_chain", "epoch_not_recorded", "manifest_mismatch"} <= rules(audit)


def test_an_epoch_missing_from_the_change_log_is_lost_keys(views_run: Path) -> None:
    shutil.rmtree(epoch_dirs(views_run / "copy")[-1])
    audit = audit_views(views_run, complete=True)
    assert audit.lost > 0
    assert "manifest_mismatch" in rules(audit)
    assert audit_views(views_run, complete=False).lost == 0  # mid-run: not there yet


def test_a_file_no_commit_record_lists_is_found(views_run: Path) -> None:
    directory = epoch_dirs(views_run / "copy")[0]
    first = next(directory.glob("w*/*.parquet"))
    shutil.copy(first, first.parent / "part-extra.parquet")
    audit = audit_views(views_run, complete=True)
    assert {"files_not_as_recorded", "rows_not_as_recorded"} <= rules(audit)


def test_a_stray_file_a_reader_sees_is_found(views_run: Path) -> None:
    (views_run / "copy" / "part-0.parquet.tmp").write_bytes(b"half a file")
    assert "stray_visible_file" in rules(audit_views(views_run, complete=False))


def test_a_staged_leftover_of_a_finished_run_is_found(views_run: Path) -> None:
    staged = views_run / "copy" / ".staging" / "00000000000000000009"
    staged.mkdir(parents=True)
    (staged / "part-00000.parquet").write_bytes(b"x")
    assert "staged_leftover" in rules(audit_views(views_run, complete=True))
    assert audit_views(views_run, complete=False).clean


# -- the backfill act's two tables ------------------------------------------------------------


@pytest.mark.redis
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_backfill_tables_are_clean_then_a_row_too_many_is_found(
    tmp_path: Path, backend: str
) -> None:
    config = BackfillDemoConfig(tmp_path, streams=2, history=500, live=1000, backend=backend)
    assert run_backfill_demo(config).verified
    audit = audit_backfill(tmp_path, complete=True)
    assert audit.clean, audit.summary()
    assert audit.rows_in == audit.rows_out == 2 * 2 * 1500
    directory = epoch_dirs(tmp_path / "history")[0]
    first = next(directory.glob("w*/*.parquet"))
    rows = pq.read_table(first)
    foreign = rows.set_column(rows.schema.get_field_index("value"), "value", pa.array(
        [-1] * rows.num_rows, pa.int64()
    ))  # fmt: skip
    pq.write_table(foreign, first.parent / "part-foreign.parquet")
    audit = audit_backfill(tmp_path, complete=True)
    assert audit.foreign == rows.num_rows
    assert "history.files_not_as_recorded" in rules(audit)


def test_rows_lost_are_counted_per_value_of_a_column() -> None:
    expected = pa.table({"s": ["a", "a", "b", "b", "c"], "k": [1, 2, 3, 4, 5]})
    got = pa.table({"s": ["a", "b", "b", "b", "x"], "k": [1, 3, 3, 4, 9]})
    # a: (a, 2) lost; b: all there (one duplicated); c: its only row lost; x: not expected
    assert lost_by(expected, got, ["s", "k"], "s") == {"a": (1, 2), "b": (0, 2), "c": (1, 1)}


STREAMS, HISTORY, LIVE = 3, 4, 6


def stream_records(stream: int) -> pa.Table:
    """Stream ``stream``'s records as the producer writes them (``i * streams + s``, ``i``)."""
    i = pa.array(range(HISTORY + LIVE), pa.int64())
    return pa.table(
        {
            "key": pc.add(pc.multiply(i, STREAMS), stream),
            "value": i,
            "_split": pa.array([f"demo:events:{stream}"] * len(i), pa.string()),
        }
    )


def write_parquet_table(path: Path, epochs: list[pa.Table]) -> None:
    """A table directory as a one-writer Parquet table commits it: an epoch directory per
    epoch with its writer's file and commit record, and the manifest over them."""
    path.mkdir(parents=True)
    for epoch, rows in enumerate(epochs, start=1):
        directory = path / f"epoch={epoch:020d}"
        (directory / "w0").mkdir(parents=True)
        pq.write_table(rows, directory / "w0" / "part-00000.parquet")
        staged = f".staging/{epoch:020d}/w0/part-00000.parquet"
        record = {"files": [staged], "rows": rows.num_rows}
        (directory / "_PRECOMMITTED.json").write_text(json.dumps(record))
    manifest = {"committed_epoch": len(epochs), "files": len(epochs)}
    (path / "_manifest.json").write_text(
        json.dumps({**manifest, "rows": sum(t.num_rows for t in epochs)})
    )


def backfill_run(workdir: Path, short: dict[str, tuple[int, int]]) -> None:
    """A finished backfill run built by hand: the manifest says what the producer wrote, and
    each table (``history``, ``live``) holds every stream's records, one epoch per stream —
    except ``short[table] = (stream, records)``: that stream's first ``records`` only."""
    manifest = {"streams": STREAMS, "history": HISTORY, "live": LIVE, "redis_url": None}
    (workdir / "demo-backfill.json").write_text(json.dumps(manifest))
    for table in BACKFILL_TABLES:
        epochs = []
        for stream in range(STREAMS):
            rows = stream_records(stream)
            if short.get(table, (-1, 0))[0] == stream:
                rows = rows.slice(0, short[table][1])
            if rows.num_rows:
                epochs.append(rows)
        write_parquet_table(workdir / table, epochs)


def incomplete_streams(audit: object) -> set[tuple[str, str]]:
    return {
        (f.rule, f.subject)
        for f in audit.findings  # type: ignore[attr-defined]
        if f.rule.endswith(".stream_incomplete")
    }


def test_a_backfill_run_whose_tables_hold_every_stream_is_clean(tmp_path: Path) -> None:
    backfill_run(tmp_path, {})
    audit = audit_backfill(tmp_path, complete=True)
    assert audit.clean, audit.summary()
    assert audit.rows_in == audit.rows_out == 2 * STREAMS * (HISTORY + LIVE)


@pytest.mark.parametrize("records", [0, 7], ids=["never-read", "partly-read"])
def test_a_stream_missing_from_the_live_table_is_a_finding_naming_the_table_and_the_stream(
    tmp_path: Path, records: int
) -> None:
    backfill_run(tmp_path, {"live": (1, records)})
    audit = audit_backfill(tmp_path, complete=True)
    assert incomplete_streams(audit) == {("live.stream_incomplete", "demo:events:1")}
    assert audit.lost == HISTORY + LIVE - records
    # Mid-run, records not there yet are not lost.
    assert not incomplete_streams(audit_backfill(tmp_path, complete=False))


@pytest.mark.parametrize("records", [0, 3], ids=["never-read", "partly-read"])
def test_a_stream_missing_from_the_backfill_table_is_a_finding_naming_the_table_and_the_stream(
    tmp_path: Path, records: int
) -> None:
    backfill_run(tmp_path, {"history": (2, records)})
    audit = audit_backfill(tmp_path, complete=True)
    assert incomplete_streams(audit) == {("history.stream_incomplete", "demo:events:2")}
    assert audit.lost == HISTORY + LIVE - records


def test_the_streams_are_the_producer_s_not_the_ones_the_tables_hold(tmp_path: Path) -> None:
    """A stream that neither table ever read (the source never listed it) is still missing
    from both: the streams come from the run's manifest."""
    backfill_run(tmp_path, {"history": (0, 0), "live": (0, 0)})
    audit = audit_backfill(tmp_path, complete=True)
    assert incomplete_streams(audit) == {
        ("history.stream_incomplete", "demo:events:0"),
        ("live.stream_incomplete", "demo:events:0"),
    }
    assert audit.lost == 2 * (HISTORY + LIVE)


def test_manifests_are_read_as_plain_json(tmp_path: Path) -> None:
    """No run started: nothing to audit mid-run, and a finished run without tables is found."""
    (tmp_path / "demo-views.json").write_text(json.dumps({"batches": 1, "rows": 1, "keys": 1}))
    assert audit_views(tmp_path, complete=False).clean
    assert "no_table" in rules(audit_views(tmp_path, complete=True))
