"""The demo pipeline: a Spark Structured Streaming query, exactly once into an Iceberg or a
Delta Lake table.

``barrierflow demo`` (the README's first command) runs, on embedded defaults only — local
Spark, the SQLite state store, local files under ``--workdir``::

    Parquet files of events (key, value)                       generated in <workdir>/input
      → Spark readStream (one file per micro-batch, availableNow)
      → SparkBridge (toArrow, bounded feed, checkpoint per micro-batch)
      → hash dispatch by key → 4 parallel SinkWriters (staged Parquet data files)
      → Coordinator → one Iceberg snapshot per epoch               <workdir>/warehouse
                      or one Delta commit per epoch (--table delta) <workdir>/delta/events
                      or COMMIT PREPARED of each writer's prepared transaction
                         (--table postgres)        barrierflow_demo.events of --postgres-dsn
                                                   or of the demo's own <workdir>/postgres

With ``--run-on executors`` no row crosses the driver: Spark's tasks stage each micro-batch
as Parquet files where it lies, the driver hands their manifests to the same coordinator and
sends only the batch's end mark through the feed (see :mod:`barrierflow.spark_bridge.bridge`).
The default is ``driver``: it runs on any graph, and at the demo's sizes on one machine the two
are about even; ``executors`` is what scales with a cluster (``--spark-master spark://...``).
``--chain`` passes the events through ``filter → async_map`` (a service on loopback) ``→
map_batches`` before the table — in Spark's tasks with ``--run-on executors`` — keeping every
event (:mod:`barrierflow.app._demo_chain`). ``--keyed`` passes them through a keyed aggregate
instead (``key_by → aggregate → changelog_rows → map_batches``), its state on the executors
with ``--run-on executors``, keeping every event (:mod:`barrierflow.app._demo_keyed`).

It shows live progress (a table on a terminal; without one — output piped to a file, CI — a
plain line every few seconds), then reads the table back with the format's own reader
(pyiceberg, deltalake, psycopg) and verifies it: every key Spark sent is in the table exactly once.
Its last line is machine-readable:
``VERIFIED rows_in=N rows_out=N duplicates=0 epochs=K`` (or ``FAILED`` with the same fields).

``--crash-after N`` SIGKILLs the driver during micro-batch ``N`` of the run (by default while
the batch's rows are being written: ``--crash-point mid-batch``; also ``after-checkpoint``,
between the batch's durable checkpoint and Spark's own commit, and ``mid-commit``, after the
table's commit and before the coordinator records it). ``--resume`` continues from the state
left behind (the runtime's checkpoint, Spark's checkpoint, the table): Spark replays the batch
it had not committed, the bridge skips it if it was durable, the coordinator re-commits or
aborts what was pending, and the final verification still shows every row exactly once.
(After a restart Spark may plan the files left into fewer, larger micro-batches; ``epochs``
counts the epochs that hold rows, one per micro-batch.)

A run first records what it was asked for (rows, micro-batches, the table) in a manifest and
writes its input files atomically, each a pure function of the manifest and its index
(:mod:`barrierflow.app._demo_input`): a run killed while generating is completed by ``--resume``,
and the verification compares the table with the rows *asked for*, not with what is on disk.
A resume takes the started run's table; one that asks for other sizes or another table than
the started run is refused (:class:`ConfigError`).
Ctrl-C (the CLI) leaves what a crash leaves, and ``--resume`` continues from it too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio
import numpy as np

from barrierflow._one_line import one_line
from barrierflow.actors import BatchFeed, Coordinator, add_sink
from barrierflow.actors.sinks.add_sink import DeclaredSink
from barrierflow.actors.sinks.errors import SinkStateMismatchError
from barrierflow.app._demo_chain import EchoService, declare_chain
from barrierflow.app._demo_faults import CrashingTable, Faults, executor_faults
from barrierflow.app._demo_input import SCHEMA, TABLES, RunManifest, TableChoice, complete_input
from barrierflow.app._demo_keyed import declare_keyed
from barrierflow.app._demo_progress import LiveProgress, RunCounts, batch_line
from barrierflow.app._demo_runs import resume_command as resume_words
from barrierflow.app._demo_tables import ICEBERG_TABLE, DemoTable, open_table
from barrierflow.app._trace import trace
from barrierflow.channels.errors import ConfigError
from barrierflow.runtime import BlockingRuntime, Runtime, RuntimeConfig
from barrierflow.spark_bridge import SparkBridge, spark_session
from barrierflow.spark_bridge.errors import SparkCheckpointBehindError
from barrierflow.spark_bridge.failures import unwrap_spark_error

__all__ = [
    "SCHEMA",
    "TABLES",
    "CrashPoint",
    "DemoConfig",
    "DemoResult",
    "WRITE_ON",
    "TableChoice",
    "WriteOn",
    "resume_command",
    "run_demo",
]

WRITERS = 4
#: A new run's sizes when none are given (a resumed run takes the started run's).
DEFAULT_ROWS = 1_000_000
DEFAULT_BATCHES = 20
TABLE = ICEBERG_TABLE
#: Spark's own checkpoint (offsets, commits), under the work directory.
SPARK_CHECKPOINT = "spark-checkpoint"
#: Where ``--adopt-sink-positions`` moves a state store that outlived Spark's checkpoint.
STATE_SET_ASIDE = "state-set-aside"
#: Written when Spark's checkpoint was found behind the state store (a refused run): the
#: refused run itself re-created Spark's checkpoint, so its absence no longer says so.
SPARK_BEHIND = "spark-checkpoint-behind.json"

CrashPoint = Literal["mid-batch", "after-checkpoint", "mid-commit", "executor-lost"]
CRASH_POINTS: tuple[CrashPoint, ...] = (
    "mid-batch",
    "after-checkpoint",
    "mid-commit",
    "executor-lost",
)
WriteOn = Literal["driver", "executors"]
WRITE_ON: tuple[WriteOn, ...] = ("driver", "executors")
#: The local master of a run that writes on executors: a failed task is retried (up to 4
#: attempts) as on a cluster, instead of failing the micro-batch.
EXECUTORS_LOCAL_MASTER = "local[2,4]"


@dataclass(frozen=True)
class DemoConfig:
    """What the demo runs (see the module docstring).

    ``rows``, ``batches`` and ``table`` left ``None`` mean :data:`DEFAULT_ROWS` /
    :data:`DEFAULT_BATCHES` / ``"iceberg"`` for a new run, and the started run's for a
    resumed one.

    Raises:
        ConfigError: a size is not a positive int (or a new run has fewer rows than
            batches), or a crash point, backend or table is unknown.
    """

    workdir: Path = Path("demo-data")
    rows: int | None = None
    batches: int | None = None
    backend: Literal["asyncio", "trio"] = "asyncio"
    spark_master: str | None = None
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    crash_after: int | None = None
    crash_point: CrashPoint = "mid-batch"
    resume: bool = False
    progress: bool = True
    #: On a resume whose state store is gone but whose table holds commits: continue from the
    #: source positions the table recorded (else the run is refused; see RuntimeConfig).
    adopt_sink_positions: bool = False
    #: The table the pipeline writes: ``"iceberg"`` or ``"delta"`` (see the class).
    table: TableChoice | None = None
    #: Where the rows are written: through the driver's graph (``"driver"``, the default) or
    #: staged by Spark's tasks on the executors (``"executors"``). A run can resume the
    #: other way: both commit through the same coordinator and record the same positions.
    write_on: WriteOn = "driver"
    #: With ``table="postgres"``: the database to write into (a libpq connection string);
    #: ``None``: a server of the demo's own, with its data in ``<workdir>/postgres``.
    postgres_dsn: str | None = None
    #: Pass the events through a chain of actors on their way to the table (``--chain``:
    #: filter → async_map calling a service on loopback → map_batches, keeping every event;
    #: see :mod:`barrierflow.app._demo_chain`), in Spark's tasks with ``write_on="executors"``.
    chain: bool = False
    #: Pass the events through a keyed aggregate on their way to the table (``--keyed``,
    #: keeping every event; see :mod:`barrierflow.app._demo_keyed`), in Spark's tasks with
    #: its state beside the table with ``write_on="executors"``. Not with ``chain``.
    keyed: bool = False

    def __post_init__(self) -> None:
        for name in ("rows", "batches"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 1):
                raise ConfigError(name, "an int >= 1", value)
        rows, batches = self.sizes()
        if not self.resume and rows < batches:
            raise ConfigError("rows", f"at least one row per batch ({batches})", rows)
        if self.crash_after is not None and (
            type(self.crash_after) is not int or self.crash_after < 0
        ):
            raise ConfigError("crash_after", "None or an int >= 0", self.crash_after)
        if not isinstance(self.crash_point, str) or self.crash_point not in CRASH_POINTS:
            raise ConfigError("crash_point", f"one of {CRASH_POINTS}", self.crash_point)
        if not isinstance(self.backend, str) or self.backend not in ("asyncio", "trio"):
            raise ConfigError("backend", "'asyncio' or 'trio'", self.backend)
        if self.table is not None and (not isinstance(self.table, str) or self.table not in TABLES):
            raise ConfigError("table", f"None or one of {TABLES}", self.table)
        if not isinstance(self.write_on, str) or self.write_on not in WRITE_ON:
            raise ConfigError("write_on", f"one of {WRITE_ON}", self.write_on)
        if self.postgres_dsn is not None and (
            not isinstance(self.postgres_dsn, str) or not self.postgres_dsn.strip()
        ):
            raise ConfigError(
                "postgres_dsn", "None or a libpq connection string", self.postgres_dsn
            )
        if not isinstance(self.chain, bool):
            raise ConfigError("chain", "a bool", self.chain)
        if not isinstance(self.keyed, bool):
            raise ConfigError("keyed", "a bool", self.keyed)
        if self.keyed and self.chain:
            # Only filters may come before a keyed step on the executors (one repartition).
            raise ConfigError("keyed", "False with chain=True", self.keyed)
        if self.table == "postgres" and self.write_on != "driver":
            # Spark tasks stage Parquet files; a PostgreSQL writer's stage is a transaction.
            raise ConfigError("write_on", "'driver' with table='postgres'", self.write_on)
        if self.crash_point == "executor-lost" and self.write_on != "executors":
            raise ConfigError(
                "crash_point", "'executor-lost' only with write_on='executors'", self.crash_point
            )

    def sizes(self) -> tuple[int, int]:
        """A new run's rows and batches, defaults filled in."""
        rows = DEFAULT_ROWS if self.rows is None else self.rows
        return rows, DEFAULT_BATCHES if self.batches is None else self.batches


