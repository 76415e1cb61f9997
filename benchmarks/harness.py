"""The record format, goals and the timing loop shared by every benchmark.

A benchmark compares a *candidate* (barrierflow's code) with a *baseline* (the same work done
with plain anyio / NumPy / Arrow) in the same process: both are warmed up, a work size ``n`` is
calibrated so that the repetitions fit the time budget, then the two are timed alternately
(the order flips on every repetition, so drift and cache effects hit both alike) and the median
of the repetitions is reported.
"""

from __future__ import annotations

import gc
import math
import operator
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "RECORD_KEYS",
    "Comparison",
    "Goal",
    "Settings",
    "compare",
    "make_record",
    "median",
    "paired_ratio",
    "rounded",
    "samples",
]

#: The keys of every record, in print order (``details`` is optional and comes last).
RECORD_KEYS = (
    "name",
    "value",
    "unit",
    "baseline",
    "ratio",
    "goal",
    "goal_on",
    "meets_goal",
)

_OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "<": operator.lt,
    ">": operator.gt,
}


@dataclass(frozen=True)
class Goal:
    """A threshold such as ``"<= 1.0"`` or ``">= 100000000"``."""

    op: str
    threshold: float

    @classmethod
    def parse(cls, text: str) -> Goal:
        op, _, number = text.strip().partition(" ")
        if op not in _OPERATORS or not number:
            raise ValueError(f"bad goal {text!r}: expected '<op> <number>' with op in {_OPERATORS}")
        return cls(op, float(number))

    def __str__(self) -> str:
        number = self.threshold
        shown = str(int(number)) if number.is_integer() and abs(number) >= 1000 else repr(number)
        return f"{self.op} {shown}"

    def met_by(self, x: float | None) -> bool:
        if x is None or not math.isfinite(x):
            return False
        return _OPERATORS[self.op](x, self.threshold)


@dataclass(frozen=True)
class Settings:
    """How long to run: ``quick`` is about a second per benchmark, otherwise a few seconds."""

    quick: bool

    @property
    def budget(self) -> float:
        """Target seconds of timed repetitions (candidate and baseline together)."""
        return 0.6 if self.quick else 3.5

    @property
    def reps(self) -> int:
        """Timed repetitions of each side; the median is reported."""
        return 7 if self.quick else 15


def rounded(x: float | None, digits: int = 6) -> float | None:
    """``x`` to ``digits`` significant digits (for readable JSON)."""
    if x is None:
        return None
    return float(f"{x:.{digits}g}")


def make_record(
    name: str,
    value: float,
    unit: str,
    baseline: float | None,
    goal: str,
    goal_on: str | None = None,
    details: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One output record; ``goal_on`` defaults to ``"ratio"`` when there is a baseline."""
    parsed = Goal.parse(goal)
    raw_ratio = None if baseline is None or baseline == 0 else value / baseline
    # The goal is judged on the printed numbers, so a record never contradicts itself.
    shown_value, shown_baseline, ratio = rounded(value), rounded(baseline), rounded(raw_ratio)
    if goal_on is None:
        goal_on = "ratio" if baseline is not None else "value"
    if goal_on not in ("ratio", "value"):
        raise ValueError(f"goal_on must be 'ratio' or 'value', not {goal_on!r}")
    record: dict[str, Any] = {
        "name": name,
        "value": shown_value,
        "unit": unit,
        "baseline": shown_baseline,
        "ratio": ratio,
        "goal": str(parsed),
        "goal_on": goal_on,
        "meets_goal": parsed.met_by(ratio if goal_on == "ratio" else shown_value),
    }
    if details:
        record["details"] = details
    return record


@contextmanager
def _no_gc() -> Iterator[None]:
    """Collect, then keep the cyclic GC off while timing (as :mod:`timeit` does)."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


Workload = Callable[[int], Awaitable[None]]


async def _timed(work: Workload, n: int) -> float:
    with _no_gc():
        started = time.perf_counter()
        await work(n)
        return time.perf_counter() - started


@dataclass
class Comparison:
    """Seconds per repetition of each side, for ``n`` units of work per repetition."""

    n: int
    candidate: list[float] = field(default_factory=list)
    baseline: list[float] = field(default_factory=list)

    def per_unit(self, side: str, scale: float = 1.0) -> list[float]:
        """Each repetition's seconds per unit, times ``scale``."""
        return [t / self.n * scale for t in getattr(self, side)]

    def rate(self, side: str, units_per_n: float = 1.0) -> list[float]:
        """Each repetition's units per second."""
        return [self.n * units_per_n / t for t in getattr(self, side)]


async def compare(
    candidate: Workload,
    baseline: Workload,
    *,
    budget: float,
    reps: int,
    start_n: int,
    min_calibration_time: float = 0.03,
) -> Comparison:
    """Warm up, calibrate ``n`` to the budget, then time both sides alternately ``reps`` times."""
    # Warm-up: first calls pay for imports, allocator growth, code specialization.
    for _ in range(2):
        await candidate(start_n)
        await baseline(start_n)
    n = start_n
    while True:
        pair = await _timed(candidate, n) + await _timed(baseline, n)
        if pair >= min_calibration_time or n >= 1 << 30:
            break
        n *= 4
    per_pair = budget / reps
    n = max(start_n, int(n * per_pair / pair))
    result = Comparison(n)
    for i in range(reps):
        if i % 2 == 0:
            result.candidate.append(await _timed(candidate, n))
            result.baseline.append(await _timed(baseline, n))
        else:
            result.baseline.append(await _timed(baseline, n))
            result.candidate.append(await _timed(candidate, n))
    return result


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def paired_ratio(ours: list[float], theirs: list[float]) -> float | None:
    """The median of the per-repetition ratios: each pair ran back to back, so this figure
    resists the machine changing speed during the run better than a ratio of medians."""
    return rounded(statistics.median(a / b for a, b in zip(ours, theirs, strict=True)))


def samples(xs: list[float]) -> list[float | None]:
    return [rounded(x, 5) for x in xs]


def sampled(ours: list[float], theirs: list[float]) -> dict[str, Any]:
    """The details every comparison reports of its repetitions: how many ran, each side's
    samples and their :func:`paired_ratio` (one copy, so that every record names them alike)."""
    return {
        "runs": len(ours),
        "samples": samples(ours),
        "baseline_samples": samples(theirs),
        "paired_ratio": paired_ratio(ours, theirs),
    }
