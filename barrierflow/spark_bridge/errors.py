"""Errors of the Spark bridge.

Every public name is re-exported from :mod:`barrierflow.errors`.
"""

from __future__ import annotations

from typing import final

from barrierflow.channels.errors import BarrierflowError

__all__ = [
    "SparkUnavailableError",
]


@final
class SparkUnavailableError(BarrierflowError):
    """Spark cannot run here: pyspark is not installed, or Java is missing."""

    def __init__(self, missing: str, install: str) -> None:
        self.missing = missing
        super().__init__(f"Spark is unavailable: {missing}; expected it installed — {install}")
