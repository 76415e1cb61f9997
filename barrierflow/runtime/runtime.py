"""The runtime: runs a graph of actors in one task group, with barriers, state and recovery.

Usage::

    rt = Runtime(RuntimeConfig(state_path="state.db"))
    rt.add_source("events")                       # a PushSource fed by rt.push()
    rt.add_actor("enrich", Enrich(), inputs=["events"])
    async with rt:
        await rt.push("events", chunk)
        epoch = await rt.checkpoint()             # returns once durable

Supervision is structured concurrency: every actor of the graph runs in one task group. An
actor that raises stops the graph and ``async with`` raises
:class:`~barrierflow.errors.ActorFailedError` naming it, with the actor's exception as
``__cause__``. With ``recovery=True`` the graph is rebuilt instead, from the last committed
checkpoint (uncommitted state is discarded, actors are re-created by their factories and
restore their tables), after ``restart_backoff`` seconds doubling per restart, at most
``max_restarts`` times. Rows pushed after the last checkpoint are not replayed by the runtime:
a pushing driver learns it from the ``ActorFailedError`` its pending ``checkpoint()`` raises,
and pushes them again (the Spark bridge does exactly that).

Leaving ``async with`` normally stops the graph cleanly: a final checkpoint barrier carrying
``Stop`` for every actor, then the store is closed.

The runtime is composed of four parts, each owning its state, wired together here and given
what it needs from the others through its constructor: :class:`~._declare.Declarations` (the
graph and the job records), :class:`~._live.LiveGraph` (the running graph as callers reach it),
:class:`~._jobs.RunningJobs` (jobs joining and leaving at barriers) and
:class:`~._lifecycle.Lifecycle` (the store, supervision and recovery, stopping). ``Runtime`` is
the facade: every public method checks its arguments where the contract says so, and delegates.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Self, final

import pyarrow as pa

from barrierflow.channels.channel import ChannelStatistics
from barrierflow.channels.chunk import Chunk
from barrierflow.channels.epoch import EpochPair
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.channels.mutation import MUTATION_TYPES, Mutation
from barrierflow.runtime._awaited import UnawaitedCalls, must_await
from barrierflow.runtime._declare import Declarations
from barrierflow.runtime._jobs import RunningJobs, trim_dropped_actor
from barrierflow.runtime._lifecycle import Lifecycle
from barrierflow.runtime._live import LiveGraph
from barrierflow.runtime._runtime_metrics import runtime_families
from barrierflow.runtime.actor import ActorStats, StreamActor
from barrierflow.runtime.config import RuntimeConfig, check_seconds
from barrierflow.runtime.errors import NotAwaitedError, NotRunningError
from barrierflow.runtime.graph import Fanout, Graph, Node
from barrierflow.runtime.job import Job, JobHandle, JobStats, PushSource
from barrierflow.runtime.metrics import MetricFamily, MetricsRegistry, refresh_parts
from barrierflow.runtime.service import Service
from barrierflow.runtime.state.state_store import CommittedEpochs, StateStore

__all__ = ["PushSource", "Runtime", "RuntimeStats"]


@final
@dataclass(frozen=True, slots=True)
class RuntimeStats:
    """A snapshot of a runtime's counters."""

    #: Actor name → its counters.
    actors: dict[str, ActorStats]
    #: Channel name → its counters (``"a->b"`` for edges, ``"a inbox"`` for sources).
    channels: dict[str, ChannelStatistics]
    #: ``curr`` of the last injected barrier.
    current_epoch: int
    #: The last durable checkpoint epoch.
    committed_epoch: int
    #: Barriers injected but not yet completed.
    barriers_in_flight: int
    #: Graph restarts so far (recovery).
    restarts: int
    #: Job name → its counters.
    jobs: dict[str, JobStats]
    #: Every metric of the runtime's registry as it was collected with these counters: the
    #: above and what the sinks' coordinators and writers, the sources, the feeds and the
    #: Spark bridge report (see :mod:`barrierflow.runtime.metrics`; ``family.value(...)``).
    metrics: tuple[MetricFamily, ...] = ()

    def metric(self, name: str, **labels: str) -> float | None:
        """The value of metric ``name`` with exactly ``labels`` (``None``: none such)."""
        for family in self.metrics:
            if family.name == name:
                return family.value(**labels)
        return None


