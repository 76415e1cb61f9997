"""One incarnation of a graph: its actors created from their factories, checked together,
started with their contexts and inputs, and its services — at start, after a recovery, and
for each job that joins later."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import anyio
from anyio.abc import TaskGroup

from barrierflow._taskgroups import single_leaf
from barrierflow.channels.channel import SendChannel, create_channel
from barrierflow.channels.endpoints import Receiver
from barrierflow.channels.merge import AlignedMerge
from barrierflow.channels.messages import Message
from barrierflow.runtime._runtime_metrics import ActorTimes
from barrierflow.runtime._wiring import Wiring
from barrierflow.runtime.actor import ActorContext, StreamActor
from barrierflow.runtime.barrier_manager import BarrierManager, InFlightBarrier
from barrierflow.runtime.context import NamedInputs
from barrierflow.runtime.errors import ActorFailedError, BarrierStuckError, GraphError
from barrierflow.runtime.graph import Node
from barrierflow.runtime.job_catalog import JobCatalog
from barrierflow.runtime.metrics import MetricsRegistry
from barrierflow.runtime.service import Service, ServiceContext
from barrierflow.runtime.startup import check_actors, check_schemas
from barrierflow.runtime.state.state_store import StateStore
from barrierflow.runtime.watchdog import diagnose

__all__ = ["Incarnation", "check_wiring", "create_actors"]

# Services get ids after every actor id a graph could use, for ActorFailedError.
_FIRST_SERVICE_ID = 1 << 30


def create_actors(nodes: list[Node]) -> dict[str, StreamActor]:
    """Every actor of ``nodes``, from its factory (before any of them runs, so that they can
    be checked together: see :mod:`.startup`).

    Raises:
        ActorFailedError: a factory raised, or returned something that is not an actor.
    """
    instances: dict[str, StreamActor] = {}
    for node in nodes:
        try:
            actor = node.factory()
            if not isinstance(actor, StreamActor):
                raise GraphError("actor", "a factory returning a StreamActor", type(actor).__name__)
        except Exception as exc:
            raise ActorFailedError(node.name, node.actor_id, exc) from exc
        instances[node.name] = actor
    return instances


def check_wiring(
    instances: dict[str, StreamActor],
    wiring: Wiring,
    services: Mapping[str, Service],
    running: Mapping[str, StreamActor] | None = None,
) -> None:
    """Run the actors' startup checks, then the schema checks of every new input (see
    :mod:`.startup`); the siblings of a parallel writer are the other members of its hash
    group; ``running`` are the actors of the running graph a joining job may read."""
    groups = {name: ["|".join(group)] for name, group in wiring.hash_groups.items()}
    hashed = {key for v in groups.values() for key in v}
    graph = {**(running or {}), **instances}
    check_actors(instances, groups, services, hashed, wiring.keys, wiring.groups, graph)
    check_schemas(wiring.edges, graph, wiring.schemas)


class Incarnation:
    """One build of the graph: its channels, contexts, barrier manager and task groups."""

    def __init__(
        self, store: StateStore, manager: BarrierManager, metrics: MetricsRegistry | None = None
    ) -> None:
        self.store = store
        self.manager = manager
        self.metrics = MetricsRegistry() if metrics is None else metrics
        #: When it was built (``time.perf_counter``): its actors' busy time counts from here.
        self.started_at = time.perf_counter()
        self.catalog = JobCatalog(store)
        self.contexts: dict[str, ActorContext] = {}
        #: Every running actor, by name (what a joining job's startup checks may look at).
        self.instances: dict[str, StreamActor] = {}
        self.inboxes: dict[str, SendChannel[Message]] = {}
        self.channels: list[SendChannel[Message]] = []
        self.ready = anyio.Event()
        #: Every actor finished (stopped, or their inputs ended): the graph runs no more.
        self.finished = False
        self.actors: TaskGroup | None = None
        self.services: TaskGroup | None = None
        #: Job name → the cancel scope of its services (cancelled when the job is dropped).
        #: Each job's services' cancel scopes (one per service: a scope enters one block).
        self.job_scopes: dict[str, list[anyio.CancelScope]] = {}
        #: Actor name → set once its task ended (a dropped job's services outlive its actors).
        self.actor_done: dict[str, anyio.Event] = {}
        #: The aligned merges in front of actors with several inputs, by actor.
        self.merges: dict[str, AlignedMerge] = {}
        #: The channel each of those merges feeds its actor through, by actor: the actor's
        #: own waits for input are there (the merge's, on each input, go on while the actor
        #: works or is blocked on its output).
        self.merged: dict[str, SendChannel[Message]] = {}
        #: Its actors' busy, backpressured and idle seconds as reported so far.
        self.actor_times = ActorTimes()
        self._services_started = 0

    def stuck_error(
        self, nodes: Mapping[str, Node], flight: InFlightBarrier | None = None
    ) -> BarrierStuckError:
        """The error naming who holds ``flight`` (default: the oldest barrier in flight; see
        :mod:`~barrierflow.runtime.watchdog`); ``nodes`` is the graph, for who reads whom."""
        if flight is None:
            flight = self.manager.oldest()
        if flight is None:
            return BarrierStuckError(
                self.manager.current_epoch, 0.0, (), (), "nobody: no barrier could be injected"
            )
        names = {ctx.actor_id: name for name, ctx in self.contexts.items()}
        upstreams = {name: node.inputs for name, node in nodes.items()}
        return diagnose(flight, names, upstreams, (tx.statistics() for tx in self.channels))

    def start_service(self, job: str, name: str, service: Service) -> None:
        """Run ``service`` of ``job`` in the incarnation's service group."""
        assert self.services is not None
        scope = anyio.CancelScope()
        self.job_scopes.setdefault(job, []).append(scope)
        service_id = _FIRST_SERVICE_ID + self._services_started
        self._services_started += 1
        self.services.start_soon(
            _run_service, name, service_id, service, self.store, scope, self.metrics
        )

    def start_actors(
        self,
        nodes: list[Node],
        instances: dict[str, StreamActor],
        wiring: Wiring,
        adopted: dict[str, int],
    ) -> None:
        """Start each actor of ``nodes`` with its context (it blocks on its input until its
        first barrier arrives)."""
        assert self.actors is not None
        for node in nodes:
            actor = self.instances[node.name] = instances[node.name]
            receivers = wiring.inputs[node.name]
            peers = tuple(n.name for n in nodes if n.group is not None and n.group == node.group)
            ctx = ActorContext(
                node.actor_id,
                node.name,
                _input_of(node, actor, receivers, self.actors, self.merges, self.merged),
                wiring.outputs[node.name],
                self.store,
                self.manager,
                job=node.job,
                peers=peers or (node.name,),
                named_inputs=None if actor.aligned_inputs else NamedInputs(receivers),
                vnode_bitmap=wiring.bitmaps.get(node.name),
                adopted_positions=adopted,
                side_outputs=_side_outputs(node, actor),
            )
            self.contexts[node.name] = ctx
            done = self.actor_done[node.name] = anyio.Event()
            self.actors.start_soon(_run_actor, node, actor, ctx, done, name=f"actor {node.name}")


