"""Jobs joining and leaving a running runtime (see :mod:`barrierflow.runtime.job`): adding a
job at one ``Add`` barrier, dropping one at a ``Stop`` barrier, the catalog entries they
write, what recovery keeps, and the progress their actors report.

:class:`RunningJobs` is the part of a :class:`~barrierflow.runtime.runtime.Runtime` that
changes *which* jobs run while the graph runs. What a job is made of is kept by the
:class:`~barrierflow.runtime._declare.Declarations` it is given; the running graph it reaches
through two callables it is given too (the current incarnation, waiting while recovery rebuilds
it, and the context that turns a send into a dead graph into the graph's failure), so that it
never depends on who supervises the graph."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import Any

import anyio
import structlog

from barrierflow.channels.barrier import Barrier, BarrierKind
from barrierflow.channels.mutation import Add, Stop
from barrierflow.runtime._declare import Declarations
from barrierflow.runtime._incarnation import Incarnation, check_wiring, create_actors
from barrierflow.runtime._wiring import wire
from barrierflow.runtime.actor import ActorContext
from barrierflow.runtime.config import RuntimeConfig
from barrierflow.runtime.errors import (
    DuplicateJobError,
    GraphError,
    JobError,
    NotRunningError,
    UnknownJobError,
)
from barrierflow.runtime.job import Job, JobHandle, JobRecord
from barrierflow.runtime.progress import Progress
from barrierflow.runtime.state.state_store import StateStore

__all__ = ["RunningJobs", "trim_dropped_actor"]


async def trim_dropped_actor(ctx: ActorContext, epoch: int) -> None:
    """Delete every key of a dropped actor's tables, durable with the next checkpoint.

    The deletes are sealed under the stop barrier's epoch, or — when a checkpoint at or after
    it was committed while the job's actors were leaving — just after the committed epoch:
    either way the next checkpoint's commit takes them."""
    for table in ctx._tables:
        for key in await table.items():
            table.delete(key)
        table.seal(max(epoch, ctx.committed_epoch + 1))


