"""The graph on Spark's executors: a chain of partition-local operators run in the Spark tasks
(``run_on="executors"``) against the same chain through the driver (``run_on="driver"``).

Every figure comes from a **fresh driver process** per run (``_driver_tree_child.py``: it
starts its own SparkSession, declares the pipeline, delivers one small warm-up micro-batch and
waits for the cue), against a Spark standalone cluster started from the wheel
(:class:`~barrierflow.testing.spark_cluster.StandaloneCluster`: a master and two workers on
loopback, started once per benchmark process). What is measured is the **driver's process
tree** — the Python driver and its JVM, read with psutil; the executors are other processes on
a cluster (in ``local[n]``, the ``--quick`` master, the executors' Python workers are the JVM's
children and are left out, but the executors' JVM side is the driver's JVM): CPU seconds
(user + sys) from the cue to the last epoch committed, and the peak RSS growth over the RSS at
the cue (a thread of this process samples every process of the tree every 20 ms).

The chain is ``filter (key & 7 != 7) -> map_batches (value * 2) -> 4 Iceberg writers``
(``add_sink(..., parallelism=4)``); the micro-batches are made by Spark on the executors
(``spark.range`` in 4 partitions, never cached): 16-byte rows (``key`` int64, ``value``
double) or ~216-byte rows (also ``text``, a distinct 200-character string). Each run delivers
``K`` micro-batches of ``n`` rows with :meth:`~barrierflow.spark_bridge.SparkBridge.deliver`
and waits for the last commit; the child then checks the table's row count (untimed).

* ``executors_chain_driver_cpu_ratio`` — driver CPU seconds per million rows on the executor
  path over the driver path, 1M rows of 216 bytes per micro-batch. Goal ``<= 0.3``.
* ``executors_chain_driver_rss_growth_mb`` — the executor path's peak RSS growth of the
  driver's tree (Python + JVM) at 4M rows per micro-batch minus that at 100K (1M between them
  in ``details``). Goal ``<= 30`` MB on the value.
* ``executors_chain_rows_per_s`` — rows/s of the executor path over the driver path at 1M rows
  per micro-batch, 16-byte rows (the record) and 216-byte rows (``details.wide``). Goal
  ``>= 0.9``. ``details.breakdown``: the executor path with Spark's Arrow batches to the Python
  tasks at 100K rows (``spark.sql.execution.arrow.maxRecordsPerBatch``; Spark's default is
  10K), Spark alone over the same micro-batches (``mapInArrow`` counting rows in the Python
  tasks; ``toArrow`` on the driver), and the bridge's time split.
* ``executors_async_map_scaling`` — ``async_map`` (concurrency 64 per task) calling an HTTP/1.1
  keep-alive service on loopback that answers each call after 20 ms (asyncio, in a thread of
  this process), on the executors: rows/s with 4 Spark tasks over 1 task (``add_sink(...,
  parallelism=N)`` makes N tasks). Goal ``>= 3.0``. The tasks need slots: this one runs on
  executors of two cores (four slots; the chain benchmarks' applications take one core per
  worker, ``spark.cores.max=2``).

Runs of the two sides alternate; medians are reported. Runs with the same configuration are
measured once per process and shared by the benchmarks that need them (the 216-byte 1M-row
runs serve the CPU ratio and the rows/s). ``--quick`` runs against ``local[2]`` (``local[4]``
for the async one) with smaller batches, one run a side, and the runs of a benchmark share one
driver (a driver's start alone takes 10-15 s): indicative figures only — in ``local[n]`` the
executors' JVM work is the driver's, and a later run's RSS growth starts from an earlier run's
grown heap.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]  # no stubs in the lock files

from benchmarks.harness import Settings, make_record, median, rounded, sampled, samples

__all__ = ["BENCHMARKS"]

CHILD = Path(__file__).with_name("_driver_tree_child.py")
#: Partitions of each micro-batch and writers of the sink (the issue's 4 Iceberg writers).
PARTITIONS = 4
WRITERS = 4
#: The async service's latency (seconds) and the calls in flight per task: the issue's.
LATENCY = 0.02
CONCURRENCY = 64
#: How often the RSS of the driver's tree is sampled (seconds).
SAMPLE_EVERY = 0.02
#: Seconds a driver run may take in all before it is killed (a hang guard only).
RUN_TIMEOUT = 600.0
_MB = 1 << 20
#: Command-line fragments of the executors' Python workers (children of the JVM in local mode).
_PYTHON_WORKERS = ("pyspark.daemon", "pyspark.worker")


# -- the driver's process tree -------------------------------------------------------------


@dataclass(frozen=True)
class DriverRun:
    """What one fresh driver measured: its query and its process tree during the query."""

    #: Rows delivered (before the filter) and seconds from the cue to the last commit.
    rows: int
    seconds: float
    #: CPU seconds (user + sys) of the Python driver and of its JVM during the query.
    cpu_python: float
    cpu_jvm: float
    #: Peak RSS growth (MB) over the RSS at the cue: the tree's (sampled together) and each's.
    growth_mb: float
    growth_python_mb: float
    growth_jvm_mb: float
    #: The share of the machine's CPU time that was busy during the query (every process's):
    #: near 1.0, the query was bound by CPU, whoever used it.
    machine_busy: float
    #: The query's own counters of the bridge (``BridgeStats``, the warm-up batch's taken off),
    #: or Spark alone's rows/s for a ``floor`` run.
    stats: dict[str, Any]

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds

    @property
    def cpu_per_m_rows(self) -> float:
        """Driver CPU seconds (Python + JVM) per million rows."""
        return (self.cpu_python + self.cpu_jvm) / self.rows * 1e6


class _Tree:
    """The driver's process tree: the Python process ``pid`` and its descendants (its JVM),
    except the executors' Python workers."""

    def __init__(self, pid: int) -> None:
        self.root = psutil.Process(pid)
        self.jvm: list[psutil.Process] = []
        self.refresh()

    def refresh(self) -> None:
        found = []
        for process in self.root.children(recursive=True):
            try:
                command = " ".join(process.cmdline())
            except psutil.Error:
                continue
            if not any(worker in command for worker in _PYTHON_WORKERS):
                found.append(process)
        self.jvm = found

    def cpu(self) -> tuple[float, float]:
        """CPU seconds (user + sys) so far: the Python driver's, the rest of the tree's."""

        def seconds(process: psutil.Process) -> float:
            try:
                times = process.cpu_times()
            except psutil.Error:
                return 0.0
            return float(times.user + times.system)

        return seconds(self.root), sum(seconds(p) for p in self.jvm)

    def rss(self) -> tuple[int, int]:
        """Resident bytes now: the Python driver's, the rest of the tree's."""

        def resident(process: psutil.Process) -> int:
            try:
                return int(process.memory_info().rss)
            except psutil.Error:
                return 0

        return resident(self.root), sum(resident(p) for p in self.jvm)


