"""Faults of a keyed aggregate run in Spark's tasks (``run_on="executors"``): ``filter → key_by
→ aggregate (sum/count/max) → changelog_rows → a table`` (``_cluster_keyed_child.py``), its
state in vnode stores on the table's directory, against a reference computed over the whole
input. After every fault the run is held to one rule, :func:`assert_exactly_once`:

* the table's changelog is the reference's, row for row (no epoch's rows twice, none lost);
* no key has two current rows ("+I"/"+U") in one commit, and each key's last one, in commit
  order, is the reference's aggregate;
* the state store, read as of its last committed epoch, is the reference's aggregate, and that
  epoch is the table's: state and output stand at the same epoch;
* nothing is left staged, of the rows or of the state.

The faults: an executor JVM SIGKILLed mid-batch, and speculative copies of a task, on the
standalone cluster; the driver's process group SIGKILLed mid-batch, or between an epoch's state
commit and its table commit, and resumed (a local master); a rescale from 2 to 4 partitions
between runs on the cluster. The child's "gate" (see its module) is what lets a test hold a
task mid-batch. The helpers of the chain's fault tests (``test_executor_chain_faults.py``) drive
the children. Parquet and Delta tables: their commits name the epoch each row came in.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from _chain_service import KEEP, Call, ChainService, events, staged_leftovers, table_root
from _cluster_keyed_child import KEYED, TOTALS, make_keyed_table
from _timeouts import scaled
from test_executor_chain_faults import (
    CHILD_BATCHES,
    CHILD_ROWS,
    FirstAttemptOfPartition1,
    chaos_act_finds_nothing,
    child_spans,
    finished,
    kill_group,
    kill_one_executor,
    start_driver,
    stop,
    wait_held,
    write_input,
)

from barrierflow.connectors.vnode_state import VnodeStateStore
from barrierflow.spark_bridge.task_state import STATE_DIRECTORY
from barrierflow.testing.spark_cluster import StandaloneCluster

pytestmark = pytest.mark.anyio

Backend = Literal["asyncio", "trio"]
CHILD = Path(__file__).with_name("_cluster_keyed_child.py")
#: A row of the table without its op: the key and the aggregate.
Aggregate = tuple[int, int, int, int]
#: The aggregate's columns, as the table and the state store hold them.
COLUMNS = ["user", "total", "n", "top"]


def run_driver(
    master: str,
    mode: str,
    work: Path,
    service: ChainService,
    kind: str,
    backend: Backend,
    **env: str,
) -> subprocess.Popen[str]:
    """The keyed child as a process group of its own; ``env`` as ``BARRIERFLOW_KEYED_<NAME>``."""
    extra = {f"BARRIERFLOW_KEYED_{name.upper()}": value for name, value in env.items()}
    return start_driver(master, mode, work, service, kind, backend, child=CHILD, env_extra=extra)


# The reference over the whole input.


def reference(spans: Iterable[tuple[int, int]]) -> tuple[list[tuple[Any, ...]], set[Aggregate]]:
    """The changelog the pipeline writes for the micro-batches of events ``spans`` (one per
    micro-batch, in order) — each batch's keys as "+I" (new) or "-U" then "+U" — sorted, and
    the aggregate after the last batch."""
    current: dict[int, Aggregate] = {}
    changelog: list[tuple[Any, ...]] = []
    for start, count in spans:
        kept = events(start, count).filter(KEEP)
        batch = kept.group_by("user").aggregate([("id", "sum"), ("id", "count"), ("id", "max")])
        columns = (batch[c].to_pylist() for c in ("user", "id_sum", "id_count", "id_max"))
        for user, total, n, top in zip(*columns, strict=True):
            before = current.get(user)
            if before is not None:
                total, n, top = before[1] + total, before[2] + n, max(before[3], top)
            after = (user, total, n, top)
            if before is None:
                changelog.append((*after, "+I"))
            else:
                changelog += [(*before, "-U"), (*after, "+U")]
            current[user] = after
    return sorted(changelog), set(current.values())


# The table and the state read back.


def read_commits(kind: str, root: Path) -> pa.Table:
    """The table's rows with the commit that added them (``commit``: increasing from commit to
    commit). Parquet: each epoch's directory; Delta: each commit's added files, numbered by
    the epoch its commit info names, and checked against deltalake's own reader."""
    if kind == "parquet":
        parts = []
        for path in sorted((root / "table").glob("epoch=*/*/*.parquet")):
            rows = pq.read_table(path, schema=KEYED)
            commit = int(path.parent.parent.name.removeprefix("epoch="))
            parts.append(rows.append_column("commit", pa.array([commit] * len(rows), pa.int64())))
        return pa.concat_tables(parts) if parts else empty_commits()
    from deltalake import DeltaTable

    location = root / "delta"
    if not (location / "_delta_log").exists():
        return empty_commits()
    table = DeltaTable(str(location))
    parts = []
    for info in table.history():
        version = int(info["version"])
        log = (location / "_delta_log" / f"{version:020d}.json").read_text()
        for line in log.splitlines():
            action = json.loads(line)
            if "add" in action:
                rows = pq.read_table(location / action["add"]["path"], schema=KEYED)
                commit = int(info["barrierflow.epoch"])
                parts.append(
                    rows.append_column("commit", pa.array([commit] * len(rows), pa.int64()))
                )
    found = pa.concat_tables(parts) if parts else empty_commits()
    assert sorted_rows(found) == sorted_rows(table.to_pyarrow_table())
    return found


