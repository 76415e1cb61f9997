"""Watching a pipeline: the runtime's metrics registry, its Prometheus endpoint (scraped while
a graph runs, parsed with prometheus_client's own parser), job progress, both backends."""

from __future__ import annotations

import errno
import math
import platform
import re
import socket
import time
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import pyarrow as pa
import pytest
import structlog.testing
from _timeouts import scaled
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from barrierflow import __version__
from barrierflow.actors import DeclaredSink, SourceBackfill, SplitSource, add_sink
from barrierflow.actors.backfill._backfill_stage import LAG_EVERY
from barrierflow.actors.sources.split_log import Offset
from barrierflow.app.top import run_top
from barrierflow.channels import Chunk, Message, create_channel
from barrierflow.channels.mutation import Pause
from barrierflow.errors import (
    ActorFailedError,
    ConfigError,
    InvalidArgumentError,
    MetricsPortError,
)
from barrierflow.runtime import ActorContext, Job, Runtime, RuntimeConfig, StreamActor
from barrierflow.runtime._runtime_metrics import ActorTimes
from barrierflow.runtime.metrics import (
    Histogram,
    MetricFamily,
    MetricsRegistry,
    counter,
    refresh_parts,
)
from barrierflow.runtime.progress import JobProgress, Progress
from barrierflow.testing import FailingTable, FakeClock, ListTable
from barrierflow.testing.split_log import MemorySplitLog

SCHEMA = pa.schema([pa.field("id", pa.int64())])
WAIT = scaled(20)


class PassOn(StreamActor):
    async def process(self, message: Message, ctx: ActorContext) -> None:
        await ctx.emit(message)


def chunk(start: int, count: int) -> Chunk:
    return Chunk(pa.record_batch([pa.array(range(start, start + count), pa.int64())], SCHEMA))


def build(tmp_path: Path, **config: Any) -> tuple[Runtime, DeclaredSink]:
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=3600.0, **config))
    rt.add_source("src")
    rt.add_actor("pass", PassOn, inputs=["src"])
    sink = add_sink(rt, "out", ListTable(SCHEMA), input="pass", parallelism=2, key=("id",))
    return rt, sink


def scrape(url: str) -> dict[str, Any]:
    """The endpoint's families by name (counters without ``_total``), parsed by
    prometheus_client."""
    with urllib.request.urlopen(url, timeout=WAIT) as response:
        text = response.read().decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def value(families: dict[str, Any], name: str, **labels: str) -> float:
    suffix = "_total" if families[name].type == "counter" else ""
    for sample in families[name].samples:
        if sample.name == name + suffix and all(
            sample.labels.get(k) == v for k, v in labels.items()
        ):
            return float(sample.value)
    raise AssertionError(f"no sample of {name} with {labels}")


@pytest.mark.anyio
async def test_the_endpoint_serves_metrics_that_move_while_the_graph_runs_and_frees_its_port(
    tmp_path: Path,
) -> None:
    rt, out = build(tmp_path, metrics_port=0)
    assert rt.metrics_url is None  # not running
    async with rt:
        url = rt.metrics_url
        assert url is not None
        assert url.startswith("http://127.0.0.1:")  # loopback unless asked otherwise
        with anyio.fail_after(WAIT):
            await rt.push("src", chunk(0, 100))
            first_epoch = await rt.checkpoint()
            before = await anyio.to_thread.run_sync(scrape, url)
            await rt.push("src", chunk(100, 50))
            await rt.checkpoint()
            await rt.push("src", chunk(150, 50))
            second_epoch = await rt.checkpoint()
            await out.coordinator.wait_committed(second_epoch)
            sink = rt.stats()  # rt.stats() reads the same counters
            after = await anyio.to_thread.run_sync(scrape, url)
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    assert value(before, "barrierflow_actor_rows_in", actor="pass", job="main") == 100
    assert value(after, "barrierflow_actor_rows_in", actor="pass", job="main") == 200
    assert value(after, "barrierflow_actor_rows_out", actor="pass") == 200
    assert value(after, "barrierflow_channel_rows", channel="src->pass") == 200
    assert value(after, "barrierflow_epoch_committed") == second_epoch > first_epoch
    assert sink.committed_epoch == second_epoch
    # rt.stats() carries every metric collected with its counters, the sink's among them.
    assert sink.metric("barrierflow_sink_rows_committed", sink="out") == 200
    assert sink.metric("barrierflow_actor_rows_in", job="main", actor="pass") == 200
    assert sink.metric("barrierflow_actor_rows_in", actor="pass") is None  # labels exactly
    assert sink.metric("barrierflow_no_such_metric") is None
    # Barrier latency by stage: every barrier was collected, every checkpoint made durable.
    latency = after["barrierflow_barrier_latency_seconds"]
    counts = {s.labels["stage"]: s.value for s in latency.samples if s.name.endswith("_count")}
    assert counts["collected"] >= 4  # the initial barrier and three checkpoints
    assert counts["durable"] >= 3
    # The sink's coordinator reports: its epochs committed move.
    assert value(after, "barrierflow_sink_committed_epochs", sink="out") > value(
        before, "barrierflow_sink_committed_epochs", sink="out"
    )
    assert (
        value(after, "barrierflow_sink_rows_written", sink="out", actor="out.0")
        + value(after, "barrierflow_sink_rows_written", sink="out", actor="out.1")
        == 200
    )
    # Busy, backpressured, idle: seconds, none negative, the idle share of an idle graph large.
    for kind in ("busy", "backpressured", "idle"):
        assert value(after, f"barrierflow_actor_{kind}_seconds", actor="pass") >= 0
    assert value(after, "barrierflow_actor_idle_seconds", actor="pass") > 0
    # Stopped: nothing listens on the port any more (SO_REUSEADDR, as any server sets it:
    # the scrapes' connections may linger in TIME_WAIT, but a listener would refuse the bind).
    assert rt.metrics_url is None
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))
        probe.listen()


