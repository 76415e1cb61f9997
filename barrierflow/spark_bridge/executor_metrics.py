"""The counters of chains run in Spark's tasks, summed on the driver.

Each task of a micro-batch run on the executors returns its chain's counters
(:class:`~barrierflow.spark_bridge.task_runtime.TaskReport`): the
``barrierflow_actor_*`` and ``barrierflow_operator_*`` counters of each actor of the chain,
labelled with the actor's name on the driver. :class:`ExecutorCounters` adds them up across
tasks and micro-batches, and reports them as the same families with the label
``on="executors"``. The driver's registry therefore shows per-actor and per-operator figures
whichever side ran the actor, and ``barrierflow top`` marks the executor side. The driver's own
instances of those actors report their own series, without the label. On the executor path
they see only barriers and committables.

Only counters travel: a gauge (calls in flight) means nothing once its task is over. A failed
attempt returns no report, so what the counters say is what the kept attempts did.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import final

from barrierflow.runtime.metrics import MetricFamily, counter
from barrierflow.spark_bridge.task_runtime import TaskReport

__all__ = ["ExecutorCounters"]


@final
class ExecutorCounters:
    """Sums of the counters Spark tasks reported (see the module)."""

    def __init__(self) -> None:
        self._sums: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._tasks = 0
        self._seconds = 0.0
        self._state_seconds = 0.0
        self._state_rows_read = 0

    @property
    def tasks(self) -> int:
        """Tasks whose reports were added."""
        return self._tasks

    @property
    def seconds(self) -> float:
        """The tasks' seconds, summed."""
        return self._seconds

    @property
    def state_seconds(self) -> float:
        """The tasks' seconds loading keyed state and staging its changes, summed."""
        return self._state_seconds

    @property
    def state_rows_read(self) -> int:
        """The keyed state rows the tasks loaded, summed."""
        return self._state_rows_read

    def add(self, reports: Iterable[TaskReport]) -> None:
        """Add the reports of one micro-batch's kept task attempts."""
        for report in reports:
            self._tasks += 1
            self._seconds += report.seconds
            self._state_seconds += report.state_seconds
            self._state_rows_read += report.state_rows_read
            for name, labels, value in report.counters:
                key = (name, tuple(sorted({**labels, "on": "executors"}.items())))
                self._sums[key] = self._sums.get(key, 0.0) + value

    def families(self) -> list[MetricFamily]:
        """The sums as counter families (one per metric name)."""
        by_name: dict[str, list[tuple[dict[str, str], float]]] = {}
        for (name, labels), value in self._sums.items():
            by_name.setdefault(name, []).append((dict(labels), value))
        return [
            counter(name, f"{name} of the actors run in Spark's tasks", values)
            for name, values in by_name.items()
        ]