def empty_commits() -> pa.Table:
    return KEYED.append(pa.field("commit", pa.int64())).empty_table()


def sorted_rows(rows: pa.Table) -> list[tuple[Any, ...]]:
    """The rows of the table's columns as tuples, sorted (a multiset to compare)."""
    return sorted(zip(*(rows[c].to_pylist() for c in KEYED.names), strict=True))


def state_store(kind: str, root: Path) -> VnodeStateStore:
    """The aggregate's view store (under the table's directory: the bridge's default)."""
    store = VnodeStateStore.existing(table_root(kind, root) / STATE_DIRECTORY / TOTALS / "view")
    assert store is not None, "no state was ever committed"
    return store


def table_epoch(kind: str, root: Path) -> int:
    """The table's last committed epoch, as its committer reads it."""
    epoch: int = make_keyed_table(kind, root).committer().committed_epoch()
    return epoch


def assert_exactly_once(kind: str, root: Path, spans: list[tuple[int, int]]) -> None:
    """The table and the state after the micro-batches ``spans`` (see the module)."""
    changelog, final = reference(spans)
    rows = read_commits(kind, root)
    assert sorted_rows(rows) == changelog
    current = rows.filter(pc.is_in(rows["op"], pa.array(["+I", "+U"])))
    pairs = list(zip(current["user"].to_pylist(), current["commit"].to_pylist(), strict=True))
    assert len(pairs) == len(set(pairs)), "a key has two current rows in one commit"
    latest = current.sort_by([("commit", "ascending")]).to_pylist()
    last = {r["user"]: tuple(r[c] for c in COLUMNS) for r in latest}
    assert set(last.values()) == final
    store = state_store(kind, root)
    state = store.read(range(store.vnode_count), store.last_committed())
    assert set(zip(*(state[c].to_pylist() for c in COLUMNS), strict=True)) == final
    assert store.last_committed() == table_epoch(kind, root)
    assert store.staged_numbers() == []
    assert staged_leftovers(kind, root) == []


def test_the_reference_changelog_counts_each_event_once_per_batch() -> None:
    changelog, final = reference([(0, 200), (200, 200)])
    users = {user for user, *_ in final}
    assert users == set(range(3, 97))
    # Batch 0 inserts every kept user; batch 1 updates each one (-U, +U).
    ops = [row[-1] for row in changelog]
    assert (ops.count("+I"), ops.count("-U"), ops.count("+U")) == (94, 94, 94)
    kept = events(0, 400).filter(KEEP)
    assert sum(total for _, total, _, _ in final) == pc.sum(kept["id"]).as_py()
    assert sum(n for _, _, n, _ in final) == len(kept)


