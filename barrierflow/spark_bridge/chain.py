"""Which actors run inside Spark's tasks: the chain from a feed's source to a sink's writers.

With ``run_on="executors"`` no row of a micro-batch reaches the driver. Each Spark task runs
the actors between the bridge's feed and its sink over its own partition
(:mod:`barrierflow.spark_bridge.task_runtime`), and only the files' manifests come back. For
that to hold the rows of every actor the feed reaches, :func:`plan_chain` reads the declared
graph and accepts exactly one shape: a straight **chain** of partition-local actors from the
feed's source to the sink's writers.

* Every step is **partition-local** (:attr:`~barrierflow.runtime.Placement.PARTITION_LOCAL`:
  ``map_batches``, ``filter_rows``, ``async_map``, a user's actor class that declares it). A
  task sees an arbitrary slice of the stream, which is all such an actor asks for. A global
  actor needs the whole stream. A plain function declares nothing, so it counts as global
  (see :mod:`barrierflow.runtime.placement`).
* Except **one keyed step**, an ``aggregate`` or a ``reduce``: the micro-batch is then
  repartitioned by barrierflow's vnodes of the step's key before the tasks run, so each task
  holds every row of its keys, and the step's state lives on a shared directory by vnode
  (:mod:`barrierflow.spark_bridge.task_state`). For the repartition to send each row where
  its key's state is, the key must be a column of the feed, and only ``filter_rows`` steps
  (which change no value) may come before the keyed one; a second keyed step would need a
  second shuffle. Other keyed actors are refused: a window's watermark is the stream's, not
  a task's, and a user's keyed actor may keep state the task cannot carry over.
* **No branch.** Nothing else may read what the feed or a step emits, on its main output or a
  side output (another sink, a print, a dead-letter reader) — except a job that follows a
  keyed step's shared view (``bridge.shared_view(step).backfill()``), which reads the step's
  state store, not its rows. Such an actor would run on the
  driver and get no rows, because none cross: data lost without a word. So it is refused. Run
  it in a query of its own, or run this one with ``run_on="driver"``. For the same reason a
  step reads nothing besides the previous step.
* A parallel declaration (``parallelism=4``) is one step. On the executors its parallelism is
  the number of Spark tasks.

Everything is checked before the query starts, and again for each micro-batch, so a job that
joins later and reads a step is refused at the next batch. The error is an
:class:`~barrierflow.errors.ExecutorPlacementError` naming the actor and why.

On the driver the chain's actors still run as declared, but they see only barriers and the
batch's committable, which they pass on to the sink's writers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import final

from barrierflow.operators import Operator
from barrierflow.runtime.actor import StreamActor
from barrierflow.runtime.graph import Node
from barrierflow.runtime.placement import Placement, declared_placement
from barrierflow.spark_bridge.errors import ExecutorPlacementError
from barrierflow.spark_bridge.shared_view import Follow

__all__ = ["ChainStep", "plan_chain"]


@final
@dataclass(frozen=True, slots=True)
class ChainStep:
    """One actor of a chain run in Spark's tasks.

    Attributes:
        name: the actor's name on the driver (a parallel group's name), the name its counters
            carry.
        factory: the factory it was declared with (an operator, an actor class), shipped to
            the tasks.
        key: the key columns of the keyed step (``None``: a partition-local one).
    """

    name: str
    factory: Callable[[], StreamActor]
    key: tuple[str, ...] | None = None


_RUN_ON_DRIVER = "or run the pipeline with run_on='driver'"


#: The keyed operators whose state a Spark task loads and stages (all of it in a KeyedState).
KEYED_KINDS = ("aggregate", "reduce")


def _why_not(node: Node) -> str | None:
    """Why ``node``'s actor cannot run in a Spark task, or ``None`` if it can."""
    placement = declared_placement(node.declared_by)
    if placement is Placement.PARTITION_LOCAL:
        return None
    if placement is Placement.KEYED:
        if _kind(node) in KEYED_KINDS:
            return None
        return (
            "it is keyed, and of the keyed actors only aggregate and reduce run in Spark's "
            "tasks (a window's watermark is the whole stream's, and another keyed actor may "
            "keep state a task cannot carry over); " + _RUN_ON_DRIVER
        )
    if placement is Placement.GLOBAL:
        return (
            "it is global (one instance sees the whole stream), and a Spark task sees one "
            "partition; declare placement = Placement.PARTITION_LOCAL on its class if any "
            "instance may take any row, " + _RUN_ON_DRIVER
        )
    return (
        "its factory is a plain function, which declares no placement; declare it with its "
        "StreamActor class (placement = Placement.PARTITION_LOCAL) or an operator, "
        + _RUN_ON_DRIVER
    )


def _kind(node: Node) -> str | None:
    """The operator kind ``node`` was declared with (``None``: not an operator)."""
    declared = node.declared_by
    return declared.kind if isinstance(declared, Operator) else None


