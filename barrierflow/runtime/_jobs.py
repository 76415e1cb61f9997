"""Jobs joining and leaving a running runtime (see :mod:`barrierflow.runtime.job`): adding a
job at one ``Add`` barrier, dropping one at a ``Stop`` barrier, the catalog entries they
write, what recovery keeps, and the progress their actors report."""

from __future__ import annotations

import contextlib
from typing import Any

import anyio

from barrierflow.channels.barrier import Barrier, BarrierKind
from barrierflow.channels.mutation import Add, Stop
from barrierflow.runtime._awaited import UnawaitedCalls, must_await
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

__all__ = ["RunningJobs"]


class RunningJobs(Declarations):
    """The job operations of a :class:`~barrierflow.runtime.runtime.Runtime`."""

    _config: RuntimeConfig
    _store: StateStore | None
    _jobs_lock: anyio.Lock
    _forget: set[str]
    _log: Any

    _unawaited: UnawaitedCalls | None = None

    @property
    def unawaited_calls(self) -> UnawaitedCalls:
        """This runtime's calls made without ``await`` (see :mod:`barrierflow.runtime._awaited`)."""
        if self._unawaited is None:
            self._unawaited = UnawaitedCalls()
        return self._unawaited

    async def _running(self) -> Incarnation:
        raise NotImplementedError

    def _as_failure(self) -> contextlib.AbstractContextManager[None]:
        raise NotImplementedError

    def forget_job(self, name: str) -> None:
        """Before start: delete job ``name`` from the state store's catalog at the first
        checkpoint, instead of declaring it again (its actors' state is left behind unread).

        Raises:
            GraphError: ``name`` is not a non-empty str, or the runtime has started.
        """
        self._check_not_started()
        if not isinstance(name, str) or not name:
            raise GraphError("job", "a job name", name)
        self._forget.add(name)

    # Jobs joining and leaving the running graph.

    def job(self, name: str) -> JobHandle:
        """The handle of job ``name`` (the default job is ``"main"``).

        Raises:
            UnknownJobError: no such job.
        """
        record = self._records.get(name) if isinstance(name, str) else None
        if record is None or record.status == "dropped":
            raise UnknownJobError(name, self.jobs())
        return JobHandle(record)

    def jobs(self) -> list[str]:
        """The names of the jobs that run (or are being dropped)."""
        return [name for name, r in self._records.items() if r.status != "dropped"]

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
        if not isinstance(job, Job):
            raise GraphError("job", "a Job", type(job).__name__)
        incarnation = await self._running()
        async with self._jobs_lock:
            if job.name in self._records:
                raise DuplicateJobError(job.name)
            clash = set(job.services) & (set(self._services()) | set(self._graph.nodes))
            if clash:
                raise GraphError(
                    "name", "service names not used by another actor or service", sorted(clash)
                )
            running = self._graph.nodes
            nodes = self._apply(job, running=True)
            try:
                instances = create_actors(nodes)
                capacity, rows = self._config.channel_capacity, self._config.channel_rows
                wiring = wire(nodes, running, capacity=capacity, rows=rows)
                services = self._services() | job.services
                check_wiring(instances, wiring, services, incarnation.instances)
            except BaseException:
                self._graph.remove([n.name for n in nodes])
                raise
            record = JobRecord(job, declared=False)
            self._records[job.name] = record
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
        incarnation = await self._running()
        async with self._jobs_lock:
            record = self._records.get(name) if isinstance(name, str) else None
            if record is None or record.status != "running":
                raise UnknownJobError(name, self.jobs())
            nodes = [n for n in self._graph.nodes.values() if n.job == name]
            mine = {n.name for n in nodes}
            readers = sorted(
                n.name for n in self._graph.nodes.values() if n.job != name and mine & set(n.inputs)
            )
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
        scope = incarnation.job_scopes.pop(name, None)
        if scope is not None:
            scope.cancel()
        for node in nodes:
            incarnation.inboxes.pop(node.name, None)
            incarnation.instances.pop(node.name, None)
            ctx = incarnation.contexts.pop(node.name, None)
            if ctx is not None:
                await self._trim(ctx, epoch)
        self._graph.remove(list(mine))
        record.status = "dropped"
        del self._records[name]
        record.error = NotRunningError(f"job {name!r}", "a job that was not dropped")
        record.ready.set()
        self._log.info("job dropped", job=name, epoch=epoch)
        return epoch

    @staticmethod
    async def _trim(ctx: ActorContext, epoch: int) -> None:
        """Delete every key of a dropped actor's tables, durable with the next checkpoint.

        The deletes are sealed under the stop barrier's epoch, or — when a checkpoint at or
        after it was committed while the job's actors were leaving — just after the committed
        epoch: either way the next checkpoint's commit takes them."""
        for table in ctx._tables:
            for key in await table.items():
                table.delete(key)
            table.seal(max(epoch, ctx.committed_epoch + 1))

    async def _restore_jobs(self) -> None:
        """Before a rebuild: keep the jobs the last checkpoint knows (and those declared before
        start); a job added since is lost, a job whose drop was not durable comes back."""
        assert self._store is not None
        committed = await self._store.read_all("__runtime__", "jobs")
        for name, record in list(self._records.items()):
            keep = record.declared or name in committed
            running = any(n.job == name for n in self._graph.nodes.values())
            if keep and not running:
                self._apply(record.job, running=True)
                record.status = "running"
            elif not keep:
                self._graph.remove([n.name for n in self._graph.nodes.values() if n.job == name])
                self._records.pop(name)
                record.error = NotRunningError(
                    f"job {name!r}", "a job whose creation a checkpoint made durable"
                )
                record.ready.set()

    def _on_complete(self, barrier: Barrier, progress: dict[int, Progress]) -> None:
        """A barrier completed: the progress collected with it counts for its jobs."""
        if not progress:
            return
        by_id = {n.actor_id: n for n in self._graph.nodes.values()}
        for actor_id, report in progress.items():
            node = by_id.get(actor_id)
            record = self._records.get(node.job) if node is not None else None
            if node is not None and record is not None:
                record.progress[node.name] = report
                record.update_ready()
