"""The suite's own setup: deadlines scale with BARRIERFLOW_TEST_TIMEOUT_SCALE (the helper
every test uses, and the conftest hook that stretches pytest-timeout's per-test limit), and a
SparkSession that cannot start is reported once, not as one confusing error per test."""

from __future__ import annotations

from pathlib import Path

import pytest
from _timeouts import ENV, scaled, timeout_scale

TESTS = Path(__file__).resolve().parent


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
def test_the_conftest_hook_multiplies_the_per_test_timeout(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, scale: str, passes: bool
) -> None:
    monkeypatch.setenv(ENV, scale)
    pytester.makeconftest((TESTS / "conftest.py").read_text())
    pytester.makepyfile(_timeouts=(TESTS / "_timeouts.py").read_text())
    pytester.makepyfile(test_inner=INNER_TEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=scaled(120))
    result.assert_outcomes(passed=int(passes), failed=int(not passes))


INNER_SPARK_TESTS = """
import pytest

@pytest.mark.parametrize("n", [1, 2, 3])
def test_needs_spark(spark, n):
    pass
"""


def test_a_spark_that_cannot_start_is_reported_once_then_in_one_line(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(pytester.path / "no-java-here"))
    monkeypatch.setenv("COLUMNS", "200")  # the summary lines name the whole error class
    pytester.makeconftest((TESTS / "conftest.py").read_text())
    pytester.makepyfile(_timeouts=(TESTS / "_timeouts.py").read_text())
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
