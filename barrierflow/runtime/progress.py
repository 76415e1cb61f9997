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

    Raises:
        InvalidArgumentError: ``finished`` not a bool, ``rows`` not an int >= 0, or
            ``detail`` not a mapping with str keys.
    """

    finished: bool = False
    rows: int = 0
    detail: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if type(self.finished) is not bool:
            raise InvalidArgumentError("finished", "a bool", self.finished)
        if type(self.rows) is not int or self.rows < 0:
            raise InvalidArgumentError("rows", "an int >= 0", self.rows)
        detail: object = self.detail
        if not isinstance(detail, Mapping) or not all(isinstance(k, str) for k in detail):
            raise InvalidArgumentError("detail", "a mapping with str keys", self.detail)
        object.__setattr__(self, "detail", MappingProxyType(dict(self.detail)))


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