@pytest.mark.anyio
async def test_no_counter_goes_down_between_collects_across_long_waits(tmp_path: Path) -> None:
    # Between pushes every actor waits for input, and the collects go on during those waits:
    # busy time (uptime less the waits) must not grow during a wait and then fall back by its
    # length when the wait ends (Prometheus would read a counter reset). The same holds for
    # every counter and every histogram's cumulative samples.
    rt, out = build(tmp_path)
    last: dict[tuple[str, str, tuple[tuple[str, str], ...]], float] = {}
    checked = 0

    def collect_and_compare() -> None:
        nonlocal checked
        for family in rt.metrics.collect():
            if family.kind == "gauge":
                continue
            for sample in family.samples:
                key = (family.name, sample.suffix, sample.labels)
                before = last.get(key, 0.0)
                assert sample.value >= before, f"{key} went down: {before} -> {sample.value}"
                last[key] = sample.value
                checked += 1

    async with rt:
        with anyio.fail_after(WAIT):
            for round in range(12):
                await rt.push("src", chunk(10 * round, 10))
                if round % 4 == 3:
                    await out.coordinator.wait_committed(await rt.checkpoint())
                await anyio.wait_all_tasks_blocked()  # the rows went through: every actor waits
                for _ in range(10):  # scrapes during the wait, as a scraper's would land
                    collect_and_compare()
                    await anyio.lowlevel.checkpoint()
    busy = [k for k in last if k[0] == "barrierflow_actor_busy_seconds"]
    assert {dict(k[2])["actor"] for k in busy} >= {"pass", "out.0", "out.1"}
    pass_labels = next(k[2] for k in busy if dict(k[2])["actor"] == "pass")
    assert last[("barrierflow_actor_rows_in", "", pass_labels)] == 120
    assert checked > 0


class HoldRows(StreamActor):
    """Passes barriers on; holds the first chunk it reads until ``release`` is set."""

    def __init__(self, release: anyio.Event) -> None:
        self.release = release

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk):
            await self.release.wait()
        await ctx.emit(message)


@pytest.mark.anyio
async def test_an_actor_blocked_on_its_output_behind_a_merge_is_backpressured_not_idle(
    tmp_path: Path,
) -> None:
    # "join" merges two inputs and is blocked sending into "hold"'s full input, while its merge
    # waits on the two empty inputs: that is the merge's wait, not join's. Counted as join's
    # idle time, it would grow as fast as its backpressure, and its busy time, the uptime less
    # both, would fall.
    release = anyio.Event()
    rt = Runtime(
        RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=3600.0, channel_capacity=1)
    )
    rt.add_source("a")
    rt.add_source("b")
    rt.add_actor("join", PassOn, inputs=["a", "b"])
    rt.add_actor("hold", lambda: HoldRows(release), inputs=["join"])

    def times() -> tuple[float, float, float]:
        families = {f.name: f for f in rt.metrics.collect()}
        read = [
            families[f"barrierflow_actor_{kind}_seconds"].value(job="main", actor="join")
            for kind in ("busy", "backpressured", "idle")
        ]
        busy, pressured, idle = (float(v or 0.0) for v in read)
        return busy, pressured, idle

    async with rt:
        with anyio.fail_after(WAIT):
            for start in (0, 10, 20):  # hold takes one, its input one; join blocks on the third
                await rt.push("a", chunk(start, 10))
            await anyio.wait_all_tasks_blocked()
            assert rt.stats().channels["join->hold"].tasks_waiting_send == 1
            first = times()
            await anyio.wait_all_tasks_blocked()
            second = times()
            release.set()
    assert second[1] > first[1]  # backpressured: it grows
    assert second[2] == first[2]  # idle: join is not waiting for input, its merge is
    assert second[0] >= first[0]


