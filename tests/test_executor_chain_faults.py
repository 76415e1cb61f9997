"""Faults of a chain run in Spark's tasks (``run_on="executors"``): ``filter → async_map (a real
HTTP service on loopback, ``_chain_service.py``) → map_batches → a table``, exactly once
against a reference computed with pyarrow, the table read back with its own reader
(pyiceberg, deltalake, pyarrow).

* A task attempt that fails mid-chain (the service answers 503 to its calls once async_map's
  retries are spent) is retried by Spark (the session's ``local[2,4]``), and nothing it
  staged becomes visible; the driver logs the failed attempt once.
* A chain that fails in every attempt fails the delivery — and a streaming query — with
  :class:`~barrierflow.errors.ExecutorChainFailedError`, one line naming the actor and cause.
* The driver's whole process group SIGKILLed while the executors are mid-chain (calls held at
  the service), then resumed: every row once (``_cluster_chain_child.py`` on a local master).
* On the standalone cluster: an executor JVM SIGKILLed mid-chain, and speculative copies of a
  chain task whose original never finishes.

Both anyio backends run the task runtime (it takes the driver's backend).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any, Literal

import anyio
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import structlog
from _chain_service import (
    ENRICH,
    Call,
    ChainService,
    declare_chain,
    events,
    events_frame,
    expected,
    make_table,
    read_rows,
    staged_leftovers,
)
from _timeouts import scaled

from barrierflow.actors import BatchFeed, add_sink
from barrierflow.actors.sinks.add_sink import DeclaredSink
from barrierflow.errors import AsyncCallFailedError, ExecutorChainFailedError
from barrierflow.runtime import BlockingRuntime, Runtime, RuntimeConfig
from barrierflow.spark_bridge import SparkBridge, arrow_schema_of
from barrierflow.testing.spark_cluster import StandaloneCluster

pytestmark = pytest.mark.anyio

Backend = Literal["asyncio", "trio"]
BACKENDS = pytest.mark.parametrize("backend", ["asyncio", "trio"])
ROOT = Path(__file__).resolve().parents[1]
CHILD = Path(__file__).with_name("_cluster_chain_child.py")
#: The child's micro-batches (see ``_cluster_chain_child.py``).
CHILD_ROWS, CHILD_PARTITIONS, CHILD_BATCHES = 400, 4, 3
#: What the session's local master allows a task (``local[2,4]``).
MAX_ATTEMPTS = 4
ATTEMPT_FAILED = "executor task attempt failed"


def build(
    spark: Any,
    tmp_path: Path,
    service: ChainService,
    kind: str,
    *,
    retries: int = 3,
    parallelism: int = 2,
    row_group_rows: int | None = None,
) -> tuple[Runtime, BatchFeed, DeclaredSink]:
    """The pipeline: the feed of the tests' events → the chain → a ``kind`` table."""
    feed = BatchFeed(arrow_schema_of(events_frame(spark, 0, 1, 1)))
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=3600.0))
    rt.add_source("events", feed.source)
    last = declare_chain(rt, "events", (service.host, service.port), retries=retries)
    table = make_table(kind, tmp_path, row_group_rows)
    sink = add_sink(rt, "out", table, input=last, parallelism=parallelism)
    return rt, feed, sink


def statuses(calls: list[Call], partition: int, attempt: int) -> set[int]:
    """The statuses the calls of one task attempt got."""
    return {c.status for c in calls if (c.partition, c.attempt) == (partition, attempt)}


# Local Spark (the session's local[2,4]: a failed task is retried, up to 4 attempts).


