"""The coordinated Delta Lake table: one Delta commit per epoch carrying the app transaction,
the connector conformance suite (crash steps included), recovery, abort, schema evolution,
rescaling — read back by deltalake's own reader and by pyarrow over the log's files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from _timeouts import scaled

from barrierflow.actors import Coordinator, add_sink
from barrierflow.channels import Chunk
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.connectors import DeltaSink
from barrierflow.connectors.delta_table import (
    APP_ID_KEY,
    EPOCH_KEY,
    POSITIONS_KEY,
    DeltaSingleWriter,
)
from barrierflow.runtime import Runtime, RuntimeConfig
from barrierflow.testing.conformance import check_sink_connector
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


def build(tmp_path: Path, writers: int = 2) -> tuple[Runtime, DeltaSink, Coordinator]:
    sink = DeltaSink(tmp_path / "delta", SCHEMA, app_id="events")
    rt = Runtime(RuntimeConfig(state_path=str(tmp_path / "state.db"), barrier_interval=3600.0))
    rt.add_source("src")
    declared = add_sink(rt, "events", sink, input="src", parallelism=writers, key=("id",))
    assert declared.coordinator is not None
    return rt, sink, declared.coordinator


def ids(sink: DeltaSink) -> list[int]:
    """The ids deltalake's own reader sees."""
    return sorted(sink.read()["id"].to_pylist())


def dataset_ids(sink: DeltaSink) -> list[int]:
    """The ids pyarrow sees over exactly the files the Delta log names."""
    files = sink.table().file_uris()
    if not files:
        return []
    return sorted(ds.dataset(files, format="parquet").to_table()["id"].to_pylist())


def barrierflow_commits(sink: DeltaSink) -> list[dict[str, Any]]:
    return [c for c in sink.table().history() if APP_ID_KEY in c]


# The conformance suite, unchanged: a one-writer Delta table, importable by name for the
# crash children, over the storage named by STORAGE_ENV.


def conformance_connector() -> DeltaSingleWriter:
    """A one-writer Delta table over ``$STORAGE_ENV/delta`` (what the suite drives)."""
    path = Path(os.environ[STORAGE_ENV]) / "delta"
    return DeltaSink(path, pa.schema([("id", pa.int64())])).single_writer()


def conformance_read() -> list[int]:
    """The ids deltalake's reader sees in :func:`conformance_connector`'s table."""
    path = Path(os.environ[STORAGE_ENV]) / "delta"
    if not (path / "_delta_log").exists():
        return []
    from deltalake import DeltaTable

    found: list[int] = DeltaTable(str(path)).to_pyarrow_table()["id"].to_pylist()
    return found


async def test_the_delta_table_keeps_the_connector_contract_across_crashes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(STORAGE_ENV, str(tmp_path))
    report = await check_sink_connector(conformance_connector, conformance_read, crash_steps=True)
    report.raise_for_failures()
    assert [r.rule for r in report.results][8:] == list(CRASH_RULES)


async def test_each_epoch_is_one_delta_commit_with_its_app_transaction(tmp_path: Path) -> None:
    rt, sink, coordinator = build(tmp_path, writers=3)
    durable = []
    async with rt:
        for k in range(3):
            await rt.push("src", batch(k * 100, 100))
            durable.append(await rt.checkpoint())
            with anyio.fail_after(scaled(20)):
                await coordinator.wait_committed(durable[-1])
    assert ids(sink) == list(range(300))
    assert dataset_ids(sink) == list(range(300))
    commits = barrierflow_commits(sink)
    assert len(commits) == 3  # the last, empty epoch of the stop adds none
    epochs = [int(c[EPOCH_KEY]) for c in reversed(commits)]  # history is newest first
    assert epochs == sorted(set(epochs))  # one commit per epoch, in epoch order
    table = sink.table()
    assert table.transaction_version("events") == epochs[-1]
    # Each commit holds every writer's files of its epoch.
    writers = {Path(uri).parent.name for uri in table.file_uris()}
    assert writers == {"w0", "w1", "w2"}
    assert not any((sink.path / ".staging").iterdir())


async def test_replayed_commit_is_skipped_by_the_app_transaction(tmp_path: Path) -> None:
    rt, sink, coordinator = build(tmp_path, writers=1)
    async with rt:
        await rt.push("src", batch(0, 5))
        epoch = await rt.checkpoint()
        with anyio.fail_after(scaled(20)):
            await coordinator.wait_committed(epoch)
    committed = sink.table().transaction_version("events")
    version = sink.table().version()
    committer = sink.committer()
    metadata = {"staging_epoch": 1, "paths": [".staging/00000000000000000001/w0/x.parquet"]}
    await committer.commit(committed, metadata, None)  # replay: would fail if not skipped
    assert sink.table().version() == version
    assert ids(sink) == list(range(5))


