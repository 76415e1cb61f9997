"""A real Spark standalone cluster — one master and a few workers on loopback — started and
stopped by a test suite itself, from the pip-installed ``pyspark`` (no Spark distribution,
no root).

Local mode (``local[2]``) runs every task in the driver's own JVM, so it cannot show what a
cluster does: Python workers started by executor JVMs on other processes, executors that die
mid-job and tasks that Spark runs again elsewhere. :class:`StandaloneCluster` runs the real
thing on one machine, for tests of exactly that.

The wheel ships ``bin/spark-class`` but not ``sbin/start-master.sh``, so the master and each
worker are started directly (``spark-class org.apache.spark.deploy.master.Master`` and
``... worker.Worker``), each in its own session, with ``SPARK_HOME`` the ``pyspark`` package
directory. Everything they write (logs, the workers' application directories) goes under the
cluster's work directory, and every failure to start names the log file to read.

A process holds one SparkContext: a test that already has a local session talks to the
cluster from a subprocess (``spark_session(master=cluster.master_url)`` there).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from barrierflow.channels.errors import BarrierflowError, InvalidArgumentError
from barrierflow.testing._server_process import (
    check_directory,
    check_seconds,
    free_port,
    log_tail,
    proc_stat,
)

__all__ = ["START_SECONDS", "STOP_SECONDS", "SparkClusterError", "StandaloneCluster", "spark_home"]

#: How long, by default, the master and workers may take until every worker is ALIVE.
START_SECONDS = 60.0
#: How long a process may take to exit after SIGTERM before its process group gets SIGKILL.
STOP_SECONDS = 5.0

_HOST = "127.0.0.1"
_MASTER_CLASS = "org.apache.spark.deploy.master.Master"
_WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
_EXECUTOR_CLASS = b"CoarseGrainedExecutorBackend"
_MEMORY = re.compile(r"[1-9][0-9]*[mMgG]")


class SparkClusterError(BarrierflowError):
    """The cluster could not start: a process exited, or the workers were not ALIVE in time.

    The message is one line: the cause, the log file to read and that log's last line.

    Attributes:
        log_path: the log file of the process at fault.
    """

    def __init__(self, cause: str, log_path: Path) -> None:
        self.log_path = log_path
        last = "".join(log_tail(log_path, 1))
        super().__init__(f"{cause}; see {log_path}" + (f" (last line: {last})" if last else ""))


def worker_host(index: int) -> str:
    """The loopback address worker ``index`` runs on (``127.0.0.2``, ``127.0.0.3``, ...)."""
    return f"127.0.0.{index + 2}"


def spark_home() -> Path:
    """The ``pyspark`` package directory: what ``SPARK_HOME`` is for a pip-installed Spark
    (it holds ``bin/spark-class`` and ``jars/``)."""
    import pyspark  # deferred: this module imports without the [spark] extra

    return Path(pyspark.__file__).resolve().parent


def _parent_pid(pid: int) -> int | None:
    """``pid``'s parent, from ``/proc/<pid>/stat`` (``None`` if it is gone)."""
    fields = proc_stat(pid)
    return int(fields[1]) if fields is not None and len(fields) > 1 else None


