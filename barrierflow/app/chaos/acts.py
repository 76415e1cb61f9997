"""The live pipelines the crash harness kills: the demo's three acts, with where to kill them.

Each act is run by its CLI command (``python -m barrierflow demo <act>``) at sizes small
enough for a run to last seconds, and has a list of :class:`Target` s — trace events
(:mod:`barrierflow.app._trace`) to kill at, each with the part of the pipeline it stands for:
start-up, mid-batch, between a checkpoint and the sink's commit, mid-commit, each phase of a
backfill, the final read-back. A seeded plan picks a target, which occurrence of its event,
and a delay after it — or, for a share of the kills, no target at all but a uniform random
moment of the run (:mod:`.harness`), which reaches what no target marks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import final

from barrierflow.app.chaos.audit import Audit
from barrierflow.app.chaos.audit_iceberg import audit_iceberg
from barrierflow.app.chaos.audit_parquet import audit_backfill, audit_views

__all__ = ["ACTS", "Act", "Target"]


@final
@dataclass(frozen=True, slots=True)
class Target:
    """A place to kill an act: after its ``event`` (whose detail contains ``detail``)."""

    event: str
    #: The part of the pipeline a kill here lands in, for the report.
    where: str
    #: The occurrence of the event to kill at is drawn from ``1..occurrences``.
    occurrences: int = 1
    #: The delay after the event is drawn from ``0..delay`` seconds.
    delay: float = 0.0
    detail: str = ""


@final
@dataclass(frozen=True, slots=True)
class Act:
    """One of the demo's acts, as the harness runs, kills and audits it."""

    name: str
    #: Sizes of a new run (``--resume`` takes the started run's).
    sizes: tuple[str, ...]
    #: The run's manifest: once it exists a restart is ``--resume``, before it a new run.
    manifest: str
    targets: tuple[Target, ...]
    audit: Callable[..., Audit]
    #: Seconds a run may take before the harness calls it hung.
    timeout: float

    def command(self, python: str, workdir: Path, backend: str, resume: bool) -> list[str]:
        words = [python, "-m", "barrierflow", "demo", self.name, "--workdir", str(workdir)]
        words += ["--backend", backend]
        words += ["--resume"] if resume else list(self.sizes)
        if self.name == "spark":
            words.append("--no-progress")
        return words


_COMMIT_TARGETS = (
    Target("pre-commit", "between a checkpoint barrier and the sink's commit", 5, 0.03),
    Target("commit-begin", "mid-commit", 5, 0.02),
    Target("commit-done", "after a commit, before it is recorded", 5, 0.0),
)

SPARK = Act(
    "spark",
    ("--rows", "20000", "--batches", "8"),
    "demo-run.json",
    (
        Target("start", "during start-up (input, Spark session)", 1, 8.0),
        Target("spark-ready", "Spark up, the query starting", 1, 3.0),
        Target("batch-begin", "mid-batch, rows arriving", 4, 0.1),
        Target("write", "mid-batch, rows written to staging", 8, 0.0),
        Target("batch-checkpointed", "after a batch's checkpoint, before Spark's commit", 4),
        *_COMMIT_TARGETS,
        Target("verify", "during the final read-back", 1, 0.4),
    ),
    audit_iceberg,
    600.0,
)

BACKFILL = Act(
    "backfill",
    ("--streams", "2", "--history", "4000", "--live", "3000"),
    "demo-backfill.json",
    (
        Target("start", "during start-up (server, history)", 1, 1.5),
        # The run's manifest is written once the server is up, its streams filled just after:
        # a kill here leaves a run to resume whose streams do not exist yet.
        Target("server-ready", "after the manifest, before the streams exist", 1, 0.02),
        Target("job-add", "as the history job is added", 1, 0.05),
        Target("job-durable", "right after the history job became durable", 1, 0.05),
        Target("backfill-phase", "mid-backfill, reading history", 1, 0.05, "backfilling"),
        Target("backfill-phase", "mid-backfill, catching up", 1, 0.05, "caching_up"),
        Target("producer-round", "while records arrive live", 3, 0.05),
        *_COMMIT_TARGETS,
        Target("drain", "draining the last records", 1, 0.2),
        Target("verify", "during the final read-back", 1, 0.1),
    ),
    audit_backfill,
    300.0,
)

VIEWS = Act(
    "views",
    ("--batches", "12", "--rows", "120000", "--keys", "20000"),
    "demo-views.json",
    (
        Target("start", "during start-up", 1, 1.0),
        Target("batch-delivered", "between batches", 6, 0.05),
        Target("job-add", "as the copy job is added", 1, 0.05),
        Target("backfill-phase", "mid-snapshot", 1, 0.05, "snapshot"),
        Target("backfill-phase", "replaying the change log", 1, 0.02, "change_log"),
        Target("job-ready", "right after the copy caught up", 1, 0.05),
        *_COMMIT_TARGETS,
        Target("drain", "draining the last epochs", 1, 0.1),
        Target("verify", "during the final read-back", 1, 0.1),
    ),
    audit_views,
    300.0,
)

#: The acts by name.
ACTS = {act.name: act for act in (SPARK, BACKFILL, VIEWS)}
