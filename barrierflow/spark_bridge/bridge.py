"""The Spark bridge: Spark micro-batches in as Arrow chunks, exactly once.

A :class:`SparkBridge` connects a Spark driver to a running barrierflow graph whose source is
a :class:`~barrierflow.actors.BatchFeed`'s source actor::

    feed = BatchFeed(SCHEMA)
    rt = Runtime(config)
    rt.add_source("events", feed.source, fanout=Fanout("hash", ("key",)))
    ...                                              # the rest of the graph
    with BlockingRuntime(rt) as handle:              # the runtime on a background thread
        bridge = SparkBridge(handle, feed)
        query = bridge.start(stream_df, checkpoint_location="ck/")   # or:
        # stream_df.writeStream.foreachBatch(bridge.callback).option(...).start()
        bridge.await_termination(query)      # a failure raises its cause, not a Py4J wall

For each micro-batch, :meth:`SparkBridge.callback` (running on Spark's callback thread):

1. checks the micro-batch's schema against the feed's, before any Spark work or any row moves
   (:class:`~barrierflow.errors.SchemaMismatchError` names both; when they differ only in a
   timestamp's time zone or an integer's width, it says which cast fixes it, or to declare
   the feed with :func:`arrow_schema_of`);
2. checks the batch id against the last durable one: Spark replays the last batch it did not
   commit after a crash — if that batch is durable here it is skipped without even being
   computed; an id that goes backwards or skips is :class:`~barrierflow.errors.BatchOrderError`;
3. converts the micro-batch with ``DataFrame.toArrow()`` and delivers it through the feed:
   chunks of ``chunk_rows`` through a bounded channel (a slow graph blocks this thread, which
   slows Spark down), then a checkpoint, returning only once the epoch that holds the rows and
   the batch id is durable. Spark then writes its own commit for the batch.

The bridge holds at most one micro-batch (the ``toArrow`` table) plus what the feed's channel
holds. Static DataFrames go through :meth:`SparkBridge.pump` the same way.

**Running on the executors** (``start(..., run_on="executors")``, for a bridge given the
``sink`` it feeds; ``write_on=`` is the argument's old name). Every row of the path above
crosses the driver; with ``"executors"`` none does, and the pipeline scales with Spark's
cluster instead of one Python process. The actors between the feed and the sink — a chain of
partition-local ones (:mod:`barrierflow.spark_bridge.chain`) — run inside every Spark task
over its partition (:mod:`barrierflow.spark_bridge.task_runtime`); anything else in their way
is refused, in one line naming the actor, before the query starts, and so is a chain whose
code the executors cannot import (the bridge builds the chain once on an executor first).
Per micro-batch, on Spark's callback thread:

1. the micro-batch's schema (against the feed's) and the batch id are checked as above; a
   replay is skipped before any Spark work;
2. one Spark job runs the chain and stages its output where the micro-batch lies — each task
   writes its partition's rows as Parquet files under its attempt's own directory and returns
   only its manifest and counters (:mod:`barrierflow.spark_bridge.executors`); no shuffle is
   added unless the sink declares a ``parallelism`` the batch's partitions do not have;
3. the driver moves the files of the one attempt Spark kept per partition into the staging
   layout writer actors use (one rename per partition) and wraps the partitions' manifests in
   one :class:`~barrierflow.actors.sinks.committables.StagedBatch`;
4. the batch goes through the feed as on the driver path — one crossing into the runtime,
   with the batch-id check — but as a *committable* with its end mark instead of rows: it
   flows to the sink's writer, which hands it to the coordinator with its manifest of the
   epoch whose barrier follows; the coordinator checks that the batch's manifests cover every
   partition exactly once, persists the epoch as pending before the checkpoint can be
   durable, and commits it once it is. The batch-id dedup and the positions the table records
   work as for rows delivered through the driver.

Two crossings per micro-batch: the batch-id check before any Spark work (a replay is skipped
without computing it), and the delivery. A graph failure in between, or during the delivery,
is retried from step 1 (the feed's ``retries`` times): the batch is either durable by then, or
staged again under a new staging number (the epoch that held the first try failed; its files
are deleted by the coordinator's recovery, and a committable whose files that recovery deleted
fails its epoch at the writer rather than commit without them).

Which to pick: ``"driver"`` (the default) runs every graph — keyed and global actors, several
sinks, side branches — and suits a stream one Python process keeps up with.
``"executors"`` is for a chain of partition-local steps into one table: the driver's cost no
longer grows with the rows (no ``toArrow``, no rows in its memory), and the chain scales with
the cluster's cores. The table's directory must be a path both the driver and the executors
see.

**Failures.** An error raised in the callback stops the query, and Spark hands it to the
driver as a ``StreamingQueryException`` whose text buries it under Py4J and JVM traces.
:meth:`SparkBridge.await_termination` (or :meth:`SparkBridge.unwrap` on what the driver caught
or ``query.exception()`` returned) gives back the error the callback raised — the same typed
object, kept on the Python side — or a :class:`~barrierflow.errors.SparkQueryFailedError`
naming Spark's own cause in one line (see :mod:`barrierflow.spark_bridge.failures`).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, final

import pyarrow as pa
import structlog

from barrierflow._extras import require
from barrierflow._fs import check_path_argument
from barrierflow.actors.sinks.add_sink import DeclaredSink
from barrierflow.actors.sinks.committables import ChecksStaged, StagedBatch
from barrierflow.actors.sinks.errors import CoordinatorAbortedError
from barrierflow.actors.sources.batch_feed import BatchFeed
from barrierflow.actors.sources.errors import BatchOrderError
from barrierflow.channels.errors import InvalidArgumentError, SchemaMismatchError
from barrierflow.channels.messages import Committable
from barrierflow.channels.schema import cast_fixes, check_schema, conform_schema
from barrierflow.connectors.errors import ExecutorStagingError
from barrierflow.connectors.executor_staging import (
    ExecutorWrites,
    executor_writes,
    staging_number,
)
from barrierflow.connectors.state_commit import commits_state
from barrierflow.runtime.blocking import BlockingRuntime
from barrierflow.runtime.errors import ActorFailedError, ActorGoneError, NotRunningError
from barrierflow.runtime.metrics import MetricFamily, counter
from barrierflow.spark_bridge.chain import plan_chain
from barrierflow.spark_bridge.errors import ExecutorPlacementError, SparkCheckpointBehindError
from barrierflow.spark_bridge.executor_metrics import ExecutorCounters
from barrierflow.spark_bridge.executors import (
    compact_on_executors,
    probe_chain,
    stage_on_executors,
)
from barrierflow.spark_bridge.failures import unwrap_spark_error
from barrierflow.spark_bridge.shared_view import SharedView
from barrierflow.spark_bridge.task_runtime import TaskChain
from barrierflow.spark_bridge.task_state import (
    STATE_DIRECTORY,
    KeyedStep,
    state_stores,
)

__all__ = ["BridgeStats", "SparkBridge", "arrow_schema_of"]

_log = structlog.get_logger("barrierflow.spark_bridge")


@final
@dataclass(frozen=True, slots=True)
class BridgeStats:
    """A snapshot of a bridge's counters."""

    #: Micro-batches delivered, and replays skipped.
    batches: int
    replays_skipped: int
    #: Rows delivered.
    rows: int
    #: Seconds in Spark's ``toArrow``, and in delivery (channel waits and checkpoints).
    to_arrow_seconds: float
    deliver_seconds: float
    #: Micro-batches staged on the executors (counted in ``batches`` too once durable), and
    #: seconds in those Spark jobs and the driver's adoption of their files.
    staged_batches: int = 0
    stage_seconds: float = 0.0
    #: Spark tasks that ran a chain (or wrote rows) for those micro-batches, and their
    #: seconds, summed over the attempts Spark kept.
    executor_tasks: int = 0
    task_seconds: float = 0.0
    #: Of those seconds, the time a keyed step's tasks spent loading their state and staging
    #: its changes, and the state rows they loaded.
    state_seconds: float = 0.0
    state_rows_read: int = 0


