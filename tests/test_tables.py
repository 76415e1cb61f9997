"""The rules every coordinated table keeps, run once against each of them: a directory of
Parquet files (:class:`~barrierflow.connectors.ParquetTable`), an Iceberg table
(:class:`~barrierflow.connectors.IcebergTable`) and a Delta table
(:class:`~barrierflow.connectors.DeltaLakeTable`).

Each table is reached through a small :class:`Adapter` (make it, read its rows, its committed
marker, its commits, its recorded positions); a rule a table does not support is either
asserted to be refused as documented (Parquet refuses a schema change) or skipped for that
table with the reason in the skip mark. What only one table does lives in its own file
(``test_iceberg_table.py``, ``test_delta_table.py``, ``test_parquet_sink.py``).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from _timeouts import scaled
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError

from barrierflow.actors import Coordinator, add_sink
from barrierflow.actors.sinks.table import (
    AlreadyCommitted,
    Committed,
    CommitTimings,
    Failed,
    Manifest,
    RetryLater,
    Table,
)
from barrierflow.channels import Chunk
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.connectors import (
    DeltaLakeTable,
    IcebergTable,
    ParquetTable,
    _file_table,
    open_local_catalog,
)
from barrierflow.connectors.delta_table import APP_ID_KEY, EPOCH_KEY, POSITIONS_KEY
from barrierflow.connectors.errors import SchemaEvolutionError
from barrierflow.connectors.iceberg_table import COMMITTED_EPOCH_PROPERTY, POSITIONS_PROPERTY
from barrierflow.errors import PositionOverlapError, SinkRecoveryError
from barrierflow.runtime import Runtime, RuntimeConfig

pytestmark = pytest.mark.anyio

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False)])
ROOT = Path(__file__).resolve().parents[1]
#: The Delta tables' application id (their committed marker is its transaction version).
APP_ID = "events"
#: Where Parquet's committed marker lives (the table's manifest).
PARQUET_MANIFEST = "_manifest.json"


def batch(start: int, count: int) -> Chunk:
    return Chunk(
        pa.record_batch([pa.array(range(start, start + count), pa.int64())], schema=SCHEMA)
    )


def _read_ids(files: list[str]) -> list[int]:
    if not files:
        return []
    return sorted(ds.dataset(files, format="parquet").to_table()["id"].to_pylist())


@dataclass(frozen=True)
class Adapter:
    """One coordinated table, as the shared rules see it.

    Attributes:
        name: the table's kind (the parametrize id).
        open: the table under a directory of its own, with a schema (see :meth:`make`).
        root: the directory its writers stage under (``root/.staging/<epoch>/w<id>/``).
        ids: the ids the table's own reader sees.
        files: the data files the table's metadata names (read back by pyarrow).
        marker: the table's committed marker: the last committed epoch (0: none).
        commits: barrierflow's commits, oldest first, as the epoch each recorded (Iceberg,
            Delta) or, for Parquet, whose commit record carries no epoch, the staged epoch
            its directory is named after.
        records_epoch: whether ``commits`` gives the committed epochs themselves.
        state: everything a commit would change, to compare before and after a no-op.
        positions: the source positions the table's own storage records.
        columns: the schema the table has now (after a schema change).
        string: the Arrow type it reads a column added as ``"string"`` back as.
        evolves: whether the table supports schema changes (``add_columns``).
    """

    name: str
    open: Callable[[Path, pa.Schema], Any]
    root: Callable[[Any], Path]
    ids: Callable[[Any], list[int]]
    files: Callable[[Any], list[str]]
    marker: Callable[[Any], int]
    commits: Callable[[Any], list[int]]
    records_epoch: bool
    state: Callable[[Any], Any]
    positions: Callable[[Any], dict[str, int]]
    columns: Callable[[Any], pa.Schema]
    string: pa.DataType | None
    evolves: bool

    def make(self, root: Path, schema: pa.Schema = SCHEMA) -> Any:
        """The table under ``root`` (created, or opened if there)."""
        return self.open(root, schema)

    def file_ids(self, table: Any) -> list[int]:
        """The ids pyarrow sees over exactly the files the table's metadata names."""
        return _read_ids(self.files(table))

    def writers(self, table: Any) -> set[str]:
        """The writers whose files the table holds (``.../w<id>/part.parquet``)."""
        return {Path(f).parent.name for f in self.files(table)}


