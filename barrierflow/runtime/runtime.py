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
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import final

import anyio
import structlog
from anyio.abc import TaskGroup, TaskStatus

from barrierflow.channels.barrier import BarrierKind
from barrierflow.channels.channel import ChannelStatistics
from barrierflow.channels.chunk import Chunk
from barrierflow.channels.epoch import EpochPair
from barrierflow.channels.errors import ChannelBrokenError, ChannelClosedError, InvalidArgumentError
from barrierflow.channels.mutation import (
    MUTATION_TYPES,
    Add,
    Mutation,
    SourceChangeSplit,
    Stop,
    Throttle,
    Update,
)
from barrierflow.runtime._incarnation import Incarnation, check_wiring, create_actors
from barrierflow.runtime._jobs import RunningJobs
from barrierflow.runtime._wiring import wire
from barrierflow.runtime.actor import ActorStats
from barrierflow.runtime.barrier_manager import BarrierManager
from barrierflow.runtime.config import RuntimeConfig
from barrierflow.runtime.errors import (
    ActorFailedError,
    JobNotDeclaredError,
    NotRunningError,
)
from barrierflow.runtime.job import JobStats, PushSource
from barrierflow.runtime.logging import configure_logging
from barrierflow.runtime.startup import adopt_sink_positions
from barrierflow.runtime.state.state_store import CommittedEpochs, StateStore

__all__ = ["PushSource", "Runtime", "RuntimeStats"]

#: Seconds ``async with rt:`` waits, on a clean exit, for the final ``Stop`` checkpoint to be
#: collected and committed. Past it the exit goes on (with a warning): nothing is lost, the
#: rows after the last committed checkpoint are replayed at the next start.
_STOP_TIMEOUT = 60.0
#: Worker threads a runtime lends its state store's blocking calls.
_IO_THREADS = 4


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


def _contains(group: BaseExceptionGroup[BaseException], exc: BaseException) -> bool:
    """Whether ``exc`` is one of the errors in ``group`` (at any depth)."""
    return any(
        leaf is exc or (isinstance(leaf, BaseExceptionGroup) and _contains(leaf, exc))
        for leaf in group.exceptions
    )


def _first_actor_failure(group: BaseExceptionGroup[BaseException]) -> ActorFailedError | None:
    """The first ActorFailedError in ``group`` (at any depth)."""
    for exc in group.exceptions:
        if isinstance(exc, ActorFailedError):
            return exc
        if isinstance(exc, BaseExceptionGroup):
            found = _first_actor_failure(exc)
            if found is not None:
                return found
    return None