def arrow_schema_of(df: Any) -> pa.Schema:
    """The Arrow schema ``df.toArrow()`` will have (computed from Spark's schema, no job): the
    schema to declare a :class:`~barrierflow.actors.BatchFeed` with
    (``BatchFeed(arrow_schema_of(df))``). Spark's ``timestamp`` is
    ``timestamp[us, tz=UTC]``, ``timestamp_ntz`` is ``timestamp[us]``, ``int`` is ``int32``
    and ``bigint`` is ``int64``."""
    spark_types = require("spark", "pyspark.sql.pandas.types")
    schema: pa.Schema = spark_types.to_arrow_schema(df.schema, timezone="UTC")
    return schema


def _check_frame(df: Any, schema: pa.Schema, what: str, streaming: bool | None = None) -> None:
    """Refuse, before any Spark job, what is not a PySpark DataFrame of ``schema`` (streaming
    or static as ``streaming`` requires, if given)."""
    if not all(hasattr(df, name) for name in ("toArrow", "schema", "isStreaming")):
        raise InvalidArgumentError("df", "a PySpark 4 DataFrame", type(df).__name__)
    if streaming is True and not df.isStreaming:
        raise InvalidArgumentError("df", "a streaming DataFrame (use pump() otherwise)", df)
    if streaming is False and df.isStreaming:
        raise InvalidArgumentError("df", "a static DataFrame (use start() to stream)", df)
    got = arrow_schema_of(df)
    try:
        check_schema(got, schema, what)
    except SchemaMismatchError:
        raise SchemaMismatchError(what, schema, got, fix=_cast_fix(schema, got)) from None