def test_actor_times_never_report_less_than_they_reported_before() -> None:
    # Uptime less waits that grew as fast as it can round to a hair below the last reading
    # (here: a nanosecond); the reported busy time stays where it was instead.
    tx, _rx = create_channel[Message](1, name="src->pass")
    base = tx.statistics()
    reader = ActorTimes()
    first = reader.read(["pass"], {"src->pass": replace(base, receive_wait_seconds=1.0)}, 3.0, {})
    later = {"src->pass": replace(base, receive_wait_seconds=1.5 + 1e-9)}
    second = reader.read(["pass"], later, 3.5, {})
    assert first["pass"] == (2.0, 0.0, 1.0)
    assert second["pass"] == (2.0, 0.0, 1.5 + 1e-9)
    assert ActorTimes().read(["pass"], later, 3.5, {})["pass"][0] < 2.0  # what it guards


@pytest.mark.anyio
async def test_sink_pending_epochs_counts_only_epochs_whose_commit_is_still_to_go(
    tmp_path: Path,
) -> None:
    # Empty epochs are acknowledged with nothing to commit: never pending. An epoch with rows
    # is pending while its commit has not gone through, and no longer once it has.
    table = FailingTable(ListTable(SCHEMA))
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=3600.0))
    rt.add_source("src")
    out = add_sink(rt, "out", table, input="src")

    def pending() -> float | None:
        return rt.stats().metric("barrierflow_sink_pending_epochs", sink="out")

    async with rt:
        with anyio.fail_after(WAIT):
            for _ in range(5):  # an idle pipeline
                await out.coordinator.wait_committed(await rt.checkpoint())
            assert out.coordinator.stats().acked_epochs >= 5
            assert pending() == 0
            table.hang("commit")
            await rt.push("src", chunk(0, 10))
            with_rows = await rt.checkpoint()
            await table.wait_called("commit")
            assert pending() == 1  # its commit hangs; the empty epochs before it are not
            table.release("commit")
            await out.coordinator.wait_committed(with_rows)
            assert pending() == 0


