"""The per-split state machine of the source backfill (after RisingWave's
``source_backfill_executor.rs``), pure and vectorized.

A job that must see a running source's history reads it twice over: the **upstream** (the live
source's output, shared with every other job) and its own **backfill reader** of the same
splits from their first record. Per split, the state says which of the two a record is taken
from, so that every record is emitted exactly once:

* ``BACKFILLING(offset)`` — history is being read; ``offset`` is the last record the backfill
  emitted (``None``: none yet). Upstream rows are dropped (the backfill will read them), unless
  the upstream shows it is not ahead: an upstream row **at** ``offset`` means the backfill met
  the live stream exactly → ``FINISHED``; one **before** ``offset`` means the backfill is ahead
  → ``CACHING_UP(offset)``. Each backfill row is emitted and moves ``offset``; a backfill row
  at or past the **target** (the latest offset the upstream showed, or the log's latest offset
  when the backfill started) → ``CACHING_UP(that row's offset)``: history is done, and the
  upstream must catch up to it.
* ``CACHING_UP(offset)`` — the backfill stopped at ``offset`` (inclusive); the upstream is
  still behind it. Upstream rows at or before ``offset`` are dropped (the backfill emitted
  them); the row **at** ``offset`` → ``FINISHED``; a row **past** it without one at it (the log
  dropped the record in between, e.g. compaction) is emitted → ``FINISHED``.
* ``FINISHED`` — upstream rows are emitted; backfill rows are dropped.

While ``BACKFILLING``, every upstream row of the split moves the target to its offset (it can
move down: the log's latest offset is only a first guess). In ``BACKFILLING(None)`` upstream
rows are dropped and only move the target.

**A split created later.** An actor that took its splits from the log's listing adopts a split
whose rows the upstream delivers although it did not list it (``adopt_new_splits=True``): the
split was created after the listing, which came after the live source passed the job's first
barrier, so the live source read it from its first record after that barrier — it has no
history the job missed, and is ``FINISHED`` at once. (A split that existed at the listing is
one of the states, whenever the live source starts reading it: the rules above make its
history and the upstream meet without a gap or a repeat.) An actor given its splits explicitly
refuses such a row (:class:`~barrierflow.channels.errors.ProtocolError`).

Offsets are compared as numbers (:class:`~barrierflow.actors.sources.split_log.Offset`). Rows
of one split arrive in offset order; a batch may mix splits, so each batch is grouped by split
(a loop over the splits in it, never over rows) and each split's rows are decided with NumPy.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.actors.sources.split_log import (
    OFFSET_MAJOR,
    OFFSET_MINOR,
    SPLIT_COLUMN,
    Offset,
    check_increasing,
)
from barrierflow.channels.errors import InvalidArgumentError, ProtocolError

__all__ = ["BackfillPhase", "SplitBackfill", "SplitBackfills"]


class BackfillPhase(enum.Enum):
    """Where one split's backfill is (see the module)."""

    BACKFILLING = "backfilling"
    CACHING_UP = "caching_up"
    FINISHED = "finished"


