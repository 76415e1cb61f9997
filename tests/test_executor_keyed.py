"""Keyed state on Spark's executors: ``key_by → aggregate / reduce`` runs in Spark's tasks after
a vnode repartition, its state read as of the last committed epoch from the shared vnode
stores and committed with the epoch's rows (``run_on="executors"``).

Local Spark (the session's ``local[2,4]``: a failed task is retried, up to 4 attempts). Each
test checks the table *and* the committed state against a reference computed with pyarrow over
the whole input, micro-batch by micro-batch: the ``changelog_rows`` output of every epoch is
exactly the changes the reference makes (``+I`` for a new key, ``-U``/``+U`` for a changed
one, nothing for an unchanged one), so a row lost, doubled, or read from a stale state fails.
The state is read back with :meth:`VnodeStateStore.existing` as of its last committed epoch,
which must be the epoch of the last micro-batch: state and output stand at the same epoch.

The chain's functions live in ``_executor_keyed_actors``, pickled by value: the tests' modules
are not importable on Spark's Python workers. Both anyio backends run the task runtime (it
takes the driver's backend) where a test is cheap enough to run twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import _executor_keyed_actors
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import structlog
from _executor_keyed_actors import (
    CURSED_KEY,
    IN,
    MEANS,
    SUMS,
    TOTALS,
    FailsFirstAttempt,
    doubled,
    even_values,
    fails_on_key_five,
    running_sum,
)
from pyspark import cloudpickle

from barrierflow.actors import BatchFeed, add_sink
from barrierflow.channels import Op
from barrierflow.channels.vnode import VnodeBitmap
from barrierflow.connectors import (
    DeltaLakeTable,
    IcebergTable,
    ParquetTable,
    PostgresTable,
    open_local_catalog,
)
from barrierflow.connectors.vnode_state import VnodeStateStore
from barrierflow.errors import ExecutorChainFailedError, ExecutorPlacementError
from barrierflow.operators import Stream, Tumbling
from barrierflow.runtime import BlockingRuntime, Runtime, RuntimeConfig
from barrierflow.spark_bridge import BridgeStats, SparkBridge
from barrierflow.testing import PostgresServer

pytestmark = pytest.mark.spark

Backend = Literal["asyncio", "trio"]
BACKENDS = pytest.mark.parametrize("backend", ["asyncio", "trio"])
#: The keys of the tests' events: ``id % KEYS``.
KEYS = 37
#: The keyed step's name (its state's directory under the state root).
STEP = "totals"
#: A row of a table or a state: its columns' values in schema order.
Row = tuple[Any, ...]
#: A reference fold: the state of every key after the rows of a table (key → values).
Fold = Callable[[pa.Table], dict[int, Row]]


@pytest.fixture(autouse=True)
def _keyed_code_by_value() -> Iterator[None]:
    cloudpickle.register_pickle_by_value(_executor_keyed_actors)  # type: ignore[no-untyped-call]
    yield
    registered = cloudpickle.list_registry_pickle_by_value()  # type: ignore[no-untyped-call]
    if _executor_keyed_actors.__name__ in registered:
        cloudpickle.unregister_pickle_by_value(_executor_keyed_actors)  # type: ignore[no-untyped-call]


# The input and the reference.


@dataclass(frozen=True)
class Batch:
    """A micro-batch: Spark's batch id and the ids ``start .. start+count`` (key ``id % 37``,
    value ``id``), in ``partitions`` Spark partitions, without the key ``without``."""

    batch_id: int
    start: int
    count: int
    partitions: int = 3
    without: int | None = None

    def frame(self, spark: Any) -> Any:
        df = spark.range(self.start, self.start + self.count, numPartitions=self.partitions)
        df = df.selectExpr(f"id % {KEYS} as k", "id as v")
        return df if self.without is None else df.where(f"k != {self.without}")

    def rows(self) -> pa.Table:
        ids = pa.array(range(self.start, self.start + self.count), pa.int64())
        rows = pa.table([pc.remainder(ids, KEYS), ids], schema=IN)
        return rows if self.without is None else rows.filter(pc.field("k") != self.without)


BATCHES = [Batch(0, 0, 300), Batch(1, 300, 200, 2), Batch(2, 500, 250, 4)]


def folded(rows: pa.Table, aggregations: list[tuple[str, str]]) -> dict[int, Row]:
    """Each key's ``aggregations`` of column ``v`` over ``rows``."""
    grouped = rows.group_by("k").aggregate([("v", fn) for _, fn in aggregations])
    columns = [grouped.column("k").to_pylist()] + [
        grouped.column(f"v_{fn}").to_pylist() for _, fn in aggregations
    ]
    return {row[0]: tuple(row[1:]) for row in zip(*columns, strict=True)}