@pytest.mark.spark
@pytest.mark.parametrize("kind", ["iceberg", "delta", "parquet"])
@BACKENDS
def test_a_chain_on_the_executors_writes_each_row_once_and_no_row_through_the_driver(
    spark: Any, tmp_path: Path, kind: str, backend: Backend
) -> None:
    with ChainService() as service:
        rt, feed, sink = build(spark, tmp_path, service, kind)
        with BlockingRuntime(rt, backend=backend) as handle:
            bridge = SparkBridge(handle, feed, sink=sink)
            first = bridge.deliver(events_frame(spark, 0, 500, 3), 0, run_on="executors")
            second = bridge.deliver(events_frame(spark, 500, 300, 2), 1, run_on="executors")
            # The replay of the last durable batch is skipped: no Spark job, no call.
            calls = len(service.calls())
            assert bridge.deliver(events_frame(spark, 500, 300, 2), 1, run_on="executors") is None
            assert len(service.calls()) == calls
            assert first is not None
            assert second is not None
            handle.call(sink.coordinator.wait_committed, second)
            stats = bridge.stats()
        made = service.calls()
    assert read_rows(kind, tmp_path) == expected([(0, 800)])
    assert (stats.batches, stats.replays_skipped, stats.staged_batches) == (2, 1, 2)
    assert stats.to_arrow_seconds == 0.0  # no row was collected to the driver
    # Every call was made in a Spark task's Python worker, never in this process; the rows
    # the filter drops were never called for.
    assert {c.pid for c in made}.isdisjoint({os.getpid()})
    assert min(c.partition for c in made) >= 0
    assert sorted({c.id for c in made}) == [r["id"] for r in expected([(0, 800)])]
    # parallelism=2: each micro-batch ran as exactly two tasks, whatever Spark's partitions.
    assert {c.partition for c in made} == {0, 1}
    assert stats.executor_tasks == 4
    assert staged_leftovers(kind, tmp_path) == []


def first_attempt_fails_late(
    spark: Any, tmp_path: Path, kind: str, backend: Backend
) -> tuple[list[Call], list[MutableMapping[str, Any]]]:
    """One micro-batch of ids 0..399 in two tasks; partition 1 holds ids 200..399, and its
    first attempt gets 503 for ids from 300 on, on every try async_map makes: the chain fails
    half-way through the partition, after the writer staged the rows before (Parquet's row
    groups of 5 rows: files are on disk). The service's calls and the driver's log entries."""

    def fails_late(call: Call) -> bool:
        return (call.partition, call.attempt) == (1, 0) and call.id >= 300

    with ChainService(fail=fails_late) as service:
        rt, feed, sink = build(spark, tmp_path, service, kind, retries=1, row_group_rows=5)
        with BlockingRuntime(rt, backend=backend) as handle:
            bridge = SparkBridge(handle, feed, sink=sink)
            with structlog.testing.capture_logs() as logs:
                epoch = bridge.deliver(events_frame(spark, 0, 400, 2), 0, run_on="executors")
            assert epoch is not None
            handle.call(sink.coordinator.wait_committed, epoch)
        return service.calls(), logs


@pytest.mark.spark
@pytest.mark.parametrize("kind", ["parquet", "delta"])
@BACKENDS
def test_a_task_attempt_that_fails_mid_chain_is_retried_by_spark_and_nothing_of_it_shows(
    spark: Any, tmp_path: Path, kind: str, backend: Backend
) -> None:
    made, _ = first_attempt_fails_late(spark, tmp_path, kind, backend)
    # The failing attempt really ran (200s, then 503s), and Spark's retry finished the task.
    assert statuses(made, 1, 0) == {200, 503}
    assert statuses(made, 1, 1) == {200}
    assert read_rows(kind, tmp_path) == expected([(0, 400)])
    assert staged_leftovers(kind, tmp_path) == []


@pytest.mark.spark
@BACKENDS
def test_a_failed_task_attempt_is_logged_once_on_the_driver_by_attempt_number_actor_and_cause(
    spark: Any, tmp_path: Path, backend: Backend
) -> None:
    _, logs = first_attempt_fails_late(spark, tmp_path, "parquet", backend)
    failed = [entry for entry in logs if entry["event"] == ATTEMPT_FAILED]
    # Spark's attempt number (TaskContext.attemptNumber(): 0 for the first), not its
    # task attempt id, which numbers every task of the application.
    assert [(e["partition"], e["attempt"], e["actor"]) for e in failed] == [(1, 0, ENRICH)]
    # The cause is the call's own failure: several calls failing at once are still one.
    assert failed[0]["cause"].startswith("AsyncCallFailedError: ")
    assert "HTTP 503" in failed[0]["cause"]


