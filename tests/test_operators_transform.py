"""map_batches and filter_rows: vectorized, ops kept row for row, a filter is a mask (never a
copy), a row-count change refused on a changelog, and the same rows with crashes."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from barrierflow.channels import Barrier, Chunk, Message, Op
from barrierflow.errors import (
    ActorFailedError,
    ChangelogInputError,
    GraphError,
    InvalidArgumentError,
    SchemaMismatchError,
)
from barrierflow.operators import Stream, changelog_rows, filter_rows, map_batches
from barrierflow.operators._operator import OperatorActor, check_columns
from barrierflow.runtime import (
    ActorContext,
    Job,
    Placement,
    Runtime,
    RuntimeConfig,
    StreamActor,
)
from barrierflow.testing.actor_conformance import check_stream_actor

pytestmark = pytest.mark.anyio

SCHEMA = pa.schema([("user", pa.int64()), ("clicks", pa.int64())])


class Collect(StreamActor):
    """Keeps every message it reads (a class-level list, cleared by each test)."""

    seen: ClassVar[list[Message]] = []

    async def process(self, message: Message, ctx: ActorContext) -> None:
        Collect.seen.append(message)
        await ctx.emit(message)


def _chunks() -> list[Chunk]:
    return [m for m in Collect.seen if isinstance(m, Chunk)]


async def _run(tmp_path: Path, operator: Any, *chunks: Chunk) -> list[Chunk]:
    Collect.seen = []
    rt = Runtime(RuntimeConfig(state_path=str(tmp_path / "state.db")))
    rt.add_source("events")
    rt.add_actor("op", operator, inputs=["events"])
    rt.add_actor("collect", Collect, inputs=["op"])
    async with rt:
        for chunk in chunks:
            await rt.push("events", chunk)
        await rt.checkpoint()
    return _chunks()


def _batch(users: list[int], clicks: list[int]) -> pa.RecordBatch:
    return pa.record_batch([pa.array(users, pa.int64()), pa.array(clicks, pa.int64())], SCHEMA)


def _double(batch: pa.RecordBatch) -> pa.RecordBatch:
    return pa.record_batch([batch["user"], pc.multiply(batch["clicks"], 2)], schema=SCHEMA)


async def test_a_row_for_row_map_keeps_the_ops(tmp_path: Path) -> None:
    ops = [Op.INSERT, Op.UPDATE_DELETE, Op.UPDATE_INSERT, Op.DELETE]
    [out] = await _run(
        tmp_path, map_batches(_double), Chunk(_batch([1, 2, 2, 3], [1, 2, 3, 4]), ops)
    )
    assert out.batch.column("clicks").to_pylist() == [2, 4, 6, 8]
    assert out.ops_numpy().tolist() == [int(o) for o in ops]


async def test_a_map_sees_only_the_visible_rows(tmp_path: Path) -> None:
    seen: list[int] = []

    def record(batch: pa.RecordBatch) -> pa.RecordBatch:
        seen.extend(batch["user"].to_pylist())
        return batch

    chunk = Chunk(
        _batch([1, 2, 3], [1, 2, 3]), [Op.INSERT, Op.DELETE, Op.INSERT], [True, False, True]
    )
    [out] = await _run(tmp_path, map_batches(record), chunk)
    assert seen == [1, 3]
    assert out.ops_numpy().tolist() == [Op.INSERT, Op.INSERT]
    assert out.visibility is None


async def test_a_map_that_changes_the_row_count_makes_inserts(tmp_path: Path) -> None:
    def explode(batch: pa.RecordBatch) -> pa.RecordBatch:
        return pa.Table.from_batches([batch, batch]).combine_chunks().to_batches()[0]

    [out] = await _run(tmp_path, map_batches(explode), Chunk(_batch([1, 2], [1, 2]), [0, 0]))
    assert out.num_rows == 4
    assert out.ops is None


async def test_a_map_that_changes_the_row_count_of_a_changelog_is_refused(
    tmp_path: Path,
) -> None:
    def first_row(batch: pa.RecordBatch) -> pa.RecordBatch:
        return batch.slice(0, 1)

    with pytest.raises(ActorFailedError) as caught:
        await _run(tmp_path, map_batches(first_row), Chunk(_batch([1, 2], [1, 2]), [0, Op.DELETE]))
    cause = caught.value.cause
    assert isinstance(cause, ChangelogInputError)
    assert (cause.actor, cause.operator) == ("op", "map_batches")
    assert _fields(cause) == (
        "map_batches 'op': input",
        "a function that returns one row per input row on a changelog",
        "1 rows for 2 rows with deletes or updates",
    )


async def test_a_map_result_of_another_schema_fails_naming_both(tmp_path: Path) -> None:
    other = pa.schema([("user", pa.int64())])

    def narrow(batch: pa.RecordBatch) -> pa.RecordBatch:
        return pa.record_batch([batch["user"]], schema=other)

    with pytest.raises(ActorFailedError) as caught:
        await _run(tmp_path, map_batches(narrow, schema=SCHEMA), Chunk(_batch([1], [1])))
    cause = caught.value.cause
    assert isinstance(cause, SchemaMismatchError)
    assert cause.argument == "map_batches 'op': fn's result"
    assert (cause.expected_schema, cause.actual_schema) == (SCHEMA, other)


async def test_a_map_result_that_is_not_a_batch_fails(tmp_path: Path) -> None:
    with pytest.raises(ActorFailedError) as caught:
        await _run(tmp_path, map_batches(lambda b: b.to_pydict()), Chunk(_batch([1], [1])))
    assert isinstance(caught.value.cause, InvalidArgumentError)
    assert "fn's result" in str(caught.value.cause)


async def test_a_filter_is_a_new_mask_over_the_same_buffers(tmp_path: Path) -> None:
    batch = _batch([1, 2, 3, 4], [0, 5, 0, 7])
    chunk = Chunk(batch, [0, 0, Op.DELETE, 0], [True, True, True, False])
    [out] = await _run(tmp_path, filter_rows(pc.field("clicks") > 0), chunk)
    assert out.batch.column(0).buffers()[1].address == batch.column(0).buffers()[1].address
    # Row 4 stays hidden: the input's mask is ANDed, not replaced.
    assert out.visibility is not None
    assert out.visibility.to_pylist() == [False, True, False, False]
    assert out.ops_numpy().tolist() == [0, 0, Op.DELETE, 0]


async def test_a_filter_function_mask_and_nulls_drop_rows(tmp_path: Path) -> None:
    def mask(batch: pa.RecordBatch) -> pa.Array:
        return pa.array([True, None, False])

    [out] = await _run(tmp_path, filter_rows(mask), Chunk(_batch([1, 2, 3], [1, 2, 3])))
    assert out.visibility is not None
    assert out.visibility.to_pylist() == [True, False, False]


async def test_a_filter_numpy_mask(tmp_path: Path) -> None:
    def mask(batch: pa.RecordBatch) -> np.ndarray:
        mask: np.ndarray = batch["clicks"].to_numpy() > 1
        return mask

    [out] = await _run(tmp_path, filter_rows(mask), Chunk(_batch([1, 2, 3], [1, 2, 3])))
    assert out.compact().batch["user"].to_pylist() == [2, 3]


@pytest.mark.parametrize("bad", [pa.array([1, 0, 1]), pa.array([True]), "yes"])
async def test_a_filter_result_that_is_not_a_mask_fails(tmp_path: Path, bad: object) -> None:
    with pytest.raises(ActorFailedError) as caught:
        await _run(tmp_path, filter_rows(lambda b: bad), Chunk(_batch([1, 2, 3], [1, 2, 3])))
    assert isinstance(caught.value.cause, InvalidArgumentError)
    assert "a boolean mask of 3 entries" in str(caught.value.cause)


async def test_barriers_pass_in_order_around_the_rows(tmp_path: Path) -> None:
    await _run(tmp_path, filter_rows(pc.field("clicks") > 0), Chunk(_batch([1], [1])))
    kinds = [type(m).__name__ for m in Collect.seen]
    first_chunk = kinds.index("Chunk")
    assert kinds[0] == "Barrier"
    assert "Barrier" in kinds[first_chunk:]
    assert all(isinstance(m, Barrier | Chunk) for m in Collect.seen)


def test_bad_arguments_are_refused_when_called() -> None:
    with pytest.raises(InvalidArgumentError, match="fn"):
        map_batches(3)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="schema"):
        map_batches(_double, schema="x")
    with pytest.raises(InvalidArgumentError, match="predicate"):
        filter_rows("clicks > 0")


def test_both_are_partition_local_and_make_a_fresh_actor_each_call() -> None:
    for operator in (map_batches(_double), filter_rows(pc.field("clicks") > 0)):
        assert operator.placement is Placement.PARTITION_LOCAL
        assert operator.key is None
        assert operator.side_outputs == ()
        assert operator() is not operator(1)


_rows = st.lists(st.tuples(st.integers(0, 5), st.integers(-3, 3)), min_size=1, max_size=8)
_settings = settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@_settings
@given(batches=st.lists(_rows, min_size=1, max_size=5))
async def test_map_then_filter_equals_a_plain_python_reference(
    tmp_path_factory: pytest.TempPathFactory, batches: list[list[tuple[int, int]]]
) -> None:
    Collect.seen = []
    rt = Runtime(RuntimeConfig(state_path=str(tmp_path_factory.mktemp("s") / "state.db")))
    rt.add_source("events")
    rt.add_actor("double", map_batches(_double), inputs=["events"])
    rt.add_actor("positive", filter_rows(pc.field("clicks") > 0), inputs=["double"])
    rt.add_actor("collect", Collect, inputs=["positive"])
    async with rt:
        for rows in batches:
            await rt.push("events", Chunk(_batch([u for u, _ in rows], [c for _, c in rows])))
        await rt.checkpoint()
    got = [
        row
        for chunk in _chunks()
        for row in zip(*chunk.compact().batch.to_pydict().values(), strict=True)
    ]
    expected = [(u, 2 * c) for rows in batches for u, c in rows if 2 * c > 0]
    assert got == expected


@_settings
@given(batches=st.lists(_rows, min_size=1, max_size=6), seed=st.integers(0, 1000))
async def test_map_and_filter_commit_the_same_rows_with_crashes(
    tmp_path_factory: pytest.TempPathFactory, batches: list[list[tuple[int, int]]], seed: int
) -> None:
    chunks = [Chunk(_batch([u for u, _ in rows], [c for _, c in rows])) for rows in batches]
    for operator in (map_batches(_double), filter_rows(pc.field("clicks") > 0)):
        report = await check_stream_actor(
            operator,
            chunks,
            output=SCHEMA,
            state_dir=tmp_path_factory.mktemp("conformance"),
            crashes=2,
            seed=seed,
        )
        report.raise_for_failures()


async def test_each_operator_reports_its_counters_in_the_runtimes_metrics(tmp_path: Path) -> None:
    rt = Runtime(RuntimeConfig(state_path=str(tmp_path / "state.db")))
    rt.add_source("events")
    rt.add_actor("double", map_batches(_double), inputs=["events"])
    rt.add_actor("positive", filter_rows(pc.field("clicks") > 0), inputs=["double"])
    async with rt:
        await rt.push("events", Chunk(_batch([1, 2, 3], [1, 0, 2])))
        await rt.checkpoint()
        families = {f.name: f for f in await rt.metrics.snapshot()}
    rows_in, rows_out = (
        families["barrierflow_operator_rows_in"],
        families["barrierflow_operator_rows_out"],
    )
    assert rows_in.value(actor="double", operator="map_batches") == 3
    assert rows_out.value(actor="double", operator="map_batches") == 3
    assert rows_in.value(actor="positive", operator="filter") == 3
    assert rows_out.value(actor="positive", operator="filter") == 2
    assert families["barrierflow_operator_state_rows"].kind == "gauge"


# Refusals: each names the argument, what was expected and what arrived, exactly.


def _same(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch


def _fields(error: InvalidArgumentError) -> tuple[Any, Any, Any]:
    return error.argument, error.expected, error.got


def test_map_batches_refusals() -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        map_batches(3)  # type: ignore[arg-type]
    assert _fields(caught.value) == ("fn", "a function of a pyarrow.RecordBatch", 3)
    with pytest.raises(InvalidArgumentError) as caught:
        map_batches(_same, schema="s")  # type: ignore[arg-type]
    assert _fields(caught.value) == ("schema", "None or a pyarrow.Schema", "s")


def test_filter_rows_refusal() -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        filter_rows("clicks > 0")  # type: ignore[arg-type]
    assert _fields(caught.value) == (
        "predicate",
        "a pyarrow.compute Expression or a function returning a mask",
        "clicks > 0",
    )


def test_operator_kinds() -> None:
    assert map_batches(_same).kind == "map_batches"
    assert filter_rows(_same).kind == "filter"


def test_check_columns() -> None:
    assert check_columns("key", "user") == ("user",)
    assert check_columns("key", ["a", "b"]) == ("a", "b")
    assert check_columns("key", [], allow_empty=True) == ()
    for bad in ([], [""], "", 3, ["a", 3]):
        with pytest.raises(InvalidArgumentError) as caught:
            check_columns("key", bad)
        assert _fields(caught.value) == ("key", "a column name or a list of column names", bad)
    with pytest.raises(InvalidArgumentError) as caught:
        check_columns("key", ("a", "a"))
    assert _fields(caught.value) == ("key", "each column once", ["a", "a"])


def test_an_operator_actor_reports_before_it_runs_with_an_empty_actor_label() -> None:
    actor = OperatorActor()
    families = {f.name: f for f in actor.metric_families()}
    rows_in = families["barrierflow_operator_rows_in"]
    assert rows_in.kind == "counter"
    assert rows_in.help == "rows an operator read"
    assert rows_in.value(actor="", operator="operator") == 0
    kinds = {name: f.kind for name, f in families.items()}
    assert {n for n, k in kinds.items() if k == "gauge"} == {
        "barrierflow_operator_calls_in_flight",
        "barrierflow_operator_state_rows",
    }


class _AddsOnly:
    """Has add_actor but no name_in_use: not a target."""

    def add_actor(self, *args: Any, **kwargs: Any) -> None: ...


def test_stream_refusals(tmp_path: Path) -> None:
    for target in (object(), _AddsOnly()):
        with pytest.raises(InvalidArgumentError) as caught:
            Stream(target, "events")
        assert _fields(caught.value) == ("target", "a Runtime or a Job", target)
    rt = Runtime(RuntimeConfig(str(tmp_path / "s.db")))
    rt.add_source("events")
    for bad in ("", 3):
        with pytest.raises(InvalidArgumentError) as caught:
            Stream(rt, bad)  # type: ignore[arg-type]
        assert _fields(caught.value) == ("name", "the name of a declared actor", bad)
    events = Stream(rt, "events")
    for bad in ("", 3):
        with pytest.raises(InvalidArgumentError) as caught:
            events.step_name(bad, "map")  # type: ignore[arg-type]
        assert _fields(caught.value) == ("name", "None or a non-empty actor name", bad)
    for bad in ("", "a:b", 3):
        with pytest.raises(InvalidArgumentError) as caught:
            events.side(bad)  # type: ignore[arg-type]
        assert _fields(caught.value) == ("output", "a side output's name", bad)
    with pytest.raises(InvalidArgumentError) as caught:
        events.side("late").side("later")
    assert _fields(caught.value) == ("output", "a side output of a step", "events:late")
    assert events.side("late").step_name(None, "filter") == "events.late.filter"
    assert repr(events.key_by("user")) == "KeyedStream('events', key=['user'])"
    assert repr(events) == "Stream('events')"


def test_stream_passes_its_arguments_on() -> None:
    job = Job("j")
    job.add_source("events")
    events = Stream(job, "events")
    events.filter(_same, parallelism=2)
    events.key_by("user").aggregate(n=("clicks", "count"), parallelism=2)
    events.key_by("user").reduce(lambda a, b: b, name="r", parallelism=3)
    events.apply("k", map_batches(_same), parallelism=2, key=["user"])
    names = job.actor_names()
    for name in ("events.filter.0", "events.filter.1", "events.aggregate.1", "r.2", "k.1"):
        assert name in names
    # The key reached add_actor: a key the actor's rows lack is checked by the graph then.
    with pytest.raises(GraphError):
        events.apply("k2", map_batches(_same), key=["user"])


async def test_schemas_reach_the_operators(tmp_path: Path) -> None:
    other = pa.schema([("user", pa.int32())])
    for step in (
        lambda s: s.map_batches(_same, schema=other),
        lambda s: s.key_by("user").aggregate(n=("clicks", "count"), schema=other),
        lambda s: s.key_by("user").reduce(lambda a, b: b, schema=other),
    ):
        rt = Runtime(RuntimeConfig(str(tmp_path / f"{id(step)}.db")))
        rt.add_source("events")
        with pytest.raises((ActorFailedError, InvalidArgumentError)):
            step(Stream(rt, "events"))  # refused here, or on the first rows
            async with rt:
                await rt.push("events", Chunk.from_pydict({"user": [1], "clicks": [2]}, SCHEMA))
                await rt.checkpoint()


async def test_the_actors_own_refusals_name_their_actor_and_what_came(tmp_path: Path) -> None:
    def to_dict(batch: pa.RecordBatch) -> Any:
        return {"x": 1}

    cases: list[tuple[Any, tuple[Any, Any, Any]]] = [
        (
            map_batches(to_dict),
            ("map_batches 'op': fn's result", "a pyarrow.RecordBatch", {"x": 1}),
        ),
        (
            filter_rows(lambda b: pa.array([1, 2])),
            ("filter 'op': the predicate's result", "a boolean mask of 2 entries", "int64[2]"),
        ),
        (
            filter_rows(lambda b: "no"),
            ("filter 'op': the predicate's result", "a boolean mask of 2 entries", "no"),
        ),
    ]
    for operator, fields in cases:
        rt = Runtime(RuntimeConfig(str(tmp_path / f"{id(operator)}.db")))
        rt.add_source("events")
        rt.add_actor("op", operator, inputs=["events"])
        with pytest.raises(ActorFailedError) as caught:
            async with rt:
                await rt.push(
                    "events", Chunk.from_pydict({"user": [1, 2], "clicks": [2, 3]}, SCHEMA)
                )
                await rt.checkpoint()
        cause = caught.value.cause
        assert isinstance(cause, InvalidArgumentError)
        assert _fields(cause) == fields


async def test_a_chunked_mask_and_counters_over_several_chunks(tmp_path: Path) -> None:
    def chunked(batch: pa.RecordBatch) -> pa.ChunkedArray:
        mask = pc.greater(batch["clicks"], 1)
        return pa.chunked_array([mask.slice(0, 1), mask.slice(1)])

    rt = Runtime(RuntimeConfig(str(tmp_path / "s.db")))
    rt.add_source("events")
    rt.add_actor("double", map_batches(_same), inputs=["events"])
    rt.add_actor("keep", filter_rows(chunked), inputs=["double"])
    async with rt:
        for _ in range(2):
            await rt.push("events", Chunk.from_pydict({"user": [1, 2], "clicks": [1, 3]}, SCHEMA))
        await rt.checkpoint()
        families = {f.name: f for f in await rt.metrics.snapshot()}
    rows_in, rows_out = (
        families["barrierflow_operator_rows_in"],
        families["barrierflow_operator_rows_out"],
    )
    assert (
        rows_in.value(actor="double", operator="map_batches"),
        rows_out.value(actor="double", operator="map_batches"),
    ) == (4, 4)
    assert (
        rows_in.value(actor="keep", operator="filter"),
        rows_out.value(actor="keep", operator="filter"),
    ) == (4, 2)


def test_as_number_takes_real_numbers_a_float_holds() -> None:
    from barrierflow.operators._operator import as_number

    assert as_number(3) == 3.0
    assert isinstance(as_number(3), float)
    assert as_number(np.int64(4)) == 4.0
    assert as_number(np.float32(0.5)) == 0.5
    assert as_number(float("inf")) == float("inf")
    for not_a_number in (True, np.bool_(True), float("nan"), 10**400, "3", None, [1]):
        assert as_number(not_a_number) is None


def test_refuse_changes_counts_deletes_and_update_halves() -> None:
    from barrierflow.operators._operator import refuse_changes

    refuse_changes(None, "a", "op", "inserts")
    refuse_changes(pa.array([0, 0], pa.int8()), "a", "op", "inserts")
    with pytest.raises(ChangelogInputError) as caught:
        refuse_changes(pa.array([0, 1, 3, 2], pa.int8()), "a", "op", "inserts")
    error = caught.value
    assert (error.actor, error.operator) == ("a", "op")
    assert _fields(error) == ("op 'a': input", "inserts", "a chunk with 3 delete(s) or update(s)")


# changelog_rows: a changelog as plain insert rows with its ops in a column.


async def test_changelog_rows_names_each_op_as_flinks_row_kind_and_emits_inserts(
    tmp_path: Path,
) -> None:
    ops = [Op.INSERT, Op.UPDATE_DELETE, Op.UPDATE_INSERT, Op.DELETE]
    [out] = await _run(tmp_path, changelog_rows(), Chunk(_batch([1, 2, 2, 3], [1, 2, 3, 4]), ops))
    assert out.batch.schema == SCHEMA.append(pa.field("op", pa.string()))
    assert out.batch.to_pydict() == {
        "user": [1, 2, 2, 3],
        "clicks": [1, 2, 3, 4],
        "op": ["+I", "-U", "+U", "-D"],
    }
    assert out.ops is None  # every row is now an insert, which an append-only table takes


async def test_changelog_rows_gives_an_insert_only_input_plus_i_in_the_named_column(
    tmp_path: Path,
) -> None:
    [out] = await _run(tmp_path, changelog_rows("kind"), Chunk(_batch([1, 2], [5, 6])))
    assert out.batch.column("kind").to_pylist() == ["+I", "+I"]
    assert out.batch.schema.names == ["user", "clicks", "kind"]


async def test_changelog_rows_keeps_only_the_visible_rows(tmp_path: Path) -> None:
    chunk = Chunk(
        _batch([1, 2, 3], [1, 2, 3]), [Op.INSERT, Op.DELETE, Op.UPDATE_INSERT], [True, False, True]
    )
    [out] = await _run(tmp_path, changelog_rows(), chunk)
    assert out.batch.to_pydict() == {"user": [1, 3], "clicks": [1, 3], "op": ["+I", "+U"]}
    assert out.visibility is None


async def test_changelog_rows_refuses_an_input_that_has_its_column_naming_actor_and_columns(
    tmp_path: Path,
) -> None:
    rt = Runtime(RuntimeConfig(str(tmp_path / "s.db")))
    rt.add_source("events")
    Stream(rt, "events").changelog_rows("clicks", name="op")
    with pytest.raises(ActorFailedError) as caught:
        async with rt:
            await rt.push("events", Chunk(_batch([1], [2])))
            await rt.checkpoint()
    cause = caught.value.cause
    assert isinstance(cause, InvalidArgumentError)
    assert _fields(cause) == (
        "changelog_rows 'op': column",
        "a name the input does not have (['user', 'clicks'])",
        "clicks",
    )


@pytest.mark.parametrize("bad", ["", 3, None])
def test_changelog_rows_refuses_a_column_that_is_not_a_non_empty_name_when_called(
    tmp_path: Path, bad: object
) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        changelog_rows(bad)  # type: ignore[arg-type]
    assert _fields(caught.value) == ("column", "a non-empty column name", bad)
    rt = Runtime(RuntimeConfig(str(tmp_path / "s.db")))
    rt.add_source("events")
    with pytest.raises(InvalidArgumentError) as caught:
        Stream(rt, "events").changelog_rows(bad)  # type: ignore[arg-type]
    assert _fields(caught.value) == ("column", "a non-empty column name", bad)
    assert rt.nodes().keys() == {"events"}  # nothing declared


def test_changelog_rows_is_a_partition_local_operator_and_the_stream_names_its_step() -> None:
    operator = changelog_rows()
    assert (operator.kind, operator.placement) == ("changelog_rows", Placement.PARTITION_LOCAL)
    assert operator() is not operator()
    job = Job("j")
    job.add_source("events")
    Stream(job, "events").changelog_rows(parallelism=2)
    assert {"events.changelog_rows.0", "events.changelog_rows.1"} <= set(job.actor_names())
