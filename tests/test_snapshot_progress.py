"""The snapshot backfill's bookkeeping: the owed epochs, and the rule that the allowed lag only
shrinks (after RisingWave's ``UpstreamBuffer``), checked against random barrier sequences."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from barrierflow import InvalidArgumentError
from barrierflow.actors.backfill.snapshot_progress import BackfillPhase, SnapshotProgress


@given(
    owed_at_start=st.integers(0, 40),
    replays=st.lists(st.integers(0, 5), min_size=1, max_size=200),
)
def test_the_allowed_lag_only_shrinks_and_the_backfill_reaches_forwarding(
    owed_at_start: int, replays: list[int]
) -> None:
    # Between two live barriers the backfill replays some owed epochs of its own accord (any
    # number, even none); each barrier closes one more epoch and forces what the rule asks.
    progress = SnapshotProgress.new(100, range(4))
    progress.pending = list(range(101, 101 + owed_at_start))
    progress.start_change_log()
    epoch = 101 + owed_at_start
    lags = [progress.owed]
    for free in replays:
        for _ in range(min(free, progress.owed)):
            progress.epoch_replayed()
        progress.on_closed(epoch)
        epoch += 1
        while progress.must_replay():
            progress.epoch_replayed()
        progress.after_barrier()
        lags.append(progress.owed)
        if progress.phase is BackfillPhase.FORWARD:
            break
    assert lags[1:] == sorted(lags[1:], reverse=True)  # never grows after the first barrier
    if len(replays) > 2 * owed_at_start + 2:
        # Half an epoch less allowed per barrier: at most 2 x the initial lag (+2) barriers.
        assert progress.phase is BackfillPhase.FORWARD
        assert progress.owed == 0


def test_owed_epochs_are_kept_in_order_and_replayed_oldest_first() -> None:
    progress = SnapshotProgress.new(10, range(2))
    for epoch in (11, 12, 15):
        progress.on_closed(epoch)
    assert progress.pending == [11, 12, 15]
    with pytest.raises(InvalidArgumentError):
        progress.on_closed(12)  # not after the owed ones
    progress.start_change_log()
    progress.log_emitted(7)
    assert (progress.epoch_replayed(), progress.replayed, progress.log_offset) == (11, 11, 0)


def test_progress_round_trips_through_its_state_rows() -> None:
    progress = SnapshotProgress.new(7, range(3))
    progress.emitted(1, [42], 5)
    progress.vnode_done(0)
    rows = progress.rows_to_save()
    assert sorted(rows) == ["progress", "vnode:0", "vnode:1", "vnode:2"]
    assert progress.rows_to_save().keys() == {"progress"}  # only what changed since
    restored = SnapshotProgress.restore(rows, range(3))
    assert restored is not None
    assert restored.vnodes[1].after == [42]
    assert restored.unfinished_vnodes() == [1, 2]
    assert restored.rows == 5
    assert SnapshotProgress.restore({}, range(3)) is None
