"""An actor's outputs: one dispatcher per downstream edge group, changed only at barriers.

Fan-out belongs to the edge, not to the actor: an actor may hash-dispatch to the parallel
writers of a sink and, beside that, send everything to a monitor. Each such group of
downstream actors has its own :class:`~barrierflow.channels.dispatch.Dispatcher`, and each
group reads one of the actor's outputs: its main output (``None``) or a *side output* it
declares (``"late"``, ``"dead_letters"``; read downstream as ``"<actor>:<output>"``). A chunk
goes through the dispatchers of the groups reading the output it was emitted to, and only
those (a side output nobody reads drops its rows); a committable goes to the groups of the
main output only (a sink's writers read it); a barrier or watermark goes to every output of
every dispatcher, so every reader, of any output, sees every epoch boundary.

Groups are added and removed only when a barrier passes (a job joining or leaving a running
graph), so every downstream actor sees whole epochs: a new group receives the barrier that
added it as its first message, and a group removed at a barrier received that barrier last.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import final

from barrierflow.channels.barrier import Barrier
from barrierflow.channels.chunk import Chunk
from barrierflow.channels.dispatch import Dispatcher, HashDispatcher
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.channels.messages import MESSAGE_EXPECTED, MESSAGE_TYPES, Committable, Message
from barrierflow.channels.mutation import NewOutput, Update
from barrierflow.channels.output_names import check_output_name
from barrierflow.channels.vnode import VnodeBitmap

__all__ = ["GroupSpec", "Outputs"]


#: A group as :class:`Outputs` takes it: a dispatcher and the actor ids behind its outputs,
#: optionally with the output the group reads (``None`` or absent: the main output).
GroupSpec = tuple[Dispatcher, Sequence[int]] | tuple[Dispatcher, Sequence[int], str | None]


@final
class _Group:
    __slots__ = ("actors", "dispatcher", "output")

    def __init__(self, dispatcher: Dispatcher, actors: Sequence[int], output: str | None) -> None:
        self.dispatcher = dispatcher
        self.actors = list(actors)
        self.output = output


@final
class Outputs:
    """The dispatchers of one actor, each with the actor ids behind its outputs (in order) and
    the output of the actor its group reads (``(dispatcher, ids)`` reads the main output,
    ``(dispatcher, ids, "late")`` the side output ``"late"``).

    Raises:
        InvalidArgumentError: a group that is not a pair or a triple, whose dispatcher is not
            a Dispatcher, whose actor ids do not match its outputs one to one, or whose output
            is not ``None`` or a side output's name.
    """

    __slots__ = ("_groups",)

    def __init__(self, groups: Iterable[GroupSpec] = ()) -> None:
        self._groups: list[_Group] = []
        for group in groups:
            if not isinstance(group, tuple) or len(group) not in (2, 3):
                raise InvalidArgumentError(
                    "groups", "(dispatcher, actor ids) or (dispatcher, actor ids, output)", group
                )
            self._add(group[0], group[1], group[2] if len(group) == 3 else None)

    def _add(self, dispatcher: object, actors: Sequence[int], output: object) -> None:
        if not isinstance(dispatcher, Dispatcher):
            raise InvalidArgumentError("dispatcher", "a Dispatcher", type(dispatcher).__name__)
        if len(actors) != len(dispatcher.outputs):
            raise InvalidArgumentError(
                "actors", f"{len(dispatcher.outputs)} actor ids (one per output)", list(actors)
            )
        self._groups.append(_Group(dispatcher, actors, check_output_name("output", output)))

    def __bool__(self) -> bool:
        return bool(self._groups)

    @property
    def downstream(self) -> list[int]:
        """Every actor id behind an output, group by group."""
        return [actor for group in self._groups for actor in group.actors]

    @property
    def dispatchers(self) -> list[Dispatcher]:
        """The dispatchers, one per group."""
        return [group.dispatcher for group in self._groups]

    async def dispatch(self, message: Message, output: str | None = None) -> None:
        """Send ``message`` on: a chunk through the groups reading ``output`` (each routes it
        as its strategy says; no group: the rows are dropped), a committable through the
        groups of the main output, a barrier or watermark through every group.

        Raises:
            ChannelBrokenError: an output's receiver is gone.
            InvalidArgumentError: ``message`` is not a Message, ``output`` is not ``None`` or
                a side output's name, or an ``output`` given for a message that is not a chunk
                (the others go where the rules above say).
        """
        if not isinstance(message, MESSAGE_TYPES):
            raise InvalidArgumentError("message", MESSAGE_EXPECTED, type(message).__name__)
        check_output_name("output", output)
        if isinstance(message, Chunk | Committable):
            if output is not None and not isinstance(message, Chunk):
                raise InvalidArgumentError(
                    "output", "None for a committable (it follows the main output)", output
                )
            for group in self._groups:
                if group.output == output:
                    await group.dispatcher.dispatch(message)
            return
        if output is not None:
            raise InvalidArgumentError(
                "output",
                f"None for a {type(message).__name__} (it goes to every output)",
                output,
            )
        for group in self._groups:
            await group.dispatcher.dispatch(message)

    async def apply(self, barrier: Barrier, actor_id: int) -> None:
        """Change the groups as ``barrier`` says, once it went out on every current output.

        New outputs of an ``Add`` get the barrier first, then join; outputs to actors that
        stop at the barrier are closed; an ``Update`` re-splits hash groups' vnodes.

        Raises:
            ChannelBrokenError: a new output's receiver is gone.
        """
        for new in barrier.new_outputs(actor_id):
            await self._join(new, barrier)
        if isinstance(barrier.mutation, Update):
            self._rescale(barrier.mutation)
        stopped = barrier.stopped_actors()
        if stopped and not isinstance(barrier.mutation, Update):
            self._drop(stopped)

    async def _join(self, new: NewOutput, barrier: Barrier) -> None:
        await new.dispatcher.dispatch(barrier)
        self._add(new.dispatcher, new.actors, new.output)

    def _drop(self, stopped: frozenset[int]) -> None:
        # Whole groups only: a job is dropped with all of its parallel actors. (Stopping a part
        # of a hash group is a rescale, which an ``Update`` does with new bitmaps.)
        kept: list[_Group] = []
        for group in self._groups:
            if set(group.actors) <= stopped:
                group.dispatcher.close()
            else:
                kept.append(group)
        self._groups = kept

    def _rescale(self, update: Update) -> None:
        """New vnode bitmaps for the next chunks, and no more messages to dropped actors."""
        for group in self._groups:
            dispatcher, ids = group.dispatcher, group.actors
            if isinstance(dispatcher, HashDispatcher) and (
                update.vnode_bitmaps or update.dropped_actors
            ):
                dispatcher.update_bitmaps(
                    [
                        VnodeBitmap.empty(bitmap.vnode_count)
                        if actor in update.dropped_actors
                        else update.vnode_bitmaps.get(actor, bitmap)
                        for actor, bitmap in zip(ids, dispatcher.bitmaps, strict=True)
                    ]
                )
            for index, actor in enumerate(ids):
                if actor in update.dropped_actors:
                    dispatcher.drop_output(index)

    def close(self) -> None:
        """Close every output of every group."""
        for group in self._groups:
            group.dispatcher.close()
