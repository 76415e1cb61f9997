"""Progress that actors report with their barriers, and what a job makes of it.

A backfilling actor reports a :class:`Progress` with a barrier it passes (RisingWave's
``collect(barrier, progress)``): how far it got and whether it has finished. The runtime keeps
each actor's latest report once that barrier has completed (every actor collected it), and a
job is *ready* when every actor of it that backfills has reported ``finished`` — what
``CREATE MATERIALIZED VIEW`` returning means. An actor that never reports progress does not
backfill and is ready from its first barrier.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, final

from barrierflow.channels.errors import InvalidArgumentError

__all__ = ["JobProgress", "Progress"]


@final
@dataclass(frozen=True, slots=True)
class Progress:
    """One actor's backfill progress as of a barrier.

    Attributes:
        finished: whether the actor has finished backfilling (it then only forwards upstream).
        rows: rows backfilled so far.
        detail: anything else worth showing (per-split offsets, vnodes done, epochs owed).
        total: the rows it expects to have backfilled in all, where it knows (a source
            backfill: the rows read plus the records its splits' logs still hold ahead of it);
            ``None``: unknown.

    Raises:
        InvalidArgumentError: ``finished`` not a bool, ``rows`` not an int >= 0, ``detail``
            not a mapping with str keys, or ``total`` not ``None`` or an int >= ``rows``.
    """

    finished: bool = False
    rows: int = 0
    detail: Mapping[str, Any] = field(default_factory=dict)
    total: int | None = None

    def __post_init__(self) -> None:
        if type(self.finished) is not bool:
            raise InvalidArgumentError("finished", "a bool", self.finished)
        if type(self.rows) is not int or self.rows < 0:
            raise InvalidArgumentError("rows", "an int >= 0", self.rows)
        detail: object = self.detail
        if not isinstance(detail, Mapping) or not all(isinstance(k, str) for k in detail):
            raise InvalidArgumentError("detail", "a mapping with str keys", self.detail)
        object.__setattr__(self, "detail", MappingProxyType(dict(self.detail)))
        if self.total is not None and (type(self.total) is not int or self.total < self.rows):
            raise InvalidArgumentError("total", "None or an int >= rows", self.total)


@final
@dataclass(frozen=True, slots=True)
class JobProgress:
    """A job's progress: each backfilling actor's latest completed report.

    Attributes:
        job: the job's name.
        created_epoch: the epoch of the barrier that added the job (0 until it was collected).
        actors: actor name → its latest report (only actors that report progress).
        ready: whether every backfilling actor has finished (see the module docstring).
    """

    job: str
    created_epoch: int
    actors: Mapping[str, Progress]
    ready: bool

    @property
    def rows(self) -> int:
        """Rows backfilled, summed over the job's actors."""
        return sum(p.rows for p in self.actors.values())

    @property
    def fraction_finished(self) -> float:
        """The share of backfilling actors that finished (1.0 with none)."""
        if not self.actors:
            return 1.0
        return sum(p.finished for p in self.actors.values()) / len(self.actors)

    @property
    def fraction_done(self) -> float:
        """How far the job's backfill is, 0..1: per actor, its rows of the :attr:`~Progress.
        total` it expects where it knows it, else the share of its splits finished (a source
        backfill reports each split's phase) or of its vnodes done (a snapshot backfill
        reports ``vnodes_left`` of ``vnodes_total``) — 1 once it finished — averaged over the
        backfilling actors (1.0 with none)."""
        if not self.actors:
            return 1.0
        return sum(_actor_fraction(p) for p in self.actors.values()) / len(self.actors)

    @property
    def splits(self) -> tuple[int, int]:
        """``(finished, total)`` splits of the job's source backfills."""
        phases = [v for p in self.actors.values() for v in _split_phases(p)]
        return sum(v == "finished" for v in phases), len(phases)

    @property
    def vnodes(self) -> tuple[int, int]:
        """``(done, total)`` vnodes of the job's snapshot backfills."""
        pairs = [v for p in self.actors.values() if (v := _vnodes(p)) is not None]
        return sum(d for d, _ in pairs), sum(t for _, t in pairs)

    @property
    def epochs_owed(self) -> int:
        """Epochs whose change log the job's snapshot backfills still owe."""
        owed = (p.detail.get("epochs_owed") for p in self.actors.values())
        return sum(o for o in owed if type(o) is int)

    @property
    def phase(self) -> str:
        """The job's phase in a word: ``"ready"``, or the phases its unfinished actors report
        (``"snapshot"``, ``"change_log"``, ``"backfilling"``, ``"caching_up"``, joined by
        ``+`` when they differ), or ``"backfilling"`` when they report none."""
        if self.ready:
            return "ready"
        phases: set[str] = set()
        for progress in self.actors.values():
            if progress.finished:
                continue
            detail = progress.detail
            if isinstance(detail.get("phase"), str):
                phases.add(detail["phase"])
            else:
                phases.update(v for v in detail.values() if isinstance(v, str) and v != "finished")
        return "+".join(sorted(phases)) or "backfilling"


#: The phases a source backfill reports per split (its detail maps each split to one).
_SPLIT_PHASES = ("backfilling", "caching_up", "finished")


def _split_phases(progress: Progress) -> list[str]:
    """The phase of each split a source backfill reports in ``progress``."""
    return [v for v in progress.detail.values() if v in _SPLIT_PHASES]


def _vnodes(progress: Progress) -> tuple[int, int] | None:
    """``(done, total)`` vnodes of a snapshot backfill's ``progress`` (``None``: it reports
    none)."""
    total, left = progress.detail.get("vnodes_total"), progress.detail.get("vnodes_left")
    if type(total) is int and type(left) is int and total > 0:
        return total - left, total
    return None


def _actor_fraction(progress: Progress) -> float:
    """One actor's share done (see :attr:`JobProgress.fraction_done`)."""
    if progress.finished:
        return 1.0
    vnodes = _vnodes(progress)
    share = 0.0
    if progress.total:
        share = progress.rows / progress.total
    elif vnodes is not None:
        share = vnodes[0] / vnodes[1]
    else:
        splits = _split_phases(progress)
        if splits:
            finished: int = sum(v == "finished" for v in splits)
            share = finished / len(splits)
    # Not finished is not done: the last vnode read still owes its change log.
    return max(0.0, min(share, _UNFINISHED))


#: The most an actor that has not finished counts as done.
_UNFINISHED = 0.99
