"""Barriers: the markers that cut a stream into epochs and carry mutations.

Every actor passes each barrier downstream after the data of the epoch it closes and before
the data of the epoch it opens. A CHECKPOINT barrier also asks every actor to make its state
durable up to ``epoch.prev``, the epoch it closes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import final

from barrierflow.channels._enum import TypedEnumType
from barrierflow.channels.epoch import EpochPair
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.channels.mutation import (
    MUTATION_TYPES,
    Add,
    Mutation,
    NewOutput,
    Pause,
    Resume,
    SourceChangeSplit,
    Split,
    Stop,
    Throttle,
    Update,
)
from barrierflow.channels.vnode import VnodeBitmap

__all__ = ["BarrierKind", "Barrier"]


class BarrierKind(enum.Enum, metaclass=TypedEnumType):
    """What a barrier asks of the actors it passes (``BarrierKind("x")`` raises
    :class:`~barrierflow.errors.InvalidArgumentError`)."""

    #: The first barrier an actor sees after (re)start; carries its initial configuration.
    INITIAL = "initial"
    #: An ordinary epoch boundary.
    BARRIER = "barrier"
    #: An epoch boundary after which state is made durable.
    CHECKPOINT = "checkpoint"


def _check_actor_id(actor_id: object) -> None:
    # Asked once per barrier per actor: an isinstance check, and a typed error instead of
    # "unhashable type" from the mutation's mapping.
    if type(actor_id) is not int or actor_id < 0:
        raise InvalidArgumentError("actor_id", "a non-negative int actor id", actor_id)


@final
@dataclass(frozen=True, slots=True)
class Barrier:
    """An epoch boundary, with an optional mutation applied at it.

    Raises:
        InvalidArgumentError: ``epoch`` is not an :class:`EpochPair`, ``kind`` not a
            :class:`BarrierKind`, or ``mutation`` not one of the mutation classes.
    """

    epoch: EpochPair
    kind: BarrierKind = BarrierKind.BARRIER
    mutation: Mutation | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.epoch, EpochPair):
            raise InvalidArgumentError("Barrier.epoch", "an EpochPair", self.epoch)
        if not isinstance(self.kind, BarrierKind):
            raise InvalidArgumentError("Barrier.kind", "a BarrierKind", self.kind)
        if self.mutation is not None and not isinstance(self.mutation, MUTATION_TYPES):
            raise InvalidArgumentError("Barrier.mutation", "None or a mutation", self.mutation)

    @property
    def is_checkpoint(self) -> bool:
        """Whether this barrier commits a checkpoint: state up to ``epoch.prev`` becomes durable
        once every actor collected it. Only CHECKPOINT barriers do; the INITIAL barrier only
        anchors a graph's first epoch at the committed one (there is nothing new to commit)."""
        return self.kind is BarrierKind.CHECKPOINT

    def with_mutation(self, mutation: Mutation | None) -> Barrier:
        """The same boundary carrying ``mutation`` instead.

        Raises:
            InvalidArgumentError: ``mutation`` is neither ``None`` nor a mutation.
        """
        return Barrier(self.epoch, self.kind, mutation)

    # The questions actors ask of a barrier. Each refuses an ``actor_id`` that is not a
    # non-negative int with InvalidArgumentError.

    def initial_splits(self, actor_id: int) -> tuple[Split, ...] | None:
        """The splits assigned to ``actor_id`` when it starts (``Add``), or ``None``."""
        _check_actor_id(actor_id)
        if isinstance(self.mutation, Add):
            return self.mutation.splits.get(actor_id)
        return None

    def new_outputs(self, actor_id: int) -> tuple[NewOutput, ...]:
        """The outputs ``actor_id`` gains at this barrier (an ``Add`` of a joining job)."""
        _check_actor_id(actor_id)
        if isinstance(self.mutation, Add):
            return self.mutation.outputs.get(actor_id, ())
        return ()

    def stopped_actors(self) -> frozenset[int]:
        """Every actor that finishes at this barrier (``Stop``, or dropped by ``Update``)."""
        if isinstance(self.mutation, Stop):
            return self.mutation.actors
        if isinstance(self.mutation, Update):
            return self.mutation.dropped_actors
        return frozenset()

    def is_pause_on_startup(self) -> bool:
        """Whether newly added actors start paused."""
        return isinstance(self.mutation, Add) and self.mutation.pause

    def is_pause(self) -> bool:
        """Whether this barrier pauses sources."""
        return isinstance(self.mutation, Pause)

    def is_resume(self) -> bool:
        """Whether this barrier resumes paused sources."""
        return isinstance(self.mutation, Resume)

    def throttle_for(self, actor_id: int) -> tuple[bool, float | None]:
        """``(changed, rate)``: whether the rate of ``actor_id`` changes here, and to what."""
        _check_actor_id(actor_id)
        if isinstance(self.mutation, Throttle) and actor_id in self.mutation.rates:
            return True, self.mutation.rates[actor_id]
        return False, None

    def new_splits(self, actor_id: int) -> tuple[Split, ...] | None:
        """The new split assignment of ``actor_id`` (``SourceChangeSplit`` or ``Update``)."""
        _check_actor_id(actor_id)
        if isinstance(self.mutation, SourceChangeSplit | Update):
            return self.mutation.splits.get(actor_id)
        return None

    def new_vnode_bitmap(self, actor_id: int) -> VnodeBitmap | None:
        """The new vnode bitmap of ``actor_id`` under an ``Update``, or ``None``."""
        _check_actor_id(actor_id)
        if isinstance(self.mutation, Update):
            return self.mutation.vnode_bitmaps.get(actor_id)
        return None

    def is_stop(self, actor_id: int) -> bool:
        """Whether ``actor_id`` stops (``Stop``) or is dropped (``Update``) at this barrier."""
        _check_actor_id(actor_id)
        if isinstance(self.mutation, Stop):
            return actor_id in self.mutation.actors
        if isinstance(self.mutation, Update):
            return actor_id in self.mutation.dropped_actors
        return False
