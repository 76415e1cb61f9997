"""``barrierflow top`` as a person watches it: a live view that waits for its endpoint, the
percentiles it shows (estimated as Prometheus's ``histogram_quantile`` does), and what its
header and sinks table say. The loop is driven with an injected fetch, clock and sleep: no
wall-clock waits. (A frame of a live runtime's endpoint: ``test_metrics.py``.)"""

from __future__ import annotations

import io
import math
import random
import socket
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client.exposition import start_http_server
from prometheus_client.registry import CollectorRegistry
from rich.console import Console, RenderableType

from barrierflow.app.top import EndpointError, Scrape, render, retry_backoff, scrape, watch
from barrierflow.errors import InvalidArgumentError
from barrierflow.runtime.metrics import (
    MetricFamily,
    MetricsRegistry,
    counter,
    gauge,
    histogram_quantile,
)
from barrierflow.runtime.metrics_server import to_prometheus

INF = math.inf
#: Upper bound → cumulative count: 2 values ≤ 0.1, 4 in (0.1, 1], 2 in (1, 10], 2 above 10.
BUCKETS = [(0.1, 2.0), (1.0, 6.0), (10.0, 8.0), (INF, 10.0)]


class HalfDraw(random.Random):
    """A jitter source whose every draw is 0.5: each retry waits half its un-jittered delay."""

    def random(self) -> float:
        return 0.5