# Parquet: a directory; its manifest is the marker, each epoch one ``epoch=<S>/`` directory.


def _parquet_manifest(table: ParquetTable) -> dict[str, Any]:
    path = table.path / PARQUET_MANIFEST
    if not path.exists():
        return {"committed_epoch": 0}
    manifest: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return manifest


def _parquet_files(table: ParquetTable) -> list[str]:
    return sorted(str(p) for p in table.path.glob("epoch=*/*/*.parquet"))


PARQUET = Adapter(
    name="parquet",
    open=lambda root, schema: ParquetTable(root / "table", schema),
    root=lambda table: table.path,
    ids=lambda table: (
        sorted(ds.dataset(table.path, SCHEMA, format="parquet").to_table()["id"].to_pylist())
        if table.path.exists()
        else []
    ),
    files=_parquet_files,
    marker=lambda table: int(_parquet_manifest(table)["committed_epoch"]),
    commits=lambda table: sorted(
        int(p.name.removeprefix("epoch=")) for p in table.path.glob("epoch=*")
    ),
    records_epoch=False,
    state=lambda table: (
        _parquet_manifest(table),
        sorted(p.name for p in table.path.iterdir() if not p.name.startswith("."))
        if table.path.exists()
        else [],
    ),
    positions=lambda table: dict(_parquet_manifest(table).get("positions", {})),
    columns=lambda table: table.schema,  # the files' schema never changes
    string=None,
    evolves=False,
)


# Iceberg: a local SQL catalog; a table property is the marker, each epoch one snapshot.


def _iceberg_state(sink: IcebergTable) -> Any:
    table = sink.table()
    return [s.snapshot_id for s in table.snapshots()], dict(table.properties)


ICEBERG = Adapter(
    name="iceberg",
    open=lambda root, schema: IcebergTable(
        open_local_catalog(root / "catalog"), "ns.events", schema
    ),
    root=lambda sink: sink.data_path,
    ids=lambda sink: sorted(sink.table().scan().to_arrow()["id"].to_pylist()),
    files=lambda sink: [task.file.file_path for task in sink.table().scan().plan_files()],
    marker=lambda sink: int(sink.table().properties.get(COMMITTED_EPOCH_PROPERTY, "0")),
    commits=lambda sink: [int(s.summary["barrierflow.epoch"]) for s in sink.table().snapshots()],
    records_epoch=True,
    state=_iceberg_state,
    positions=lambda sink: json.loads(sink.table().properties.get(POSITIONS_PROPERTY, "{}")),
    columns=lambda sink: sink.table().schema().as_arrow(),
    string=pa.large_string(),  # pyiceberg's Arrow type of an Iceberg string
    evolves=True,
)


# Delta: the app transaction is the marker, each epoch one Delta commit with commitInfo.


def _delta_positions(sink: DeltaLakeTable) -> dict[str, int]:
    for info in sink.table().history():  # newest first
        if APP_ID_KEY in info:
            held: dict[str, int] = json.loads(info.get(POSITIONS_KEY, "{}"))
            return held
    return {}


DELTA = Adapter(
    name="delta",
    open=lambda root, schema: DeltaLakeTable(root / "delta", schema, app_id=APP_ID),
    root=lambda sink: sink.path,
    ids=lambda sink: sorted(sink.read()["id"].to_pylist()),
    files=lambda sink: list(sink.table().file_uris()),
    marker=lambda sink: int(sink.table().transaction_version(APP_ID) or 0),
    commits=lambda sink: [
        int(c[EPOCH_KEY]) for c in reversed(sink.table().history()) if APP_ID_KEY in c
    ],
    records_epoch=True,
    state=lambda sink: sink.table().version(),
    positions=_delta_positions,
    columns=lambda sink: pa.schema(sink.table().schema().to_arrow()),
    string=pa.string(),
    evolves=True,
)

