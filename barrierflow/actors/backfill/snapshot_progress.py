"""What a snapshot backfill has done and still owes (pure bookkeeping, no I/O): its phase, the
snapshot epoch, how far each vnode's snapshot got, the epochs whose change log is still owed,
and the rule that makes the owed epochs shrink (after RisingWave's ``UpstreamBuffer``).

**Owed epochs.** While it backfills, the actor drops the live upstream's chunks: every epoch the
live barriers close after the snapshot epoch is owed, to be read back whole from the view's
change log. ``pending`` lists them, oldest first.

**The allowed lag only shrinks.** When the snapshot is done, the lag allowed is what is owed
then. At each later live barrier the actor replays owed epochs (holding the barrier) until no
more than the allowed lag remain — and replays the epoch the barrier closed when it is the only
one owed — and the allowed lag becomes the smaller of what remains and itself minus half an
epoch: for every two live epochs the backfill replays at least three, so it catches up even
with a busy upstream, and the lag it reports never grows. When nothing is owed at a barrier,
the epoch that barrier opens is forwarded live: no chunk of it was dropped.

The state persisted at every barrier (``progress`` and one ``vnode:<v>`` row per vnode whose
snapshot moved) is what a restart resumes from: mid-vnode from the last key emitted, or
mid-epoch from the number of change-log rows emitted.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, final

from barrierflow.channels.errors import InvalidArgumentError

__all__ = ["SnapshotPhase", "SnapshotProgress", "VnodeProgress"]


class SnapshotPhase(enum.StrEnum):
    """The three phases of a snapshot backfill."""

    SNAPSHOT = "snapshot"
    CHANGE_LOG = "change_log"
    FORWARD = "forward"


@final
@dataclass(slots=True)
class VnodeProgress:
    """How far one vnode's snapshot got: the key of the last row emitted (``None``: none
    yet), the rows emitted, and whether it is done."""

    after: list[Any] | None = None
    rows: int = 0
    done: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"after": self.after, "rows": self.rows, "done": self.done}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> VnodeProgress:
        return cls(value["after"], int(value["rows"]), bool(value["done"]))


@final
@dataclass(slots=True)
class SnapshotProgress:
    """One snapshot backfill actor's progress (see the module)."""

    snapshot_epoch: int
    vnodes: dict[int, VnodeProgress]
    phase: SnapshotPhase = SnapshotPhase.SNAPSHOT
    #: The last epoch whose change log was replayed whole (the snapshot epoch at first).
    replayed: int = 0
    #: Rows of the oldest owed epoch's change log already emitted.
    log_offset: int = 0
    #: Rows emitted in all (snapshot and change log).
    rows: int = 0
    #: Closed epochs after ``replayed`` still owed, oldest first (rebuilt at start).
    pending: list[int] = field(default_factory=list)
    #: The owed epochs allowed at a barrier (``inf`` until the snapshot is done).
    max_lag: float = math.inf
    #: Vnodes whose progress changed since the last barrier.
    dirty: set[int] = field(default_factory=set)
    #: Whether the view is followed, never forwarded (a view kept on Spark's executors: every
    #: epoch it commits is owed, all of them replayed at each barrier).
    follow: bool = False

    @classmethod
    def new(cls, snapshot_epoch: int, vnodes: Iterable[int]) -> SnapshotProgress:
        progress = cls(snapshot_epoch, {v: VnodeProgress() for v in vnodes})
        progress.replayed = snapshot_epoch
        progress.dirty = set(progress.vnodes)
        return progress

    @classmethod
    def restore(cls, saved: Mapping[str, Any], vnodes: Iterable[int]) -> SnapshotProgress | None:
        """The progress a state table holds (``None`` for a new job); vnodes without a row
        start from scratch."""
        if "progress" not in saved:
            return None
        head = saved["progress"]
        progress = cls(
            int(head["snapshot_epoch"]),
            {},
            SnapshotPhase(head["phase"]),
            int(head["replayed"]),
            int(head["log_offset"]),
            int(head["rows"]),
        )
        for vnode in vnodes:
            row = saved.get(f"vnode:{vnode}")
            progress.vnodes[vnode] = (
                VnodeProgress() if row is None else VnodeProgress.from_json(row)
            )
        return progress

    def rows_to_save(self) -> dict[str, Any]:
        """The state rows that changed since the last call (``progress`` always)."""
        rows: dict[str, Any] = {
            "progress": {
                "phase": self.phase.value,
                "snapshot_epoch": self.snapshot_epoch,
                "replayed": self.replayed,
                "log_offset": self.log_offset,
                "rows": self.rows,
            }
        }
        for vnode in sorted(self.dirty):
            rows[f"vnode:{vnode}"] = self.vnodes[vnode].to_json()
        self.dirty.clear()
        return rows

    # The snapshot.

    def unfinished_vnodes(self) -> list[int]:
        return [v for v, p in sorted(self.vnodes.items()) if not p.done]

    def emitted(self, vnode: int, last_key: list[Any], rows: int) -> None:
        """A chunk of ``vnode``'s snapshot went out; ``last_key`` is its last row's key."""
        progress = self.vnodes[vnode]
        progress.after, progress.rows = last_key, progress.rows + rows
        self.rows += rows
        self.dirty.add(vnode)

    def vnode_done(self, vnode: int) -> None:
        self.vnodes[vnode].done = True
        self.dirty.add(vnode)

    # The change log.

    def start_change_log(self) -> None:
        """The snapshot is done: the allowed lag starts as what is owed now."""
        self.phase = SnapshotPhase.CHANGE_LOG
        self.max_lag = float(len(self.pending))

    def on_closed(self, epoch: int) -> None:
        """A live barrier closed ``epoch``: its chunks were dropped, so it is owed."""
        if type(epoch) is not int or (self.pending and epoch <= self.pending[-1]):
            raise InvalidArgumentError("epoch", "a closed epoch after the owed ones", epoch)
        if epoch > self.replayed:
            self.pending.append(epoch)

    def must_replay(self) -> bool:
        """At a barrier: replay before passing it — while more epochs are owed than the
        allowed lag, or when the only one owed is the epoch this barrier closed (replayed at
        once, the job forwards from the next epoch, as the seed finishes once it consumed the
        latest upstream epoch: a quiet upstream does not keep it waiting on the lag rule)."""
        owed = len(self.pending)
        return self.phase is SnapshotPhase.CHANGE_LOG and (
            owed > math.floor(self.max_lag) or owed == 1 or (self.follow and owed > 0)
        )

    def log_emitted(self, rows: int) -> None:
        self.log_offset += rows
        self.rows += rows

    def epoch_replayed(self) -> int:
        """The oldest owed epoch's change log went out whole; returns the epoch."""
        epoch = self.pending.pop(0)
        self.replayed, self.log_offset = epoch, 0
        return epoch

    def after_barrier(self) -> None:
        """A live barrier was handled: shrink the allowed lag (never grows), and forward once
        nothing is owed."""
        if self.phase is not SnapshotPhase.CHANGE_LOG or self.follow:
            return
        if not self.pending:
            self.phase = SnapshotPhase.FORWARD
            return
        self.max_lag = max(0.0, min(float(len(self.pending)), self.max_lag - 0.5))

    @property
    def owed(self) -> int:
        """Epochs whose change log is still owed."""
        return len(self.pending)