@pytest.mark.anyio
async def test_two_runtimes_in_one_process_keep_separate_metrics(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, _ = build(tmp_path / "a")
    second, _ = build(tmp_path / "b")
    async with first, second:
        with anyio.fail_after(WAIT):
            await first.push("src", chunk(0, 7))
            await first.checkpoint()
            await second.checkpoint()
        ours = {f.name: f for f in first.metrics.collect()}
        theirs = {f.name: f for f in second.metrics.collect()}
    assert ours["barrierflow_actor_rows_in"].value(job="main", actor="pass") == 7
    assert theirs["barrierflow_actor_rows_in"].value(job="main", actor="pass") == 0
    assert first.metrics is not second.metrics


def test_a_port_in_use_or_a_bad_port_is_refused(tmp_path: Path) -> None:
    for bad in (-1, 70000, True, "9000"):
        with pytest.raises(ConfigError) as info:
            RuntimeConfig(state_path=tmp_path / "s.db", metrics_port=bad)  # type: ignore[arg-type]
        assert info.value.argument == "metrics_port"
    with pytest.raises(ConfigError) as info:
        RuntimeConfig(state_path=tmp_path / "s.db", metrics_host="")
    assert info.value.argument == "metrics_host"


@pytest.mark.anyio
async def test_a_metrics_port_in_use_fails_the_start_naming_it(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        rt, _ = build(tmp_path, metrics_port=port)
        with pytest.raises(MetricsPortError) as refused:
            async with rt:
                pass
    error = refused.value
    assert (error.argument, error.host, error.port) == ("metrics_port", "127.0.0.1", port)
    assert isinstance(error.__cause__, OSError)
    assert error.__cause__.errno == errno.EADDRINUSE
    assert error.reason == error.__cause__.strerror
    assert "RuntimeConfig.metrics_port: expected a port free to bind on 127.0.0.1" in str(error)
    assert rt.metrics_url is None  # nothing was started, nothing is left running


def test_histograms_count_into_buckets_and_give_quantiles() -> None:
    histogram = Histogram("barrierflow_test_seconds", "a test", ("stage",), (0.1, 1.0, 10.0))
    for seconds in (0.05, 0.5, 0.5, 5.0, 50.0):
        histogram.observe(seconds, "x")
    assert histogram.count("x") == 5
    assert histogram.count("y") == 0
    # Estimated inside the bucket as Prometheus's histogram_quantile does (test_top.py): the
    # median is 1.5 of the 2 values of (0.1, 1]; the maximum, past the last bound, that bound.
    assert histogram.quantile(0.5, "x") == pytest.approx(0.1 + 0.9 * 1.5 / 2)
    assert histogram.quantile(0.2, "x") == 0.1
    assert histogram.quantile(1.0, "x") == 10.0
    assert histogram.quantile(0.5, "y") is None
    family = histogram.family()
    buckets = [s.value for s in family.samples if s.suffix == "_bucket"]
    assert buckets == [1, 3, 4, 5]  # cumulative, +Inf last
    assert [s.value for s in family.samples if s.suffix == "_count"] == [5]
    with pytest.raises(InvalidArgumentError):
        histogram.observe(1.0)  # the stage label is missing
    with pytest.raises(InvalidArgumentError):
        Histogram("barrierflow_bad", "x", (), (1.0, 1.0))
    with pytest.raises(InvalidArgumentError):
        Histogram("no_prefix", "x")


def test_the_registry_merges_families_of_one_name_from_several_sources() -> None:
    registry = MetricsRegistry()
    registry.add_source("a", lambda: [counter("barrierflow_x", "x", [({"sink": "a"}, 1)])])
    registry.add_source("b", lambda: [counter("barrierflow_x", "x", [({"sink": "b"}, 2)])])
    (family,) = registry.collect()
    assert (family.value(sink="a"), family.value(sink="b")) == (1, 2)
    registry.remove_source("a")
    registry.remove_source("a")  # idempotent
    assert registry.collect()[0].value(sink="a") is None
    with pytest.raises(InvalidArgumentError):
        registry.add_source("c", "not callable")  # type: ignore[arg-type]


def test_job_progress_gives_a_phase_and_the_fraction_done() -> None:
    snapshot = Progress(rows=10, detail={"phase": "snapshot", "vnodes_left": 3, "vnodes_total": 4})
    splits = Progress(rows=5, detail={"s0": "finished", "s1": "caching_up"})
    job = JobProgress("j", 7, {"a": snapshot, "b": splits}, ready=False)
    assert job.fraction_done == pytest.approx((0.25 + 0.5) / 2)
    assert job.phase == "caching_up+snapshot"
    assert job.rows == 15
    assert (job.splits, job.vnodes, job.epochs_owed) == ((1, 2), (1, 4), 0)
    owing = Progress(detail={"phase": "change_log", "epochs_owed": 3, "vnodes_left": 0,
                             "vnodes_total": 4})  # fmt: skip
    two = JobProgress("j", 7, {"a": snapshot, "c": owing}, ready=False)
    assert (two.splits, two.vnodes, two.epochs_owed) == ((0, 0), (5, 8), 3)
    # Where an actor knows the rows it expects in all, its share is its rows of them.
    counted = JobProgress("j", 7, {"a": Progress(rows=30, total=120)}, ready=False)
    assert counted.fraction_done == 0.25
    assert JobProgress("j", 7, {"a": Progress(rows=9, total=9)}, ready=False).fraction_done == 0.99
    for total in (-1, 29, "120", 1.5):
        with pytest.raises(InvalidArgumentError):
            Progress(rows=30, total=total)  # type: ignore[arg-type]
    done = JobProgress("j", 7, {"a": Progress(finished=True)}, ready=True)
    assert (done.fraction_done, done.phase) == (1.0, "ready")
    assert JobProgress("j", 0, {}, ready=True).fraction_done == 1.0


@pytest.mark.anyio
async def test_top_shows_jobs_actors_barriers_and_sinks_of_a_live_endpoint(tmp_path: Path) -> None:
    rt, out = build(tmp_path, metrics_port=0)
    console = Console(record=True, width=140, force_terminal=False)
    async with rt:
        url = rt.metrics_url
        assert url is not None
        with anyio.fail_after(WAIT):
            await rt.push("src", chunk(0, 100))
            await out.coordinator.wait_committed(await rt.checkpoint())
            await anyio.to_thread.run_sync(
                lambda: run_top(url, interval=0.2, once=True, console=console)
            )
    frame = console.export_text()
    for heading in ("jobs", "actors", "barriers", "sinks"):
        assert heading in frame
    assert "\nsplits" not in frame  # no split source: no table of splits
    assert "barrierflow top " + url in frame
    rows = [[c.strip() for c in line.strip("│ ").split("│")] for line in frame.splitlines()]
    assert next(r[:2] for r in rows if r[0] == "main") == ["main", "ready"]
    assert any(r[:2] == ["pass", "main"] for r in rows)  # an actor's row
    assert any(r[0] == "injected → durable" for r in rows)
    sink = next(r for r in rows if r[0] == "out")  # the sink's row: one commit, timed
    assert [sink[1], *sink[3:5]] == ["1", "0", "0"]
    assert re.fullmatch(r"\d+ s ago", sink[2]), sink
    assert re.fullmatch(r"\d+ ms / \d+ ms", sink[5]), sink
    assert re.fullmatch(r"\d+ ms", sink[6]), sink
    # The header: the runtime's version, its process's CPU and memory.
    assert re.search(rf"— barrierflow {re.escape(__version__)}, CPU \d+%, RSS [\d.]+ MiB", frame)


@pytest.mark.anyio
async def test_the_endpoint_serves_process_platform_and_build_info(
    tmp_path: Path, anyio_backend_name: str
) -> None:
    rt, _ = build(tmp_path, metrics_port=0)
    async with rt:
        url = rt.metrics_url
        assert url is not None
        with anyio.fail_after(WAIT):
            families = await anyio.to_thread.run_sync(scrape, url)
    # prometheus_client's process and platform collectors, in the runtime's registry.
    assert value(families, "process_cpu_seconds") > 0
    assert value(families, "process_resident_memory_bytes") > 2**20
    assert value(families, "process_open_fds") > 0
    (python,) = families["python_info"].samples
    assert python.labels["version"] == platform.python_version()
    # What runs: barrierflow's version, Python's, pyarrow's and the backend.
    (info,) = families["barrierflow_build_info"].samples
    assert info.value == 1
    assert info.labels == {
        "version": __version__,
        "python": platform.python_version(),
        "pyarrow": pa.__version__,
        "backend": anyio_backend_name,
    }


@pytest.mark.anyio
async def test_a_sink_reports_the_wall_clock_time_of_its_last_commit(tmp_path: Path) -> None:
    rt, out = build(tmp_path)
    last_commit = "barrierflow_sink_last_commit_timestamp_seconds"
    async with rt:
        with anyio.fail_after(WAIT):
            # No commit yet: no sample (0 would be a commit in 1970 to an alert on time() - x).
            assert rt.stats().metric(last_commit, sink="out") is None
            times = []
            for start in (0, 10):
                before = time.time()
                await rt.push("src", chunk(start, 10))
                await out.coordinator.wait_committed(await rt.checkpoint())
                after = time.time()
                times.append(rt.stats().metric(last_commit, sink="out"))
                assert times[-1] is not None
                # The commit of the rows went through after they came, before it was seen.
                assert before <= times[-1] <= after
    assert times[0] <= times[1]


def test_top_on_a_dead_endpoint_is_one_line_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    from barrierflow.app.cli import main

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    url = f"http://127.0.0.1:{port}/metrics"
    assert main(["top", url, "--once", "--interval", "0.1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("barrierflow: error: EndpointError: metrics endpoint ")
    assert f"{url!r}: expected Prometheus metrics, got URLError" in err[0]
    assert main(["top", "localhost:9464", "--once"]) == 2  # not a URL: bad input


class CountRows(StreamActor):
    """Keeps a row count in its state table: each checkpoint writes one state row."""

    async def restore(self, ctx: ActorContext) -> None:
        self.table = ctx.table("count")
        self.rows = 0

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk):
            self.rows += message.num_rows
            self.table.put("rows", self.rows)
        await ctx.emit(message)


@pytest.mark.anyio
async def test_merges_report_their_alignment_and_checkpoints_their_state_rows(
    tmp_path: Path,
) -> None:
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=3600.0))
    rt.add_source("left")
    rt.add_source("right")
    rt.add_actor("both", CountRows, inputs=["left", "right"])
    async with rt:
        with anyio.fail_after(WAIT):
            for epoch in range(3):
                await rt.push("left", chunk(epoch * 10, 10))
                await rt.checkpoint()
        families = {f.name: f for f in rt.metrics.collect()}
    alignment = families["barrierflow_merge_alignment_seconds"].value(job="main", actor="both")
    assert alignment is not None
    assert alignment >= 0
    # One put per epoch, and the runtime's own rows (its job catalog).
    written = families["barrierflow_checkpoint_rows_written"].value()
    assert written is not None
    assert written >= 3
    assert families["barrierflow_actor_rows_in"].value(job="main", actor="both") == 30


class FailOnce(StreamActor):
    """Fails on its first chunk, once per test (class-level: survives the rebuild)."""

    failed = False

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk) and not FailOnce.failed:
            FailOnce.failed = True
            raise RuntimeError("injected fault")
        await ctx.emit(message)