def write_batches(work: Path) -> list[tuple[int, int]]:
    """The child's input for a streaming query (``write_input``: one event file per
    micro-batch), the files' modification times one second apart: Spark's file source takes
    the files in that order, and files written in the same instant could come in any (the
    changelog depends on the order of the batches, the totals do not)."""
    spans = write_input(work, [CHILD_ROWS] * CHILD_BATCHES)
    files = sorted((work / "in").glob("part-*.parquet"))
    first = min(path.stat().st_mtime for path in files)
    for index, path in enumerate(files):
        os.utime(path, (first + index, first + index))
    return spans


def in_batch(batch: int) -> range:
    """The ids of the child's static micro-batch ``batch`` (a gate call's id is the largest
    id of its user so far, so it falls in the batch the task is running)."""
    return range(batch * CHILD_ROWS, (batch + 1) * CHILD_ROWS)


# A driver of its own on a local master: its process group SIGKILLed, then resumed.


@pytest.mark.spark
@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("kind", "backend", "epoch"),
    [("parquet", "asyncio", 1), ("delta", "trio", 2), ("parquet", "trio", 3)],
)
def test_a_driver_killed_between_an_epoch_s_state_commit_and_its_table_commit_resumes_once(
    tmp_path: Path, kind: str, backend: Backend, epoch: int
) -> None:
    spans = write_batches(tmp_path)
    with ChainService() as service:
        # The child SIGKILLs its own group right after the state commit of its epoch-th
        # epoch with rows, before the table commit of that epoch.
        driver = run_driver(
            "local[2,4]", "stream", tmp_path, service, kind, backend, kill=str(epoch)
        )
        try:
            driver.communicate(timeout=scaled(180))
        finally:
            stop(driver)
        assert driver.returncode == -signal.SIGKILL
        # The kill landed where it was meant to: the table holds the epochs before, and the
        # state is one epoch ahead of it.
        assert len(set(read_commits(kind, tmp_path)["commit"].to_pylist())) == epoch - 1
        assert state_store(kind, tmp_path).last_committed() > table_epoch(kind, tmp_path)
        report = finished(run_driver("local[2,4]", "stream", tmp_path, service, kind, backend))
    assert report["to_arrow_seconds"] == 0.0
    assert_exactly_once(kind, tmp_path, spans)


@pytest.mark.spark
@pytest.mark.subprocess
def test_the_check_fails_a_run_whose_epoch_committed_its_rows_without_its_state(
    tmp_path: Path,
) -> None:
    spans = write_batches(tmp_path)
    with ChainService() as service:
        # The second epoch's state is never committed: the third batch's tasks read the
        # state of the first, and write totals short of the second batch's events.
        driver = run_driver(
            "local[2,4]", "stream", tmp_path, service, "parquet", "asyncio", skip="2"
        )
        finished(driver)
    with pytest.raises(AssertionError):
        assert_exactly_once("parquet", tmp_path, spans)


@pytest.mark.spark
@pytest.mark.subprocess
@pytest.mark.parametrize(("kind", "backend"), [("delta", "asyncio"), ("parquet", "trio")])
def test_a_driver_killed_mid_batch_and_resumed_leaves_state_and_output_exactly_once(
    tmp_path: Path, kind: str, backend: Backend
) -> None:
    spans = write_batches(tmp_path)
    # Batch 1's tasks are held at the gate, after their aggregate and before anything of
    # theirs is staged, while the driver's process group is SIGKILLed.
    with ChainService(hold=lambda call: call.id in in_batch(1)) as service:
        driver = run_driver("local[2,4]", "stream", tmp_path, service, kind, backend)
        try:
            wait_held(service, 1, driver)
            kill_group(driver)
        finally:
            stop(driver)
        service.release()
        report = finished(run_driver("local[2,4]", "stream", tmp_path, service, kind, backend))
        held, made = service.held(), service.calls()
    assert report["to_arrow_seconds"] == 0.0
    # The resumed driver ran batch 1 again, in Spark tasks: its gate calls, beyond the held
    # ones of the killed driver's tasks.
    again = [c for c in made if c.id in in_batch(1) and c not in held]
    assert again
    assert report["pid"] not in {c.pid for c in again}
    assert_exactly_once(kind, tmp_path, spans)


# On the standalone cluster (two one-core executors).


