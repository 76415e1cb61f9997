"""aggregate and reduce: a changelog per epoch (an insert the first time, an update pair for a
changed key, nothing for an unchanged one) whose applied state equals a plain-Python reference,
with crashes, in parallel; retractions and bad arguments refused; the accumulators' rules."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import anyio
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from _changelog import Changelog
from _timeouts import scaled
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from barrierflow.actors.backfill.materialize import VIEW_TABLE
from barrierflow.channels import Chunk, Message, Op, Watermark
from barrierflow.errors import (
    ActorFailedError,
    ChangelogInputError,
    InvalidArgumentError,
    SchemaMismatchError,
)
from barrierflow.operators._accumulators import FUNCTIONS, Aggregations, Reduction, group_rows
from barrierflow.operators.aggregate import FOLD_ROWS, aggregate, reduce
from barrierflow.runtime import ActorContext, Placement, Runtime, RuntimeConfig, StreamActor
from barrierflow.testing.actor_conformance import check_stream_actor, check_stream_actor_kills

pytestmark = pytest.mark.anyio

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64())])
KEY = ("k",)
ALL = {
    "s": ("v", "sum"),
    "c": ("v", "count"),
    "lo": ("v", "min"),
    "hi": ("v", "max"),
    "m": ("v", "mean"),
    "f": ("v", "first"),
    "l": ("v", "last"),
}
Row = tuple[int, int | None]


class Collect(StreamActor):
    """Keeps every chunk it reads (a class-level list, cleared by each test)."""

    seen: ClassVar[list[Chunk]] = []

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk):
            Collect.seen.append(message)
        await ctx.emit(message)


def reference(rows: Iterable[Row]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Every aggregation of ALL, in plain Python (nulls as SQL; first/last keep nulls)."""
    groups: dict[int, list[int | None]] = {}
    for k, v in rows:
        groups.setdefault(k, []).append(v)
    out = {}
    for k, values in groups.items():
        valid = [v for v in values if v is not None]
        out[(k,)] = {
            "k": k,
            "s": sum(valid) if valid else None,
            "c": len(valid),
            "lo": min(valid) if valid else None,
            "hi": max(valid) if valid else None,
            "m": sum(valid) / len(valid) if valid else None,
            "f": values[0],
            "l": values[-1],
        }
    return out


def _batch(rows: Sequence[Row]) -> pa.RecordBatch:
    return pa.record_batch(
        [pa.array([k for k, _ in rows], pa.int64()), pa.array([v for _, v in rows], pa.int64())],
        schema=SCHEMA,
    )


def _runtime(path: Path, operator: Any, **options: Any) -> Runtime:
    Collect.seen = []
    # Barriers only when the test asks: each checkpoint closes one epoch.
    rt = Runtime(RuntimeConfig(state_path=str(path / "state.db"), barrier_interval=3600))
    rt.add_source("events")
    rt.add_actor("agg", operator, inputs=["events"], **options)
    rt.add_actor("collect", Collect, inputs=["agg"])
    return rt


async def _run(
    path: Path, operator: Any, epochs: Sequence[Sequence[Sequence[Row]]], **options: Any
) -> list[Chunk]:
    rt = _runtime(path, operator, **options)
    with anyio.fail_after(scaled(60)):
        async with rt:
            for epoch in epochs:
                for rows in epoch:
                    await rt.push("events", Chunk(_batch(rows)))
                await rt.checkpoint()
    return list(Collect.seen)


_values = st.one_of(st.none(), st.integers(-5, 5))
_rows = st.lists(st.tuples(st.integers(0, 6), _values), min_size=1, max_size=8)
_epochs = st.lists(st.lists(_rows, min_size=1, max_size=3), min_size=1, max_size=4)
_settings = settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@_settings
@given(epochs=_epochs)
async def test_the_applied_changelog_equals_a_plain_python_reference(
    tmp_path_factory: pytest.TempPathFactory, epochs: list[list[list[Row]]]
) -> None:
    chunks = await _run(tmp_path_factory.mktemp("agg"), aggregate("k", **ALL), epochs)
    applied = Changelog().apply(chunks)
    assert applied.state == reference(r for epoch in epochs for rows in epoch for r in rows)
    assert len(chunks) <= len(epochs)  # one chunk per epoch at most


@_settings
@given(epochs=_epochs)
async def test_parallel_instances_give_what_one_gives(
    tmp_path_factory: pytest.TempPathFactory, epochs: list[list[list[Row]]]
) -> None:
    one = await _run(tmp_path_factory.mktemp("one"), aggregate("k", **ALL), epochs)
    two = await _run(tmp_path_factory.mktemp("two"), aggregate("k", **ALL), epochs, parallelism=2)
    assert Changelog().apply(one).state == Changelog().apply(two).state
    expected = reference(r for epoch in epochs for rows in epoch for r in rows)
    assert Changelog().apply(two).state == expected


async def test_an_epoch_emits_inserts_then_update_pairs_in_key_order_and_unchanged_keys_stay_silent(
    tmp_path: Path,
) -> None:
    chunks = await _run(
        tmp_path,
        aggregate("k", hi=("v", "max")),
        [
            [[(1, 5), (2, 7)], [(1, 6)]],
            [[(2, 3), (3, 1), (1, 9)]],  # 2's max stays 7: silent
            [],  # no rows: no chunk
            [[(2, 7)]],  # equal to the max: silent, and no chunk at all
        ],
    )
    assert len(chunks) == 2
    first, second = chunks
    assert first.batch.to_pylist() == [{"k": 1, "hi": 6}, {"k": 2, "hi": 7}]
    assert first.ops_numpy().tolist() == [Op.INSERT, Op.INSERT]
    assert second.batch.to_pylist() == [{"k": 3, "hi": 1}, {"k": 1, "hi": 6}, {"k": 1, "hi": 9}]
    assert second.ops_numpy().tolist() == [Op.INSERT, Op.UPDATE_DELETE, Op.UPDATE_INSERT]


