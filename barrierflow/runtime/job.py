"""Jobs: named groups of actors added to and dropped from a runtime as a unit.

A :class:`Job` is a declaration — which actors (from their factories), which inputs, which
services — checked when it is made and applied all or nothing. The graph declared before
start is made of jobs too: what ``rt.add_source`` / ``rt.add_actor`` declare belongs to the
default job ``"main"``, and ``rt.declare_job(job)`` adds a named one. While the runtime runs,
``await rt.add_job(job)`` joins a new job to the live graph at one barrier and returns a
:class:`JobHandle`; ``await rt.drop_job(name)`` removes one at another.

Each actor of a job may read actors of other (running) jobs: those upstreams gain an output
exactly at the barrier that adds the job — the rows before it go only to the old outputs, the
rows after it to the new job too, and the barrier is the new actors' first.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import final

import anyio
import pyarrow as pa

from barrierflow.channels.chunk import Chunk
from barrierflow.channels.errors import SchemaMismatchError
from barrierflow.channels.messages import Message
from barrierflow.runtime.actor import ActorContext, StreamActor
from barrierflow.runtime.errors import GraphError
from barrierflow.runtime.graph import Fanout
from barrierflow.runtime.placement import Placement, declared_key, declared_placement
from barrierflow.runtime.progress import JobProgress, Progress
from barrierflow.runtime.service import Service

__all__ = ["Job", "JobHandle", "JobStats", "PushSource"]


class PushSource(StreamActor):
    """A source fed by :meth:`Runtime.push`: chunks and injected barriers share one inbox, so
    a chunk pushed before a barrier was injected belongs to the epoch that barrier closes.

    Args:
        schema: the schema of the chunks pushed (``rt.add_source(name, schema=...)``), so
            that the actors reading it are checked against it before any row flows (see
            :mod:`barrierflow.runtime.startup`); ``None``: not declared.

    Raises:
        GraphError: ``schema`` is not ``None`` or a ``pyarrow.Schema``.
    """

    def __init__(self, schema: pa.Schema | None = None) -> None:
        if schema is not None and not isinstance(schema, pa.Schema):
            raise GraphError("schema", "None or a pyarrow.Schema", schema)
        self._schema = schema

    def output_schema(self) -> pa.Schema | None:
        """The declared schema of the pushed chunks (``None``: not declared)."""
        return self._schema

    async def process(self, message: Message, ctx: ActorContext) -> None:
        """Forward ``message``; a chunk must have the declared schema, if one was declared.

        Raises:
            SchemaMismatchError: a chunk of another schema was pushed (the checks made
                against the declared schema would not hold for it).
        """
        if (
            self._schema is not None
            and isinstance(message, Chunk)
            and not message.batch.schema.equals(self._schema)
        ):
            raise SchemaMismatchError(
                f"chunk pushed into source {ctx.name!r}", self._schema, message.batch.schema
            )
        await ctx.emit(message)


@dataclass(frozen=True, slots=True)
class ActorDeclaration:
    """One actor (or parallel group) of a job, as declared."""

    name: str
    factory: Callable[..., StreamActor]
    inputs: Sequence[str] | Mapping[str, str]
    source: bool
    fanout: Fanout | None
    parallelism: int | None
    key: tuple[str, ...] | None
    schema: pa.Schema | None = None

    def names(self) -> list[str]:
        """The actors this declaration makes: ``name``, or ``name.0`` … for a group."""
        return parallel_names(self.name, self.parallelism)


def parallel_names(name: str, parallelism: int | None) -> list[str]:
    """The names of the actors of a declaration (``name``, or ``name.0``, ``name.1``, …)."""
    return [name] if parallelism is None else [f"{name}.{i}" for i in range(parallelism)]


def check_declaration(
    name: object,
    factory: object,
    *,
    parallelism: object,
    key: object,
) -> tuple[int | None, tuple[str, ...] | None]:
    """Check what ``add_actor`` is given beyond what the graph checks.

    Raises:
        GraphError: ``factory`` is an actor instance or not callable, ``parallelism`` not
            ``None`` or an int in 1..1024, ``key`` not ``None`` or a list or tuple of
            non-empty column names, or ``key`` given without ``parallelism``.
    """
    if not isinstance(name, str) or not name or ":" in name:
        # ':' names a side output in an input ("<actor>:<output>").
        raise GraphError("name", "a non-empty str without ':'", name)
    if isinstance(factory, StreamActor) or not callable(factory):
        raise GraphError(
            "actor",
            "a factory (a StreamActor class or a callable returning one; an instance would be "
            "reused across restarts)",
            type(factory).__name__ if isinstance(factory, StreamActor) else factory,
        )
    if parallelism is not None and (type(parallelism) is not int or not 1 <= parallelism <= 1024):
        raise GraphError("parallelism", "None or an int in 1..1024", parallelism)
    if key is None:
        return parallelism, _placed_key(name, factory, parallelism, given=False)
    if parallelism is None:
        raise GraphError("key", "key columns only with parallelism=N", key)
    if (
        not isinstance(key, list | tuple)
        or not key
        or not all(isinstance(c, str) and c for c in key)
    ):
        raise GraphError("key", "a non-empty list or tuple of column names", key)
    declared = _placed_key(name, factory, parallelism, given=True)
    if declared is not None and not set(key) <= set(declared):
        # Rows of one key of the operator's would reach several instances.
        raise GraphError(
            "key", f"columns of {name!r}'s key {list(declared)} (rows of a key to one actor)", key
        )
    return parallelism, tuple(key)


def _placed_key(
    name: str, factory: object, parallelism: int | None, *, given: bool
) -> tuple[str, ...] | None:
    """The hash key a parallel declaration gets from what ``factory`` declares (see
    :mod:`barrierflow.runtime.placement`): none for a partition-local actor (round robin), the
    operator's key for a keyed one; a global actor is refused in parallel.

    Raises:
        GraphError: a global actor, or a keyed one that names no key (neither declared nor
            ``given`` to ``add_actor``), with ``parallelism`` > 1.
    """
    placement = declared_placement(factory)
    if parallelism is None or placement is None:
        return None
    if placement is Placement.GLOBAL and parallelism > 1:
        raise GraphError(
            "parallelism",
            f"1 for {name!r}: a global actor sees the whole stream (declare placement = "
            "Placement.PARTITION_LOCAL or KEYED on its class to run several)",
            parallelism,
        )
    if placement is Placement.KEYED:
        key = declared_key(factory)
        if key is None and parallelism > 1 and not given:
            raise GraphError(
                "key",
                f"the key columns of keyed actor {name!r} (key=[...]), for parallelism > 1",
                None,
            )
        return key
    return None


@final
class Job:
    """A named group of actors and services, declared before it is added.

    Raises:
        GraphError: ``name`` is not a non-empty str.
    """

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise GraphError("job", "a non-empty job name", name)
        self._name = name
        self._actors: list[ActorDeclaration] = []
        self._services: dict[str, Service] = {}

    @property
    def name(self) -> str:
        """The job's name."""
        return self._name

    @property
    def declarations(self) -> list[ActorDeclaration]:
        """The actor declarations, in order."""
        return list(self._actors)

    @property
    def services(self) -> dict[str, Service]:
        """Service name → service, run while the job runs."""
        return dict(self._services)

    def actor_names(self) -> list[str]:
        """Every actor name the job declares."""
        return [n for d in self._actors for n in d.names()]

    def _undo_last(self) -> None:
        """Forget the last actor declaration (the graph refused it)."""
        self._actors.pop()

    def declared_schema(self, name: str) -> pa.Schema | None:
        """The schema source ``name`` of this job was declared to emit (``None``: not
        declared here; an upstream in the running graph is checked when the job is added)."""
        for declaration in self._actors:
            if declaration.name == name:
                return declaration.schema
        return None

    def name_in_use(self, name: str) -> bool:
        """Whether ``name`` is taken by an actor or a service of this job."""
        return name in self.actor_names() or name in self._services

    def _check_free(self, names: list[str]) -> None:
        taken = set(self.actor_names()) | set(self._services)
        for name in names:
            if name in taken:
                raise GraphError("name", "a name not used by another actor or service", name)

    def add_source(
        self,
        name: str,
        actor: Callable[[], StreamActor] | None = None,
        *,
        fanout: Fanout | None = None,
        schema: pa.Schema | None = None,
    ) -> None:
        """Declare a source (a :class:`PushSource` unless a factory is given).

        Args:
            schema: the schema the source emits, if known: the actors reading it are checked
                against it at declaration (hash key columns, a sink's schema) instead of on
                the first rows. A push source made here is given it too.

        Raises:
            GraphError: a bad or taken name, an actor instance instead of a factory, or a
                ``schema`` that is not a ``pyarrow.Schema``.
        """
        if schema is not None and not isinstance(schema, pa.Schema):
            raise GraphError("schema", "None or a pyarrow.Schema", schema)
        factory: Callable[[], StreamActor] = PushSource
        if actor is not None:
            factory = actor
        elif schema is not None:
            factory = functools.partial(PushSource, schema)
        check_declaration(name, factory, parallelism=None, key=None)
        if fanout is not None and not isinstance(fanout, Fanout):
            raise GraphError("fanout", "None or a Fanout", fanout)
        self._check_free([name])
        self._actors.append(ActorDeclaration(name, factory, (), True, fanout, None, None, schema))

    def add_actor(
        self,
        name: str,
        actor: Callable[..., StreamActor],
        *,
        inputs: Sequence[str] | Mapping[str, str],
        fanout: Fanout | None = None,
        parallelism: int | None = None,
        key: Sequence[str] | None = None,
    ) -> list[str]:
        """Declare an actor, or ``parallelism`` actors of one kind.

        Args:
            actor: a factory, called at every (re)start (``factory(i)`` with the index in
                0..N-1 when ``parallelism`` is given; a StreamActor class is called without
                it). What the factory declares (:mod:`barrierflow.runtime.placement`) is
                checked here: a global actor runs as one instance, a keyed one is
                hash-dispatched by its own key unless ``key`` names a subset of it.
            inputs: upstream actor names (of this job, or of a running one; in a list, the
                name of a parallel group stands for all its actors), or a mapping of the
                actor's own input name to an upstream actor.
            fanout: how *this* actor's output is split among downstream actors declared alone.
            parallelism: N actors named ``name.0`` … ``name.N-1``; every upstream
                hash-dispatches to them by ``key`` (round robin without one), separately
                from its other outputs.
            key: the hashed columns of a parallel group.

        Returns:
            The declared actors' names.

        Raises:
            GraphError: a bad or taken name, an instance instead of a factory, a bad
                ``parallelism`` or ``key``, or ``inputs`` that is not a list, tuple or mapping.
        """
        count, columns = check_declaration(name, actor, parallelism=parallelism, key=key)
        candidate: object = inputs
        if not isinstance(candidate, list | tuple | Mapping):
            raise GraphError("inputs", "a list or tuple of actor names, or a mapping", inputs)
        if fanout is not None and not isinstance(fanout, Fanout):
            raise GraphError("fanout", "None or a Fanout", fanout)
        names = parallel_names(name, count)
        self._check_free(names)
        self._actors.append(
            ActorDeclaration(
                name,
                actor,
                dict(inputs) if isinstance(inputs, Mapping) else tuple(inputs),
                False,
                fanout,
                count,
                columns,
            )
        )
        return names

    def add_service(self, name: str, service: Service) -> None:
        """Run ``service`` while the job runs (a sink's coordinator).

        Raises:
            GraphError: ``service`` has no ``run(ctx)``, or ``name`` is taken.
        """
        if not isinstance(service, Service):
            raise GraphError("service", "an object with async run(ctx)", service)
        if not isinstance(name, str) or not name:
            raise GraphError("name", "a non-empty service name", name)
        self._check_free([name])
        self._services[name] = service

    def __repr__(self) -> str:
        return f"<Job {self._name!r} actors={self.actor_names()}>"


