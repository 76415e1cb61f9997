"""Errors of the Spark bridge.

Every public name is re-exported from :mod:`barrierflow.errors`.
"""

from __future__ import annotations

from typing import Literal, final

from barrierflow.actors.sources.errors import BatchOrderError
from barrierflow.channels.errors import BarrierflowError

__all__ = [
    "ExecutorChainFailedError",
    "ExecutorImportError",
    "ExecutorPlacementError",
    "SparkCheckpointBehindError",
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
    """Spark's executors could not import a module that running a micro-batch there needs:
    barrierflow or its dependencies (their Python is not the driver's environment), or the
    user's own module holding a function of the chain (a ``map_batches`` function, an
    actor class) that was never shipped to them.

    Attributes:
        module: the module an executor could not import.
    """

    def __init__(self, module: str) -> None:
        self.module = module
        super().__init__(
            f"Spark executors cannot import {module!r}; expected every executor to run a "
            "Python with barrierflow and its dependencies — point PYSPARK_PYTHON (or "
            "spark.pyspark.python) at the driver's virtual environment on every worker, or "
            "ship the environment with spark.archives (a packed venv) — and to find your own "
            "modules: ship them with spark.submit.pyFiles or "
            "spark.sparkContext.addPyFile('path/to/module.py'), or send a module's code with "
            "its functions: pyspark.cloudpickle.register_pickle_by_value(module)"
        )


@final
class ExecutorPlacementError(BarrierflowError):
    """An actor of the graph cannot run in Spark's tasks, so a pipeline cannot run on the
    executors (``run_on="executors"``); raised before any Spark job.

    Attributes:
        actor: the actor (or parallel group) that cannot be placed.
        reason: why, in words, with the way on.
    """

    def __init__(self, actor: str, reason: str) -> None:
        self.actor = actor
        self.reason = reason
        super().__init__(f"actor {actor!r} cannot run on Spark's executors: {reason}")


@final
class ExecutorChainFailedError(BarrierflowError):
    """An actor of the chain running in Spark's tasks failed in every attempt Spark made of a
    task (``spark.task.maxFailures``), which fails the micro-batch: nothing of it became
    visible. Each failed attempt was logged on the driver as it was learnt.

    Attributes:
        actor: the actor that raised (``None``: the task failed outside an actor).
        partition: the micro-batch's partition whose task failed.
        attempts: the attempts that failed, as far as the driver learnt them.
        cause: the actor's own error, carried back from the executor (``None`` when it could
            not be: an exception that does not pickle); ``cause_line`` names it either way.
        cause_line: the cause in one line (``"AsyncCallFailedError: ..."``).
    """

    def __init__(
        self,
        actor: str | None,
        partition: int,
        attempts: int,
        cause_line: str,
        cause: BaseException | None = None,
    ) -> None:
        self.actor = actor
        self.partition = partition
        self.attempts = attempts
        self.cause_line = cause_line
        self.cause = cause
        who = "a Spark task" if actor is None else f"actor {actor!r}"
        super().__init__(
            f"{who} failed on Spark's executors (partition {partition}, {attempts} failed "
            f"attempt(s)): {cause_line}"
        )


@final
class SparkCheckpointBehindError(BatchOrderError):
    """Spark sent a micro-batch id below the last one durable in the runtime's state store:
    Spark's checkpoint was lost, reset or restored from an older copy, so its batch ids
    restarted below the store's. Nothing is delivered — the store would skip none of those
    batches as replays and the sinks would hold their rows twice.

    The ways on: restore Spark's checkpoint that goes with the state store; or continue from
    the positions the sinks recorded, which do not depend on either: remove the state store
    and start with ``RuntimeConfig(adopt_sink_positions=True)`` (the demo: ``--resume
    --adopt-sink-positions``, which does both).

    Attributes: those of :class:`~barrierflow.errors.BatchOrderError` (``direction`` is
    ``"backwards"``; ``last`` is the store's last durable batch id, never ``None``).
    """

    def __init__(self, stream: str, last: int, batch_id: int, expected: int) -> None:
        super().__init__(stream, last, batch_id, expected)
        # The base's fields stand; the message says the cause and the ways on instead.
        self.args = (
            f"Spark query stream {stream!r} sent batch {batch_id}, below the state store's "
            f"last durable batch {last} (expected {expected}, or {last} again as a replay): "
            "Spark's checkpoint was lost or reset — its batch ids restarted below the state "
            "store's. To go on: restore the Spark checkpoint that goes with the store, or "
            "continue from the positions the sinks recorded: remove the state store and start "
            "with RuntimeConfig(adopt_sink_positions=True)",
        )