async def test_an_unchanged_mean_is_silent_but_its_count_is_kept(tmp_path: Path) -> None:
    chunks = await _run(
        tmp_path, aggregate("k", m=("v", "mean")), [[[(1, 2)]], [[(1, 2)]], [[(1, 5)]]]
    )
    assert [c.batch.to_pylist() for c in chunks] == [
        [{"k": 1, "m": 2.0}],
        [{"k": 1, "m": 2.0}, {"k": 1, "m": 3.0}],  # (2 + 2 + 5) / 3: the second 2 was counted
    ]
    assert chunks[1].ops_numpy().tolist() == [Op.UPDATE_DELETE, Op.UPDATE_INSERT]


async def test_first_keeps_the_first_row_and_last_takes_the_last_across_epochs(
    tmp_path: Path,
) -> None:
    chunks = await _run(
        tmp_path,
        aggregate("k", f=("v", "first"), l=("v", "last")),
        [[[(1, None), (1, 3)]], [[(1, 4), (1, None)]], [[(1, 8)]]],
    )
    state = Changelog().apply(chunks).state
    assert state == {(1,): {"k": 1, "f": None, "l": 8}}
    assert chunks[1].batch.to_pylist()[1] == {"k": 1, "f": None, "l": None}


async def test_a_sum_of_nulls_is_null_and_their_count_zero(tmp_path: Path) -> None:
    chunks = await _run(
        tmp_path,
        aggregate("k", s=("v", "sum"), c=("v", "count"), lo=("v", "min")),
        [[[(1, None)]], [[(1, None)]], [[(1, 4)]]],
    )
    assert chunks[0].batch.to_pylist() == [{"k": 1, "s": None, "c": 0, "lo": None}]
    assert len(chunks) == 2  # the second null changed nothing
    assert chunks[1].batch.to_pylist()[1] == {"k": 1, "s": 4, "c": 1, "lo": 4}


async def test_epochs_larger_than_the_fold_threshold_fold_in_order(tmp_path: Path) -> None:
    n = FOLD_ROWS + 10
    keys = np.arange(n) % 3
    batch = pa.record_batch([pa.array(keys), pa.array(np.arange(n))], schema=SCHEMA)
    rt = _runtime(tmp_path, aggregate("k", f=("v", "first"), l=("v", "last"), c=("v", "count")))
    with anyio.fail_after(scaled(60)):
        async with rt:
            await rt.push("events", Chunk(batch.slice(0, FOLD_ROWS)))
            await rt.push("events", Chunk(batch.slice(FOLD_ROWS)))
            await rt.checkpoint()
    [chunk] = Collect.seen
    rows = {r["k"]: r for r in chunk.batch.to_pylist()}
    assert rows[0] == {"k": 0, "f": 0, "l": n - 1 - ((n - 1) % 3), "c": len(keys[keys == 0])}
    assert rows[2]["f"] == 2
    assert rows[2]["l"] == max(i for i in range(n - 3, n) if i % 3 == 2)


async def test_a_reduce_folds_with_the_users_combine(tmp_path: Path) -> None:
    def running_max(acc: pa.RecordBatch, rows: pa.RecordBatch) -> pa.RecordBatch:
        return pa.record_batch(
            [acc["k"], pc.max_element_wise(acc["v"], rows["v"])], schema=acc.schema
        )

    epochs = [[[(1, 3), (2, 1), (1, 5)]], [[(1, 4), (2, 9)]], [[(1, 7)]]]
    chunks = await _run(tmp_path, reduce("k", running_max), epochs)
    assert Changelog().apply(chunks).state == {(1,): {"k": 1, "v": 7}, (2,): {"k": 2, "v": 9}}
    assert chunks[1].batch.to_pylist() == [{"k": 2, "v": 1}, {"k": 2, "v": 9}]  # 1 stays 5


def _concat(acc: pa.RecordBatch, rows: pa.RecordBatch) -> pa.RecordBatch:
    joined = pc.binary_join_element_wise(acc["s"], rows["s"], "")
    return pa.record_batch([acc["k"], joined], names=["k", "s"])


def test_a_reduction_combines_pairwise_in_input_order() -> None:
    rows = pa.table({"k": [1, 2, 1, 1, 1, 2, 1], "s": ["a", "x", "b", "c", "d", "y", "e"]})
    calls: list[int] = []

    def counted(acc: pa.RecordBatch, more: pa.RecordBatch) -> pa.RecordBatch:
        calls.append(acc.num_rows)
        return _concat(acc, more)

    out = Reduction(counted).partial(rows, KEY)
    assert out.to_pylist() == [{"k": 1, "s": "abcde"}, {"k": 2, "s": "xy"}]
    assert calls == [3, 1, 1]  # log2 rounds of whole batches: (ab, cd, xy), (abcd), (abcde)
    assert out.schema.field("k").nullable is False


