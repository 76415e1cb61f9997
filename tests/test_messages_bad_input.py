"""Bad input to the message vocabulary: typed errors that say what was expected and got."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from barrierflow.channels import (
    Barrier,
    Chunk,
    EpochClock,
    EpochPair,
    Op,
    VnodeBitmap,
    Watermark,
    compute_vnodes,
    epoch_from_unix_ms,
    physical_time_ms,
)
from barrierflow.errors import EpochOrderError, InvalidArgumentError
from barrierflow.testing import FakeClock

BATCH = pa.record_batch({"id": pa.array([1, 2, 3], pa.int64())})


@pytest.mark.parametrize(
    ("ops", "got"),
    [([0, 1], "2 op codes"), ([0, 1, 7], 7), ([0, -1, 0], -1), (pa.array([0, None, 1]), "1 nulls")],
)
def test_bad_ops_column_is_rejected(ops: object, got: object) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Chunk(BATCH, ops)
    assert info.value.argument == "ops"
    assert info.value.got == got
    assert "expected" in str(info.value)


@pytest.mark.parametrize(
    "mask",
    [[True, False], np.array([1, 0, 1]), pa.array([1, 0, 1]), "yes", pa.array([True, None, True])],
)
def test_bad_visibility_mask_is_rejected(mask: object) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Chunk(BATCH, visibility=mask)
    assert info.value.argument == "visibility"


def test_with_visibility_shares_data_and_compact_materializes() -> None:
    chunk = Chunk(BATCH, [Op.INSERT, Op.DELETE, Op.INSERT])
    hidden = chunk.with_visibility([True, False, True])
    assert hidden.batch is chunk.batch  # no copy
    assert chunk.visibility is None  # the original is untouched
    assert hidden.cardinality == 2
    compact = hidden.compact()
    assert compact.batch.column("id").to_pylist() == [1, 3]
    assert compact.ops_numpy().tolist() == [Op.INSERT, Op.INSERT]
    assert chunk.compact() is chunk


def test_non_increasing_epochs_are_rejected() -> None:
    with pytest.raises(EpochOrderError) as info:
        EpochPair(5 << 16, 5 << 16)
    assert (info.value.previous, info.value.current) == (5 << 16, 5 << 16)
    with pytest.raises(EpochOrderError):
        EpochPair(6 << 16, 5 << 16).advance(6 << 16)
    with pytest.raises(InvalidArgumentError):
        EpochPair(-1, 0)


@given(readings=st.lists(st.floats(1.7e9, 1.8e9), min_size=1, max_size=30))
def test_epoch_clock_is_strictly_increasing_whatever_the_clock(readings: list[float]) -> None:
    clock = FakeClock()
    epochs = EpochClock(clock=clock)
    seen = []
    for reading in readings:
        clock.set(reading)
        seen.append(epochs.next())
    assert all(b > a for a, b in itertools.pairwise(seen))
    assert all(e & 0xFFFF == 0 for e in seen)


def test_epoch_layout_is_risingwaves() -> None:
    unix_ms = 1_700_000_000_123
    epoch = epoch_from_unix_ms(unix_ms)
    assert epoch == (unix_ms - 1_617_235_200_000) << 16
    assert physical_time_ms(epoch) == unix_ms
    with pytest.raises(InvalidArgumentError):
        epoch_from_unix_ms(0)


def test_vnode_bitmap_of_wrong_size_is_rejected() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        VnodeBitmap(np.zeros(0, dtype=bool))
    assert info.value.argument == "vnode_count"
    with pytest.raises(InvalidArgumentError):
        VnodeBitmap.from_vnodes([300], 256)
    with pytest.raises(InvalidArgumentError):
        VnodeBitmap.full(16) | VnodeBitmap.full(32)


def test_barrier_and_watermark_validate_their_fields() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Barrier(5)  # type: ignore[arg-type]
    assert info.value.argument == "Barrier.epoch"
    with pytest.raises(InvalidArgumentError):
        Watermark("", 1)


def test_vnode_hash_is_stable_across_runs() -> None:
    # Pinned values: persisted state is partitioned by this hash, so it is a file format.
    # Any change here re-partitions every store and must be deliberate.
    batch = pa.record_batch(
        {
            "i": pa.array([0, 1, 42, -7, 2**40], pa.int64()),
            "s": pa.array(["a", "order-17", "", "ü", "x" * 40]),
            "f": pa.array([0.0, 1.5, -2.25, 1e300, 3.0]),
        }
    )
    assert compute_vnodes(batch, ["i"]).tolist() == [111, 30, 4, 33, 164]
    assert compute_vnodes(batch, ["s"]).tolist() == [4, 204, 145, 249, 29]
    assert compute_vnodes(batch, ["f"]).tolist() == [111, 62, 236, 135, 149]
    assert compute_vnodes(batch, ["i", "s"]).tolist() == [119, 228, 201, 38, 55]
    as_int32 = pa.record_batch({"i": pa.array([0, 1, 42, -7], pa.int32())})
    assert compute_vnodes(as_int32, ["i"]).tolist() == [111, 30, 4, 33]
    sliced = batch.slice(1)
    assert compute_vnodes(sliced, ["s"]).tolist() == [204, 145, 249, 29]
