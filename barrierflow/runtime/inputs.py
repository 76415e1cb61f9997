"""How an actor reads: its one (or aligned) input as an iterator, or its named inputs one by
one (the backfills)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Protocol

import anyio

from barrierflow.channels.chunk import Chunk
from barrierflow.channels.endpoints import Receiver
from barrierflow.channels.errors import UnknownInputError
from barrierflow.channels.messages import Committable, Message
from barrierflow.channels.select import PollableReceiver

__all__ = ["Finishing", "Messages", "NamedInputs"]


class Finishing(Protocol):
    """The actor whose input :class:`Messages` reads (its
    :class:`~barrierflow.runtime.context.ActorContext`): reading stops once it has finished
    (a stop barrier passed), and the end of its input finishes it."""

    finished: bool


class NamedInputs(Mapping[str, PollableReceiver[Message]]):
    """An actor's inputs by name; asking for one it does not have is a typed error."""

    __slots__ = ("_inputs",)

    def __init__(self, inputs: Mapping[str, PollableReceiver[Message]]) -> None:
        self._inputs = dict(inputs)

    def __getitem__(self, name: str) -> PollableReceiver[Message]:
        try:
            return self._inputs[name]
        except KeyError:
            raise UnknownInputError(name, list(self._inputs)) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._inputs)

    def __len__(self) -> int:
        return len(self._inputs)


class Messages:
    """Iterator over an actor's input (a class, not an async generator, so that an actor
    raising mid-iteration leaves nothing to finalize), counting what it reads.

    Committables (:class:`~barrierflow.channels.messages.Committable`) are passed on through
    :attr:`forward` as they are read, in their place among the other messages, unless it is
    ``None`` (an actor that takes them: a sink's writer); :meth:`receive_nowait` returns them
    either way, to a caller that polls and must pass them on itself.

    Args:
        input: the actor's one (or aligned) input.
        actor: the reading actor; its ``finished`` ends the iteration, and is set when the
            input ends.
    """

    __slots__ = ("_actor", "_input", "forward", "messages_in", "rows_in")

    def __init__(self, input: Receiver[Message], actor: Finishing) -> None:
        self._input = input
        self._actor = actor
        #: Where committables read by :meth:`receive` go (``None``: to the reader).
        self.forward: Callable[[Committable], Awaitable[None]] | None = None
        #: Messages read so far.
        self.messages_in = 0
        #: Rows of the chunks read so far.
        self.rows_in = 0

    def __aiter__(self) -> Messages:
        return self

    async def __anext__(self) -> Message:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def receive(self) -> Message:
        """The next message, waiting for one.

        Raises:
            anyio.EndOfStream: the input ended, or the actor has finished.
        """
        actor = self._actor
        while True:
            if actor.finished:
                raise anyio.EndOfStream
            try:
                message = await self._input.receive()
            except anyio.EndOfStream:
                actor.finished = True
                raise
            if self.forward is None or not isinstance(message, Committable):
                return self._count(message)
            self.messages_in += 1
            await self.forward(message)

    def receive_nowait(self) -> Message | None:
        """The next message if one is waiting now, else ``None`` — for an actor that does
        work of its own between messages (a backfill) and lets every barrier go first.

        Raises:
            anyio.EndOfStream: the input ended, or the actor has finished.
        """
        actor = self._actor
        if actor.finished:
            raise anyio.EndOfStream
        try:
            message = self._input.receive_nowait()  # type: ignore[attr-defined]
        except anyio.WouldBlock:
            return None
        except anyio.EndOfStream:
            actor.finished = True
            raise
        return self._count(message)

    def _count(self, message: Message) -> Message:
        self.messages_in += 1
        if isinstance(message, Chunk):
            self.rows_in += message.num_rows
        return message