def test_a_reduction_takes_the_keys_of_the_left_rows() -> None:
    def moves_keys(acc: pa.RecordBatch, more: pa.RecordBatch) -> pa.RecordBatch:
        return pa.record_batch([pc.add(acc["k"], 100), more["s"]], names=["k", "s"])

    out = Reduction(moves_keys).partial(pa.table({"k": [1, 1], "s": ["a", "b"]}), KEY)
    assert out.to_pylist() == [{"k": 1, "s": "b"}]


_ROWS = pa.table({"k": [1, 1], "s": ["a", "b"]})
_STATE = Reduction(_concat).state_schema(_ROWS.schema, KEY)


@pytest.mark.parametrize(
    ("result", "expected", "got"),
    [
        (lambda acc, more: acc.to_pydict(), "a pyarrow.RecordBatch", {"k": [1], "s": ["a"]}),
        (lambda acc, more: acc.slice(0, 0), "1 rows (one per key-aligned row)", "0 rows"),
    ],
)
def test_a_reduction_refuses_a_result_that_is_not_one_row_per_row(
    result: Any, expected: str, got: Any
) -> None:
    reduction = Reduction(result)
    reduction.actor = "r.0"
    with pytest.raises(InvalidArgumentError) as caught:
        reduction.partial(_ROWS, KEY)
    assert caught.value.argument == "reduce 'r.0': fn's result"
    assert (caught.value.expected, caught.value.got) == (expected, got)


@pytest.mark.parametrize(
    "columns",
    [
        [pa.array([1], pa.int64())],  # fewer columns
        [pa.array([1], pa.int64()), pa.array(["a"], pa.large_string())],  # another type
    ],
)
@pytest.mark.parametrize("names", [["k", "s"], ["k", "t"]])
def test_a_reduction_refuses_a_result_of_another_schema(
    columns: list[pa.Array], names: list[str]
) -> None:
    out = pa.record_batch(columns, names=names[: len(columns)])
    if out.schema.names == ["k", "s"] and out.schema.types == _STATE.types:
        pytest.skip("the state's own schema")
    reduction = Reduction(lambda acc, more: out)
    reduction.actor = "r.0"
    with pytest.raises(SchemaMismatchError) as caught:
        reduction.partial(_ROWS, KEY)
    assert caught.value.argument == "reduce 'r.0': fn's result"
    assert caught.value.expected_schema == _STATE
    assert caught.value.actual_schema == out.schema


def test_a_reduction_result_of_the_state_names_and_types_but_other_nullability_is_taken() -> None:
    def loose(acc: pa.RecordBatch, more: pa.RecordBatch) -> pa.RecordBatch:
        return pa.record_batch([acc["k"], more["s"]], names=["k", "s"])  # k nullable

    assert Reduction(loose).partial(_ROWS, KEY).to_pylist() == [{"k": 1, "s": "b"}]


def test_group_rows_keeps_input_order_over_many_chunks() -> None:
    rng = np.random.default_rng(3)
    chunks = [pa.table({"k": rng.integers(0, 50, 2000)}) for _ in range(100)]
    rows = pa.concat_tables(chunks)
    keys = rows.column("k").to_numpy()
    for _ in range(10):  # a hash aggregation on threads interleaves the chunks' rows
        order, lengths = group_rows(rows, KEY)
        starts = np.cumsum(lengths) - lengths
        for start, length in zip(starts.tolist(), lengths.tolist(), strict=True):
            group = order[start : start + length]
            assert (np.diff(group) > 0).all()
            assert (keys[group] == keys[group[0]]).all()


def test_group_rows_keeps_input_order_within_a_key_and_keys_by_first_appearance() -> None:
    order, lengths = group_rows(pa.table({"k": [3, 1, 3, 2, 1, 3]}), KEY)
    assert order.tolist() == [0, 2, 5, 1, 4, 3]
    assert lengths.tolist() == [3, 2, 1]


def test_aggregations_fold_partials_and_merge_state_by_the_rules() -> None:
    spec = Aggregations(ALL)
    a = spec.partial(pa.table({"k": [1, 1, 2], "v": [None, 4, 6]}), KEY)
    b = spec.partial(pa.table({"k": [2, 1], "v": [1, None]}), KEY)
    assert a.schema == spec.state_schema(SCHEMA, KEY)
    combined = spec.combine(pa.concat_tables([a, b]), KEY)
    merged = spec.merge(a.take([0, 1]), b.take([1, 0]), KEY)
    expected = [
        {
            "k": 1,
            "s": 4,
            "c": 1,
            "lo": 4,
            "hi": 4,
            "m:sum": 4.0,
            "m:count": 1,
            "f": None,
            "l": None,
        },
        {"k": 2, "s": 7, "c": 2, "lo": 1, "hi": 6, "m:sum": 7.0, "m:count": 2, "f": 6, "l": 1},
    ]
    assert combined.to_pylist() == expected
    assert merged.to_pylist() == expected
    out = spec.outputs(merged)
    assert out.schema == spec.output_schema(SCHEMA, KEY)
    assert out.column("m").to_pylist() == [4.0, 3.5]
    assert out.column_names == ["k", "s", "c", "lo", "hi", "m", "f", "l"]


