"""Channels and dispatchers for a set of actors: the whole graph at start, or a joining job.

Every edge is a bounded channel. An upstream's downstream actors are split into *groups*, and
each group has its own dispatcher (fan-out is on the edge): the actors declared alone before
start share one group that follows the upstream's node-level :class:`Fanout` (broadcast unless
told otherwise); a parallel group (``parallelism=N``) is hash-dispatched by its key, or round
robin without one; an actor declared alone in a job added later is a group of its own.
Groups are made per output of the upstream: the readers of a side output (``"win:late"``)
are grouped, and dispatched, apart from the readers of the main output, by the same rules,
and each group's dispatcher is told which output it reads (see
:class:`~barrierflow.channels.outputs.Outputs`).

When the new actors join a running graph, an upstream that already runs gets its new
dispatchers as :class:`~barrierflow.channels.mutation.NewOutput` s, to be attached by the
``Add`` barrier.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from barrierflow.channels.channel import ReceiveChannel, SendChannel, create_channel
from barrierflow.channels.dispatch import (
    BroadcastDispatcher,
    Dispatcher,
    HashDispatcher,
    RoundRobinDispatcher,
)
from barrierflow.channels.messages import Message
from barrierflow.channels.mutation import NewOutput
from barrierflow.channels.outputs import Outputs
from barrierflow.channels.vnode import VnodeBitmap
from barrierflow.runtime.graph import Fanout, Node
from barrierflow.runtime.startup import Edge

__all__ = ["Wiring", "wire"]


@dataclass
class Wiring:
    """What :func:`wire` built."""

    #: Every send end made (closed when the incarnation dies, so parked sends fail).
    channels: list[SendChannel[Message]] = field(default_factory=list)
    #: Source actor id → its inbox.
    inboxes: dict[int, SendChannel[Message]] = field(default_factory=dict)
    #: Actor name → its input name → receiver.
    inputs: dict[str, dict[str, ReceiveChannel[Message]]] = field(default_factory=dict)
    #: New actor name → its outputs.
    outputs: dict[str, Outputs] = field(default_factory=dict)
    #: Running upstream actor id → the outputs it gains (a joining job).
    new_outputs: dict[int, list[NewOutput]] = field(default_factory=dict)
    #: Actor name → the vnodes it owns (hash-dispatched inputs).
    bitmaps: dict[str, VnodeBitmap] = field(default_factory=dict)
    #: Names of actors that are one of several siblings of a hash group (checked at start).
    hash_groups: dict[str, list[str]] = field(default_factory=dict)
    #: Actor name → the columns its hash-dispatched input is keyed by.
    keys: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: Actor name → every actor of its parallel group (itself included), for grouped actors.
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: Every input of a new actor, with its hash key (for the schema checks at start).
    edges: list[Edge] = field(default_factory=list)
    #: Source name → the schema it was declared with (new and running sources).
    schemas: dict[str, pa.Schema] = field(default_factory=dict)


def _dispatcher(
    upstream: Node, group: str | None, members: Sequence[Node], senders: list[SendChannel[Message]]
) -> Dispatcher:
    if group is None:
        fanout = upstream.fanout
    elif members[0].key is not None:
        fanout = Fanout("hash", members[0].key)
    else:
        fanout = Fanout("round_robin" if len(members) > 1 else "broadcast")
    if fanout.kind == "hash":
        return HashDispatcher(senders, VnodeBitmap.split(len(senders)), fanout.key_columns)
    if fanout.kind == "round_robin":
        return RoundRobinDispatcher(senders)
    return BroadcastDispatcher(senders)


def _key_of(upstream: Node, node: Node) -> tuple[str, ...] | None:
    """The columns ``upstream`` hash-dispatches to ``node`` by (as :func:`_dispatcher`)."""
    if node.group is None:
        return upstream.fanout.key_columns if upstream.fanout.kind == "hash" else None
    return node.key


def wire(
    new: Sequence[Node],
    running: Mapping[str, Node],
    *,
    capacity: int,
    rows: int | None,
) -> Wiring:
    """Build the channels into and between the ``new`` actors, and their dispatchers.

    Args:
        new: the actors to wire (every actor at start; a joining job's actors later).
        running: actors already running that ``new`` may read.
        capacity, rows: each channel's bounds (messages, rows).
    """
    wiring = Wiring()
    new_names = {n.name for n in new}
    every = {**running, **{n.name: n for n in new}}
    # (upstream name, output) -> group key -> [(downstream node, sender)]
    fan: dict[tuple[str, str | None], dict[str | None, list[tuple[Node, SendChannel[Message]]]]]
    fan = {}
    for node in new:
        wiring.inputs[node.name] = {}
        if node.is_source:
            tx, rx = create_channel[Message](capacity, rows, name=f"{node.name} inbox")
            wiring.inboxes[node.actor_id] = tx
            wiring.channels.append(tx)
            wiring.inputs[node.name]["inbox"] = rx
        for source, local, output in zip(
            node.inputs, node.input_names, node.input_outputs, strict=True
        ):
            tx, rx = create_channel[Message](capacity, rows, name=f"{source}->{node.name}")
            wiring.channels.append(tx)
            wiring.inputs[node.name][local] = rx
            fan.setdefault((source, output), {}).setdefault(node.group, []).append((node, tx))
            if output is None:  # a side output's schema is not known before it runs
                wiring.edges.append(
                    Edge(source, node.name, _key_of(every[source], node), node.group or node.name)
                )
    built_by: dict[str, list[tuple[Dispatcher, list[int], str | None]]] = {}
    for (upstream_name, output), groups in fan.items():
        upstream = every[upstream_name]
        built = built_by.setdefault(upstream_name, [])
        for group, members in groups.items():
            targets = [m for m, _ in members]
            dispatcher = _dispatcher(upstream, group, targets, [tx for _, tx in members])
            if isinstance(dispatcher, HashDispatcher):
                for target, bitmap in zip(targets, dispatcher.bitmaps, strict=True):
                    wiring.bitmaps.setdefault(target.name, bitmap)
                    wiring.keys.setdefault(target.name, dispatcher.key_columns)
                if len(targets) > 1:
                    names = [t.name for t in targets]
                    for name in names:
                        wiring.hash_groups[name] = names
            built.append((dispatcher, [t.actor_id for t in targets], output))
    for upstream_name, built in built_by.items():
        if upstream_name in new_names:
            wiring.outputs[upstream_name] = Outputs(built)
        else:
            wiring.new_outputs[every[upstream_name].actor_id] = [
                NewOutput(dispatcher, tuple(ids), output) for dispatcher, ids, output in built
            ]
    wiring.schemas = {n.name: n.schema for n in every.values() if n.schema is not None}
    for node in new:
        wiring.outputs.setdefault(node.name, Outputs())
        if node.group is not None:
            wiring.groups[node.name] = tuple(n.name for n in new if n.group == node.group)
    return wiring