@pytest.mark.spark
@BACKENDS
def test_a_chain_that_fails_in_every_attempt_fails_the_delivery_in_one_line_naming_the_actor(
    spark: Any, tmp_path: Path, backend: Backend
) -> None:
    # Event 5's call always gets 503: every attempt of the task that holds it fails.
    with ChainService(fail=lambda call: call.id == 5) as service:
        rt, feed, sink = build(spark, tmp_path, service, "parquet", retries=0)
        with BlockingRuntime(rt, backend=backend) as handle:
            bridge = SparkBridge(handle, feed, sink=sink)
            with (
                structlog.testing.capture_logs() as logs,
                pytest.raises(ExecutorChainFailedError) as info,
            ):
                bridge.deliver(events_frame(spark, 0, 200, 2), 0, run_on="executors")
            assert bridge.stats().batches == 0
        made = service.calls()
    error = info.value
    text = str(error)
    assert "\n" not in text
    assert ENRICH in text
    assert "AsyncCallFailedError" in text
    assert "HTTP 503" in text
    assert error.actor == ENRICH
    assert error.partition == 0  # ids 0..99
    assert error.attempts == MAX_ATTEMPTS
    # The actor's own typed error, carried back from the executor (it pickles).
    assert isinstance(error.cause, AsyncCallFailedError)
    assert error.cause.actor == ENRICH
    # Spark ran every attempt it allows, and the driver logged each failed one once.
    assert {c.attempt for c in made if c.id == 5} == set(range(MAX_ATTEMPTS))
    failed = [entry for entry in logs if entry["event"] == ATTEMPT_FAILED]
    assert len(failed) == MAX_ATTEMPTS
    assert {(e["partition"], e["actor"]) for e in failed} == {(0, ENRICH)}
    assert read_rows("parquet", tmp_path) == []


@pytest.mark.spark
@BACKENDS
def test_a_micro_batch_whose_chain_failed_lands_once_when_delivered_again_after_the_fix(
    spark: Any, tmp_path: Path, backend: Backend
) -> None:
    with ChainService(fail=lambda call: call.id == 5) as service:
        rt, feed, sink = build(spark, tmp_path, service, "parquet", retries=0)
        with BlockingRuntime(rt, backend=backend) as handle:
            bridge = SparkBridge(handle, feed, sink=sink)
            frame = events_frame(spark, 0, 200, 2)
            with pytest.raises(ExecutorChainFailedError):
                bridge.deliver(frame, 0, run_on="executors")
            service.fail = None  # the service is back: the same batch id again
            epoch = bridge.deliver(frame, 0, run_on="executors")
            assert epoch is not None
            handle.call(sink.coordinator.wait_committed, epoch)
            stats = bridge.stats()
    # Nothing of the failed delivery's tasks (partition 1 succeeded in it) is in the table.
    assert read_rows("parquet", tmp_path) == expected([(0, 200)])
    assert (stats.batches, stats.staged_batches) == (1, 1)
    assert staged_leftovers("parquet", tmp_path) == []


@pytest.mark.spark
@BACKENDS
def test_a_streaming_query_whose_chain_fails_in_every_attempt_stops_with_the_typed_error(
    spark: Any, tmp_path: Path, backend: Backend
) -> None:
    source = tmp_path / "in"
    source.mkdir()
    pq.write_table(events(0, 100), source / "part-000.parquet")
    frame = (
        spark.readStream.schema("id bigint, user bigint, amount double")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(source))
    )
    with ChainService(fail=lambda call: call.id == 7) as service:
        feed = BatchFeed(arrow_schema_of(frame))
        rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=3600.0))
        rt.add_source("events", feed.source)
        last = declare_chain(rt, "events", (service.host, service.port), retries=0)
        sink = add_sink(rt, "out", make_table("delta", tmp_path), input=last, parallelism=1)
        with BlockingRuntime(rt, backend=backend) as handle:
            bridge = SparkBridge(handle, feed, stream="q", sink=sink)
            query = bridge.start(
                frame, str(tmp_path / "ck"), available_now=True, run_on="executors"
            )
            with pytest.raises(ExecutorChainFailedError) as info:
                bridge.await_termination(query)
    assert info.value.actor == ENRICH
    assert "\n" not in str(info.value)
    assert "HTTP 503" in str(info.value)
    assert read_rows("delta", tmp_path) == []