class _PeakSampler:
    """A thread sampling the tree's RSS every :data:`SAMPLE_EVERY` s until stopped: the peaks
    of the Python driver, of the rest and of their sum, and the figures at the start."""

    def __init__(self, tree: _Tree) -> None:
        self.tree = tree
        self.start = tree.rss()
        self.peak = [self.start[0], self.start[1], sum(self.start)]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        ticks = 0
        while not self._stop.wait(SAMPLE_EVERY):
            ticks += 1
            if ticks % 50 == 0:
                self.tree.refresh()  # processes the JVM starts later (not on a cluster)
            python, jvm = self.tree.rss()
            self.peak = [
                max(self.peak[0], python),
                max(self.peak[1], jvm),
                max(self.peak[2], python + jvm),
            ]

    def stop(self) -> tuple[float, float, float]:
        """Stop; the growth (MB) of the sum, of the Python driver and of the rest."""
        self._stop.set()
        self._thread.join()
        python, jvm = self.tree.rss()
        self.peak = [
            max(self.peak[0], python),
            max(self.peak[1], jvm),
            max(self.peak[2], python + jvm),
        ]
        return (
            (self.peak[2] - sum(self.start)) / _MB,
            (self.peak[0] - self.start[0]) / _MB,
            (self.peak[1] - self.start[1]) / _MB,
        )


