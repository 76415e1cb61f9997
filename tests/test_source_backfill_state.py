"""The source backfill's per-split state machine: each rule of the seed named, the vectorized
form checked against a row-by-row model, and exactly-once over random interleavings."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from barrierflow.actors.backfill.source_backfill_state import (
    BackfillPhase,
    SplitBackfill,
    SplitBackfills,
)
from barrierflow.actors.sources.errors import OffsetOrderError
from barrierflow.actors.sources.split_log import OFFSET_MAJOR, OFFSET_MINOR, SPLIT_COLUMN, Offset
from barrierflow.channels.errors import InvalidArgumentError, ProtocolError

BACKFILLING, CACHING_UP, FINISHED = (
    BackfillPhase.BACKFILLING,
    BackfillPhase.CACHING_UP,
    BackfillPhase.FINISHED,
)


def rows(*pairs: tuple[str, int]) -> pa.RecordBatch:
    """A batch of (split, offset major) rows; offsets ``<major>-0``."""
    return pa.record_batch(
        {
            SPLIT_COLUMN: pa.array([s for s, _ in pairs], pa.string()),
            OFFSET_MAJOR: pa.array([o for _, o in pairs], pa.int64()),
            OFFSET_MINOR: pa.array([0] * len(pairs), pa.int64()),
        }
    )


def off(major: int) -> Offset:
    return Offset(major)


# --- the rules, one test each ------------------------------------------------------------------


def test_offsets_compare_as_numbers_not_text() -> None:
    assert Offset.parse("9-0") < Offset.parse("10-0")
    assert Offset.parse("10-2") < Offset.parse("10-10")
    assert str(Offset.parse("7")) == "7-0"
    with pytest.raises(InvalidArgumentError):
        Offset.parse("10-x")


def test_an_empty_split_at_start_is_finished_at_once() -> None:
    states = SplitBackfills({"a": SplitBackfill()})
    states.set_target("a", None)
    assert states.states["a"].phase is FINISHED
    assert states.on_upstream(rows(("a", 1))).tolist() == [True]


def test_upstream_rows_while_not_started_are_dropped_and_move_the_target_even_down() -> None:
    states = SplitBackfills({"a": SplitBackfill()})
    states.set_target("a", off(100))  # the log's latest offset: a first guess
    assert states.on_upstream(rows(("a", 7), ("a", 8))).tolist() == [False, False]
    assert states.states["a"] == SplitBackfill(BACKFILLING, None, 0, off(8))


def test_upstream_ahead_of_the_backfill_is_dropped_and_moves_the_target() -> None:
    states = SplitBackfills({"a": SplitBackfill(BACKFILLING, off(3), 3, off(5))})
    assert states.on_upstream(rows(("a", 6), ("a", 9))).tolist() == [False, False]
    assert states.states["a"] == SplitBackfill(BACKFILLING, off(3), 3, off(9))


def test_upstream_at_the_backfill_offset_finishes_the_split_exactly() -> None:
    states = SplitBackfills({"a": SplitBackfill(BACKFILLING, off(5), 5, off(9))})
    assert states.on_upstream(rows(("a", 5), ("a", 6))).tolist() == [False, True]
    assert states.states["a"].phase is FINISHED


def test_backfill_ahead_of_upstream_waits_for_it_to_catch_up() -> None:
    states = SplitBackfills({"a": SplitBackfill(BACKFILLING, off(5), 5, off(9))})
    assert states.on_upstream(rows(("a", 2), ("a", 3))).tolist() == [False, False]
    assert states.states["a"] == SplitBackfill(CACHING_UP, off(5), 5, off(9))
    assert states.on_upstream(rows(("a", 4), ("a", 5), ("a", 6))).tolist() == [False, False, True]
    assert states.states["a"].phase is FINISHED


def test_a_compaction_gap_past_the_backfill_offset_emits_that_row_and_finishes() -> None:
    states = SplitBackfills({"a": SplitBackfill(CACHING_UP, off(5), 5, off(5))})
    assert states.on_upstream(rows(("a", 4), ("a", 8))).tolist() == [False, True]
    assert states.states["a"].phase is FINISHED


def test_a_backfill_row_at_or_past_the_target_is_the_last_one_emitted() -> None:
    states = SplitBackfills({"a": SplitBackfill(BACKFILLING, None, 0, off(3))})
    assert states.on_backfill(rows(("a", 1), ("a", 3), ("a", 4))).tolist() == [True, True, False]
    assert states.states["a"] == SplitBackfill(CACHING_UP, off(3), 3, off(3))
    assert states.on_backfill(rows(("a", 5))).tolist() == [False]
    assert states.states["a"].consumed_rows == 4  # every delivered row counts


def test_without_a_target_the_backfill_keeps_going() -> None:
    states = SplitBackfills({"a": SplitBackfill()})
    assert states.on_backfill(rows(("a", 1), ("a", 2))).tolist() == [True, True]
    assert states.states["a"] == SplitBackfill(BACKFILLING, off(2), 2, None)


def test_no_upstream_traffic_after_the_target_reports_caught_up_but_not_finished() -> None:
    states = SplitBackfills({"a": SplitBackfill(), "b": SplitBackfill()})
    states.set_target("a", off(2))
    states.set_target("b", None)
    states.on_backfill(rows(("a", 1), ("a", 2)))
    assert states.caught_up()  # wait_ready() may return
    assert not states.finished()  # but the backfill stage is not left
    assert states.unfinished() == {}


def test_a_backfill_that_read_all_there_is_stops_even_if_its_target_never_comes() -> None:
    states = SplitBackfills(
        {
            "read_all": SplitBackfill(BACKFILLING, off(4), 4, off(5)),  # 5 was deleted
            "behind": SplitBackfill(BACKFILLING, off(2), 2, off(5)),
            "emptied": SplitBackfill(BACKFILLING, None, 0, off(3)),
            "untouched": SplitBackfill(BACKFILLING, None, 0, off(3)),
        }
    )
    states.on_latest("read_all", off(4))
    states.on_latest("behind", off(4))
    states.on_latest("emptied", None)
    states.on_latest("untouched", off(3))
    assert states.states["read_all"] == SplitBackfill(CACHING_UP, off(4), 4, off(5))
    assert states.states["behind"].phase is BACKFILLING
    assert states.states["emptied"].phase is FINISHED
    assert states.states["untouched"].phase is BACKFILLING


def test_rows_of_several_splits_in_one_chunk_are_decided_per_split() -> None:
    states = SplitBackfills(
        {
            "a": SplitBackfill(FINISHED),
            "b": SplitBackfill(BACKFILLING, off(5), 5, off(9)),
            "c": SplitBackfill(CACHING_UP, off(2), 2, off(2)),
        }
    )
    batch = rows(("b", 6), ("a", 1), ("c", 1), ("a", 2), ("c", 2), ("b", 7), ("c", 3))
    assert states.on_upstream(batch).tolist() == [False, True, False, True, False, False, True]
    assert states.states["b"] == SplitBackfill(BACKFILLING, off(5), 5, off(7))
    assert states.states["c"].phase is FINISHED


def test_offsets_that_go_backwards_or_repeat_within_a_split_are_refused() -> None:
    states = SplitBackfills({"a": SplitBackfill(FINISHED), "b": SplitBackfill(FINISHED)})
    with pytest.raises(OffsetOrderError) as backwards:
        states.on_upstream(rows(("a", 1), ("b", 9), ("a", 3), ("b", 2)))
    assert (backwards.value.split, backwards.value.previous, backwards.value.offset) == (
        "b",
        off(9),
        off(2),
    )
    with pytest.raises(OffsetOrderError) as repeated:
        states.on_backfill(rows(("a", 4), ("a", 4)))
    assert repeated.value.offset == off(4)


def test_a_row_of_a_split_the_actor_does_not_own_is_a_protocol_error() -> None:
    states = SplitBackfills({"a": SplitBackfill()})
    with pytest.raises(ProtocolError):
        states.on_upstream(rows(("z", 1)))


def test_split_changes_keep_owned_states_adopt_migrated_ones_and_finish_new_ones() -> None:
    states = SplitBackfills(
        {"a": SplitBackfill(BACKFILLING, off(1), 1, None), "b": SplitBackfill()}
    )
    migrated = SplitBackfill(CACHING_UP, off(4), 4, off(4))
    changed, dropped = states.reassign(["a", "m", "new"], {"m": migrated})
    assert changed
    assert dropped == ["b"]
    assert states.states == {
        "a": SplitBackfill(BACKFILLING, off(1), 1, None),
        "m": migrated,
        "new": SplitBackfill(FINISHED),
    }
    assert states.reassign(["a", "m", "new"], {}) == (False, [])


def test_states_round_trip_through_json() -> None:
    state = SplitBackfill(CACHING_UP, Offset(10, 2), 7, Offset(11, 0))
    assert SplitBackfill.from_json(state.to_json()) == state
    with pytest.raises(InvalidArgumentError):
        SplitBackfill.from_json({"phase": "nope"})


@pytest.mark.parametrize(
    "value",
    [
        {"phase": "nope", "offset": None, "consumed_rows": 0, "target": None},
        {"phase": "backfilling", "offset": None, "consumed_rows": 0},
        {"phase": "backfilling", "offset": "x-1", "consumed_rows": 0, "target": None},
        {"phase": "caching_up", "offset": "3-0", "consumed_rows": None, "target": None},
        {"phase": "finished", "offset": None, "consumed_rows": 0, "target": 5},
    ],
    ids=["phase", "missing-target", "offset", "consumed-rows", "target-type"],
)
def test_a_state_that_is_not_a_split_backfill_state_is_refused_with_what_was_expected(
    value: dict[str, object],
) -> None:
    with pytest.raises(InvalidArgumentError) as bad:
        SplitBackfill.from_json(value)
    assert (bad.value.argument, bad.value.expected, bad.value.got) == (
        "state",
        "a split backfill state (phase, offset, consumed_rows, target)",
        value,
    )


def test_a_split_emptied_before_its_backfill_read_anything_keeps_its_row_count() -> None:
    # The progress counter never goes back: finishing an emptied split keeps what was read.
    states = SplitBackfills({"a": SplitBackfill(BACKFILLING, None, 3, off(5))})
    states.on_latest("a", None)
    assert states.states["a"] == SplitBackfill(FINISHED, None, 3, None)
    assert states.consumed_rows == 3


@pytest.mark.parametrize(
    "value",
    [[("a", SplitBackfill())], {"a": "backfilling"}, {1: SplitBackfill()}],
    ids=["not-a-mapping", "not-a-state", "not-a-name"],
)
def test_states_that_are_not_a_mapping_of_split_to_state_are_refused(value: object) -> None:
    with pytest.raises(InvalidArgumentError) as bad:
        SplitBackfills(value)  # type: ignore[arg-type]
    assert (bad.value.argument, bad.value.expected, bad.value.got) == (
        "states",
        "a mapping of split to SplitBackfill",
        value,
    )


@pytest.mark.parametrize("side", ["upstream", "backfill"])
def test_a_row_of_a_split_not_owned_names_the_side_the_splits_and_the_row(side: str) -> None:
    states = SplitBackfills({"b": SplitBackfill(), "a": SplitBackfill()})
    apply = states.on_upstream if side == "upstream" else states.on_backfill
    with pytest.raises(ProtocolError) as bad:
        apply(rows(("a", 1), ("z", 1)))
    assert str(bad.value) == (
        f"source backfill: expected rows of its splits ['a', 'b'] from the {side}, got a row "
        "of split 'z'"
    )


# --- the vectorized form against a row-by-row model of the seed ---------------------------------


def model_upstream(state: SplitBackfill, offset: Offset) -> tuple[SplitBackfill, bool]:
    """The seed's handle_upstream_row, one row at a time."""
    visible = False
    phase, at = state.phase, state.offset
    if phase is BACKFILLING and at is not None:
        if offset == at:
            state = replace(state, phase=FINISHED, offset=None)
        elif offset < at:
            state = replace(state, phase=CACHING_UP)
    elif phase is CACHING_UP:
        assert at is not None
        if offset > at:
            visible = True
            state = replace(state, phase=FINISHED, offset=None)
        elif offset == at:
            state = replace(state, phase=FINISHED, offset=None)
    elif phase is FINISHED:
        visible = True
    if state.phase is BACKFILLING:
        state = replace(state, target=offset)
    return state, visible


