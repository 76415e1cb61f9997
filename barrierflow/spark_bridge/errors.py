"""Errors of the Spark bridge.

Every public name is re-exported from :mod:`barrierflow.errors`.
"""

from __future__ import annotations

from typing import Literal, final

from barrierflow.channels.errors import BarrierflowError

__all__ = [
    "SparkQueryFailedError",
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


@final
class SparkQueryFailedError(BarrierflowError):
    """A Spark streaming query stopped with an error that is not one barrierflow raised in the
    bridge's callback (a Spark-side failure: a missing input path, a corrupt checkpoint, a
    user's own callback code), reduced from Spark's wall of Py4J and JVM traces to its cause
    in one line. The Spark exception is the ``__cause__`` (its full text: ``str(exc.__cause__)``).

    Attributes:
        query: the query, as Spark names it (its name, else its id), or ``None`` if unknown.
        cause: the error that stopped it, in one line (``"ValueError: bad row"``,
            ``"[PATH_NOT_FOUND] Path does not exist: ..."``).
    """

    def __init__(self, query: str | None, cause: str) -> None:
        self.query = query
        self.cause = cause
        name = "a Spark streaming query" if query is None else f"Spark streaming query {query}"
        super().__init__(f"{name} stopped: {cause}")