@pytest.mark.anyio
async def test_a_recovery_is_counted_and_timed(tmp_path: Path) -> None:
    FailOnce.failed = False
    rt = Runtime(
        RuntimeConfig(
            state_path=tmp_path / "state.db", barrier_interval=3600.0, recovery=True,
            restart_backoff=0.01,
        )
    )  # fmt: skip
    rt.add_source("src")
    rt.add_actor("flaky", FailOnce, inputs=["src"])
    async with rt:
        with anyio.fail_after(WAIT):
            await rt.push("src", chunk(0, 1))
            with pytest.raises(ActorFailedError):
                await rt.checkpoint()
            await rt.wait_running()
            await rt.checkpoint()
        families = {f.name: f for f in rt.metrics.collect()}
    assert families["barrierflow_restarts"].value() == 1
    counts = [
        s.value for s in families["barrierflow_recovery_seconds"].samples if s.suffix == "_count"
    ]
    assert counts == [1]
    (total,) = [
        s.value for s in families["barrierflow_recovery_seconds"].samples if s.suffix == "_sum"
    ]
    assert 0.01 <= total < WAIT  # at least the restart backoff


class Count(StreamActor):
    """Counts the rows it sees; ``reached(n)`` waits until it saw ``n``."""

    def __init__(self, counter: RowCounter) -> None:
        self._counter = counter

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk):
            self._counter.add(message.num_rows)
        else:
            await ctx.emit(message)


class RowCounter:
    def __init__(self) -> None:
        self.rows = 0
        self._changed = anyio.Event()

    def add(self, rows: int) -> None:
        self.rows += rows
        self._changed.set()
        self._changed = anyio.Event()

    async def reached(self, rows: int) -> None:
        while self.rows < rows:
            await self._changed.wait()