def model_backfill(state: SplitBackfill, offset: Offset) -> tuple[SplitBackfill, bool]:
    """The seed's handle_backfill_row, one row at a time."""
    state = replace(state, consumed_rows=state.consumed_rows + 1)
    if state.phase is not BACKFILLING:
        return state, False
    if state.target is not None and offset >= state.target:
        return replace(state, phase=CACHING_UP, offset=offset), True
    return replace(state, offset=offset), True


SPLITS = ["a", "b", "c"]
offsets = st.builds(Offset, st.integers(0, 12), st.integers(0, 2))
phases = st.sampled_from(list(BackfillPhase))


@st.composite
def split_states(draw: st.DrawFn) -> SplitBackfill:
    phase = draw(phases)
    offset = None if phase is FINISHED else draw(st.none() | offsets)
    if phase is CACHING_UP and offset is None:
        offset = draw(offsets)
    return SplitBackfill(phase, offset, draw(st.integers(0, 5)), draw(st.none() | offsets))


@st.composite
def batches(draw: st.DrawFn) -> pa.RecordBatch:
    """Rows of random splits, each split's offsets strictly increasing, splits interleaved."""
    per_split = {
        s: sorted(draw(st.sets(offsets, max_size=5)))
        for s in draw(st.sets(st.sampled_from(SPLITS)))
    }
    order = [s for s, offs in per_split.items() for _ in offs]
    order = draw(st.permutations(order))
    position = dict.fromkeys(per_split, 0)
    split_col, major, minor = [], [], []
    for split in order:
        offset = per_split[split][position[split]]
        position[split] += 1
        split_col.append(split)
        major.append(offset.major)
        minor.append(offset.minor)
    return pa.record_batch(
        {
            SPLIT_COLUMN: pa.array(split_col, pa.string()),
            OFFSET_MAJOR: pa.array(major, pa.int64()),
            OFFSET_MINOR: pa.array(minor, pa.int64()),
        }
    )


