"""Vnodes: bitmaps that partition the key space, ownership checks, and the stable row hash."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from _timeouts import scaled
from hypothesis import given
from hypothesis import strategies as st

from barrierflow.channels import VnodeBitmap, compute_vnodes
from barrierflow.channels.vnode import DEFAULT_VNODE_COUNT, vnode_owners
from barrierflow.errors import InvalidArgumentError, VnodeOwnershipError

INTS = [0, 1, -1, 42, 1_000_000_007, 2**62, -(2**63)]
STRINGS = ["", "a", "b", "orders-3", "héllo wörld", "x" * 40]
FLOATS = [0.0, 1.5, -2.25, 1e300, float("inf"), float("-inf"), float("nan")]


def vnodes_of(array: pa.Array, vnode_count: int = DEFAULT_VNODE_COUNT) -> list[int]:
    return compute_vnodes(pa.record_batch({"k": array}), ["k"], vnode_count).tolist()


# VnodeBitmap.


def test_default_vnode_count_is_256() -> None:
    assert DEFAULT_VNODE_COUNT == 256
    assert VnodeBitmap.full().vnode_count == 256


def test_from_vnodes_holds_exactly_those_vnodes() -> None:
    bitmap = VnodeBitmap.from_vnodes([5, 1, 5, 200])
    assert bitmap.vnodes() == [1, 5, 200]
    assert bitmap.count() == 3
    assert 5 in bitmap
    assert 6 not in bitmap
    assert -1 not in bitmap
    assert 256 not in bitmap
    assert "5" not in bitmap
    assert not bitmap.is_full()


def test_numpy_integer_vnode_is_in_the_bitmap() -> None:
    assert np.int64(5) in VnodeBitmap.from_vnodes([5])


def test_full_and_empty() -> None:
    assert VnodeBitmap.full().vnodes() == list(range(256))
    assert VnodeBitmap.full().is_full()
    assert VnodeBitmap.empty().vnodes() == []
    assert VnodeBitmap.empty(16).count() == 0
    assert VnodeBitmap.full(16).count() == 16
    assert VnodeBitmap.from_vnodes(range(8), vnode_count=8) == VnodeBitmap.full(8)


def test_mask_is_a_read_only_copy() -> None:
    source = np.zeros(8, dtype=np.bool_)
    bitmap = VnodeBitmap(source)
    source[3] = True
    assert 3 not in bitmap
    assert not bitmap.mask.flags.writeable
    with pytest.raises(ValueError, check=lambda e: type(e) is ValueError):  # numpy's refusal
        bitmap.mask[0] = True


@pytest.mark.parametrize(
    "mask",
    [
        [],
        np.zeros(0, dtype=np.bool_),
        np.zeros((4, 4), dtype=np.bool_),
        [1, 0, 1],
        np.array([0.0, 1.0]),
        np.zeros((1 << 15) + 1, dtype=np.bool_),
    ],
)
def test_bad_mask_is_invalid(mask: Any) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        VnodeBitmap(mask)
    assert info.value.argument in {"mask", "vnode_count"}


@pytest.mark.parametrize("vnode", [-1, 256, 1000, "3", 2.0, None])
def test_from_vnodes_out_of_range_vnode_is_invalid(vnode: Any) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        VnodeBitmap.from_vnodes([1, vnode])
    assert info.value.argument == "vnodes"
    assert info.value.got is vnode


@pytest.mark.parametrize("vnode_count", [0, -1, (1 << 15) + 1, 8.0, "256"])
def test_bad_vnode_count_is_invalid(vnode_count: Any) -> None:
    for build in (
        lambda: VnodeBitmap.full(vnode_count),
        lambda: VnodeBitmap.empty(vnode_count),
        lambda: VnodeBitmap.from_vnodes([], vnode_count),
        lambda: VnodeBitmap.split(1, vnode_count),
    ):
        with pytest.raises(InvalidArgumentError) as info:
            build()
        assert info.value.argument == "vnode_count"
        assert info.value.got == vnode_count


@pytest.mark.parametrize("parts", [0, -1, 257, 2.0, None])
def test_split_into_a_bad_number_of_parts_is_invalid(parts: Any) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        VnodeBitmap.split(parts)
    assert info.value.argument == "parts"


@given(st.integers(min_value=1, max_value=256))
def test_split_covers_every_vnode_exactly_once_in_near_equal_contiguous_ranges(parts: int) -> None:
    bitmaps = VnodeBitmap.split(parts)
    assert len(bitmaps) == parts
    stacked = np.stack([b.mask for b in bitmaps])
    assert (stacked.sum(axis=0) == 1).all()
    sizes = [b.count() for b in bitmaps]
    assert min(sizes) >= 1
    assert max(sizes) - min(sizes) <= 1
    for bitmap in bitmaps:
        vnodes = bitmap.vnodes()
        assert vnodes == list(range(vnodes[0], vnodes[-1] + 1))
    owners = vnode_owners(bitmaps)
    assert owners.tolist() == sorted(owners.tolist())


@given(st.integers(min_value=1, max_value=64), st.integers(min_value=1, max_value=64))
def test_split_of_any_vnode_count_covers_every_vnode_exactly_once(
    vnode_count: int, parts: int
) -> None:
    if parts > vnode_count:
        with pytest.raises(InvalidArgumentError):
            VnodeBitmap.split(parts, vnode_count)
        return
    owners = vnode_owners(VnodeBitmap.split(parts, vnode_count))
    assert len(owners) == vnode_count


def test_set_operations() -> None:
    a = VnodeBitmap.from_vnodes([1, 2, 3])
    b = VnodeBitmap.from_vnodes([3, 4])
    assert (a | b).vnodes() == [1, 2, 3, 4]
    assert (a & b).vnodes() == [3]
    assert (a - b).vnodes() == [1, 2]
    assert (b - a).vnodes() == [4]
    assert a.vnodes() == [1, 2, 3]  # operands unchanged
    full = VnodeBitmap.full()
    assert (full - a) | a == full
    assert (full - a) & a == VnodeBitmap.empty()


@given(st.sets(st.integers(0, 255)), st.sets(st.integers(0, 255)))
def test_set_operations_match_python_sets(left: set[int], right: set[int]) -> None:
    a, b = VnodeBitmap.from_vnodes(left), VnodeBitmap.from_vnodes(right)
    assert set((a | b).vnodes()) == left | right
    assert set((a & b).vnodes()) == left & right
    assert set((a - b).vnodes()) == left - right


@pytest.mark.parametrize("op", ["__or__", "__and__", "__sub__"])
def test_set_operations_on_mismatched_sizes_are_invalid(op: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        getattr(VnodeBitmap.full(256), op)(VnodeBitmap.full(128))
    assert info.value.argument == "other"
    assert info.value.got == "128 vnodes"


def test_equality_and_hash_follow_the_vnodes() -> None:
    a = VnodeBitmap.from_vnodes([1, 2])
    b = VnodeBitmap(np.isin(np.arange(256), [1, 2]))
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b}) == 1
    assert a != VnodeBitmap.from_vnodes([1])
    assert VnodeBitmap.empty(8) != VnodeBitmap.empty(16)
    assert a != [1, 2]
    assert a != a.mask


# vnode_owners.


def test_vnode_owners_maps_each_vnode_to_its_bitmap() -> None:
    bitmaps = [VnodeBitmap.from_vnodes([0, 2], 4), VnodeBitmap.from_vnodes([1, 3], 4)]
    assert vnode_owners(bitmaps).tolist() == [0, 1, 0, 1]
    assert vnode_owners([VnodeBitmap.full()]).tolist() == [0] * 256


def test_overlapping_bitmaps_are_vnode_ownership_error_listing_the_doubly_owned() -> None:
    bitmaps = [
        VnodeBitmap.from_vnodes(range(0, 130)),
        VnodeBitmap.from_vnodes(range(128, 256)),
        VnodeBitmap.from_vnodes([5]),
    ]
    with pytest.raises(VnodeOwnershipError) as info:
        vnode_owners(bitmaps)
    assert info.value.overlapping == frozenset({5, 128, 129})
    assert info.value.missing == frozenset()
    assert info.value.argument == "bitmaps"
    assert isinstance(info.value, InvalidArgumentError)


def test_incomplete_bitmaps_are_vnode_ownership_error_listing_the_missing() -> None:
    with pytest.raises(VnodeOwnershipError) as info:
        vnode_owners([VnodeBitmap.from_vnodes(range(0, 100)), VnodeBitmap.from_vnodes([255])])
    assert info.value.missing == frozenset(range(100, 255))
    assert info.value.overlapping == frozenset()


def test_ownership_error_reports_overlap_and_gap_together() -> None:
    with pytest.raises(VnodeOwnershipError) as info:
        vnode_owners(
            [VnodeBitmap.from_vnodes([0, 1], 4), VnodeBitmap.from_vnodes([1, 2], 4)], "writers"
        )
    assert info.value.overlapping == frozenset({1})
    assert info.value.missing == frozenset({3})
    assert info.value.argument == "writers"


def test_vnode_ownership_error_message_says_expected_and_got() -> None:
    with pytest.raises(VnodeOwnershipError) as info:
        vnode_owners([VnodeBitmap.from_vnodes([0, 1], 4), VnodeBitmap.from_vnodes([1, 2], 4)])
    message = str(info.value)
    assert "expected bitmaps that cover every vnode exactly once" in message
    assert "vnodes owned twice [1]" in message
    assert "vnodes owned by nobody [3]" in message


@given(st.lists(st.sets(st.integers(0, 31)), min_size=1, max_size=6))
def test_vnode_owners_accepts_exactly_the_partitions(owned: list[set[int]]) -> None:
    bitmaps = [VnodeBitmap.from_vnodes(vnodes, 32) for vnodes in owned]
    counts = {v: sum(v in s for s in owned) for v in range(32)}
    overlapping = {v for v, c in counts.items() if c > 1}
    missing = {v for v, c in counts.items() if c == 0}
    if overlapping or missing:
        with pytest.raises(VnodeOwnershipError) as info:
            vnode_owners(bitmaps)
        assert info.value.overlapping == overlapping
        assert info.value.missing == missing
    else:
        owners = vnode_owners(bitmaps)
        assert all(v in owned[owners[v]] for v in range(32))


def test_vnode_owners_of_no_bitmaps_is_invalid() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        vnode_owners([])
    assert type(info.value) is InvalidArgumentError
    assert info.value.argument == "bitmaps"


def test_vnode_owners_of_mixed_sizes_is_invalid() -> None:
    odd = VnodeBitmap.full(128)
    with pytest.raises(InvalidArgumentError) as info:
        vnode_owners([VnodeBitmap.empty(256), odd])
    assert type(info.value) is InvalidArgumentError
    assert info.value.got is odd


def test_vnode_owners_of_a_non_bitmap_is_invalid() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        vnode_owners([VnodeBitmap.full(), "all"])  # type: ignore[list-item]
    assert info.value.got == "all"


def test_vnode_owners_of_a_non_bitmap_first_is_invalid() -> None:
    with pytest.raises(InvalidArgumentError):
        vnode_owners(["all"])  # type: ignore[list-item]


# compute_vnodes: bad input.

KEYED = pa.record_batch(
    {"id": pa.array([1, 2], pa.int64()), "tags": pa.array([[1], [2, 3]], pa.list_(pa.int64()))}
)


@pytest.mark.parametrize(
    ("keys", "got"),
    [
        (["missing"], "missing"),
        (["id", "missing"], "missing"),
        ([], []),
        ("id", "id"),
        ([0], 0),
        (["tags"], "tags: list<item: int64>"),
    ],
)
def test_bad_key_columns_are_invalid(keys: Any, got: Any) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        compute_vnodes(KEYED, keys)
    assert info.value.argument == "key_columns"
    assert info.value.got == got


@pytest.mark.parametrize("typ", [pa.null(), pa.decimal128(10, 2), pa.struct([("a", pa.int8())])])
def test_unhashable_key_types_are_invalid(typ: pa.DataType) -> None:
    batch = pa.record_batch({"k": pa.nulls(2, typ)})
    with pytest.raises(InvalidArgumentError) as info:
        compute_vnodes(batch, ["k"])
    assert info.value.argument == "key_columns"


def test_month_day_nano_interval_key_is_invalid() -> None:
    # Arrow counts intervals as temporal, but the hash covers only temporal types that are one
    # integer (dates, times, timestamps, durations); an interval is three, so it is refused up
    # front, naming the column and its type, rather than failing inside the hash.
    batch = pa.record_batch(
        {"k": pa.array([pa.MonthDayNano([1, 2, 3])], pa.month_day_nano_interval())}
    )
    with pytest.raises(InvalidArgumentError) as info:
        compute_vnodes(batch, ["k"])
    assert info.value.argument == "key_columns"
    assert info.value.got == "k: month_day_nano_interval"


@pytest.mark.parametrize("vnode_count", [0, (1 << 15) + 1, 2.5])
def test_compute_vnodes_bad_vnode_count_is_invalid(vnode_count: Any) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        compute_vnodes(KEYED, ["id"], vnode_count)
    assert info.value.argument == "vnode_count"


# compute_vnodes: golden values. Changing the hash re-partitions persisted state, so these
# pins must only ever change together with a migration.


def test_golden_vnodes_of_int64_keys() -> None:
    assert vnodes_of(pa.array(INTS, pa.int64())) == [111, 30, 55, 4, 245, 148, 160]


def test_golden_vnodes_of_int64_keys_over_32768_vnodes() -> None:
    assert vnodes_of(pa.array(INTS, pa.int64()), 32768) == [
        32367,
        24862,
        28983,
        29188,
        32501,
        19860,
        16800,
    ]


def test_golden_vnodes_of_string_keys() -> None:
    assert vnodes_of(pa.array(STRINGS, pa.string())) == [145, 4, 247, 104, 144, 29]


def test_golden_vnodes_of_float_keys() -> None:
    assert vnodes_of(pa.array(FLOATS, pa.float64())) == [111, 62, 236, 135, 65, 199, 255]


def test_golden_vnodes_of_bool_and_null_keys() -> None:
    assert vnodes_of(pa.array([True, False, None], pa.bool_())) == [30, 111, 146]


def test_golden_vnodes_of_a_two_column_key_depend_on_column_order() -> None:
    batch = pa.record_batch(
        {"a": pa.array([1, 1, 2, 2], pa.int64()), "b": pa.array(["x", "y", "x", "y"])}
    )
    assert compute_vnodes(batch, ["a", "b"]).tolist() == [92, 98, 16, 185]
    assert compute_vnodes(batch, ["b", "a"]).tolist() == [182, 216, 79, 139]


def test_compute_vnodes_returns_int64_in_range() -> None:
    batch = pa.record_batch({"k": pa.array(range(1000), pa.int64())})
    for vnode_count in (1, 7, 256, 1 << 15):
        vnodes = compute_vnodes(batch, ["k"], vnode_count)
        assert vnodes.dtype == np.int64
        assert len(vnodes) == 1000
        assert vnodes.min() >= 0
        assert vnodes.max() < vnode_count


def test_compute_vnodes_of_a_table_matches_the_batch() -> None:
    batch = pa.record_batch({"k": pa.array(STRINGS), "i": pa.array(range(len(STRINGS)))})
    table = pa.Table.from_batches([batch.slice(0, 2), batch.slice(2)])
    assert compute_vnodes(table, ["k", "i"]).tolist() == compute_vnodes(batch, ["k", "i"]).tolist()


def test_compute_vnodes_of_an_empty_batch_is_empty() -> None:
    for typ in (pa.int64(), pa.string(), pa.float32()):
        assert vnodes_of(pa.array([], typ)) == []


_SUBPROCESS = """
import json, sys
import pyarrow as pa
from barrierflow.channels import compute_vnodes
ints, strings, floats = json.loads(sys.stdin.read())
out = []
for values, typ in ((ints, pa.int64()), (strings, pa.string()), (floats, pa.float64())):
    batch = pa.record_batch({"k": pa.array(values, typ)})
    out.append(compute_vnodes(batch, ["k"]).tolist())