def totals(rows: pa.Table) -> dict[int, Row]:
    """``aggregate(total=("v", "sum"), n=("v", "count"), top=("v", "max"))``'s reference."""
    return folded(rows, [("total", "sum"), ("n", "count"), ("top", "max")])


def even_sums(rows: pa.Table) -> dict[int, Row]:
    """``filter(even_values)`` then ``reduce(running_sum)``'s reference."""
    return folded(rows.filter(pc.equal(pc.bit_wise_and(rows["v"], 1), 0)), [("v", "sum")])


def means(rows: pa.Table) -> dict[int, Row]:
    """``aggregate(avg=("v", "mean"))``'s reference (sum over count, as the state keeps)."""
    return {
        k: (round(s / n, 9),) for k, (s, n) in folded(rows, [("s", "sum"), ("n", "count")]).items()
    }


def expected_changes(batches: Sequence[Batch], fold: Fold) -> list[list[Row]]:
    """The ``changelog_rows`` output of each micro-batch, sorted: ``+I`` for a key's first
    state, ``-U`` then ``+U`` for a changed one, nothing for a key whose state did not change."""
    changes: list[list[Row]] = []
    seen: list[pa.Table] = []
    before: dict[int, Row] = {}
    for batch in batches:
        seen.append(batch.rows())
        after = fold(pa.concat_tables(seen))
        epoch: list[Row] = []
        for key, state in after.items():
            if key not in before:
                epoch.append((key, *state, "+I"))
            elif before[key] != state:
                epoch += [(key, *before[key], "-U"), (key, *state, "+U")]
        changes.append(sorted(epoch))
        before = after
    return changes


def final_state(batches: Sequence[Batch], fold: Fold) -> list[Row]:
    """Each key's state after every batch, sorted."""
    return sorted((k, *v) for k, v in fold(pa.concat_tables([b.rows() for b in batches])).items())


# The pipeline.

Kind = Literal["parquet", "iceberg", "delta"]
Declare = Callable[[Stream], Stream]


def make_table(kind: Kind, root: Path, schema: pa.Schema) -> Any:
    """The ``kind`` table of ``schema`` under ``root`` (created, or opened if there)."""
    if kind == "iceberg":
        return IcebergTable(open_local_catalog(root / "catalog"), "ns.totals", schema)
    if kind == "delta":
        return DeltaLakeTable(root / "delta", schema, app_id="totals")
    return ParquetTable(root / "table", schema)


def read_epochs(kind: Kind, root: Path, schema: pa.Schema) -> list[list[Row]]:
    """The table's rows, sorted: for Parquet one list per committed epoch that has rows (its
    ``epoch=<E>`` directory), in epoch order; for Iceberg and Delta, read with the format's
    own reader, one list of every row."""
    if kind == "iceberg":
        rows = open_local_catalog(root / "catalog").load_table("ns.totals").scan().to_arrow()
        tables = [rows]
    elif kind == "delta":
        from deltalake import DeltaTable

        tables = [DeltaTable(str(root / "delta")).to_pyarrow_table()]
    else:
        epochs = sorted((root / "table").glob("epoch=*"), key=lambda p: int(p.name[6:]))
        tables = [
            pa.concat_tables([pq.read_table(f) for f in sorted(d.rglob("*.parquet"))])
            for d in epochs
            if any(d.rglob("*.parquet"))
        ]
    return [sorted(_rows(t.select(schema.names))) for t in tables if t.num_rows]


