"""``barrierflow top URL``: a live view of a running pipeline, read from its metrics endpoint
(``RuntimeConfig(metrics_port=...)``).

Every ``--interval`` seconds it scrapes the endpoint (parsed with prometheus_client's own
parser) and redraws, with rich, what a Flink or RisingWave user looks at first:

* **jobs** — ready or the phase of their backfill, with how far it is (splits finished,
  vnodes done, epochs owed);
* **actors** — rows/s in and out, and the share of the last interval each was busy,
  backpressured (blocked on a full output) or idle (waiting for input): the actor that is
  busy while its upstream is backpressured is the bottleneck;
* **barriers** — the median and the slowest (p99) latency of each stage, injected →
  collected by every actor → checkpoint durable, and the epochs in flight;
* **sinks** — epochs committed and pending, commit retries, how long a commit takes (median
  and p99) and how long after its checkpoint was durable an epoch was committed (p99);
* **operators** — per operator (map, filter, async_map, aggregate, window): rows/s in and out,
  calls in flight, retries and timeouts, late rows (and how many were beyond the allowed
  lateness), rows of state (when there are any);
* **feeds and the Spark bridge** — batches, rows and replays skipped (when there are any);
* **splits** — per split of each split source and source backfill, records read, records/s
  and the lag in records behind the log's latest (``-`` where the log cannot tell; when there
  are any).

The header names the runtime's version (``barrierflow_build_info``) and its process's CPU
(the share of one core over the last interval) and resident memory (prometheus_client's
process collector); each sink says how long ago its last commit went through
(``barrierflow_sink_last_commit_timestamp_seconds``).

Live, an endpoint that is not up yet or goes away is waited for, not a reason to exit: the
screen says so ("waiting for URL — connection refused, retrying in 1.2 s") and top tries again
on the library's retry schedule (:class:`~barrierflow._backoff.RetryBackoff`, capped at the
interval), then draws the next frame from two good scrapes (a rate never spans the gap: the
runtime may have restarted). ``--once`` scrapes twice, one interval apart, prints one frame and
exits (for scripts and tests); there an endpoint that cannot be read is one line naming the URL
and the cause.
"""

from __future__ import annotations

import random
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table

from barrierflow._backoff import RetryBackoff
from barrierflow._extras import require
from barrierflow.channels.errors import BarrierflowError, InvalidArgumentError
from barrierflow.runtime.metrics import histogram_quantile

__all__ = ["EndpointError", "Scrape", "render", "retry_backoff", "run_top", "scrape", "watch"]

#: The first retry delay of a live top whose endpoint cannot be read (seconds): the library's
#: schedule from there (10 ms, 100 ms, 1 s, ... with full jitter), capped at the interval.
FIRST_RETRY = 0.01


class EndpointError(BarrierflowError):
    """The metrics endpoint could not be read.

    Attributes:
        url: the endpoint.
        cause: what went wrong, with the exception's type (for the one-line error).
        reason: the same in a few words, for top's waiting line ("connection refused").
    """

    def __init__(self, url: str, cause: str, reason: str | None = None) -> None:
        self.url = url
        self.cause = cause
        self.reason = cause if reason is None else reason
        super().__init__(f"metrics endpoint {url!r}: expected Prometheus metrics, got {cause}")


@dataclass(frozen=True, slots=True)
class Scrape:
    """One reading of the endpoint: when (``at``, monotonic seconds, for rates; ``wall``, Unix
    seconds, for the age of a timestamp the endpoint reports), and every sample by name and
    labels."""

    at: float
    samples: Mapping[str, list[tuple[dict[str, str], float]]]
    wall: float = 0.0

    def values(self, name: str) -> list[tuple[dict[str, str], float]]:
        """The samples of ``name`` (a counter's with ``_total``, a bucket's with ``_bucket``)."""
        return self.samples.get(name, [])

    def one(self, name: str, **labels: str) -> float:
        """The value of ``name`` with ``labels`` (0 if absent); a label given as ``""``
        matches a sample without it."""
        for have, value in self.values(name):
            if all(have.get(k, "") == v for k, v in labels.items()):
                return value
        return 0.0