@settings(max_examples=300)
@given(
    st.fixed_dictionaries({s: split_states() for s in SPLITS}),
    st.lists(st.tuples(st.booleans(), batches()), max_size=6),
)
def test_vectorized_states_match_the_row_by_row_model(
    initial: dict[str, SplitBackfill], steps: list[tuple[bool, pa.RecordBatch]]
) -> None:
    states = SplitBackfills(initial)
    model = dict(initial)
    for upstream, batch in steps:
        got = states.on_upstream(batch) if upstream else states.on_backfill(batch)
        expected = []
        for split, major, minor in zip(
            batch.column(SPLIT_COLUMN).to_pylist(),
            batch.column(OFFSET_MAJOR).to_pylist(),
            batch.column(OFFSET_MINOR).to_pylist(),
            strict=True,
        ):
            step = model_upstream if upstream else model_backfill
            model[split], visible = step(model[split], Offset(major, minor))
            expected.append(visible)
        assert got.tolist() == expected
        assert states.states == model


# --- exactly once over random interleavings ----------------------------------------------------


@settings(max_examples=300)
@given(st.data())
def test_every_record_is_emitted_exactly_once_in_offset_order(data: st.DataObject) -> None:
    """A log per split that keeps growing; the live source has read the first ``live[s]``
    records when the job starts (the job's upstream delivers the rest as they come); the
    backfill reads history from the start. Whatever the interleaving and batch sizes, the job
    emits every record of every split once, in order."""
    logs: dict[str, list[Offset]] = {}
    live: dict[str, int] = {}
    for split in SPLITS:
        majors = sorted(data.draw(st.sets(st.integers(0, 60), max_size=25), label=split))
        logs[split] = [Offset(m) for m in majors]
        live[split] = data.draw(st.integers(0, len(majors)), label=f"{split} live")
    # What exists when the job starts: the live source's position, plus some not yet read.
    existing = {
        s: data.draw(st.integers(live[s], len(logs[s])), label=f"{s} exists") for s in SPLITS
    }
    states = SplitBackfills({s: SplitBackfill() for s in SPLITS})
    for split in SPLITS:
        states.set_target(split, logs[split][existing[split] - 1] if existing[split] else None)
    upstream = dict(live)  # next record index the upstream delivers
    backfill = dict.fromkeys(SPLITS, 0)  # next record index the backfill reader delivers
    emitted: dict[str, list[Offset]] = {s: [] for s in SPLITS}

    def deliver(side: str, split: str, count: int) -> None:
        position = upstream if side == "upstream" else backfill
        start = position[split]
        taken = logs[split][start : start + count]
        position[split] = start + len(taken)
        batch = rows(*[(split, o.major) for o in taken])
        visible = states.on_upstream(batch) if side == "upstream" else states.on_backfill(batch)
        emitted[split].extend(o for o, v in zip(taken, visible.tolist(), strict=True) if v)

    for _ in range(data.draw(st.integers(0, 40), label="steps")):
        side = data.draw(st.sampled_from(["upstream", "backfill"]))
        split = data.draw(st.sampled_from(SPLITS))
        if side == "backfill" and split not in states.unfinished():
            continue  # the reader only reads splits still backfilling
        deliver(side, split, data.draw(st.integers(1, 5)))
    # Drain: the backfill reads on while backfilling, the upstream to the end of the log.
    while states.unfinished():
        for split in list(states.unfinished()):
            if backfill[split] == len(logs[split]):
                # History exhausted without reaching the target: only the upstream can tell.
                if upstream[split] == len(logs[split]):
                    break
                deliver("upstream", split, 1)
            else:
                deliver("backfill", split, 3)
        else:
            continue
        break
    for split in SPLITS:
        deliver("upstream", split, len(logs[split]))
    for split in SPLITS:
        assert emitted[split] == logs[split], split
    # A split whose upstream never passes the backfill's stop stays CACHING_UP (the seed's
    # quiet-topic case); one whose history ended before its target stays BACKFILLING until a
    # live row shows how far it goes. Neither lost nor duplicated a record.
    assert all(
        state.phase is not BACKFILLING or backfill[split] == len(logs[split])
        for split, state in states.states.items()
    )