class RunningJobs:
    """The jobs of a running runtime: handles on them, adding and dropping them at barriers,
    what recovery keeps of them, and their progress.

    It owns the lock that orders every barrier changing which jobs run (an ``Add``, a job's
    ``Stop``, and — taken by the lifecycle — the initial barrier and the final ``Stop``), so
    that each is recorded in the job catalog under its own epoch; and the names of stored jobs
    to forget at start (:meth:`forget_job`), a declaration the lifecycle acts on.

    Args:
        config: for the capacity of a joining job's channels.
        declarations: the graph and the job records, which this grows and shrinks.
        running: the current incarnation, once it runs (raises ``NotRunningError`` or the
            graph's failure, as ``Runtime.wait_running`` does).
        as_failure: a context in which a send into a graph that just failed raises the
            failure itself.
        trim: deletes the state of an actor of a dropped job, given its context and the
            epoch of the stop barrier (:func:`trim_dropped_actor`).
    """

    def __init__(
        self,
        config: RuntimeConfig,
        declarations: Declarations,
        *,
        running: Callable[[], Awaitable[Incarnation]],
        as_failure: Callable[[], AbstractContextManager[None]],
        trim: Callable[[ActorContext, int], Awaitable[None]] = trim_dropped_actor,
    ) -> None:
        self._config = config
        self._declarations = declarations
        self._running = running
        self._as_failure = as_failure
        self._trim = trim
        self._lock = anyio.Lock()
        self._forget: set[str] = set()
        self._log: Any = structlog.get_logger("barrierflow.runtime")

    @property
    def lock(self) -> anyio.Lock:
        """Held while a barrier that changes which jobs run is injected and recorded."""
        return self._lock

    @property
    def forgotten(self) -> frozenset[str]:
        """The stored jobs to delete from the catalog at start instead of declaring them."""
        return frozenset(self._forget)

    def forget_job(self, name: str) -> None:
        """Before start: forget stored job ``name`` (the contract: ``Runtime.forget_job``)."""
        self._declarations.check_not_started()
        if not isinstance(name, str) or not name:
            raise GraphError("job", "a job name", name)
        self._forget.add(name)

    # Jobs joining and leaving the running graph (the contracts: Runtime's methods).

    def job(self, name: str) -> JobHandle:
        """The handle of job ``name``."""
        record = self._declarations.records.get(name) if isinstance(name, str) else None
        if record is None or record.status == "dropped":
            raise UnknownJobError(name, self.jobs())
        return JobHandle(record)

    def jobs(self) -> list[str]:
        """The names of the jobs that run (or are being dropped)."""
        return [n for n, r in self._declarations.records.items() if r.status != "dropped"]

    async def add_job(self, job: Job) -> JobHandle:
        """Join ``job`` to the running graph at one ``Add`` barrier: its channels and actors
        are built and checked first (nothing is added if that fails), then the barrier is
        injected and the job enters the catalog under its epoch."""
        if not isinstance(job, Job):
            raise GraphError("job", "a Job", type(job).__name__)
        incarnation = await self._running()
        declarations = self._declarations
        graph = declarations.graph
        async with self._lock:
            if job.name in declarations.records:
                raise DuplicateJobError(job.name)
            clash = set(job.services) & (set(declarations.services()) | set(graph.nodes))
            if clash:
                raise GraphError(
                    "name", "service names not used by another actor or service", sorted(clash)
                )
            running = graph.nodes
            nodes = declarations.apply(job, running=True)
            try:
                instances = create_actors(nodes)
                capacity, rows = self._config.channel_capacity, self._config.channel_rows
                wiring = wire(nodes, running, capacity=capacity, rows=rows)
                services = declarations.services() | job.services
                check_wiring(instances, wiring, services, incarnation.instances)
            except BaseException:
                graph.remove([n.name for n in nodes])
                raise
            record = JobRecord(job, declared=False)
            declarations.enroll(record)
            record.set_backfilling(instances)
            incarnation.channels += wiring.channels
            for name, service in job.services.items():
                incarnation.start_service(job.name, name, service)
            incarnation.start_actors(nodes, instances, wiring, {})
            ids = frozenset(n.actor_id for n in nodes)
            add = Add(
                added_actors=ids,
                outputs={actor: tuple(new) for actor, new in wiring.new_outputs.items()},
            )
            with self._as_failure():
                flight = await incarnation.manager.inject(
                    mutation=add, add_actors=ids, add_sources=wiring.inboxes
                )
            epoch = flight.barrier.epoch.curr
            record.created_epoch = epoch
            incarnation.catalog.record(epoch, created={job.name: job.actor_names()})
            for node in nodes:
                if node.is_source:
                    incarnation.inboxes[node.name] = wiring.inboxes[node.actor_id]
        record.update_ready()
        await flight.wait()
        self._log.info("job added", job=job.name, epoch=epoch, actors=job.actor_names())
        return JobHandle(record)

    async def drop_job(self, name: str) -> int:
        """Stop job ``name``'s actors at one checkpoint barrier, then its services, then trim
        its state; returns the barrier's epoch."""
        incarnation = await self._running()
        declarations = self._declarations
        async with self._lock:
            record = declarations.records.get(name) if isinstance(name, str) else None
            if record is None or record.status != "running":
                raise UnknownJobError(name, self.jobs())
            graph_nodes = declarations.graph.nodes.values()
            nodes = [n for n in graph_nodes if n.job == name]
            mine = {n.name for n in nodes}
            readers = sorted(n.name for n in graph_nodes if n.job != name and mine & set(n.inputs))
            if readers:
                raise JobError(name, "a job no other job reads", f"read by {readers}")
            record.status = "dropping"
            ids = frozenset(n.actor_id for n in nodes)
            # A checkpoint, as a graceful stop of the runtime is: a sink of the job commits
            # what it pre-committed before its writers leave, instead of rolling it back.
            with self._as_failure():
                flight = await incarnation.manager.inject(BarrierKind.CHECKPOINT, Stop(ids))
            epoch = flight.barrier.epoch.curr
            incarnation.catalog.record(epoch, dropped=(name,))
        await flight.wait()
        incarnation.manager.remove_sources(ids)
        # The job's services (a sink's coordinator) serve its actors until the last one left.
        for node in nodes:
            done = incarnation.actor_done.pop(node.name, None)
            if done is not None:
                await done.wait()
        for scope in incarnation.job_scopes.pop(name, []):
            scope.cancel()
        for node in nodes:
            incarnation.inboxes.pop(node.name, None)
            incarnation.instances.pop(node.name, None)
            ctx = incarnation.contexts.pop(node.name, None)
            if ctx is not None:
                await self._trim(ctx, epoch)
        declarations.remove_job(name)
        record.status = "dropped"
        record.error = NotRunningError(f"job {name!r}", "a job that was not dropped")
        record.ready.set()
        self._log.info("job dropped", job=name, epoch=epoch)
        return epoch

    async def restore(self, store: StateStore) -> None:
        """Before a rebuild: keep the jobs the last checkpoint of ``store`` knows (and those
        declared before start); a job added since is lost, a job whose drop was not durable
        comes back."""
        declarations = self._declarations
        committed = await store.read_all("__runtime__", "jobs")
        for name, record in list(declarations.records.items()):
            keep = record.declared or name in committed
            in_graph = any(n.job == name for n in declarations.graph.nodes.values())
            if keep and not in_graph:
                declarations.apply(record.job, running=True)
                record.status = "running"
            elif not keep:
                declarations.remove_job(name)
                record.error = NotRunningError(
                    f"job {name!r}", "a job whose creation a checkpoint made durable"
                )
                record.ready.set()

    def on_complete(self, barrier: Barrier, progress: dict[int, Progress]) -> None:
        """A barrier completed: the progress collected with it counts for its jobs (the
        barrier manager's ``on_complete`` hook)."""
        if not progress:
            return
        by_id = {n.actor_id: n for n in self._declarations.graph.nodes.values()}
        records = self._declarations.records
        for actor_id, report in progress.items():
            node = by_id.get(actor_id)
            record = records.get(node.job) if node is not None else None
            if node is not None and record is not None:
                record.progress[node.name] = report
                record.update_ready()
