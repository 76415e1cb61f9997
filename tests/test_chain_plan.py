"""Which actors run in Spark's tasks: :func:`plan_chain` reads a declared graph and accepts
exactly a straight chain of partition-local actors from the feed's source to the sink's
writers, refusing anything else by name (no Spark here: the plan is the graph's)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from barrierflow.actors import add_sink
from barrierflow.connectors import ParquetTable
from barrierflow.errors import ExecutorPlacementError
from barrierflow.operators import (
    Operator,
    Tumbling,
    aggregate,
    filter_rows,
    map_batches,
    reduce,
    window_aggregate,
)
from barrierflow.runtime import Placement, Runtime, RuntimeConfig, StreamActor
from barrierflow.spark_bridge.chain import ChainStep, plan_chain
from barrierflow.spark_bridge.shared_view import SharedView

SCHEMA = pa.schema([pa.field("id", pa.int64())])


class Local(StreamActor):
    placement = Placement.PARTITION_LOCAL


class Keyed(StreamActor):
    placement = Placement.KEYED
    key = ("id",)


class Global(StreamActor):
    pass


def same(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch


def plan(
    tmp_path: Path,
    declare: Callable[[Runtime], str],
    *,
    parallelism: int | None = None,
    columns: list[str] | None = None,
) -> tuple[ChainStep, ...]:
    """The plan of the graph ``declare`` builds on a source ``events`` (it returns what the
    sink ``out`` reads); ``columns``: the feed's, as the bridge passes them."""
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db"))
    rt.add_source("events", schema=SCHEMA)
    upstream = declare(rt)
    sink = add_sink(rt, "out", ParquetTable(tmp_path / "t", SCHEMA), input=upstream,
                    parallelism=parallelism)  # fmt: skip
    return plan_chain(rt.nodes(), "events", sink.name, sink.writers, columns)


def refusal(
    tmp_path: Path, declare: Callable[[Runtime], str], *, columns: list[str] | None = None
) -> ExecutorPlacementError:
    with pytest.raises(ExecutorPlacementError) as info:
        plan(tmp_path, declare, columns=columns)
    assert "\n" not in str(info.value)
    assert info.value.actor in str(info.value)
    return info.value


def test_a_chain_of_partition_local_steps_is_planned_in_order_with_their_declared_factories(
    tmp_path: Path,
) -> None:
    keep = filter_rows(pc.field("id") > 0)
    mapped = map_batches(same)

    def declare(rt: Runtime) -> str:
        rt.add_actor("keep", keep, inputs=["events"])
        rt.add_actor("mine", Local, inputs=["keep"])
        rt.add_actor("mapped", mapped, inputs=["mine"], parallelism=3)
        return "mapped"

    steps = plan(tmp_path, declare, parallelism=2)
    assert [s.name for s in steps] == ["keep", "mine", "mapped"]  # a parallel group is a step
    assert (steps[0].factory, steps[1].factory, steps[2].factory) == (keep, Local, mapped)


def test_a_sink_fed_by_the_feed_has_an_empty_chain(tmp_path: Path) -> None:
    assert plan(tmp_path, lambda rt: "events") == ()
    assert plan(tmp_path / "p", lambda rt: "events", parallelism=4) == ()


ON_DRIVER = "or run the pipeline with run_on='driver'"
GLOBAL = (
    "it is global (one instance sees the whole stream), and a Spark task sees one partition; "
    "declare placement = Placement.PARTITION_LOCAL on its class if any instance may take any "
    "row, " + ON_DRIVER
)
KEYED = (
    "it is keyed, and of the keyed actors only aggregate and reduce run in Spark's tasks (a "
    "window's watermark is the whole stream's, and another keyed actor may keep state a task "
    "cannot carry over); " + ON_DRIVER
)
PLAIN = (
    "its factory is a plain function, which declares no placement; declare it with its "
    "StreamActor class (placement = Placement.PARTITION_LOCAL) or an operator, " + ON_DRIVER
)


@pytest.mark.parametrize(
    ("factory", "words"),
    [(Global, GLOBAL), (Keyed, KEYED), (lambda: Local(), PLAIN)],
    ids=["global", "keyed", "plain-function"],
)
def test_an_actor_that_is_not_partition_local_is_refused_naming_it_and_why(
    tmp_path: Path, factory: Callable[[], StreamActor], words: str
) -> None:
    def declare(rt: Runtime) -> str:
        rt.add_actor("first", Local, inputs=["events"])
        rt.add_actor("odd", factory, inputs=["first"])
        rt.add_actor("last", Local, inputs=["odd"])
        return "last"

    error = refusal(tmp_path, declare)
    assert (error.actor, error.reason) == ("odd", words)


