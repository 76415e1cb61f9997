"""Declaring a runtime's graph: the default job's actors, named jobs, and applying a job's
declarations to the graph all or nothing (before start, or when a job joins later)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import pyarrow as pa

from barrierflow.runtime.actor import StreamActor
from barrierflow.runtime.errors import DuplicateJobError, GraphError, JobDroppingError
from barrierflow.runtime.graph import DEFAULT_JOB, Fanout, Graph, Node
from barrierflow.runtime.job import ActorDeclaration, Job, JobRecord, parallel_names
from barrierflow.runtime.service import Service
from barrierflow.runtime.startup import check_key_columns

__all__ = ["Declarations"]


def _indexed(factory: Callable[..., StreamActor], index: int) -> Callable[[], StreamActor]:
    def make() -> StreamActor:
        return factory(index)

    return make


def _check_keys(declaration: ActorDeclaration, nodes: Mapping[str, Node], *, running: bool) -> None:
    """Check the hash key of each input of ``declaration`` against its upstream's declared
    schema, where there is one (the same check runs at start against what the actors say).

    Raises:
        KeyColumnError: a key column the upstream's declared schema lacks or cannot hash.
    """
    upstreams = (
        declaration.inputs.values()
        if isinstance(declaration.inputs, Mapping)
        else declaration.inputs
    )
    for upstream in upstreams:
        node = nodes.get(upstream)
        if node is None or node.schema is None:
            continue
        key = declaration.key
        if declaration.parallelism is None and not running and node.fanout.kind == "hash":
            key = node.fanout.key_columns  # an actor declared alone shares the node's fan-out
        if key is not None:
            check_key_columns(declaration.name, key, upstream, node.schema)


class Declarations:
    """The graph of a runtime, made of jobs (see :mod:`barrierflow.runtime.job`)."""

    def __init__(self) -> None:
        self._graph = Graph()
        self._main = Job(DEFAULT_JOB)
        self._records: dict[str, JobRecord] = {DEFAULT_JOB: JobRecord(self._main, declared=True)}
        self._started = False

    def _check_not_started(self) -> None:
        if self._started:
            raise GraphError("graph", "changes before the runtime starts", "a running runtime")

    def _services(self) -> dict[str, Service]:
        return {
            name: service
            for record in self._records.values()
            if record.status != "dropped"
            for name, service in record.job.services.items()
        }

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
        self._check_not_started()
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
        self._check_not_started()
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
        return name in self._graph.nodes or name in self._services()

    def _check_not_a_service(self, name: object) -> None:
        if isinstance(name, str) and name in self._services():
            raise GraphError("name", "a name not used by an actor or a service", name)

    def add_service(self, name: str, service: Service) -> None:
        """Run ``service`` alongside the graph, in every incarnation (see :mod:`.service`).

        Raises:
            GraphError: ``service`` has no ``run(ctx)``, or ``name`` is taken.
        """
        self._check_not_started()
        if isinstance(name, str) and (name in self._graph.nodes or name in self._services()):
            raise GraphError("name", "a new, non-empty service name", name)
        self._main.add_service(name, service)

    def connect(self, upstream: str, downstream: str) -> None:
        """Add an edge between two declared actors.

        Raises:
            GraphError: an unknown actor, an edge into a source, an edge declared twice, an
                edge closing a cycle, or the runtime has started.
        """
        self._check_not_started()
        self._graph.connect(upstream, downstream)

    def declare_job(self, job: Job) -> None:
        """Declare a named job before start (a job added at runtime in an earlier run is
        declared again this way when the program restarts).

        Raises:
            GraphError: ``job`` is not a Job, or its declarations do not fit the graph.
            DuplicateJobError: a job of that name is declared.
        """
        self._check_not_started()
        if not isinstance(job, Job):
            raise GraphError("job", "a Job", type(job).__name__)
        if job.name in self._records:
            raise DuplicateJobError(job.name)
        self._apply(job, running=False)
        self._records[job.name] = JobRecord(job, declared=True)

    def _apply_last(self, job: Job) -> list[Node]:
        """Apply the last declaration of ``job`` to the graph (the default job grows one
        actor at a time)."""
        return self._add_declaration(job, job.declarations[-1], running=False)

    def _apply(self, job: Job, *, running: bool) -> list[Node]:
        """Every declaration of ``job`` into the graph, all or nothing.

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
        services = self._services()
        upstreams = (
            declaration.inputs.values()
            if isinstance(declaration.inputs, Mapping)
            else declaration.inputs
        )
        for upstream in upstreams:
            node = nodes.get(upstream) if isinstance(upstream, str) else None
            if node is not None and node.job != job.name:
                record = self._records.get(node.job)
                if record is not None and record.status != "running":
                    raise JobDroppingError(job.name, upstream, node.job)
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
                    )
                )
        except BaseException:
            self._graph.remove([n.name for n in added])
            raise
        return added