def test_aggregation_types_follow_the_input() -> None:
    schema = pa.schema(
        [("k", pa.string()), ("i", pa.int8()), ("u", pa.uint16()), ("x", pa.float32())]
    )
    spec = Aggregations(
        {
            "si": ("i", "sum"),
            "su": ("u", "sum"),
            "sx": ("x", "sum"),
            "mi": ("i", "min"),
            "n": ("x", "count"),
        }
    )
    out = spec.output_schema(schema, KEY)
    assert out == pa.schema(
        [
            pa.field("k", pa.string(), nullable=False),
            ("si", pa.int64()),
            ("su", pa.uint64()),
            ("sx", pa.float64()),
            ("mi", pa.int8()),
            pa.field("n", pa.int64(), nullable=False),
        ]
    )
    assert spec.needs_state is False
    assert Aggregations({"m": ("i", "mean")}).needs_state is True


def test_a_merged_sum_of_nulls_stays_null_and_a_null_side_is_no_value() -> None:
    spec = Aggregations({"s": ("v", "sum")})
    old = pa.table({"k": [1, 2, 3], "s": [None, 2, None]}).cast(spec.state_schema(SCHEMA, KEY))
    new = pa.table({"k": [1, 2, 3], "s": [5, None, None]}).cast(old.schema)
    assert spec.merge(old, new, KEY).column("s").to_pylist() == [5, 2, None]


_PAIR = "a (column, function) pair of strs"


@pytest.mark.parametrize(
    ("aggregations", "fields"),
    [
        ({}, ("aggregations", "at least one out_name=(column, function)", {})),
        (
            {"x": ("v", "median")},
            ("aggregations['x']", f"a function of {list(FUNCTIONS)}", "median"),
        ),
        ({"x": ("v",)}, ("aggregations['x']", _PAIR, ("v",))),
        ({"x": ["v", "sum"]}, ("aggregations['x']", _PAIR, ["v", "sum"])),
        ({"x": ("", "sum")}, ("aggregations['x']", _PAIR, ("", "sum"))),
        ({"x": ("v", "sum", "max")}, ("aggregations['x']", _PAIR, ("v", "sum", "max"))),
        (
            {"a:b": ("v", "sum")},
            ("aggregations", "output names that are non-empty strs without ':'", "a:b"),
        ),
    ],
)
def test_bad_aggregations_are_refused_when_called(
    aggregations: dict[str, Any], fields: tuple[Any, ...]
) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        aggregate("k", **aggregations)
    assert (caught.value.argument, caught.value.expected, caught.value.got) == fields


def test_an_unknown_function_is_refused_naming_the_valid_ones() -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        aggregate("k", x=("v", "median"))
    assert caught.value.got == "median"
    assert caught.value.expected == f"a function of {list(FUNCTIONS)}"


_NAMES = "a column name or a list of column names"
_FN = "a function (acc: RecordBatch, rows: RecordBatch) -> RecordBatch"


@pytest.mark.parametrize(
    ("call", "error", "fields"),
    [
        (lambda: aggregate(5, s=("v", "sum")), InvalidArgumentError, ("key", _NAMES, 5)),
        (lambda: aggregate([], s=("v", "sum")), InvalidArgumentError, ("key", _NAMES, [])),
        (
            lambda: aggregate("k", k=("v", "sum")),
            InvalidArgumentError,
            ("aggregations", "output names other than the key columns ['k']", "k"),
        ),
        (
            lambda: aggregate("k", schema={"k": 1}, s=("v", "sum")),
            InvalidArgumentError,
            ("schema", "None or a pyarrow.Schema", {"k": 1}),
        ),
        (
            lambda: aggregate("k", schema=SCHEMA, s=("w", "sum")),
            SchemaMismatchError,
            ("aggregations['s']", "schema (a schema with the column 'w')", SCHEMA),
        ),
        (
            lambda: aggregate("x", schema=SCHEMA, s=("v", "sum")),
            SchemaMismatchError,
            ("key", "schema (a schema with the key column 'x')", SCHEMA),
        ),
        (lambda: reduce("k", 5), InvalidArgumentError, ("fn", _FN, 5)),
        (
            lambda: reduce(("k", "k"), max),
            InvalidArgumentError,
            ("key", "each column once", ["k", "k"]),
        ),
        (
            lambda: reduce("x", max, schema=SCHEMA),
            SchemaMismatchError,
            ("key", "schema (a schema with the key column 'x')", SCHEMA),
        ),
        (
            lambda: reduce("k", max, schema=5),
            InvalidArgumentError,
            ("schema", "None or a pyarrow.Schema", 5),
        ),
    ],
)
def test_bad_arguments_are_refused_when_called(
    call: Any, error: type, fields: tuple[Any, ...]
) -> None:
    with pytest.raises(error) as caught:
        call()
    assert (caught.value.argument, caught.value.expected, caught.value.got) == fields


_ORDERABLE = "an orderable column 'v' (number, time, string, binary)"


@pytest.mark.parametrize(
    ("function", "typ", "expected"),
    [
        ("sum", pa.string(), "a numeric column 'v' to sum"),
        ("mean", pa.bool_(), "a numeric column 'v' to mean"),
        ("min", pa.list_(pa.int64()), _ORDERABLE),
        ("max", pa.struct([("a", pa.int8())]), _ORDERABLE),
        ("max", pa.bool_(), _ORDERABLE),
    ],
)
def test_a_function_of_a_column_it_cannot_take_is_refused(
    function: str, typ: pa.DataType, expected: str
) -> None:
    schema = pa.schema([("k", pa.int64()), ("v", typ)])
    with pytest.raises(SchemaMismatchError) as caught:
        aggregate("k", schema=schema, x=("v", function))
    assert caught.value.argument == "aggregations['x']"
    assert caught.value.expected_schema == expected
    assert caught.value.actual_schema == f"v: {typ}"