@final
@dataclass(frozen=True, slots=True)
class SplitBackfill:
    """One split's backfill state, with its progress (persisted at every barrier).

    Attributes:
        phase: the state.
        offset: ``BACKFILLING``: the last offset the backfill emitted (``None``: none yet);
            ``CACHING_UP``: where the backfill stopped (inclusive); ``FINISHED``: ``None``.
        consumed_rows: history rows the backfill reader delivered for the split.
        target: the latest offset known to exist (``None``: unknown yet).
    """

    phase: BackfillPhase = BackfillPhase.BACKFILLING
    offset: Offset | None = None
    consumed_rows: int = 0
    target: Offset | None = None

    def to_json(self) -> dict[str, Any]:
        """The state as a JSON object (how it is kept in the state table)."""
        return {
            "phase": self.phase.value,
            "offset": None if self.offset is None else str(self.offset),
            "consumed_rows": self.consumed_rows,
            "target": None if self.target is None else str(self.target),
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> SplitBackfill:
        """The state :meth:`to_json` wrote.

        Raises:
            InvalidArgumentError: ``value`` is not such an object.
        """
        try:
            offset, target = value["offset"], value["target"]
            return cls(
                BackfillPhase(value["phase"]),
                None if offset is None else Offset.parse(offset),
                int(value["consumed_rows"]),
                None if target is None else Offset.parse(target),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidArgumentError(
                "state", "a split backfill state (phase, offset, consumed_rows, target)", value
            ) from exc


_FINISHED = SplitBackfill(BackfillPhase.FINISHED)


def _after(major: np.ndarray, minor: np.ndarray, offset: Offset) -> np.ndarray:
    """Rows whose offset is greater than ``offset``."""
    result: np.ndarray = (major > offset.major) | ((major == offset.major) & (minor > offset.minor))
    return result


def _at_or_after(major: np.ndarray, minor: np.ndarray, offset: Offset) -> np.ndarray:
    result: np.ndarray = (major > offset.major) | (
        (major == offset.major) & (minor >= offset.minor)
    )
    return result


def _offset_at(major: np.ndarray, minor: np.ndarray, index: int) -> Offset:
    return Offset(int(major[index]), int(minor[index]))


def _on_upstream(
    state: SplitBackfill, major: np.ndarray, minor: np.ndarray
) -> tuple[SplitBackfill, np.ndarray]:
    """One split's upstream rows (in offset order): the new state and the rows to emit."""
    if state.phase is BackfillPhase.FINISHED:
        return state, np.full(len(major), True)
    hidden = np.full(len(major), False)
    last = _offset_at(major, minor, -1)
    if state.phase is BackfillPhase.BACKFILLING and (
        state.offset is None or _offset_at(major, minor, 0) > state.offset
    ):
        # Not started, or the upstream is ahead of the backfill: the backfill will read these
        # rows; they only tell how far the split goes now.
        return replace(state, target=last), hidden
    # BACKFILLING whose offset the upstream's first row is at or before (the backfill is not
    # behind: it stops there and the upstream catches up), or CACHING_UP.
    assert state.offset is not None
    emit = _after(major, minor, state.offset)
    if last >= state.offset:
        return replace(state, phase=BackfillPhase.FINISHED, offset=None), emit
    return replace(state, phase=BackfillPhase.CACHING_UP), hidden


def _on_backfill(
    state: SplitBackfill, major: np.ndarray, minor: np.ndarray
) -> tuple[SplitBackfill, np.ndarray]:
    """One split's backfill rows (in offset order): the new state and the rows to emit."""
    consumed = state.consumed_rows + len(major)
    if state.phase is not BackfillPhase.BACKFILLING:
        return replace(state, consumed_rows=consumed), np.full(len(major), False)
    if state.target is not None:
        done = np.flatnonzero(_at_or_after(major, minor, state.target))
        if len(done):
            # History reached the target: this row is the last one the backfill emits.
            stop = int(done[0])
            emit = np.arange(len(major)) <= stop
            offset = _offset_at(major, minor, stop)
            return SplitBackfill(BackfillPhase.CACHING_UP, offset, consumed, state.target), emit
    offset = _offset_at(major, minor, -1)
    return replace(state, offset=offset, consumed_rows=consumed), np.full(len(major), True)


@final
class SplitBackfills:
    """The backfill states of the splits an actor owns, and the rows each side may emit.

    Args:
        states: the state of each split owned.
        adopt_new_splits: an upstream row of a split not owned adopts the split as
            ``FINISHED`` (see the module) instead of being a protocol error.

    Raises:
        InvalidArgumentError: ``states`` is not a mapping of split name to SplitBackfill, or
            ``adopt_new_splits`` is not a bool.
    """

    def __init__(
        self, states: Mapping[str, SplitBackfill], *, adopt_new_splits: bool = False
    ) -> None:
        if not isinstance(states, Mapping) or not all(
            isinstance(k, str) and isinstance(v, SplitBackfill) for k, v in states.items()
        ):
            raise InvalidArgumentError("states", "a mapping of split to SplitBackfill", states)
        if type(adopt_new_splits) is not bool:
            raise InvalidArgumentError("adopt_new_splits", "a bool", adopt_new_splits)
        self.states: dict[str, SplitBackfill] = dict(states)
        self.adopt_new_splits = adopt_new_splits

    def adopt(self, splits: Iterable[str]) -> list[str]:
        """The upstream delivers rows of ``splits``: adopt each one not owned as ``FINISHED``
        (see the module); returns the splits adopted.

        Raises:
            ProtocolError: a split not owned, and this actor adopts none.
        """
        adopted = [split for split in splits if split not in self.states]
        if adopted and not self.adopt_new_splits:
            raise ProtocolError(
                f"source backfill: expected rows of its splits {sorted(self.states)} from "
                f"the upstream, got a row of split {adopted[0]!r}"
            )
        for split in adopted:
            self.states[split] = _FINISHED
        return adopted

    def on_upstream(self, batch: pa.RecordBatch) -> np.ndarray:
        """Apply the live source's ``batch``; returns the visibility of its rows.

        Raises:
            ProtocolError: a row of a split this actor does not own.
            OffsetOrderError: a split's offsets in the batch do not increase strictly.
        """
        return self._apply(batch, _on_upstream, "upstream")

    def on_backfill(self, batch: pa.RecordBatch) -> np.ndarray:
        """Apply the backfill reader's ``batch``; returns the visibility of its rows.

        Raises:
            ProtocolError: a row of a split this actor does not own.
        """
        return self._apply(batch, _on_backfill, "backfill")

    def _apply(self, batch: pa.RecordBatch, step: Any, side: str) -> np.ndarray:
        visible = np.zeros(batch.num_rows, dtype=bool)
        if batch.num_rows == 0:
            return visible
        encoded = pc.dictionary_encode(batch.column(SPLIT_COLUMN))
        codes = encoded.indices.to_numpy()
        major = batch.column(OFFSET_MAJOR).to_numpy()
        minor = batch.column(OFFSET_MINOR).to_numpy()
        names = encoded.dictionary.to_pylist()
        if side == "upstream":
            self.adopt(names)
        for code, split in enumerate(names):
            state = self.states.get(split)
            if state is None:
                raise ProtocolError(
                    f"source backfill: expected rows of its splits {sorted(self.states)} from "
                    f"the {side}, got a row of split {split!r}"
                )
            rows = np.flatnonzero(codes == code)
            split_major, split_minor = major[rows], minor[rows]
            check_increasing(split, split_major, split_minor)
            self.states[split], emit = step(state, split_major, split_minor)
            visible[rows[emit]] = True
        return visible

    def set_target(self, split: str, target: Offset | None) -> None:
        """The log's latest offset when the backfill (re)starts: ``None`` (an empty split)
        means there is nothing to backfill — the split is finished at once."""
        state = self.states[split]
        if state.phase is not BackfillPhase.BACKFILLING:
            return
        self.states[split] = _FINISHED if target is None else replace(state, target=target)

    def on_latest(self, split: str, latest: Offset | None) -> None:
        """The log's latest offset now, for a split whose backfill has not moved for a while:
        if the backfill has read up to it (or the split is empty), its history is done —
        ``CACHING_UP`` at the last offset read (``FINISHED`` if it read none). This is how a
        target that is never delivered (its record deleted after the target was taken) still
        ends the backfill on a quiet split."""
        state = self.states[split]
        if state.phase is not BackfillPhase.BACKFILLING:
            return
        if state.offset is None:
            if latest is None:
                self.states[split] = replace(_FINISHED, consumed_rows=state.consumed_rows)
            return
        if latest is None or latest <= state.offset:
            self.states[split] = replace(state, phase=BackfillPhase.CACHING_UP)

    def unfinished(self) -> dict[str, Offset | None]:
        """Where the backfill reader resumes each split still ``BACKFILLING`` (after the
        offset it last emitted; ``None``: from the first record)."""
        return {
            split: state.offset
            for split, state in self.states.items()
            if state.phase is BackfillPhase.BACKFILLING
        }

    def caught_up(self) -> bool:
        """Every split is ``CACHING_UP`` or ``FINISHED``: the job may report itself ready (a
        quiet split must not hold ``wait_ready()`` for ever)."""
        return all(s.phase is not BackfillPhase.BACKFILLING for s in self.states.values())

    def finished(self) -> bool:
        """Every split of this actor is ``FINISHED``."""
        return all(s.phase is BackfillPhase.FINISHED for s in self.states.values())

    @property
    def consumed_rows(self) -> int:
        """History rows read, over every split."""
        return sum(s.consumed_rows for s in self.states.values())

    def reassign(
        self, splits: Iterable[str], committed: Mapping[str, SplitBackfill]
    ) -> tuple[bool, list[str]]:
        """A split change: keep the states of splits still owned; a new split takes its
        committed state (a split migrated from another actor) or, with none, is
        ``FINISHED`` (a split created after the job: the live source has all of it).

        Returns:
            Whether the set of splits changed, and the splits dropped.
        """
        target = list(splits)
        new: dict[str, SplitBackfill] = {}
        for split in target:
            if split in self.states:
                new[split] = self.states[split]
            else:
                new[split] = committed.get(split, _FINISHED)
        dropped = [split for split in self.states if split not in new]
        changed = bool(dropped) or len(new) != len(self.states)
        self.states = new
        return changed, dropped
