"""What the runtime asks of a graph's actors before it starts them.

Every incarnation of a graph creates all its actors first (calling their factories), then
asks them two things before any of them runs, so that a mistake is refused at start instead of
hanging or losing rows later:

1. **Does the graph suit you?** An actor implementing :class:`StartupCheck` gets a
   :class:`StartupContext` — the runtime's services, the actors that share its inputs — and
   raises a typed error if something it needs is missing (a coordinated sink writer whose
   coordinator is not a service of the runtime, or whose parallel siblings have none).
2. **What does your storage already hold?** Only when the state store is empty (nothing ever
   committed): an actor implementing :class:`HoldsPositions` (a sink's writer) says up to which
   source positions its output storage holds rows, or refuses to start (a sink whose table
   holds commits the store does not know, unless ``adopt_sink_positions=True``: see
   :mod:`barrierflow.actors.sinks`). The positions given are handed to every actor as
   ``ctx.adopted_positions``, and sources skip what they cover. From several actors the
   **smallest** position of each key is adopted: one that holds more than that skips the
   replayed epochs it already has, while adopting the largest would lose rows for the one that
   holds less. The runtime knows nothing more of sinks: what a table holds and the refusal are
   the sinks'.
3. **Do the schemas fit?** Where an actor's output schema is known — declared on the source
   (``rt.add_source(name, schema=...)``) or told by the actor (:class:`OutputSchema`: a batch
   feed's source, a split source) — every actor reading it hash-dispatched must find its key
   columns there (:class:`~barrierflow.errors.KeyColumnError`, naming the actor and the
   columns the input has), and an actor that requires one input schema
   (:class:`InputSchema`: a sink writer) must be given exactly it
   (:class:`~barrierflow.errors.SinkSchemaError`, saying what differs and, for a time zone
   or an integer width, the cast that fixes it). The same checks run at declaration when the
   schemas are known then; otherwise the first chunk would fail in the upstream, or the sink
   at its first checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, final, runtime_checkable

import pyarrow as pa
import structlog

from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.channels.vnode import check_key_columns as check_hashable
from barrierflow.runtime._schemas import describe_difference
from barrierflow.runtime.errors import KeyColumnError, SinkSchemaError

__all__ = [
    "Edge",
    "InputSchema",
    "OutputSchema",
    "StartupCheck",
    "StartupContext",
    "EmptyStore",
    "HoldsPositions",
    "adopt_positions",
    "check_actors",
    "check_input_schema",
    "check_key_columns",
    "check_schemas",
]


@final
@dataclass(frozen=True, slots=True)
class StartupContext:
    """What an actor may look at before the graph starts.

    Attributes:
        name: the actor's name.
        services: the runtime's services, by name.
        siblings: the other actors reading a hash-dispatched input of this actor, by name: the
            parallel writers of one upstream are each other's siblings.
        input_key: the columns this actor's input is hash-dispatched by (``None``: its input
            is not hash-dispatched).
        peers: every actor of its parallel group, itself included (``(name,)`` for an actor
            declared alone).
        graph: every actor of the graph it joins, by name (the running ones and the new).
    """

    name: str
    services: Mapping[str, object]
    siblings: Mapping[str, object]
    input_key: tuple[str, ...] | None = None
    peers: tuple[str, ...] = ()
    graph: Mapping[str, object] = field(default_factory=dict)


@runtime_checkable
class StartupCheck(Protocol):
    """An actor that checks the graph it is part of before it starts."""

    def check_startup(self, ctx: StartupContext) -> None:
        """Raise a typed error (a :class:`~barrierflow.errors.GraphError`) if the graph lacks
        what this actor needs."""
        ...


@runtime_checkable
class OutputSchema(Protocol):
    """An actor that knows the schema of every chunk it emits (before it runs)."""

    def output_schema(self) -> pa.Schema | None:
        """The schema of its chunks, or ``None`` if it does not know it."""
        ...


@runtime_checkable
class InputSchema(Protocol):
    """An actor that accepts one input schema only (a sink writer: its sink's schema)."""

    def input_schema(self) -> pa.Schema | None:
        """The schema its input must have, or ``None`` if any will do."""
        ...


@final
@dataclass(frozen=True, slots=True)
class Edge:
    """One input of an actor, as the schema checks see it.

    Attributes:
        upstream: the actor whose output is read.
        actor: the actor reading it.
        key: the columns the edge is hash-dispatched by (``None``: not hash-dispatched).
        group: the name to blame for the key: the parallel group's, else ``actor``.
    """

    upstream: str
    actor: str
    key: tuple[str, ...] | None
    group: str


def check_key_columns(
    actor: str, key: Sequence[str], upstream: str, schema: pa.Schema | None
) -> None:
    """Refuse hash key columns that ``upstream``'s known ``schema`` lacks or cannot hash.

    Raises:
        KeyColumnError: a key column missing from ``schema``, or of a type that cannot be
            hashed (nothing is checked when ``schema`` is ``None``).
    """
    if schema is None:
        return
    columns = [f"{f.name}: {f.type}" for f in schema]
    for column in key:
        if schema.get_field_index(column) < 0:
            raise KeyColumnError(actor, column, upstream, columns, "is not a column of its input")
    try:
        check_hashable(schema, tuple(key))  # the dispatcher's own rule for a key's types
    except InvalidArgumentError as exc:
        column = str(exc.got).split(":", 1)[0]
        raise KeyColumnError(
            actor, column, upstream, columns, f"cannot be hashed (expected {exc.expected})"
        ) from None


def check_input_schema(
    actor: str, wanted: pa.Schema | None, upstream: str, schema: pa.Schema | None
) -> None:
    """Refuse an input whose known ``schema`` is not the one ``actor`` requires, compared as
    the sink task compares each batch (names, order, types, nullability; not metadata).

    Raises:
        SinkSchemaError: both schemas are known and differ.
    """
    if wanted is None or schema is None or schema.equals(wanted):
        return
    difference, fix = describe_difference(wanted, schema)
    raise SinkSchemaError(actor, upstream, difference, fix)


def _output_schema(actor: object, declared: pa.Schema | None) -> pa.Schema | None:
    if isinstance(actor, OutputSchema):
        told = actor.output_schema()
        if isinstance(told, pa.Schema):
            return told
    return declared


def check_schemas(
    edges: Iterable[Edge],
    actors: Mapping[str, object],
    declared: Mapping[str, pa.Schema],
) -> None:
    """Check every edge whose upstream's schema is known (module docstring, point 3).

    Args:
        edges: the inputs of the actors to check (the whole graph, or a joining job's).
        actors: every actor instance of the graph (running ones included), by name.
        declared: the schemas declared on sources (``add_source(..., schema=...)``).

    Raises:
        KeyColumnError: a hash key column the upstream does not emit.
        SinkSchemaError: an actor requiring one input schema reads another.
    """
    for edge in edges:
        upstream = actors.get(edge.upstream)
        schema = _output_schema(upstream, declared.get(edge.upstream))
        if schema is None:
            continue
        if edge.key is not None:
            check_key_columns(edge.group, edge.key, edge.upstream, schema)
        reader = actors.get(edge.actor)
        if isinstance(reader, InputSchema):
            check_input_schema(edge.actor, reader.input_schema(), edge.upstream, schema)


def check_actors(
    actors: Mapping[str, object],
    inputs: Mapping[str, list[str]],
    services: Mapping[str, object],
    hashed: set[str],
    keys: Mapping[str, tuple[str, ...]] | None = None,
    groups: Mapping[str, tuple[str, ...]] | None = None,
    graph: Mapping[str, object] | None = None,
) -> None:
    """Run every actor's :class:`StartupCheck`.

    Args:
        actors: name → the actor instance of this incarnation.
        inputs: name → the names of its inputs.
        services: the runtime's services.
        hashed: the actors whose output is hash-dispatched.
        keys: name → the columns its hash-dispatched input is keyed by.
        groups: name → the actors of its parallel group (grouped actors only).
        graph: every actor of the graph, by name (default: ``actors``).
    """
    for name, actor in actors.items():
        if not isinstance(actor, StartupCheck):
            continue
        mine = set(inputs.get(name, ())) & hashed
        siblings = {
            other: instance
            for other, instance in actors.items()
            if other != name and mine & set(inputs.get(other, ()))
        }
        key = (keys or {}).get(name)
        peers = (groups or {}).get(name, (name,))
        context = StartupContext(name, services, siblings, key, peers, graph or actors)
        actor.check_startup(context)


@final
@dataclass(frozen=True, slots=True)
class EmptyStore:
    """What an actor is told when the runtime starts on an empty state store."""

    #: The store (for messages).
    state_path: str
    #: ``RuntimeConfig.adopt_sink_positions``: whether positions held outside the store may be
    #: adopted (``False``: an actor whose storage holds rows should refuse to start).
    adopt: bool


@runtime_checkable
class HoldsPositions(Protocol):
    """An actor whose output storage may hold rows the state store does not cover (a sink's
    writer: its table). Asked before the graph starts, only on an empty state store."""

    async def positions_held(self, store: EmptyStore) -> Mapping[str, int] | None:
        """The source positions up to which the storage holds rows (``None``: it holds none).

        Raises:
            Exception: a typed error, when the actor must not start next to this store.
        """
        ...


async def adopt_positions(
    actors: Mapping[str, object], state_path: str, *, adopt: bool
) -> dict[str, int]:
    """On an empty store: the positions the actors' storage holds, key-wise smallest (module
    docstring); empty when none holds any.

    Raises:
        Exception: what an actor refused the start with.
    """
    store = EmptyStore(state_path, adopt)
    held: dict[str, Mapping[str, int]] = {}
    for name, actor in actors.items():
        if isinstance(actor, HoldsPositions):
            positions = await actor.positions_held(store)
            if positions is not None:
                held[name] = positions
    if not held:
        return {}
    adopted: dict[str, int] = {}
    for positions in held.values():
        for key, value in positions.items():
            adopted[key] = min(value, adopted.get(key, value))
    structlog.get_logger("barrierflow.runtime").warning(
        "empty state store: adopting the positions held outside it",
        actors=sorted(held),
        positions=adopted,
    )
    return adopted