@final
class Runtime:
    """Runs a graph of stream actors, made of jobs (see the module docstring).

    Args:
        config: how to run.
        clock: wall-clock seconds for epochs; a test may pass a fake.

    Raises:
        InvalidArgumentError: ``config`` is not a :class:`RuntimeConfig`, or ``clock`` is
            neither ``None`` nor callable. (What the clock returns is checked where it is
            read: a reading that is not a finite number is an error naming ``clock``.)
    """

    def __init__(self, config: RuntimeConfig, *, clock: Callable[[], float] | None = None) -> None:
        if not isinstance(config, RuntimeConfig):
            raise InvalidArgumentError("config", "a RuntimeConfig", config)
        if clock is not None and not callable(clock):
            raise InvalidArgumentError("clock", "None or a callable returning seconds", clock)
        # The parts, each given the others it needs (see the module docstring).
        self._declarations = Declarations()
        self._live = LiveGraph(self._declarations)
        self._jobs = RunningJobs(
            config,
            self._declarations,
            running=self._live.running,
            as_failure=self._live.as_failure,
            trim=lambda ctx, epoch: Runtime._trim(ctx, epoch),
        )
        #: The runtime's one metrics home (see :mod:`barrierflow.runtime.metrics`).
        self.metrics = MetricsRegistry()
        self.metrics.add_source("runtime", self._metric_families, self._refresh_metrics)
        self._lifecycle = Lifecycle(
            config, clock, self._declarations, self._jobs, self._live, self.metrics
        )
        self._unawaited = UnawaitedCalls()

    # For tests and tools that look inside a runtime.

    #: How the state of a dropped job's actor is trimmed, looked up on each drop (a test
    #: replaces it on the class to delay the trim).
    _trim = staticmethod(trim_dropped_actor)

    @property
    def _graph(self) -> Graph:
        return self._declarations.graph

    @property
    def _store(self) -> StateStore | None:
        return self._lifecycle.store

    def nodes(self) -> dict[str, Node]:
        """The declared graph's actors by name, in declaration order (a new dict; the nodes
        are the graph's own, to read, not change): what the Spark bridge reads to place a
        chain on the executors."""
        return self._graph.nodes

    def reaches(self, upstream: str, downstream: str) -> bool:
        """Whether what actor ``upstream`` emits reaches actor ``downstream`` along the
        declared graph's edges (what the Spark bridge checks before it sends a sink's
        committables through its feed's source)."""
        return self._graph.reaches(upstream, downstream)

    # Entering and leaving.

    async def __aenter__(self) -> Self:
        await self._lifecycle.enter()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._lifecycle.exit(exc_type, exc, tb)
        if exc is None and self._unawaited.calls:
            raise NotAwaitedError(self._unawaited.calls)

    @property
    def unawaited_calls(self) -> UnawaitedCalls:
        """This runtime's calls made without ``await`` (see :mod:`barrierflow.runtime._awaited`)."""
        return self._unawaited

    # Declaring the graph, before start.

    def add_source(
        self,
        name: str,
        actor: Callable[[], StreamActor] | None = None,
        *,
        fanout: Fanout | None = None,
        schema: pa.Schema | None = None,
    ) -> Node:
        """Declare a source of the default job (a :class:`PushSource` unless a factory is
        given). All or nothing, like :meth:`add_actor`.

        ``schema``, if given, is what the source emits (a push source refuses chunks of
        another schema): the actors declared to read it are checked against it at once — hash
        key columns, a sink's schema — instead of failing on the first rows (see
        :mod:`barrierflow.runtime.startup`).

        Raises:
            GraphError: as for :meth:`add_actor`; ``schema`` is not a ``pyarrow.Schema``; or
                the runtime has started.
        """
        return self._declarations.add_source(name, actor, fanout=fanout, schema=schema)

    def add_actor(
        self,
        name: str,
        actor: Callable[..., StreamActor],
        *,
        inputs: Sequence[str] | Mapping[str, str],
        fanout: Fanout | None = None,
        parallelism: int | None = None,
        key: Sequence[str] | None = None,
    ) -> Node:
        """Declare an actor of the default job reading ``inputs`` (aligned-merged if more than
        one, unless the actor reads them independently); see :meth:`Job.add_actor`.

        All or nothing: everything is checked before the graph changes, so a refused
        declaration leaves no half-declared actor behind and its name stays free. ``inputs``
        is a list or tuple of declared names (or a mapping of input name to upstream); a str
        is refused (it is a sequence of letters).

        Returns:
            The node of the actor (the first one of a parallel group).

        Raises:
            GraphError: the name is empty, taken (by an actor or a service) or not a str; the
                actor is not a factory (an instance is refused: it would be reused across
                restarts); ``inputs`` is not a list, tuple or mapping of declared names, or
                names one twice; ``fanout`` is not a Fanout; a bad ``parallelism`` or ``key``;
                or the runtime has started.
            KeyColumnError: ``key`` (or the hash fan-out of an input) names a column that an
                input declared with a schema does not have, or cannot hash.
        """
        return self._declarations.add_actor(
            name, actor, inputs=inputs, fanout=fanout, parallelism=parallelism, key=key
        )

    def declared_schema(self, name: str) -> pa.Schema | None:
        """The schema source ``name`` was declared to emit (``None``: not declared, or not a
        declared source)."""
        return self._declarations.declared_schema(name)

    def name_in_use(self, name: str) -> bool:
        """Whether ``name`` is taken by an actor or a service of a declared job."""
        return self._declarations.name_in_use(name)

    def add_service(self, name: str, service: Service) -> None:
        """Run ``service`` alongside the graph, in every incarnation (see :mod:`.service`).

        Raises:
            GraphError: ``service`` has no ``run(ctx)``, or ``name`` is taken.
        """
        self._declarations.add_service(name, service)

    def connect(self, upstream: str, downstream: str) -> None:
        """Add an edge between two declared actors.

        Raises:
            GraphError: an unknown actor, an edge into a source, an edge declared twice, an
                edge closing a cycle, or the runtime has started.
        """
        self._declarations.connect(upstream, downstream)

    def declare_job(self, job: Job) -> None:
        """Declare a named job before start (a job added at runtime in an earlier run is
        declared again this way when the program restarts).

        Raises:
            GraphError: ``job`` is not a Job, or its declarations do not fit the graph.
            DuplicateJobError: a job of that name is declared.
        """
        self._declarations.declare_job(job)

    def forget_job(self, name: str) -> None:
        """Before start: delete job ``name`` from the state store's catalog at the first
        checkpoint, instead of declaring it again (its actors' state is left behind unread).

        Raises:
            GraphError: ``name`` is not a non-empty str, or the runtime has started.
        """
        self._jobs.forget_job(name)

    # Jobs joining and leaving the running graph.

    def job(self, name: str) -> JobHandle:
        """The handle of job ``name`` (the default job is ``"main"``).

        Raises:
            UnknownJobError: no such job.
        """
        return self._jobs.job(name)

    def jobs(self) -> list[str]:
        """The names of the jobs that run (or are being dropped)."""
        return self._jobs.jobs()

    @must_await
    async def add_job(self, job: Job) -> JobHandle:
        """Join ``job`` to the running graph at one barrier; return once it was collected.

        The job's channels and actors are built first; then a barrier carrying ``Add`` is
        injected: each running actor the job reads gains its new output exactly at that
        barrier, which is the new actors' first. The job enters the catalog under that
        barrier's epoch and is durable with the next checkpoint.

        Raises:
            GraphError: ``job`` is not a Job, or an actor reads an unknown actor.
            DuplicateJobError: a job of that name exists.
            JobDroppingError: an actor reads an actor of a job being dropped.
            ActorFailedError: a factory of the job raised (nothing was added).
            NotRunningError: the runtime is not running.
        """
        return await self._jobs.add_job(job)

    @must_await
    async def drop_job(self, name: str) -> int:
        """Stop job ``name``'s actors at one checkpoint barrier (upstreams drop their outputs
        to it at the same barrier); once that checkpoint is durable and every actor of the job
        left (a sink's writers after their last commit), its services stop; its state is
        trimmed in the checkpoint that follows. Returns the epoch of that barrier.

        Raises:
            UnknownJobError: no such job.
            JobError: another running job reads an actor of this one (drop that one first).
            NotRunningError: the runtime is not running.
        """
        return await self._jobs.drop_job(name)

    # Driving a running graph.

    @must_await
    async def wait_running(self) -> None:
        """Return once the graph runs (at once, or after recovery rebuilt it).

        Raises:
            ActorFailedError: the graph failed for good (no recovery, or no restarts left).
            NotRunningError: the runtime is not running.
        """
        await self._live.running()

    @must_await
    async def push(self, source: str, chunk: Chunk) -> None:
        """Send ``chunk`` into the inbox of push source ``source`` (waits while it is full).

        Raises:
            InvalidArgumentError: ``source`` is not a source, or ``chunk`` not a Chunk.
            ActorFailedError: the graph failed while the chunk waited for room (with recovery,
                the graph is rebuilt from the last checkpoint; push again what followed it).
            NotRunningError: the runtime is not running.
        """
        if not isinstance(source, str):
            raise InvalidArgumentError("source", "a source's name (a str)", source)
        if not isinstance(chunk, Chunk):
            raise InvalidArgumentError("chunk", "a Chunk", type(chunk).__name__)
        await self._live.push(source, chunk)

    @must_await
    async def checkpoint(self, timeout: float | None = None) -> int:  # noqa: ASYNC109
        # (A timeout of its own, not ``fail_after``: on expiry the caller gets the error that
        # names who holds the barrier, and the injection is never cancelled half way.)
        """Inject a checkpoint barrier now and return the epoch it made durable.

        Args:
            timeout: seconds to wait at most (``None``: as long as it takes). The checkpoint is
                not withdrawn when the wait gives up: it completes, or fails, with the graph.

        Raises:
            ActorFailedError: the graph failed before the checkpoint completed.
            BarrierStuckError: ``timeout`` passed first; it names the actors that hold the
                barrier.
            ConfigError: ``timeout`` is not ``None`` or a finite number of seconds > 0.
        """
        if timeout is not None:
            check_seconds("timeout", timeout)
        return await self._live.checkpoint(timeout)

    @must_await
    async def mutate(self, mutation: Mutation) -> EpochPair:
        """Inject a barrier carrying ``mutation`` now; returns its epoch once collected.

        Raises:
            InvalidArgumentError: ``mutation`` is not a mutation (checked before anything is
                injected), or names an actor id that is not in the graph.
        """
        if not isinstance(mutation, MUTATION_TYPES):
            raise InvalidArgumentError(
                "mutation", "a Mutation (Add, Pause, Resume, ...)", type(mutation).__name__
            )
        return await self._live.mutate(mutation)

    def actor_id(self, name: str) -> int:
        """The id of the actor named ``name``.

        Raises:
            InvalidArgumentError: no actor is named ``name``.
        """
        return self._declarations.actor_id(name)

    # Reading it.

    @property
    def committed_epoch(self) -> int:
        """The last durable checkpoint epoch."""
        store = self._lifecycle.store
        return 0 if store is None else store.committed_epoch

    def committed_epochs(self) -> CommittedEpochs:
        """The committed epoch now, then each newer one (see ``StateStore.committed_epochs``)."""
        store = self._lifecycle.store
        if store is None:
            raise NotRunningError("the runtime", "use it inside `async with rt:`")
        return store.committed_epochs()

    def stats(self) -> RuntimeStats:
        """Per-actor, per-channel and per-job counters, epochs and restarts, and every metric
        of :attr:`metrics` collected with them (the sinks', sources', feeds' among them; a
        source's lag as of the last :meth:`~.metrics.MetricsRegistry.snapshot`)."""
        counters = self._counters()
        return replace(counters, metrics=tuple(self.metrics.collect()))

    def _counters(self, now: float | None = None) -> RuntimeStats:
        """The runtime's own counters (what its metrics are made of); the channels' waits
        going on count up to ``now`` (a ``time.perf_counter()`` reading; default: the
        current one)."""
        restarts = self._lifecycle.restarts
        incarnation = self._live.incarnation
        if incarnation is None:
            return RuntimeStats({}, {}, 0, self.committed_epoch, 0, restarts, {})
        actors = {name: ctx.stats() for name, ctx in incarnation.contexts.items()}
        jobs: dict[str, JobStats] = {}
        for name, record in self._declarations.records.items():
            members = tuple(n for n in record.job.actor_names() if n in actors)
            jobs[name] = JobStats(
                job=name,
                actors=members,
                created_epoch=record.created_epoch,
                rows_in=sum(actors[n].rows_in for n in members),
                rows_out=sum(actors[n].rows_out for n in members),
                ready=record.snapshot().ready,
            )
        return RuntimeStats(
            actors=actors,
            channels={tx.name: tx.statistics(now) for tx in incarnation.channels},
            current_epoch=incarnation.manager.current_epoch,
            committed_epoch=self.committed_epoch,
            barriers_in_flight=incarnation.manager.in_flight,
            restarts=restarts,
            jobs=jobs,
        )

    @property
    def metrics_url(self) -> str | None:
        """The URL of the Prometheus endpoint while the runtime runs with
        ``RuntimeConfig(metrics_port=...)`` (its port resolved when ``0`` was asked), else
        ``None``."""
        return self._lifecycle.metrics_url

    async def _refresh_metrics(self) -> None:
        """Refresh the actors and services whose metrics ask a server (a split log's lag)."""
        incarnation = self._live.incarnation
        if incarnation is not None:
            parts = {**incarnation.instances, **self._declarations.services()}
            await refresh_parts(parts)

    def _metric_families(self) -> list[MetricFamily]:
        """The runtime's own metrics and those of the actors and services that report some."""
        incarnation = self._live.incarnation
        # One reading for the uptime and the channels' waits: busy time is the one less the
        # others, and readings apart by a few microseconds would make it go back by as much.
        now = time.perf_counter()
        stats = self._counters(now)
        progress = {name: r.snapshot() for name, r in self._declarations.records.items()}
        if incarnation is None:
            return runtime_families(stats, progress, (), 0.0)
        parts = [*incarnation.instances.values(), *self._declarations.services().values()]
        uptime = now - incarnation.started_at
        alignment = {name: m.alignment_seconds for name, m in incarnation.merges.items()}
        merged = {
            n: tx.statistics(now).receive_wait_seconds for n, tx in incarnation.merged.items()
        }
        rows_written = incarnation.store.rows_written
        return runtime_families(
            stats,
            progress,
            parts,
            uptime,
            alignment,
            rows_written,
            merged_waits=merged,
            actor_times=incarnation.actor_times,
        )

    def __repr__(self) -> str:
        state = "running" if self._live.attached else "stopped"
        return f"<Runtime {state} actors={list(self._declarations.graph.nodes)}>"
