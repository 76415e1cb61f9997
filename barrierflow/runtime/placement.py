"""What an actor needs of the rows it is given — its *placement* — and the side outputs it
declares, both known from its factory before anything runs.

Three placements, after RisingWave's distributions and Flink's keyed / non-keyed streams:

* :attr:`Placement.PARTITION_LOCAL` — any instance can take any row (a map, a filter, an async
  enrichment, a writer of an append-only table). Parallel instances are fed **round robin**,
  and the next step may run them inside Spark's tasks.
* :attr:`Placement.KEYED` — state by key, partitioned by vnode: every row must reach the
  instance that owns its key's vnode (an aggregate, a window, a materialized view). Parallel
  instances are fed by **hash** of the key (a declaration of several instances without a key
  the operator names is refused).
* :attr:`Placement.GLOBAL` — the actor sees the whole stream in one instance (a user's actor
  whose rules are unknown). It is the default of :class:`~barrierflow.runtime.actor.
  StreamActor`: an actor that says nothing is never split.

The declaration is checked when ``add_actor`` is called (``parallelism=N`` of a global actor is
refused there, a keyed one gets its hash key), not when the graph starts. A factory that is a
plain function or a lambda declares nothing: it is taken as the user wrote it (``parallelism``
and ``key`` as given) and counts as global wherever a placement is needed.
"""

from __future__ import annotations

import enum
from typing import Protocol, runtime_checkable

__all__ = [
    "DeclaresPlacement",
    "Placement",
    "declared_key",
    "declared_placement",
    "declared_side_outputs",
]


class Placement(enum.StrEnum):
    """What an actor needs of the rows it is given (see the module)."""

    PARTITION_LOCAL = "partition_local"
    KEYED = "keyed"
    GLOBAL = "global"


@runtime_checkable
class DeclaresPlacement(Protocol):
    """A factory that says what its actors need: an operator (:mod:`barrierflow.operators`),
    or a :class:`~barrierflow.runtime.actor.StreamActor` class (its class attributes)."""

    #: What the actors need of their rows.
    placement: Placement
    #: The key columns of a keyed factory (``None`` otherwise).
    key: tuple[str, ...] | None
    #: The side outputs its actors emit to besides the main one (``ctx.emit(..., output=)``).
    side_outputs: tuple[str, ...]


def declared_placement(factory: object) -> Placement | None:
    """The placement ``factory`` declares (a :class:`StreamActor` subclass's ``placement``,
    an operator's), else ``None``: a plain callable declares nothing."""
    return factory.placement if isinstance(factory, DeclaresPlacement) else None


def declared_key(factory: object) -> tuple[str, ...] | None:
    """The key columns a keyed factory declares (an operator's ``key``), else ``None``."""
    return factory.key if isinstance(factory, DeclaresPlacement) else None


def declared_side_outputs(factory: object) -> tuple[str, ...] | None:
    """The side outputs ``factory`` declares (a :class:`StreamActor` subclass's or an
    operator's ``side_outputs``), else ``None`` (declares nothing)."""
    return factory.side_outputs if isinstance(factory, DeclaresPlacement) else None