@pytest.mark.parametrize("function", ["first", "last", "count"])
def test_first_last_and_count_take_any_column(function: str) -> None:
    schema = pa.schema([("k", pa.int64()), ("v", pa.list_(pa.int64()))])
    aggregate("k", schema=schema, x=("v", function))


async def test_a_retraction_is_refused(tmp_path: Path) -> None:
    rt = _runtime(tmp_path, aggregate("k", s=("v", "sum")))
    with pytest.raises(ActorFailedError) as caught:
        async with rt:
            await rt.push(
                "events", Chunk(_batch([(1, 1), (1, 2), (2, 2)]), [0, Op.UPDATE_DELETE, Op.DELETE])
            )
            await rt.checkpoint()
    cause = caught.value.cause
    assert isinstance(cause, ChangelogInputError)
    assert (cause.actor, cause.operator) == ("agg", "aggregate")
    assert cause.what == "a chunk with 2 delete(s) or update(s)"
    assert cause.expected == "an insert-only input (aggregates over a changelog are for later)"


async def test_an_insert_only_chunk_with_ops_is_taken(tmp_path: Path) -> None:
    rt = _runtime(tmp_path, aggregate("k", s=("v", "sum")))
    async with rt:
        await rt.push("events", Chunk(_batch([(1, 1), (1, 2)]), [Op.INSERT, Op.INSERT]))
        await rt.checkpoint()
    assert Collect.seen[0].batch.to_pylist() == [{"k": 1, "s": 3}]


async def test_invisible_rows_are_not_aggregated(tmp_path: Path) -> None:
    rt = _runtime(tmp_path, aggregate("k", s=("v", "sum")))
    async with rt:
        await rt.push("events", Chunk(_batch([(1, 1), (1, 2), (2, 5)]), None, [True, False, False]))
        await rt.push("events", Chunk(_batch([(3, 1)]), None, [False]))
        await rt.checkpoint()
    [chunk] = Collect.seen
    assert chunk.batch.to_pylist() == [{"k": 1, "s": 1}]


async def test_a_null_key_is_refused(tmp_path: Path) -> None:
    rt = _runtime(tmp_path, aggregate("k", s=("v", "sum")))
    batch = pa.record_batch(
        [pa.array([1, None], pa.int64()), pa.array([1, 2], pa.int64())], schema=SCHEMA
    )
    with pytest.raises(ActorFailedError) as caught:
        async with rt:
            await rt.push("events", Chunk(batch))
            await rt.checkpoint()
    cause = caught.value.cause
    assert isinstance(cause, InvalidArgumentError)
    assert cause.argument == "aggregate 'agg': key column 'k'"
    assert cause.got == "1 null(s)"
    assert cause.expected == "no nulls"


@pytest.mark.parametrize("declared", [True, False])
@pytest.mark.parametrize("kind", ["aggregate", "reduce"])
async def test_a_chunk_of_another_schema_is_refused(
    tmp_path: Path, declared: bool, kind: str
) -> None:
    schema = SCHEMA if declared else None
    if kind == "aggregate":
        operator = aggregate("k", schema=schema, s=("v", "sum"))
    else:
        operator = reduce("k", _add, schema=schema)
    rt = _runtime(tmp_path, operator)
    other = pa.record_batch([pa.array([1]), pa.array([1.5])], names=["k", "v"])
    with pytest.raises(ActorFailedError) as caught:
        async with rt:
            if not declared:
                await rt.push("events", Chunk(_batch([(1, 1)])))
            await rt.push("events", Chunk(other))
            await rt.checkpoint()
    cause = caught.value.cause
    assert isinstance(cause, SchemaMismatchError)
    assert cause.argument == f"{kind} 'agg': input"
    assert (cause.expected_schema, cause.actual_schema) == (SCHEMA, other.schema)


async def test_a_restart_with_another_undeclared_input_schema_is_refused(tmp_path: Path) -> None:
    await _run(tmp_path, aggregate("k", s=("v", "sum")), [[[(1, 1)]]])
    other = pa.record_batch(
        [pa.array([1], pa.int32()), pa.array([1], pa.int64())], names=["k", "v"]
    )
    rt = _runtime(tmp_path, aggregate("k", s=("v", "sum")))
    with pytest.raises(ActorFailedError) as caught:
        async with rt:
            await rt.push("events", Chunk(other))
            await rt.checkpoint()
    cause = caught.value.cause
    assert isinstance(cause, SchemaMismatchError)
    assert cause.argument == "aggregate 'agg': input"
    spec = Aggregations({"s": ("v", "sum")})
    assert cause.expected_schema == spec.state_schema(SCHEMA, KEY)
    assert cause.actual_schema == spec.state_schema(other.schema, KEY)


async def test_a_restart_with_another_input_schema_is_refused(tmp_path: Path) -> None:
    await _run(tmp_path, aggregate("k", s=("v", "sum")), [[[(1, 1)]]])
    other = pa.schema([("k", pa.int32()), ("v", pa.int64())])
    rt = _runtime(tmp_path, aggregate("k", schema=other, s=("v", "sum")))
    with pytest.raises(ActorFailedError) as caught:
        async with rt:
            await rt.checkpoint()
    cause = caught.value.cause
    assert isinstance(cause, SchemaMismatchError)
    assert cause.argument == "keyed state of 'agg'"
    spec = Aggregations({"s": ("v", "sum")})
    assert cause.expected_schema == spec.state_schema(SCHEMA, KEY)  # what the state holds
    assert cause.actual_schema == spec.state_schema(other, KEY)