def test_a_keyed_aggregate_or_reduce_after_filters_is_planned_with_its_key(
    tmp_path: Path,
) -> None:
    keep = filter_rows(pc.field("id") > 0)
    total = aggregate("id", n=("id", "count"))
    folded = reduce("id", lambda acc, rows: acc)

    def declare(rt: Runtime) -> str:
        rt.add_actor("keep", keep, inputs=["events"])
        rt.add_actor("total", total, inputs=["keep"], parallelism=2)
        rt.add_actor("after", Local, inputs=["total"])
        return "after"

    steps = plan(tmp_path, declare, columns=["id"])
    assert [(s.name, s.factory, s.key) for s in steps] == [
        ("keep", keep, None),
        ("total", total, ("id",)),
        ("after", Local, None),
    ]
    only = plan(tmp_path / "r", lambda rt: rt.add_actor("fold", folded, inputs=["events"]).name)
    assert [(s.name, s.factory, s.key) for s in only] == [("fold", folded, ("id",))]


def test_a_window_aggregate_is_refused_as_a_keyed_actor_other_than_aggregate_and_reduce(
    tmp_path: Path,
) -> None:
    windowed = window_aggregate("id", Tumbling(10), on="id", n=("id", "count"))

    def declare(rt: Runtime) -> str:
        rt.add_actor("win", windowed, inputs=["events"])
        return "win"

    error = refusal(tmp_path, declare)
    assert (error.actor, error.reason) == ("win", KEYED)


def test_a_second_keyed_step_is_refused_as_the_batch_is_repartitioned_by_one_key(
    tmp_path: Path,
) -> None:
    def declare(rt: Runtime) -> str:
        rt.add_actor("first", aggregate("id", n=("id", "count")), inputs=["events"])
        rt.add_actor("second", aggregate("id", m=("n", "sum")), inputs=["first"])
        return "second"

    error = refusal(tmp_path, declare, columns=["id"])
    assert (error.actor, error.reason) == (
        "second",
        "it is a second keyed step, and the micro-batch is repartitioned by one key before the "
        "tasks run; " + ON_DRIVER,
    )


@pytest.mark.parametrize(
    "before", [lambda: map_batches(same), lambda: Local], ids=["map_batches", "local-actor"]
)
def test_a_keyed_step_after_a_step_other_than_filter_rows_is_refused_naming_it(
    tmp_path: Path, before: Callable[[], Operator | type[StreamActor]]
) -> None:
    def declare(rt: Runtime) -> str:
        rt.add_actor("keep", filter_rows(pc.field("id") > 0), inputs=["events"])
        rt.add_actor("changes", before(), inputs=["keep"])
        rt.add_actor("total", aggregate("id", n=("id", "count")), inputs=["changes"])
        return "total"

    error = refusal(tmp_path, declare, columns=["id"])
    assert (error.actor, error.reason) == (
        "total",
        "it is keyed and comes after ['changes'], which may change the rows the micro-batch "
        "is repartitioned by; only filter_rows may come before a keyed step in Spark's tasks, "
        + ON_DRIVER,
    )


def test_a_keyed_step_whose_key_is_not_a_feed_column_is_refused_naming_the_key(
    tmp_path: Path,
) -> None:
    def declare(rt: Runtime) -> str:
        rt.add_actor("total", aggregate(["id", "user"], n=("id", "count")), inputs=["events"])
        return "total"

    error = refusal(tmp_path, declare, columns=["id"])
    assert (error.actor, error.reason) == (
        "total",
        "its key ['user'] is not a column of the feed, and the micro-batch is repartitioned "
        "by the feed's columns; " + ON_DRIVER,
    )
    # Without the feed's columns (a plan of the graph alone) the key is not checked.
    assert [s.key for s in plan(tmp_path / "unchecked", declare)] == [("id", "user")]


def test_a_reader_off_the_path_to_the_sink_is_refused_as_it_would_get_no_rows(
    tmp_path: Path,
) -> None:
    def declare(rt: Runtime) -> str:
        rt.add_actor("step", Local, inputs=["events"])
        rt.add_actor("tap", Local, inputs=["step"])  # reads the chain, leads nowhere
        return "step"

    error = refusal(tmp_path, declare)
    assert (error.actor, error.reason) == (
        "tap",
        "it reads 'step', whose rows run in Spark's tasks to sink 'out' and never reach the "
        "driver, so it would get none; give it a query of its own (another bridge), " + ON_DRIVER,
    )


def test_a_reader_of_the_feed_besides_the_chain_is_refused(tmp_path: Path) -> None:
    def declare(rt: Runtime) -> str:
        rt.add_actor("audit", Local, inputs=["events"])
        rt.add_actor("step", Local, inputs=["events"])
        return "step"

    assert refusal(tmp_path, declare).actor == "audit"


