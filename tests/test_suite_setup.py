"""The suite's own setup: the unit tier's guard, deadlines that scale with
BARRIERFLOW_TEST_TIMEOUT_SCALE (the helper every test uses, and the conftest hook that
stretches pytest-timeout's per-test limit), and a SparkSession that cannot start is reported
once, not as one confusing error per test."""

from __future__ import annotations

from pathlib import Path

import pytest
from _timeouts import ENV, scaled, timeout_scale

TESTS = Path(__file__).resolve().parent


def copy_suite_setup(pytester: pytest.Pytester) -> None:
    """Give a pytester project this suite's conftest and the modules it imports."""
    pytester.makeconftest((TESTS / "conftest.py").read_text())
    pytester.makepyfile(_timeouts=(TESTS / "_timeouts.py").read_text())
    pytester.makepyfile(_tiers=(TESTS / "_tiers.py").read_text())


def test_deadlines_are_unscaled_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert timeout_scale() == 1.0
    assert scaled(10) == 10.0


def test_the_scale_variable_multiplies_every_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "2.5")
    assert scaled(10) == 25.0
    assert scaled(0.05) == pytest.approx(0.125)


@pytest.mark.parametrize("bad", ["0", "-1", "fast", "inf", "nan"])
def test_a_malformed_scale_is_refused(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    monkeypatch.setenv(ENV, bad)
    with pytest.raises(ValueError, match=ENV):
        timeout_scale()


# The inner test reads the SIGALRM timer pytest-timeout armed for it: 10 s unscaled.
INNER_TEST = """
import signal

import pytest


@pytest.mark.timeout(10, method="signal")
def test_timer_is_scaled():
    remaining, _ = signal.getitimer(signal.ITIMER_REAL)
    assert 10 < remaining <= 30
"""


@pytest.mark.parametrize(("scale", "passes"), [("3", True), ("1", False)])
@pytest.mark.subprocess
def test_the_conftest_hook_multiplies_the_per_test_timeout(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, scale: str, passes: bool
) -> None:
    monkeypatch.setenv(ENV, scale)
    copy_suite_setup(pytester)
    pytester.makepyfile(test_inner=INNER_TEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=scaled(120))
    result.assert_outcomes(passed=int(passes), failed=int(not passes))


INNER_SPARK_TESTS = """
import pytest

@pytest.mark.spark
@pytest.mark.parametrize("n", [1, 2, 3])
def test_needs_spark(spark, n):
    pass
"""


@pytest.mark.subprocess
def test_a_spark_that_cannot_start_is_reported_once_then_in_one_line(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(pytester.path / "no-java-here"))
    monkeypatch.setenv("COLUMNS", "200")  # the summary lines name the whole error class
    copy_suite_setup(pytester)
    pytester.makepyfile(test_inner=INNER_SPARK_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=scaled(120))
    result.assert_outcomes(errors=3)
    # The first test shows why (with its traceback); the others say so in one line each.
    result.stdout.fnmatch_lines(
        [
            "ERROR test_inner.py::test_needs_spark?1? - *SparkUnavailab*",
            "ERROR test_inner.py::test_needs_spark?2? - Failed: Spark could not start earl*",
            "ERROR test_inner.py::test_needs_spark?3? - Failed: Spark could not start earl*",
        ]
    )


# The unit tier's guard (tests/_tiers.py). The inner projects run in this process: the guard
# is the same audit hook, so an inner test that tries to start a process is stopped before
# any process starts.

UNMARKED_CHILDREN = """
import multiprocessing
import os
import subprocess
import sys


def test_runs_a_child():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_catches_the_guard_itself():
    try:
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    except Exception:
        pass


def test_forks():
    pid = os.fork()
    if pid == 0:
        os._exit(0)


def test_spawns_with_multiprocessing():
    context = multiprocessing.get_context("spawn")
    process = context.Process(target=print)
    process.start()
    process.join()


def test_asks_for_a_server(redis_server):
    pass
"""


def test_an_unmarked_test_that_starts_a_process_fails_naming_the_marker(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # the summary lines carry the whole message
    copy_suite_setup(pytester)
    pytester.makepyfile(test_inner=UNMARKED_CHILDREN)
    result = pytester.runpytest("-p", "no:cacheprovider", "-rfE")
    result.assert_outcomes(failed=4, errors=1)
    result.stdout.fnmatch_lines_random(
        [
            "FAILED test_inner.py::test_runs_a_child - *started a child process (subprocess*"
            "mark it @pytest.mark.subprocess*",
            "FAILED test_inner.py::test_catches_the_guard_itself - *mark it @pytest.mark.subproc*",
            "FAILED test_inner.py::test_forks - *started a child process (os.fork)*",
            "FAILED test_inner.py::test_spawns_with_multiprocessing - *started a child process*",
            "ERROR test_inner.py::test_asks_for_a_server - *uses the fixture 'redis_server'*",
        ]
    )


MARKED_CHILD = """
import subprocess

import pytest


@pytest.mark.subprocess
def test_runs_a_child():
    subprocess.run(["true"], check=True)


@pytest.mark.slow
def test_slow_in_process():
    pass


def test_unit():
    pass
"""


@pytest.mark.subprocess
def test_a_marked_test_may_start_a_process_and_the_unit_tier_leaves_it_out(
    pytester: pytest.Pytester,
) -> None:
    copy_suite_setup(pytester)
    pytester.makepyfile(test_inner=MARKED_CHILD)
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=3)
    unit = pytester.runpytest("-p", "no:cacheprovider", "--tier", "unit", "-v")
    unit.assert_outcomes(passed=1, deselected=2)
    unit.stdout.fnmatch_lines(["*test_unit PASSED*"])


SCHEDULED = """
import pytest


def test_unit():
    pass


@pytest.mark.subprocess
def test_child():
    pass


@pytest.mark.spark
def test_spark_in_a_child():
    pass


@pytest.mark.spark
def test_session(spark):
    pass


@pytest.mark.cluster
def test_cluster(spark_cluster):
    pass
"""


def test_jvm_tests_go_first_and_only_shared_spark_pins_a_worker(pytester: pytest.Pytester) -> None:
    copy_suite_setup(pytester)
    pytester.makepyfile(test_inner=SCHEDULED)
    recorder = pytester.inline_run("--collect-only", "-p", "no:cacheprovider")
    items = recorder.getcall("pytest_collection_finish").session.items
    order = [item.name for item in items]
    assert order == [
        "test_spark_in_a_child", "test_session", "test_cluster", "test_child", "test_unit"
    ]  # fmt: skip
    groups = {item.name: [m.args[0] for m in item.iter_markers("xdist_group")] for item in items}
    assert groups == {
        "test_spark_in_a_child": [],  # its Spark lives in its child: any worker
        "test_session": ["spark-session"],
        "test_cluster": ["spark-cluster"],
        "test_child": [],
        "test_unit": [],
    }
