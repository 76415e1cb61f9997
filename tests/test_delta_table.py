"""What only the Delta Lake table does: the table conformance suite (crash steps included),
the schema change committed in one Delta commit or in two that survive a crash between them,
one writer, its arguments and its optional extra.

The rules every coordinated table keeps (one commit per epoch carrying the app transaction,
replays skipped, abort, recovery, positions, rescaling, schema changes, SIGKILLed commits)
are in ``test_tables.py``, run against Parquet, Iceberg and Delta alike."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from _timeouts import scaled

from barrierflow.actors import add_sink
from barrierflow.actors.sinks.table import Manifest
from barrierflow.channels import Chunk
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.connectors import DeltaLakeTable
from barrierflow.connectors.delta_table import APP_ID_KEY, EPOCH_KEY
from barrierflow.runtime import Runtime, RuntimeConfig
from barrierflow.testing.conformance import check_table
from barrierflow.testing.crash_conformance import CRASH_RULES

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False)])
ROOT = Path(__file__).resolve().parents[1]
#: The directory the conformance factory reaches, in this process and in the suite's children.
STORAGE_ENV = "BARRIERFLOW_DELTA_CONFORMANCE_STORAGE"

pytestmark = pytest.mark.anyio


def batch(start: int, count: int) -> Chunk:
    return Chunk(
        pa.record_batch([pa.array(range(start, start + count), pa.int64())], schema=SCHEMA)
    )


def ids(sink: DeltaLakeTable) -> list[int]:
    """The ids deltalake's own reader sees."""
    return sorted(sink.read()["id"].to_pylist())


def dataset_ids(sink: DeltaLakeTable) -> list[int]:
    """The ids pyarrow sees over exactly the files the Delta log names."""
    files = sink.table().file_uris()
    if not files:
        return []
    return sorted(ds.dataset(files, format="parquet").to_table()["id"].to_pylist())


def barrierflow_commits(sink: DeltaLakeTable) -> list[dict[str, Any]]:
    return [c for c in sink.table().history() if APP_ID_KEY in c]


# The conformance suite: a Delta table, importable by name for the crash children, over the
# storage named by STORAGE_ENV.


def conformance_table() -> DeltaLakeTable:
    """A Delta table over ``$STORAGE_ENV/delta`` (what the suite drives)."""
    path = Path(os.environ[STORAGE_ENV]) / "delta"
    return DeltaLakeTable(path, pa.schema([("id", pa.int64())]))


def conformance_read() -> list[int]:
    """The ids deltalake's reader sees in :func:`conformance_table`'s table."""
    path = Path(os.environ[STORAGE_ENV]) / "delta"
    if not (path / "_delta_log").exists():
        return []
    from deltalake import DeltaTable

    found: list[int] = DeltaTable(str(path)).to_pyarrow_table()["id"].to_pylist()
    return found


def with_change(staged: Manifest, change: Any) -> Manifest:
    """A writer's manifest carrying a schema change."""
    return replace(staged, schema_change=change)


@pytest.mark.subprocess
async def test_the_delta_table_keeps_the_commit_protocol_across_crashes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(STORAGE_ENV, str(tmp_path))
    report = await check_table(conformance_table, conformance_read, crash_steps=True)
    report.raise_for_failures()
    assert [r.rule for r in report.results][-len(CRASH_RULES) :] == list(CRASH_RULES)


async def test_a_schema_only_change_is_one_atomic_commit(tmp_path: Path) -> None:
    # The column and its type, the marker and the refused change: test_tables.py, for every
    # table. Delta's own: no second commit for the transaction and the epoch.
    sink = DeltaLakeTable(tmp_path / "delta", SCHEMA, app_id="s")
    committer = sink.committer()
    change = {"add_columns": [{"name": "note", "type": "string"}]}
    pre = await committer.prepare(5, [Manifest("0", 1, schema_change=change)])
    assert pre is not None
    await committer.commit(5, pre)
    table = sink.table()
    assert table.version() == 1  # the columns, the transaction and the epoch in one commit
    assert table.transaction_version("s") == 5
    assert table.history(1)[0][EPOCH_KEY] == "5"
    assert table.history(1)[0][APP_ID_KEY] == "s"


