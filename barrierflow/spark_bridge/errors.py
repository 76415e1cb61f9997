"""Errors of the Spark bridge.

Every public name is re-exported from :mod:`barrierflow.errors`.
"""

from __future__ import annotations

from typing import Literal, final

from barrierflow.channels.errors import BarrierflowError

__all__ = [
    "SparkUnavailableError",
]


@final
class SparkUnavailableError(BarrierflowError):
    """Spark cannot run here: pyspark is not installed, or Java is missing.

    Attributes:
        missing: what is missing, in words.
        install: how to install it, in words.
        component: which piece is missing — ``"pyspark"`` (the Python package) or ``"java"``
            (a Java runtime) — or ``None`` if the raiser did not say.
    """

    def __init__(
        self,
        missing: str,
        install: str,
        *,
        component: Literal["pyspark", "java"] | None = None,
    ) -> None:
        self.missing = missing
        self.install = install
        self.component = component
        super().__init__(f"Spark is unavailable: {missing}; expected it installed — {install}")