def _rows(table: pa.Table) -> list[Row]:
    """The rows of ``table`` as tuples, floats rounded (a mean's last bits)."""
    return [
        tuple(round(v, 9) if isinstance(v, float) else v for v in row.values())
        for row in table.to_pylist()
    ]


def committed_state(root: Path, table: str, columns: Sequence[str]) -> tuple[int, list[Row]]:
    """The last committed epoch of the state table ``table`` under the step's ``root``, and
    its rows (``columns``) as of it, sorted."""
    store = VnodeStateStore.existing(root / table)
    assert store is not None, f"no committed state at {root / table}"
    epoch = store.last_committed()
    rows = store.read(VnodeBitmap.full(store.vnode_count), epoch).select(list(columns))
    return epoch, sorted(_rows(rows))


def staged(root: Path) -> list[tuple[str, int, str]]:
    """What is left staged under the step's ``root``: ``(table, staging number, attempt)`` of
    each ``<table>/staged/<number>/<attempt>``."""
    found = root.glob("*/staged/*/*")
    return sorted((p.parents[2].name, int(p.parent.name), p.name) for p in found)


def aggregate_totals(events: Stream) -> Stream:
    keyed = events.key_by("k")
    return keyed.aggregate(name=STEP, total=("v", "sum"), n=("v", "count"), top=("v", "max"))


@dataclass
class Run:
    """What one run of the pipeline returned: the epochs of its micro-batches (``None``: a
    replay skipped) and the bridge's counters."""

    epochs: list[int | None]
    stats: BridgeStats


def run(
    spark: Any,
    tmp_path: Path,
    batches: Sequence[Batch],
    *,
    kind: Kind = "parquet",
    parallelism: int | None = 2,
    backend: Backend = "asyncio",
    declare: Declare = aggregate_totals,
    schema: pa.Schema = TOTALS,
    state_root: Path | None = None,
) -> Run:
    """Deliver ``batches`` on the executors through ``events → declare → changelog_rows →
    a kind table`` in a new runtime on the same state path and table, and wait until the last
    one is committed."""
    feed = BatchFeed(IN)
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=3600.0))
    rt.add_source("events", feed.source)
    last = declare(Stream(rt, "events")).changelog_rows()
    sink = add_sink(rt, "out", make_table(kind, tmp_path, schema), input=last.name,
                    parallelism=parallelism)  # fmt: skip
    epochs: list[int | None] = []
    with BlockingRuntime(rt, backend=backend) as handle:
        bridge = SparkBridge(handle, feed, sink=sink, state_root=state_root)
        for batch in batches:
            epochs.append(bridge.deliver(batch.frame(spark), batch.batch_id, run_on="executors"))
        durable = [e for e in epochs if e is not None]
        if durable:
            handle.call(sink.coordinator.wait_committed, durable[-1])
        return Run(epochs, bridge.stats())


# Local Spark: the result equals the reference, exactly once.