async def test_state_survives_a_restart_without_a_declared_schema(tmp_path: Path) -> None:
    first = await _run(tmp_path, aggregate("k", s=("v", "sum")), [[[(1, 1), (2, 2)]]])
    second = await _run(tmp_path, aggregate("k", s=("v", "sum")), [[[(1, 5)]]])
    assert second[0].batch.to_pylist() == [{"k": 1, "s": 1}, {"k": 1, "s": 6}]
    assert Changelog().apply(first + second).state[(1,)] == {"k": 1, "s": 6}


async def test_watermarks_pass_through_at_once_and_the_changes_wait_for_the_barrier(
    tmp_path: Path,
) -> None:
    seen: list[Message] = []

    class Marks(StreamActor):
        async def process(self, message: Message, ctx: ActorContext) -> None:
            await ctx.emit(message)
            if isinstance(message, Chunk):
                await ctx.emit(Watermark("k", 5))

    class Everything(StreamActor):
        async def process(self, message: Message, ctx: ActorContext) -> None:
            seen.append(message)
            await ctx.emit(message)

    rt = Runtime(RuntimeConfig(state_path=str(tmp_path / "state.db"), barrier_interval=3600))
    rt.add_source("events")
    rt.add_actor("marks", Marks, inputs=["events"])
    rt.add_actor("agg", aggregate("k", s=("v", "sum")), inputs=["marks"])
    rt.add_actor("all", Everything, inputs=["agg"])
    async with rt:
        await rt.push("events", Chunk(_batch([(1, 1)])))
        await rt.checkpoint()
    kinds = [type(m).__name__ for m in seen]
    assert kinds[:4] == ["Barrier", "Watermark", "Chunk", "Barrier"]


class _OpsAsColumn:
    """A context whose emit turns a changelog chunk into inserts with an ``op`` column (the
    conformance suite's sink is append-only)."""

    def __init__(self, ctx: ActorContext) -> None:
        self._ctx = ctx

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)

    async def emit(self, message: Message) -> None:
        if isinstance(message, Chunk):
            message = Chunk(message.batch.append_column("op", pa.array(message.ops_numpy())))
        await self._ctx.emit(message)


class Flattened(StreamActor):
    """Runs an operator's actor with its changelog as a column."""

    def __init__(self, operator: Any) -> None:
        self.inner = operator()

    async def run(self, ctx: ActorContext) -> None:
        await self.inner.run(_OpsAsColumn(ctx))


def _add(acc: pa.RecordBatch, rows: pa.RecordBatch) -> pa.RecordBatch:
    return pa.record_batch([acc["k"], pc.add(acc["v"], rows["v"])], schema=acc.schema)


def flattened_aggregate() -> StreamActor:
    return Flattened(aggregate("k", **ALL))


def flattened_reduce() -> StreamActor:
    return Flattened(reduce("k", _add))


_OP = pa.field("op", pa.int8())
CONFORMANCE = [
    (flattened_aggregate, Aggregations(ALL).output_schema(SCHEMA, KEY).append(_OP)),
    (flattened_reduce, Reduction(_add).state_schema(SCHEMA, KEY).append(_OP)),
]


@_settings
@given(epochs=_epochs, seed=st.integers(0, 1000))
async def test_aggregate_and_reduce_commit_the_same_rows_with_crashes(
    tmp_path_factory: pytest.TempPathFactory, epochs: list[list[list[Row]]], seed: int
) -> None:
    chunks = [Chunk(_batch(rows)) for epoch in epochs for rows in epoch]
    for factory, output in CONFORMANCE:
        report = await check_stream_actor(
            factory,
            chunks,
            output=output,
            state_dir=tmp_path_factory.mktemp("conformance"),
            crashes=2,
            seed=seed,
        )
        report.raise_for_failures()


async def test_the_operator_declares_keyed_placement_by_its_key() -> None:
    operator = aggregate(["k", "j"], s=("v", "sum"))
    assert operator.placement is Placement.KEYED
    assert operator.key == ("k", "j")
    assert operator.kind == "aggregate"
    assert reduce("k", max).key == ("k",)
    assert reduce("k", max).kind == "reduce"
    assert reduce("k", max).placement is Placement.KEYED
    assert operator() is not operator(1)


async def test_the_counters_are_reported(tmp_path: Path) -> None:
    rt = _runtime(tmp_path, aggregate("k", s=("v", "sum")))
    async with rt:
        await rt.push("events", Chunk(_batch([(1, 1), (2, 2), (1, 3)])))
        await rt.checkpoint()
        await rt.push("events", Chunk(_batch([(1, 1), (3, 2)])))
        await rt.checkpoint()
        families = {f.name: f for f in await rt.metrics.snapshot()}
    labels = {"actor": "agg", "operator": "aggregate"}
    assert families["barrierflow_operator_rows_in"].value(**labels) == 5
    assert families["barrierflow_operator_rows_out"].value(**labels) == 2 + 3
    assert families["barrierflow_operator_state_rows"].value(**labels) == 3