@pytest.mark.cluster
@pytest.mark.parametrize(("kind", "backend"), [("parquet", "asyncio"), ("delta", "trio")])
def test_an_executor_killed_mid_batch_leaves_state_and_output_exactly_once(
    spark_cluster: StandaloneCluster, tmp_path: Path, kind: str, backend: Backend
) -> None:
    # Batch 1's first attempts are held at the gate, one task on each executor, while the
    # test SIGKILLs one executor; Spark runs its task again from the committed state.
    def first_attempts_of_batch_1(call: Call) -> bool:
        return call.id in in_batch(1) and call.attempt == 0

    with ChainService(hold=first_attempts_of_batch_1) as service:
        driver = run_driver(spark_cluster.master_url, "batches", tmp_path, service, kind, backend)
        try:
            wait_held(service, 2, driver)
            kill_one_executor(spark_cluster, (tmp_path / "app_id").read_text())
            service.release()
            report = finished(driver)
        finally:
            stop(driver)
        made = service.calls()
    assert (report["batches"], report["staged_batches"]) == (CHILD_BATCHES, CHILD_BATCHES)
    assert report["to_arrow_seconds"] == 0.0
    # The killed executor's task ran again: a partition of batch 1 passed the gate in two
    # attempts (the vnode repartition is a shuffle, so Spark may rerun the stage, whose
    # attempts count from 0 again, rather than the task: told apart by the Python worker).
    batch_1 = [c for c in made if c.id in in_batch(1)]
    runs = {(c.partition, c.attempt, c.pid) for c in batch_1}
    assert len(runs) > len({c.partition for c in batch_1})
    assert_exactly_once(kind, tmp_path, child_spans())


@pytest.mark.cluster
@pytest.mark.parametrize(("kind", "backend"), [("delta", "asyncio"), ("parquet", "trio")])
def test_speculative_copies_of_a_keyed_task_commit_one_attempt_s_state_and_rows(
    spark_cluster: StandaloneCluster, tmp_path: Path, kind: str, backend: Backend
) -> None:
    # One attempt of batch 0's partition 1 is held at the gate for good: the job can only
    # finish through another attempt of it, run by Spark's speculation on the other executor;
    # both read the same state, and only the winner's delta may be committed.
    first = FirstAttemptOfPartition1()
    with ChainService(hold=first) as service:
        driver = run_driver(spark_cluster.master_url, "speculate", tmp_path, service, kind, backend)
        try:
            report = finished(driver)
        finally:
            stop(driver)
        held, made = service.held(), service.calls()
    assert held  # one attempt started, and was outrun
    assert {c.attempt for c in held} == {first.attempt}
    winners = {c.attempt for c in made if c.partition == 1 and c.id in in_batch(0)}
    assert winners
    assert first.attempt not in winners
    assert report["batches"] == CHILD_BATCHES
    assert_exactly_once(kind, tmp_path, child_spans())


@pytest.mark.cluster
@pytest.mark.parametrize(("kind", "backend"), [("parquet", "asyncio"), ("delta", "trio")])
def test_a_rescale_from_2_to_4_partitions_between_runs_moves_state_by_vnode_exactly_once(
    spark_cluster: StandaloneCluster, tmp_path: Path, kind: str, backend: Backend
) -> None:
    master = spark_cluster.master_url
    with ChainService() as service:
        two = finished(
            run_driver(master, "batches", tmp_path, service, kind, backend,
                       parallelism="2", batches="0,2")
        )  # fmt: skip
        before = service.calls()
        four = finished(
            run_driver(master, "batches", tmp_path, service, kind, backend,
                       parallelism="4", batches="2,2")
        )  # fmt: skip
        after = service.calls()[len(before) :]
    # Two tasks a micro-batch, then four: each task ran its own vnodes' keys, whose state the
    # first run's tasks had written under another split.
    assert (two["batches"], two["executor_tasks"]) == (2, 4)
    assert (four["batches"], four["executor_tasks"]) == (2, 8)
    assert {c.partition for c in before} == {0, 1}
    assert {c.partition for c in after} == {0, 1, 2, 3}
    assert_exactly_once(kind, tmp_path, [(b * CHILD_ROWS, CHILD_ROWS) for b in range(4)])


# The chaos harness's act of the keyed step (see barrierflow.app.chaos.acts).


