"""The graph a runtime runs: named actors, their inputs, and how each fans out.

Declared before the runtime starts, validated when it starts: every non-source actor needs an
input, an edge is declared once, and the graph has no cycle. Each edge becomes a bounded
channel; an actor with several inputs reads them through an aligned merge; an actor with
several outputs writes them through its dispatcher (broadcast unless told otherwise).

**Side outputs.** Besides its main output an actor may emit to side outputs its factory
declares (a :class:`StreamActor` subclass's ``side_outputs``, an operator's: see
:func:`~barrierflow.runtime.placement.declared_side_outputs`), with
``await ctx.emit(chunk, output="late")``. A downstream reads one by naming it in its inputs as
``"<actor>:<output>"`` (``inputs=["win:late"]``, in a mapping of named inputs, or with a
parallel group's name, ``"agg:late"`` standing for each member's side output). An actor may
read both the main and a side output of one upstream. So that the syntax is unambiguous, no
actor's name holds a ``":"``. Everything is checked when the reader is declared: a side output
the upstream's factory does not declare is refused, and so is any side output of an upstream
whose factory declares nothing (a plain function or a lambda, whose actors' class is not known
before it is called): declare ``side_outputs`` on the actor class and pass the class, or use
an operator. A side-output edge is an edge like any other for the cycle check and
:meth:`Graph.reaches`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import final

import pyarrow as pa

from barrierflow.channels.output_names import SEPARATOR
from barrierflow.runtime.actor import StreamActor
from barrierflow.runtime.context import DEFAULT_JOB
from barrierflow.runtime.errors import GraphError
from barrierflow.runtime.placement import declared_side_outputs

__all__ = ["DEFAULT_JOB", "Fanout", "Graph", "Node", "split_input"]


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
        inputs: the upstream actors' names, in order (an upstream whose main and side output
            are both read appears twice).
        input_names: the actor's own name for each input (``inputs[i]`` is read as
            ``input_names[i]``; the upstream's name — ``"win:late"`` for a side output —
            unless the actor named it).
        input_outputs: the upstream's output each input reads (``None``: its main output,
            else a side output's name).
        side_outputs: the side outputs the actor's factory declares (``None``: it declares
            nothing, being a plain function).
        job: the job the actor belongs to.
        group: the parallel group (all actors of one ``parallelism=N`` declaration), or
            ``None`` for an actor declared alone before start (those share their upstream's
            node-level ``fanout``).
        key: the columns a parallel group is hash-dispatched by (``None``: round robin).
        schema: the schema a source was declared to emit (``None``: not declared).
        declared_by: the factory the actor was declared with (a parallel instance's
            ``factory`` wraps it): what says its placement and side outputs, and what the
            Spark bridge ships to the executors to run it there.
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
    input_outputs: list[str | None] = field(default_factory=list)
    side_outputs: tuple[str, ...] | None = None
    declared_by: object = None

    def __post_init__(self) -> None:
        if len(self.input_outputs) < len(self.inputs):
            # Built with inputs only: every one reads its upstream's main output.
            self.input_outputs += [None] * (len(self.inputs) - len(self.input_outputs))


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
        declared_by: object = None,
    ) -> Node:
        """Declare an actor from its factory (called at every (re)start of the graph).

        All or nothing: every argument is checked before the graph changes, so a refused
        declaration leaves no trace and its name can be used again. ``inputs`` is a list or
        tuple of declared actors' names, or a mapping of the actor's own input name to an
        upstream actor (named inputs); a str is refused (it is a sequence of one-letter names).
        An upstream is read as ``"<actor>:<output>"`` for one of its side outputs (see the
        module).

        Args:
            known: actors that may be read besides this graph's (a job's upstreams in the
                running graph).
            schema: the schema a source emits, if declared.
            declared_by: the factory whose declaration (side outputs) counts, when ``actor``
                wraps it (default: ``actor``).

        Raises:
            GraphError: a bad or duplicate name, or one holding ``":"``; a side output the
                upstream's factory does not declare, or one of an upstream whose factory
                declares nothing; an actor instance or anything else that is not
                a factory (an instance would be reused across restarts with its in-memory
                state); ``source`` not a bool, ``fanout`` not a Fanout, ``schema`` not a
                schema (or given for an actor that is not a source), ``inputs`` not a list,
                tuple or mapping of names, an input named twice or not declared, or a source
                with inputs.
        """
        if not isinstance(name, str) or not name:
            raise GraphError("name", "a non-empty str", name)
        if SEPARATOR in name:
            raise GraphError(
                "name", "a name without ':' (it separates an actor and its side output)", name
            )
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
            # A parallel group's name in a list stands for every actor of the group (and
            # ``"group:late"`` for each one's side output).
            names = [
                _join(m, output)
                for n in names
                for upstream, output in [split_input(n)]
                for m in _members(upstream, readable)
            ]
            local = list(names)
        reads: list[tuple[str, str | None]] = []
        for ref in names:
            upstream, output = split_input(ref)
            if not isinstance(upstream, str) or upstream not in readable:
                raise GraphError("inputs", f"names of declared actors {list(readable)}", ref)
            _check_side_output(readable[upstream], output, ref)
            reads.append((upstream, output))
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
            [upstream for upstream, _ in reads],
            local,
            job,
            group,
            key,
            schema,
            [output for _, output in reads],
            declared_side_outputs(actor if declared_by is None else declared_by),
            actor if declared_by is None else declared_by,
        )
        self._nodes[name] = node
        return node

    def remove(self, names: Sequence[str]) -> None:
        """Forget the actors ``names`` (a dropped job); their ids are never reused."""
        for name in names:
            self._nodes.pop(name, None)

    def connect(self, upstream: str, downstream: str) -> None:
        """Add the edge ``upstream → downstream`` (``upstream`` may be ``"<actor>:<output>"``
        for a side output; the input is named as ``upstream`` is written).

        Raises:
            GraphError: an unknown actor or side output (as :meth:`add`), an edge into a
                source, the edge exists already, or it would close a cycle (refused here
                rather than when the runtime starts).
        """
        source, output = split_input(upstream)
        for end in (source, downstream):
            if not isinstance(end, str) or end not in self._nodes:
                raise GraphError("actor", f"one of {list(self._nodes)}", end)
        assert isinstance(source, str)
        _check_side_output(self._nodes[source], output, upstream)
        node = self._nodes[downstream]
        if node.is_source:
            raise GraphError("downstream", "an actor that is not a source", downstream)
        if (source, output) in zip(node.inputs, node.input_outputs, strict=True):
            raise GraphError("edge", "each edge connected once", f"{upstream} -> {downstream}")
        if upstream in node.input_names:
            raise GraphError("edge", "an input name not in use", upstream)
        path = self._path(downstream, source)
        if path is not None:
            raise GraphError("graph", "no cycle", " -> ".join([upstream, *path]))
        node.inputs.append(source)
        node.input_names.append(upstream)
        node.input_outputs.append(output)

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
        """The actors reading ``name``'s main or side outputs, in declaration order."""
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


