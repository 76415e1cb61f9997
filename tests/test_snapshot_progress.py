"""The snapshot backfill's bookkeeping: the owed epochs, and the rule that the allowed lag only
shrinks (after RisingWave's ``UpstreamBuffer``), checked against random barrier sequences."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from barrierflow.actors.backfill.snapshot_progress import (
    SnapshotPhase,
    SnapshotProgress,
    VnodeProgress,
)
from barrierflow.errors import InvalidArgumentError


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
        if progress.phase is SnapshotPhase.FORWARD:
            break
    assert lags[1:] == sorted(lags[1:], reverse=True)  # never grows after the first barrier
    if len(replays) > 2 * owed_at_start + 2:
        # Half an epoch less allowed per barrier: at most 2 x the initial lag (+2) barriers.
        assert progress.phase is SnapshotPhase.FORWARD
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


def test_a_new_progress_owes_every_vnode_and_saves_every_vnode_row() -> None:
    progress = SnapshotProgress.new(7, [3, 1])
    assert (progress.snapshot_epoch, progress.replayed, progress.phase) == (
        7,
        7,
        SnapshotPhase.SNAPSHOT,
    )
    assert progress.unfinished_vnodes() == [1, 3]
    assert progress.rows_to_save() == {
        "progress": {
            "phase": "snapshot",
            "snapshot_epoch": 7,
            "replayed": 7,
            "log_offset": 0,
            "rows": 0,
        },
        "vnode:1": {"after": None, "rows": 0, "done": False},
        "vnode:3": {"after": None, "rows": 0, "done": False},
    }


def test_the_state_rows_say_how_far_each_vnode_and_the_change_log_got() -> None:
    # What a restart resumes from: per vnode the last key emitted and the rows (the seed's
    # `VnodeBackfillProgress`), and the change-log rows of the oldest owed epoch emitted.
    progress = SnapshotProgress.new(7, range(3))
    progress.rows_to_save()
    progress.emitted(1, [40], 3)
    progress.emitted(1, [42], 2)
    progress.vnode_done(2)
    progress.start_change_log()
    progress.log_emitted(4)
    progress.log_emitted(6)
    assert progress.rows == 15
    assert progress.rows_to_save() == {
        "progress": {
            "phase": "change_log",
            "snapshot_epoch": 7,
            "replayed": 7,
            "log_offset": 10,
            "rows": 15,
        },
        "vnode:1": {"after": [42], "rows": 5, "done": False},
        "vnode:2": {"after": None, "rows": 0, "done": True},
    }


def test_a_restored_progress_is_the_saved_one() -> None:
    saved = {
        "progress": {
            "phase": "change_log",
            "snapshot_epoch": 7,
            "replayed": 9,
            "log_offset": 4,
            "rows": 25,
        },
        "vnode:0": {"after": [3, "x"], "rows": 20, "done": True},
        "vnode:2": {"after": [8, "y"], "rows": 5, "done": False},
        "vnode:5": {"after": [1, "z"], "rows": 1, "done": True},  # not this actor's
    }
    restored = SnapshotProgress.restore(saved, [0, 1, 2])
    assert restored is not None
    assert (
        restored.snapshot_epoch,
        restored.phase,
        restored.replayed,
        restored.log_offset,
        restored.rows,
    ) == (7, SnapshotPhase.CHANGE_LOG, 9, 4, 25)
    assert restored.vnodes == {
        0: VnodeProgress([3, "x"], 20, True),
        1: VnodeProgress(),  # no row: from scratch
        2: VnodeProgress([8, "y"], 5, False),
    }
    assert restored.unfinished_vnodes() == [1, 2]
    assert restored.rows_to_save() == {"progress": saved["progress"]}  # nothing moved
    assert SnapshotProgress.restore({"vnode:0": saved["vnode:0"]}, [0]) is None


def test_a_vnode_row_round_trips() -> None:
    row = VnodeProgress([1, 2], 9, True)
    assert row.to_json() == {"after": [1, 2], "rows": 9, "done": True}
    back = VnodeProgress.from_json(row.to_json())
    assert back == row
    assert (type(back.rows), type(back.done)) == (int, bool)


@pytest.mark.parametrize(
    ("pending", "epoch"),
    [([11, 12], 12), ([11, 12], 11), ([11, 12], 5), ([], True), ([], 12.0), ([], None)],
)
def test_a_closed_epoch_not_after_the_owed_ones_is_refused(pending: list[int], epoch: Any) -> None:
    progress = SnapshotProgress.new(10, range(2))
    progress.pending = list(pending)
    with pytest.raises(InvalidArgumentError) as refused:
        progress.on_closed(epoch)
    assert (refused.value.argument, refused.value.expected, refused.value.got) == (
        "epoch",
        "a closed epoch after the owed ones",
        epoch,
    )
    assert progress.pending == pending


def test_an_epoch_already_replayed_is_not_owed_again() -> None:
    progress = SnapshotProgress.new(10, range(2))
    progress.on_closed(10)  # the snapshot epoch: in the snapshot
    assert progress.pending == []
    progress.on_closed(11)
    assert progress.pending == [11]


@pytest.mark.parametrize(
    ("phase", "owed", "max_lag", "replay"),
    [
        (SnapshotPhase.SNAPSHOT, 3, math.inf, False),  # the snapshot first
        (SnapshotPhase.SNAPSHOT, 1, math.inf, False),
        (SnapshotPhase.FORWARD, 0, 0.0, False),
        (SnapshotPhase.CHANGE_LOG, 0, 0.0, False),  # nothing owed
        (SnapshotPhase.CHANGE_LOG, 1, 3.0, True),  # the only one owed: replayed at once
        (SnapshotPhase.CHANGE_LOG, 2, 3.0, False),  # within the allowed lag
        (SnapshotPhase.CHANGE_LOG, 2, 2.0, False),
        (SnapshotPhase.CHANGE_LOG, 3, 2.0, True),  # more than the allowed lag
        (SnapshotPhase.CHANGE_LOG, 2, 1.5, True),  # half epochs round down
    ],
)
def test_a_barrier_waits_on_replays_while_more_than_the_allowed_lag_is_owed(
    phase: SnapshotPhase, owed: int, max_lag: float, replay: bool
) -> None:
    progress = SnapshotProgress.new(10, range(2))
    progress.phase, progress.max_lag = phase, max_lag
    progress.pending = list(range(11, 11 + owed))
    assert progress.must_replay() is replay


def test_the_allowed_lag_shrinks_by_half_an_epoch_per_barrier_until_nothing_is_owed() -> None:
    # A busy upstream (one more owed epoch per barrier) and no replay between barriers: the
    # barrier replays down to the allowed lag, which then loses half an epoch.
    progress = SnapshotProgress.new(10, range(2))
    progress.pending = [11, 12, 13, 14]
    progress.after_barrier()  # in the snapshot: no lag rule yet
    assert (progress.phase, progress.max_lag) == (SnapshotPhase.SNAPSHOT, math.inf)
    progress.start_change_log()
    assert (progress.phase, progress.max_lag) == (SnapshotPhase.CHANGE_LOG, 4.0)
    epoch, owed, lags = 15, [], []
    while progress.phase is SnapshotPhase.CHANGE_LOG:
        progress.on_closed(epoch)
        epoch += 1
        while progress.must_replay():
            assert progress.epoch_replayed() == progress.replayed
        progress.after_barrier()
        owed.append(progress.owed)
        lags.append(progress.max_lag)
    assert owed == [4, 3, 3, 2, 2, 0]  # the last one owed is replayed at once
    assert lags[:-1] == [3.5, 3.0, 2.5, 2.0, 1.5]
    assert progress.phase is SnapshotPhase.FORWARD
    assert progress.replayed == epoch - 1


def test_the_allowed_lag_is_never_more_than_what_is_owed() -> None:
    progress = SnapshotProgress.new(10, range(2))
    progress.pending = [11, 12, 13, 14]
    progress.start_change_log()
    for _ in range(3):  # replayed between barriers
        progress.epoch_replayed()
    progress.on_closed(15)
    progress.after_barrier()
    assert (progress.owed, progress.max_lag) == (2, 2.0)
    progress.epoch_replayed()
    progress.after_barrier()
    assert (progress.owed, progress.max_lag) == (1, 1.0)


def test_a_replayed_epoch_resets_the_change_log_offset() -> None:
    progress = SnapshotProgress.new(10, range(2))
    progress.pending = [11, 12]
    progress.log_emitted(3)
    assert progress.epoch_replayed() == 11
    assert (progress.pending, progress.replayed, progress.log_offset) == ([12], 11, 0)
