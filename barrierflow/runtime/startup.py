"""What the runtime asks of a graph's actors before it starts them.

Every incarnation of a graph creates all its actors first (calling their factories), then
asks them two things before any of them runs, so that a mistake is refused at start instead of
hanging or losing rows later:

1. **Does the graph suit you?** An actor implementing :class:`StartupCheck` gets a
   :class:`StartupContext` — the runtime's services, the actors that share its inputs — and
   raises a typed error if something it needs is missing (a coordinated sink writer whose
   coordinator is not a service of the runtime, or whose parallel siblings have none).
2. **What does your sink already hold?** Only when the state store is empty (nothing ever
   committed): an actor implementing
   :class:`~barrierflow.runtime.positions.SinkCommitsReader` says what its sink committed. A
   sink that holds commits next to an empty store means the store was lost or replaced; the
   upstream would replay rows the sink has. That is refused with
   :class:`~barrierflow.errors.SinkStateMismatchError`, unless the runtime was configured with
   ``adopt_sink_positions=True``: then the positions recorded in the sinks are handed to every
   actor as ``ctx.adopted_positions``, and sources skip what they cover. With several sinks the
   **smallest** position of each key is adopted: a sink that holds more than that skips the
   replayed epochs it already has (see :func:`~barrierflow.runtime.positions.
   epoch_already_held`), while adopting the largest would lose rows for the sink that holds
   less.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, final, runtime_checkable

import structlog

from barrierflow.runtime.errors import SinkStateMismatchError
from barrierflow.runtime.positions import SinkCommits, SinkCommitsReader

__all__ = ["StartupCheck", "StartupContext", "adopt_sink_positions", "check_actors"]


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


async def adopt_sink_positions(
    actors: Mapping[str, object], state_path: str, *, adopt: bool
) -> dict[str, int]:
    """On an empty store: refuse, or adopt, what the sinks already hold (module docstring).

    Returns:
        The adopted positions (empty when no sink holds commits).

    Raises:
        SinkStateMismatchError: a sink holds commits and ``adopt`` is false.
    """
    found: list[SinkCommits] = []
    for actor in actors.values():
        if isinstance(actor, SinkCommitsReader):
            commits = await actor.sink_commits()
            if commits is not None:
                found.append(commits)
    if not found:
        return {}
    if not adopt:
        first = found[0]
        raise SinkStateMismatchError(first.sink, state_path, first.epoch, first.positions)
    adopted: dict[str, int] = {}
    for commits in found:
        for key, value in commits.positions.items():
            adopted[key] = min(value, adopted.get(key, value))
    structlog.get_logger("barrierflow.runtime").warning(
        "empty state store: adopting the positions recorded in the sinks",
        sinks=[commits.sink for commits in found],
        positions=adopted,
    )
    return adopted
