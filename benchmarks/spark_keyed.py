"""Keyed state on Spark's executors: ``key_by -> aggregate -> changelog_rows -> table`` run in
the Spark tasks (``run_on="executors"``: a vnode repartition, each task loading its vnodes'
state as of the last commit and staging its delta) against the same declarations through the
driver (``run_on="driver"``: ``toArrow``, the aggregate and the writers in the driver).

``executors_keyed_aggregate_rows_per_s`` — 8M rows over 1M keys in micro-batches of 1M rows
(``--quick``: 400K rows over 100K keys in micro-batches of 100K), int64 ``k`` uniform over the
keys and int64 ``v``, made by Spark on the executors in 4 partitions; ``key_by("k") ->
aggregate(total=sum(v), n=count(v), top=max(v)) -> changelog_rows() -> 4 Iceberg writers``
(``add_sink(..., parallelism=4)``: on the executor path, 4 tasks of 64 vnodes each). Each run
is a fresh driver (:mod:`benchmarks._keyed_driver_child`) measured as
:mod:`benchmarks.spark_chain` measures its drivers — the same cluster (two workers, an executor
of one core each; ``--quick``: ``local[2]`` and one driver for both sides), the same psutil
reading of the driver's process tree from the cue to the last commit. Checked after each run
(untimed): the committed changelog's signed sums of ``n`` and ``total`` and its signed count
of keys equal Spark's aggregate of every micro-batch.

Reported:

* the value: rows/s of the executor path; the baseline: the driver path's; goal ``>= 0.7`` on
  the ratio.
* ``details.driver_cpu_per_m_rows``: the driver's process-tree CPU seconds (Python + JVM, user
  + sys) per million rows on each path and their ratio, goal ``<= 0.3``.
* ``details.task_ms``: per task per micro-batch (the executor path's, over every task of the
  median run), the state read + delta write (``TaskReport.state_seconds``) against the task's
  total (``TaskReport.seconds``), median and max, and the state rows each task loaded.
* ``details.breakdown``: where each path's time goes per micro-batch (ms): in all, in the Spark
  jobs (``job``, as the driver saw them) and the adoption of their files (``stage`` includes
  the job), in delivery and checkpoint (``deliver``), in ``toArrow`` (the driver path); and
  (not with ``--quick``: one more driver) Spark alone's rows/s over the same micro-batches, a
  ``mapInArrow`` counting rows in the Python tasks, as made and after the vnode repartition.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.harness import Settings, make_record, median, rounded, sampled
from benchmarks.spark_chain import (
    PARTITIONS,
    WRITERS,
    DriverRun,
    _cpu,
    _machine,
    _measure,
    _per_side,
    _placement,
    _rates,
    _split,
)

__all__ = ["BENCHMARKS"]

CHILD = Path(__file__).with_name("_keyed_driver_child.py")
#: Full and ``--quick`` sizes: (keys, rows per micro-batch, micro-batches, runs a side).
FULL = (1_000_000, 1_000_000, 8, 2)
QUICK = (100_000, 100_000, 4, 1)
#: Goals on the rows/s ratio and the driver CPU per row ratio.
GOAL_RATE = 0.7
GOAL_CPU = 0.3


def _keyed(
    settings: Settings, run_on: str, keys: int, rows: int, batches: int, mode: str = "keyed"
) -> dict[str, Any]:
    """A driver run of the keyed aggregate on ``run_on`` (``mode="floor"``: Spark alone over
    the same micro-batches)."""
    placement = _placement(settings, cores_per_executor=1)
    return {
        "mode": mode,
        "master": placement["master"],
        "conf": placement["conf"],
        "run_on": run_on,
        "keys": keys,
        "rows": rows,
        "batches": batches,
        "partitions": PARTITIONS,
        "writers": WRITERS,
        "backend": "asyncio",
    }


def _median_run(runs: list[DriverRun]) -> DriverRun:
    return sorted(runs, key=lambda r: r.seconds)[len(runs) // 2]


def _task_ms(runs: list[DriverRun]) -> dict[str, Any]:
    """Per task per micro-batch of the median run: its state seconds and its total, in ms."""
    tasks = _median_run(runs).stats.get("tasks", [])
    if not tasks:
        return {}
    state = [t[3] * 1e3 for t in tasks]
    total = [t[2] * 1e3 for t in tasks]

    def summary(values: list[float]) -> dict[str, float | None]:
        return {"median": rounded(median(values), 4), "max": rounded(max(values), 4)}

    return {
        "tasks": len(tasks),
        "state_read_and_write": summary(state),
        "task_total": summary(total),
        "state_share": rounded(sum(state) / sum(total), 3),
        "rows_per_task": summary([float(t[1]) for t in tasks]),
        "state_rows_read_per_task": summary([float(t[4]) for t in tasks]),
    }


def _breakdown(runs: list[DriverRun], batches: int) -> dict[str, Any]:
    """:func:`~benchmarks.spark_chain._split` of the median run, with its Spark jobs' ms per
    micro-batch when it ran any."""
    split: dict[str, Any] = _split(runs, batches)
    jobs = _median_run(runs).stats.get("job_seconds", [])
    if jobs:
        split["job"] = rounded(sum(jobs) / batches * 1e3, 4)
    return split


def executors_keyed_aggregate_rows_per_s(settings: Settings) -> dict[str, Any]:
    keys, rows, batches, reps = QUICK if settings.quick else FULL
    ours, theirs = _measure(
        [
            _keyed(settings, "executors", keys, rows, batches),
            _keyed(settings, "driver", keys, rows, batches),
        ],
        reps,
        settings,
        CHILD,
    )
    cpu_ratio = median(_cpu(ours)) / median(_cpu(theirs))
    breakdown: dict[str, Any] = {
        "ms_per_batch_executors": _breakdown(ours, batches),
        "ms_per_batch_driver": _breakdown(theirs, batches),
    }
    if not settings.quick:
        (floor,) = _measure(
            [_keyed(settings, "executors", keys, rows, batches, mode="floor")], 1, settings, CHILD
        )
        breakdown["spark_alone_rows_per_s"] = {k: rounded(v) for k, v in floor[0].stats.items()}

    def side(figure: Callable[[DriverRun], float]) -> dict[str, float | None]:
        return _per_side(ours, theirs, figure)

    return make_record(
        "executors_keyed_aggregate_rows_per_s",
        median(_rates(ours)),
        "rows/s",
        median(_rates(theirs)),
        f">= {GOAL_RATE}",
        details={
            "figure": "rows/s of key_by -> aggregate(sum, count, max) -> changelog_rows -> "
            "4 Iceberg writers, the executor path over the driver path",
            "spark_master": "local[2]"
            if settings.quick
            else "standalone: 2 workers, an executor of 1 core each",
            "partitions": PARTITIONS,
            "writers": WRITERS,
            **_machine(),
            "keys": keys,
            "rows_per_batch": rows,
            "batches_per_run": batches,
            **sampled(_rates(ours), _rates(theirs)),
            "driver_cpu_per_m_rows": {
                **side(lambda r: r.cpu_per_m_rows),
                "ratio": rounded(cpu_ratio),
                "goal": f"<= {GOAL_CPU}",
                "meets_goal": cpu_ratio <= GOAL_CPU,
                "python": side(lambda r: r.cpu_python / r.rows * 1e6),
                "jvm": side(lambda r: r.cpu_jvm / r.rows * 1e6),
            },
            "task_ms": _task_ms(ours),
            "breakdown": breakdown,
            "rss_growth_mb": side(lambda r: r.growth_mb),
            "machine_cpu_busy": side(lambda r: r.machine_busy),
            "candidate": "run_on='executors': vnode repartition, the aggregate in 4 Spark "
            "tasks with its state loaded from and staged to the shared vnode stores",
            "baseline_impl": "the same declarations with run_on='driver' (toArrow, the "
            "aggregate and the writers in the driver)",
        },
    )


#: Every benchmark of this module, by name.
BENCHMARKS: dict[str, Callable[[Settings], dict[str, Any]]] = {
    "executors_keyed_aggregate_rows_per_s": executors_keyed_aggregate_rows_per_s,
}