def _child_env() -> dict[str, str]:
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    for inherited in ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET"):
        env.pop(inherited, None)  # a benchmark process with its own session: a JVM of its own
    return env


def _expect(child: subprocess.Popen[str], key: str, log: Path) -> dict[str, Any]:
    """The child's next ``BENCH`` line, which must carry ``key``."""
    assert child.stdout is not None
    for line in child.stdout:
        if line.startswith("BENCH "):
            message: dict[str, Any] = json.loads(line[len("BENCH ") :])
            if key in message:
                return message
            raise AssertionError(f"the driver said {message}, expected {key!r}")
    child.wait()
    tail = log.read_text(errors="replace").splitlines()[-30:]
    raise RuntimeError(
        f"the driver exited with code {child.returncode} before {key!r}:\n" + "\n".join(tail)
    )


def driver_runs(
    directory: Path, configs: list[dict[str, Any]], script: Path = CHILD
) -> list[DriverRun]:
    """One fresh driver (the script ``script``, by default ``_driver_tree_child.py``; another
    benchmark's driver speaks the same cues) running the query of each of ``configs`` in turn
    (each in a directory of its own under ``directory``), its tree measured from each query's
    cue to its end; ``directory`` is removed after.

    Raises:
        RuntimeError: the driver exited early or failed a check (with its log's last lines).
    """
    directory.mkdir(parents=True)
    log = directory / "driver.log"
    queries = [
        {**config, "root": str(directory / f"query-{i}")} for i, config in enumerate(configs)
    ]
    runs = []
    try:
        with log.open("w") as stderr:
            child = subprocess.Popen(
                [sys.executable, str(script), json.dumps(queries)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                env=_child_env(),
                cwd=directory,
            )
        guard = threading.Timer(RUN_TIMEOUT * len(configs), child.kill)
        guard.start()
        try:
            for _ in queries:
                runs.append(_query_run(child, log))
            assert child.stdin is not None
            child.stdin.close()
            if child.wait() != 0:
                tail = log.read_text(errors="replace").splitlines()[-30:]
                raise RuntimeError("the driver failed its checks:\n" + "\n".join(tail))
        finally:
            guard.cancel()
            if child.poll() is None:
                child.kill()
                child.wait()
        return runs
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _busy(before: Any, after: Any) -> float:
    """The busy share of the machine's CPU time between two ``psutil.cpu_times()``."""
    total = sum(after) - sum(before)
    idle = (after.idle - before.idle) + (after.iowait - before.iowait)
    return float((total - idle) / total) if total > 0 else 0.0


def _query_run(child: subprocess.Popen[str], log: Path) -> DriverRun:
    """The driver's next query, cued and measured; then its check is cued."""
    assert child.stdin is not None
    _expect(child, "ready", log)
    tree = _Tree(child.pid)
    sampler = _PeakSampler(tree)
    cpu_before, machine_before = tree.cpu(), psutil.cpu_times()
    child.stdin.write("go\n")
    child.stdin.flush()
    done = _expect(child, "done", log)
    cpu_after, machine_after = tree.cpu(), psutil.cpu_times()
    growth, growth_python, growth_jvm = sampler.stop()
    child.stdin.write("check\n")
    child.stdin.flush()
    return DriverRun(
        rows=int(done.get("rows", 0)),
        seconds=float(done.get("seconds", 0.0)),
        cpu_python=cpu_after[0] - cpu_before[0],
        cpu_jvm=cpu_after[1] - cpu_before[1],
        growth_mb=growth,
        growth_python_mb=growth_python,
        growth_jvm_mb=growth_jvm,
        machine_busy=_busy(machine_before, machine_after),
        stats={**done.get("stats", {}), **done.get("floor", {})},
    )


# -- the cluster, the runs -----------------------------------------------------------------

_cluster: Any = None
_scratch: Path | None = None
_drivers = 0
#: Runs already measured in this process, by configuration (see the module).
_measured: dict[str, list[DriverRun]] = {}


def _driver_directory() -> Path:
    """A fresh directory for one driver, under this process's scratch directory."""
    global _scratch, _drivers
    if _scratch is None:
        _scratch = Path(tempfile.mkdtemp(prefix="barrierflow-chain-bench-"))
        atexit.register(shutil.rmtree, _scratch, True)
    _drivers += 1
    return _scratch / f"driver-{_drivers}"


def _master_url() -> str:
    """The standalone cluster's master, started on first use (two workers of two cores on
    loopback; see the module for how the applications use them) and stopped at exit."""
    global _cluster
    if _cluster is None:
        from barrierflow.testing.spark_cluster import StandaloneCluster

        work = Path(tempfile.mkdtemp(prefix="barrierflow-chain-cluster-"))
        cluster = StandaloneCluster(work, workers=2, cores=2, memory="2g")
        cluster.start()
        atexit.register(shutil.rmtree, work, True)
        atexit.register(cluster.stop)  # runs first: the processes go before their directory
        _cluster = cluster
    return str(_cluster.master_url)


def _placement(settings: Settings, cores_per_executor: int) -> dict[str, Any]:
    """Where a driver runs its jobs: ``master`` and ``conf``. On the cluster, an executor of
    ``cores_per_executor`` cores on each of the two workers; with ``--quick``, ``local[n]``
    with as many task slots."""
    conf = {"spark.driver.memory": "2g"}
    if settings.quick:
        return {"master": f"local[{2 * cores_per_executor}]", "conf": conf}
    cores = str(cores_per_executor)
    conf.update(
        {
            "spark.driver.host": "127.0.0.1",
            "spark.executor.memory": "1g",
            "spark.executor.cores": cores,
            "spark.cores.max": str(2 * cores_per_executor),
        }
    )
    return {"master": _master_url(), "conf": conf}


def _chain(
    settings: Settings,
    run_on: str,
    rows: int,
    batches: int,
    *,
    wide: bool,
    conf: dict[str, str] | None = None,
    mode: str = "chain",
) -> dict[str, Any]:
    """A driver run of the chain (``mode="floor"``: Spark alone over the same batches)."""
    placement = _placement(settings, cores_per_executor=1)
    return {
        "mode": mode,
        "master": placement["master"],
        "conf": {**placement["conf"], **(conf or {})},
        "run_on": run_on,
        "chain": True,
        "rows": rows,
        "batches": batches,
        "partitions": PARTITIONS,
        "writers": WRITERS,
        "wide": wide,
        "backend": "asyncio",
    }


def _measure(
    configs: list[dict[str, Any]], reps: int, settings: Settings, script: Path = CHILD
) -> list[list[DriverRun]]:
    """``reps`` runs of each configuration, the order reversing every repetition, each in a
    fresh driver (the script ``script``; with ``--quick``, the runs of one call share one
    driver: a driver's start takes longer than a quick benchmark may); runs measured earlier
    in this process count."""
    keys = [json.dumps({**config, "script": script.name}, sort_keys=True) for config in configs]
    order = list(zip(keys, configs, strict=True))
    pending: list[tuple[str, dict[str, Any]]] = []
    for i in range(reps):
        for key, config in order if i % 2 == 0 else order[::-1]:
            if len(_measured.get(key, [])) + sum(k == key for k, _ in pending) <= i:
                pending.append((key, config))
    groups = [pending] if settings.quick else [[run] for run in pending]
    for group in groups:
        if group:
            runs = driver_runs(_driver_directory(), [config for _, config in group], script)
            for (key, _), run in zip(group, runs, strict=True):
                _measured.setdefault(key, []).append(run)
    return [_measured[key][:reps] for key in keys]


def _rates(runs: list[DriverRun]) -> list[float]:
    return [run.rows_per_s for run in runs]


def _cpu(runs: list[DriverRun]) -> list[float]:
    return [run.cpu_per_m_rows for run in runs]


def _sizes(settings: Settings) -> tuple[int, int, int]:
    """Rows per micro-batch, micro-batches per run and runs a side of the CPU and rows/s
    benchmarks."""
    return (100_000, 2, 1) if settings.quick else (1_000_000, 4, 3)


def _machine() -> dict[str, Any]:
    """The machine's cores and its load when the figures were taken: other work on a small
    machine takes CPU from the tasks and the driver alike."""
    return {"cpus": os.cpu_count(), "load_average_1m": round(os.getloadavg()[0], 2)}


def _where(settings: Settings) -> dict[str, Any]:
    master = "local[2]" if settings.quick else "standalone: 2 workers, an executor of 1 core each"
    return {"spark_master": master, "partitions": PARTITIONS, "writers": WRITERS, **_machine()}


def _split(runs: list[DriverRun], batches: int) -> dict[str, float | None]:
    """Where the median run's time went: ms per micro-batch in all (``wall``), in the Spark
    jobs on the executors with the adoption of their files (``stage``), in ``toArrow``
    (``to_arrow``), in delivery to the graph and its checkpoint (``deliver``); the tasks per
    batch and each task's ms (``task_ms``, its Python worker's time in the chain)."""
    run = sorted(runs, key=lambda r: r.seconds)[len(runs) // 2]
    stats = run.stats

    def per_batch(seconds: float | None) -> float | None:
        return None if seconds is None else rounded(float(seconds) / batches * 1e3, 4)

    tasks = stats.get("executor_tasks") or 0
    return {
        "wall": per_batch(run.seconds),
        "stage": per_batch(stats.get("stage_seconds")),
        "to_arrow": per_batch(stats.get("to_arrow_seconds")),
        "deliver": per_batch(stats.get("deliver_seconds")),
        "tasks_per_batch": rounded(tasks / batches, 4),
        "task_ms": rounded(stats["task_seconds"] / tasks * 1e3, 4) if tasks else None,
    }


# -- the benchmarks --------------------------------------------------------------------------


def executors_chain_driver_cpu_ratio(settings: Settings) -> dict[str, Any]:
    rows, batches, reps = _sizes(settings)
    ours, theirs = _measure(
        [
            _chain(settings, "executors", rows, batches, wide=True),
            _chain(settings, "driver", rows, batches, wide=True),
        ],
        reps,
        settings,
    )
    return make_record(
        "executors_chain_driver_cpu_ratio",
        median(_cpu(ours)),
        "s",
        median(_cpu(theirs)),
        "<= 0.3",
        details={
            "figure": "driver CPU seconds (Python + JVM, user + sys) per million rows",
            **_where(settings),
            "rows_per_batch": rows,
            "batches_per_run": batches,
            "row_bytes": 216,
            **sampled(_cpu(ours), _cpu(theirs)),
            "python_cpu_per_m_rows": _per_side(ours, theirs, lambda r: r.cpu_python / r.rows * 1e6),
            "jvm_cpu_per_m_rows": _per_side(ours, theirs, lambda r: r.cpu_jvm / r.rows * 1e6),
            "rows_per_s": _per_side(ours, theirs, lambda r: r.rows_per_s),
            "rss_growth_python_mb": _per_side(ours, theirs, lambda r: r.growth_python_mb),
            "rss_growth_jvm_mb": _per_side(ours, theirs, lambda r: r.growth_jvm_mb),
            "candidate": "run_on='executors': filter -> map_batches -> 4 Iceberg writers in "
            "the Spark tasks, manifests to the driver",
            "baseline_impl": "the same declarations with run_on='driver' (toArrow, the chain "
            "and the writers in the driver)",
        },
    )


def _per_side(
    ours: list[DriverRun], theirs: list[DriverRun], figure: Callable[[DriverRun], float]
) -> dict[str, float | None]:
    return {
        "executors": rounded(median([figure(r) for r in ours]), 4),
        "driver": rounded(median([figure(r) for r in theirs]), 4),
    }


def executors_chain_driver_rss_growth_mb(settings: Settings) -> dict[str, Any]:
    sizes = (10_000, 100_000, 400_000) if settings.quick else (100_000, 1_000_000, 4_000_000)
    batches, reps = (1, 1) if settings.quick else (2, 2)
    runs = _measure(
        [_chain(settings, "executors", rows, batches, wide=True) for rows in sizes], reps, settings
    )

    def growth(figure: Callable[[DriverRun], float]) -> dict[str, float | None]:
        return {
            f"{rows:_}": rounded(median([figure(r) for r in side]), 4)
            for rows, side in zip(sizes, runs, strict=True)
        }

    total = [median([r.growth_mb for r in side]) for side in runs]
    return make_record(
        "executors_chain_driver_rss_growth_mb",
        total[-1] - total[0],
        "MB",
        None,
        "<= 30",
        details={
            "figure": f"peak RSS growth of the driver's tree during the query at {sizes[-1]:_} "
            f"rows per micro-batch minus that at {sizes[0]:_}",
            **_where(settings),
            "batches_per_run": batches,
            "row_bytes": 216,
            "runs": reps,
            "growth_mb": growth(lambda r: r.growth_mb),
            "growth_python_mb": growth(lambda r: r.growth_python_mb),
            "growth_jvm_mb": growth(lambda r: r.growth_jvm_mb),
            "samples": {
                f"{rows:_}": samples([r.growth_mb for r in side])
                for rows, side in zip(sizes, runs, strict=True)
            },
            "candidate": "run_on='executors': filter -> map_batches -> 4 Iceberg writers",
        },
    )


def executors_chain_rows_per_s(settings: Settings) -> dict[str, Any]:
    rows, batches, reps = _sizes(settings)
    narrow, narrow_driver, wide, wide_driver = _measure(
        [
            _chain(settings, "executors", rows, batches, wide=False),
            _chain(settings, "driver", rows, batches, wide=False),
            _chain(settings, "executors", rows, batches, wide=True),
            _chain(settings, "driver", rows, batches, wide=True),
        ],
        reps,
        settings,
    )
    wide_ratio = median(_rates(wide)) / median(_rates(wide_driver))
    breakdown: dict[str, Any] = {
        "ms_per_batch_executors_16b": _split(narrow, batches),
        "ms_per_batch_executors_216b": _split(wide, batches),
        "ms_per_batch_driver_216b": _split(wide_driver, batches),
    }
    if not settings.quick:
        big = {"spark.sql.execution.arrow.maxRecordsPerBatch": "100000"}
        big_narrow, big_wide, floor_narrow, floor_wide = _measure(
            [
                _chain(settings, "executors", rows, batches, wide=False, conf=big),
                _chain(settings, "executors", rows, batches, wide=True, conf=big),
                _chain(settings, "executors", rows, batches, wide=False, mode="floor"),
                _chain(settings, "executors", rows, batches, wide=True, mode="floor"),
            ],
            1,
            settings,
        )
        breakdown.update(
            {
                "arrow_batch_100k_rows_per_s_16b": rounded(median(_rates(big_narrow))),
                "arrow_batch_100k_rows_per_s_216b": rounded(median(_rates(big_wide))),
                "spark_alone_16b": {k: rounded(v) for k, v in floor_narrow[0].stats.items()},
                "spark_alone_216b": {k: rounded(v) for k, v in floor_wide[0].stats.items()},
            }
        )
    return make_record(
        "executors_chain_rows_per_s",
        median(_rates(narrow)),
        "rows/s",
        median(_rates(narrow_driver)),
        ">= 0.9",
        details={
            "figure": "rows/s of 16-byte rows (key int64, value double), the executor path "
            "over the driver path; the same for 216-byte rows in 'wide'",
            **_where(settings),
            "rows_per_batch": rows,
            "batches_per_run": batches,
            **sampled(_rates(narrow), _rates(narrow_driver)),
            "wide": {
                "rows_per_s": rounded(median(_rates(wide))),
                "driver_rows_per_s": rounded(median(_rates(wide_driver))),
                "ratio": rounded(wide_ratio),
                "meets_goal": rounded(wide_ratio) is not None and wide_ratio >= 0.9,
                **sampled(_rates(wide), _rates(wide_driver)),
            },
            "breakdown": breakdown,
            "machine_cpu_busy": {
                "executors_16b": rounded(median([r.machine_busy for r in narrow]), 3),
                "driver_16b": rounded(median([r.machine_busy for r in narrow_driver]), 3),
            },
            "candidate": "run_on='executors': filter -> map_batches -> 4 Iceberg writers",
            "baseline_impl": "the same declarations with run_on='driver'",
        },
    )


# -- the async service ---------------------------------------------------------------------

_REQUEST = re.compile(rb"GET /score\?key=(-?\d+) ")


class _ScoreProtocol(asyncio.Protocol):
    """One connection of the service: each request answered :data:`LATENCY` s after it came."""

    def __init__(self, service: _Service) -> None:
        self.service = service
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        *requests, self.buffer = (self.buffer + data).split(b"\r\n\r\n")
        loop = asyncio.get_running_loop()
        for request in requests:
            match = _REQUEST.match(request)
            loop.call_later(LATENCY, self._answer, None if match is None else int(match[1]))

    def _answer(self, key: int | None) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        status, body = (
            (b"400 Bad Request", b"-1") if key is None else (b"200 OK", b"%d" % (2 * key))
        )
        self.transport.write(
            b"HTTP/1.1 %s\r\nContent-Length: %d\r\n\r\n%s" % (status, len(body), body)
        )
        self.service.calls += 1


class _Service:
    """An HTTP/1.1 keep-alive service on 127.0.0.1: ``GET /score?key=N`` answered with ``2N``
    after :data:`LATENCY` s — asyncio, in a thread of this process, for the executors' tasks to
    call."""

    def __init__(self) -> None:
        self.port = 0
        self.calls = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    async def _serve(self) -> None:
        self._loop, self._stopping = asyncio.get_running_loop(), asyncio.Event()
        server = await self._loop.create_server(lambda: _ScoreProtocol(self), "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stopping.wait()

    def __enter__(self) -> _Service:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the service did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None
        assert self._stopping is not None
        self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join()


def executors_async_map_scaling(settings: Settings) -> dict[str, Any]:
    rows, batches, reps = (6_400, 1, 1) if settings.quick else (48_000, 1, 2)
    placement = _placement(settings, cores_per_executor=2)
    with _Service() as service:

        def tasks(count: int) -> dict[str, Any]:
            return {
                **placement,
                "mode": "async",
                "run_on": "executors",
                "chain": True,
                "rows": rows,
                "batches": batches,
                "partitions": count,
                "writers": count,
                "wide": False,
                "backend": "asyncio",
                "service": ["127.0.0.1", service.port],
                "concurrency": CONCURRENCY,
            }

        four, one = _measure([tasks(4), tasks(1)], reps, settings)
        calls = service.calls
    ideal = CONCURRENCY / LATENCY
    return make_record(
        "executors_async_map_scaling",
        median(_rates(four)),
        "rows/s",
        median(_rates(one)),
        ">= 3.0",
        details={
            "figure": "rows/s with 4 Spark tasks over 1, async_map calling a 20 ms service",
            "spark_master": placement["master"]
            if settings.quick
            else "standalone: 2 workers, an executor of 2 cores each (4 task slots)",
            "rows_per_batch": rows,
            "batches_per_run": batches,
            **_machine(),
            "concurrency_per_task": CONCURRENCY,
            "latency_s": LATENCY,
            "ideal_rows_per_s": {"1": ideal, "4": 4 * ideal},
            "service_calls": calls,
            "machine_cpu_busy": {
                "4": rounded(median([r.machine_busy for r in four]), 3),
                "1": rounded(median([r.machine_busy for r in one]), 3),
            },
            "ms_per_batch_4_tasks": _split(four, batches),
            "ms_per_batch_1_task": _split(one, batches),
            **sampled(_rates(four), _rates(one)),
            "candidate": "run_on='executors', 4 tasks (add_sink parallelism=4): async_map "
            "(concurrency 64, ordered) -> 4 Iceberg writers",
            "baseline_impl": "the same with 1 task (parallelism=1)",
        },
    )


#: Every benchmark of this module, by name, in run order.
BENCHMARKS: dict[str, Callable[[Settings], dict[str, Any]]] = {
    "executors_chain_driver_cpu_ratio": executors_chain_driver_cpu_ratio,
    "executors_chain_driver_rss_growth_mb": executors_chain_driver_rss_growth_mb,
    "executors_chain_rows_per_s": executors_chain_rows_per_s,
    "executors_async_map_scaling": executors_async_map_scaling,
}
