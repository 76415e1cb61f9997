"""A keyed step's state is a view (issue 38): an aggregate maintained in Spark's tasks is read
from the driver like a materialized view's table (:class:`SharedView`), a snapshot backfill
follows it (a snapshot at its last commit, then every committed epoch's change log, never
forwarding: no row of it flows on the driver), compaction never folds past a follower's pin,
and the executors' chain planner lets such a follower read the step.

The store is filled with :meth:`VnodeStateStore.stage` and :meth:`~VnodeStateStore.commit`
in this process, as Spark's tasks and the driver's commit do; the last test runs the whole
path on local Spark.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

import pyarrow as pa
import pytest

from barrierflow.actors import BatchFeed, add_sink
from barrierflow.actors.backfill.materialize import VIEW_TABLE
from barrierflow.channels import Op, VnodeBitmap
from barrierflow.channels.chunk import Chunk
from barrierflow.channels.messages import Message
from barrierflow.channels.vnode import compute_vnodes
from barrierflow.connectors import ParquetTable
from barrierflow.connectors.vnode_state import VnodeStateStore
from barrierflow.errors import ExecutorPlacementError, InvalidArgumentError
from barrierflow.operators import Stream
from barrierflow.runtime import BlockingRuntime, Job, Runtime, RuntimeConfig
from barrierflow.runtime.actor import ActorContext, StreamActor
from barrierflow.spark_bridge import SparkBridge
from barrierflow.spark_bridge.chain import plan_chain
from barrierflow.spark_bridge.shared_view import Follow, SharedView
from barrierflow.spark_bridge.task_state import compact_state

pytestmark = pytest.mark.anyio

VIEW = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("total", pa.int64())])
ALL = VnodeBitmap.full()


def commit(store: VnodeStateStore, epoch: int, rows: dict[int, int | None]) -> None:
    """Commit ``rows`` (key -> total; ``None``: a delete) as epoch ``epoch``'s change."""
    keys = sorted(rows)
    table = pa.table({"k": keys, "total": [rows[k] or 0 for k in keys]}, schema=VIEW)
    ops = [int(Op.DELETE if rows[k] is None else Op.UPDATE_INSERT) for k in keys]
    delta = store.stage(epoch, "t0", ALL, table, ops)
    store.commit(epoch, [delta])


@pytest.fixture
def view(tmp_path: Path) -> tuple[SharedView, VnodeStateStore]:
    shared = SharedView(tmp_path / "events.aggregate", "events.aggregate")
    return shared, VnodeStateStore(tmp_path / "events.aggregate" / VIEW_TABLE, ["k"], VIEW)


async def test_before_the_first_commit_the_view_is_empty_at_epoch_0(
    view: tuple[SharedView, VnodeStateStore],
) -> None:
    shared, _ = view
    (table,) = shared.tables()
    assert shared.committed_epoch() == 0
    assert table.epochs_after(0) == []
    assert (await table.read_vnode(3, 0)).num_rows == 0
    assert (await table.change_log(1)).num_rows == 0
    table.pin("job", 0)  # nothing to hold back yet: a no-op, not an error
    table.unpin("job")


async def test_a_vnode_reads_as_of_an_epoch_in_key_order_and_resumes_after_a_key(
    view: tuple[SharedView, VnodeStateStore],
) -> None:
    shared, store = view
    commit(store, 5, dict.fromkeys(range(0, 400, 3), 1))
    commit(store, 9, {k: 2 for k in range(0, 400, 7)})
    (table,) = shared.tables()
    assert (shared.committed_epoch(), table.epochs_after(5), table.primary_key) == (9, [9], ("k",))
    every = [await table.read_vnode(v, 9) for v in range(table.vnode_count)]
    assert sum(t.num_rows for t in every) == len(set(range(0, 400, 3)) | set(range(0, 400, 7)))
    vnode = max(range(table.vnode_count), key=lambda v: every[v].num_rows)  # several keys
    keys = every[vnode].column("k").to_pylist()
    assert len(keys) > 1
    assert keys == sorted(keys)
    as_of_5 = (await table.read_vnode(vnode, 5)).to_pydict()
    assert as_of_5["k"] == sorted(k for k in keys if k % 3 == 0)  # epoch 9's keys not yet
    assert set(as_of_5["total"]) == {1}
    after = await table.read_vnode(vnode, 9, after=[keys[0]])
    assert after.column("k").to_pylist() == keys[1:]


async def test_a_committed_epoch_s_change_log_carries_its_ops_as_a_view_s_does(
    view: tuple[SharedView, VnodeStateStore],
) -> None:
    shared, store = view
    commit(store, 2, {1: 10, 2: 20})
    commit(store, 4, {1: 11, 2: None})
    (table,) = shared.tables()
    log = await table.change_log(4)
    assert log.column_names == ["k", "total", "_op"]
    assert sorted(zip(log["k"].to_pylist(), log["_op"].to_pylist(), strict=True)) == [
        (1, int(Op.UPDATE_INSERT)),
        (2, int(Op.DELETE)),
    ]
    vnode = int(compute_vnodes(pa.table({"k": [1]}), ["k"])[0])
    only = await table.change_log(4, VnodeBitmap.from_vnodes([vnode], table.vnode_count))
    assert only["k"].to_pylist() == [1]  # key 2's vnode is not asked for