#: Spark's SQL type names of the Arrow integer types it has (Spark has no unsigned ones).
_SPARK_INTEGERS = {
    pa.int8(): "tinyint",
    pa.int16(): "smallint",
    pa.int32(): "int",
    pa.int64(): "bigint",
}


def _cast_fix(want: pa.Schema, got: pa.Schema) -> str:
    """How to fix a micro-batch schema that differs from the feed's only in timestamps' time
    zones or integers' widths (the two a user meets most: Spark's ``timestamp`` carries UTC,
    its ``int`` is 32 bits): the Spark casts, and declaring the feed with
    :func:`arrow_schema_of`. ``""`` for any other difference (a name, a type that no Spark
    cast produces)."""
    if want.names != got.names:
        return ""
    casts: list[str] = []
    for wanted, have in zip(want, got, strict=True):
        if wanted.type == have.type:
            continue
        if not cast_fixes(wanted.type, have.type):
            return ""
        if pa.types.is_timestamp(wanted.type):
            if wanted.type.unit != "us" or wanted.type.tz not in (None, "UTC"):
                return ""  # Spark's timestamps are microseconds, in UTC or naive
            spark_type = "timestamp_ntz" if wanted.type.tz is None else "timestamp"
        elif wanted.type in _SPARK_INTEGERS:
            spark_type = _SPARK_INTEGERS[wanted.type]
        else:
            return ""  # Spark has no unsigned integers
        casts.append(f".withColumn({wanted.name!r}, df[{wanted.name!r}].cast({spark_type!r}))")
    return (
        f"declare the feed with BatchFeed(arrow_schema_of(df)), or cast in Spark: "
        f"df{''.join(casts)}"
    )


