"""Errors of the Spark bridge.

Every public name is re-exported from :mod:`barrierflow.errors`.
"""

from __future__ import annotations

from typing import Literal, final

from barrierflow.channels.errors import BarrierflowError

__all__ = [
    "ExecutorImportError",
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


@final
class ExecutorImportError(BarrierflowError):
    """Spark's executors could not import a module that staging a micro-batch there needs
    (barrierflow, pyarrow, ...): their Python is not the driver's environment.

    Attributes:
        module: the module an executor could not import.
    """

    def __init__(self, module: str) -> None:
        self.module = module
        super().__init__(
            f"Spark executors cannot import {module!r}; expected every executor to run a "
            "Python with barrierflow and its dependencies: point PYSPARK_PYTHON (or "
            "spark.pyspark.python) at the driver's virtual environment on every worker, or "
            "ship the environment with spark.archives (a packed venv) or the package with "
            "spark.submit.pyFiles"
        )