def resume_command(config: DemoConfig) -> str:
    """The command that resumes the run ``config`` describes (for the user to copy)."""
    words = resume_words(None, config.workdir, config.backend)
    words += " --run-on executors" if config.write_on == "executors" else ""
    words += " --chain" if config.chain else ""
    return words + (" --keyed" if config.keyed else "")


#: The errors that refuse a resume (the run stops before a row moves): the state store is
#: gone while the table holds commits, or Spark's checkpoint is gone while the store is not.
REFUSALS = (SinkStateMismatchError, SparkCheckpointBehindError)


def refusal_remedies(config: DemoConfig, failure: BaseException) -> tuple[str, ...]:
    """The ways on from a refused resume, one line each, for the user to copy."""
    adopt = resume_command(config) + " --adopt-sink-positions"
    if isinstance(failure, SinkStateMismatchError):
        lost = f"the state store in {config.workdir} is gone but the table holds commits"
        restore = "the state store the table's commits came with"
    else:
        lost = (
            f"Spark's checkpoint in {config.workdir / SPARK_CHECKPOINT} was lost or reset "
            "while the state store was kept"
        )
        restore = "the Spark checkpoint that goes with the state store"
    return (
        f"{lost};",
        f"to continue from the positions the table recorded: {adopt}",
        f"or restore {restore}, and resume",
    )


