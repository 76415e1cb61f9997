"""Mutations: commands that ride on a barrier and take effect at its epoch boundary.

A mutation is applied by every actor it names exactly between the data of the epoch the
barrier closes and the data of the epoch it opens, which is what makes reconfiguration
consistent across a parallel graph. Each is a small frozen dataclass; mappings are copied into
read-only views on construction so a barrier, once sent, never changes under its receivers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar, final

from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.channels.output_names import check_output_name
from barrierflow.channels.vnode import VnodeBitmap, owners_from_mapping

__all__ = [
    "Split",
    "NewOutput",
    "Add",
    "Pause",
    "Resume",
    "Throttle",
    "SourceChangeSplit",
    "Update",
    "Stop",
    "Mutation",
]

V = TypeVar("V")


def _frozen_mapping(argument: str, value: Mapping[int, V]) -> Mapping[int, V]:
    if not isinstance(value, Mapping):
        raise InvalidArgumentError(argument, "a mapping of actor id to value", value)
    for key in value:
        if type(key) is not int or key < 0:
            raise InvalidArgumentError(argument, "non-negative int actor ids as keys", key)
    return MappingProxyType(dict(value))


def _split_assignment(
    argument: str, value: Mapping[int, Iterable[Split]]
) -> Mapping[int, tuple[Split, ...]]:
    checked: dict[int, tuple[Split, ...]] = {}
    for actor, splits in _frozen_mapping(argument, value).items():
        candidate: object = splits
        if isinstance(candidate, Split | str) or not isinstance(candidate, Iterable):
            raise InvalidArgumentError(argument, "a sequence of Splits per actor", splits)
        items = tuple(splits)
        for split in items:
            if not isinstance(split, Split):
                raise InvalidArgumentError(argument, "Split values", split)
        checked[actor] = items
    return MappingProxyType(checked)


def _actor_set(argument: str, value: Iterable[int]) -> frozenset[int]:
    """A frozen set of actor ids; a str (an iterable of characters) is refused."""
    candidate: object = value
    if isinstance(candidate, str | bytes | Mapping) or not isinstance(candidate, Iterable):
        raise InvalidArgumentError(argument, "a set of actor ids", value)
    items = list(value)
    for actor in items:  # checked before hashing: an unhashable id is a typed error too
        if type(actor) is not int or actor < 0:
            raise InvalidArgumentError(argument, "non-negative int actor ids", actor)
    return frozenset(items)


@final
@dataclass(frozen=True, slots=True)
class Split:
    """A partition of an external source and, optionally, where to start reading it.

    Attributes:
        split_id: the partition's stable name (``"orders-3"``).
        offset: the offset to start *after* (``None``: from the beginning).
    """

    split_id: str
    offset: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.split_id, str) or not self.split_id:
            raise InvalidArgumentError("split_id", "a non-empty str", self.split_id)
        # Offsets are stored as signed 64-bit integers: a larger one would fail at commit.
        if self.offset is not None and (
            type(self.offset) is not int or not -1 <= self.offset < 1 << 63
        ):
            raise InvalidArgumentError("offset", "None or an int in -1..2**63-1", self.offset)


@final
@dataclass(frozen=True, slots=True)
class NewOutput:
    """An output an upstream actor gains at an :class:`Add` barrier: a dispatcher (any object
    with ``async dispatch(message)`` and ``close()``, normally a
    :class:`~barrierflow.channels.dispatch.Dispatcher`) feeding the new ``actors``, in the
    dispatcher's output order, with the upstream's ``output`` they read (``None``: its main
    output; else a side output's name: see :mod:`barrierflow.channels.outputs`).

    The upstream sends the ``Add`` barrier itself into the new output after its old outputs:
    everything before the barrier went to the old outputs only, and the barrier is the new
    actors' first.
    """

    dispatcher: Any
    actors: tuple[int, ...]
    output: str | None = None

    def __post_init__(self) -> None:
        if not callable(getattr(self.dispatcher, "dispatch", None)) or not callable(
            getattr(self.dispatcher, "close", None)
        ):
            raise InvalidArgumentError(
                "NewOutput.dispatcher", "a dispatcher with dispatch() and close()", self.dispatcher
            )
        actors = _actor_set("NewOutput.actors", self.actors)
        if not actors:
            raise InvalidArgumentError("NewOutput.actors", "at least one actor id", self.actors)
        object.__setattr__(self, "actors", tuple(self.actors))
        check_output_name("NewOutput.output", self.output)


@final
@dataclass(frozen=True, slots=True)
class Add:
    """New actors start: their initial split assignment, whether to start paused, and (for a
    job joining a running graph) the actors added and the outputs their upstreams gain.

    Attributes:
        splits: initial splits per new source actor.
        pause: whether new actors start paused.
        added_actors: the ids of the actors this barrier starts (their first barrier).
        outputs: upstream actor id → the outputs it gains at this barrier.
    """

    splits: Mapping[int, tuple[Split, ...]] = field(default_factory=dict)
    pause: bool = False
    added_actors: frozenset[int] = frozenset()
    outputs: Mapping[int, tuple[NewOutput, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "splits", _split_assignment("Add.splits", self.splits))
        if type(self.pause) is not bool:
            raise InvalidArgumentError("Add.pause", "a bool", self.pause)
        object.__setattr__(self, "added_actors", _actor_set("Add.added_actors", self.added_actors))
        outputs: dict[int, tuple[NewOutput, ...]] = {}
        for actor, new in _frozen_mapping("Add.outputs", self.outputs).items():
            candidate: object = new
            if not isinstance(candidate, list | tuple) or not all(
                isinstance(o, NewOutput) for o in new
            ):
                raise InvalidArgumentError("Add.outputs", "a tuple of NewOutput per actor", new)
            outputs[actor] = tuple(new)
        object.__setattr__(self, "outputs", MappingProxyType(outputs))


@final
@dataclass(frozen=True, slots=True)
class Pause:
    """Every source stops reading until a :class:`Resume`; barriers keep flowing."""


@final
@dataclass(frozen=True, slots=True)
class Resume:
    """Sources paused by :class:`Pause` (or paused on startup) read again."""


@final
@dataclass(frozen=True, slots=True)
class Throttle:
    """New rate limits, in rows per second per actor (``None``: unlimited; 0: paused).

    A rate is a finite number ≥ 0: NaN is refused, and so is infinity — "unlimited" is spelled
    ``None``.
    """

    rates: Mapping[int, float | None]

    def __post_init__(self) -> None:
        rates = _frozen_mapping("Throttle.rates", self.rates)
        for rate in rates.values():
            check_rate("Throttle.rates", rate)
        object.__setattr__(self, "rates", rates)


def check_rate(argument: str, rate: object) -> None:
    """``rate`` is a rate limit: ``None`` (unlimited) or a finite number of rows per second
    >= 0 (0: paused) — what ``Throttle`` carries and a rate-limited actor is built with.

    Raises:
        InvalidArgumentError: anything else (NaN and infinity too), naming ``argument``.
    """
    if rate is not None and (
        isinstance(rate, bool)
        or not isinstance(rate, int | float)
        or not 0 <= rate < math.inf  # also refuses NaN
    ):
        raise InvalidArgumentError(argument, "None or a finite rate >= 0 (rows per second)", rate)


@final
@dataclass(frozen=True, slots=True)
class SourceChangeSplit:
    """A new split assignment for source actors (splits discovered, moved or removed)."""

    splits: Mapping[int, tuple[Split, ...]]

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "splits", _split_assignment("SourceChangeSplit.splits", self.splits)
        )


@final
@dataclass(frozen=True, slots=True)
class Update:
    """Re-scaling: new splits and vnode bitmaps for some actors, and actors that go away."""

    splits: Mapping[int, tuple[Split, ...]] = field(default_factory=dict)
    vnode_bitmaps: Mapping[int, VnodeBitmap] = field(default_factory=dict)
    dropped_actors: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "splits", _split_assignment("Update.splits", self.splits))
        bitmaps = owners_from_mapping(_frozen_mapping("Update.vnode_bitmaps", self.vnode_bitmaps))
        object.__setattr__(self, "vnode_bitmaps", MappingProxyType(bitmaps))
        object.__setattr__(
            self, "dropped_actors", _actor_set("Update.dropped_actors", self.dropped_actors)
        )


@final
@dataclass(frozen=True, slots=True)
class Stop:
    """These actors finish after passing this barrier downstream."""

    actors: frozenset[int]

    def __post_init__(self) -> None:
        object.__setattr__(self, "actors", _actor_set("Stop.actors", self.actors))


Mutation = Add | Pause | Resume | Throttle | SourceChangeSplit | Update | Stop
MUTATION_TYPES: tuple[type[Any], ...] = (
    Add,
    Pause,
    Resume,
    Throttle,
    SourceChangeSplit,
    Update,
    Stop,
)