class SparkBridge:
    """Delivers Spark DataFrames into a running runtime (see the module docstring).

    Args:
        runtime: the running runtime's blocking handle (the bridge is called from Spark's
            threads, not from async code).
        feed: the feed whose source actor is in the runtime's graph.
        stream: the name under which batch ids are recorded (one per streaming query).
        sink: the sink (what :func:`~barrierflow.actors.sinks.add_sink.add_sink` returned)
            the feed's source feeds directly; needed only to write on the executors.

    Raises:
        InvalidArgumentError: a bad argument (names it).
    """

    def __init__(
        self,
        runtime: BlockingRuntime,
        feed: BatchFeed,
        *,
        stream: str = "spark",
        sink: DeclaredSink | None = None,
        state_root: str | os.PathLike[str] | None = None,
    ) -> None:
        if not isinstance(runtime, BlockingRuntime):
            raise InvalidArgumentError("runtime", "a BlockingRuntime", type(runtime).__name__)
        if not isinstance(feed, BatchFeed):
            raise InvalidArgumentError("feed", "a BatchFeed", type(feed).__name__)
        if not isinstance(stream, str) or not stream:
            raise InvalidArgumentError("stream", "a non-empty str", stream)
        if sink is not None and not isinstance(sink, DeclaredSink):
            raise InvalidArgumentError("sink", "None or what add_sink returned", sink)
        self.runtime = runtime
        self.feed = feed
        self.stream = stream
        self.sink = sink
        self._state_root = None if state_root is None else check_path_argument(state_root)
        self._writes: ExecutorWrites | None = None
        self._compactor: ThreadPoolExecutor | None = None
        self._counters = ExecutorCounters()
        self._probed = False
        self._number = 0  # the last staging number
        self._batches = self._replays = self._rows = self._staged = 0
        self._to_arrow = self._deliver = self._stage = 0.0
        self._last_error: Exception | None = None
        runtime.runtime.metrics.add_source(f"bridge:{stream}:{id(self)}", self.metric_families)

    def metric_families(self) -> list[MetricFamily]:
        """The bridge's counters as metrics, labelled with its stream (the runtime collects
        them)."""
        labels = {"stream": self.stream}
        return [
            counter("barrierflow_bridge_batches", "Spark micro-batches made durable",
                    [(labels, self._batches)]),
            counter("barrierflow_bridge_replays_skipped", "Spark micro-batches skipped as "
                    "replays", [(labels, self._replays)]),
            counter("barrierflow_bridge_rows", "rows of the micro-batches made durable",
                    [(labels, self._rows)]),
            counter("barrierflow_bridge_staged_batches", "micro-batches staged on the "
                    "executors", [(labels, self._staged)]),
            counter("barrierflow_bridge_to_arrow_seconds", "seconds in Spark's toArrow",
                    [(labels, self._to_arrow)]),
            counter("barrierflow_bridge_stage_seconds", "seconds staging micro-batches on the "
                    "executors", [(labels, self._stage)]),
            counter("barrierflow_bridge_deliver_seconds", "seconds delivering micro-batches "
                    "(channel waits and checkpoints)", [(labels, self._deliver)]),
            counter("barrierflow_bridge_executor_tasks", "Spark tasks that ran the chain",
                    [(labels, self._counters.tasks)]),
            counter("barrierflow_bridge_task_seconds", "seconds of the Spark tasks that ran "
                    "the chain", [(labels, self._counters.seconds)]),
            *self._counters.families(),
        ]  # fmt: skip

    @property
    def last_error(self) -> Exception | None:
        """The exception :meth:`callback` raised last, or ``None`` if it never raised.

        Spark reports a failed ``foreachBatch`` callback as a ``StreamingQueryException``
        whose message is the Py4J proxy's ("An exception was raised by the Python Proxy...")
        with the real error buried in a Python traceback; this is that real error (a
        :class:`~barrierflow.errors.BatchOrderError`, a ``SchemaMismatchError``, ...), for a
        driver to report. It stays set after later batches succeed.
        """
        return self._last_error

    def unwrap(self, exc: BaseException, *, query: Any = None) -> BaseException:
        """The error behind ``exc`` — what a driver caught around ``awaitTermination``, or
        what ``query.exception()`` returned: the error this bridge's callback raised (the same
        object: :attr:`last_error`) if Spark's text names its type, else a
        :class:`~barrierflow.errors.SparkQueryFailedError` with Spark's own cause in one line
        (its ``__cause__`` is ``exc``, and it names ``query``'s name or id if given); ``exc``
        itself if it is not a Spark or Py4J error.
        """
        kept = () if self._last_error is None else (self._last_error,)
        name = None if query is None else (query.name or str(query.id))
        return unwrap_spark_error(exc, kept, query=name)

    def await_termination(self, query: Any, timeout: float | None = None) -> bool:
        """``query.awaitTermination(timeout)``, with a failed query raising its cause.

        Returns:
            Whether the query has terminated (always ``True`` without a timeout).

        Raises:
            SchemaMismatchError, BatchOrderError, ActorFailedError, ...: what the bridge's
                callback raised, the same object (see :meth:`unwrap`).
            SparkQueryFailedError: the query failed otherwise; Spark's cause in one line.
        """
        try:
            done = query.awaitTermination() if timeout is None else query.awaitTermination(timeout)
        except Exception as exc:
            cause = self.unwrap(exc, query=query)
            if cause is exc:
                raise
        else:
            return done is None or bool(done)
        # Raised outside the except block: the Spark wall is not chained on as the context.
        raise cause

    def stats(self) -> BridgeStats:
        """A snapshot of the bridge's counters."""
        return BridgeStats(
            batches=self._batches,
            replays_skipped=self._replays,
            rows=self._rows,
            to_arrow_seconds=self._to_arrow,
            deliver_seconds=self._deliver,
            staged_batches=self._staged,
            stage_seconds=self._stage,
            executor_tasks=self._counters.tasks,
            task_seconds=self._counters.seconds,
            state_seconds=self._counters.state_seconds,
            state_rows_read=self._counters.state_rows_read,
        )

    def _check_running(self) -> None:
        if not self.runtime.running:
            raise NotRunningError(
                "the runtime behind this Spark bridge",
                "enter `with BlockingRuntime(rt):` before starting the query, and stop the "
                "query before leaving it",
            )

    def _executor_writes(self) -> ExecutorWrites:
        """How Spark tasks write the bridge's sink's table (made once)."""
        if self._writes is None:
            if self.sink is None:
                raise InvalidArgumentError(
                    "sink",
                    "the sink to write on the executors: SparkBridge(handle, feed, "
                    "sink=add_sink(...))",
                    None,
                )
            self._writes = executor_writes(self.sink.table)
        return self._writes

    async def _plan(self, stream: str) -> TaskChain:
        """The chain every task runs (in the runtime's thread: the graph is read there).

        Raises:
            ExecutorPlacementError: an actor between the feed and the sink cannot run in
                Spark's tasks.
        """
        key = await self.feed.position_key(stream, self.runtime.runtime)
        return self._chain(key[: -len(stream) - 1])

    def _chain(self, source: str) -> TaskChain:
        """The chain from the feed's source actor ``source`` to the sink (in the runtime's
        thread), with where its keyed step keeps its state; its tasks read the state as of
        the last epoch committed now.

        Raises:
            ExecutorPlacementError: an actor of the path cannot run in Spark's tasks, or a
                keyed step feeds a table whose commits cannot carry state.
        """
        assert self.sink is not None  # checked by _executor_writes
        nodes = self.runtime.runtime.nodes()
        steps = plan_chain(nodes, source, self.sink.name, self.sink.writers, self.feed.schema.names)
        writes = self._executor_writes()
        keyed = next((step for step in steps if step.key is not None), None)
        state = None
        if keyed is not None:
            assert keyed.key is not None
            if not commits_state(self.sink.coordinator.committer):
                raise ExecutorPlacementError(
                    keyed.name,
                    f"it is keyed, and its state commits with the table's files, which sink "
                    f"{self.sink.name!r}'s table ({type(self.sink.table).__name__}) does not "
                    "carry; write to Parquet, Iceberg or Delta, or run the pipeline with "
                    "run_on='driver'",
                )
            root = self._state_directory(keyed.name)
            stores = state_stores(root).values()
            as_of = max((store.last_committed() for store in stores), default=0)
            state = KeyedStep(keyed.name, keyed.key, str(root), as_of, 0)
        return TaskChain(
            steps, writes, self.feed.schema, self.runtime.backend, self.sink.name, state
        )

    def _state_directory(self, step: str) -> Path:
        """Where keyed step ``step`` keeps its state when it runs on the executors."""
        root = self._state_root or Path(self._executor_writes().root, STATE_DIRECTORY)
        return Path(root, step)

    def shared_view(self, step: str) -> SharedView:
        """The view of keyed step ``step`` (an ``aggregate`` or ``reduce`` between the feed
        and the sink) when it runs on the executors: what a job joining it from the driver
        reads, declared with ``bridge.shared_view(step).backfill()``.

        Raises:
            InvalidArgumentError: ``step`` is not a non-empty str, or the bridge has no sink.
        """
        if not isinstance(step, str) or not step:
            raise InvalidArgumentError("step", "the keyed step's actor name", step)
        return SharedView(self._state_directory(step), step)

    def _probe_chain(self, spark: Any, stream: str) -> TaskChain:
        """Plan the chain and, the first time, build it once on an executor (see
        :func:`~barrierflow.spark_bridge.executors.probe_chain`)."""
        self._executor_writes()
        chain = self.runtime.call(self._plan, stream)
        if not self._probed:
            probe_chain(spark, chain)
            self._probed = True
        return chain

    def deliver(
        self,
        df: Any,
        batch_id: int,
        *,
        stream: str | None = None,
        run_on: str = "driver",
        write_on: str | None = None,
    ) -> int | None:
        """Deliver ``df`` as batch ``batch_id`` of ``stream`` (default: the bridge's); returns
        the durable epoch, or ``None`` for a replay that was already durable.

        ``run_on="executors"`` runs the chain between the feed and the bridge's sink in
        Spark's tasks and stages its output there, instead of collecting the rows here (see
        the module docstring); ``write_on`` is the argument's old name.

        Raises:
            NotRunningError: the runtime is not running.
            SchemaMismatchError: ``df``'s schema is not the feed's (nothing delivered).
            SparkCheckpointBehindError: ``batch_id`` is below the last durable one: Spark's
                checkpoint was lost or reset (nothing delivered; a BatchOrderError).
            BatchOrderError: ``batch_id`` goes backwards otherwise, or skips (nothing
                delivered).
            ExecutorImportError: an executor cannot import barrierflow, its dependencies or
                the user's module a step of the chain comes from.
            ExecutorPlacementError: an actor between the feed and the sink cannot run in
                Spark's tasks (names it and why).
            ExecutorChainFailedError: a task of the chain failed in every attempt.
            InvalidArgumentError: ``run_on`` is not ``"driver"`` or ``"executors"``, or
                ``"executors"`` for a bridge without a sink whose table stages Parquet files.
        """
        try:
            return self._deliver_batch(df, batch_id, stream, _check_run_on(run_on, write_on))
        except BatchOrderError as exc:
            last = exc.last
            if type(exc) is not BatchOrderError or last is None or exc.batch_id >= last:
                raise
            # Spark replays only the batch it did not commit (the last durable one at most):
            # an id below that is Spark's checkpoint gone back, which the user must be told.
            raise SparkCheckpointBehindError(
                exc.stream, last, exc.batch_id, exc.expected_id
            ) from None

    def _deliver_batch(self, df: Any, batch_id: int, stream: str | None, run_on: str) -> int | None:
        self._check_running()
        stream = self.stream if stream is None else stream
        if run_on == "executors":
            self._executor_writes()
            _check_frame(df, self.feed.schema, f"micro-batch {batch_id} of {stream!r}")
            return self._deliver_on_executors(df, stream, batch_id)
        # The schema is checked once, here at the boundary, from Spark's own schema (no job).
        _check_frame(df, self.feed.schema, f"micro-batch {batch_id} of {stream!r}")
        started = time.perf_counter()
        table = df.toArrow()
        self._to_arrow += time.perf_counter() - started
        # One crossing into the runtime per micro-batch: the feed checks the batch id (a
        # replay is skipped there, after one toArrow it did not need) and delivers.
        return self._deliver_table(stream, batch_id, table)

    def callback(self, df: Any, batch_id: int) -> None:
        """The ``foreachBatch`` callback: ``df.writeStream.foreachBatch(bridge.callback)``.

        Raises:
            NotRunningError, SchemaMismatchError, BatchOrderError: as :meth:`deliver` (or
                whatever the graph raised); the exception is also kept as :attr:`last_error`.
        """
        self._callback(df, batch_id, "driver")

    def executors_callback(self, df: Any, batch_id: int) -> None:
        """The ``foreachBatch`` callback that runs on the executors (see :meth:`callback`
        and the module docstring)."""
        self._callback(df, batch_id, "executors")

    def _callback(self, df: Any, batch_id: int, run_on: str) -> None:
        try:
            self.deliver(df, batch_id, run_on=run_on)
        except Exception as exc:
            self._last_error = exc
            raise

    async def _probe(self, stream: str, batch_id: int) -> tuple[str, TaskChain, bool]:
        """The stream's position key, the chain the tasks run, and whether ``batch_id`` is
        new (in the runtime's thread: the feed's ids are the running source's). Also checks
        that the feed's source reaches every writer of the sink: a committable that cannot
        reach its sink would let the batch id become durable without its files.

        Raises:
            InvalidArgumentError: the sink is not downstream of the feed's source.
            ExecutorPlacementError: an actor of the path cannot run in Spark's tasks.
        """
        rt = self.runtime.runtime
        key = await self.feed.position_key(stream, rt)
        assert self.sink is not None  # checked by _executor_writes
        source = key[: -len(stream) - 1]
        cut_off = [w for w in self.sink.writers if not rt.reaches(source, w)]
        if cut_off:
            raise InvalidArgumentError(
                "sink",
                f"a sink whose writers read the feed's source {source!r} (the files staged on "
                "the executors reach it through the feed)",
                f"sink {self.sink.name!r} with writers {cut_off} not downstream of it",
            )
        chain = self._chain(source)
        if chain.keyed is not None:
            # Keyed state is read as of the last commit: every durable epoch's commit (its
            # state with its rows) must have run first, those a restart recovered included.
            await self.sink.coordinator.wait_commits_through(rt.committed_epoch)
            chain = self._chain(source)
        return key, chain, self.feed.check_batch(stream, batch_id)

    def _deliver_on_executors(self, df: Any, stream: str, batch_id: int) -> int | None:
        """Run the chain and stage its output on the executors, then deliver the batch's
        files as a committable with its end mark through the feed: two crossings into the
        runtime (the batch-id check before any Spark work, the delivery). The whole is
        retried after a graph failure (see the module docstring).

        A keyed chain's state is compacted meanwhile, in a Spark job of its own beside the
        batch's (:func:`~barrierflow.spark_bridge.executors.compact_on_executors`): the
        driver spends no time rewriting the state, and the compaction is over when this
        returns, so none outlives the last micro-batch, or the SparkSession. A failed
        compaction is logged; the next micro-batch's tries again."""
        compactions: list[Future[list[str]]] = []
        try:
            return self._run_on_executors(df, stream, batch_id, compactions)
        finally:
            for compaction in compactions:
                _wait_for_compaction(compaction)

    def _run_on_executors(
        self, df: Any, stream: str, batch_id: int, compactions: list[Future[list[str]]]
    ) -> int | None:
        """:meth:`_deliver_on_executors`'s work; a compaction it starts joins
        ``compactions``."""
        assert self.sink is not None  # checked by _executor_writes
        sink = self.sink.coordinator.sink
        rt = self.runtime.runtime
        end_mark = self.feed.schema.empty_table()
        failures = 0
        while True:
            key, chain, new = self.runtime.call(self._probe, stream, batch_id)
            if not new:
                # A replay: the feed confirms it (a checkpoint, if an abandoned call sent it).
                self.runtime.call(
                    partial(self.feed.deliver, rt, stream, batch_id, end_mark, retries=0)
                )
                self._replays += 1
                return None
            if not self._probed:
                probe_chain(df.sparkSession, chain)
                self._probed = True
            if chain.keyed is not None and not compactions:
                if self._compactor is None:
                    self._compactor = ThreadPoolExecutor(1, thread_name_prefix="bf-compaction")
                spark, root = df.sparkSession, chain.keyed.root
                compactions.append(self._compactor.submit(compact_on_executors, spark, root))
            self._number = staging_number(self._number)
            started = time.perf_counter()
            writes = chain.writes
            try:
                partitions, manifests, reports = stage_on_executors(
                    df, chain, self._number, self.sink.parallelism
                )
                adopted = writes.adopt(self._number, manifests)
                self._counters.add(reports)
                check = writes if isinstance(writes, ChecksStaged) else None
                batch = StagedBatch(key, batch_id, partitions, tuple(adopted), writes.root, check)
                self._stage += time.perf_counter() - started
                self._staged += 1
                started = time.perf_counter()
                epoch = self.runtime.call(
                    partial(
                        self.feed.deliver, rt, stream, batch_id, end_mark, retries=0,
                        committables=(Committable(sink, batch),),
                    )
                )  # fmt: skip
                self._deliver += time.perf_counter() - started
            except _STAGE_AGAIN:
                failures += 1
                if failures > self.feed.retries:
                    raise
                continue
            if epoch is None:
                self._replays += 1
            else:
                self._batches += 1
                self._rows += sum(report.rows for report in reports)  # read, not written
            return epoch

    def _deliver_table(self, stream: str, batch_id: int, table: pa.Table) -> int | None:
        started = time.perf_counter()
        epoch = self.runtime.call(self.feed.deliver, self.runtime.runtime, stream, batch_id, table)
        self._deliver += time.perf_counter() - started
        if epoch is None:
            self._replays += 1
        else:
            self._batches += 1
            self._rows += table.num_rows
        return epoch

    def start(
        self,
        df: Any,
        checkpoint_location: str,
        *,
        trigger: str | None = None,
        available_now: bool = False,
        query_name: str | None = None,
        run_on: str = "driver",
        write_on: str | None = None,
    ) -> Any:
        """Start ``df`` (a streaming DataFrame) into the bridge; returns the StreamingQuery.

        Args:
            checkpoint_location: Spark's own checkpoint (offsets and commits); keep it with the
                runtime's state: together they make the query exactly once across restarts.
            trigger: a processing-time interval such as ``"1 second"`` (default: Spark's).
            available_now: process what is available now, in micro-batches, then stop.
            query_name: the query's name in Spark.
            run_on: ``"driver"`` (the default: rows go through the graph) or
                ``"executors"`` (Spark tasks run the chain to the bridge's sink and stage its
                output; see the module docstring). ``write_on`` is its old name.

        Raises:
            InvalidArgumentError: a bad argument, or ``"executors"`` without a sink whose
                table stages Parquet files.
            SchemaMismatchError: ``df``'s schema is not the feed's.
            ExecutorPlacementError: ``"executors"``, and an actor between the feed and the
                sink cannot run in Spark's tasks (names it and why).
            ExecutorImportError: ``"executors"``, and the executors cannot import a module
                the chain needs (the chain is built once on an executor first).
        """
        self._check_running()
        if not isinstance(checkpoint_location, str) or not checkpoint_location:
            raise InvalidArgumentError(
                "checkpoint_location", "a non-empty directory path", checkpoint_location
            )
        on_executors = _check_run_on(run_on, write_on) == "executors"
        _check_frame(df, self.feed.schema, "the streaming DataFrame", streaming=True)
        if on_executors:
            # Refused now, before the query starts: what cannot run in Spark's tasks.
            self._probe_chain(df.sparkSession, self.stream)
        callback = self.executors_callback if on_executors else self.callback
        writer = df.writeStream.foreachBatch(callback).option(
            "checkpointLocation", checkpoint_location
        )
        if query_name is not None:
            writer = writer.queryName(query_name)
        if available_now:
            writer = writer.trigger(availableNow=True)
        elif trigger is not None:
            writer = writer.trigger(processingTime=trigger)
        return writer.start()

    def pump(
        self,
        df: Any,
        *,
        stream: str = "pump",
        slice_rows: int | None = None,
        progress: bool = False,
    ) -> int:
        """Deliver a static DataFrame: one batch, or slices of ``slice_rows`` rows, each its
        own durable batch of ``stream``; returns the rows delivered now.

        A pump that crashed resumes with the slice after the last durable one when called
        again with the same ``stream`` — exact only if ``df`` yields its rows in the same order
        every time (sort it, or read files that do not change).

        Raises:
            NotRunningError, SchemaMismatchError: as :meth:`deliver`.
        """
        self._check_running()
        if slice_rows is not None and (type(slice_rows) is not int or slice_rows < 1):
            raise InvalidArgumentError("slice_rows", "None or an int >= 1", slice_rows)
        what = f"the DataFrame pumped as {stream!r}"
        _check_frame(df, self.feed.schema, what, streaming=False)
        started = time.perf_counter()
        table = conform_schema(df.toArrow(), self.feed.schema, what)
        self._to_arrow += time.perf_counter() - started
        size = slice_rows or max(table.num_rows, 1)
        slices = [table.slice(offset, size) for offset in range(0, max(table.num_rows, 1), size)]
        last = self.runtime.call(self.feed.last_batch, stream, self.runtime.runtime)
        first = self.feed.first_batch_id
        todo = [(first + i, s) for i, s in enumerate(slices) if last is None or first + i > last]
        delivered = 0
        with _Progress(progress, f"pump {stream}", table.num_rows) as advance:
            advance(table.num_rows - sum(s.num_rows for _, s in todo))
            for batch_id, piece in todo:
                self._deliver_table(stream, batch_id, piece)
                delivered += piece.num_rows
                advance(piece.num_rows)
        return delivered


