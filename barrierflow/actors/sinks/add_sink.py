"""A sink in one call: ``add_sink(rt_or_job, name, table, input=..., parallelism=N, key=...)``.

Declaring a sink by hand takes three parts that must agree: N writer actors
(:class:`~barrierflow.actors.sinks.sink_writer.SinkWriter`) with unique writer ids,
hash-dispatched by the key so each owns a share of the vnodes; one coordinator service holding
the table's committer; and each writer pointing at that coordinator. :func:`add_sink` makes all
three from one description, so none can be forgotten or mismatched:

* ``table`` a **table** (:class:`~barrierflow.actors.sinks.table.Table`: ``schema``,
  ``writer(writer_id)`` and ``committer()``), such as
  :class:`~barrierflow.connectors.IcebergTable`, :class:`~barrierflow.connectors.DeltaLakeTable` or
  :class:`~barrierflow.connectors.ParquetTable`: ``parallelism`` writers (default 1) named
  ``<name>.0`` … ``<name>.N-1`` with writer ids ``"0"`` … ``"N-1"`` (one writer declared
  without ``parallelism`` or ``key`` is named ``<name>``, writer id ``"0"``), and a
  :class:`~barrierflow.actors.Coordinator` service named
  ``<name>.coordinator`` that commits every epoch once, across all of them — for one writer
  too, so a sink commits the same way whatever its parallelism.

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

from barrierflow.actors.sinks.coordinator.coordinator import Coordinator
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
    #: Its coordinator (a service of the runtime or job).
    coordinator: Coordinator
    #: The table it writes (what Spark executors stage for, when a bridge writes there).
    table: Table
    #: The ``parallelism`` it was declared with (``None``: one writer, not declared); on
    #: Spark's executors, the number of tasks that write each micro-batch.
    parallelism: int | None = None


def add_sink(
    target: _Declares,
    name: str,
    table: Table,
    *,
    input: str,
    parallelism: int | None = None,
    key: Sequence[str] | None = None,
    commit_retry_timeout: float = 300.0,
) -> DeclaredSink:
    """Declare sink ``name`` reading ``input`` into ``target`` (see the module).

    Args:
        target: a :class:`~barrierflow.runtime.Runtime` before start, or a
            :class:`~barrierflow.runtime.Job`.
        name: the sink's name: its writers' names, its coordinator's, and its key in the
            meta store.
        table: the table (``schema``, ``writer(id)``, ``committer()``).
        input: the actor whose output the sink writes.
        parallelism: writers (default 1). When a Spark bridge runs the pipeline on the
            executors (``run_on="executors"``), the number of Spark tasks that write each
            micro-batch, one file set each: the micro-batch is coalesced or repartitioned to
            it; not given, one task per partition of the micro-batch as Spark made them.
        key: the columns rows are hash-dispatched to the writers by (round robin without).
        commit_retry_timeout: seconds a failing commit of the table is retried before the
            pipeline fails with :class:`~barrierflow.errors.TableCommitFailedError` (the
            coordinator's, see :class:`~barrierflow.actors.Coordinator`).

    Returns:
        The writers' names and the coordinator.

    Raises:
        InvalidArgumentError: ``table`` is not a table; ``input`` not a str;
            ``commit_retry_timeout`` not a finite number of seconds > 0.
        GraphError: a bad or taken name, a bad ``parallelism`` or ``key`` (from the graph).
        KeyColumnError: ``key`` names a column the input's declared schema lacks.
        SinkSchemaError: the table's schema differs from the input's declared schema (a
            source declared with ``schema=``; otherwise the runtime checks it at start).
    """
    if not isinstance(name, str) or not name:
        raise GraphError("name", "a non-empty sink name", name)
    if not isinstance(input, str) or not input:
        raise InvalidArgumentError("input", "the name of the actor the sink reads", input)
    if not isinstance(table, Table):
        raise InvalidArgumentError(
            "table", "a table (schema, writer(id) and committer())", type(table).__name__
        )
    return _add_coordinated(target, name, table, input, parallelism, key, commit_retry_timeout)


def _add_coordinated(
    target: _Declares,
    name: str,
    table: Table,
    upstream: str,
    parallelism: int | None,
    key: Sequence[str] | None,
    commit_retry_timeout: float,
) -> DeclaredSink:
    service = f"{name}.coordinator"
    # All or nothing: the service's name is checked before the writers are declared (which
    # is itself all or nothing), so a refused sink leaves no writer without its coordinator.
    if target.name_in_use(service):
        raise GraphError("name", "a sink name whose coordinator name is free", service)
    if isinstance(table.schema, pa.Schema):
        check_input_schema(name, table.schema, upstream, target.declared_schema(upstream))
    coordinator = Coordinator(name, table.committer(), commit_retry_timeout=commit_retry_timeout)

    def writer(index: int) -> SinkWriter:
        writer_id = str(index)
        return SinkWriter(
            lambda: table.writer(writer_id),
            coordinator=coordinator,
            writer_id=writer_id,
            name=name,
        )

    if parallelism is None and key is None:
        # One writer, named as the sink (writer id "0"): the coordinator runs for it too.
        target.add_actor(name, lambda: writer(0), inputs=[upstream])
    else:
        count = 1 if parallelism is None else parallelism
        target.add_actor(name, writer, inputs=[upstream], parallelism=count, key=key)
        parallelism = count
    target.add_service(service, coordinator)
    return DeclaredSink(
        name, tuple(parallel_names(name, parallelism)), coordinator, table, parallelism
    )