ADAPTERS = {a.name: a for a in (PARQUET, ICEBERG, DELTA)}
TABLES = [pytest.param(a, id=a.name) for a in ADAPTERS.values()]


def build(kind: str, tmp_path: Path, writers: int = 2) -> tuple[Runtime, Any, Coordinator]:
    """A runtime whose source ``src`` feeds ``writers`` writers of a ``kind`` table (importable
    by name: the crash children build theirs with it)."""
    table = ADAPTERS[kind].make(tmp_path)
    assert isinstance(table, Table)
    rt = Runtime(RuntimeConfig(state_path=str(tmp_path / "state.db"), barrier_interval=3600.0))
    rt.add_source("src")
    declared = add_sink(rt, "events", table, input="src", parallelism=writers, key=("id",))
    assert declared.coordinator is not None
    return rt, table, declared.coordinator


def staging_is_empty(adapter: Adapter, table: Any) -> bool:
    staging = adapter.root(table) / ".staging"
    return staging.is_dir() and not any(staging.iterdir())


async def stage(table: Any, writer_id: str, epoch: int, start: int, count: int) -> Manifest:
    """One writer's manifest of ``count`` rows staged in ``epoch``."""
    writer = table.writer(writer_id)
    await writer.open()
    try:
        await writer.begin(epoch)
        await writer.write(batch(start, count).batch)
        manifest: Manifest = await writer.stage(epoch)
        return manifest
    finally:
        await writer.close()


@pytest.mark.parametrize("adapter", TABLES)
async def test_parallel_writers_commit_each_epoch_once_in_one_commit(
    tmp_path: Path, adapter: Adapter
) -> None:
    rt, table, coordinator = build(adapter.name, tmp_path, writers=3)
    durable = []
    async with rt:
        for k in range(3):
            await rt.push("src", batch(k * 100, 100))
            durable.append(await rt.checkpoint())
            with anyio.fail_after(scaled(20)):
                await coordinator.wait_committed(durable[-1])
    assert adapter.ids(table) == list(range(300))
    assert adapter.file_ids(table) == list(range(300))
    commits = adapter.commits(table)
    assert len(commits) == 3  # the last, empty epoch of the stop adds none
    assert commits == sorted(set(commits))  # one commit per epoch, in epoch order
    if adapter.records_epoch:
        assert commits == durable
    assert adapter.marker(table) == durable[-1]
    # Each commit holds every writer's files of its epoch.
    assert adapter.writers(table) == {"w0", "w1", "w2"}
    assert staging_is_empty(adapter, table)


@pytest.mark.parametrize("adapter", TABLES)
async def test_a_replayed_commit_is_skipped_by_the_committed_marker(
    tmp_path: Path, adapter: Adapter
) -> None:
    rt, table, coordinator = build(adapter.name, tmp_path, writers=1)
    async with rt:
        await rt.push("src", batch(0, 5))
        epoch = await rt.checkpoint()
        with anyio.fail_after(scaled(20)):
            await coordinator.wait_committed(epoch)
    assert adapter.marker(table) == epoch
    before = adapter.state(table)
    metadata = {"staging_epoch": 1, "paths": [".staging/00000000000000000001/w0/x.parquet"]}
    await table.committer().commit(epoch, metadata)  # replay: would fail if not skipped
    assert adapter.state(table) == before
    assert adapter.ids(table) == list(range(5))
    assert adapter.marker(table) == epoch
    assert len(adapter.commits(table)) == 1
    if adapter.records_epoch:
        assert adapter.commits(table) == [epoch]