def test_compaction_never_folds_past_a_follower_s_pin(
    view: tuple[SharedView, VnodeStateStore],
) -> None:
    shared, store = view
    for epoch in range(1, 21):
        commit(store, epoch, {epoch: epoch})
    (table,) = shared.tables()
    table.pin("job.follow", 5)
    assert compact_state(shared.root, after=2) == [VIEW_TABLE]
    assert store.change_log(6).num_rows == 1  # still to replay: kept
    table.unpin("job.follow")
    assert store.pins() == {}
    assert compact_state(shared.root, after=2) == [VIEW_TABLE]
    assert store.committed_epochs() == [20]


def test_a_shared_view_and_its_follower_refuse_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="root"):
        SharedView(3, "agg")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="step"):
        SharedView(tmp_path, "")
    with pytest.raises(InvalidArgumentError, match="batch_rows"):
        SharedView(tmp_path, "agg").backfill(batch_rows=0)
    follow = SharedView(tmp_path, "agg").backfill(batch_rows=7)
    assert isinstance(follow, Follow)
    assert follow().shared is follow.view


IN = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("v", pa.int64())])
OUT = pa.schema(
    [pa.field("k", pa.int64(), nullable=False), pa.field("total", pa.int64()), ("op", pa.string())]
)


def keyed_pipeline(tmp_path: Path) -> tuple[Runtime, BatchFeed, Any, Stream]:
    feed = BatchFeed(IN)
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=3600.0))
    rt.add_source("events", feed.source)
    agg = Stream(rt, "events").key_by("k").aggregate(total=("v", "sum"))
    out = add_sink(rt, "out", ParquetTable(tmp_path / "t", OUT), input=agg.changelog_rows().name)
    return rt, feed, out, agg


def test_the_chain_planner_lets_a_follower_read_the_keyed_step_and_refuses_a_reader(
    tmp_path: Path,
) -> None:
    rt, _, out, agg = keyed_pipeline(tmp_path)
    rt.add_actor("follow", SharedView(tmp_path, agg.name).backfill(), inputs=[agg.name])
    steps = plan_chain(rt.nodes(), "events", "out", out.writers, IN.names)
    assert [s.name for s in steps] == [agg.name, f"{agg.name}.changelog_rows"]
    rt.add_actor("tap", Collect, inputs=[agg.name])
    with pytest.raises(ExecutorPlacementError) as refused:
        plan_chain(rt.nodes(), "events", "out", out.writers, IN.names)
    assert refused.value.actor == "tap"


class Collect(StreamActor):
    """Keeps what reaches it (rows and ops), as a job's output."""

    seen: ClassVar[list[tuple[dict[str, Any], int]]] = []

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk):
            chunk = message.compact()
            ops = [0] * chunk.num_rows if chunk.ops is None else chunk.ops_numpy().tolist()
            Collect.seen.extend(zip(chunk.batch.to_pylist(), ops, strict=True))
        await ctx.emit(message)


def replayed(seen: list[tuple[dict[str, Any], int]]) -> dict[int, int]:
    """The view a follower's output rebuilds (upserts and deletes by key, in order)."""
    view: dict[int, int] = {}
    for row, op in seen:
        if op in (int(Op.INSERT), int(Op.UPDATE_INSERT)):
            view[row["k"]] = row["total"]
        elif op == int(Op.DELETE):
            view.pop(row["k"], None)
    return view


@pytest.mark.spark
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_job_joins_an_aggregate_maintained_on_the_executors_from_the_driver(
    spark: Any, tmp_path: Path, backend: Literal["asyncio", "trio"]
) -> None:
    rt, feed, out, agg = keyed_pipeline(tmp_path)
    Collect.seen = []

    def frame(batch_id: int) -> Any:
        first = batch_id * 1000
        return spark.range(first, first + 1000, numPartitions=3).selectExpr(
            "id % 37 as k", "id as v"
        )

    with BlockingRuntime(rt, backend=backend) as handle:
        bridge = SparkBridge(handle, feed, sink=out)
        for batch_id in range(2):
            epoch = bridge.deliver(frame(batch_id), batch_id, run_on="executors")
        handle.call(out.coordinator.wait_committed, epoch)
        job = Job("join")
        job.add_actor(
            "follow", bridge.shared_view(agg.name).backfill(batch_rows=10), inputs=[agg.name]
        )
        job.add_actor("collect", Collect, inputs=["follow"])
        handle.call(rt.add_job, job)
        for batch_id in range(2, 5):
            epoch = bridge.deliver(frame(batch_id), batch_id, run_on="executors")
        handle.call(out.coordinator.wait_committed, epoch)
        handle.call(rt.checkpoint)  # the follower replays the last commit at a barrier
    reference: dict[int, int] = {}
    for i in range(5000):
        reference[i % 37] = reference.get(i % 37, 0) + i
    assert replayed(Collect.seen) == reference
    # The snapshot (37 keys as of batch 1), then one update pair per key per later batch.
    assert len(Collect.seen) == 37 + 3 * 2 * 37


def test_a_store_is_compacted_once_its_changes_weigh_as_much_as_its_base(
    view: tuple[SharedView, VnodeStateStore],
) -> None:
    shared, store = view
    commit(store, 1, dict.fromkeys(range(100), 1))
    commit(store, 2, dict.fromkeys(range(10), 2))
    assert compact_state(shared.root) == [VIEW_TABLE]  # 110 rows of changes, no base yet
    assert store.sizes() == (100, 0)
    commit(store, 3, dict.fromkeys(range(50), 3))
    assert compact_state(shared.root) == []  # 50 rows against a base of 100
    commit(store, 4, dict.fromkeys(range(50, 100), 4))
    assert compact_state(shared.root) == [VIEW_TABLE]  # 100 against 100
    assert store.sizes() == (100, 0)
    assert store.read(ALL, 4).sort_by("k")["total"].to_pylist() == [3] * 50 + [4] * 50