@pytest.mark.parametrize(
    ("kind", "backend"),
    [("parquet", "asyncio"), ("iceberg", "asyncio"), ("delta", "trio")],
)
def test_a_keyed_aggregate_on_the_executors_equals_the_reference_in_table_and_state_once(
    spark: Any, tmp_path: Path, kind: Kind, backend: Backend
) -> None:
    # Parquet keeps its state where the bridge puts it by default (under the table's root);
    # Iceberg and Delta in a state root of the test's.
    state_root = None if kind == "parquet" else tmp_path / "state"
    step = (tmp_path / "table" / "_barrierflow_state" if state_root is None else state_root) / STEP
    # Spark replays the last batch id: skipped, no Spark job, nothing changes.
    delivered = [*BATCHES, BATCHES[-1]]
    done = run(spark, tmp_path, delivered, kind=kind, backend=backend, state_root=state_root)
    assert [e is None for e in done.epochs] == [False, False, False, True]
    assert (done.stats.batches, done.stats.replays_skipped) == (len(BATCHES), 1)
    changes = expected_changes(BATCHES, totals)
    if kind == "parquet":
        # Each micro-batch's changes in an epoch of its own: each (key, epoch) once.
        assert read_epochs(kind, tmp_path, TOTALS) == changes
    else:
        assert read_epochs(kind, tmp_path, TOTALS) == [sorted(r for e in changes for r in e)]
    # The state as of its last committed epoch: the last micro-batch's, and the reference's.
    assert committed_state(step, "view", ("k", "total", "n", "top")) == (
        done.epochs[-2],
        final_state(BATCHES, totals),
    )
    assert staged(step) == []
    # No row crossed to the driver, and each micro-batch ran as the sink's two tasks.
    assert (done.stats.to_arrow_seconds, done.stats.executor_tasks) == (0.0, 2 * len(BATCHES))
    # The second and third batches' tasks loaded every key the one before left.
    assert done.stats.state_rows_read == 2 * KEYS
    assert 0 < done.stats.state_seconds < done.stats.task_seconds


def test_a_filter_then_a_reduce_on_the_executors_equals_the_reference_across_an_emptied_batch(
    spark: Any, tmp_path: Path
) -> None:
    def declare(events: Stream) -> Stream:
        return events.filter(even_values).key_by("k").reduce(running_sum, name=STEP)

    step = tmp_path / "table" / "_barrierflow_state" / STEP
    # Batch 1 holds one odd id: the filter drops it, none of the four tasks has a row for the
    # keyed step, and the state stays as it was for batch 2.
    batches = [BATCHES[0], Batch(1, 301, 1, 1), Batch(2, 302, 200, 2)]
    done = run(spark, tmp_path, batches, declare=declare, schema=SUMS, parallelism=4)
    assert None not in done.epochs
    changes = expected_changes(batches, even_sums)
    assert changes[1] == []
    assert read_epochs("parquet", tmp_path, SUMS) == [changes[0], changes[2]]
    assert committed_state(step, "view", ("k", "v")) == (
        done.epochs[-1],
        final_state(batches, even_sums),
    )


def test_a_mean_keeps_its_hidden_state_and_its_view_on_the_executors_equal_to_the_reference(
    spark: Any, tmp_path: Path
) -> None:
    def declare(events: Stream) -> Stream:
        return events.key_by("k").aggregate(name=STEP, avg=("v", "mean"))

    step = tmp_path / "table" / "_barrierflow_state" / STEP
    done = run(spark, tmp_path, BATCHES[:2], declare=declare, schema=MEANS, backend="trio")
    assert read_epochs("parquet", tmp_path, MEANS) == expected_changes(BATCHES[:2], means)
    # Two state tables, both committed at the last micro-batch's epoch.
    assert sorted(p.name for p in step.iterdir()) == ["state", "view"]
    assert committed_state(step, "view", ("k", "avg")) == (
        done.epochs[-1],
        final_state(BATCHES[:2], means),
    )
    hidden = VnodeStateStore.existing(step / "state")
    assert hidden is not None
    assert hidden.last_committed() == done.epochs[-1]
    assert hidden.read(VnodeBitmap.full(hidden.vnode_count), done.epochs[-1]).num_rows == KEYS


def test_a_rescale_between_runs_resplits_the_vnodes_and_equals_the_reference(
    spark: Any, tmp_path: Path
) -> None:
    step = tmp_path / "table" / "_barrierflow_state" / STEP
    batches = [*BATCHES, Batch(3, 750, 120, 5)]
    runs = [
        run(spark, tmp_path, batches[:2], parallelism=2),
        run(spark, tmp_path, batches[2:3], parallelism=4),
        # After the restart Spark replays the last batch id: skipped, whatever the parallelism.
        run(spark, tmp_path, batches[2:], parallelism=1),
    ]
    assert runs[2].epochs[0] is None
    assert [r.stats.executor_tasks for r in runs] == [2 * 2, 1 * 4, 1 * 1]
    assert read_epochs("parquet", tmp_path, TOTALS) == expected_changes(batches, totals)
    assert committed_state(step, "view", ("k", "total", "n", "top")) == (
        runs[-1].epochs[-1],
        final_state(batches, totals),
    )