async def test_the_view_table_holds_exactly_the_output_rows(tmp_path: Path) -> None:
    rt = _runtime(tmp_path, aggregate("k", m=("v", "mean"), s=("v", "sum")))
    async with rt:
        await rt.push("events", Chunk(_batch([(1, 1), (2, 2), (1, 3)])))
        await rt.checkpoint()
        await rt.push("events", Chunk(_batch([(1, 2)])))
        epoch = await rt.checkpoint()
        [view] = rt._store.versioned_group("agg", VIEW_TABLE)
        [state] = rt._store.versioned_group("agg", "state")
        rows = pa.concat_tables([await view.read_vnode(v, epoch) for v in range(256)])
        log = await view.change_log(epoch)
        kept = pa.concat_tables([await state.read_vnode(v, epoch) for v in range(256)])
    assert sorted(rows.to_pylist(), key=lambda r: r["k"]) == [
        {"k": 1, "m": 2.0, "s": 6},
        {"k": 2, "m": 2.0, "s": 2},
    ]
    assert log.column("_op").to_pylist() == [Op.UPDATE_DELETE, Op.UPDATE_INSERT]
    assert sorted(kept.to_pylist(), key=lambda r: r["k"])[0] == {
        "k": 1,
        "m:sum": 6.0,
        "m:count": 3,
        "s": 6,
    }


@pytest.mark.subprocess
async def test_aggregate_commits_the_same_rows_across_sigkills(
    tmp_path: Path, anyio_backend_name: str
) -> None:
    epochs = [[(i % 7, i), (i % 3, None), (i % 5, -i)] for i in range(9)]
    chunks = [Chunk(_batch(rows)) for rows in epochs]
    factory, output = CONFORMANCE[0]
    other = {"asyncio": "trio", "trio": "asyncio"}[anyio_backend_name]  # children: the other
    report = await check_stream_actor_kills(
        factory, chunks, output=output, state_dir=tmp_path, kills=3, seed=4, backend=other
    )
    report.raise_for_failures()
    assert len(report.results[0].detail.split("; ")) == 4  # three kills, then the end


async def test_a_key_of_several_columns_of_several_types(tmp_path: Path) -> None:
    schema = pa.schema([("region", pa.string()), ("day", pa.int32()), ("v", pa.float64())])
    rt = Runtime(RuntimeConfig(state_path=str(tmp_path / "state.db"), barrier_interval=3600))
    rt.add_source("events")
    operator = aggregate(["region", "day"], total=("v", "sum"), avg=("v", "mean"))
    rt.add_actor("agg", operator, inputs=["events"], parallelism=2)
    rt.add_actor("collect", Collect, inputs=["agg"])
    Collect.seen = []
    rows = [("eu", 1, 1.0), ("us", 1, 2.0), ("eu", 2, 4.0), ("eu", 1, 3.0)]
    more = [("eu", 1, 5.0), ("us", 2, 1.0)]
    async with rt:
        for part in (rows, more):
            columns = list(zip(*part, strict=True))
            await rt.push(
                "events", Chunk(pa.record_batch([pa.array(c) for c in columns], schema=schema))
            )
            await rt.checkpoint()
    state = Changelog(("region", "day")).apply(Collect.seen).state
    assert state == {
        ("eu", 1): {"region": "eu", "day": 1, "total": 9.0, "avg": 3.0},
        ("us", 1): {"region": "us", "day": 1, "total": 2.0, "avg": 2.0},
        ("eu", 2): {"region": "eu", "day": 2, "total": 4.0, "avg": 4.0},
        ("us", 2): {"region": "us", "day": 2, "total": 1.0, "avg": 1.0},
    }


def test_as_batch_gives_one_batch_of_any_table() -> None:
    from barrierflow.operators._accumulators import as_batch

    two = pa.concat_tables([pa.table({"a": [1]}), pa.table({"a": [2, 3]})])
    assert as_batch(two).to_pylist() == [{"a": 1}, {"a": 2}, {"a": 3}]
    empty = as_batch(pa.table({"a": pa.array([], pa.int8())}))
    assert empty.num_rows == 0
    assert empty.schema == pa.schema([("a", pa.int8())])


@pytest.mark.parametrize(
    "typ",
    [
        pa.int16(),
        pa.uint8(),
        pa.float32(),
        pa.string(),
        pa.large_string(),
        pa.binary(),
        pa.large_binary(),
        pa.timestamp("ms"),
        pa.date32(),
        pa.duration("s"),
    ],
)
def test_min_and_max_take_numbers_times_strings_and_binaries(typ: pa.DataType) -> None:
    schema = pa.schema([("k", pa.int64()), ("v", typ)])
    spec = Aggregations({"lo": ("v", "min"), "hi": ("v", "max")})
    assert spec.output_schema(schema, KEY).field("lo").type == typ


def test_a_mean_keeps_a_float_sum_and_a_count_and_outputs_a_float() -> None:
    spec = Aggregations({"m": ("v", "mean"), "c": ("v", "count")})
    state = spec.state_schema(SCHEMA, KEY)
    assert state == pa.schema(
        [
            pa.field("k", pa.int64(), nullable=False),
            ("m:sum", pa.float64()),
            pa.field("m:count", pa.int64(), nullable=False),
            pa.field("c", pa.int64(), nullable=False),
        ]
    )
    assert spec.view_schema(state) == pa.schema(
        [
            pa.field("k", pa.int64(), nullable=False),
            ("m", pa.float64()),
            pa.field("c", pa.int64(), nullable=False),
        ]
    )
    partial = spec.partial(pa.table({"k": [1, 1, 1], "v": [1, None, 2]}), KEY)
    assert partial.to_pylist() == [{"k": 1, "m:sum": 3.0, "m:count": 2, "c": 2}]
    assert spec.outputs(partial).to_pylist() == [{"k": 1, "m": 1.5, "c": 2}]