def family_values(families: list[MetricFamily], name: str) -> dict[tuple[str, str], float]:
    """``(actor, split)`` → value of a per-split family."""
    found = next((f for f in families if f.name == name), None)
    if found is None:
        return {}
    return {(dict(s.labels)["actor"], dict(s.labels)["split"]): s.value for s in found.samples}


@pytest.mark.anyio
async def test_sources_and_backfills_report_records_read_and_lag_per_split(tmp_path: Path) -> None:
    log = MemorySplitLog(pa.schema([("v", pa.int64())]), splits=["a", "b"])
    log.append("a", {"v": [1, 2, 3, 4, 5]})
    log.append("b", {"v": [1, 2, 3]})
    counted = RowCounter()
    config = RuntimeConfig(
        state_path=tmp_path / "state.db", barrier_interval=3600.0, metrics_port=0
    )
    rt = Runtime(config)
    # Two-row batches: a split's records read add up over its batches.
    rt.add_source("src", lambda: SplitSource(log, batch_rows=2))
    rt.add_actor("count", lambda: Count(counted), inputs=["src"])
    job = Job("history")
    job.add_actor("backfill", lambda: SourceBackfill(log, rate_limit=0), inputs=["src"])
    job.add_actor("tail", lambda: Count(RowCounter()), inputs=["backfill"])
    with anyio.fail_after(WAIT):
        async with rt:
            await counted.reached(8)
            caught_up = await rt.metrics.snapshot()
            await rt.mutate(Pause())
            log.append("a", {"v": [6, 7, 8, 9]})  # the paused source falls 4 behind in a
            handle = await rt.add_job(job)
            await rt.checkpoint()  # the job's first progress rides on a completed barrier
            behind = await rt.metrics.snapshot()
            progress = handle.progress()
            # The backfill asks its log beside its loop at each barrier; a later report gives
            # the rows it expects in all: none read, 9 + 3 ahead.
            while handle.progress().actors["backfill"].total is None:
                await rt.checkpoint()
            expected = handle.progress().actors["backfill"].total
            url = rt.metrics_url
            assert url is not None
            console = Console(record=True, width=140, force_terminal=False)
            await anyio.to_thread.run_sync(
                lambda: run_top(url, interval=0.2, once=True, console=console)
            )
    read = family_values(caught_up, "barrierflow_source_records_read")
    assert read == {("src", "a"): 5, ("src", "b"): 3}
    assert family_values(caught_up, "barrierflow_source_lag_records") == {
        ("src", "a"): 0,
        ("src", "b"): 0,
    }
    lag = family_values(behind, "barrierflow_source_lag_records")
    assert (lag[("src", "a")], lag[("src", "b")]) == (4, 0)
    # The joining job's backfill, paused (rate 0), has all the history ahead of it.
    assert (lag[("backfill", "a")], lag[("backfill", "b")]) == (9, 3)
    assert family_values(behind, "barrierflow_source_records_read")[("backfill", "a")] == 0
    families = {f.name: f for f in behind}
    assert families["barrierflow_backfill_splits"].value(job="history") == 2
    assert families["barrierflow_backfill_splits_finished"].value(job="history") == 0
    assert progress.splits == (0, 2)
    assert expected == 12
    assert families["barrierflow_job_phase"].value(job="history", phase="backfilling") == 1
    # ``top`` shows them: the job's splits, each split's records read and lag.
    frame = [
        [c.strip() for c in line.strip("│ ").split("│")]
        for line in console.export_text().splitlines()
    ]
    assert next(r for r in frame if r[0] == "history")[4] == "splits 0/2"
    assert ["src (source)", "a", "5", "0", "4"] in frame
    assert ["backfill (backfill)", "a", "0", "0", "9"] in frame


class Refreshing:
    """A part whose refresh ends, fails or never ends, as told."""

    def __init__(self, how: str) -> None:
        self.how = how
        self.refreshed = False

    async def refresh_metrics(self) -> None:
        if self.how == "fails":
            raise ConnectionError("log server gone")
        if self.how == "hangs":
            await anyio.Event().wait()
        self.refreshed = True


@pytest.mark.anyio
async def test_a_refresh_that_fails_or_overruns_logs_one_warning_naming_it() -> None:
    parts = {"good": Refreshing("ends"), "bad": Refreshing("fails"), "stuck": Refreshing("hangs")}
    with structlog.testing.capture_logs() as logs, anyio.fail_after(WAIT):
        await refresh_parts({**parts, "plain": object()}, each_within=0.05)
    assert parts["good"].refreshed
    warnings = {entry["part"]: entry for entry in logs if entry["log_level"] == "warning"}
    assert set(warnings) == {"bad", "stuck"}
    assert "ConnectionError('log server gone')" in warnings["bad"]["error"]
    assert warnings["stuck"]["event"] == "metrics refresh timed out; left unknown"


