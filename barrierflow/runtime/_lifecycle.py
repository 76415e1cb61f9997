"""Starting, supervising and stopping a runtime's graph: the lifecycle part of
:class:`~barrierflow.runtime.runtime.Runtime` (the graph it runs is declared in
:mod:`._declare`, the jobs that join and leave are :mod:`._jobs`', and callers drive the running
graph through :mod:`._live`).

``async with rt:`` opens the state store (on threads the runtime owns), refuses a job in the
store that is not declared, then runs :meth:`Lifecycle._supervise` in the runtime's task group:
each *incarnation* of the graph is built (channels, actors, a barrier manager), started with its
initial barrier, and run until every actor finished. An actor failure either fails the runtime
or, with recovery, rebuilds the graph from the last committed checkpoint after a backoff.
Leaving ``async with`` normally sends a final ``Stop`` checkpoint and waits (at most
``RuntimeConfig.stop_timeout`` seconds) for it to be committed; past that deadline the graph is
cancelled and the exit raises :class:`~barrierflow.errors.BarrierStuckError` naming the actors
that hold the barrier, rather than hang. The same error comes at once when every actor finished
but the Stop did not go through them all (an actor ended holding it): the rows behind it were
never committed, and a clean exit would hide that. A
:class:`~barrierflow.runtime.watchdog.BarrierWatchdog` runs beside every incarnation and warns
about such an actor long before.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any

import anyio
import anyio.to_thread
import structlog
from anyio.abc import TaskGroup, TaskStatus

from barrierflow.channels.barrier import BarrierKind
from barrierflow.channels.mutation import Stop
from barrierflow.runtime._declare import Declarations
from barrierflow.runtime._incarnation import Incarnation, check_wiring, create_actors
from barrierflow.runtime._jobs import RunningJobs
from barrierflow.runtime._live import LiveGraph
from barrierflow.runtime._wiring import wire
from barrierflow.runtime.barrier_manager import BarrierManager, InFlightBarrier
from barrierflow.runtime.config import RuntimeConfig
from barrierflow.runtime.errors import (
    ActorFailedError,
    BarrierStuckError,
    JobNotDeclaredError,
    NotRunningError,
)
from barrierflow.runtime.logging import configure_logging
from barrierflow.runtime.metrics import MetricsRegistry
from barrierflow.runtime.metrics_server import MetricsServer
from barrierflow.runtime.startup import adopt_positions
from barrierflow.runtime.state.state_store import StateStore
from barrierflow.runtime.watchdog import BarrierWatchdog

__all__ = ["Lifecycle"]

#: Worker threads a runtime lends its state store's blocking calls.
_IO_THREADS = 4


def _contains(group: BaseExceptionGroup[BaseException], exc: BaseException) -> bool:
    """Whether ``exc`` is one of the errors in ``group`` (at any depth)."""
    return any(
        leaf is exc or (isinstance(leaf, BaseExceptionGroup) and _contains(leaf, exc))
        for leaf in group.exceptions
    )


def _actor_failures(group: BaseExceptionGroup[BaseException]) -> list[ActorFailedError]:
    """Every ActorFailedError in ``group`` (at any depth)."""
    found: list[ActorFailedError] = []
    for exc in group.exceptions:
        if isinstance(exc, ActorFailedError):
            found.append(exc)
        elif isinstance(exc, BaseExceptionGroup):
            found.extend(_actor_failures(exc))
    return found


def _root_failure(group: BaseExceptionGroup[BaseException]) -> ActorFailedError | None:
    """The ActorFailedError in ``group`` that came first in time (``None``: there is none).

    One failure brings others: a source that fails closes its outputs, so a sink's writers see
    their input end and leave, and the sink's coordinator, still waiting for them to align,
    fails on the leaving. The task groups' nesting decides where each error sits in the group
    (the coordinator's, in the services' group, comes before the source's, in the actors'
    group nested inside it), not which came first: the earliest is the cause, and the one to
    raise.
    """
    failures = _actor_failures(group)
    return min(failures, key=lambda failure: failure.failed_at, default=None)


class Lifecycle:
    """Entering, supervising and leaving a runtime (see the module).

    It owns the runtime's state store (opened on entering, closed on leaving), the exit stack
    that keeps the runtime's task group open between ``__aenter__`` and ``__aexit__``, and the
    count of restarts; it is the one writer of the :class:`~barrierflow.runtime._live.LiveGraph`
    it is given (which incarnation runs, and how it failed). It builds each incarnation from the
    graph of the ``declarations`` it is given, and takes from the ``jobs`` it is given what they
    decide: the jobs recovery keeps, the jobs to forget, the progress of a completed barrier,
    and the lock that orders the barriers changing which jobs run.

    Args:
        config: how to run.
        clock: wall-clock seconds for epochs (``None``: the barrier manager's own).
        declarations: the graph and the job records.
        jobs: the running jobs.
        live: the running graph, as callers reach it.
        metrics: the runtime's metrics (served at ``config.metrics_port``, if set, while the
            runtime runs).
    """

    def __init__(
        self,
        config: RuntimeConfig,
        clock: Callable[[], float] | None,
        declarations: Declarations,
        jobs: RunningJobs,
        live: LiveGraph,
        metrics: MetricsRegistry,
    ) -> None:
        self._config = config
        self._metrics = metrics
        self._server: MetricsServer | None = None
        self._failed_at: float | None = None  # when the graph last failed, until rebuilt
        self._recovery_seconds = metrics.histogram(
            "barrierflow_recovery_seconds",
            "seconds from a graph's failure until the rebuilt graph ran again (recovery)",
        )
        self._clock = clock
        self._declarations = declarations
        self._jobs = jobs
        self._live = live
        self._store: StateStore | None = None
        self._exit_stack: AsyncExitStack | None = None
        self._task_group: TaskGroup | None = None
        self._restarts = 0
        self._log: Any = structlog.get_logger("barrierflow.runtime")

    @property
    def store(self) -> StateStore | None:
        """The state store (``None``: the runtime never started; closed once it left)."""
        return self._store

    @property
    def metrics_url(self) -> str | None:
        """Where the metrics endpoint serves (``None``: none runs)."""
        return None if self._server is None else self._server.url

    @property
    def restarts(self) -> int:
        """Graph restarts so far (recovery)."""
        return self._restarts

    async def enter(self) -> None:
        """Open the store, refuse an undeclared stored job, and start the graph (returns once
        its initial barrier is in)."""
        self._declarations.graph.validate()
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
            records, forgotten = self._declarations.records, self._jobs.forgotten
            for job, entry in catalog.items():
                if job not in records and job not in forgotten:
                    raise JobNotDeclaredError(job, int(entry.get("created_epoch", 0)))
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._store.aclose()
            raise
        self._declarations.freeze()
        # The task group outlives this call: it is entered on an exit stack that exit()
        # (or a failed start) closes with the body's exception.
        stack = AsyncExitStack()
        task_group = await stack.enter_async_context(anyio.create_task_group())
        self._exit_stack, self._task_group = stack, task_group
        self._live.attach(task_group)
        try:
            if self._config.metrics_port is not None:
                self._server = MetricsServer(
                    self._metrics, self._config.metrics_host, self._config.metrics_port
                )
                self._server.start()
            await task_group.start(self._supervise)
        except BaseException as exc:
            await self._shutdown(type(exc), exc, exc.__traceback__)
            raise

    async def exit(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Leave: stop the graph at a final checkpoint (if the body and the graph did not
        fail), then cancel what is left and close the store."""
        if exc is None and self._live.failure is None:
            timeout = self._config.stop_timeout
            flight: InFlightBarrier | None = None
            with anyio.CancelScope(shield=True), anyio.move_on_after(timeout) as stop:
                flight = await self._stop_graph()
            incarnation = self._live.incarnation
            nodes = self._declarations.graph.nodes
            stuck: BarrierStuckError | None = None
            if stop.cancelled_caught and incarnation is not None:
                stuck = incarnation.stuck_error(nodes)
            elif flight is not None and flight.missed and incarnation is not None:
                # Every actor finished, but the Stop did not go through them all: if one ended
                # holding it, the rows behind it were never committed downstream. (One whose
                # input had ended before it was sent the Stop lost nothing: no culprit.)
                lost = incarnation.stuck_error(nodes, flight)
                stuck = lost if lost.culprits else None
            if stuck is not None:
                # What followed the last committed checkpoint is replayed at the next start.
                self._log.error(str(stuck), timeout_s=timeout)
                await self._shutdown(BarrierStuckError, stuck, None)
                raise stuck
        await self._shutdown(exc_type, exc, tb)

    async def _shutdown(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task_group, self._task_group = self._task_group, None
        stack, self._exit_stack = self._exit_stack, None
        self._live.detach()
        server, self._server = self._server, None
        if server is not None:  # its port is free once the runtime has stopped
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(server.stop)
        try:
            if task_group is not None and stack is not None:
                if exc is not None:
                    task_group.cancel_scope.cancel()
                try:
                    await stack.__aexit__(exc_type, exc, tb)
                except BaseExceptionGroup as group:
                    if exc is not None and _contains(group, exc):
                        # The body's own error, not a group of it: what the actors raised while
                        # being torn down because of it is a consequence (and was logged).
                        raise exc from exc.__cause__
                    failure = _root_failure(group)
                    if failure is not None:
                        raise failure from failure.cause
                    raise
        finally:
            if self._store is not None:
                with anyio.CancelScope(shield=True):
                    await self._store.aclose()
        failure = self._live.failure
        if failure is not None and exc is None:
            raise failure from failure.cause

    async def _stop_graph(self) -> InFlightBarrier | None:
        """Inject the final ``Stop`` checkpoint and wait until it completed; return it (``None``:
        no Stop was needed, every actor had finished already)."""
        incarnation = self._live.incarnation
        if incarnation is None or incarnation.finished:
            return None  # nothing runs that a Stop could reach (every actor finished already)
        await incarnation.ready.wait()
        try:
            async with self._jobs.lock:
                nodes = self._declarations.graph.nodes.values()
                stop = Stop(frozenset(n.actor_id for n in nodes))
                flight = await incarnation.manager.inject(BarrierKind.CHECKPOINT, stop)
            await flight.wait()
        except NotRunningError:
            return None  # every actor finished meanwhile (their own Stop, or inputs ended)
        return flight

    async def _supervise(self, *, task_status: TaskStatus[None]) -> None:
        started = False
        while True:
            try:
                await self._run_incarnation(task_status if not started else None)
                return
            except ActorFailedError as failure:
                started = True
                self._failed_at = anyio.current_time()
                self._live.lose(failure)
                if not self._config.recovery or self._restarts >= self._config.max_restarts:
                    self._log.error(
                        "actor failed; stopping",
                        actor=failure.actor,
                        error=repr(failure.cause),
                        restarts=self._restarts,
                    )
                    self._live.fail(failure)
                    for record in self._declarations.records.values():
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
                await self._jobs.restore(self._store)
                await anyio.sleep(delay)
            started = True

    async def _run_incarnation(self, task_status: TaskStatus[None] | None) -> None:
        try:
            await self._run_graph(task_status)
        except BaseExceptionGroup as group:
            # Surface the failure that caused the others (siblings were cancelled by it, or
            # failed because of it).
            failure = _root_failure(group)
            if failure is None:
                raise
            raise failure from failure.cause

    async def _run_graph(self, task_status: TaskStatus[None] | None) -> None:
        store = self._store
        assert store is not None
        graph, records = self._declarations.graph, self._declarations.records
        nodes = list(graph.nodes.values())
        capacity, rows = self._config.channel_capacity, self._config.channel_rows
        instances = create_actors(nodes)
        wiring = wire(nodes, {}, capacity=capacity, rows=rows)
        check_wiring(instances, wiring, self._declarations.services())
        manager = BarrierManager(
            store,
            wiring.inboxes,
            {n.actor_id for n in nodes},
            barrier_interval=self._config.barrier_interval,
            checkpoint_frequency=self._config.checkpoint_frequency,
            max_in_flight=self._config.max_in_flight,
            clock=self._clock,
            metrics=self._metrics,
        )
        manager.on_complete = self._jobs.on_complete
        incarnation = Incarnation(store, manager, self._metrics)
        incarnation.channels = wiring.channels
        incarnation.inboxes = {n.name: wiring.inboxes[n.actor_id] for n in nodes if n.is_source}
        self._live.install(incarnation)
        adopted: dict[str, int] = {}
        if store.committed_epoch == 0:
            adopted = await adopt_positions(
                instances, str(self._config.state_path), adopt=self._config.adopt_sink_positions
            )
        committed = await incarnation.catalog.committed()
        for record in records.values():
            record.set_backfilling(instances)
        # The initial barrier goes in before anyone may push, so every actor sees it first
        # and knows its epoch before its first chunk. The catalog gains the declared jobs it
        # lacks (and loses the forgotten ones) under its epoch.
        async with self._jobs.lock:
            flight = await manager.inject()
            new = {
                name: record.job.actor_names()
                for name, record in records.items()
                if name not in committed
            }
            gone = tuple(name for name in self._jobs.forgotten if name in committed)
            incarnation.catalog.record(flight.barrier.epoch.curr, created=new, dropped=gone)
            for name, record in records.items():
                entry = committed.get(name)
                record.created_epoch = (
                    int(entry["created_epoch"]) if entry else flight.barrier.epoch.curr
                )
        async with anyio.create_task_group() as tg:
            tg.start_soon(manager.run, name="barrier manager")
            watchdog = BarrierWatchdog(
                manager,
                lambda: incarnation.stuck_error(self._declarations.graph.nodes),
                after_intervals=self._config.stuck_barrier_intervals,
            )
            tg.start_soon(watchdog.run, name="barrier watchdog")
            incarnation.services = tg
            for record in records.values():
                for name, service in record.job.services.items():
                    incarnation.start_service(record.job.name, name, service)
            async with anyio.create_task_group() as actors:
                incarnation.actors = actors
                incarnation.start_actors(nodes, instances, wiring, adopted)
                if self._failed_at is not None:  # a recovery: the rebuilt graph runs again
                    self._recovery_seconds.observe(anyio.current_time() - self._failed_at)
                    self._failed_at = None
                self._live.announce_ready()
                if task_status is not None:
                    task_status.started()
            await manager.drain()
            incarnation.finished = True  # no barrier can be injected into it any more
            tg.cancel_scope.cancel()  # every actor finished: no more barriers to inject