# A driver of its own (the chain child), on a local master or the standalone cluster.


def start_driver(
    master: str,
    mode: str,
    work: Path,
    service: ChainService,
    kind: str,
    backend: Backend,
    *,
    child: Path = CHILD,
    env_extra: Mapping[str, str] | None = None,
) -> subprocess.Popen[str]:
    """``child`` (by default ``_cluster_chain_child.py``; the keyed tests' has the same
    arguments) as a process group of its own (the driver and its JVM), with ``env_extra``
    added to its environment."""
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    for inherited in ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET"):
        env.pop(inherited, None)  # the child starts a JVM of its own, never joins ours
    env["BARRIERFLOW_CHILD_GO_SECONDS"] = str(scaled(90))
    env |= env_extra or {}
    command = [sys.executable, str(child), master, mode, str(work), str(service.port), kind]
    return subprocess.Popen(
        [*command, backend],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=work,
        start_new_session=True,
    )


def finished(driver: subprocess.Popen[str]) -> dict[str, Any]:
    """The driver's report (its last stdout line); fails the test with its stderr if it
    failed or hung."""
    try:
        stdout, stderr = driver.communicate(timeout=scaled(180))
    except subprocess.TimeoutExpired:
        os.killpg(driver.pid, signal.SIGKILL)
        stdout, stderr = driver.communicate()
        pytest.fail(f"the driver did not finish in time; its stderr ends:\n{stderr[-3000:]}")
    assert driver.returncode == 0, f"the driver failed; its stderr ends:\n{stderr[-3000:]}"
    return dict(json.loads(stdout.strip().splitlines()[-1]))


def wait_held(service: ChainService, partitions: int, driver: subprocess.Popen[str]) -> None:
    """Wait until calls of ``partitions`` tasks are held at the service; a driver that failed
    meanwhile is reported with its own error."""
    if not service.wait_held(partitions, scaled(180)):
        if driver.poll() is not None:
            finished(driver)  # fails the test with the driver's stderr
        pytest.fail(f"calls of only {len(service.held())} tasks were held in time")


def kill_group(driver: subprocess.Popen[str]) -> None:
    """SIGKILL the driver's whole process group (the driver and its JVM) and reap it."""
    os.killpg(driver.pid, signal.SIGKILL)
    driver.communicate()
    assert driver.returncode == -signal.SIGKILL


def stop(driver: subprocess.Popen[str]) -> None:
    if driver.poll() is None:
        kill_group(driver)


def write_input(work: Path, sizes: list[int]) -> list[tuple[int, int]]:
    """One event file per micro-batch, contiguous ids; the ``(start, count)`` of each."""
    (work / "in").mkdir(parents=True, exist_ok=True)
    spans, start = [], 0
    for index, size in enumerate(sizes):
        pq.write_table(events(start, size), work / "in" / f"part-{index:03d}.parquet")
        spans.append((start, size))
        start += size
    return spans


@pytest.mark.spark
@pytest.mark.subprocess
@pytest.mark.parametrize(("kind", "backend"), [("iceberg", "asyncio"), ("delta", "trio")])
def test_a_driver_killed_mid_chain_and_resumed_holds_every_row_once(
    tmp_path: Path, kind: str, backend: Backend
) -> None:
    spans = write_input(tmp_path, [300, 300, 300])
    batch_1 = range(300, 600)

    # Batch 1's calls are held at the service: the executors are mid-chain when the driver's
    # process group (the driver, its JVM) is SIGKILLed.
    with ChainService(hold=lambda call: call.id in batch_1) as service:
        driver = start_driver("local[2,4]", "stream", tmp_path, service, kind, backend)
        try:
            wait_held(service, 1, driver)
            kill_group(driver)
        finally:
            stop(driver)
        # Nothing of the killed batch shows; batch 0 is there whole, or not yet committed.
        assert read_rows(kind, tmp_path) in ([], expected(spans[:1]))
        service.release()
        report = finished(start_driver("local[2,4]", "stream", tmp_path, service, kind, backend))
        made = service.calls()
    assert read_rows(kind, tmp_path) == expected(spans)
    assert report["to_arrow_seconds"] == 0.0
    # The resumed driver called again for the killed batch's rows, in Spark tasks.
    assert {c.id for c in made if c.id in batch_1 and c.status == 200} >= {
        r["id"] for r in expected(spans[1:2])
    }
    assert report["pid"] not in {c.pid for c in made}
    assert staged_leftovers(kind, tmp_path) == []