@pytest.mark.anyio
async def test_a_snapshot_refreshes_the_sources_that_ask_for_it_then_collects() -> None:
    registry = MetricsRegistry()
    seen: list[str] = []

    async def refresh() -> None:
        await anyio.lowlevel.checkpoint()
        seen.append("refreshed")

    def source() -> list[MetricFamily]:
        return [counter("barrierflow_x", "x", [({}, len(seen))])]

    registry.add_source("a", source, refresh)
    assert registry.collect()[0].value() == 0  # collect alone does not refresh
    assert (await registry.snapshot())[0].value() == 1
    registry.remove_source("a")
    assert await registry.snapshot() == []
    with pytest.raises(InvalidArgumentError):
        registry.add_source("b", source, "not callable")  # type: ignore[arg-type]


def test_the_runtime_reports_each_jobs_splits_vnodes_and_epochs_owed() -> None:
    from barrierflow.runtime import RuntimeStats
    from barrierflow.runtime._runtime_metrics import runtime_families
    from barrierflow.runtime.job import JobStats

    snapshot = Progress(detail={"phase": "change_log", "vnodes_left": 1, "vnodes_total": 4,
                                "epochs_owed": 2})  # fmt: skip
    splits = Progress(detail={"s0": "finished", "s1": "backfilling", "s2": "caching_up"})
    progress = {"copy": JobProgress("copy", 3, {"b": snapshot, "c": splits}, ready=False)}
    jobs = {name: JobStats(name, (), 0, 0, 0, ready=False) for name in ("copy", "main")}
    stats = RuntimeStats({}, {}, 5, 4, 0, 0, jobs)
    families = {f.name: f for f in runtime_families(stats, progress, (), 0.0)}
    got = {
        name: families[f"barrierflow_backfill_{name}"].value(job="copy")
        for name in ("splits_finished", "splits", "vnodes_done", "vnodes", "epochs_owed")
    }
    assert got == {"splits_finished": 1, "splits": 3, "vnodes_done": 3, "vnodes": 4,
                   "epochs_owed": 2}  # fmt: skip
    assert families["barrierflow_backfill_splits"].value(job="main") is None  # no backfill


class Lagging:
    """A split log's lag side only: ``records_after`` answers from ``lags`` (``None``: the log
    cannot tell)."""

    def __init__(self, lags: dict[str, int | None]) -> None:
        self.lags = lags

    async def records_after(self, split: str, offset: object) -> int | None:
        await anyio.lowlevel.checkpoint()
        return self.lags[split]


@pytest.mark.anyio
async def test_split_metrics_report_unknown_lag_as_nan_and_none_for_a_log_that_cannot_count() -> (
    None
):
    from barrierflow.actors.sources.split_metrics import SplitMetrics

    metrics = SplitMetrics(Lagging({"a": 3, "b": None}), "source")  # type: ignore[arg-type]
    metrics.count({"a": (Offset(1), 2)})
    metrics.count({"a": (Offset(3), 2), "b": (Offset(1), 1)})
    await metrics.refresh({"a": Offset(3), "b": Offset(1)}, frozenset({"c"}))
    read, lag = metrics.families("src")
    assert read.value(actor="src", kind="source", split="a") == 4
    assert lag.value(actor="src", kind="source", split="a") == 3
    assert math.isnan(lag.value(actor="src", kind="source", split="b") or 0.0)
    assert lag.value(actor="src", kind="source", split="c") == 0  # caught up: not asked
    assert (metrics.lag("a"), metrics.lag("b"), metrics.lag("z")) == (3, None, None)
    # A refresh that fails leaves the lag unknown: none reported, not the last one.
    failing = SplitMetrics(Lagging({"a": 3}), "source")  # type: ignore[arg-type]
    await failing.refresh({"a": None})
    assert failing.families("src")[1].value(actor="src", kind="source", split="a") == 3
    with pytest.raises(KeyError):  # the log knows no split "b"
        await failing.refresh({"a": None, "b": None})
    assert failing.families("src")[1].samples == ()
    # A log that cannot count reports no lag but for the splits known to be caught up.
    plain = SplitMetrics(object(), "backfill")  # type: ignore[arg-type]
    await plain.refresh({"a": None}, frozenset({"c"}))
    assert [s.labels for s in plain.families("bf")[1].samples] == [
        (("actor", "bf"), ("kind", "backfill"), ("split", "c"))
    ]


@pytest.mark.anyio
async def test_actors_that_never_ran_report_no_split_metrics() -> None:
    log = MemorySplitLog(pa.schema([("v", pa.int64())]), splits=["a"])
    for actor in (SplitSource(log), SourceBackfill(log)):
        await actor.refresh_metrics()  # nothing to ask yet: no error, no lag
        assert actor.metric_families() == []


class AskedLog(MemorySplitLog):
    """A memory log that counts the lag asks, and can hold them (``gate``), fail them, or not
    know (``unknown`` splits)."""

    def __init__(self, *splits: str) -> None:
        super().__init__(pa.schema([("v", pa.int64())]), splits=list(splits))
        self.asks = 0
        self.gate: anyio.Event | None = None
        self.cancelled = anyio.Event()
        self.unknown: set[str] = set()
        self.fail = False

    async def records_after(self, split: str, offset: Offset | None) -> int | None:  # type: ignore[override]
        self.asks += 1
        if self.fail:
            raise ConnectionError("log server gone")
        if self.gate is not None:
            try:
                await self.gate.wait()
            except anyio.get_cancelled_exc_class():
                self.cancelled.set()
                raise
        if split in self.unknown:
            return None
        return await super().records_after(split, offset)