print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.subprocess
def test_vnodes_are_stable_across_processes_with_different_hash_seeds() -> None:
    finite = [f for f in FLOATS if f == f and abs(f) != float("inf")]
    here = [
        vnodes_of(pa.array(INTS, pa.int64())),
        vnodes_of(pa.array(STRINGS, pa.string())),
        vnodes_of(pa.array(finite, pa.float64())),
    ]
    payload = json.dumps([INTS, STRINGS, finite])
    for seed in ("1", "12345"):
        result = subprocess.run(
            [sys.executable, "-c", _SUBPROCESS],
            input=payload,
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
            timeout=scaled(60),
        )
        assert json.loads(result.stdout) == here


# compute_vnodes: the hash depends on the value only (see barrierflow.channels._hash).


@pytest.mark.parametrize(
    "typ",
    [pa.int8(), pa.int16(), pa.int32(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()],
)
def test_integer_width_does_not_change_the_vnode(typ: pa.DataType) -> None:
    values = [0, 1, 5, 100, 127]
    assert vnodes_of(pa.array(values, typ)) == vnodes_of(pa.array(values, pa.int64()))


def test_negative_int32_lands_with_negative_int64() -> None:
    values = [-1, -5, -(2**31)]
    assert vnodes_of(pa.array(values, pa.int32())) == vnodes_of(pa.array(values, pa.int64()))


def test_temporal_values_hash_like_their_integers() -> None:
    ints32 = pa.array([0, 5, 19_000], pa.int32())
    ints64 = pa.array([0, 5, 19_000], pa.int64())
    assert vnodes_of(ints32.cast(pa.date32())) == vnodes_of(ints32)
    assert vnodes_of(ints64.cast(pa.timestamp("ms"))) == vnodes_of(ints64)
    assert vnodes_of(ints64.cast(pa.duration("us"))) == vnodes_of(ints64)


def test_negative_zero_lands_with_zero() -> None:
    assert vnodes_of(pa.array([-0.0], pa.float64())) == vnodes_of(pa.array([0.0], pa.float64()))
    assert vnodes_of(pa.array([-0.0], pa.float32())) == vnodes_of(pa.array([0.0], pa.float64()))


def test_every_quiet_nan_lands_together() -> None:
    nans = np.array([0x7FF8000000000000, 0xFFF8000000000000, 0x7FF8000000000123], np.uint64)
    as_floats = nans.view(np.float64)
    assert np.isnan(as_floats).all()
    vnodes = vnodes_of(pa.array(as_floats))
    assert vnodes == [255, 255, 255]
    assert vnodes == vnodes_of(pa.array([float("nan")] * 3, pa.float32()))


def test_signaling_nan_lands_with_quiet_nan() -> None:
    signaling = np.array([0x7FF0000000000001, 0xFFF0000000000001], np.uint64).view(np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert vnodes_of(pa.array(signaling)) == [255, 255]


def test_signaling_nan_hashes_without_a_warning() -> None:
    signaling = np.array([0x7FF0000000000001], np.uint64).view(np.float64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        vnodes_of(pa.array(signaling))
    assert [str(warning.message) for warning in caught] == []


def test_float32_and_float64_of_the_same_value_land_together() -> None:
    values = [1.5, -2.25, 1024.0, float("inf")]
    assert vnodes_of(pa.array(values, pa.float32())) == vnodes_of(pa.array(values, pa.float64()))


def test_dictionary_encoded_strings_hash_like_plain_strings() -> None:
    plain = pa.array(["a", "b", None, "a", "orders-3", ""], pa.string())
    assert vnodes_of(plain.dictionary_encode()) == vnodes_of(plain)


def test_sliced_arrays_hash_like_unsliced() -> None:
    strings = pa.array(["zz", *STRINGS, None, "tail"], pa.string())
    assert vnodes_of(strings.slice(1, len(STRINGS))) == vnodes_of(pa.array(STRINGS))
    ints = pa.array([7, *INTS, 8], pa.int64())
    assert vnodes_of(ints.slice(1, len(INTS))) == vnodes_of(pa.array(INTS, pa.int64()))
    floats = pa.array([None, 1.5, 2.5], pa.float64())
    assert vnodes_of(floats.slice(1)) == vnodes_of(pa.array([1.5, 2.5]))


def test_string_flavours_hash_alike() -> None:
    expected = vnodes_of(pa.array(STRINGS, pa.string()))
    assert vnodes_of(pa.array(STRINGS, pa.large_string())) == expected
    assert vnodes_of(pa.array(STRINGS, pa.string_view())) == expected
    as_bytes = [s.encode() for s in STRINGS]
    assert vnodes_of(pa.array(as_bytes, pa.binary())) == expected
    assert vnodes_of(pa.array(as_bytes, pa.large_binary())) == expected


def test_nulls_hash_to_a_constant_whatever_the_type() -> None:
    typs = [pa.int64(), pa.int8(), pa.float64(), pa.string(), pa.large_string(), pa.bool_()]
    vnodes = {v for typ in typs for v in vnodes_of(pa.array([None, None], typ))}
    assert vnodes == {146}
    # A null does not land with the zero value its slot happens to hold.
    assert vnodes_of(pa.array([None, 0], pa.int64())) == [146, 111]


@given(st.lists(st.text(max_size=8), min_size=1, max_size=30), st.data())
def test_string_hash_ignores_layout(values: list[str], data: st.DataObject) -> None:
    start = data.draw(st.integers(0, len(values) - 1))
    plain = pa.array(values, pa.string())
    expected = vnodes_of(plain)[start:]
    assert vnodes_of(plain.slice(start)) == expected
    assert vnodes_of(pa.array(values[start:], pa.large_string())) == expected
    assert vnodes_of(plain.dictionary_encode().slice(start)) == expected


@given(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=30))
def test_int_hash_ignores_width(values: list[int]) -> None:
    assert vnodes_of(pa.array(values, pa.int32())) == vnodes_of(pa.array(values, pa.int64()))


def test_sequential_ints_spread_evenly_over_vnodes() -> None:
    vnodes = vnodes_of(pa.array(np.arange(100_000, dtype=np.int64)))
    counts = np.bincount(vnodes, minlength=256)
    mean = 100_000 / 256
    assert counts.min() >= 0.7 * mean
    assert counts.max() <= 1.3 * mean


def test_distinct_strings_spread_evenly_over_vnodes() -> None:
    keys = pa.array([f"user-{i}" for i in range(50_000)])
    counts = np.bincount(vnodes_of(keys), minlength=256)
    mean = 50_000 / 256
    assert counts.min() >= 0.7 * mean
    assert counts.max() <= 1.3 * mean