@dataclass(frozen=True)
class DemoResult:
    """What the demo verified, read back from the table."""

    #: The rows the run was asked to produce (its manifest), over every run.
    rows_in: int
    rows_out: int
    duplicates: int
    missing: int
    epochs: int
    batches_this_run: int
    seconds: float
    #: Why the run failed (the query or the runtime), if it did: its cause in one line.
    error: str | None = None
    #: The error itself (the callback's own error, not Spark's wrapper), for ``-v``.
    failure: BaseException | None = field(default=None, compare=False, repr=False)
    #: Rows Spark delivered in this run (a resumed run's earlier rows are not counted).
    rows_this_run: int = 0
    #: The table's format, as the demo's lines name it ("Iceberg", "Delta").
    table: str = "Iceberg"
    #: What the user can do when the run was refused (:attr:`refused`), one line each.
    remedies: tuple[str, ...] = ()

    @property
    def refused(self) -> bool:
        """The run refused to start rather than risk duplicating rows (the state store and
        the table or Spark's checkpoint disagree): nothing was written, nothing is lost; see
        :attr:`remedies`. Not a failed verification."""
        return isinstance(self.failure, REFUSALS)

    @property
    def verified(self) -> bool:
        """The run finished and every key Spark sent is in the table exactly once."""
        return (
            self.error is None
            and self.rows_in == self.rows_out
            and self.duplicates == 0
            and self.missing == 0
        )

    def summary_line(self) -> str:
        """The machine-readable last line: ``VERIFIED ...`` or ``FAILED ...`` (a refusal
        has none: the CLI prints the refusal and its remedies instead)."""
        word = "VERIFIED" if self.verified else "FAILED"
        return (
            f"{word} rows_in={self.rows_in} rows_out={self.rows_out} "
            f"duplicates={self.duplicates} epochs={self.epochs}"
        )


