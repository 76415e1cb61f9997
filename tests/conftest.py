"""Shared test setup: every async test runs on asyncio and on trio (anyio's pytest plugin)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=60
)
settings.register_profile(
    "ci",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    max_examples=60,
    derandomize=True,
)
# CI runs derandomized: the same examples every run, so a red CI is reproducible.
settings.load_profile("ci" if os.environ.get("CI") == "true" else "default")


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Both backends, for every test marked ``anyio`` (see pytest.ini's anyio_mode)."""
    return str(request.param)


@pytest.fixture(scope="session")
def spark() -> object:
    """One local SparkSession for the whole test session (≈ 8 s to start); tests that use it
    are marked ``spark`` so that ``-m spark`` / ``-m 'not spark'`` select them."""
    from barrierflow.spark_bridge import spark_session

    return spark_session("barrierflow-tests", conf={"spark.default.parallelism": "2"})
