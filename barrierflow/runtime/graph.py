"""The graph a runtime runs: named actors, their inputs, and how each fans out.

Declared before the runtime starts, validated when it starts: every non-source actor needs an
input, an edge is declared once, and the graph has no cycle. Each edge becomes a bounded
channel; an actor with several inputs reads them through an aligned merge; an actor with
several outputs writes them through its dispatcher (broadcast unless told otherwise).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import final

import pyarrow as pa

from barrierflow.runtime.actor import StreamActor
from barrierflow.runtime.context import DEFAULT_JOB
from barrierflow.runtime.errors import GraphError

__all__ = ["DEFAULT_JOB", "Fanout", "Graph", "Node"]


@final
@dataclass(frozen=True, slots=True)
class Fanout:
    """How an actor's output is split among its downstream actors.

    Attributes:
        kind: ``"broadcast"`` (everything to all), ``"round_robin"`` (whole chunks in turn) or
            ``"hash"`` (rows by vnode of ``key_columns``; vnodes split evenly).
        key_columns: the hashed columns, for ``"hash"``.

    Both are checked here, not when the runtime starts: ``key_columns`` must be a list or
    tuple of non-empty column names (stored as a tuple). A str is refused where the sequence of
    names is expected — ``Fanout("hash", "key")`` would hash the columns ``k``, ``e``, ``y``.

    Raises:
        GraphError: an unknown ``kind``, key columns that are not a list or tuple of non-empty
            names, or key columns given for a kind other than ``"hash"`` (or missing for it).
    """

    kind: str = "broadcast"
    key_columns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or self.kind not in ("broadcast", "round_robin", "hash"):
            raise GraphError("fanout", "'broadcast', 'round_robin' or 'hash'", self.kind)
        keys: object = self.key_columns
        if not isinstance(keys, list | tuple) or not all(isinstance(c, str) and c for c in keys):
            raise GraphError(
                "key_columns", "a list or tuple of non-empty column names", self.key_columns
            )
        if (self.kind == "hash") != bool(keys):
            raise GraphError(
                "key_columns", "key columns exactly when kind is 'hash'", self.key_columns
            )
        object.__setattr__(self, "key_columns", tuple(keys))


@dataclass(slots=True)
class Node:
    """One actor of the graph.

    Attributes:
        actor_id: unique for the runtime's life (never reused after a job is dropped).
        inputs: the upstream actors' names, in order.
        input_names: the actor's own name for each input (``inputs[i]`` is read as
            ``input_names[i]``; the upstream's name unless the actor named it).
        job: the job the actor belongs to.
        group: the parallel group (all actors of one ``parallelism=N`` declaration), or
            ``None`` for an actor declared alone before start (those share their upstream's
            node-level ``fanout``).
        key: the columns a parallel group is hash-dispatched by (``None``: round robin).
        schema: the schema a source was declared to emit (``None``: not declared).
    """

    actor_id: int
    name: str
    factory: Callable[[], StreamActor]
    is_source: bool
    fanout: Fanout
    inputs: list[str] = field(default_factory=list)
    input_names: list[str] = field(default_factory=list)
    job: str = DEFAULT_JOB
    group: str | None = None
    key: tuple[str, ...] | None = None
    schema: pa.Schema | None = None


@final
class Graph:
    """A builder for the actors and edges of a runtime."""

    def __init__(self) -> None:
        self._nodes: dict[str, Node] = {}
        self._last_id = 0

    @property
    def nodes(self) -> dict[str, Node]:
        """Name → node, in declaration order."""
        return dict(self._nodes)

    def add(
        self,
        name: str,
        actor: Callable[[], StreamActor],
        *,
        inputs: Sequence[str] | Mapping[str, str] = (),
        source: bool = False,
        fanout: Fanout | None = None,
        job: str = DEFAULT_JOB,
        group: str | None = None,
        key: tuple[str, ...] | None = None,
        known: Mapping[str, Node] | None = None,
        schema: pa.Schema | None = None,
    ) -> Node:
        """Declare an actor from its factory (called at every (re)start of the graph).

        All or nothing: every argument is checked before the graph changes, so a refused
        declaration leaves no trace and its name can be used again. ``inputs`` is a list or
        tuple of declared actors' names, or a mapping of the actor's own input name to an
        upstream actor (named inputs); a str is refused (it is a sequence of one-letter names).

        Args:
            known: actors that may be read besides this graph's (a job's upstreams in the
                running graph).
            schema: the schema a source emits, if declared.

        Raises:
            GraphError: a bad or duplicate name; an actor instance or anything else that is not
                a factory (an instance would be reused across restarts with its in-memory
                state); ``source`` not a bool, ``fanout`` not a Fanout, ``schema`` not a
                schema (or given for an actor that is not a source), ``inputs`` not a list,
                tuple or mapping of names, an input named twice or not declared, or a source
                with inputs.
        """
        if not isinstance(name, str) or not name:
            raise GraphError("name", "a non-empty str", name)
        if name in self._nodes or (known is not None and name in known):
            raise GraphError("name", "a name not used by another actor", name)
        if isinstance(actor, StreamActor) or not callable(actor):
            raise GraphError(
                "actor",
                "a factory (a StreamActor class or a callable returning one; an instance would "
                "be reused across restarts)",
                type(actor).__name__ if isinstance(actor, StreamActor) else actor,
            )
        if type(source) is not bool:
            raise GraphError("source", "a bool", source)
        if fanout is not None and not isinstance(fanout, Fanout):
            raise GraphError("fanout", "None or a Fanout", fanout)
        if schema is not None and not (source and isinstance(schema, pa.Schema)):
            raise GraphError("schema", "None, or a pyarrow.Schema for a source", schema)
        candidate: object = inputs
        if isinstance(candidate, Mapping):
            local = list(candidate.keys())
            names = list(candidate.values())
            if not all(isinstance(n, str) and n for n in local):
                raise GraphError("inputs", "non-empty str input names", local)
        elif isinstance(candidate, list | tuple):
            names = list(inputs)
            local = list(names)
        else:
            raise GraphError("inputs", "a list or tuple of actor names, or a mapping", inputs)
        if source and names:
            raise GraphError("inputs", "no inputs for a source", names)
        readable = dict(known or {}) | self._nodes
        if not isinstance(candidate, Mapping):
            # A parallel group's name in a list stands for every actor of the group.
            names = [m for n in names for m in _members(n, readable)]
            local = list(names)
        for upstream in names:
            if not isinstance(upstream, str) or upstream not in readable:
                raise GraphError("inputs", f"names of declared actors {list(readable)}", upstream)
        if len(set(names)) != len(names):
            raise GraphError("inputs", "each input named once", names)
        # A new actor has no downstream yet, so its input edges cannot close a cycle.
        self._last_id += 1
        node = Node(
            self._last_id,
            name,
            actor,
            source,
            fanout or Fanout(),
            names,
            local,
            job,
            group,
            key,
            schema,
        )
        self._nodes[name] = node
        return node

    def remove(self, names: Sequence[str]) -> None:
        """Forget the actors ``names`` (a dropped job); their ids are never reused."""
        for name in names:
            self._nodes.pop(name, None)

    def connect(self, upstream: str, downstream: str) -> None:
        """Add the edge ``upstream → downstream``.

        Raises:
            GraphError: an unknown actor, an edge into a source, the edge exists already, or
                it would close a cycle (refused here rather than when the runtime starts).
        """
        for end in (upstream, downstream):
            if not isinstance(end, str) or end not in self._nodes:
                raise GraphError("actor", f"one of {list(self._nodes)}", end)
        node = self._nodes[downstream]
        if node.is_source:
            raise GraphError("downstream", "an actor that is not a source", downstream)
        if upstream in node.inputs:
            raise GraphError("edge", "each edge connected once", f"{upstream} -> {downstream}")
        if upstream in node.input_names:
            raise GraphError("edge", "an input name not in use", upstream)
        path = self._path(downstream, upstream)
        if path is not None:
            raise GraphError("graph", "no cycle", " -> ".join([upstream, *path]))
        node.inputs.append(upstream)
        node.input_names.append(upstream)

    def _path(self, start: str, goal: str) -> list[str] | None:
        """A path of edges from ``start`` to ``goal`` (``[start, ..., goal]``), or ``None``."""
        stack, seen = [[start]], {start}
        while stack:
            path = stack.pop()
            if path[-1] == goal:
                return path
            for down in self.downstream_of(path[-1]):
                if down not in seen:
                    seen.add(down)
                    stack.append([*path, down])
        return None

    def reaches(self, upstream: str, downstream: str) -> bool:
        """Whether what ``upstream`` emits reaches ``downstream`` along the graph's edges."""
        return upstream != downstream and self._path(upstream, downstream) is not None

    def downstream_of(self, name: str) -> list[str]:
        """The actors reading ``name``'s output, in declaration order."""
        return [n.name for n in self._nodes.values() if name in n.inputs]

    def validate(self) -> None:
        """Check the graph can run.

        Raises:
            GraphError: no actors, no source, an actor without input, or a cycle.
        """
        if not self._nodes:
            raise GraphError("graph", "at least one actor", "an empty graph")
        if not any(n.is_source for n in self._nodes.values()):
            raise GraphError("graph", "at least one source", "no source")
        for node in self._nodes.values():
            if not node.is_source and not node.inputs:
                raise GraphError("inputs", f"at least one input for actor {node.name!r}", [])
        state: dict[str, int] = {}

        def visit(name: str, path: list[str]) -> None:
            if state.get(name) == 1:
                cycle = [*path[path.index(name) :], name]
                raise GraphError("graph", "no cycle", " -> ".join(cycle))
            if state.get(name) == 2:
                return
            state[name] = 1
            for down in self.downstream_of(name):
                visit(down, [*path, name])
            state[name] = 2

        for name in self._nodes:
            visit(name, [])


def _members(name: object, readable: Mapping[str, Node]) -> list[object]:
    """``name``, or the actors of the parallel group ``name`` (in declaration order)."""
    if not isinstance(name, str) or name in readable:
        return [name]
    members = sorted(
        (node for n, node in readable.items() if node.group == name and n != name),
        key=lambda node: node.actor_id,
    )
    return [node.name for node in members] or [name]