@final
@dataclass(frozen=True, slots=True)
class JobStats:
    """A snapshot of one job's counters."""

    #: The job's name.
    job: str
    #: Its actors' names.
    actors: tuple[str, ...]
    #: The epoch of the barrier that added it (0 for a job declared before start).
    created_epoch: int
    #: Rows read and emitted, summed over its actors.
    rows_in: int
    rows_out: int
    #: Whether every backfilling actor has finished.
    ready: bool


class JobRecord:
    """The runtime's bookkeeping for one job (not public: see :class:`JobHandle`)."""

    def __init__(self, job: Job, *, declared: bool) -> None:
        self.job = job
        #: Declared before start (rebuilt by recovery whatever the catalog says).
        self.declared = declared
        self.created_epoch = 0
        self.status = "running"
        self.progress: dict[str, Progress] = {}
        self.backfilling: set[str] = set()
        self.ready = anyio.Event()
        self.error: BaseException | None = None

    def set_backfilling(self, instances: Mapping[str, StreamActor]) -> None:
        """Note which of this incarnation's actors of the job backfill (class ``backfills``)."""
        self.backfilling = {
            name
            for name in self.job.actor_names()
            if name in instances and instances[name].backfills
        }
        self.update_ready()

    def update_ready(self) -> None:
        if all(name in self.progress and self.progress[name].finished for name in self.backfilling):
            self.ready.set()

    def snapshot(self) -> JobProgress:
        return JobProgress(
            self.job.name,
            self.created_epoch,
            dict(self.progress),
            all(n in self.progress and self.progress[n].finished for n in self.backfilling),
        )


@final
class JobHandle:
    """A job of a running runtime (returned by ``add_job``, or ``rt.job(name)``)."""

    __slots__ = ("_record",)

    def __init__(self, record: JobRecord) -> None:
        self._record = record

    @property
    def name(self) -> str:
        """The job's name."""
        return self._record.job.name

    @property
    def actors(self) -> list[str]:
        """The job's actors' names."""
        return self._record.job.actor_names()

    @property
    def created_epoch(self) -> int:
        """The epoch of the barrier that added the job (0 if declared before start)."""
        return self._record.created_epoch

    def progress(self) -> JobProgress:
        """Each backfilling actor's latest completed progress, and whether the job is ready."""
        return self._record.snapshot()

    async def wait_ready(self) -> JobProgress:
        """Return once every actor of the job has reported its backfill finished (at once for
        a job without backfill).

        Raises:
            NotRunningError: the job was dropped, or lost to a failure before its creation
                was committed, before it became ready.
        """
        record = self._record
        await record.ready.wait()
        if record.error is not None:
            raise record.error
        return record.snapshot()

    def __repr__(self) -> str:
        return f"<JobHandle {self.name!r} status={self._record.status}>"