async def test_abort_deletes_the_files_of_an_uncommitted_epoch(tmp_path: Path) -> None:
    sink = DeltaSink(tmp_path / "delta", SCHEMA)
    writer = sink.writer("0")
    await writer.open()
    await writer.begin_epoch(7)
    await writer.write_batch(batch(0, 3).batch)
    metadata = await writer.pre_commit(7)
    staged = [sink.path / p for p in metadata["paths"]]
    assert all(p.exists() for p in staged)
    committer = sink.committer()
    pre = await committer.pre_commit(100, [metadata], None)
    await committer.abort(100, pre)
    await writer.close()
    assert not any(p.exists() for p in staged)
    assert sink.table().version() == 0  # only the table's creation
    assert ids(sink) == []


async def test_init_deletes_staged_epochs_no_pending_commit_references(tmp_path: Path) -> None:
    sink = DeltaSink(tmp_path / "delta", SCHEMA)
    writer = sink.writer("0")
    await writer.open()
    kept: dict[int, Any] = {}
    for epoch in (3, 4):
        await writer.begin_epoch(epoch)
        await writer.write_batch(batch(epoch * 10, 2).batch)
        kept[epoch] = await sink.committer().pre_commit(
            epoch, [await writer.pre_commit(epoch)], None
        )
    await writer.close()
    committer = sink.committer()
    await committer.init({4: kept[4]})
    staging = sink.path / ".staging"
    assert sorted(p.name for p in staging.iterdir()) == [f"{4:020d}"]
    await committer.commit(4, kept[4], None)
    assert ids(sink) == [40, 41]
    assert not any(staging.iterdir())


async def test_a_schema_only_change_is_one_atomic_commit(tmp_path: Path) -> None:
    sink = DeltaSink(tmp_path / "delta", SCHEMA, app_id="s")
    committer = sink.committer()
    change = {"add_columns": [{"name": "note", "type": "string"}]}
    pre = await committer.pre_commit(5, [{"epoch": 1, "paths": [], "rows": 0}], change)
    await committer.commit(5, pre, change)
    table = sink.table()
    assert pa.schema(table.schema().to_arrow()).field("note").type == pa.string()
    assert table.version() == 1  # the columns, the transaction and the epoch in one commit
    assert table.transaction_version("s") == 5
    assert table.history(1)[0][EPOCH_KEY] == "5"
    with pytest.raises(InvalidArgumentError):
        await committer.pre_commit(6, [{"epoch": 2}], {"drop": "id"})


async def test_a_schema_change_with_files_survives_a_crash_between_its_two_commits(
    tmp_path: Path,
) -> None:
    sink = DeltaSink(tmp_path / "delta", SCHEMA, app_id="s")
    writer = sink.writer("0")
    await writer.open()
    await writer.begin_epoch(9)
    await writer.write_batch(batch(0, 4).batch)
    staged = await writer.pre_commit(9)
    await writer.close()
    change = {"add_columns": [{"name": "score", "type": "double"}]}
    committer = sink.committer()
    pre = await committer.pre_commit(9, [staged], change)
    # A crash after the columns were added, before the files: the table has the column only.
    from deltalake.schema import Field, PrimitiveType

    sink.table().alter.add_columns([Field("score", PrimitiveType("double"), nullable=True)])
    await sink.committer().commit(9, pre, change)  # the replay skips the present column
    rows = sink.read()
    assert rows.schema.names == ["id", "score"]
    assert sorted(rows["id"].to_pylist()) == [0, 1, 2, 3]
    assert rows["score"].null_count == 4
    assert dataset_ids(sink) == [0, 1, 2, 3]
    assert sink.table().transaction_version("s") == 9


async def test_source_positions_are_in_the_commit_and_read_back(tmp_path: Path) -> None:
    sink = DeltaSink(tmp_path / "delta", SCHEMA, app_id="s")
    writer = sink.writer("0")
    await writer.open()
    held: list[Any] = []
    for epoch, (start, end) in ((3, (-1, 4)), (4, (4, 6))):
        await writer.begin_epoch(epoch)
        await writer.write_batch(batch(epoch * 10, 1).batch)
        await writer.record_positions(epoch, {"src/a": start}, {"src/a": end})
        staged = await writer.pre_commit(epoch)
        committer = sink.committer()  # a new committer reads what the log holds
        pre = await committer.pre_commit(epoch, [staged], None)
        await committer.commit(epoch, pre, None)
        held.append(await sink.committer().sink_commits())
    await writer.close()
    assert [(c.epoch, dict(c.positions)) for c in held] == [(3, {"src/a": 4}), (4, {"src/a": 6})]
    assert json.loads(sink.table().history(1)[0][POSITIONS_KEY]) == {"src/a": 6}
    assert await DeltaSink(tmp_path / "other", SCHEMA).committer().sink_commits() is None


async def test_rescaling_from_two_to_three_writers_keeps_every_row_once(tmp_path: Path) -> None:
    rt, sink, _ = build(tmp_path, writers=2)
    async with rt:
        await rt.push("src", batch(0, 100))
        await rt.checkpoint()
    rt, sink, coordinator = build(tmp_path, writers=3)
    async with rt:
        await rt.push("src", batch(100, 200))
        epoch = await rt.checkpoint()
        with anyio.fail_after(scaled(20)):
            await coordinator.wait_committed(epoch)
    assert ids(sink) == list(range(300))
    assert dataset_ids(sink) == list(range(300))
    writers = {Path(uri).parent.name for uri in sink.table().file_uris()}
    assert writers == {"w0", "w1", "w2"}