#: What makes the bridge stage a micro-batch again: the graph failed (and recovered: its
#: epoch and the committable are gone; its recovery may have deleted the files too).
_STAGE_AGAIN = (ActorFailedError, ActorGoneError, CoordinatorAbortedError, ExecutorStagingError)


def _wait_for_compaction(compaction: Future[list[str]]) -> None:
    """Wait until ``compaction`` is over; a failure is logged (the next micro-batch tries
    again: the state stays readable as it was)."""
    try:
        compaction.result()
    except Exception as exc:
        _log.warning(
            "keyed state compaction failed; the next micro-batch tries again",
            cause=" ".join(f"{type(exc).__name__}: {exc}".split())[:300],
        )


def _check_run_on(run_on: object, write_on: object = None) -> str:
    """Where the pipeline runs: ``run_on``, or ``write_on`` (its old name) if given."""
    argument, where = ("run_on", run_on) if write_on is None else ("write_on", write_on)
    if where not in ("driver", "executors"):
        raise InvalidArgumentError(argument, "'driver' or 'executors'", where)
    return str(where)


class _Progress:
    """A rich progress bar over rows, or nothing."""

    def __init__(self, enabled: bool, title: str, total: int) -> None:
        self._bar: Any = None
        if enabled:
            from rich.progress import Progress

            self._bar = Progress(transient=False)
            self._task = self._bar.add_task(title, total=total)

    def __enter__(self) -> Any:
        if self._bar is None:
            return lambda rows: None
        self._bar.start()
        return lambda rows: self._bar.advance(self._task, rows)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