def test_the_keyed_act_runs_the_executors_act_with_the_keyed_step_on_every_run_not_by_default(
    tmp_path: Path,
) -> None:
    from barrierflow.app.chaos.acts import ACTS
    from barrierflow.app.chaos.harness import ChaosConfig

    act = ACTS["spark-keyed"]
    assert act.targets == ACTS["spark-executors"].targets
    assert act.tables == ("iceberg", "delta")
    for resume in (False, True):
        words = act.command("python", tmp_path, "trio", resume)
        assert words[3:5] == ["demo", "spark"]
        assert {"--keyed", "executors", "trio"} <= set(words)
        assert "--chain" not in words
    assert "spark-keyed" not in ChaosConfig(workdir=tmp_path).acts


def test_the_demo_s_keyed_option_is_a_bool_not_with_the_chain_and_a_resume_keeps_it(
    tmp_path: Path,
) -> None:
    from barrierflow.app.demo import DemoConfig, resume_command
    from barrierflow.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        DemoConfig(workdir=tmp_path, keyed="yes")  # type: ignore[arg-type]
    assert (info.value.argument, info.value.got) == ("keyed", "yes")
    with pytest.raises(ConfigError) as info:
        DemoConfig(workdir=tmp_path, keyed=True, chain=True)
    assert (info.value.argument, info.value.expected) == ("keyed", "False with chain=True")
    config = DemoConfig(workdir=tmp_path, keyed=True, write_on="executors")
    assert resume_command(config).endswith(" --run-on executors --keyed")
    assert "--keyed" not in resume_command(DemoConfig(workdir=tmp_path))


def test_the_keyed_demo_step_keeps_the_inserts_in_the_table_s_columns_and_drops_updates() -> None:
    from barrierflow.app._demo_input import SCHEMA
    from barrierflow.app._demo_keyed import inserts_in_table_order

    changelog = pa.record_batch(
        {
            "key": pa.array([1, 2, 2, 3], pa.int64()),
            "value": [0.5, 0.25, 0.75, 0.125],
            "op": ["+I", "-U", "+U", "+I"],
        }
    )
    kept = inserts_in_table_order(changelog)
    assert kept.schema == SCHEMA
    assert kept.to_pylist() == [{"key": 1, "value": 0.5}, {"key": 3, "value": 0.125}]


def test_the_keyed_demo_s_aggregate_is_planned_into_spark_s_tasks(tmp_path: Path) -> None:
    from barrierflow.app._demo_faults import Faults
    from barrierflow.app._demo_tables import open_table
    from barrierflow.app.demo import build_runtime
    from barrierflow.spark_bridge.chain import plan_chain

    table = open_table("delta", tmp_path, postgres_dsn=None, fresh=True)
    rt, feed, sink = build_runtime(tmp_path, table, Faults(None, "mid-batch", ""), keyed=True)
    steps = plan_chain(rt.nodes(), "events", sink.name, sink.writers, feed.schema.names)
    assert [(s.name, s.key) for s in steps] == [
        ("keyed.aggregate", ("key",)),
        ("keyed.changelog", None),
        ("keyed.map", None),
    ]


@pytest.mark.spark
@pytest.mark.subprocess
@pytest.mark.timeout(300)
def test_the_keyed_demo_runs_its_aggregate_in_spark_s_tasks_with_its_state_beside_the_table(
    tmp_path: Path,
) -> None:
    from test_demo import demo

    options = ["--rows", "2000", "--batches", "2", "--table", "delta", "--run-on", "executors"]
    done = demo(tmp_path / "d", *options, "--keyed")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert lines[-1] == "VERIFIED rows_in=2000 rows_out=2000 duplicates=0 epochs=2"
    view = tmp_path / "d" / "delta" / "events" / STATE_DIRECTORY / "keyed.aggregate" / "view"
    store = VnodeStateStore.existing(view)
    assert store is not None
    every = store.read(range(store.vnode_count), store.last_committed())
    assert sorted(every["key"].to_pylist()) == list(range(2000))


@pytest.mark.spark
@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_chaos_harness_kills_the_keyed_act_mid_batch_and_finds_nothing(tmp_path: Path) -> None:
    chaos_act_finds_nothing(tmp_path, "spark-keyed")
