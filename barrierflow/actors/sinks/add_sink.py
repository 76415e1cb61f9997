"""A sink in one call: ``add_sink(rt_or_job, name, connector, input=..., parallelism=N, key=...)``.

Declaring a sink by hand takes three parts that must agree: N writer actors with unique writer
ids, hash-dispatched by the key so each owns a share of the vnodes; one coordinator service
holding the sink's committer; and each writer pointing at that coordinator. :func:`add_sink`
makes all three from one description, so none can be forgotten or mismatched:

* ``connector`` a **table** (:class:`~barrierflow.actors.sinks.table.Table`: ``schema``,
  ``writer(writer_id)`` and ``committer()``), such as
  :class:`~barrierflow.connectors.IcebergSink`, :class:`~barrierflow.connectors.DeltaSink` or
  :class:`~barrierflow.connectors.ParquetTable`: ``parallelism`` writers (default 1) named
  ``<name>.0`` … ``<name>.N-1`` with writer ids ``"0"`` … ``"N-1"``, and a
  :class:`~barrierflow.actors.sinks.coordinator.Coordinator` service named
  ``<name>.coordinator`` that commits every epoch once, across all of them;
* ``connector`` a **factory** of a single-writer connector (``lambda: ParquetFileSink(...)``):
  one writer actor named ``name`` that commits its own epochs. Parallel writers need a
  coordinated table (each would otherwise commit a part of an epoch on its own), so
  ``parallelism`` above 1 is refused.

``rt_or_job`` is a :class:`~barrierflow.runtime.Runtime` before it starts (the sink joins its
default job), or a :class:`~barrierflow.runtime.Job` to be added to a running runtime with
``await rt.add_job(job)``: the writers' first barrier is then the job's ``Add`` barrier, and a
fresh coordinated sink starts every writer at that epoch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, final

import pyarrow as pa

from barrierflow.actors.sinks.coordinator import Coordinator
from barrierflow.actors.sinks.protocol import SinkConnector
from barrierflow.actors.sinks.sink_writer import SinkWriter
from barrierflow.actors.sinks.table import Table
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.runtime.actor import StreamActor
from barrierflow.runtime.errors import GraphError
from barrierflow.runtime.job import parallel_names
from barrierflow.runtime.service import Service
from barrierflow.runtime.startup import check_input_schema

__all__ = ["DeclaredSink", "add_sink"]


class _Declares(Protocol):
    """What :func:`add_sink` declares into: a runtime before start, or a job."""

    def add_actor(
        self,
        name: str,
        actor: Callable[..., StreamActor],
        *,
        inputs: Sequence[str],
        parallelism: int | None = None,
        key: Sequence[str] | None = None,
    ) -> object: ...

    def add_service(self, name: str, service: Service) -> None: ...

    def name_in_use(self, name: str) -> bool: ...

    def declared_schema(self, name: str) -> pa.Schema | None: ...


@final
@dataclass(frozen=True, slots=True)
class DeclaredSink:
    """What :func:`add_sink` declared."""

    #: The sink's name.
    name: str
    #: Its writer actors' names.
    writers: tuple[str, ...]
    #: Its coordinator (a service of the runtime or job), or ``None`` for a single writer.
    coordinator: Coordinator | None


def add_sink(
    target: _Declares,
    name: str,
    connector: Table | Callable[[], SinkConnector],
    *,
    input: str,
    parallelism: int | None = None,
    key: Sequence[str] | None = None,
) -> DeclaredSink:
    """Declare sink ``name`` reading ``input`` into ``target`` (see the module).

    Args:
        target: a :class:`~barrierflow.runtime.Runtime` before start, or a
            :class:`~barrierflow.runtime.Job`.
        name: the sink's name: its writers' names, its coordinator's, and its key in the
            meta store.
        connector: a coordinated table, or a factory of a single-writer connector.
        input: the actor whose output the sink writes.
        parallelism: writers of a coordinated table (default 1).
        key: the columns rows are hash-dispatched to the writers by (round robin without).

    Returns:
        The writers' names and the coordinator.

    Raises:
        InvalidArgumentError: ``connector`` is neither a coordinated table nor a callable;
            ``parallelism`` above 1 for a single-writer connector; ``input`` not a str.
        GraphError: a bad or taken name, a bad ``parallelism`` or ``key`` (from the graph).
        KeyColumnError: ``key`` names a column the input's declared schema lacks.
        SinkSchemaError: the table's schema differs from the input's declared schema (a
            source declared with ``schema=``; otherwise the runtime checks it at start).
    """
    if not isinstance(name, str) or not name:
        raise GraphError("name", "a non-empty sink name", name)
    if not isinstance(input, str) or not input:
        raise InvalidArgumentError("input", "the name of the actor the sink reads", input)
    if isinstance(connector, Table):
        count = 1 if parallelism is None else parallelism
        return _add_coordinated(target, name, connector, input, count, key)
    if not callable(connector):
        raise InvalidArgumentError(
            "connector",
            "a coordinated table (writer(id) and committer()) or a factory of a SinkConnector",
            type(connector).__name__,
        )
    if parallelism not in (None, 1) or key is not None:
        raise InvalidArgumentError(
            "parallelism",
            "1 for a single-writer connector (parallel writers need a coordinated table)",
            parallelism if parallelism not in (None, 1) else f"key={key!r}",
        )
    factory = connector
    target.add_actor(name, lambda: SinkWriter(factory, name=name), inputs=[input])
    return DeclaredSink(name, (name,), None)


def _add_coordinated(
    target: _Declares,
    name: str,
    table: Table,
    upstream: str,
    parallelism: int,
    key: Sequence[str] | None,
) -> DeclaredSink:
    service = f"{name}.coordinator"
    # All or nothing: the service's name is checked before the writers are declared (which
    # is itself all or nothing), so a refused sink leaves no writer without its coordinator.
    if target.name_in_use(service):
        raise GraphError("name", "a sink name whose coordinator name is free", service)
    if isinstance(table.schema, pa.Schema):
        check_input_schema(name, table.schema, upstream, target.declared_schema(upstream))
    coordinator = Coordinator(name, table.committer())

    def writer(index: int) -> SinkWriter:
        return SinkWriter(lambda: table.writer(str(index)), name=name, coordinator=coordinator)

    target.add_actor(name, writer, inputs=[upstream], parallelism=parallelism, key=key)
    target.add_service(service, coordinator)
    return DeclaredSink(name, tuple(parallel_names(name, parallelism)), coordinator)