def split_input(ref: object) -> tuple[object, str | None]:
    """``"<actor>:<output>"`` as ``(actor, output)``; a plain name reads the main output
    (``None``). Anything but a str is returned as is, for the caller to refuse."""
    if not isinstance(ref, str):
        return ref, None
    upstream, separator, output = ref.partition(SEPARATOR)
    return upstream, output if separator else None


def _join(upstream: object, output: str | None) -> object:
    """The reference to ``upstream``'s ``output`` (the inverse of :func:`split_input`)."""
    return upstream if output is None else f"{upstream}{SEPARATOR}{output}"


def _check_side_output(upstream: Node, output: str | None, ref: object) -> None:
    """Refuse reading ``output`` of ``upstream`` unless its factory declares it (``ref`` is
    the input as written).

    Raises:
        GraphError: ``output`` is empty or holds ``":"``, ``upstream``'s factory declares no
            side output at all (it is a plain function), or not this one.
    """
    if output is None:
        return
    declared = upstream.side_outputs
    if not output or SEPARATOR in output:
        raise GraphError("inputs", "'<actor>:<output>' naming one side output", ref)
    if declared is None:
        raise GraphError(
            "inputs",
            f"a side output of an actor whose factory declares it ({upstream.name!r} is made "
            "by a plain function: declare side_outputs on the actor class and pass the class, "
            "or use an operator)",
            ref,
        )
    if output not in declared:
        raise GraphError(
            "inputs", f"a side output {upstream.name!r} declares {list(declared)}", ref
        )