def test_visibility_masks_are_numpy_bools() -> None:
    states = SplitBackfills({"a": SplitBackfill(FINISHED)})
    mask = states.on_upstream(rows(("a", 1)))
    assert isinstance(mask, np.ndarray)
    assert mask.dtype == np.bool_


# --- a stateful model: appends, compaction, both sides, checkpoints and crashes ----------------


class BackfillWithCrashes(RuleBasedStateMachine):
    """A log per split that grows and loses records to compaction; a live source that has read
    some of it when the job starts; the job's backfill states, committed at checkpoints and
    restored at crashes (what was emitted since the last checkpoint is not committed, the live
    source and the reader resume from the committed positions). Whatever the interleaving, the
    committed output per split is in offset order, without duplicates, and — once both sides
    are drained — holds every record the log still has."""

    def __init__(self) -> None:
        super().__init__()
        self.logs: dict[str, list[int]] = {s: [] for s in SPLITS}
        self.next = dict.fromkeys(SPLITS, 1)

    @initialize(sizes=st.fixed_dictionaries({s: st.integers(0, 8) for s in SPLITS}), data=st.data())
    def start(self, sizes: dict[str, int], data: st.DataObject) -> None:
        for split, size in sizes.items():
            self.append(split, size)
        # The live source's committed position (how many records it has read) at job start.
        self.live = {s: data.draw(st.integers(0, len(self.logs[s]))) for s in SPLITS}
        self.live = {s: self.logs[s][n - 1] if n else 0 for s, n in self.live.items()}
        self.states = SplitBackfills({s: SplitBackfill() for s in SPLITS})
        self.restart()
        self.committed: dict[str, list[int]] = {s: [] for s in SPLITS}
        self.pending: dict[str, list[int]] = {s: [] for s in SPLITS}
        self.snapshot = (dict(self.states.states), dict(self.live))

    def append(self, split: str, count: int) -> None:
        for _ in range(count):
            self.logs[split].append(self.next[split])
            self.next[split] += 1

    def restart(self) -> None:
        """The actor (re)starts: targets from the log, the reader from the states."""
        for split in list(self.states.unfinished()):
            log = self.logs[split]
            self.states.set_target(split, Offset(log[-1]) if log else None)
        self.reader = {
            s: (0 if o is None else o.major) for s, o in self.states.unfinished().items()
        }
        self.upstream = dict(self.live)

    def deliver(self, split: str, after: int, count: int, side: str) -> int:
        taken = [o for o in self.logs[split] if o > after][:count]
        if not taken:
            return after
        batch = rows(*[(split, o) for o in taken])
        visible = self.states.on_upstream(batch) if side == "up" else self.states.on_backfill(batch)
        self.pending[split] += [o for o, v in zip(taken, visible.tolist(), strict=True) if v]
        return taken[-1]

    @rule(split=st.sampled_from(SPLITS), count=st.integers(1, 4))
    def log_grows(self, split: str, count: int) -> None:
        self.append(split, count)

    @rule(split=st.sampled_from(SPLITS), data=st.data())
    def compaction_deletes_a_record(self, split: str, data: st.DataObject) -> None:
        if self.logs[split]:
            self.logs[split].remove(data.draw(st.sampled_from(self.logs[split])))

    @rule(split=st.sampled_from(SPLITS), count=st.integers(1, 4))
    def live_source_delivers(self, split: str, count: int) -> None:
        self.upstream[split] = self.deliver(split, self.upstream[split], count, "up")

    @rule(split=st.sampled_from(SPLITS), count=st.integers(1, 4))
    def backfill_reader_delivers(self, split: str, count: int) -> None:
        if split in self.states.unfinished():
            self.reader[split] = self.deliver(split, self.reader[split], count, "back")

    @rule()
    def checkpoint(self) -> None:
        for split in SPLITS:
            self.committed[split] += self.pending[split]
            self.pending[split] = []
        self.live = dict(self.upstream)
        self.snapshot = (dict(self.states.states), dict(self.live))

    @rule()
    def crash(self) -> None:
        states, self.live = self.snapshot
        self.states = SplitBackfills(states)
        self.pending = {s: [] for s in SPLITS}
        self.restart()

    @invariant()
    def committed_output_is_ordered_and_unique(self) -> None:
        for split in SPLITS:
            out = self.committed[split] + self.pending[split]
            assert out == sorted(set(out)), split

    def teardown(self) -> None:
        if not hasattr(self, "states"):
            return
        # Drain: the reader reads its splits to the end, the live source to the end.
        for split in list(self.states.unfinished()):
            self.reader[split] = self.deliver(split, self.reader[split], 10**6, "back")
        for split in SPLITS:
            self.upstream[split] = self.deliver(split, self.upstream[split], 10**6, "up")
        self.checkpoint()
        for split in SPLITS:
            out = self.committed[split]
            assert out == sorted(set(out)), split
            assert set(self.logs[split]) <= set(out), (split, self.logs[split], out)


BackfillWithCrashes.TestCase.settings = settings(max_examples=200, stateful_step_count=30)
test_backfill_with_crashes = BackfillWithCrashes.TestCase