def _side_outputs(node: Node, actor: StreamActor) -> tuple[str, ...]:
    """The side outputs ``actor`` may emit to: those its factory declares (an operator's, a
    StreamActor subclass's), or, for a factory that declares nothing (a plain function, whose
    side outputs no reader could name), those of the class of the actor it made."""
    return type(actor).side_outputs if node.side_outputs is None else node.side_outputs


def _input_of(
    node: Node,
    actor: StreamActor,
    receivers: dict[str, Any],
    group: TaskGroup,
    merges: dict[str, AlignedMerge],
    merged: dict[str, SendChannel[Message]],
) -> Receiver[Message]:
    if len(receivers) == 1 or not actor.aligned_inputs:
        return next(iter(receivers.values()))
    tx, rx = create_channel[Message](16, name=f"{node.name} merged")
    merged[node.name] = tx
    merge = merges[node.name] = AlignedMerge(receivers)
    group.start_soon(merge.run, tx, name=f"merge into {node.name}")
    return rx


async def _run_actor(node: Node, actor: StreamActor, ctx: ActorContext, done: anyio.Event) -> None:
    try:
        await actor.run(ctx)
        # Finished (its input ended, or it stopped): no barrier it has not collected will
        # reach it, and none may wait for it.
        ctx._manager.retire(ctx.actor_id)
    except Exception as raised:
        # An actor's own task group raising one error: log and report that error itself.
        exc = single_leaf(raised)
        ctx.log.error("actor raised", error=repr(exc))
        raise ActorFailedError(node.name, node.actor_id, exc) from exc
    finally:
        ctx.finished = True
        ctx.close_outputs()
        done.set()


async def _run_service(
    name: str,
    service_id: int,
    service: Service,
    store: StateStore,
    scope: anyio.CancelScope,
    metrics: MetricsRegistry,
) -> None:
    ctx = ServiceContext(name, store, metrics=metrics)
    with scope:
        try:
            await service.run(ctx)
        except Exception as raised:
            exc = single_leaf(raised)
            ctx.log.error("service raised", error=repr(exc))
            raise ActorFailedError(name, service_id, exc) from exc