def scrape(url: str, timeout: float = 10.0) -> Scrape:
    """Read ``url`` once.

    Raises:
        EndpointError: it cannot be reached, or what it serves is not Prometheus text.
    """
    parser = require("metrics", "prometheus_client.parser")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            text = response.read().decode()
        samples: dict[str, list[tuple[dict[str, str], float]]] = {}
        for family in parser.text_string_to_metric_families(text):
            for sample in family.samples:
                samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    except (OSError, urllib.error.URLError) as exc:
        raise EndpointError(url, f"{type(exc).__name__}: {exc}", _reason(exc)) from None
    except ValueError as exc:
        raise EndpointError(
            url, f"text that is not Prometheus's format ({exc})", "not Prometheus text"
        ) from None
    if not any(name.startswith("barrierflow_") for name in samples):
        raise EndpointError(
            url, "no barrierflow_ metric (is it a barrierflow runtime?)", "no barrierflow_ metric"
        )
    return Scrape(time.monotonic(), samples, time.time())


def _reason(exc: OSError) -> str:
    """``exc`` in a few words: ``connection refused``, ``timed out``, ``HTTP 404 Not Found``."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    cause: object = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(cause, TimeoutError):
        return "timed out"
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror[:1].lower() + cause.strerror[1:]
    return str(cause) or type(cause).__name__


def _rate(before: Scrape, after: Scrape, name: str, labels: Mapping[str, str]) -> float:
    seconds = max(after.at - before.at, 1e-9)
    return (after.one(name, **labels) - before.one(name, **labels)) / seconds


def _quantile(scrape: Scrape, name: str, q: float, **labels: str) -> float | None:
    """Quantile ``q`` of histogram ``name``, as Prometheus estimates it (``None``: empty)."""
    buckets = [
        (float(have["le"]), value)
        for have, value in scrape.values(f"{name}_bucket")
        if all(have.get(k) == v for k, v in labels.items())
    ]
    return histogram_quantile(q, buckets)


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.1f} s"


def _ago(scrape: Scrape, timestamp: float | None) -> str:
    """How long before ``scrape`` the Unix time ``timestamp`` was (``-``: none)."""
    if timestamp is None:
        return "-"
    age = max(scrape.wall - timestamp, 0.0)  # two machines' clocks may disagree a little
    if age < 120:
        return f"{age:.0f} s ago"
    if age < 7200:
        return f"{age / 60:.0f} min ago"
    return f"{age / 3600:.1f} h ago"


def _bytes(value: float) -> str:
    """``value`` bytes in MiB, or GiB from one GiB on (a process's memory)."""
    return f"{value / 2**30:.1f} GiB" if value >= 2**30 else f"{value / 2**20:.1f} MiB"


def _process(before: Scrape, after: Scrape) -> str:
    """The runtime's version, and its process's CPU (share of one core over the interval) and
    resident memory, where the endpoint reports them."""
    info = after.values("barrierflow_build_info")
    parts = [f"barrierflow {info[0][0].get('version', '?')}" if info else "barrierflow ?"]
    if after.values("process_cpu_seconds_total"):
        cpu = _rate(before, after, "process_cpu_seconds_total", {})
        parts.append(f"CPU {max(cpu, 0.0):.0%}")
    if after.values("process_resident_memory_bytes"):
        parts.append(f"RSS {_bytes(after.one('process_resident_memory_bytes'))}")
    return ", ".join(parts)


def _share(before: Scrape, after: Scrape, kind: str, labels: Mapping[str, str]) -> float:
    return _rate(before, after, f"barrierflow_actor_{kind}_seconds_total", labels)


def render(before: Scrape, after: Scrape, url: str) -> Group:
    """One frame from two scrapes (see the module docstring)."""
    jobs = Table(title="jobs", title_justify="left", expand=True)
    for column in ("job", "phase", "backfill", "rows backfilled", "splits / vnodes / owed"):
        jobs.add_column(column)
    phases = {have["job"]: have["phase"] for have, _ in after.values("barrierflow_job_phase")}
    for have, fraction in after.values("barrierflow_backfill_fraction"):
        job = have["job"]
        filled = round(fraction * 20)
        bar = "█" * filled + "░" * (20 - filled) + f" {fraction:.0%}"
        rows = after.one("barrierflow_backfill_rows", job=job)
        jobs.add_row(job, phases.get(job, "?"), bar, f"{rows:,.0f}", _backfill_detail(after, job))

    actors = Table(title="actors", title_justify="left", expand=True)
    for column in ("actor", "job", "rows/s in", "rows/s out", "busy", "backpressured", "idle"):
        actors.add_column(column, justify="left" if column in ("actor", "job") else "right")
    for have, _ in after.values("barrierflow_actor_rows_in_total"):
        labels = _placed(have)
        shares = [_share(before, after, k, labels) for k in ("busy", "backpressured", "idle")]
        actors.add_row(
            _actor_name(have),
            have.get("job", ""),
            f"{_rate(before, after, 'barrierflow_actor_rows_in_total', labels):,.0f}",
            f"{_rate(before, after, 'barrierflow_actor_rows_out_total', labels):,.0f}",
            *(f"{min(max(s, 0.0), 1.0):.0%}" for s in shares),
        )

    barriers = Table(title="barriers", title_justify="left", expand=True)
    for column in ("stage", "median", "p99", "count"):
        barriers.add_column(column)
    latency = "barrierflow_barrier_latency_seconds"
    slowest: tuple[float, str] = (-1.0, "-")
    for stage in ("collected", "durable"):
        p99 = _quantile(after, latency, 0.99, stage=stage)
        count = after.one(f"{latency}_count", stage=stage)
        barriers.add_row(
            f"injected → {stage}",
            _seconds(_quantile(after, latency, 0.5, stage=stage)),
            _seconds(p99),
            f"{count:,.0f}",
        )
        if p99 is not None and p99 > slowest[0]:
            slowest = (p99, stage)
    in_flight = after.one("barrierflow_barriers_in_flight")

    sinks = Table(title="sinks", title_justify="left", expand=True)
    for column in ("sink", "committed epochs", "last commit", "pending", "retries",
                   "commit p50 / p99", "durable → committed p99"):  # fmt: skip
        sinks.add_column(column)
    last_commits = {
        have["sink"]: at
        for have, at in after.values("barrierflow_sink_last_commit_timestamp_seconds")
    }
    for have, committed in after.values("barrierflow_sink_committed_epochs_total"):
        sink = have["sink"]
        commit = "barrierflow_sink_commit_seconds"
        sinks.add_row(
            sink,
            f"{committed:,.0f}",
            _ago(after, last_commits.get(sink)),
            f"{after.one('barrierflow_sink_pending_epochs', sink=sink):,.0f}",
            f"{after.one('barrierflow_sink_commit_retries_total', sink=sink):,.0f}",
            f"{_seconds(_quantile(after, commit, 0.5, sink=sink))} / "
            f"{_seconds(_quantile(after, commit, 0.99, sink=sink))}",
            _seconds(_quantile(after, "barrierflow_sink_commit_latency_seconds", 0.99, sink=sink)),
        )

    feeds = Table(title="feeds", title_justify="left", expand=True)
    for column in ("source", "batches", "rows", "rows/s", "replays skipped"):
        feeds.add_column(column)
    for prefix, label in (("feed", "actor"), ("bridge", "stream")):
        for have, batches in after.values(f"barrierflow_{prefix}_batches_total"):
            labels = {label: have[label]}
            feeds.add_row(
                f"{prefix} {have[label]}",
                f"{batches:,.0f}",
                f"{after.one(f'barrierflow_{prefix}_rows_total', **labels):,.0f}",
                f"{_rate(before, after, f'barrierflow_{prefix}_rows_total', labels):,.0f}",
                f"{after.one(f'barrierflow_{prefix}_replays_skipped_total', **labels):,.0f}",
            )

    splits = Table(title="splits", title_justify="left", expand=True)
    for column in ("actor", "split", "records read", "records/s", "lag (records)"):
        splits.add_column(column, justify="left" if column in ("actor", "split") else "right")
    lags = {
        (have["actor"], have["split"]): lag
        for have, lag in after.values("barrierflow_source_lag_records")
    }
    for have, read in after.values("barrierflow_source_records_read_total"):
        key = (have["actor"], have["split"])
        labels = {"actor": key[0], "split": key[1]}
        lag = lags.get(key)
        splits.add_row(
            f"{key[0]} ({have.get('kind', '?')})",
            key[1],
            f"{read:,.0f}",
            f"{_rate(before, after, 'barrierflow_source_records_read_total', labels):,.0f}",
            "-" if lag is None or lag != lag else f"{lag:,.0f}",  # NaN: the log cannot tell
        )

    operators = _operators(before, after)

    committed = after.one("barrierflow_epoch_committed")
    header = (
        f"[b]barrierflow top[/b] {url} — {_process(before, after)}\n"
        f"committed epoch {committed:.0f}, {in_flight:.0f} barrier(s) in flight, "
        f"slowest stage: {slowest[1]}"
    )
    # Operators, feeds and splits only where the graph has some.
    shown = [t for t in (operators, feeds, splits) if t.row_count]
    return Group(header, jobs, actors, barriers, sinks, *shown)


def _placed(labels: Mapping[str, str]) -> dict[str, str]:
    """An actor's labels and where it ran: the driver's instances carry no ``on`` label, and
    the counters of a chain run in Spark's tasks carry ``on="executors"``
    (:mod:`barrierflow.spark_bridge.executor_metrics`)."""
    return {"actor": labels["actor"], "on": labels.get("on", "")}


def _actor_name(labels: Mapping[str, str]) -> str:
    """An actor's name as a row shows it, marked when it ran in Spark's tasks."""
    on = labels.get("on")
    return f"{labels['actor']} ({on})" if on else labels["actor"]


def _operators(before: Scrape, after: Scrape) -> Table:
    """The operators' own counters (``barrierflow_operator_*``): rates in and out, calls in
    flight, retries and timeouts, late rows, state rows."""
    table = Table(title="operators", title_justify="left", expand=True)
    for column in ("actor", "operator", "rows/s in", "rows/s out", "calls in flight",
                   "retries / timeouts", "late (dropped)", "state rows"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("actor", "operator") else "right")
    for have, _ in after.values("barrierflow_operator_rows_in_total"):
        labels = _placed(have)

        def one(name: str, labels: dict[str, str] = labels) -> float:
            return after.one(f"barrierflow_operator_{name}", **labels)

        table.add_row(
            _actor_name(have),
            have.get("operator", "?"),
            f"{_rate(before, after, 'barrierflow_operator_rows_in_total', labels):,.0f}",
            f"{_rate(before, after, 'barrierflow_operator_rows_out_total', labels):,.0f}",
            f"{one('calls_in_flight'):,.0f}",
            f"{one('call_retries_total'):,.0f} / {one('call_timeouts_total'):,.0f}",
            f"{one('late_rows_total'):,.0f} ({one('late_rows_dropped_total'):,.0f})",
            f"{one('state_rows'):,.0f}",
        )
    return table


def _backfill_detail(after: Scrape, job: str) -> str:
    """Splits finished of total, vnodes done of total and epochs owed, where a job has any."""
    parts = []
    total = after.one("barrierflow_backfill_splits", job=job)
    if total:
        parts.append(f"splits {after.one('barrierflow_backfill_splits_finished', job=job):.0f}/"
                     f"{total:.0f}")  # fmt: skip
    total = after.one("barrierflow_backfill_vnodes", job=job)
    if total:
        parts.append(f"vnodes {after.one('barrierflow_backfill_vnodes_done', job=job):.0f}/"
                     f"{total:.0f}")  # fmt: skip
    owed = after.one("barrierflow_backfill_epochs_owed", job=job)
    if owed:
        parts.append(f"{owed:.0f} epoch(s) owed")
    return ", ".join(parts) or "-"


def retry_backoff(interval: float, rng: random.Random | None = None) -> RetryBackoff:
    """The retry schedule of a live top whose endpoint cannot be read: the library's one
    (from :data:`FIRST_RETRY`), capped at ``interval`` — top never waits longer between tries
    than between frames."""
    return RetryBackoff(FIRST_RETRY, max(interval, FIRST_RETRY), rng or random.Random())


def watch(
    url: str,
    interval: float,
    *,
    fetch: Callable[[str], Scrape],
    show: Callable[[RenderableType], None],
    sleep: Callable[[float], None],
    backoff: RetryBackoff,
    stop: Callable[[], bool] = lambda: False,
) -> None:
    """Top's live loop, until ``stop()``: ``fetch`` the endpoint, ``show`` a frame from the
    last two good scrapes, ``sleep`` the interval, again.

    A fetch that fails with :class:`EndpointError` is not the end: ``show`` says what top waits
    for and when it tries again, and the next try comes after ``backoff``'s delay (a success
    starts the schedule over). The scrape after a failure is the start of the next interval,
    not the end of one: a rate must not span the gap, where the runtime may have restarted
    and its counters with it. Everything it waits on is passed in, so that a test drives it
    without a wall clock.

    Args:
        url: the endpoint (named on screen).
        interval: seconds between frames.
        fetch: reads the endpoint (:func:`scrape`).
        show: draws a renderable (the live display's update).
        sleep: waits that many seconds.
        backoff: the retry schedule (:func:`retry_backoff`).
        stop: checked before each fetch; true ends the loop.
    """
    before: Scrape | None = None
    while not stop():
        try:
            after = fetch(url)
        except EndpointError as exc:
            before = None
            delay = backoff.failed()
            show(
                f"[b]barrierflow top[/b] waiting for {url} — {exc.reason}, "
                f"retrying in {_seconds(delay)}"
            )
            sleep(delay)
            continue
        backoff.succeeded()
        if before is None:
            show(f"[b]barrierflow top[/b] {url} — connected, first frame in {_seconds(interval)}")
        else:
            show(render(before, after, url))
        before = after
        sleep(interval)


def run_top(
    url: str,
    *,
    interval: float = 2.0,
    once: bool = False,
    console: Console | None = None,
    stop: Callable[[], bool] = lambda: False,
) -> None:
    """Show ``url``'s pipeline, redrawn every ``interval`` seconds until interrupted (or
    ``stop()``), waiting for the endpoint while it cannot be read (see :func:`watch`); with
    ``once``, one frame from two scrapes ``interval`` apart.

    Raises:
        InvalidArgumentError: ``url`` is not an http(s) URL or ``interval`` not > 0.
        EndpointError: (``once`` only) the endpoint cannot be read.
    """
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise InvalidArgumentError("url", "an http:// URL of a metrics endpoint", url)
    if type(interval) not in (int, float) or not 0 < interval < float("inf"):
        raise InvalidArgumentError("interval", "a number of seconds > 0", interval)
    console = console or Console()
    if once:
        before = scrape(url)
        time.sleep(interval)
        console.print(render(before, scrape(url), url))
        return
    with Live(console=console, auto_refresh=False) as live:
        watch(
            url,
            interval,
            fetch=scrape,
            show=lambda frame: live.update(frame, refresh=True),
            sleep=time.sleep,
            backoff=retry_backoff(interval),
            stop=stop,
        )