def kill_one_executor(cluster: StandaloneCluster, app_id: str) -> None:
    """SIGKILL one of the application's two executor JVMs and wait (on its pidfd) until it
    is gone."""
    executors = cluster.executor_pids(app_id)
    assert len(executors) == 2, executors
    try:
        descriptor = os.pidfd_open(executors[0])
    except ProcessLookupError:
        pytest.fail(f"executor {executors[0]} was gone before the kill")
    try:
        os.kill(executors[0], signal.SIGKILL)
        ready, _, _ = select.select([descriptor], [], [], scaled(90))
        assert ready, f"executor {executors[0]} did not exit after SIGKILL"
    finally:
        os.close(descriptor)


def child_spans() -> list[tuple[int, int]]:
    return [(b * CHILD_ROWS, CHILD_ROWS) for b in range(CHILD_BATCHES)]


@pytest.mark.cluster
@pytest.mark.parametrize(("kind", "backend"), [("iceberg", "asyncio"), ("delta", "trio")])
def test_an_executor_killed_mid_chain_leaves_every_row_once(
    spark_cluster: StandaloneCluster, tmp_path: Path, kind: str, backend: Backend
) -> None:
    batch_1 = range(CHILD_ROWS, 2 * CHILD_ROWS)

    # Batch 1's first attempts are held mid-chain at the service, one task on each of the
    # two one-core executors, while the test SIGKILLs one executor; Spark runs its task again.
    def first_attempts_of_batch_1(call: Call) -> bool:
        return call.id in batch_1 and call.attempt == 0

    with ChainService(hold=first_attempts_of_batch_1) as service:
        master = spark_cluster.master_url
        driver = start_driver(master, "batches", tmp_path, service, kind, backend)
        try:
            wait_held(service, 2, driver)
            kill_one_executor(spark_cluster, (tmp_path / "app_id").read_text())
            service.release()
            report = finished(driver)
        finally:
            stop(driver)
        made = service.calls()
    assert (report["batches"], report["staged_batches"]) == (CHILD_BATCHES, CHILD_BATCHES)
    assert report["to_arrow_seconds"] == 0.0
    assert read_rows(kind, tmp_path) == expected(child_spans())
    # The killed executor's task ran again: a later attempt of batch 1 called the service.
    assert any(c.attempt >= 1 for c in made if c.id in batch_1)
    assert staged_leftovers(kind, tmp_path) == []


class FirstAttemptOfPartition1:
    """A hold rule: the calls of whichever attempt of batch 0's partition 1 calls first. On a
    loaded machine Spark may launch the speculative copy before the original has made a call
    (the original's Python worker still starting): then the copy is the one held, and the
    original wins. Either way two attempts of the task run at once, one of them mid-chain for
    good."""

    def __init__(self) -> None:
        self.attempt: int | None = None
        self._lock = threading.Lock()

    def __call__(self, call: Call) -> bool:
        if call.id >= CHILD_ROWS or call.partition != 1:
            return False
        with self._lock:
            if self.attempt is None:
                self.attempt = call.attempt
            return call.attempt == self.attempt