def build_runtime(
    workdir: Path,
    table: DemoTable,
    faults: Faults,
    *,
    adopt_sink_positions: bool = False,
    chain: tuple[str, int] | None = None,
    keyed: bool = False,
) -> tuple[Runtime, BatchFeed, DeclaredSink]:
    """The demo's graph: batch source (→ the chain calling the service at ``chain``, if
    given; → the keyed aggregate, if ``keyed``) → hash by key → 4 writers of ``table`` + their
    coordinator."""
    feed = BatchFeed(SCHEMA, chunk_rows=16_384, capacity=8)
    # With recovery, a transient failure rebuilds the graph and the bridge re-delivers the batch.
    config = RuntimeConfig(
        state_path=workdir / "state.db",
        barrier_interval=1.0,
        recovery=True,
        adopt_sink_positions=adopt_sink_positions,
    )
    rt = Runtime(config)
    rt.add_source("events", feed.source)
    source = "events" if chain is None else declare_chain(rt, "events", chain)
    source = declare_keyed(rt, source) if keyed else source
    # Writers events.0..3, hash-dispatched by key, and their coordinator service.
    declared = add_sink(
        rt, "events", CrashingTable(table.sink, faults), input=source, parallelism=WRITERS,
        key=("key",),
    )  # fmt: skip
    return rt, feed, declared


def verify(table: DemoTable, rows_in: int, batches: int, seconds: float) -> DemoResult:
    """Read the table back with its format's reader: rows, duplicate keys, missing keys,
    epochs committed."""
    keys, epochs = table.read_back()
    unique = np.unique(keys)
    expected = np.arange(rows_in, dtype=np.int64)
    missing = len(np.setdiff1d(expected, unique, assume_unique=True))
    return DemoResult(
        rows_in=rows_in,
        rows_out=len(keys),
        duplicates=len(keys) - len(unique),
        missing=missing,
        epochs=epochs,
        batches_this_run=batches,
        seconds=seconds,
        table=table.title,
    )


