"""A real Spark standalone cluster (:class:`~barrierflow.testing.spark_cluster.
StandaloneCluster`): jobs run on its executors, whose Python workers import barrierflow and
pyarrow, and a job survives the loss of an executor JVM; micro-batches staged by its
executors are committed exactly once through an executor's loss and speculative copies, and
the demo verifies on it with the executors writing.

The test process holds a local SparkContext for the other tests and a process can hold only
one, so every job runs in a driver of its own (``_cluster_child.py``, a subprocess).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from _timeouts import scaled

from barrierflow.errors import InvalidArgumentError
from barrierflow.testing.rendezvous import Rendezvous
from barrierflow.testing.spark_cluster import StandaloneCluster

pytestmark = pytest.mark.cluster

CHILD = Path(__file__).with_name("_cluster_child.py")
EXECUTORS_CHILD = Path(__file__).with_name("_cluster_executors_child.py")
ROOT = Path(__file__).resolve().parent.parent
ROWS, PARTITIONS = 1000, 4


def _driver(
    cluster: StandaloneCluster, mode: str, sync_dir: Path, port: int = 0, child: Path = CHILD
) -> subprocess.Popen[str]:
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    for inherited in ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET"):
        env.pop(inherited, None)  # the child starts a JVM of its own, never joins ours
    env["BARRIERFLOW_CHILD_GO_SECONDS"] = str(scaled(90))
    return subprocess.Popen(
        [sys.executable, str(child), cluster.master_url, mode, str(sync_dir), str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=sync_dir,
    )


def _result(driver: subprocess.Popen[str]) -> dict[str, Any]:
    try:
        stdout, stderr = driver.communicate(timeout=scaled(90))
    except subprocess.TimeoutExpired:
        driver.kill()
        stdout, stderr = driver.communicate()
        pytest.fail(f"the driver did not finish in time; its stderr ends:\n{stderr[-3000:]}")
    assert driver.returncode == 0, f"the driver failed; its stderr ends:\n{stderr[-3000:]}"
    return dict(json.loads(stdout.strip().splitlines()[-1]))


def _check_rows(rows: list[dict[str, Any]]) -> None:
    """One result per partition, and together every row exactly once."""
    assert sorted(row["partition"] for row in rows) == list(range(PARTITIONS))
    assert sum(row["rows"] for row in rows) == ROWS
    assert sum(row["total"] for row in rows) == ROWS * (ROWS - 1) // 2


def test_job_runs_on_the_executors(spark_cluster: StandaloneCluster, tmp_path: Path) -> None:
    result = _result(_driver(spark_cluster, "count", tmp_path))
    _check_rows(result["rows"])
    workers = set(spark_cluster.worker_pids)
    for row in result["rows"]:
        ancestors = {int(pid) for pid in row["ancestors"].split(",") if pid}
        # Each task's Python worker runs under an executor JVM under one of our workers,
        # never in (or under) the driver.
        assert ancestors & workers, row
        assert result["driver_pid"] not in ancestors
        assert row["pid"] != result["driver_pid"]


def _arrivals(meet: Rendezvous, count: int, driver: subprocess.Popen[str]) -> None:
    """Wait until ``count`` tasks arrived at ``meet``; a driver that failed meanwhile is
    reported with its own error."""
    if not meet.wait_for(count, scaled(120)):
        if driver.poll() is not None:
            _result(driver)  # fails the test with the driver's stderr
        pytest.fail(f"only {meet.arrived} of {count} tasks arrived in time")


def _wait_gone(pid: int) -> None:
    """Wait (on the kernel's word, a pidfd) until process ``pid`` has exited."""
    try:
        descriptor = os.pidfd_open(pid)
    except ProcessLookupError:
        return  # gone already
    try:
        ready, _, _ = select.select([descriptor], [], [], scaled(90))
        assert ready, f"process {pid} did not exit after SIGKILL"
    finally:
        os.close(descriptor)


def _kill_one_executor(cluster: StandaloneCluster, app_id: str | None = None) -> None:
    """SIGKILL the first of the cluster's two executor JVMs and wait until it is gone."""
    executors = cluster.executor_pids(app_id)
    assert len(executors) == 2, executors
    os.kill(executors[0], signal.SIGKILL)
    _wait_gone(executors[0])


def test_job_survives_a_killed_executor(spark_cluster: StandaloneCluster, tmp_path: Path) -> None:
    with Rendezvous() as meet:
        driver = _driver(spark_cluster, "slow", tmp_path, meet.port)
        try:
            # Both executors (one core each) busy with a task that waits for its cue.
            _arrivals(meet, 2, driver)
            _kill_one_executor(spark_cluster, (tmp_path / "app_id").read_text())
            meet.release()
            result = _result(driver)
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.communicate()
    _check_rows(result["rows"])
    # The task of the killed executor ran again: a second attempt of its partition.
    assert any(row["attempt"] >= 1 for row in result["rows"]), result["rows"]
    assert any(not tag.endswith("-0") for tag in meet.arrived), meet.arrived


def _table_ids(work: Path) -> list[int]:
    """The ids the Parquet table holds, read over exactly its committed files."""
    files = sorted((work / "table").glob("epoch=*/*/*.parquet"))
    return sorted(pq.ParquetDataset([str(f) for f in files]).read()["id"].to_pylist())


def _staged_leftovers(work: Path) -> list[str]:
    staging = work / "table" / ".staging"
    return sorted(p.name for p in staging.iterdir()) if staging.exists() else []


def test_an_executor_killed_while_it_stages_a_micro_batch_leaves_every_row_once(
    spark_cluster: StandaloneCluster, tmp_path: Path
) -> None:
    with Rendezvous() as meet:
        driver = _driver(spark_cluster, "kill", tmp_path, meet.port, EXECUTORS_CHILD)
        try:
            # Both executors (one core each) mid-stage of batch 1, waiting for their cue.
            _arrivals(meet, 2, driver)
            _kill_one_executor(spark_cluster)
            meet.release()
            result = _result(driver)
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.communicate()
    assert (result["batches"], result["staged_batches"], result["rows"]) == (3, 3, 1200)
    assert result["to_arrow_seconds"] == 0.0  # no row through the driver
    assert _table_ids(tmp_path) == list(range(1200))
    # The killed attempts' files are gone with their directories; nothing staged is left.
    assert _staged_leftovers(tmp_path) == []


def test_speculative_copies_of_a_staging_task_commit_one_attempt_and_show_no_orphan(
    spark_cluster: StandaloneCluster, tmp_path: Path
) -> None:
    # The original attempt of partition 1 waits at the rendezvous until the test closes it:
    # the job can only finish through its speculative copy.
    with Rendezvous() as meet:
        driver = _driver(spark_cluster, "speculate", tmp_path, meet.port, EXECUTORS_CHILD)
        try:
            result = _result(driver)
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.communicate()
    assert (result["batches"], result["rows"]) == (3, 1200)
    assert _table_ids(tmp_path) == list(range(1200))
    assert "1-0" in meet.arrived  # the original started, and was outrun
    # Only adopted attempts are in the table: one directory per task and epoch, and the
    # micro-batch's 4 partitions ran as the sink's 2 declared writers (coalesced).
    for epoch in (tmp_path / "table").glob("epoch=*"):
        assert sorted(p.name for p in epoch.iterdir() if p.is_dir()) == ["wp0", "wp1"]


def test_the_demo_verifies_on_the_cluster_with_the_executors_writing(
    spark_cluster: StandaloneCluster, tmp_path: Path
) -> None:
    command = [sys.executable, "-m", "barrierflow", "demo", "--workdir", str(tmp_path / "d")]
    command += ["--rows", "40000", "--batches", "4", "--no-progress", "--write-on", "executors"]
    command += ["--spark-master", spark_cluster.master_url, "--conf", "spark.driver.host=127.0.0.1"]
    command += ["--conf", "spark.executor.memory=512m"]
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    for inherited in ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET"):
        env.pop(inherited, None)
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=scaled(300), cwd=ROOT, env=env
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == (
        "VERIFIED rows_in=40000 rows_out=40000 duplicates=0 epochs=4"
    )


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("work_dir", ""),
        ("work_dir", 3),
        ("workers", 0),
        ("workers", True),
        ("workers", 1.5),
        ("cores", 0),
        ("memory", "lots"),
        ("memory", 1024),
        ("memory", "0g"),
        ("start_timeout", 0),
        ("start_timeout", float("inf")),
        ("start_timeout", float("nan")),
        ("start_timeout", "60"),
        ("start_timeout", 10**400),  # an int beyond any float: no float() overflow later
    ],
)
def test_bad_arguments_are_rejected_by_name(tmp_path: Path, argument: str, value: Any) -> None:
    kwargs: dict[str, Any] = {argument: value}
    work_dir = kwargs.pop("work_dir", tmp_path)
    with pytest.raises(InvalidArgumentError) as caught:
        StandaloneCluster(work_dir, **kwargs)
    assert caught.value.argument == argument
    assert not any(tmp_path.iterdir())  # rejected before anything was created