@pytest.mark.cluster
@pytest.mark.parametrize(("kind", "backend"), [("delta", "asyncio"), ("iceberg", "trio")])
def test_speculative_copies_of_a_chain_task_commit_one_attempt_and_show_no_orphan(
    spark_cluster: StandaloneCluster, tmp_path: Path, kind: str, backend: Backend
) -> None:
    # One attempt of batch 0's partition 1 is held mid-chain for good: the job can only
    # finish through another attempt of it, run by Spark's speculation on the other executor.
    first = FirstAttemptOfPartition1()
    with ChainService(hold=first) as service:
        master = spark_cluster.master_url
        driver = start_driver(master, "speculate", tmp_path, service, kind, backend)
        try:
            report = finished(driver)
        finally:
            stop(driver)
        held, made = service.held(), service.calls()
    assert held  # one attempt started, and was outrun
    assert {c.attempt for c in held} == {first.attempt}
    winners = {c.attempt for c in made if c.partition == 1 and c.id < CHILD_ROWS}
    assert winners
    assert first.attempt not in winners
    assert report["batches"] == CHILD_BATCHES
    assert read_rows(kind, tmp_path) == expected(child_spans())
    assert staged_leftovers(kind, tmp_path) == []


# The chaos harness's act of the chain (see barrierflow.app.chaos.acts).


@pytest.mark.spark
@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_chaos_harness_kills_the_chain_act_mid_batch_and_finds_nothing(tmp_path: Path) -> None:
    chaos_act_finds_nothing(tmp_path, "spark-chain")


def chaos_act_finds_nothing(tmp_path: Path, act: str) -> None:
    """Run the chaos harness's ``act`` with two kills and check its audit found nothing.

    Seed 128 plans one kill per round at a traced event, each while Spark's tasks run the
    act's steps (after a "batch-begin"): round 0 on asyncio into Iceberg, round 1 on trio into
    Delta; each round then resumes and its final audit reads the table.
    """
    command = [sys.executable, "-m", "barrierflow", "chaos", "--acts", act]
    command += ["--kills", "2", "--max-kills-per-round", "1", "--random-share", "0"]
    command += ["--seed", "128", "--workdir", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=scaled(800), cwd=ROOT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "chaos-report.json").read_text())
    totals = report["totals"]
    assert totals["kills"] == 2
    assert (totals["lost"], totals["duplicated"], totals["foreign"], totals["findings"]) == (
        0, 0, 0, 0
    )  # fmt: skip
    assert [k["plan"].split("#")[0] for k in report["kills"]] == ["batch-begin"] * 2
    rounds = [(r["act"], r["backend"], r["table"]) for r in report["rounds"]]
    assert rounds == [(act, "asyncio", "iceberg"), (act, "trio", "delta")]


async def test_the_demo_chain_s_call_returns_every_event_it_sent_exactly() -> None:
    from barrierflow.app._demo_chain import EchoCall, EchoService
    from barrierflow.app._demo_input import SCHEMA

    # Values a float's JSON text must bring back bit for bit (the audit compares them).
    batch = pa.record_batch(
        {"key": [0, 1, 2**53, 7], "value": [0.1, -1e-310, 1 / 3, 2.5e300]}, schema=SCHEMA
    )
    with EchoService() as service, anyio.fail_after(scaled(20)):
        assert (await EchoCall(*service.address)(batch)).equals(batch)


def test_the_chain_act_runs_the_executors_act_with_the_chain_on_every_run(
    tmp_path: Path,
) -> None:
    from barrierflow.app.chaos.acts import ACTS

    act = ACTS["spark-chain"]
    assert act.targets == ACTS["spark-executors"].targets
    for resume in (False, True):
        words = act.command("python", tmp_path, "trio", resume)
        assert words[3:5] == ["demo", "spark"]
        assert {"--chain", "executors", "trio"} <= set(words)


def test_the_demo_s_chain_option_is_a_bool_and_a_resume_keeps_it(tmp_path: Path) -> None:
    from barrierflow.app.demo import DemoConfig, resume_command
    from barrierflow.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        DemoConfig(workdir=tmp_path, chain="yes")  # type: ignore[arg-type]
    assert (info.value.argument, info.value.got) == ("chain", "yes")
    config = DemoConfig(workdir=tmp_path, chain=True, write_on="executors")
    assert resume_command(config).endswith(" --run-on executors --chain")
    assert "--chain" not in resume_command(DemoConfig(workdir=tmp_path))
