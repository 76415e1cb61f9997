"""The live pipelines the crash harness kills: the demo's three acts, with where to kill them.

Each act is run by its CLI command (``python -m barrierflow demo <act>``) at sizes small
enough for a run to last seconds, and has a list of :class:`Target` s — trace events
(:mod:`barrierflow.app._trace`) to kill at, each with the part of the pipeline it stands for:
start-up, mid-batch, between a checkpoint and the sink's commit, mid-commit, each phase of a
backfill, the final read-back. A seeded plan picks a target, which occurrence of its event,
and a delay after it — or, for a share of the kills, no target at all but a uniform random
moment of the run (:mod:`.harness`), which reaches what no target marks.

The Spark act writes one of three tables (``--table iceberg|delta|postgres``): the harness
gives each of its rounds one (:meth:`Act.writing`), and the act's audit reads that table with
its own reader (pyiceberg, deltalake, psycopg). The ``spark-executors`` act is the Spark act
with Spark's tasks staging the rows (``--run-on executors``; Iceberg and Delta only), killed
while they stage, after they staged and before the commit, and mid-commit. The ``spark-chain``
act is that act with a chain of actors before the table (``--chain``: filter → async_map
calling a service on loopback → map_batches), run in Spark's tasks. The ``spark-keyed`` act is
the executors act with a keyed aggregate before the table (``--keyed``), its state read,
applied and staged by Spark's tasks and committed with the epoch's rows.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import final

from barrierflow.app.chaos.audit import Audit, spark_table
from barrierflow.app.chaos.audit_delta import audit_delta
from barrierflow.app.chaos.audit_iceberg import audit_iceberg
from barrierflow.app.chaos.audit_parquet import audit_backfill, audit_views
from barrierflow.app.chaos.audit_postgres import audit_postgres

__all__ = ["ACTS", "Act", "Target", "audit_spark"]


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
    #: The tables a round may write (``--table``), in rotation; ``()``: the act has no
    #: choice. An act :meth:`writing` one table has just it.
    tables: tuple[str, ...] = ()
    #: The demo act the CLI runs (``demo <demo_act>``); ``""``: the act's own name.
    demo_act: str = ""
    #: Options every run of the act gets, new or resumed.
    options: tuple[str, ...] = ()

    @property
    def table(self) -> str:
        """The table this act writes, once :meth:`writing` chose it (else ``""``)."""
        return self.tables[0] if len(self.tables) == 1 else ""

    def writing(self, table: str) -> Act:
        """This act writing ``table``: a new run asks for it (``--table``; a resumed run keeps
        the started run's), and the audit reads that table."""
        return dataclasses.replace(
            self,
            sizes=(*self.sizes, "--table", table),
            audit=functools.partial(self.audit, table=table),
            tables=(table,),
        )

    def command(self, python: str, workdir: Path, backend: str, resume: bool) -> list[str]:
        demo = self.demo_act or self.name
        words = [python, "-m", "barrierflow", "demo", demo, "--workdir", str(workdir)]
        words += ["--backend", backend, *self.options]
        words += ["--resume"] if resume else list(self.sizes)
        if demo == "spark":
            words.append("--no-progress")
        return words


def audit_spark(workdir: Path, *, complete: bool, table: str = "iceberg") -> Audit:
    """Audit the Spark act's ``table`` in ``workdir`` (:func:`.audit_iceberg.audit_iceberg`,
    :func:`.audit_delta.audit_delta` or :func:`.audit_postgres.audit_postgres`), and that the
    run recorded that table in its manifest: a run writing another table than the round asked
    for would go unaudited."""
    auditor = {"delta": audit_delta, "postgres": audit_postgres}.get(table, audit_iceberg)
    audit = auditor(workdir, complete=complete)
    recorded = spark_table(workdir)
    if recorded is not None and recorded != table:
        audit.add("table_not_as_asked", f"the round asked for {table}, the run wrote {recorded}")
    return audit


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
    audit_spark,
    600.0,
    ("iceberg", "delta", "postgres"),
)

#: The Spark act with the rows staged by Spark's tasks on the executors: a kill lands while
#: the executors stage a micro-batch (the whole process group dies: driver, Spark JVM, Python
#: workers), after they staged and the driver handed their files over but before the
#: coordinator's commit (``pre-commit``), or mid-commit. The audit is the Spark act's.
SPARK_EXECUTORS = Act(
    "spark-executors",
    ("--rows", "20000", "--batches", "8"),
    "demo-run.json",
    (
        Target("spark-ready", "Spark up, the query starting", 1, 3.0),
        Target("batch-begin", "mid-batch, executors staging", 4, 0.6),
        Target("batch-checkpointed", "after a batch's checkpoint, before Spark's commit", 4),
        *_COMMIT_TARGETS,
        Target("verify", "during the final read-back", 1, 0.4),
    ),
    audit_spark,
    600.0,
    ("iceberg", "delta"),
    demo_act="spark",
    options=("--run-on", "executors"),
)

#: The executors act with a chain of actors before the table (``--chain``): filter → async_map
#: calling a service on loopback → map_batches, run in Spark's tasks, so that a kill lands
#: while they run it, with calls in flight. The audit is the Spark act's (the chain keeps
#: every event as it is).
SPARK_CHAIN = dataclasses.replace(
    SPARK_EXECUTORS, name="spark-chain", options=(*SPARK_EXECUTORS.options, "--chain")
)

#: The executors act with a keyed aggregate before the table (``--keyed``: key_by → aggregate
#: → changelog_rows → map_batches), run in Spark's tasks with its state in vnode stores beside
#: the table, so that a kill lands while they read, apply and stage the state, or between an
#: epoch's state commit and its rows'. The audit is the Spark act's: the step keeps every event
#: once, and state committed without its rows (or the reverse) shows as missing (duplicate)
#: keys (see :mod:`barrierflow.app._demo_keyed`).
SPARK_KEYED = dataclasses.replace(
    SPARK_EXECUTORS, name="spark-keyed", options=(*SPARK_EXECUTORS.options, "--keyed")
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
ACTS = {
    act.name: act for act in (SPARK, SPARK_EXECUTORS, SPARK_CHAIN, SPARK_KEYED, BACKFILL, VIEWS)
}
