"""The message vocabulary: chunks, barriers and their mutations, watermarks."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from barrierflow.channels import (
    Add,
    Barrier,
    BarrierKind,
    Chunk,
    EpochPair,
    Op,
    Pause,
    Resume,
    SourceChangeSplit,
    Split,
    Stop,
    Throttle,
    Update,
    VnodeBitmap,
    Watermark,
)
from barrierflow.errors import EpochOrderError, InvalidArgumentError

BATCH = pa.record_batch(
    {
        "id": pa.array([1, 2, 3, 4], pa.int64()),
        "name": pa.array(["a", None, "c", "d"], pa.string()),
    }
)
OPS = [Op.INSERT, Op.DELETE, Op.UPDATE_DELETE, Op.UPDATE_INSERT]
EPOCH = EpochPair(2 << 16, 1 << 16)


def buffer_addresses(batch: pa.RecordBatch) -> list[list[int | None]]:
    return [
        [None if buf is None else buf.address for buf in column.buffers()]
        for column in batch.columns
    ]


# Chunk: ops.


def test_chunk_without_ops_is_insert_only() -> None:
    chunk = Chunk(BATCH)
    assert chunk.ops is None
    assert chunk.ops_numpy().tolist() == [0, 0, 0, 0]
    assert chunk.ops_numpy().dtype == np.int8


@pytest.mark.parametrize(
    "ops",
    [OPS, [0, 1, 2, 3], np.array([0, 1, 2, 3], np.int64), pa.array([0, 1, 2, 3], pa.uint32())],
)
def test_chunk_ops_are_stored_as_int8_codes(ops: Any) -> None:
    chunk = Chunk(BATCH, ops)
    assert chunk.ops is not None
    assert chunk.ops.type == pa.int8()
    assert chunk.ops.to_pylist() == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("ops", "got"),
    [
        ([0, 1, 2], "3 op codes"),
        ([0, 1, 2, 3, 0], "5 op codes"),
        ([], "0 op codes"),
        (pa.array([0, 1], pa.int8()), "2 op codes"),
    ],
)
def test_ops_of_wrong_length_are_invalid(ops: Any, got: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Chunk(BATCH, ops)
    assert info.value.argument == "ops"
    assert info.value.got == got


@pytest.mark.parametrize(
    ("ops", "got"),
    [
        ([0, 1, 7, 0], 7),
        ([0, -1, 0, 0], -1),
        ([4, 0, 0, 0], 4),
        (pa.array([0, 1, 2, 100], pa.int64()), 100),
        (pa.array([0, -5, 2, 100], pa.int64()), -5),
    ],
)
def test_unknown_op_code_is_invalid(ops: Any, got: int) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Chunk(BATCH, ops)
    assert info.value.argument == "ops"
    assert info.value.got == got


def test_ops_with_nulls_are_invalid() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Chunk(BATCH, pa.array([0, None, None, 1], pa.int8()))
    assert info.value.argument == "ops"
    assert info.value.got == "2 nulls"


@pytest.mark.parametrize(
    "ops",
    [
        pa.array([0.0, 1.0, 2.0, 3.0]),
        pa.array(["0", "1", "2", "3"]),
        pa.array([True, False, True, False]),
        ["a", "b", "c", "d"],
        [0, 1, 300, 0],
        5,
        object(),
    ],
)
def test_ops_of_non_integer_type_are_invalid(ops: Any) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Chunk(BATCH, ops)
    assert info.value.argument == "ops"


def test_invalid_argument_error_message_says_expected_and_got() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Chunk(BATCH, [0, 1, 7, 0])
    message = str(info.value)
    assert message.startswith("ops: expected op codes in 0..3")
    assert message.endswith("got 7")
    assert info.value.expected in message


def test_with_ops_validates_and_keeps_the_mask() -> None:
    chunk = Chunk(BATCH, visibility=[True, False, True, True])
    changed = chunk.with_ops([3, 2, 1, 0])
    assert changed.ops is not None
    assert changed.ops.to_pylist() == [3, 2, 1, 0]
    assert changed.visibility is chunk.visibility
    with pytest.raises(InvalidArgumentError) as info:
        chunk.with_ops([0, 9, 0, 0])
    assert info.value.argument == "ops"


# Chunk: visibility.


@pytest.mark.parametrize(
    "mask",
    [
        [True, False, True, True],
        (True, False, True, True),
        np.array([True, False, True, True]),
        pa.array([True, False, True, True]),
        pa.chunked_array([[True, False], [True, True]]),
    ],
)
def test_visibility_accepts_lists_numpy_and_arrow_masks(mask: Any) -> None:
    chunk = Chunk(BATCH, visibility=mask)
    assert chunk.visibility is not None
    assert chunk.visibility.to_pylist() == [True, False, True, True]


@pytest.mark.parametrize(
    ("mask", "got"),
    [
        ([True, False], "2 entries"),
        (np.ones(5, dtype=np.bool_), "5 entries"),
        (pa.array([], pa.bool_()), "0 entries"),
        (pa.array([1, 0, 1, 1], pa.int8()), pa.int8()),
        (pa.array(["t", "f", "t", "t"]), pa.string()),
        (np.array([1, 0, 1, 1]), "numpy int64"),
        (np.array([1.0, 0.0, 1.0, 1.0]), "numpy float64"),
        (pa.array([True, None, True, None]), "2 nulls"),
        ([True, None, True, True], "1 nulls"),
        ("yes!", "str"),
        ({0: True}, "dict"),
        (5, "int"),
    ],
)
def test_bad_visibility_is_invalid(mask: Any, got: Any) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Chunk(BATCH, visibility=mask)
    assert info.value.argument == "visibility"
    assert info.value.got == got


@pytest.mark.parametrize("mask", [[1, 0, 1, 1], ["a", "b", "c", "d"]])
def test_list_visibility_of_non_bools_is_invalid(mask: list[Any]) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Chunk(BATCH, visibility=mask)
    assert info.value.argument == "visibility"


def test_two_dimensional_numpy_visibility_is_invalid_argument() -> None:
    with pytest.raises(InvalidArgumentError):
        Chunk(BATCH, visibility=np.ones((4, 1), dtype=np.bool_))


@pytest.mark.parametrize("batch", [pa.table({"id": [1]}), {"id": [1]}, None, [1, 2]])
def test_chunk_of_a_non_record_batch_is_invalid(batch: Any) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Chunk(batch)
    assert info.value.argument == "batch"
    assert info.value.got == type(batch).__name__


def test_with_visibility_shares_the_arrow_buffers() -> None:
    chunk = Chunk(BATCH, OPS)
    hidden = chunk.with_visibility([False, True, False, True])
    assert hidden.batch is chunk.batch
    assert buffer_addresses(hidden.batch) == buffer_addresses(chunk.batch)
    assert hidden.ops is chunk.ops


def test_with_visibility_does_not_mutate_the_original() -> None:
    chunk = Chunk(BATCH, OPS, visibility=[True, True, True, False])
    before = chunk.visibility
    hidden = chunk.with_visibility([False, True, False, True])
    assert chunk.visibility is before
    assert chunk.visibility is not None
    assert chunk.visibility.to_pylist() == [True, True, True, False]
    assert chunk.cardinality == 3
    assert hidden.cardinality == 2


def test_with_visibility_validates_the_mask() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Chunk(BATCH).with_visibility([True])
    assert info.value.argument == "visibility"


def test_cardinality_counts_visible_rows() -> None:
    assert Chunk(BATCH).cardinality == 4
    assert Chunk(BATCH, visibility=[False] * 4).cardinality == 0
    assert Chunk(BATCH, visibility=[True, False, False, True]).cardinality == 2
    sliced_mask = pa.array([True, False, True, True, False, False])[1:5]
    assert Chunk(BATCH, visibility=sliced_mask).cardinality == 2


def test_num_rows_counts_hidden_rows_too() -> None:
    assert Chunk(BATCH, visibility=[False] * 4).num_rows == 4


def test_compact_keeps_exactly_the_visible_rows_and_their_ops_in_order() -> None:
    chunk = Chunk(BATCH, OPS, visibility=[False, True, False, True])
    compact = chunk.compact()
    assert compact.visibility is None
    assert compact.batch.to_pydict() == {"id": [2, 4], "name": [None, "d"]}
    assert compact.ops is not None
    assert compact.ops.to_pylist() == [Op.DELETE, Op.UPDATE_INSERT]
    assert compact.cardinality == compact.num_rows == 2


def test_compact_without_ops_keeps_insert_only() -> None:
    compact = Chunk(BATCH, visibility=[True, False, False, False]).compact()
    assert compact.ops is None
    assert compact.batch.to_pydict() == {"id": [1], "name": ["a"]}


def test_compact_returns_self_when_there_is_no_mask() -> None:
    chunk = Chunk(BATCH, OPS)
    assert chunk.compact() is chunk


def test_compact_of_an_all_visible_mask_drops_the_mask_without_copying() -> None:
    chunk = Chunk(BATCH, OPS, visibility=[True] * 4)
    compact = chunk.compact()
    assert compact.visibility is None
    assert compact.batch is chunk.batch
    assert compact.ops is chunk.ops


def test_compact_of_an_all_hidden_mask_is_empty() -> None:
    compact = Chunk(BATCH, OPS, visibility=[False] * 4).compact()
    assert compact.num_rows == 0
    assert compact.schema == BATCH.schema


def test_nbytes_counts_batch_ops_and_mask_buffers() -> None:
    plain = Chunk(BATCH)
    assert plain.nbytes == BATCH.get_total_buffer_size()
    ops = pa.array(OPS, pa.int8())
    mask = pa.array([True, False, True, True])
    full = Chunk(BATCH, ops, mask)
    assert full.nbytes == (
        BATCH.get_total_buffer_size() + ops.get_total_buffer_size() + mask.get_total_buffer_size()
    )


def test_nbytes_of_a_slice_counts_the_whole_buffers_it_keeps_alive() -> None:
    big = pa.record_batch({"id": pa.array(range(10_000), pa.int64())})
    assert Chunk(big.slice(0, 10)).nbytes == Chunk(big).nbytes


def test_equals_compares_visible_rows_and_ops() -> None:
    a = Chunk(BATCH, OPS, visibility=[False, True, False, True])
    b = Chunk(
        pa.record_batch({"id": pa.array([2, 4], pa.int64()), "name": pa.array([None, "d"])}),
        [Op.DELETE, Op.UPDATE_INSERT],
    )
    assert a.equals(b)
    assert b.equals(a)
    assert not a.equals(b.with_ops([Op.DELETE, Op.INSERT]))
    assert not a.equals(Chunk(BATCH, OPS))
    assert Chunk(BATCH).equals(Chunk(BATCH, [0, 0, 0, 0]))


def test_from_pydict_builds_an_insert_only_chunk() -> None:
    chunk = Chunk.from_pydict({"id": [1, 2]})
    assert chunk.num_rows == 2
    assert chunk.ops is None
    assert chunk.visibility is None
    assert chunk.schema.names == ["id"]


@st.composite
def chunks(draw: st.DrawFn) -> tuple[pa.RecordBatch, list[int] | None, list[bool]]:
    n = draw(st.integers(min_value=0, max_value=40))
    ids = draw(
        st.lists(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), min_size=n, max_size=n)
    )
    names = draw(st.lists(st.one_of(st.none(), st.text(max_size=5)), min_size=n, max_size=n))
    batch = pa.record_batch({"id": pa.array(ids, pa.int64()), "name": pa.array(names, pa.string())})
    ops = draw(st.one_of(st.none(), st.lists(st.sampled_from(list(Op)), min_size=n, max_size=n)))
    mask = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    offset = draw(st.integers(min_value=0, max_value=n))
    # Sometimes a slice, so offsets are exercised too.
    if offset:
        batch = batch.slice(offset)
        ops = None if ops is None else ops[offset:]
        mask = mask[offset:]
    return batch, ops, mask


@given(chunks())
def test_compact_equals_filtering_with_pyarrow(
    case: tuple[pa.RecordBatch, list[int] | None, list[bool]],
) -> None:
    batch, ops, mask = case
    chunk = Chunk(batch, ops, mask)
    compact = chunk.compact()
    arrow_mask = pa.array(mask, pa.bool_())
    assert compact.visibility is None
    assert compact.batch.equals(batch.filter(arrow_mask))
    expected_ops = (
        [0] * sum(mask) if ops is None else [o for o, v in zip(ops, mask, strict=True) if v]
    )
    assert compact.ops_numpy().tolist() == expected_ops
    assert chunk.cardinality == compact.num_rows == sum(mask)


# Barrier.


def test_barrier_defaults_to_a_plain_barrier_without_mutation() -> None:
    barrier = Barrier(EPOCH)
    assert barrier.kind is BarrierKind.BARRIER
    assert barrier.mutation is None


@pytest.mark.parametrize("epoch", [(2, 1), 2, None, {"curr": 2, "prev": 1}])
def test_barrier_epoch_must_be_an_epoch_pair(epoch: Any) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Barrier(epoch)
    assert info.value.argument == "Barrier.epoch"
    assert info.value.got is epoch


@pytest.mark.parametrize("kind", ["checkpoint", None, 1])
def test_barrier_kind_must_be_a_barrier_kind(kind: Any) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Barrier(EPOCH, kind)
    assert info.value.argument == "Barrier.kind"
    assert info.value.got is kind


@pytest.mark.parametrize("mutation", [Pause, "pause", {}, Split("s")])
def test_barrier_mutation_must_be_a_mutation_instance(mutation: Any) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Barrier(EPOCH, mutation=mutation)
    assert info.value.argument == "Barrier.mutation"
    assert info.value.got is mutation


def test_barrier_with_a_bad_epoch_pair_fails_in_the_pair() -> None:
    with pytest.raises(EpochOrderError):
        Barrier(EpochPair(1, 2))


@pytest.mark.parametrize(
    ("kind", "checkpoint"),
    [(BarrierKind.BARRIER, False), (BarrierKind.CHECKPOINT, True), (BarrierKind.INITIAL, False)],
)
def test_only_checkpoint_barriers_are_checkpoints(kind: BarrierKind, checkpoint: bool) -> None:
    assert Barrier(EPOCH, kind).is_checkpoint is checkpoint


def test_barrier_is_frozen_and_with_mutation_makes_a_new_one() -> None:
    barrier = Barrier(EPOCH, BarrierKind.CHECKPOINT)
    with pytest.raises(dataclasses.FrozenInstanceError):
        barrier.kind = BarrierKind.BARRIER  # type: ignore[misc]
    paused = barrier.with_mutation(Pause())
    assert paused == Barrier(EPOCH, BarrierKind.CHECKPOINT, Pause())
    assert barrier.mutation is None
    assert paused.with_mutation(None) == barrier


def test_initial_splits_and_pause_on_startup_come_from_add() -> None:
    splits = (Split("orders-0"), Split("orders-1", offset=41))
    barrier = Barrier(EPOCH, BarrierKind.INITIAL, Add({1: splits}, pause=True))
    assert barrier.initial_splits(1) == splits
    assert barrier.initial_splits(2) is None
    assert barrier.is_pause_on_startup()
    assert not Barrier(EPOCH, mutation=Add({1: splits})).is_pause_on_startup()


def test_initial_splits_is_none_without_add() -> None:
    for mutation in (None, Pause(), SourceChangeSplit({1: [Split("s")]})):
        barrier = Barrier(EPOCH, mutation=mutation)
        assert barrier.initial_splits(1) is None
        assert not barrier.is_pause_on_startup()


@pytest.mark.parametrize(
    ("mutation", "pause", "resume"),
    [(Pause(), True, False), (Resume(), False, True), (None, False, False), (Add(), False, False)],
)
def test_is_pause_and_is_resume(mutation: Any, pause: bool, resume: bool) -> None:
    barrier = Barrier(EPOCH, mutation=mutation)
    assert barrier.is_pause() is pause
    assert barrier.is_resume() is resume


def test_throttle_for_reports_change_and_rate_per_actor() -> None:
    barrier = Barrier(EPOCH, mutation=Throttle({1: 100.0, 2: None, 3: 0}))
    assert barrier.throttle_for(1) == (True, 100.0)
    assert barrier.throttle_for(2) == (True, None)  # changed to unlimited
    assert barrier.throttle_for(3) == (True, 0)  # changed to paused
    assert barrier.throttle_for(4) == (False, None)
    assert Barrier(EPOCH, mutation=Pause()).throttle_for(1) == (False, None)
    assert Barrier(EPOCH).throttle_for(1) == (False, None)


def test_new_splits_from_source_change_split_and_update() -> None:
    splits = (Split("a"), Split("b", 7))
    assert Barrier(EPOCH, mutation=SourceChangeSplit({5: splits})).new_splits(5) == splits
    assert Barrier(EPOCH, mutation=Update(splits={5: splits})).new_splits(5) == splits
    assert Barrier(EPOCH, mutation=Update(splits={5: splits})).new_splits(6) is None
    assert Barrier(EPOCH, mutation=Add({5: splits})).new_splits(5) is None
    assert Barrier(EPOCH).new_splits(5) is None


def test_new_vnode_bitmap_from_update_only() -> None:
    left, right = VnodeBitmap.split(2)
    barrier = Barrier(EPOCH, mutation=Update(vnode_bitmaps={1: left, 2: right}))
    assert barrier.new_vnode_bitmap(1) == left
    assert barrier.new_vnode_bitmap(2) == right
    assert barrier.new_vnode_bitmap(3) is None
    assert Barrier(EPOCH, mutation=Stop({1})).new_vnode_bitmap(1) is None
    assert Barrier(EPOCH).new_vnode_bitmap(1) is None


def test_is_stop_for_stop_and_update_dropped_actors() -> None:
    stop = Barrier(EPOCH, mutation=Stop({1, 2}))
    assert stop.is_stop(1)
    assert stop.is_stop(2)
    assert not stop.is_stop(3)
    update = Barrier(EPOCH, mutation=Update(dropped_actors=frozenset({3})))
    assert update.is_stop(3)
    assert not update.is_stop(1)
    assert not Barrier(EPOCH, mutation=Pause()).is_stop(1)
    assert not Barrier(EPOCH).is_stop(1)


# Mutations.


@pytest.mark.parametrize(
    ("mutation", "attribute", "value"),
    [
        (Add(), "pause", True),
        (Throttle({1: 1.0}), "rates", {}),
        (SourceChangeSplit({}), "splits", {}),
        (Update(), "dropped_actors", frozenset({1})),
        (Stop({1}), "actors", frozenset()),
        (Split("s"), "offset", 3),
    ],
)
def test_mutations_are_frozen(mutation: Any, attribute: str, value: Any) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(mutation, attribute, value)


def test_mutation_mappings_are_read_only_copies() -> None:
    splits: dict[int, list[Split]] = {1: [Split("a")]}
    rates: dict[int, float | None] = {1: 5.0}
    left, right = VnodeBitmap.split(2)
    bitmaps = {1: left}
    add = Add(splits)
    change = SourceChangeSplit(splits)
    update = Update(splits=splits, vnode_bitmaps=bitmaps)
    throttle = Throttle(rates)
    splits[2] = [Split("b")]
    splits[1].append(Split("c"))
    rates[1] = None
    bitmaps[1] = right
    assert dict(add.splits) == {1: (Split("a"),)}
    assert dict(change.splits) == {1: (Split("a"),)}
    assert dict(update.splits) == {1: (Split("a"),)}
    assert dict(update.vnode_bitmaps) == {1: left}
    assert dict(throttle.rates) == {1: 5.0}
    for mapping in (add.splits, change.splits, update.splits, update.vnode_bitmaps):
        with pytest.raises(TypeError):
            mapping[9] = ()  # type: ignore[index]
    with pytest.raises(TypeError):
        throttle.rates[9] = 1.0  # type: ignore[index]


def test_actor_sets_are_frozen_copies() -> None:
    actors = {1, 2}
    stop = Stop(actors)  # type: ignore[arg-type]
    update = Update(dropped_actors=actors)  # type: ignore[arg-type]
    actors.add(3)
    assert stop.actors == frozenset({1, 2})
    assert update.dropped_actors == frozenset({1, 2})
    assert isinstance(stop.actors, frozenset)


@pytest.mark.parametrize("actor", [-1, "1", 1.0, True, None])
def test_bad_actor_id_in_a_mapping_is_invalid(actor: Any) -> None:
    for build, argument in (
        (lambda: Add({actor: []}), "Add.splits"),
        (lambda: SourceChangeSplit({actor: []}), "SourceChangeSplit.splits"),
        (lambda: Update(splits={actor: []}), "Update.splits"),
        (lambda: Update(vnode_bitmaps={actor: VnodeBitmap.full()}), "Update.vnode_bitmaps"),
        (lambda: Throttle({actor: 1.0}), "Throttle.rates"),
    ):
        with pytest.raises(InvalidArgumentError) as info:
            build()
        assert info.value.argument == argument
        assert info.value.got is actor


@pytest.mark.parametrize("actor", [-1, "1", 1.0, True, None])
def test_bad_actor_id_in_a_set_is_invalid(actor: Any) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Stop({0, actor})  # type: ignore[arg-type]
    assert info.value.argument == "Stop.actors"
    assert info.value.got is actor
    with pytest.raises(InvalidArgumentError) as info:
        Update(dropped_actors=frozenset({0, actor}))
    assert info.value.argument == "Update.dropped_actors"
    assert info.value.got is actor


@pytest.mark.parametrize("mapping", [[(1, 2.0)], None, "x"])
def test_non_mapping_is_invalid(mapping: Any) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Throttle(mapping)
    assert info.value.argument == "Throttle.rates"
    assert info.value.got is mapping


@pytest.mark.parametrize("value", ["orders-3", ["orders-3"], [Split("a"), ("b", 1)], [None]])
def test_split_assignment_values_must_be_splits(value: Any) -> None:
    for build, argument in (
        (lambda: Add({1: value}), "Add.splits"),
        (lambda: SourceChangeSplit({1: value}), "SourceChangeSplit.splits"),
        (lambda: Update(splits={1: value}), "Update.splits"),
    ):
        with pytest.raises(InvalidArgumentError) as info:
            build()
        assert info.value.argument == argument


def test_single_split_instead_of_a_sequence_is_invalid_argument() -> None:
    with pytest.raises(InvalidArgumentError):
        Add({1: Split("a")})  # type: ignore[dict-item]


def test_update_vnode_bitmap_values_must_be_bitmaps() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Update(vnode_bitmaps={1: [True] * 256})  # type: ignore[dict-item]
    assert info.value.argument == "vnode_bitmaps"


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"split_id": ""}, "split_id"),
        ({"split_id": 3}, "split_id"),
        ({"split_id": None}, "split_id"),
        ({"split_id": "s", "offset": -2}, "offset"),
        ({"split_id": "s", "offset": 1.5}, "offset"),
        ({"split_id": "s", "offset": "10"}, "offset"),
        ({"split_id": "s", "offset": True}, "offset"),
    ],
)
def test_bad_split_is_invalid(kwargs: dict[str, Any], argument: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Split(**kwargs)
    assert info.value.argument == argument


def test_split_offset_minus_one_and_none_are_accepted() -> None:
    assert Split("s", -1).offset == -1
    assert Split("s").offset is None


@pytest.mark.parametrize("rate", [-1, -0.5, "10", [1.0]])
def test_negative_or_non_numeric_throttle_rate_is_invalid(rate: Any) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Throttle({1: rate})
    assert info.value.argument == "Throttle.rates"
    assert info.value.got == rate


def test_nan_throttle_rate_is_invalid() -> None:
    with pytest.raises(InvalidArgumentError):
        Throttle({1: float("nan")})


def test_add_defaults() -> None:
    add = Add()
    assert dict(add.splits) == {}
    assert add.pause is False
    assert Pause() == Pause()
    assert Resume() == Resume()


# Watermark.


def test_watermark_holds_column_and_value() -> None:
    watermark = Watermark("ts", 10)
    assert (watermark.column, watermark.value) == ("ts", 10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        watermark.value = 11  # type: ignore[misc]


@pytest.mark.parametrize(
    ("column", "value", "argument"),
    [
        ("", 1, "Watermark.column"),
        (None, 1, "Watermark.column"),
        (3, 1, "Watermark.column"),
        ("ts", None, "Watermark.value"),
    ],
)
def test_bad_watermark_is_invalid(column: Any, value: Any, argument: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Watermark(column, value)
    assert info.value.argument == argument
