"""The runtime's one metrics home: what every part of a running pipeline reports, in one
registry per runtime (no globals: two runtimes in one process keep separate metrics).

Two kinds of reporting, chosen so that nothing on a hot path costs more than a counter
increment:

* **Counters the parts keep anyway** — an actor's rows in and out, a channel's messages and
  blocked seconds, a coordinator's commits, a sink task's poisoned epochs, a feed's batches —
  are read when metrics are collected (a scrape, ``rt.stats()``), never pushed: a part that
  reports implements :class:`ReportsMetrics`, and the runtime asks it at collection time.
  Collection runs on the runtime's event loop (the Prometheus endpoint's thread asks the loop
  for a snapshot), so it reads a consistent state without a lock.
* **Latencies** — a barrier's stages, a commit's duration — are observed once per epoch into
  the registry's :class:`Histogram` s (a bisection and two additions).
* **What only a server knows** — how far a split log's latest record is ahead of a source —
  is asked when somebody looks: :meth:`MetricsRegistry.snapshot` first *refreshes* the parts
  that implement :class:`RefreshesMetrics` (concurrently, each within
  :data:`REFRESH_TIMEOUT` seconds; one that fails or overruns logs one warning naming it and
  reports that metric as unknown), then collects. The Prometheus endpoint scrapes with it;
  :meth:`MetricsRegistry.collect` alone reads only what the parts hold.

:meth:`MetricsRegistry.collect` returns :class:`MetricFamily` s in the Prometheus data model
(names with the ``barrierflow_`` prefix, labels such as ``job``, ``actor``, ``channel``,
``sink``); :mod:`barrierflow.runtime.metrics_server` serves them in the text exposition
format. The metric table, and what each corresponds to in Flink and RisingWave, is in the
README's "Watching a pipeline".
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, final, runtime_checkable

import anyio
import structlog

from barrierflow.channels.errors import InvalidArgumentError

__all__ = [
    "LATENCY_BUCKETS",
    "REFRESH_TIMEOUT",
    "Histogram",
    "MetricFamily",
    "MetricsRegistry",
    "RefreshesMetrics",
    "ReportsMetrics",
    "Sample",
    "counter",
    "gauge",
    "histogram_quantile",
    "refresh_parts",
]

#: Bucket bounds (seconds) of every latency histogram: 1 ms .. 2 min.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0,
)  # fmt: skip

#: Seconds a part has to refresh its metrics in one snapshot (a scrape times out after 10 s).
REFRESH_TIMEOUT = 2.0

Kind = Literal["counter", "gauge", "histogram"]
Labels = tuple[tuple[str, str], ...]


@final
@dataclass(frozen=True, slots=True)
class Sample:
    """One value of a family, with its labels (``(("actor", "map"),)``) and, for a histogram,
    its ``suffix`` (``"_bucket"`` with an ``le`` label, ``"_sum"``, ``"_count"``)."""

    labels: Labels
    value: float
    suffix: str = ""


@final
@dataclass(frozen=True, slots=True)
class MetricFamily:
    """A metric and its samples, in the Prometheus data model.

    Attributes:
        name: ``barrierflow_...`` (a counter's without its ``_total``: the exposition adds it).
        kind: ``"counter"``, ``"gauge"`` or ``"histogram"``.
        help: what it means, in one line.
        samples: its values.
    """

    name: str
    kind: Kind
    help: str
    samples: tuple[Sample, ...] = ()

    def value(self, **labels: str) -> float | None:
        """The value of the plain sample with exactly ``labels`` (``None`` if none)."""
        wanted = tuple(sorted(labels.items()))
        for sample in self.samples:
            if not sample.suffix and tuple(sorted(sample.labels)) == wanted:
                return sample.value
        return None


def _family(
    name: str, kind: Kind, help: str, values: Iterable[tuple[Mapping[str, str], float]]
) -> MetricFamily:
    samples = tuple(Sample(tuple(labels.items()), float(value)) for labels, value in values)
    return MetricFamily(name, kind, help, samples)


def counter(
    name: str, help: str, values: Iterable[tuple[Mapping[str, str], float]]
) -> MetricFamily:
    """A counter family from ``(labels, value)`` pairs."""
    return _family(name, "counter", help, values)


def gauge(name: str, help: str, values: Iterable[tuple[Mapping[str, str], float]]) -> MetricFamily:
    """A gauge family from ``(labels, value)`` pairs."""
    return _family(name, "gauge", help, values)


@runtime_checkable
class ReportsMetrics(Protocol):
    """A part of a pipeline (an actor, a service) that reports metrics of its own; the runtime
    asks it at collection time, on its event loop."""

    def metric_families(self) -> Iterable[MetricFamily]:
        """This part's metrics now (labels included)."""
        ...


@runtime_checkable
class RefreshesMetrics(Protocol):
    """A part whose metrics need a call out (a server) before they are read; the runtime
    refreshes it on every :meth:`MetricsRegistry.snapshot`, on its event loop."""

    async def refresh_metrics(self) -> None:
        """Bring this part's metrics up to date (bounded by the caller's timeout)."""
        ...


async def refresh_parts(parts: Mapping[str, object], each_within: float = REFRESH_TIMEOUT) -> None:
    """Refresh the ``parts`` (name → part) that implement :class:`RefreshesMetrics`, at once,
    each within ``each_within`` seconds; one that fails or overruns logs one warning naming it."""
    log = structlog.get_logger("barrierflow.metrics")

    async def one(name: str, part: RefreshesMetrics) -> None:
        try:
            with anyio.fail_after(each_within):
                await part.refresh_metrics()
        except TimeoutError:
            log.warning("metrics refresh timed out; left unknown", part=name, timeout_s=each_within)
        except Exception as exc:
            log.warning("metrics refresh failed; left unknown", part=name, error=repr(exc))

    async with anyio.create_task_group() as tg:
        for name, part in parts.items():
            if isinstance(part, RefreshesMetrics):
                tg.start_soon(one, name, part)


@dataclass(slots=True)
class _Series:
    counts: list[int]
    total: float = 0.0
    count: int = 0


@final
class Histogram:
    """A histogram with fixed buckets, one series per label values: ``observe`` costs a
    bisection and two additions.

    Raises:
        InvalidArgumentError: a bad name, no label names, or buckets not strictly increasing.
    """

    def __init__(
        self,
        name: str,
        help: str,
        labels: Sequence[str] = (),
        buckets: Sequence[float] = LATENCY_BUCKETS,
    ) -> None:
        _check_name(name)
        bounds = tuple(float(b) for b in buckets)
        if not bounds or any(b >= c for b, c in itertools.pairwise(bounds)):
            raise InvalidArgumentError("buckets", "strictly increasing bounds", buckets)
        self.name = name
        self.help = help
        self.labels = tuple(labels)
        self.buckets = bounds
        self._series: dict[tuple[str, ...], _Series] = {}

    def observe(self, value: float, *labels: str) -> None:
        """Count ``value`` (seconds, usually) for the label values ``labels``."""
        series = self._series.get(labels)
        if series is None:
            if len(labels) != len(self.labels):
                raise InvalidArgumentError("labels", f"values of {self.labels}", labels)
            series = self._series[labels] = _Series([0] * len(self.buckets))
        index = bisect.bisect_left(self.buckets, value)
        if index < len(series.counts):
            series.counts[index] += 1
        series.total += value
        series.count += 1

    def count(self, *labels: str) -> int:
        """How many values were observed for ``labels``."""
        series = self._series.get(labels)
        return 0 if series is None else series.count

    def quantile(self, q: float, *labels: str) -> float | None:
        """Quantile ``q`` of the values observed for ``labels``, estimated from the buckets as
        :func:`histogram_quantile` does (``None`` with no values)."""
        series = self._series.get(labels)
        if series is None:
            return None
        cumulative = list(zip(self.buckets, itertools.accumulate(series.counts), strict=True))
        return histogram_quantile(q, [*cumulative, (math.inf, series.count)])

    def family(self) -> MetricFamily:
        """The histogram's samples: cumulative buckets, ``+Inf``, sum and count."""
        samples: list[Sample] = []
        for values, series in self._series.items():
            labels = tuple(zip(self.labels, values, strict=True))
            running = 0
            for bound, count in zip(self.buckets, series.counts, strict=True):
                running += count
                samples.append(Sample((*labels, ("le", _bound(bound))), running, "_bucket"))
            samples.append(Sample((*labels, ("le", "+Inf")), series.count, "_bucket"))
            samples.append(Sample(labels, series.total, "_sum"))
            samples.append(Sample(labels, series.count, "_count"))
        return MetricFamily(self.name, "histogram", self.help, tuple(samples))


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Quantile ``q`` (0..1) of a histogram's values, estimated from its ``buckets`` as
    Prometheus's ``histogram_quantile`` does — so that ``barrierflow top`` and a dashboard
    show the same number for the same scrape.

    The rank ``q * count`` falls in one bucket; the estimate is linear inside it, between the
    bucket's lower bound (the previous bucket's upper bound; 0 for the first bucket, unless
    its upper bound is not positive: then that bound) and its upper bound, by how far into
    the bucket's count the rank lies. A rank in the ``+Inf`` bucket gives the highest finite
    bound (nothing is known above it). A bucket's bound alone would overstate a latency by
    up to the bucket's width (a 6 ms median read as 10 ms).

    Args:
        q: the quantile, 0 ≤ q ≤ 1.
        buckets: ``(upper bound, cumulative count)`` pairs, the ``+Inf`` bucket (the total
            count) among them; any order.

    Returns:
        The estimate, or ``None`` where there is none: no value observed, no ``+Inf`` bucket
        or no finite one.

    Raises:
        InvalidArgumentError: ``q`` is not a number in [0, 1].
    """
    if isinstance(q, bool) or not isinstance(q, int | float) or not 0 <= q <= 1:
        raise InvalidArgumentError("q", "a quantile between 0 and 1", q)
    ordered = sorted(buckets)
    if len(ordered) < 2 or ordered[-1][0] != math.inf or not ordered[-1][1] > 0:
        return None
    rank = q * ordered[-1][1]
    finite = ordered[:-1]
    index = next((i for i, (_, count) in enumerate(finite) if count >= rank), None)
    if index is None:
        return finite[-1][0]
    upper, count = finite[index]
    if index == 0 and upper <= 0:
        return upper
    lower, below = finite[index - 1] if index else (0.0, 0.0)
    if count <= below:  # q = 0 on an empty first bucket: the rank sits at its lower bound
        return lower
    return lower + (upper - lower) * (rank - below) / (count - below)


def _bound(value: float) -> str:
    return repr(value)


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name.startswith("barrierflow_"):
        raise InvalidArgumentError("name", "a metric name starting with 'barrierflow_'", name)


@final
class MetricsRegistry:
    """The metrics of one runtime (see the module docstring)."""

    def __init__(self) -> None:
        self._histograms: dict[str, Histogram] = {}
        self._sources: dict[str, Callable[[], Iterable[MetricFamily]]] = {}
        self._refreshers: dict[str, Callable[[], Coroutine[Any, Any, None]]] = {}

    def histogram(
        self,
        name: str,
        help: str,
        labels: Sequence[str] = (),
        buckets: Sequence[float] = LATENCY_BUCKETS,
    ) -> Histogram:
        """The histogram ``name``, made on first use (later calls return the same one)."""
        existing = self._histograms.get(name)
        if existing is None:
            existing = self._histograms[name] = Histogram(name, help, labels, buckets)
        return existing

    def add_source(
        self,
        key: str,
        source: Callable[[], Iterable[MetricFamily]],
        refresh: Callable[[], Coroutine[Any, Any, None]] | None = None,
    ) -> None:
        """Collect ``source()`` with every collection, until :meth:`remove_source` (a part
        outside the graph: a Spark bridge, a feed's driver side); ``refresh()`` is awaited
        first in every :meth:`snapshot` (it bounds its own time, see :func:`refresh_parts`)."""
        if not callable(source):
            raise InvalidArgumentError("source", "a callable returning metric families", source)
        if refresh is not None and not callable(refresh):
            raise InvalidArgumentError("refresh", "None or an async callable", refresh)
        self._sources[key] = source
        if refresh is not None:
            self._refreshers[key] = refresh

    def remove_source(self, key: str) -> None:
        """Stop collecting the source added as ``key`` (idempotent)."""
        self._sources.pop(key, None)
        self._refreshers.pop(key, None)

    async def snapshot(self) -> list[MetricFamily]:
        """Refresh the sources that need it (concurrently), then :meth:`collect`."""
        async with anyio.create_task_group() as tg:
            for refresh in list(self._refreshers.values()):
                tg.start_soon(refresh)
        return self.collect()

    def collect(self) -> list[MetricFamily]:
        """Every metric now: the sources' and the histograms', families of one name merged
        (two sinks report the same family with different labels)."""
        merged: dict[str, MetricFamily] = {}
        for source in list(self._sources.values()):
            for family in source():
                _merge(merged, family)
        for histogram in self._histograms.values():
            _merge(merged, histogram.family())
        return list(merged.values())


def _merge(into: dict[str, MetricFamily], family: MetricFamily) -> None:
    known = into.get(family.name)
    if known is None:
        into[family.name] = family
    else:
        into[family.name] = MetricFamily(
            known.name, known.kind, known.help, known.samples + family.samples
        )