def text(renderable: RenderableType) -> str:
    console = Console(record=True, width=160, force_terminal=False, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def free_port() -> int:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port: int = free.getsockname()[1]
    return port


@pytest.mark.parametrize(
    ("q", "expected"),
    [
        (0.5, 0.1 + 0.9 * 3 / 4),  # rank 5: 3 of the 4 values of (0.1, 1]
        (0.75, 1.0 + 9.0 * 1.5 / 2),  # rank 7.5: 1.5 of the 2 values of (1, 10]
        (0.1, 0.0 + 0.1 * 1 / 2),  # rank 1 in the first bucket: from 0 to its bound
        (0.2, 0.1),  # rank 2: exactly the first bucket's bound
        (0.0, 0.0),  # rank 0: the first bucket's lower bound
        (0.9, 10.0),  # rank 9 in +Inf: the highest finite bound
        (1.0, 10.0),
    ],
)
def test_histogram_quantile_interpolates_inside_the_bucket_as_prometheus_does(
    q: float, expected: float
) -> None:
    assert histogram_quantile(q, BUCKETS) == pytest.approx(expected)
    assert histogram_quantile(q, list(reversed(BUCKETS))) == pytest.approx(expected)  # any order


def test_histogram_quantile_edge_cases_give_a_bound_or_no_value() -> None:
    # Everything above the last finite bound: any quantile is that bound.
    assert histogram_quantile(0.01, [(0.1, 0.0), (1.0, 0.0), (INF, 5.0)]) == 1.0
    assert histogram_quantile(0.99, [(0.1, 0.0), (1.0, 0.0), (INF, 5.0)]) == 1.0
    # A first bucket whose bound is not positive has no lower bound to interpolate from.
    assert histogram_quantile(0.5, [(0.0, 3.0), (1.0, 4.0), (INF, 4.0)]) == 0.0
    # An empty first bucket at q = 0: its lower bound, not 0/0.
    assert histogram_quantile(0.0, [(0.1, 0.0), (1.0, 4.0), (INF, 4.0)]) == 0.0
    # No value: an empty histogram, no buckets, no +Inf bucket, no finite bucket.
    assert histogram_quantile(0.5, [(0.1, 0.0), (INF, 0.0)]) is None
    assert histogram_quantile(0.5, []) is None
    assert histogram_quantile(0.5, [(0.1, 2.0), (1.0, 3.0)]) is None
    assert histogram_quantile(0.5, [(INF, 3.0)]) is None
    for q in (-0.1, 1.5, math.nan, True, "0.5"):
        with pytest.raises(InvalidArgumentError) as raised:
            histogram_quantile(q, BUCKETS)  # type: ignore[arg-type]
        assert raised.value.argument == "q"
        assert raised.value.got is q


class Served:
    """A Prometheus endpoint on ``port`` serving a registry as a runtime's does (one actor,
    its rows moving by 100 a scrape, and a barrier latency histogram); started on cue."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.rows = 0.0
        self.server: Any = None
        self.registry = MetricsRegistry()
        self.registry.add_source("runtime", self.families)
        latency = self.registry.histogram("barrierflow_barrier_latency_seconds", "", ("stage",))
        for seconds in (0.004, 0.02, 0.03):
            latency.observe(seconds, "collected")

    def families(self) -> list[MetricFamily]:
        self.rows += 100
        labels = {"actor": "map", "job": "main"}
        return [
            counter("barrierflow_actor_rows_in", "rows", [(labels, self.rows)]),
            gauge("barrierflow_epoch_committed", "epoch", [({}, 7.0)]),
        ]

    def collect(self) -> list[Any]:
        return to_prometheus(self.registry.collect())

    def start(self) -> None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        self.server, thread = start_http_server(self.port, addr="127.0.0.1", registry=registry)
        self.thread = thread

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.thread.join()


@pytest.fixture
def served() -> Iterator[Served]:
    endpoint = Served(free_port())
    yield endpoint
    endpoint.stop()


def test_live_top_waits_for_an_endpoint_that_is_not_up_then_draws_its_next_frame(
    served: Served,
) -> None:
    url = f"http://127.0.0.1:{served.port}/metrics"
    now = [1000.0]
    shown: list[str] = []
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += seconds
        if served.server is None:  # top waited once: the endpoint comes up
            served.start()

    watch(
        url,
        2.0,
        fetch=lambda u: replace(scrape(u, timeout=5.0), at=now[0]),
        show=lambda frame: shown.append(text(frame)),
        sleep=sleep,
        backoff=retry_backoff(2.0, HalfDraw()),
        stop=lambda: any("actors" in frame for frame in shown),
    )
    waiting, connected, frame = shown
    # The endpoint was not up: top said so, with the cause and its wait (half of 10 ms).
    assert waiting.strip() == f"barrierflow top waiting for {url} — connection refused, " \
        "retrying in 5 ms"  # fmt: skip
    assert connected.strip() == f"barrierflow top {url} — connected, first frame in 2.0 s"
    assert sleeps == [0.005, 2.0, 2.0]
    # Its next frame: the data of the two scrapes after it came up (100 rows in 2 s).
    assert f"barrierflow top {url}" in frame
    rows = [[c.strip() for c in line.strip("│ ").split("│")] for line in frame.splitlines()]
    assert next(r for r in rows if r[0] == "map")[:3] == ["map", "main", "50"]
    assert "committed epoch 7" in frame
    # Its percentiles are interpolated in their buckets: 4, 20 and 30 ms observed, the median
    # is half-way through (10, 25] ms and the p99 97 % through (25, 50] ms.
    assert next(r for r in rows if r[0] == "injected → collected")[1:3] == ["18 ms", "49 ms"]


def test_once_on_an_endpoint_that_is_not_up_fails_naming_the_url_and_the_cause() -> None:
    url = f"http://127.0.0.1:{free_port()}/metrics"
    with pytest.raises(EndpointError) as raised:
        scrape(url, timeout=5.0)
    assert (raised.value.url, raised.value.reason) == (url, "connection refused")
    assert raised.value.cause.startswith("URLError: ")


def at(seconds: float, rows_in: float, **extra: list[tuple[dict[str, str], float]]) -> Scrape:
    samples: dict[str, list[tuple[dict[str, str], float]]] = {
        "barrierflow_actor_rows_in_total": [({"actor": "map", "job": "main"}, rows_in)],
        **extra,
    }
    return Scrape(seconds, samples, 1_700_000_000.0 + seconds)


def test_live_top_waits_again_when_the_endpoint_goes_away_and_no_rate_spans_the_gap() -> None:
    url = "http://127.0.0.1:9464/metrics"
    down = EndpointError(url, "URLError: refused", "connection refused")
    # Up (rows 0, 100), gone twice, back after a restart (its counter started over: 10, 30).
    readings: list[Scrape | EndpointError] = [
        at(0, 0), at(2, 100), down, down, at(10, 10), at(12, 30)
    ]  # fmt: skip
    shown: list[str] = []
    sleeps: list[float] = []

    def fetch(_: str) -> Scrape:
        reading = readings.pop(0)
        if isinstance(reading, EndpointError):
            raise reading
        return reading

    watch(
        url,
        2.0,
        fetch=fetch,
        show=lambda frame: shown.append(text(frame)),
        sleep=sleeps.append,
        backoff=retry_backoff(2.0, HalfDraw()),
        stop=lambda: not readings,
    )
    assert len(shown) == 6
    assert "connected" in shown[0]
    assert "connected" in shown[4]
    # The schedule grows while the endpoint stays away (10 ms, then 100 ms, half each)...
    assert "connection refused, retrying in 5 ms" in shown[2]
    assert "connection refused, retrying in 50 ms" in shown[3]
    assert sleeps == [2.0, 2.0, 0.005, 0.05, 2.0, 2.0]

    def rate(frame: str) -> str:
        rows = [[c.strip() for c in line.strip("│ ").split("│")] for line in frame.splitlines()]
        return next(r for r in rows if r[0] == "map")[2]

    # ... and the frame after it comes from the two scrapes since (20 rows in 2 s), not from
    # the last one before (which would read 30 - 100 rows in 10 s).
    assert (rate(shown[1]), rate(shown[5])) == ("50", "10")


def test_top_shows_the_version_cpu_rss_and_how_long_ago_each_sink_committed() -> None:
    info = {"version": "9.9.9", "python": "3.11.9", "pyarrow": "17.0.0", "backend": "trio"}

    def sinks(committed: float) -> dict[str, list[tuple[dict[str, str], float]]]:
        return {
            "barrierflow_build_info": [(info, 1.0)],
            "process_cpu_seconds_total": [({}, committed / 10)],
            "process_resident_memory_bytes": [({}, 150 * 2**20)],
            "barrierflow_sink_committed_epochs_total": [
                ({"sink": "out"}, committed),
                ({"sink": "idle"}, 0.0),
            ],
            "barrierflow_sink_last_commit_timestamp_seconds": [
                ({"sink": "out"}, 1_700_000_000.0 + 2 - 3.4),  # 3.4 s before the scrape
            ],
        }

    before, after = at(0, 0, **sinks(5)), at(2, 100, **sinks(10))  # 0.5 CPU s in 2 s
    frame = text(render(before, after, "http://h:1/metrics"))
    assert "barrierflow top http://h:1/metrics — barrierflow 9.9.9, CPU 25%, RSS 150.0 MiB" in frame
    rows = [[c.strip() for c in line.strip("│ ").split("│")] for line in frame.splitlines()]
    assert next(r for r in rows if r[0] == "out")[1:3] == ["10", "3 s ago"]
    assert next(r for r in rows if r[0] == "idle")[1:3] == ["0", "-"]  # never committed
    # An endpoint without the process collector (not Linux) or build info: nothing made up.
    bare = text(render(at(0, 0), at(2, 100), "http://h:1/metrics"))
    assert "barrierflow top http://h:1/metrics — barrierflow ?\n" in bare


def test_top_shows_each_operator_with_its_own_counters() -> None:
    def operators(rows: float) -> dict[str, list[tuple[dict[str, str], float]]]:
        labels = {"actor": "enrich", "operator": "async_map"}
        window = {"actor": "per_minute", "operator": "window_aggregate"}
        return {
            "barrierflow_operator_rows_in_total": [(labels, rows), (window, 2 * rows)],
            "barrierflow_operator_rows_out_total": [(labels, rows / 2), (window, 0.0)],
            "barrierflow_operator_calls_in_flight": [(labels, 17.0)],
            "barrierflow_operator_call_retries_total": [(labels, 4.0)],
            "barrierflow_operator_call_timeouts_total": [(labels, 3.0)],
            "barrierflow_operator_late_rows_total": [(window, 9.0)],
            "barrierflow_operator_late_rows_dropped_total": [(window, 2.0)],
            "barrierflow_operator_state_rows": [(window, 1234.0)],
        }

    frame = text(render(at(0, 0, **operators(0)), at(2, 100, **operators(200)), "u"))
    rows = [[c.strip() for c in line.strip("│ ").split("│")] for line in frame.splitlines()]
    assert next(r for r in rows if r[0] == "enrich") == [
        "enrich", "async_map", "100", "50", "17", "4 / 3", "0 (0)", "0",
    ]  # fmt: skip
    assert next(r for r in rows if r[0] == "per_minute")[1:] == [
        "window_aggregate", "200", "0", "0", "0 / 0", "9 (2)", "1,234",
    ]  # fmt: skip
    # A graph without operators shows no operators table.
    assert "operators" not in text(render(at(0, 0), at(2, 100), "u"))


def test_top_shows_an_operator_run_in_spark_tasks_apart_from_its_driver_instance() -> None:
    # On the executor path the driver's instance of a chain's actor reads no row; the tasks'
    # counters come back labelled on="executors" (spark_bridge/executor_metrics.py).
    def operators(rows: float) -> dict[str, list[tuple[dict[str, str], float]]]:
        driver = {"actor": "enrich", "operator": "async_map"}
        tasks = {**driver, "on": "executors"}
        return {
            "barrierflow_operator_rows_in_total": [(driver, 0.0), (tasks, rows)],
            "barrierflow_operator_rows_out_total": [(driver, 0.0), (tasks, rows / 2)],
            "barrierflow_operator_call_retries_total": [(tasks, 6.0)],
        }

    frame = text(render(at(0, 0, **operators(0)), at(2, 100, **operators(200)), "u"))
    rows = [[c.strip() for c in line.strip("│ ").split("│")] for line in frame.splitlines()]
    assert next(r for r in rows if r[0] == "enrich")[2:4] == ["0", "0"]
    assert next(r for r in rows if r[0] == "enrich (executors)")[2:6] == [
        "100", "50", "0", "6 / 0",
    ]  # fmt: skip