def test_without_a_sink_parallelism_each_batch_splits_the_vnodes_by_its_partitions(
    spark: Any, tmp_path: Path
) -> None:
    # 3, then 2, then 4 Spark partitions: the vnodes are split three ways, then two, then
    # four, and each task reads the state of the vnodes it holds now.
    step = tmp_path / "table" / "_barrierflow_state" / STEP
    done = run(spark, tmp_path, BATCHES, parallelism=None)
    assert done.stats.executor_tasks == sum(b.partitions for b in BATCHES)
    assert read_epochs("parquet", tmp_path, TOTALS) == expected_changes(BATCHES, totals)
    assert committed_state(step, "view", ("k", "total", "n", "top")) == (
        done.epochs[-1],
        final_state(BATCHES, totals),
    )


# Refusals: before any Spark job, naming the actor.


def _map_first(events: Stream) -> Stream:
    return events.map_batches(doubled, schema=IN).key_by("k").aggregate(name=STEP, n=("v", "count"))


def _two_keyed(events: Stream) -> Stream:
    first = events.key_by("k").aggregate(name="first", n=("v", "count"))
    return first.key_by("k").aggregate(name=STEP, m=("n", "sum"))


def _key_off_the_feed(events: Stream) -> Stream:
    return events.key_by("w").aggregate(name=STEP, n=("v", "count"))


def _window(events: Stream) -> Stream:
    return events.key_by("k").window(Tumbling(10), on="v").aggregate(name=STEP, n=("v", "count"))


REFUSALS = pytest.mark.parametrize(
    ("declare", "words"),
    [
        (_map_first, "comes after ['events.map_batches']"),
        (_two_keyed, "it is a second keyed step"),
        (_key_off_the_feed, "its key ['w'] is not a column of the feed"),
        (_window, "only aggregate and reduce run in Spark's tasks"),
    ],
    ids=["map_batches-before", "second-keyed-step", "key-not-in-the-feed", "window_aggregate"],
)


def job_ids(spark: Any) -> set[int]:
    """The Spark jobs the application ran so far (none of the tests' set a job group)."""
    return set(spark.sparkContext.statusTracker().getJobIdsForGroup(None))


def refused(
    spark: Any, tmp_path: Path, declare: Declare, table: Any, entry: str
) -> ExecutorPlacementError:
    """What ``entry`` (``start`` or ``deliver``, ``run_on="executors"``) refuses for ``events →
    declare → changelog_rows → table``; asserts that no Spark job ran and nothing was
    delivered."""
    feed = BatchFeed(IN)
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=3600.0))
    rt.add_source("events", feed.source)
    last = declare(Stream(rt, "events")).changelog_rows()
    sink = add_sink(rt, "out", table, input=last.name)
    jobs = job_ids(spark)
    with BlockingRuntime(rt) as handle:
        bridge = SparkBridge(handle, feed, sink=sink)
        with pytest.raises(ExecutorPlacementError) as info:
            if entry == "start":
                stream_df = spark.readStream.format("rate").load()
                stream_df = stream_df.selectExpr("value % 37 as k", "value as v")
                bridge.start(stream_df, str(tmp_path / "ck"), run_on="executors")
            else:
                bridge.deliver(BATCHES[0].frame(spark), 0, run_on="executors")
        assert bridge.stats().batches == 0
    assert job_ids(spark) == jobs
    assert spark.streams.active == []
    assert "\n" not in str(info.value)
    return info.value


