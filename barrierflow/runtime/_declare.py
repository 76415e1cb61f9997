"""Declaring a runtime's graph: the default job's actors, named jobs, and applying a job's
declarations to the graph all or nothing (before start, or when a job joins later).

:class:`Declarations` is the part of a :class:`~barrierflow.runtime.runtime.Runtime` that
knows *what* runs: the graph and the job records. It depends on nothing else of the runtime;
the running jobs (:mod:`._jobs`), the running graph (:mod:`._live`) and the lifecycle
(:mod:`._lifecycle`) read it and grow or shrink it through its methods."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

import pyarrow as pa

from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.runtime.actor import StreamActor
from barrierflow.runtime.errors import DuplicateJobError, GraphError, JobDroppingError
from barrierflow.runtime.graph import DEFAULT_JOB, Fanout, Graph, Node, split_input
from barrierflow.runtime.job import ActorDeclaration, Job, JobRecord, parallel_names
from barrierflow.runtime.service import Service
from barrierflow.runtime.startup import check_key_columns

__all__ = ["Declarations"]


def _indexed(factory: Callable[..., StreamActor], index: int) -> Callable[[], StreamActor]:
    """A parallel instance's factory: ``factory(index)``, or ``factory()`` for an actor class
    (its instances are alike; a class of its own taking the index can override ``__init__``
    with a default)."""
    build = factory
    if isinstance(factory, type) and issubclass(factory, StreamActor):
        return factory

    def make() -> StreamActor:
        return build(index)

    return make


def _upstreams(declaration: ActorDeclaration) -> list[tuple[object, str | None]]:
    """Each input of ``declaration`` as ``(upstream actor, output)`` (``output`` ``None`` for
    the main output, else the side output of ``"<actor>:<output>"``)."""
    inputs = declaration.inputs
    return [split_input(i) for i in (inputs.values() if isinstance(inputs, Mapping) else inputs)]


def _check_keys(declaration: ActorDeclaration, nodes: Mapping[str, Node], *, running: bool) -> None:
    """Check the hash key of each input of ``declaration`` against its upstream's declared
    schema, where there is one (the same check runs at start against what the actors say; a
    side output's schema is not declared, so it is not checked).

    Raises:
        KeyColumnError: a key column the upstream's declared schema lacks or cannot hash.
    """
    for upstream, output in _upstreams(declaration):
        node = nodes.get(upstream) if isinstance(upstream, str) and output is None else None
        if node is None or node.schema is None:
            continue
        key = declaration.key
        if declaration.parallelism is None and not running and node.fanout.kind == "hash":
            key = node.fanout.key_columns  # an actor declared alone shares the node's fan-out
        if key is not None:
            check_key_columns(declaration.name, key, node.name, node.schema)


class Declarations:
    """What a runtime runs: its graph and the record of each of its jobs (see
    :mod:`barrierflow.runtime.job`).

    It owns the :class:`~barrierflow.runtime.graph.Graph` (every actor of every job, declared
    or joined), the default job that :meth:`add_source` and :meth:`add_actor` grow, and the
    :class:`~barrierflow.runtime.job.JobRecord` of each job by name (its status, progress and
    epoch), because every change to the graph is checked against the jobs: a name a service
    of another job holds, an input of a job being dropped. Until the runtime starts
    (:meth:`freeze`) the graph is declared through it; afterwards the running jobs
    (:class:`~barrierflow.runtime._jobs.RunningJobs`) grow and shrink it with :meth:`apply`,
    :meth:`enroll` and :meth:`remove_job`.
    """

    def __init__(self) -> None:
        self._graph = Graph()
        self._main = Job(DEFAULT_JOB)
        self._records: dict[str, JobRecord] = {DEFAULT_JOB: JobRecord(self._main, declared=True)}
        self._started = False

    # What the other parts of the runtime read.

    @property
    def graph(self) -> Graph:
        """The graph: every actor of every job that runs (or is being dropped)."""
        return self._graph

    @property
    def records(self) -> Mapping[str, JobRecord]:
        """Job name → its record, in the order the jobs were declared or added (read-only:
        see :meth:`enroll` and :meth:`remove_job`)."""
        return MappingProxyType(self._records)

    @property
    def started(self) -> bool:
        """Whether the runtime started (no more declarations, see :meth:`freeze`)."""
        return self._started

    def freeze(self) -> None:
        """The runtime starts: from now on only jobs join and leave the graph."""
        self._started = True

    def check_not_started(self) -> None:
        """Refuse a declaration once the runtime has started.

        Raises:
            GraphError: the runtime has started.
        """
        if self._started:
            raise GraphError("graph", "changes before the runtime starts", "a running runtime")

    def services(self) -> dict[str, Service]:
        """Service name → service, of every job that runs (or is being dropped)."""
        return {
            name: service
            for record in self._records.values()
            if record.status != "dropped"
            for name, service in record.job.services.items()
        }

    def actor_id(self, name: str) -> int:
        """The id of the actor named ``name`` (the contract: ``Runtime.actor_id``).

        Raises:
            InvalidArgumentError: no actor is named ``name``.
        """
        node = self._graph.nodes.get(name) if isinstance(name, str) else None
        if node is None:
            raise InvalidArgumentError("name", f"one of {list(self._graph.nodes)}", name)
        return node.actor_id

    # Declaring, before start (the contracts: the methods of Runtime of the same names).

    def add_source(
        self,
        name: str,
        actor: Callable[[], StreamActor] | None = None,
        *,
        fanout: Fanout | None = None,
        schema: pa.Schema | None = None,
    ) -> Node:
        """Declare a source of the default job, all or nothing: the job takes the declaration,
        then the graph does, else the job forgets it again."""
        self.check_not_started()
        self._check_not_a_service(name)
        self._main.add_source(name, actor, fanout=fanout, schema=schema)
        try:
            return self._apply_last(self._main)[0]
        except BaseException:
            self._main._undo_last()
            raise

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
        """Declare an actor of the default job, all or nothing (as :meth:`add_source`)."""
        self.check_not_started()
        self._check_not_a_service(name)
        self._main.add_actor(
            name, actor, inputs=inputs, fanout=fanout, parallelism=parallelism, key=key
        )
        try:
            return self._apply_last(self._main)[0]
        except BaseException:
            self._main._undo_last()
            raise

    def declared_schema(self, name: str) -> pa.Schema | None:
        """The schema source ``name`` was declared to emit (``None``: not declared, or not a
        declared source)."""
        node = self._graph.nodes.get(name)
        return None if node is None else node.schema

    def name_in_use(self, name: str) -> bool:
        """Whether ``name`` is taken by an actor or a service of a declared job."""
        return name in self._graph.nodes or name in self.services()

    def _check_not_a_service(self, name: object) -> None:
        if isinstance(name, str) and name in self.services():
            raise GraphError("name", "a name not used by an actor or a service", name)

    def add_service(self, name: str, service: Service) -> None:
        """Declare a service of the default job."""
        self.check_not_started()
        if isinstance(name, str) and (name in self._graph.nodes or name in self.services()):
            raise GraphError("name", "a new, non-empty service name", name)
        self._main.add_service(name, service)

    def connect(self, upstream: str, downstream: str) -> None:
        """Add an edge between two declared actors."""
        self.check_not_started()
        self._graph.connect(upstream, downstream)

    def declare_job(self, job: Job) -> None:
        """Declare a named job before start: its actors into the graph, its record kept."""
        self.check_not_started()
        if not isinstance(job, Job):
            raise GraphError("job", "a Job", type(job).__name__)
        if job.name in self._records:
            raise DuplicateJobError(job.name)
        self.apply(job, running=False)
        self._records[job.name] = JobRecord(job, declared=True)

    # Jobs joining and leaving, after start.

    def enroll(self, record: JobRecord) -> None:
        """Keep the record of a job that joined the running graph (its actors were applied).

        Raises:
            DuplicateJobError: a job of that name exists.
        """
        if record.job.name in self._records:
            raise DuplicateJobError(record.job.name)
        self._records[record.job.name] = record

    def remove_job(self, name: str) -> JobRecord:
        """Remove job ``name``: its actors from the graph, and its record, which is returned
        (for the caller to settle: a dropped job, or one that recovery does not keep)."""
        self._graph.remove([n.name for n in self._graph.nodes.values() if n.job == name])
        return self._records.pop(name)

    def _apply_last(self, job: Job) -> list[Node]:
        """Apply the last declaration of ``job`` to the graph (the default job grows one
        actor at a time)."""
        return self._add_declaration(job, job.declarations[-1], running=False)

    def apply(self, job: Job, *, running: bool) -> list[Node]:
        """Every declaration of ``job`` into the graph, all or nothing; returns the new nodes
        (``running``: the job joins a running graph, each actor with a dispatcher of its own).

        Raises:
            GraphError: a name taken or an input unknown (or an upstream of a job being
                dropped, :class:`JobDroppingError`).
        """
        added: list[Node] = []
        try:
            for declaration in job.declarations:
                added += self._add_declaration(job, declaration, running=running)
        except BaseException:
            self._graph.remove([n.name for n in added])
            raise
        return added

    def _add_declaration(
        self, job: Job, declaration: ActorDeclaration, *, running: bool
    ) -> list[Node]:
        nodes = self._graph.nodes
        services = self.services()
        for upstream, _ in _upstreams(declaration):
            node = nodes.get(upstream) if isinstance(upstream, str) else None
            if node is not None and node.job != job.name:
                record = self._records.get(node.job)
                if record is not None and record.status != "running":
                    raise JobDroppingError(job.name, node.name, node.job)
        _check_keys(declaration, nodes, running=running)
        names = parallel_names(declaration.name, declaration.parallelism)
        for name in names:
            if name in services and name not in job.services:
                raise GraphError("name", "a name not used by an actor or a service", name)
        added: list[Node] = []
        try:
            for index, name in enumerate(names):
                factory = (
                    declaration.factory
                    if declaration.parallelism is None
                    else _indexed(declaration.factory, index)
                )
                group = declaration.name if declaration.parallelism is not None else None
                if running and group is None:
                    group = name  # a joining actor never shares an existing dispatcher
                added.append(
                    self._graph.add(
                        name,
                        factory,
                        inputs=declaration.inputs,
                        source=declaration.source,
                        fanout=declaration.fanout,
                        job=job.name,
                        group=group,
                        key=declaration.key,
                        schema=declaration.schema,
                        declared_by=declaration.factory,
                    )
                )
        except BaseException:
            self._graph.remove([n.name for n in added])
            raise
        return added