async def test_a_single_writer_commits_its_own_epochs_once(tmp_path: Path) -> None:
    sink = DeltaSink(tmp_path / "delta", SCHEMA, app_id="one")
    for start in (0, 20):  # a second run over the same state and table
        rt = Runtime(RuntimeConfig(state_path=str(tmp_path / "state.db"), barrier_interval=3600.0))
        rt.add_source("src")
        declared = add_sink(rt, "one", sink.single_writer, input="src")
        assert declared.coordinator is None
        async with rt:
            await rt.push("src", batch(start, 20))
            await rt.checkpoint()
    assert ids(sink) == list(range(40))
    assert dataset_ids(sink) == list(range(40))
    assert len(barrierflow_commits(sink)) == 2


def test_a_table_schema_that_differs_is_refused(tmp_path: Path) -> None:
    DeltaSink(tmp_path / "delta", SCHEMA)
    nullable = pa.schema([pa.field("id", pa.int64(), nullable=True)])
    with pytest.raises(InvalidArgumentError) as info:
        DeltaSink(tmp_path / "delta", nullable)
    assert info.value.argument == "schema"
    with pytest.raises(InvalidArgumentError) as app:
        DeltaSink(tmp_path / "delta", SCHEMA, app_id="")
    assert app.value.argument == "app_id"
    # Delta has no unsigned ints: a new table would store another type than the rows have.
    with pytest.raises(InvalidArgumentError) as unsigned:
        DeltaSink(tmp_path / "unsigned", pa.schema([("id", pa.uint64())]))
    assert unsigned.value.argument == "schema"


def test_importing_the_connectors_does_not_import_deltalake() -> None:
    code = "import sys, barrierflow.connectors; sys.exit('deltalake' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], timeout=scaled(60), cwd=ROOT)
    assert done.returncode == 0


def test_a_missing_deltalake_names_the_delta_extra(tmp_path: Path) -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["deltalake"] = None  # as if not installed
        import pyarrow as pa
        from barrierflow.errors import MissingExtraError
        from barrierflow.connectors import DeltaSink
        try:
            DeltaSink(sys.argv[1], pa.schema([("id", pa.int64())]))
        except MissingExtraError as error:
            sys.exit(0 if error.extra == "delta" else 2)
        sys.exit(3)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "t")], timeout=scaled(60), cwd=ROOT
    )
    assert done.returncode == 0


# A real process, SIGKILLed at a chosen point of the first epoch's commit.
CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import anyio
    sys.path.insert(0, {tests!r})
    from test_delta_table import batch, build
    from pathlib import Path

    point = os.environ["KILL_AT"]
    if point == "before_durable":
        from barrierflow.connectors.delta_table import DeltaCommitter
        async def pre_commit(self, *args):
            os.kill(os.getpid(), signal.SIGKILL)
        DeltaCommitter.pre_commit = pre_commit
    elif point == "after_pending":
        from barrierflow.connectors.delta_table import DeltaCommitter
        def commit(self, *args):
            os.kill(os.getpid(), signal.SIGKILL)
        DeltaCommitter._commit = commit
    elif point == "after_commit":
        # The committed mark is written with the next pending record (or at the end).
        from barrierflow.actors.sinks import SinkStates
        persist = SinkStates.persist_pending
        async def persist_pending(self, *args, committed=None):
            if committed is not None:
                os.kill(os.getpid(), signal.SIGKILL)
            await persist(self, *args, committed=committed)
        async def commit_and_prune(self, epoch):
            os.kill(os.getpid(), signal.SIGKILL)
        SinkStates.persist_pending = persist_pending
        SinkStates.commit_and_prune = commit_and_prune

    async def main():
        rt, sink, coordinator = build(Path(sys.argv[1]))
        async with rt:
            for k in range(3):
                await rt.push("src", batch(k * 10, 10))
                await rt.checkpoint()
                print("DURABLE", k, flush=True)
            await anyio.sleep_forever()

    anyio.run(main, backend=sys.argv[2])
    """
)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize(
    ("point", "expected"),
    [("before_durable", []), ("after_pending", list(range(10))), ("after_commit", list(range(10)))],
)
def test_killed_mid_commit_restarts_with_each_epoch_once(
    tmp_path: Path, backend: str, point: str, expected: list[int]
) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(tests=str(ROOT / "tests")))
    child = subprocess.run(
        [sys.executable, str(script), str(tmp_path), backend],
        env={**os.environ, "KILL_AT": point},
        capture_output=True,
        text=True,
        timeout=scaled(60),
        cwd=ROOT,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]

    async def restart() -> tuple[list[int], list[int]]:
        rt, sink, coordinator = build(tmp_path)
        async with rt:
            epoch = await rt.checkpoint()
            with anyio.fail_after(scaled(20)):
                await coordinator.wait_committed(epoch)
        staged = sink.path / ".staging"
        assert not any(staged.iterdir()), "aborted or orphaned files were left staged"
        return ids(sink), dataset_ids(sink)

    assert anyio.run(restart, backend=backend) == (expected, expected)
