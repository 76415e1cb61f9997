"""Epochs: RisingWave's layout, ordered pairs, and a clock that never hands out a stale epoch."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from barrierflow.channels import EpochClock, EpochPair, epoch_from_unix_ms, physical_time_ms
from barrierflow.channels.epoch import EPOCH_BASE_UNIX_MS, EPOCH_PHYSICAL_SHIFT
from barrierflow.errors import EpochOrderError, InvalidArgumentError
from barrierflow.testing import FakeClock

LOW_BITS = (1 << EPOCH_PHYSICAL_SHIFT) - 1
#: A wall-clock time well after the epoch base, in milliseconds since 1970.
NOW_MS = 1_700_000_000_000


class ListClock:
    """A fake ``time.time`` that returns the given readings (seconds) in order."""

    def __init__(self, readings_ms: list[int]) -> None:
        self._readings = [ms / 1000 for ms in readings_ms]
        self._index = 0

    def __call__(self) -> float:
        value = self._readings[self._index]
        self._index += 1
        return value


# Layout.


def test_epoch_base_is_2021_04_01_utc_and_shift_is_16() -> None:
    base = datetime(2021, 4, 1, tzinfo=UTC)
    assert int(base.timestamp() * 1000) == EPOCH_BASE_UNIX_MS
    assert EPOCH_PHYSICAL_SHIFT == 16


def test_epoch_is_milliseconds_since_base_shifted_left_16_bits() -> None:
    assert epoch_from_unix_ms(EPOCH_BASE_UNIX_MS) == 0
    assert epoch_from_unix_ms(EPOCH_BASE_UNIX_MS + 1) == 1 << 16
    assert epoch_from_unix_ms(EPOCH_BASE_UNIX_MS + 1000) == 1000 << 16
    assert epoch_from_unix_ms(NOW_MS) == (NOW_MS - EPOCH_BASE_UNIX_MS) << 16


@given(st.integers(min_value=EPOCH_BASE_UNIX_MS, max_value=EPOCH_BASE_UNIX_MS + (1 << 40)))
def test_epoch_from_unix_ms_round_trips_through_physical_time_ms(unix_ms: int) -> None:
    epoch = epoch_from_unix_ms(unix_ms)
    assert epoch & LOW_BITS == 0
    assert physical_time_ms(epoch) == unix_ms


@given(
    st.integers(min_value=0, max_value=1 << 40),
    st.integers(min_value=0, max_value=LOW_BITS),
)
def test_physical_time_ms_ignores_the_low_16_bits(physical: int, low: int) -> None:
    epoch = (physical << EPOCH_PHYSICAL_SHIFT) | low
    assert physical_time_ms(epoch) == physical + EPOCH_BASE_UNIX_MS


def test_epoch_from_unix_ms_before_base_is_invalid_argument() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        epoch_from_unix_ms(EPOCH_BASE_UNIX_MS - 1)
    assert info.value.argument == "unix_ms"
    assert info.value.got == EPOCH_BASE_UNIX_MS - 1


def test_physical_time_ms_of_negative_epoch_is_invalid_argument() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        physical_time_ms(-1)
    assert info.value.argument == "epoch"
    assert info.value.got == -1


# EpochPair.


def test_epoch_pair_holds_curr_and_prev() -> None:
    pair = EpochPair(curr=5 << 16, prev=4 << 16)
    assert (pair.curr, pair.prev) == (5 << 16, 4 << 16)


def test_epoch_pair_prev_zero_is_the_first_barrier_of_a_fresh_job() -> None:
    assert EpochPair(1, 0).prev == 0


@pytest.mark.parametrize(("curr", "prev"), [(5, 5), (4, 5), (0, 0), (1 << 16, 2 << 16)])
def test_epoch_pair_curr_not_greater_than_prev_is_epoch_order_error(curr: int, prev: int) -> None:
    with pytest.raises(EpochOrderError) as info:
        EpochPair(curr, prev)
    assert info.value.previous == prev
    assert info.value.current == curr
    assert info.value.argument == "EpochPair.curr"
    assert isinstance(info.value, InvalidArgumentError)


def test_epoch_order_error_message_says_expected_and_got() -> None:
    with pytest.raises(EpochOrderError) as info:
        EpochPair(3, 7)
    message = str(info.value)
    assert "expected an epoch greater than 7" in message
    assert "got 3" in message


@pytest.mark.parametrize(
    ("curr", "prev", "argument", "got"),
    [
        (-1, 0, "EpochPair.curr", -1),
        (5, -1, "EpochPair.prev", -1),
        (5.0, 0, "EpochPair.curr", 5.0),
        (5, 1.0, "EpochPair.prev", 1.0),
        ("5", 0, "EpochPair.curr", "5"),
        (True, 0, "EpochPair.curr", True),
        (2, False, "EpochPair.prev", False),
        (None, 0, "EpochPair.curr", None),
    ],
)
def test_epoch_pair_negative_or_non_int_epoch_is_invalid_argument(
    curr: object, prev: object, argument: str, got: object
) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        EpochPair(curr, prev)  # type: ignore[arg-type]
    assert type(info.value) is InvalidArgumentError
    assert info.value.argument == argument
    assert info.value.got is got


def test_epoch_pair_is_frozen() -> None:
    pair = EpochPair(2, 1)
    with pytest.raises(AttributeError):
        pair.curr = 3  # type: ignore[misc]


def test_epoch_pair_advance_moves_curr_into_prev() -> None:
    pair = EpochPair(2 << 16, 1 << 16)
    nxt = pair.advance(3 << 16)
    assert nxt == EpochPair(3 << 16, 2 << 16)
    assert pair == EpochPair(2 << 16, 1 << 16)  # the original is untouched


@pytest.mark.parametrize("curr", [2 << 16, 1 << 16, 0])
def test_epoch_pair_advance_to_an_epoch_not_greater_is_epoch_order_error(curr: int) -> None:
    with pytest.raises(EpochOrderError) as info:
        EpochPair(2 << 16, 1 << 16).advance(curr)
    assert info.value.previous == 2 << 16
    assert info.value.current == curr
    assert info.value.argument == "curr"


def test_epoch_pair_advance_to_a_non_int_is_invalid_argument() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        EpochPair(2, 1).advance(3.5)  # type: ignore[arg-type]
    assert info.value.got == 3.5


# EpochClock.


def test_epoch_clock_bad_last_is_invalid_argument() -> None:
    for bad in (-1, 1.0, "0", None, True):
        with pytest.raises(InvalidArgumentError) as info:
            EpochClock(bad)  # type: ignore[arg-type]
        assert info.value.argument == "last"
        assert info.value.got is bad


def test_epoch_clock_last_starts_at_the_given_epoch_and_follows_next() -> None:
    clock = EpochClock(last=7 << 16, clock=FakeClock(NOW_MS / 1000))
    assert clock.last == 7 << 16
    epoch = clock.next()
    assert clock.last == epoch


def test_moving_clock_gives_the_epoch_of_the_clock_time() -> None:
    fake = FakeClock(NOW_MS / 1000)
    clock = EpochClock(clock=fake)
    for step in range(1, 200):
        ms = NOW_MS + step * 7
        fake.set(ms / 1000)
        epoch = clock.next()
        assert physical_time_ms(epoch) == ms
        assert epoch == epoch_from_unix_ms(ms)


def test_standing_clock_moves_one_millisecond_per_epoch() -> None:
    clock = EpochClock(clock=FakeClock(NOW_MS / 1000))
    epochs = [clock.next() for _ in range(5)]
    assert [physical_time_ms(e) - NOW_MS for e in epochs] == [0, 1, 2, 3, 4]
    assert all(e & LOW_BITS == 0 for e in epochs)


def test_clock_stepping_back_still_gives_increasing_epochs() -> None:
    fake = FakeClock(NOW_MS / 1000)
    clock = EpochClock(clock=fake)
    first = clock.next()
    fake.set((NOW_MS - 60_000) / 1000)  # a minute back
    second = clock.next()
    third = clock.next()
    assert first < second < third
    assert physical_time_ms(second) == NOW_MS + 1
    assert physical_time_ms(third) == NOW_MS + 2
    fake.set((NOW_MS + 10_000) / 1000)  # the clock overtakes again: epochs follow it
    assert physical_time_ms(clock.next()) == NOW_MS + 10_000


def test_clock_before_the_base_gives_epochs_after_last() -> None:
    clock = EpochClock(clock=FakeClock(0.0))
    assert clock.next() == 1 << 16
    assert clock.next() == 2 << 16


def test_epoch_clock_after_recovery_starts_past_the_committed_epoch() -> None:
    committed = epoch_from_unix_ms(NOW_MS + 5_000)
    clock = EpochClock(last=committed, clock=FakeClock(NOW_MS / 1000))
    assert clock.next() == committed + (1 << 16)


def test_epoch_clock_last_with_low_bits_set_still_yields_zero_low_bits() -> None:
    clock = EpochClock(last=(5 << 16) | 123, clock=FakeClock(0.0))
    epoch = clock.next()
    assert epoch == 6 << 16


def test_next_pair_chains_previous_last_into_prev() -> None:
    fake = FakeClock(NOW_MS / 1000)
    clock = EpochClock(clock=fake)
    first = clock.next_pair()
    assert first.prev == 0
    fake.advance(1.0)
    second = clock.next_pair()
    assert second.prev == first.curr
    assert second.curr > first.curr


@given(
    st.lists(
        st.integers(min_value=0, max_value=NOW_MS + 10**9),
        min_size=1,
        max_size=60,
    ),
    st.integers(min_value=0, max_value=1 << 40),
)
def test_any_clock_readings_give_strictly_increasing_epochs_with_zero_low_bits(
    readings_ms: list[int], last: int
) -> None:
    clock = EpochClock(last=last, clock=ListClock(readings_ms))
    previous = last
    for ms in readings_ms:
        epoch = clock.next()
        assert epoch > previous
        assert epoch & LOW_BITS == 0
        # Never behind the clock, and never more than one millisecond past what was needed.
        if ms >= EPOCH_BASE_UNIX_MS:
            assert epoch >= epoch_from_unix_ms(ms)
        floor = ((previous >> EPOCH_PHYSICAL_SHIFT) + 1) << EPOCH_PHYSICAL_SHIFT
        assert epoch == max(floor, epoch_from_unix_ms(max(ms, EPOCH_BASE_UNIX_MS)))
        previous = epoch