class StandaloneCluster:
    """A Spark standalone master and ``workers`` workers on 127.0.0.1 (see the module).

    Use it as a context manager (``with StandaloneCluster(path) as cluster:``) or call
    :meth:`start` and :meth:`stop`; jobs go to :attr:`master_url`.

    Args:
        work_dir: where logs and the workers' directories go; created at :meth:`start`.
        workers: how many worker processes.
        cores: the cores each worker offers (one executor per worker and application, with
            this many task slots).
        memory: the memory each worker offers its executors, as Spark writes it (``"1g"``,
            ``"512m"``).
        start_timeout: seconds until every worker must be ALIVE at the master (a suite that
            stretches its deadlines on a loaded machine passes a longer one).

    Raises:
        InvalidArgumentError: an argument is out of range, by name.
    """

    def __init__(
        self,
        work_dir: Path,
        *,
        workers: int = 2,
        cores: int = 1,
        memory: str = "1g",
        start_timeout: float = START_SECONDS,
    ) -> None:
        check_directory("work_dir", work_dir)
        for argument, count in (("workers", workers), ("cores", cores)):
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise InvalidArgumentError(argument, "an int of at least 1", count)
        if not isinstance(memory, str) or _MEMORY.fullmatch(memory) is None:
            raise InvalidArgumentError("memory", "an amount such as '1g' or '512m'", memory)
        check_seconds("start_timeout", start_timeout)
        self.work_dir = Path(work_dir)
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.start_timeout = float(start_timeout)
        self.log_dir = self.work_dir / "logs"
        self._port = 0
        self._webui_port = 0
        self._master: subprocess.Popen[bytes] | None = None
        self._workers: list[subprocess.Popen[bytes]] = []
        self._logs: dict[int, Path] = {}  # pid -> its stdout/stderr file
        self._worker_webui_ports: list[int] = []

    # -- properties ------------------------------------------------------------------------

    @property
    def master_url(self) -> str:
        """``spark://127.0.0.1:<port>``, what ``spark_session(master=...)`` takes.

        Raises:
            SparkClusterError: the cluster was never started.
        """
        if self._port == 0:
            raise SparkClusterError("the cluster has not been started", self.log_dir)
        return f"spark://{_HOST}:{self._port}"

    @property
    def master_webui_url(self) -> str:
        """The master's web UI (its JSON state is at ``<this>/json/``)."""
        return f"http://{_HOST}:{self._webui_port}"

    @property
    def running(self) -> bool:
        """Whether the master process runs."""
        return self._master is not None and self._master.poll() is None

    @property
    def worker_pids(self) -> list[int]:
        """The pids of the worker JVMs that run (each leads its own process group)."""
        return [worker.pid for worker in self._workers if worker.poll() is None]

    def executor_pids(self, app_id: str | None = None) -> list[int]:
        """The pids of the executor JVMs (``CoarseGrainedExecutorBackend``) that this cluster's
        workers run, of application ``app_id`` only if given (``sc.applicationId``).

        Found in ``/proc`` (Linux): a process counts if its command line names the executor
        class and one of its ancestors is one of this cluster's workers, so executors of
        another cluster on the same machine are not counted.
        """
        workers = set(self.worker_pids)
        if not workers:
            return []
        found: list[int] = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                args = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if not any(_EXECUTOR_CLASS in arg for arg in args):
                continue
            if app_id is not None and app_id.encode() not in args:
                continue
            pid = int(entry.name)
            if self._descends_from(pid, workers):
                found.append(pid)
        return sorted(found)

    @staticmethod
    def _descends_from(pid: int, ancestors: set[int]) -> bool:
        seen: set[int] = set()
        current: int | None = pid
        while current is not None and current > 1 and current not in seen:
            if current in ancestors:
                return True
            seen.add(current)
            current = _parent_pid(current)
        return False

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start the master and the workers and wait until the master reports every worker
        ALIVE; a no-op if the cluster runs.

        Raises:
            SparkClusterError: a process exited, or the workers were not all ALIVE within
                ``start_timeout`` seconds; everything started is stopped first.
        """
        if self.running:
            return
        self.stop()  # whatever is left of an earlier run
        home = spark_home()
        spark_class = home / "bin" / "spark-class"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = self._environment(home)
        self._port, self._webui_port = free_port(_HOST), free_port(_HOST)
        try:
            self._master = self._launch(
                "master",
                [
                    str(spark_class), _MASTER_CLASS,
                    "--host", _HOST,
                    "--port", str(self._port),
                    "--webui-port", str(self._webui_port),
                ],
                env,
            )  # fmt: skip
            self._worker_webui_ports = []
            for index in range(self.workers):
                webui = free_port(_HOST)
                self._worker_webui_ports.append(webui)
                directory = self.work_dir / f"worker-{index}"
                directory.mkdir(parents=True, exist_ok=True)
                # Each worker on a loopback address of its own, as on a cluster of machines:
                # Spark runs a speculative copy of a task only on another host than the
                # original's, and a host is an address to it.
                host = worker_host(index)
                worker = self._launch(
                    f"worker-{index}",
                    [
                        str(spark_class), _WORKER_CLASS, f"spark://{_HOST}:{self._port}",
                        "--host", host,
                        "--cores", str(self.cores),
                        "--memory", self.memory,
                        "--webui-port", str(webui),
                        "-d", str(directory),
                    ],
                    {**env, "SPARK_LOCAL_IP": host},
                )  # fmt: skip
                self._workers.append(worker)
            self._wait_alive()
        except BaseException:
            self.stop()
            raise

    def _environment(self, home: Path) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            SPARK_HOME=str(home),
            SPARK_LOCAL_IP=_HOST,
            # Executors start Python workers with this interpreter: it has pyarrow and
            # barrierflow, where the first python3 on PATH may have neither.
            PYSPARK_PYTHON=sys.executable,
            SPARK_LOG_DIR=str(self.log_dir),
            SPARK_WORKER_DIR=str(self.work_dir / "work"),
            SPARK_PID_DIR=str(self.work_dir / "pids"),
        )
        # A user's SPARK_CONF_DIR (spark-defaults, spark-env.sh) must not leak in.
        env["SPARK_CONF_DIR"] = str(self.work_dir / "conf")
        (self.work_dir / "conf").mkdir(parents=True, exist_ok=True)
        return env

    def _launch(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Start one process in its own session, its stdout and stderr to ``logs/<name>.log``
        (``spark-class`` execs the JVM, so the pid is the JVM's)."""
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.work_dir,
                start_new_session=True,
            )
        self._logs[process.pid] = log_path
        return process

    def _wait_alive(self) -> None:
        """Poll the master's JSON state until every worker is ALIVE (see :meth:`start`)."""
        deadline = time.monotonic() + self.start_timeout
        state: dict[str, Any] | None = None
        while True:
            for process in [self._master, *self._workers]:
                if process is not None and process.poll() is not None:
                    log = self._logs[process.pid]
                    raise SparkClusterError(
                        f"Spark {log.stem} exited with code {process.returncode} while the "
                        "cluster started",
                        log,
                    )
            state = self._master_state()
            alive = self._alive_webui_ports(state)
            if all(port in alive for port in self._worker_webui_ports):
                return
            if time.monotonic() > deadline:
                if state is None:
                    cause, log = "the Spark master's web UI never answered", self._master_log
                else:
                    index = next(
                        i for i, port in enumerate(self._worker_webui_ports) if port not in alive
                    )
                    cause = f"Spark worker-{index} was not ALIVE at the master"
                    log = self.log_dir / f"worker-{index}.log"
                raise SparkClusterError(
                    f"{cause} within {self.start_timeout:.0f} s (raise start_timeout on a "
                    "busy machine)",
                    log,
                )
            # JVMs starting up and registering: nothing to wait on but the master's state.
            time.sleep(0.2)

    @property
    def _master_log(self) -> Path:
        return self.log_dir / "master.log"

    def _master_state(self) -> dict[str, Any] | None:
        """The master's JSON state, or ``None`` while its web UI does not answer."""
        try:
            with urllib.request.urlopen(f"{self.master_webui_url}/json/", timeout=2) as reply:
                state = json.loads(reply.read())
        except (OSError, urllib.error.URLError, ValueError):
            return None
        return state if isinstance(state, dict) else None

    @staticmethod
    def _alive_webui_ports(state: dict[str, Any] | None) -> set[int]:
        """The web UI ports of the workers the master reports ALIVE."""
        ports: set[int] = set()
        for worker in (state or {}).get("workers", []):
            if isinstance(worker, dict) and worker.get("state") == "ALIVE":
                address = str(worker.get("webuiaddress", ""))
                with contextlib.suppress(ValueError):
                    ports.add(int(address.rstrip("/").rsplit(":", 1)[-1]))
        return ports

    def stop(self) -> None:
        """Stop the workers (and with them their executors), then the master: SIGTERM to
        each process group, SIGKILL after :data:`STOP_SECONDS`. Idempotent."""
        processes = [*self._workers, *([self._master] if self._master is not None else [])]
        self._workers, self._master = [], None
        for process in processes:
            _signal_group(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_SECONDS
        for process in processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            # The whole group: executors and Python workers the JVM leaves behind too.
            _signal_group(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=STOP_SECONDS)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
