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
from barrierflow.operators import Operator, filter_rows, map_batches
from barrierflow.runtime import Placement, Runtime, RuntimeConfig, StreamActor
from barrierflow.spark_bridge.chain import ChainStep, plan_chain

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
    tmp_path: Path, declare: Callable[[Runtime], str], *, parallelism: int | None = None
) -> tuple[ChainStep, ...]:
    """The plan of the graph ``declare`` builds on a source ``events`` (it returns what the
    sink ``out`` reads)."""
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db"))
    rt.add_source("events", schema=SCHEMA)
    upstream = declare(rt)
    sink = add_sink(rt, "out", ParquetTable(tmp_path / "t", SCHEMA), input=upstream,
                    parallelism=parallelism)  # fmt: skip
    return plan_chain(rt.nodes(), "events", sink.name, sink.writers)


def refusal(tmp_path: Path, declare: Callable[[Runtime], str]) -> ExecutorPlacementError:
    with pytest.raises(ExecutorPlacementError) as info:
        plan(tmp_path, declare)
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
    "it is keyed (every row of a key must reach the instance holding the key's state), and "
    "keyed actors do not run in Spark's tasks yet; " + ON_DRIVER
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