def _spark_schema() -> Any:
    from pyspark.sql.types import DoubleType, LongType, StructField, StructType

    return StructType([StructField("key", LongType()), StructField("value", DoubleType())])


def _prepare_input(config: DemoConfig, workdir: Path) -> RunManifest:
    """Start a new run (manifest first, then the input) or check and complete a started one.

    Raises:
        ConfigError: ``resume`` with no run started in ``workdir``, or with other sizes or
            another table.
    """
    if config.resume:
        manifest = RunManifest.read(workdir)
        manifest.check_resume(config.rows, config.batches, config.table)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
        manifest = RunManifest(*config.sizes(), table=config.table or TABLES[0])
        manifest.write(workdir)
    complete_input(workdir / "input", manifest)
    return manifest


def run_demo(config: DemoConfig) -> DemoResult:
    """Run the demo once (see the module docstring) and verify the table.

    Raises:
        ConfigError: ``config.resume`` with no run started in its work directory, or with
            other sizes or another table than the started run.
        SparkUnavailableError: pyspark or Java is missing.
    """
    started = time.perf_counter()
    workdir = config.workdir.resolve()
    input_dir = workdir / "input"
    trace("input")
    manifest = _prepare_input(config, workdir)
    # pyspark replaces Ctrl-C handling with its own when the SparkContext starts; keep the
    # caller's (the CLI's quiet interrupt).
    on_interrupt = signal.getsignal(signal.SIGINT)
    master = config.spark_master
    if master is None and config.write_on == "executors":
        master = EXECUTORS_LOCAL_MASTER
    spark = spark_session("barrierflow-demo", master=master, conf=config.spark_conf)
    if threading.current_thread() is threading.main_thread() and on_interrupt is not None:
        signal.signal(signal.SIGINT, on_interrupt)
    trace("spark-ready")
    faults = Faults(config.crash_after, config.crash_point, resume_command(config))
    if config.resume and config.adopt_sink_positions:
        _set_aside_state_without_spark_checkpoint(workdir)
    table = open_table(
        manifest.table, workdir, postgres_dsn=config.postgres_dsn, fresh=not config.resume
    )
    service = EchoService() if config.chain else None
    rt, feed, sink = build_runtime(
        workdir, table, faults, adopt_sink_positions=config.adopt_sink_positions,
        chain=None if service is None else service.address, keyed=config.keyed,
    )  # fmt: skip
    coordinator = sink.coordinator
    rows_before = table.rows()
    stream = (
        spark.readStream.schema(_spark_schema())
        .option("maxFilesPerTrigger", 1)
        .parquet(str(input_dir))
    )
    error: str | None = None
    failure: BaseException | None = None
    rows_this_run = 0
    failures: list[Exception] = []  # what the callback raised (Spark wraps it in Py4J text)
    try:
        with BlockingRuntime(rt, backend=config.backend) as handle:
            bridge = SparkBridge(handle, feed, stream="events-query", sink=sink)

            def callback(df: Any, batch_id: int) -> None:
                try:
                    trace("batch-begin", batch_id)
                    faults.begin_batch()
                    if config.write_on == "executors":
                        bridge.executors_callback(executor_faults(df, faults), batch_id)
                    else:
                        bridge.callback(df, batch_id)
                    trace("batch-checkpointed", batch_id)
                    if not config.progress:  # a plain line per micro-batch instead of the table
                        print(batch_line(batch_id, counts()), flush=True)
                    faults.end_batch()
                except Exception as exc:  # Spark only shows it as a Py4J traceback
                    failures.append(exc)
                    raise

            def counts() -> RunCounts:
                stats = bridge.stats()
                return RunCounts(
                    rows_asked=manifest.rows,
                    rows_before=rows_before,
                    rows_this_run=stats.rows,
                    batches_this_run=stats.batches,
                    replays_skipped=stats.replays_skipped,
                    epochs_this_run=coordinator.stats().committed_epochs,
                    blocked_seconds=feed.stats().blocked_seconds,
                    seconds=time.perf_counter() - started,
                )

            query = (
                stream.writeStream.foreachBatch(callback)
                .option("checkpointLocation", str(workdir / SPARK_CHECKPOINT))
                .trigger(availableNow=True)
                .start()
            )
            from pyspark.errors import StreamingQueryException

            progress = LiveProgress(
                config.progress, counts, settle=lambda: handle.call(_last_commit, coordinator)
            )
            with contextlib.suppress(StreamingQueryException):  # read just below
                _follow(query, progress)
            rows_this_run = bridge.stats().rows
            stopped = query.exception()
            if stopped is not None:
                # The callback's own error (kept here), not Spark's Py4J wrapper of it.
                failure = unwrap_spark_error(stopped, failures)
                error = "the streaming query failed: " + one_line(failure)
    except Exception as exc:  # the runtime failed: still read back what the table holds
        if error is None:
            failure = unwrap_spark_error(exc, failures)
            error = one_line(failure)
    if service is not None:
        service.close()
    trace("verify")
    result = verify(table, manifest.rows, faults.batches, time.perf_counter() - started)
    remedies = refusal_remedies(config, failure) if isinstance(failure, REFUSALS) else ()
    if isinstance(failure, SparkCheckpointBehindError):
        behind = {"stream": failure.stream, "last": failure.last, "batch_id": failure.batch_id}
        (workdir / SPARK_BEHIND).write_text(json.dumps(behind))
    return dataclasses.replace(
        result, error=error, failure=failure, rows_this_run=rows_this_run, remedies=remedies
    )