@pytest.mark.parametrize("adapter", TABLES)
async def test_abort_deletes_the_files_of_an_uncommitted_epoch(
    tmp_path: Path, adapter: Adapter
) -> None:
    table = adapter.make(tmp_path)
    before = adapter.state(table)
    manifest = await stage(table, "0", 7, 0, 3)
    staged = [adapter.root(table) / f.path for f in manifest.files]
    assert staged
    assert all(p.exists() for p in staged)
    committer = table.committer()
    pre = await committer.prepare(100, [manifest])
    await committer.abort(100, pre)
    assert not any(p.exists() for p in staged)
    assert staging_is_empty(adapter, table)
    assert adapter.state(table) == before  # nothing committed: the table as created
    assert adapter.commits(table) == []
    assert adapter.marker(table) == 0
    assert adapter.ids(table) == []


@pytest.mark.parametrize("adapter", TABLES)
async def test_recover_deletes_staged_epochs_no_pending_commit_references(
    tmp_path: Path, adapter: Adapter
) -> None:
    table = adapter.make(tmp_path)
    kept: dict[int, Any] = {}
    for epoch in (3, 4):
        manifest = await stage(table, "0", epoch, epoch * 10, 2)
        kept[epoch] = await table.committer().prepare(epoch, [manifest])
    committer = table.committer()
    await committer.recover({4: kept[4]})
    staging = adapter.root(table) / ".staging"
    assert sorted(p.name for p in staging.iterdir()) == [f"{4:020d}"]
    await committer.commit(4, kept[4])
    assert adapter.ids(table) == [40, 41]
    assert adapter.file_ids(table) == [40, 41]
    assert adapter.marker(table) == 4
    assert not any(staging.iterdir())


@pytest.mark.parametrize("adapter", TABLES)
async def test_source_positions_are_in_the_commit_and_read_back(
    tmp_path: Path, adapter: Adapter
) -> None:
    table = adapter.make(tmp_path)
    writer = table.writer("0")
    await writer.open()
    held: list[Any] = []
    for epoch, (start, end) in ((3, (-1, 4)), (4, (4, 6))):
        await writer.begin(epoch)
        await writer.write(batch(epoch * 10, 1).batch)
        staged = replace(
            await writer.stage(epoch),
            positions={"src/a": end},
            positions_from={} if start < 0 else {"src/a": start},
        )  # as the sink writer fills them in
        committer = table.committer()  # a new committer reads what the table holds
        pre = await committer.prepare(epoch, [staged])
        await committer.commit(epoch, pre)
        held.append(await table.committer().sink_commits())
    await writer.close()
    assert [(c.epoch, dict(c.positions)) for c in held] == [(3, {"src/a": 4}), (4, {"src/a": 6})]
    assert adapter.positions(table) == {"src/a": 6}  # as the table's own storage records them
    assert await adapter.make(tmp_path / "other").committer().sink_commits() is None


@pytest.mark.parametrize("adapter", TABLES)
async def test_rescaling_from_two_to_three_writers_keeps_every_row_once(
    tmp_path: Path, adapter: Adapter
) -> None:
    rt, table, _ = build(adapter.name, tmp_path, writers=2)
    async with rt:
        await rt.push("src", batch(0, 100))
        await rt.checkpoint()
    assert adapter.ids(table) == list(range(100))  # the graceful stop committed it
    rt, table, coordinator = build(adapter.name, tmp_path, writers=3)
    async with rt:
        await rt.push("src", batch(100, 200))
        epoch = await rt.checkpoint()
        with anyio.fail_after(scaled(20)):
            await coordinator.wait_committed(epoch)
    assert adapter.ids(table) == list(range(300))
    assert adapter.file_ids(table) == list(range(300))
    assert adapter.writers(table) == {"w0", "w1", "w2"}


@pytest.mark.parametrize("adapter", TABLES)
async def test_a_schema_change_adds_columns_in_the_epochs_commit(
    tmp_path: Path, adapter: Adapter
) -> None:
    table = adapter.make(tmp_path)
    committer = table.committer()
    change = {"add_columns": [{"name": "note", "type": "string"}]}
    if not adapter.evolves:
        # Parquet files cannot evolve: the change is refused when the commit is prepared.
        with pytest.raises(SchemaEvolutionError) as refused:
            await committer.prepare(5, [Manifest("0", 1, schema_change=change)])
        assert refused.value.epoch == 5
        assert refused.value.change == change
        assert adapter.marker(table) == 0
        return
    pre = await committer.prepare(5, [Manifest("0", 1, schema_change=change)])
    await committer.commit(5, pre)
    columns = adapter.columns(table)
    assert columns.names == ["id", "note"]
    assert columns.field("note").type == adapter.string
    assert adapter.marker(table) == 5
    assert adapter.ids(table) == []
    with pytest.raises(InvalidArgumentError):
        await committer.prepare(6, [Manifest("0", 2, schema_change={"drop": "id"})])