@REFUSALS
@pytest.mark.parametrize("entry", ["start", "deliver"])
def test_a_keyed_chain_the_executors_cannot_run_is_refused_before_any_spark_job(
    spark: Any, tmp_path: Path, declare: Declare, words: str, entry: str
) -> None:
    table = ParquetTable(tmp_path / "table", TOTALS)
    error = refused(spark, tmp_path, declare, table, entry)
    assert error.actor == STEP
    assert words in error.reason
    assert not any((tmp_path / "table").rglob("*.parquet"))


@pytest.mark.postgres
def test_a_keyed_chain_into_a_postgresql_table_is_refused_as_its_commits_carry_no_state(
    spark: Any, postgres_server: PostgresServer, tmp_path: Path
) -> None:
    table = PostgresTable(postgres_server.dsn, postgres_server.unique_name(), TOTALS)
    error = refused(spark, tmp_path, aggregate_totals, table, "deliver")
    assert (error.actor, error.reason) == (
        STEP,
        "it is keyed, and its state commits with the table's files, which sink 'out''s table "
        "(PostgresTable) does not carry; write to Parquet, Iceberg or Delta, or run the "
        "pipeline with run_on='driver'",
    )


# Faults.


def test_a_deterministic_failure_after_the_keyed_step_commits_nothing_and_keeps_the_state(
    spark: Any, tmp_path: Path
) -> None:
    def declare(events: Stream) -> Stream:
        return aggregate_totals(events).map_batches(fails_on_key_five, name="cursed")

    step = tmp_path / "table" / "_barrierflow_state" / STEP
    clean = Batch(0, 0, 300, without=CURSED_KEY)
    first = run(spark, tmp_path, [clean], declare=declare)
    before = committed_state(step, "view", ("k", "total", "n", "top"))
    assert before == (first.epochs[0], final_state([clean], totals))
    with pytest.raises(ExecutorChainFailedError) as info:
        # Key 5's task fails in every attempt; the other task staged its state delta.
        run(spark, tmp_path, [Batch(1, 300, 200, 2)], declare=declare)
    assert info.value.actor == "cursed"
    assert f"key {CURSED_KEY} is cursed" in str(info.value)
    assert read_epochs("parquet", tmp_path, TOTALS) == expected_changes([clean], totals)
    assert committed_state(step, "view", ("k", "total", "n", "top")) == before
    assert staged(step) == []  # what the failed job's tasks staged is gone
    assert not any((tmp_path / "table" / ".staging").glob("*"))


def test_a_task_attempt_failing_once_after_the_keyed_step_is_retried_and_equals_the_reference(
    spark: Any, tmp_path: Path
) -> None:
    def declare(events: Stream) -> Stream:
        return aggregate_totals(events).apply("flaky", FailsFirstAttempt)

    step = tmp_path / "table" / "_barrierflow_state" / STEP
    batches = BATCHES[:2]
    run(spark, tmp_path, batches[:1], declare=declare)
    # A delta no manifest names, as a lost or speculative attempt leaves one: never read.
    view = VnodeStateStore.existing(step / "view")
    assert view is not None
    stray = pa.table(
        {"k": pa.array(range(KEYS), pa.int64()), "total": [-1] * KEYS, "n": [-1] * KEYS,
         "top": [-1] * KEYS},
        schema=view.schema,
    )  # fmt: skip
    view.stage(2, "t999", VnodeBitmap.full(view.vnode_count), stray, [Op.INSERT] * KEYS)
    with structlog.testing.capture_logs() as logs:
        done = run(spark, tmp_path, batches[1:], declare=declare)
    # Partition 1's first attempt failed at its end in batch 1 (its first run had no failure),
    # after the keyed step emitted; Spark's retry read the committed state again, and only it
    # counted.
    failed = [e for e in logs if e["event"] == "executor task attempt failed"]
    assert [(e["partition"], e["attempt"], e["actor"]) for e in failed] == [(1, 0, "flaky")]
    assert read_epochs("parquet", tmp_path, TOTALS) == expected_changes(batches, totals)
    assert committed_state(step, "view", ("k", "total", "n", "top")) == (
        done.epochs[-1],
        final_state(batches, totals),
    )
    assert staged(step) == [("view", 2, "t999")]