@pytest.mark.parametrize(
    "aggregations",
    [
        [("x", ("v", "sum"))],
        {1: ("v", "sum")},
        {"": ("v", "sum")},
        {"x": (1, "sum")},
        {"x": ("v", 2)},
    ],
)
def test_aggregations_refuse_what_is_not_named_pairs_of_strs(aggregations: Any) -> None:
    with pytest.raises(InvalidArgumentError):
        Aggregations(aggregations)


def test_aggregations_say_what_they_hold() -> None:
    assert repr(Aggregations({"x": ("v", "sum")})) == "Aggregations({'x': ('v', 'sum')})"
    assert Reduction(max).actor == "reduce"


def test_a_reduction_of_no_rows_is_no_rows() -> None:
    calls: list[int] = []

    def never(acc: pa.RecordBatch, more: pa.RecordBatch) -> pa.RecordBatch:
        calls.append(1)
        return acc

    out = Reduction(never).partial(SCHEMA.empty_table(), KEY)
    assert out.num_rows == 0
    assert calls == []
    single = Reduction(never).partial(pa.table({"k": [1, 2], "v": [3, 4]}), KEY)
    assert single.to_pylist() == [{"k": 1, "v": 3}, {"k": 2, "v": 4}]
    assert calls == []  # one row per key: nothing to combine


async def test_a_chunk_without_the_key_column_is_refused(tmp_path: Path) -> None:
    rt = _runtime(tmp_path, aggregate("k", s=("v", "sum")))
    with pytest.raises(ActorFailedError) as caught:
        async with rt:
            await rt.push("events", Chunk(pa.record_batch({"v": [1]})))
            await rt.checkpoint()
    cause = caught.value.cause
    assert isinstance(cause, SchemaMismatchError)
    assert cause.argument == "key"


def test_combining_partials_keeps_the_first_rows_null_and_the_last_rows_null() -> None:
    spec = Aggregations({"f": ("v", "first"), "l": ("v", "last"), "s": ("v", "sum")})
    schema = spec.state_schema(SCHEMA, KEY)
    partials = pa.table(
        {
            "k": [1, 1, 2, 2],
            "f": [None, 3, 7, None],
            "l": [5, None, None, 8],
            "s": [1, None, None, 2],
        }
    ).cast(schema)
    assert spec.combine(partials, KEY).to_pylist() == [
        {"k": 1, "f": None, "l": None, "s": 1},
        {"k": 2, "f": 7, "l": 8, "s": 2},
    ]


def test_a_reduction_combines_partials_as_rows() -> None:
    reduction = Reduction(_concat)
    first = reduction.partial(pa.table({"k": [1, 2, 1], "s": ["a", "x", "b"]}), KEY)
    second = reduction.partial(pa.table({"k": [1, 1], "s": ["c", "d"]}), KEY)
    combined = reduction.combine(pa.concat_tables([first, second]), KEY)
    assert combined.to_pylist() == [{"k": 1, "s": "abcd"}, {"k": 2, "s": "x"}]
    assert reduction.merge(first.take([0]), second, KEY).to_pylist() == [{"k": 1, "s": "abcd"}]


def test_an_aggregation_of_the_first_column() -> None:
    spec = Aggregations({"n": ("k", "count"), "top": ("k", "max")})
    assert spec.output_schema(SCHEMA, ("v",)).names == ["v", "n", "top"]


class _Named:
    name = "agg"


async def test_an_epochs_rows_are_folded_once_they_reach_the_threshold() -> None:
    actor: Any = aggregate("k", schema=SCHEMA, s=("v", "sum"))()
    half = FOLD_ROWS // 2
    keys = np.arange(FOLD_ROWS) % 5
    batch = pa.record_batch([pa.array(keys), pa.array(np.ones(FOLD_ROWS, np.int64))], schema=SCHEMA)
    await actor._take(Chunk(batch.slice(0, half)), _Named())
    assert (actor._buffered, len(actor._partials)) == (half, 0)
    await actor._take(Chunk(batch.slice(half, FOLD_ROWS - half - 1)), _Named())
    assert (actor._buffered, len(actor._partials)) == (FOLD_ROWS - 1, 0)
    await actor._take(Chunk(batch.slice(FOLD_ROWS - 1)), _Named())  # exactly the threshold
    assert (actor._buffered, len(actor._partials)) == (0, 1)
    counts = np.bincount(keys).tolist()
    assert actor._partials[0].to_pylist() == [{"k": k, "s": counts[k]} for k in range(5)]


async def test_a_reduce_names_its_actor_when_fn_fails(tmp_path: Path) -> None:
    def wrong(acc: pa.RecordBatch, rows: pa.RecordBatch) -> pa.RecordBatch:
        return acc.slice(0, 0)

    rt = _runtime(tmp_path, reduce("k", wrong))
    with pytest.raises(ActorFailedError) as caught:
        async with rt:
            await rt.push("events", Chunk(_batch([(1, 1), (1, 2)])))
            await rt.checkpoint()
    cause = caught.value.cause
    assert isinstance(cause, InvalidArgumentError)
    assert cause.argument == "reduce 'agg': fn's result"