@pytest.mark.parametrize(
    "adapter",
    [
        pytest.param(
            PARQUET,
            id="parquet",
            marks=pytest.mark.skip(
                reason="ParquetTable stores no schema: its files are read with the caller's"
            ),
        ),
        pytest.param(ICEBERG, id="iceberg"),
        pytest.param(DELTA, id="delta"),
    ],
)
def test_a_table_schema_that_differs_is_refused(tmp_path: Path, adapter: Adapter) -> None:
    adapter.make(tmp_path)
    nullable = pa.schema([pa.field("id", pa.int64(), nullable=True)])
    with pytest.raises(InvalidArgumentError) as info:
        adapter.make(tmp_path, nullable)
    assert info.value.argument == "schema"


@pytest.mark.parametrize(
    "adapter",
    [
        pytest.param(PARQUET, id="parquet"),
        pytest.param(ICEBERG, id="iceberg"),
        pytest.param(DELTA, id="delta"),
    ],
)
async def test_commit_seconds_keep_a_bounded_recent_window_and_count_every_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, adapter: Adapter
) -> None:
    monkeypatch.setattr(_file_table, "RECENT_COMMITS", 2)
    table = adapter.make(tmp_path)
    committer = table.committer()
    assert isinstance(committer, CommitTimings)
    for epoch in (5, 6, 7):
        writer = table.writer("0")
        await writer.open()
        await writer.begin(epoch)
        await writer.write(batch(epoch * 10, 3).batch)
        manifest = await writer.stage(epoch)
        await writer.close()
        pre = await committer.prepare(epoch, [manifest])
        assert isinstance(await committer.commit(epoch, pre), Committed)
    assert committer.commits == 3
    assert len(committer.commit_seconds) == 2  # only the latest are kept
    assert all(seconds >= 0 for seconds in committer.commit_seconds)
    assert adapter.marker(table) == 7


# A real process, SIGKILLed at a chosen point of the first epoch's commit.
CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import anyio
    sys.path.insert(0, {tests!r})
    from test_tables import batch, build
    from pathlib import Path

    point = os.environ["KILL_AT"]
    committer = {{
        "parquet": ("barrierflow.connectors.parquet_committer", "ParquetCommitter"),
        "iceberg": ("barrierflow.connectors.iceberg_table", "IcebergCommitter"),
        "delta": ("barrierflow.connectors.delta_table", "DeltaCommitter"),
    }}[sys.argv[3]]
    if point == "before_durable":
        import importlib
        cls = getattr(importlib.import_module(committer[0]), committer[1])
        async def prepare(self, *args):
            os.kill(os.getpid(), signal.SIGKILL)
        cls.prepare = prepare
    elif point == "after_pending":
        import importlib
        cls = getattr(importlib.import_module(committer[0]), committer[1])
        def commit(self, *args):
            os.kill(os.getpid(), signal.SIGKILL)
        cls._commit = commit
    elif point == "after_commit":
        # The committed mark is written with the next pending record (or at the end).
        from barrierflow.actors.sinks.coordinator.meta_store import SinkStates
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
        rt, table, coordinator = build(sys.argv[3], Path(sys.argv[1]))
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
@pytest.mark.parametrize("adapter", TABLES)
@pytest.mark.subprocess
def test_killed_mid_commit_restarts_with_each_epoch_once(
    tmp_path: Path, adapter: Adapter, backend: str, point: str, expected: list[int]
) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(tests=str(ROOT / "tests")))
    child = subprocess.run(
        [sys.executable, str(script), str(tmp_path), backend, adapter.name],
        env={**os.environ, "KILL_AT": point},
        capture_output=True,
        text=True,
        timeout=scaled(60),
        cwd=ROOT,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]

    async def restart() -> tuple[list[int], list[int]]:
        rt, table, coordinator = build(adapter.name, tmp_path)
        async with rt:
            epoch = await rt.checkpoint()
            with anyio.fail_after(scaled(20)):
                await coordinator.wait_committed(epoch)
        assert staging_is_empty(adapter, table), "aborted or orphaned files were left staged"
        return adapter.ids(table), adapter.file_ids(table)

    assert anyio.run(restart, backend=backend) == (expected, expected)