async def test_a_schema_change_with_files_survives_a_crash_between_its_two_commits(
    tmp_path: Path,
) -> None:
    sink = DeltaLakeTable(tmp_path / "delta", SCHEMA, app_id="s")
    writer = sink.writer("0")
    await writer.open()
    await writer.begin(9)
    await writer.write(batch(0, 4).batch)
    staged = await writer.stage(9)
    await writer.close()
    change = {"add_columns": [{"name": "score", "type": "double"}]}
    committer = sink.committer()
    pre = await committer.prepare(9, [with_change(staged, change)])
    assert pre is not None
    # A crash after the columns were added, before the files: the table has the column only.
    from deltalake.schema import Field, PrimitiveType

    sink.table().alter.add_columns([Field("score", PrimitiveType("double"), nullable=True)])
    await sink.committer().commit(9, pre)  # the replay skips the present column
    rows = sink.read()
    assert rows.schema.names == ["id", "score"]
    assert sorted(rows["id"].to_pylist()) == [0, 1, 2, 3]
    assert rows["score"].null_count == 4
    assert dataset_ids(sink) == [0, 1, 2, 3]
    assert sink.table().transaction_version("s") == 9


async def test_one_writer_commits_its_epochs_once_across_runs(tmp_path: Path) -> None:
    sink = DeltaLakeTable(tmp_path / "delta", SCHEMA, app_id="one")
    for start in (0, 20):  # a second run over the same state and table
        rt = Runtime(RuntimeConfig(state_path=str(tmp_path / "state.db"), barrier_interval=3600.0))
        rt.add_source("src")
        declared = add_sink(rt, "one", sink, input="src")
        assert declared.writers == ("one",)  # one writer keeps the sink's name
        async with rt:
            await rt.push("src", batch(start, 20))
            epoch = await rt.checkpoint()
            with anyio.fail_after(scaled(30)):
                await declared.coordinator.wait_committed(epoch)
    assert ids(sink) == list(range(40))
    assert dataset_ids(sink) == list(range(40))
    assert len(barrierflow_commits(sink)) == 2


def test_an_empty_app_id_or_an_unsigned_column_is_refused(tmp_path: Path) -> None:
    # A table whose schema differs is refused for every table: test_tables.py.
    with pytest.raises(InvalidArgumentError) as app:
        DeltaLakeTable(tmp_path / "delta", SCHEMA, app_id="")
    assert app.value.argument == "app_id"
    # Delta has no unsigned ints: a new table would store another type than the rows have.
    with pytest.raises(InvalidArgumentError) as unsigned:
        DeltaLakeTable(tmp_path / "unsigned", pa.schema([("id", pa.uint64())]))
    assert unsigned.value.argument == "schema"


@pytest.mark.subprocess
def test_importing_the_connectors_does_not_import_deltalake() -> None:
    code = "import sys, barrierflow.connectors; sys.exit('deltalake' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], timeout=scaled(60), cwd=ROOT)
    assert done.returncode == 0


@pytest.mark.subprocess
def test_a_missing_deltalake_names_the_delta_extra(tmp_path: Path) -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["deltalake"] = None  # as if not installed
        import pyarrow as pa
        from barrierflow.errors import MissingExtraError
        from barrierflow.connectors import DeltaLakeTable
        try:
            DeltaLakeTable(sys.argv[1], pa.schema([("id", pa.int64())]))
        except MissingExtraError as error:
            sys.exit(0 if error.extra == "delta" else 2)
        sys.exit(3)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "t")], timeout=scaled(60), cwd=ROOT
    )
    assert done.returncode == 0