def _spark_checkpoint_lost(workdir: Path) -> bool:
    """Spark's checkpoint holds no micro-batch: it was deleted (or never written), so Spark
    starts again from batch 0."""
    offsets = workdir / SPARK_CHECKPOINT / "offsets"
    return not offsets.is_dir() or not any(p.name.isdigit() for p in offsets.iterdir())


def _set_aside_state_without_spark_checkpoint(workdir: Path) -> None:
    """``--resume --adopt-sink-positions`` with Spark's checkpoint lost (or found behind the
    store by a refused run: :data:`SPARK_BEHIND`) and the state store kept: the store's batch
    ids are ahead of Spark's restarted ones and would refuse them
    (:class:`SparkCheckpointBehindError`). The table's positions do not depend on either, so
    the store is moved to ``<workdir>/state-set-aside/`` (not deleted) and the run adopts them
    as when both were lost. The store's pending epochs are not lost: the table does not hold
    their batches, so Spark's replay delivers them again (and the committers' recovery deletes
    their files)."""
    stores = sorted(workdir.glob("state.db*"))
    behind = workdir / SPARK_BEHIND
    if not stores or not (behind.exists() or _spark_checkpoint_lost(workdir)):
        return
    aside = workdir / STATE_SET_ASIDE / time.strftime("%Y%m%dT%H%M%S")
    aside.mkdir(parents=True, exist_ok=True)
    for path in stores:
        path.rename(aside / path.name)
    behind.unlink(missing_ok=True)
    print(
        f"Spark's checkpoint is gone or behind: the state store was set aside to {aside}; "
        "continuing from the positions the table recorded",
        flush=True,
    )


#: How long the final table waits for the sink's last commit at most.
SETTLE_SECONDS = 30.0


async def _last_commit(coordinator: Coordinator) -> None:
    """Wait until the coordinator committed every epoch it acknowledged (at most
    :data:`SETTLE_SECONDS`): the last micro-batch returns once its checkpoint is durable, and
    its table commit lands just after — the final table must count it."""
    last = coordinator.stats().last_acked_epoch
    if last:
        with anyio.move_on_after(SETTLE_SECONDS):
            await coordinator.wait_committed(last)


def _follow(query: Any, progress: LiveProgress) -> None:
    """Wait for the query to finish, showing live progress (if enabled)."""
    with progress:
        while not query.awaitTermination(0.25):
            progress.refresh()