# Commit outcomes: each table classifies its own errors.


async def stage_one(table: Any, epoch: int, start: int) -> Manifest:
    """One writer's manifest of ``epoch``: three rows from ``start``, staged."""
    writer = table.writer("0")
    await writer.open()
    await writer.begin(epoch)
    await writer.write(batch(start, 3).batch)
    manifest: Manifest = await writer.stage(epoch)
    await writer.close()
    return manifest


def _drop(adapter: Adapter, table: Any) -> type[BaseException]:
    """Make ``table`` go away; the error its committer then meets."""
    if adapter is PARQUET:
        shutil.rmtree(table.path)  # the staged files with it
        return SinkRecoveryError
    if adapter is ICEBERG:
        table.catalog.drop_table("ns.events")
        return NoSuchTableError
    shutil.rmtree(table.path / "_delta_log")
    return TableNotFoundError


@pytest.mark.parametrize("adapter", TABLES)
async def test_a_commit_to_a_table_that_is_gone_fails_for_good(
    tmp_path: Path, adapter: Adapter
) -> None:
    table = adapter.make(tmp_path)
    metadata = await table.committer().prepare(1, [await stage_one(table, 1, 0)])
    expected = _drop(adapter, table)
    outcome = await table.committer().commit(1, metadata)
    assert isinstance(outcome, Failed)
    assert isinstance(outcome.cause, expected)


def _lost_race(adapter: Adapter) -> Exception:
    """What a table's commit raises when a concurrent writer won (the file system's hiccup
    for Parquet, whose commit is a rename)."""
    if adapter is PARQUET:
        return OSError(errno.EIO, "input/output error")
    if adapter is ICEBERG:
        return CommitFailedException("a concurrent commit won")
    return CommitFailedError("a concurrent commit won")