def history_job(log: MemorySplitLog, clock: FakeClock) -> Job:
    """A job whose source backfill reads no history (rate 0): it only reports. It asks its
    log's lag at most once a second of ``clock``."""
    job = Job("history")
    job.add_actor(
        "backfill", lambda: SourceBackfill(log, rate_limit=0, clock=clock), inputs=["src"]
    )
    job.add_actor("tail", lambda: Count(RowCounter()), inputs=["backfill"])
    return job


def behind_source(tmp_path: Path, log: MemorySplitLog) -> Runtime:
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=3600.0))
    rt.add_source("src", lambda: SplitSource(log))
    rt.add_actor("count", lambda: Count(RowCounter()), inputs=["src"])
    return rt


def lags(families: list[MetricFamily]) -> dict[str, float]:
    """The backfill's lag per split."""
    return {s: v for (a, s), v in family_values(families, "barrierflow_source_lag_records").items()
            if a == "backfill"}  # fmt: skip


@pytest.mark.anyio
async def test_a_backfill_asks_its_lag_beside_its_loop_one_ask_at_a_time(tmp_path: Path) -> None:
    log = AskedLog("a", "e")  # e stays empty: its backfill finishes at once
    log.append("a", {"v": [1, 2, 3, 4, 5]})
    rt = behind_source(tmp_path, log)
    log.gate = anyio.Event()
    clock = FakeClock()
    with anyio.fail_after(WAIT):
        async with rt:
            handle = await rt.add_job(history_job(log, clock))
            for _ in range(3):
                clock.advance(LAG_EVERY)
                await rt.checkpoint()
            assert log.asks == 1  # the first ask holds: no second one beside it
            log.gate.set()
            while (
                handle.progress().splits != (1, 2)
                or handle.progress().actors["backfill"].total is None
            ):
                await rt.checkpoint()
            assert handle.progress().actors["backfill"].total == 5
            asked = log.asks
            clock.advance(LAG_EVERY * 0.5)
            await rt.checkpoint()
            await anyio.wait_all_tasks_blocked()
            assert log.asks == asked  # at most one ask a second
            clock.advance(LAG_EVERY * 0.5)  # a second exactly: due
            await rt.checkpoint()  # an ask again: a second since the last one began
            while log.asks == asked:
                await anyio.wait_all_tasks_blocked()
            await anyio.wait_all_tasks_blocked()
            # What the backfill asked itself: a 5 behind, e finished (0, without asking).
            assert lags(rt.metrics.collect()) == {"a": 5, "e": 0}
            # A scrape asks again, between barriers: the lag is the log's now.
            log.append("a", {"v": [6, 7]})
            assert lags(await rt.metrics.snapshot()) == {"a": 7, "e": 0}


@pytest.mark.anyio
async def test_a_backfill_whose_lag_is_unknown_or_fails_reports_no_total(tmp_path: Path) -> None:
    log = AskedLog("a", "b")
    log.append("a", {"v": [1, 2]})
    log.append("b", {"v": [1]})
    log.unknown = {"b"}
    rt = behind_source(tmp_path, log)
    clock = FakeClock()
    with anyio.fail_after(WAIT):
        async with rt:
            handle = await rt.add_job(history_job(log, clock))
            while log.asks < 4:  # two rounds of asks, both answered
                clock.advance(LAG_EVERY)
                await rt.checkpoint()
                await anyio.wait_all_tasks_blocked()
            await rt.checkpoint()
            assert handle.progress().actors["backfill"].total is None  # b's lag unknown
            log.fail = True
            asked = log.asks
            while log.asks < asked + 2:  # asks that fail
                clock.advance(LAG_EVERY)
                await rt.checkpoint()
                await anyio.wait_all_tasks_blocked()
            await rt.checkpoint()
            assert handle.progress().actors["backfill"].total is None
            assert handle.progress().phase == "backfilling"  # it runs on


@pytest.mark.anyio
async def test_a_backfill_gives_up_an_ask_that_overruns_and_asks_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from barrierflow.actors.backfill import _backfill_stage

    monkeypatch.setattr(_backfill_stage, "REFRESH_TIMEOUT", 0.01)
    log = AskedLog("a")
    log.append("a", {"v": [1]})
    log.gate = anyio.Event()  # never set: every ask holds
    rt = behind_source(tmp_path, log)
    clock = FakeClock()
    with anyio.fail_after(WAIT):
        async with rt:
            handle = await rt.add_job(history_job(log, clock))
            await rt.checkpoint()
            await log.cancelled.wait()  # the ask was given up after its timeout ...
            while log.asks < 2:  # ... so a later barrier asks again
                clock.advance(LAG_EVERY)
                await rt.checkpoint()
                await anyio.wait_all_tasks_blocked()
            assert handle.progress().actors["backfill"].total is None