@final
class Runtime(RunningJobs):
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
        super().__init__()
        self._config = config
        self._clock = clock
        self._store: StateStore | None = None
        self._task_group: TaskGroup | None = None
        self._incarnation: Incarnation | None = None
        self._restarts = 0
        self._failure: ActorFailedError | None = None
        self._last_failure: ActorFailedError | None = None
        self._rebuilt: anyio.Event | None = None
        self._jobs_lock = anyio.Lock()
        self._forget: set[str] = set()
        self._log = structlog.get_logger("barrierflow.runtime")

    # Lifecycle.

    async def __aenter__(self) -> Runtime:
        self._graph.validate()
        if self._config.log_format is not None:
            configure_logging(self._config.log_format)
        # The runtime's own worker threads for blocking calls (the store's file checks, and
        # every SQLite call on trio): a bounded pool of its own, so a stuck disk cannot take
        # the threads the driver's other work (or another runtime) relies on.
        self._store = await StateStore.open(
            self._config.state_path,
            adapter=self._config.store_adapter,
            limiter=anyio.CapacityLimiter(_IO_THREADS),
        )
        try:
            catalog = await self._store.read_all("__runtime__", "jobs")
            for job, entry in catalog.items():
                if job not in self._records and job not in self._forget:
                    raise JobNotDeclaredError(job, int(entry.get("created_epoch", 0)))
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._store.aclose()
            raise
        self._started = True
        self._rebuilt = anyio.Event()
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._task_group = task_group
        try:
            await task_group.start(self._supervise)
        except BaseException as exc:
            await self._shutdown(type(exc), exc, exc.__traceback__)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None and self._failure is None:
            with anyio.CancelScope(shield=True), anyio.move_on_after(_STOP_TIMEOUT) as stop:
                await self._stop_graph()
            if stop.cancelled_caught:
                self._log.warning(
                    "the final stop checkpoint did not complete in time; what followed the "
                    "last committed checkpoint is replayed at restart",
                    timeout_s=_STOP_TIMEOUT,
                    committed_epoch=self.committed_epoch,
                )
        await self._shutdown(exc_type, exc, tb)

    async def _shutdown(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task_group, self._task_group = self._task_group, None
        try:
            if task_group is not None:
                if exc is not None:
                    task_group.cancel_scope.cancel()
                try:
                    await task_group.__aexit__(exc_type, exc, tb)
                except BaseExceptionGroup as group:
                    if exc is not None and _contains(group, exc):
                        # The body's own error, not a group of it: what the actors raised while
                        # being torn down because of it is a consequence (and was logged).
                        raise exc from exc.__cause__
                    failure = _first_actor_failure(group)
                    if failure is not None:
                        raise failure from failure.cause
                    raise
        finally:
            if self._store is not None:
                with anyio.CancelScope(shield=True):
                    await self._store.aclose()
        if self._failure is not None and exc is None:
            raise self._failure from self._failure.cause

    async def _stop_graph(self) -> None:
        incarnation = self._incarnation
        if incarnation is None:
            return
        await incarnation.ready.wait()
        async with self._jobs_lock:
            stop = Stop(frozenset(n.actor_id for n in self._graph.nodes.values()))
            flight = await incarnation.manager.inject(BarrierKind.CHECKPOINT, stop)
        await flight.wait()

    async def _supervise(self, *, task_status: TaskStatus[None]) -> None:
        started = False
        while True:
            try:
                await self._run_incarnation(task_status if not started else None)
                return
            except ActorFailedError as failure:
                started = True
                self._last_failure = failure
                old, self._incarnation = self._incarnation, None
                self._rebuilt = anyio.Event()
                if old is not None:
                    old.manager.fail_in_flight(failure)
                    for tx in old.channels:
                        tx.close()  # pushes parked on the dead graph fail now
                if not self._config.recovery or self._restarts >= self._config.max_restarts:
                    self._log.error(
                        "actor failed; stopping",
                        actor=failure.actor,
                        error=repr(failure.cause),
                        restarts=self._restarts,
                    )
                    self._failure = failure
                    self._rebuilt.set()  # wake callers waiting for a rebuild: there is none
                    for record in self._records.values():
                        record.error = failure
                        record.ready.set()
                    raise
                self._restarts += 1
                delay = self._config.restart_backoff * 2 ** (self._restarts - 1)
                self._log.warning(
                    "actor failed; restarting from the last checkpoint",
                    actor=failure.actor,
                    error=repr(failure.cause),
                    restart=self._restarts,
                    backoff_s=delay,
                )
                assert self._store is not None
                self._store.release_tables()
                await self._store.abort_epoch_records_after_committed()
                await self._restore_jobs()
                await anyio.sleep(delay)
            started = True

    async def _run_incarnation(self, task_status: TaskStatus[None] | None) -> None:
        try:
            await self._run_graph(task_status)
        except BaseExceptionGroup as group:
            # Surface the actor failure itself (siblings were only cancelled by it).
            failure = _first_actor_failure(group)
            if failure is None:
                raise
            raise failure from failure.cause

    async def _run_graph(self, task_status: TaskStatus[None] | None) -> None:
        store = self._store
        assert store is not None
        nodes = list(self._graph.nodes.values())
        capacity, rows = self._config.channel_capacity, self._config.channel_rows
        instances = create_actors(nodes)
        wiring = wire(nodes, {}, capacity=capacity, rows=rows)
        check_wiring(instances, wiring, self._services())
        manager = BarrierManager(
            store,
            wiring.inboxes,
            {n.actor_id for n in nodes},
            barrier_interval=self._config.barrier_interval,
            checkpoint_frequency=self._config.checkpoint_frequency,
            max_in_flight=self._config.max_in_flight,
            clock=self._clock,
        )
        manager.on_complete = self._on_complete
        incarnation = Incarnation(store, manager)
        incarnation.channels = wiring.channels
        incarnation.inboxes = {n.name: wiring.inboxes[n.actor_id] for n in nodes if n.is_source}
        self._incarnation = incarnation
        adopted: dict[str, int] = {}
        if store.committed_epoch == 0:
            adopted = await adopt_sink_positions(
                instances, str(self._config.state_path), adopt=self._config.adopt_sink_positions
            )
        committed = await incarnation.catalog.committed()
        for record in self._records.values():
            record.set_backfilling(instances)
        # The initial barrier goes in before anyone may push, so every actor sees it first
        # and knows its epoch before its first chunk. The catalog gains the declared jobs it
        # lacks (and loses the forgotten ones) under its epoch.
        async with self._jobs_lock:
            flight = await manager.inject()
            new = {
                name: record.job.actor_names()
                for name, record in self._records.items()
                if name not in committed
            }
            gone = tuple(name for name in self._forget if name in committed)
            incarnation.catalog.record(flight.barrier.epoch.curr, created=new, dropped=gone)
            for name, record in self._records.items():
                entry = committed.get(name)
                record.created_epoch = (
                    int(entry["created_epoch"]) if entry else flight.barrier.epoch.curr
                )
        async with anyio.create_task_group() as tg:
            tg.start_soon(manager.run, name="barrier manager")
            incarnation.services = tg
            for record in self._records.values():
                for name, service in record.job.services.items():
                    incarnation.start_service(record.job.name, name, service)
            async with anyio.create_task_group() as actors:
                incarnation.actors = actors
                incarnation.start_actors(nodes, instances, wiring, adopted)
                incarnation.ready.set()
                if self._rebuilt is not None:
                    self._rebuilt.set()
                if task_status is not None:
                    task_status.started()
            await manager.drain()
            tg.cancel_scope.cancel()  # every actor finished: no more barriers to inject

    # Driving a running graph.

    async def _running(self) -> Incarnation:
        """The current graph, waiting while recovery rebuilds it."""
        while True:
            if self._task_group is None:
                raise NotRunningError("the runtime", "use it inside `async with rt:`")
            if self._failure is not None:
                # The graph failed for good: a caller outside the runtime's task group (a
                # blocking portal's call from a Spark thread) must not wait for a rebuild.
                raise self._failure
            incarnation = self._incarnation
            if incarnation is not None:
                await incarnation.ready.wait()
                return incarnation
            assert self._rebuilt is not None
            await self._rebuilt.wait()

    async def wait_running(self) -> None:
        """Return once the graph runs (at once, or after recovery rebuilt it).

        Raises:
            ActorFailedError: the graph failed for good (no recovery, or no restarts left).
            NotRunningError: the runtime is not running.
        """
        await self._running()

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
        incarnation = await self._running()
        inbox = incarnation.inboxes.get(source)
        if inbox is None:
            raise InvalidArgumentError("source", f"one of {list(incarnation.inboxes)}", source)
        with self._as_failure():
            await inbox.send(chunk)

    async def checkpoint(self) -> int:
        """Inject a checkpoint barrier now and return the epoch it made durable.

        Raises:
            ActorFailedError: the graph failed before the checkpoint completed.
        """
        incarnation = await self._running()
        with self._as_failure():
            flight = await incarnation.manager.inject(BarrierKind.CHECKPOINT)
        barrier = await flight.wait()
        return barrier.epoch.prev

    @contextlib.contextmanager
    def _as_failure(self) -> Iterator[None]:
        """A send into a graph that just failed surfaces as the failure itself."""
        try:
            yield
        except (ChannelClosedError, ChannelBrokenError) as exc:
            failure = self._last_failure
            if failure is None:
                raise
            raise failure from exc

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
        ids = {n.actor_id for n in self._graph.nodes.values()}
        named: set[int] = set()
        if isinstance(mutation, Add | SourceChangeSplit):
            named |= set(mutation.splits)
        elif isinstance(mutation, Throttle):
            named |= set(mutation.rates)
        elif isinstance(mutation, Update):
            named |= set(mutation.splits) | set(mutation.vnode_bitmaps) | mutation.dropped_actors
        elif isinstance(mutation, Stop):
            named |= mutation.actors
        unknown = sorted(named - ids)
        if unknown:
            raise InvalidArgumentError(
                "mutation", f"actor ids of this graph {sorted(ids)}", unknown
            )
        incarnation = await self._running()
        with self._as_failure():
            flight = await incarnation.manager.inject(mutation=mutation)
        return (await flight.wait()).epoch

    def actor_id(self, name: str) -> int:
        """The id of the actor named ``name``.

        Raises:
            InvalidArgumentError: no actor is named ``name``.
        """
        node = self._graph.nodes.get(name) if isinstance(name, str) else None
        if node is None:
            raise InvalidArgumentError("name", f"one of {list(self._graph.nodes)}", name)
        return node.actor_id

    @property
    def committed_epoch(self) -> int:
        """The last durable checkpoint epoch."""
        return 0 if self._store is None else self._store.committed_epoch

    def committed_epochs(self) -> CommittedEpochs:
        """The committed epoch now, then each newer one (see ``StateStore.committed_epochs``)."""
        if self._store is None:
            raise NotRunningError("the runtime", "use it inside `async with rt:`")
        return self._store.committed_epochs()

    def stats(self) -> RuntimeStats:
        """Per-actor, per-channel and per-job counters, epochs and restarts."""
        incarnation = self._incarnation
        if incarnation is None:
            return RuntimeStats({}, {}, 0, self.committed_epoch, 0, self._restarts, {})
        actors = {name: ctx.stats() for name, ctx in incarnation.contexts.items()}
        jobs: dict[str, JobStats] = {}
        for name, record in self._records.items():
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
            channels={tx.name: tx.statistics() for tx in incarnation.channels},
            current_epoch=incarnation.manager.current_epoch,
            committed_epoch=self.committed_epoch,
            barriers_in_flight=incarnation.manager.in_flight,
            restarts=self._restarts,
            jobs=jobs,
        )

    def __repr__(self) -> str:
        state = "running" if self._task_group is not None else "stopped"
        return f"<Runtime {state} actors={list(self._graph.nodes)}>"