def test_two_paths_to_the_sink_are_refused_as_a_branch(tmp_path: Path) -> None:
    def declare(rt: Runtime) -> str:
        rt.add_actor("left", Local, inputs=["events"])
        rt.add_actor("right", Local, inputs=["events"])
        rt.add_actor("join", Local, inputs=["left", "right"])
        return "join"

    assert refusal(tmp_path, declare).actor == "right"


def test_a_step_with_a_second_input_is_refused(tmp_path: Path) -> None:
    def declare(rt: Runtime) -> str:
        rt.add_source("other", schema=SCHEMA)
        rt.add_actor("merge", Local, inputs=["events", "other"])
        return "merge"

    error = refusal(tmp_path, declare)
    assert (error.actor, error.reason) == (
        "merge",
        "it reads ['other'] besides 'events', and a Spark task holds one chain's rows; "
        + ON_DRIVER,
    )


class Splits(StreamActor):
    placement = Placement.PARTITION_LOCAL
    side_outputs = ("rejects",)


def test_a_chain_through_a_side_output_is_refused(tmp_path: Path) -> None:
    def declare(rt: Runtime) -> str:
        rt.add_actor("split", Splits, inputs=["events"])
        rt.add_actor("fix", Local, inputs=["split:rejects"])
        return "fix"

    error = refusal(tmp_path, declare)
    assert (error.actor, error.reason) == (
        "fix",
        "it reads a side output of 'split'; only main outputs chain in Spark's tasks, " + ON_DRIVER,
    )


def test_a_sink_the_feed_does_not_reach_is_refused(tmp_path: Path) -> None:
    def declare(rt: Runtime) -> str:
        rt.add_source("elsewhere", schema=SCHEMA)
        return "elsewhere"

    error = refusal(tmp_path, declare)
    assert error.actor == "events"
    assert "no writer of sink 'out'" in error.reason


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["filter", "map", "local"]), st.sampled_from([None, 2])),
        max_size=5,
    )
)
def test_any_straight_chain_of_partition_local_steps_is_planned_as_declared(
    tmp_path_factory: pytest.TempPathFactory, chain: list[tuple[str, int | None]]
) -> None:
    makers: dict[str, Callable[[], Operator | type[StreamActor]]] = {
        "filter": lambda: filter_rows(pc.field("id") > 0),
        "map": lambda: map_batches(same),
        "local": lambda: Local,
    }
    declared: list[object] = []

    def declare(rt: Runtime) -> str:
        upstream = "events"
        for index, (kind, parallelism) in enumerate(chain):
            factory = makers[kind]()
            declared.append(factory)
            rt.add_actor(f"s{index}", factory, inputs=[upstream], parallelism=parallelism)
            upstream = f"s{index}"
        return upstream

    steps = plan(tmp_path_factory.mktemp("chain"), declare)
    assert [s.name for s in steps] == [f"s{i}" for i in range(len(chain))]
    assert [s.factory for s in steps] == declared


def test_a_sink_named_like_the_source_is_not_taken_for_it(tmp_path: Path) -> None:
    # The sink "events" (writers events.0, events.1) and the source "events": a parallel group
    # and a lone actor of one name are two units, so the chain between them is planned.
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db"))
    rt.add_source("events", schema=SCHEMA)
    rt.add_actor("keep", filter_rows(pc.field("id") > 0), inputs=["events"])
    rt.add_actor("last", Local, inputs=["keep"])
    sink = add_sink(rt, "events", ParquetTable(tmp_path / "t", SCHEMA), input="last",
                    parallelism=2)  # fmt: skip
    steps = plan_chain(rt.nodes(), "events", sink.name, sink.writers)
    assert [s.name for s in steps] == ["keep", "last"]


def test_a_job_following_the_keyed_step_s_shared_view_is_no_branch(tmp_path: Path) -> None:
    total = aggregate("id", n=("id", "count"))
    follow = SharedView(tmp_path / "state", "total").backfill()

    def declare(rt: Runtime) -> str:
        rt.add_actor("total", total, inputs=["events"])
        rt.add_actor("follow", follow, inputs=["total"])
        rt.add_actor("after", Local, inputs=["total"])
        return "after"

    steps = plan(tmp_path, declare, columns=["id"])
    assert [s.name for s in steps] == ["total", "after"]

    def tapped(rt: Runtime) -> str:
        declare(rt)
        rt.add_actor("tap", Local, inputs=["total"])
        return "after"

    assert refusal(tmp_path / "tap", tapped, columns=["id"]).actor == "tap"