@pytest.mark.parametrize("adapter", TABLES)
async def test_a_commit_that_lost_a_race_is_retry_later_and_its_retry_commits(
    tmp_path: Path, adapter: Adapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = adapter.make(tmp_path)
    committer = table.committer()
    await committer.recover({})
    metadata = await committer.prepare(1, [await stage_one(table, 1, 0)])
    lost = _lost_race(adapter)

    def publish(*args: Any) -> None:
        raise lost

    monkeypatch.setattr(committer, "publish", publish)
    outcome = await committer.commit(1, metadata)
    assert isinstance(outcome, RetryLater)
    assert outcome.cause is lost
    monkeypatch.undo()
    assert isinstance(await committer.commit(1, metadata), Committed)
    assert isinstance(await committer.commit(1, metadata), AlreadyCommitted)  # a replay
    assert adapter.ids(table) == [0, 1, 2]


async def test_an_error_no_table_classifies_escapes_the_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = DELTA.make(tmp_path)
    committer = table.committer()
    metadata = await committer.prepare(1, [await stage_one(table, 1, 0)])
    odd = ValueError("something no table knows")

    def publish(*args: Any) -> None:
        raise odd

    monkeypatch.setattr(committer, "publish", publish)
    with pytest.raises(ValueError, match="something no table knows"):
        await committer.commit(1, metadata)  # the coordinator retries it as unclassified


@pytest.mark.parametrize(
    ("error", "root_gone", "outcome"),
    [
        (PermissionError("read-only"), False, Failed),
        (FileNotFoundError("no such file"), True, Failed),
        (FileNotFoundError("no such file"), False, RetryLater),
        (OSError(errno.ENOSPC, "no space left"), False, RetryLater),
        (SinkRecoveryError("t", "files lost"), False, Failed),
        (PositionOverlapError("t", 1, "s/0", 1, 3, 2), False, Failed),
    ],
    ids=["permission", "root-gone", "file-gone", "disk-full", "files-lost", "overlap"],
)
def test_file_errors_are_classified_by_whether_retrying_can_help(
    tmp_path: Path, error: Exception, root_gone: bool, outcome: type
) -> None:
    root = tmp_path / ("gone" if root_gone else "")
    assert isinstance(_file_table.file_commit_outcome(error, root), outcome)


# File statistics: the writers' own, in the table's metadata, with no footer read to commit.


async def commit_two_epochs(table: Any) -> None:
    """Epoch 1 holds ids 0..2, epoch 2 ids 100..102: one file each."""
    committer = table.committer()
    await committer.recover({})
    for epoch, start in ((1, 0), (2, 100)):
        metadata = await committer.prepare(epoch, [await stage_one(table, epoch, start)])
        assert isinstance(await committer.commit(epoch, metadata), Committed)


@pytest.fixture
def footer_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every Parquet footer read (pyarrow's, which pyiceberg and our committers use)."""
    import pyarrow.parquet as pq

    reads: list[str] = []
    read_metadata, parquet_file = pq.read_metadata, pq.ParquetFile

    def spy_metadata(where: Any, *args: Any, **kwargs: Any) -> Any:
        reads.append(str(where))
        return read_metadata(where, *args, **kwargs)

    def spy_file(where: Any, *args: Any, **kwargs: Any) -> Any:
        reads.append(str(where))
        return parquet_file(where, *args, **kwargs)

    monkeypatch.setattr(pq, "read_metadata", spy_metadata)
    monkeypatch.setattr(pq, "ParquetFile", spy_file)
    return reads


async def test_iceberg_data_files_carry_the_writers_bounds_and_readers_skip_files(
    tmp_path: Path, footer_reads: list[str]
) -> None:
    table = ICEBERG.make(tmp_path)
    await commit_two_epochs(table)
    assert footer_reads == []  # the commits opened no data file
    files = table.table().inspect.files()
    assert files["record_count"].to_pylist() == [3, 3]
    field = table.table().schema().find_field("id").field_id
    bounds = sorted(
        (int.from_bytes(dict(lower)[field], "little"), int.from_bytes(dict(upper)[field], "little"))
        for lower, upper in zip(
            files["lower_bounds"].to_pylist(), files["upper_bounds"].to_pylist(), strict=True
        )
    )
    assert bounds == [(0, 2), (100, 102)]  # a long's bound: 8 bytes, little-endian
    assert sorted(n[field] for n in map(dict, files["null_value_counts"].to_pylist())) == [0, 0]
    from pyiceberg.expressions import GreaterThanOrEqual

    # A filtered scan plans only the file whose bounds can match.
    planned = list(table.table().scan(row_filter=GreaterThanOrEqual("id", 100)).plan_files())
    assert len(planned) == 1
    assert sorted(table.table().scan().to_arrow()["id"].to_pylist()) == [0, 1, 2, 100, 101, 102]


async def test_delta_add_actions_carry_the_writers_stats_like_deltalakes_own_writer(
    tmp_path: Path, footer_reads: list[str]
) -> None:
    table = DELTA.make(tmp_path)
    await commit_two_epochs(table)
    assert footer_reads == []  # the commits opened no data file
    actions = pa.table(table.table().get_add_actions(flatten=True)).to_pydict()
    columns = ("num_records", "min.id", "max.id", "null_count.id")
    stats = sorted(zip(*(actions[c] for c in columns), strict=True))
    assert stats == [(3, 0, 2, 0), (3, 100, 102, 0)]
    # deltalake skips the file whose bounds cannot match.
    assert table.table().to_pyarrow_table(filters=[("id", ">=", 100)])["id"].to_pylist() == [
        100, 101, 102,
    ]  # fmt: skip