def _keyed_step(
    name: str, node: Node, before: Sequence[ChainStep], columns: Sequence[str] | None
) -> ChainStep:
    """The chain's keyed step ``name`` (after the steps ``before``; ``columns``: the feed's).

    Raises:
        ExecutorPlacementError: it cannot be repartitioned for (see the module).
    """
    declared = node.declared_by
    assert isinstance(declared, Operator)  # aggregate or reduce (KEYED_KINDS)
    assert declared.key is not None
    if any(step.key is not None for step in before):
        raise ExecutorPlacementError(
            name,
            "it is a second keyed step, and the micro-batch is repartitioned by one key "
            "before the tasks run; " + _RUN_ON_DRIVER,
        )
    changers = [s.name for s in before if not _is_filter(s.factory)]
    if changers:
        raise ExecutorPlacementError(
            name,
            f"it is keyed and comes after {changers}, which may change the rows the "
            "micro-batch is repartitioned by; only filter_rows may come before a keyed step "
            "in Spark's tasks, " + _RUN_ON_DRIVER,
        )
    missing = [k for k in declared.key if columns is not None and k not in columns]
    if missing:
        raise ExecutorPlacementError(
            name,
            f"its key {missing} is not a column of the feed, and the micro-batch is "
            "repartitioned by the feed's columns; " + _RUN_ON_DRIVER,
        )
    return ChainStep(name, declared, declared.key)


def _is_filter(factory: Callable[[], StreamActor]) -> bool:
    return isinstance(factory, Operator) and factory.kind == "filter"


def plan_chain(
    nodes: Mapping[str, Node],
    source: str,
    sink: str,
    writers: Sequence[str],
    columns: Sequence[str] | None = None,
) -> tuple[ChainStep, ...]:
    """The steps between ``source`` (the feed's source actor) and ``writers`` (sink
    ``sink``'s writers) of the graph ``nodes``, in order, each with the factory to run in a
    Spark task (see the module); ``columns`` are the feed's (``None``: not checked).

    Raises:
        ExecutorPlacementError: the graph is not a chain of partition-local actors, with at
            most one keyed step, from ``source`` to the writers (names the first actor that
            breaks it, and why).
    """
    # A unit of the chain: a parallel group or a lone actor, told apart even when a group is
    # named like an actor (a sink "events" whose writers are events.0, events.1, and a source
    # "events"); its first element is the name errors and steps use.
    group = {name: _unit(node) for name, node in nodes.items()}
    sink_group = {group[w] for w in writers if w in group}
    steps: list[ChainStep] = []
    current = group[source]
    while current not in sink_group:
        readers: dict[_Unit, set[str | None]] = {}
        for node in nodes.values():
            if group[node.name] == current:
                continue
            for upstream, output in zip(node.inputs, node.input_outputs, strict=True):
                if group.get(upstream) == current:
                    readers.setdefault(group[node.name], set()).add(output)
        if not readers:
            raise ExecutorPlacementError(
                current[0], f"it leads to no writer of sink {sink!r}; the sink must read the chain"
            )
        onward = [g for g in readers if g in sink_group or _leads_to(nodes, group, g, sink_group)]
        off = [g for g in readers if g not in onward[:1] and not _follows(nodes, group, g)]
        if off:
            raise ExecutorPlacementError(
                off[0][0],
                f"it reads {current[0]!r}, whose rows run in Spark's tasks to sink {sink!r} and "
                "never reach the driver, so it would get none; give it a query of its own "
                "(another bridge), " + _RUN_ON_DRIVER,
            )
        following = onward[0]
        if readers[following] != {None}:
            raise ExecutorPlacementError(
                following[0],
                f"it reads a side output of {current[0]!r}; only main outputs chain in Spark's "
                "tasks, " + _RUN_ON_DRIVER,
            )
        members = [n for n in nodes.values() if group[n.name] == following]
        others = sorted({u for n in members for u in n.inputs if group.get(u) != current})
        if others:
            raise ExecutorPlacementError(
                following[0],
                f"it reads {others} besides {current[0]!r}, and a Spark task holds one chain's "
                "rows; " + _RUN_ON_DRIVER,
            )
        current = following
        if current in sink_group:
            break
        why = _why_not(members[0])
        if why is not None:
            raise ExecutorPlacementError(current[0], why)
        declared = members[0].declared_by
        assert callable(declared)  # a node's factory is callable (checked when declared)
        if declared_placement(declared) is Placement.KEYED:
            steps.append(_keyed_step(current[0], members[0], steps, columns))
        else:
            steps.append(ChainStep(current[0], declared))
    return tuple(steps)


#: A unit of the chain (see :func:`plan_chain`): its name, and whether it is a parallel group.
_Unit = tuple[str, bool]


def _unit(node: Node) -> _Unit:
    return (node.group, True) if node.group else (node.name, False)


def _follows(nodes: Mapping[str, Node], group: Mapping[str, _Unit], reader: _Unit) -> bool:
    """Whether group ``reader`` follows a shared view (``SharedView.backfill()``): it reads
    the view's store, not the rows, so it is no branch."""
    return all(isinstance(n.declared_by, Follow) for n in nodes.values() if group[n.name] == reader)


def _leads_to(
    nodes: Mapping[str, Node], group: Mapping[str, _Unit], start: _Unit, goal: set[_Unit]
) -> bool:
    """Whether group ``start``'s output reaches one of the groups ``goal``."""
    frontier, seen = [start], {start}
    while frontier:
        here = frontier.pop()
        for node in nodes.values():
            there = group[node.name]
            if there in seen or not any(group.get(u) == here for u in node.inputs):
                continue
            if there in goal:
                return True
            seen.add(there)
            frontier.append(there)
    return False
