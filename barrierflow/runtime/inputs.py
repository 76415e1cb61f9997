"""How an actor reads: its one (or aligned) input as an iterator, or its named inputs one by
one (the backfills)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import anyio

from barrierflow.channels.chunk import Chunk
from barrierflow.channels.errors import UnknownInputError
from barrierflow.channels.messages import Message
from barrierflow.channels.select import PollableReceiver

if TYPE_CHECKING:
    from barrierflow.runtime.context import ActorContext

__all__ = ["Messages", "NamedInputs"]


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
    raising mid-iteration leaves nothing to finalize)."""

    __slots__ = ("_ctx",)

    def __init__(self, ctx: ActorContext) -> None:
        self._ctx = ctx

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
        ctx = self._ctx
        if ctx.finished:
            raise anyio.EndOfStream
        try:
            message = await ctx._input.receive()
        except anyio.EndOfStream:
            ctx.finished = True
            raise
        return self._count(message)

    def receive_nowait(self) -> Message | None:
        """The next message if one is waiting now, else ``None`` — for an actor that does
        work of its own between messages (a backfill) and lets every barrier go first.

        Raises:
            anyio.EndOfStream: the input ended, or the actor has finished.
        """
        ctx = self._ctx
        if ctx.finished:
            raise anyio.EndOfStream
        try:
            message = ctx._input.receive_nowait()  # type: ignore[attr-defined]
        except anyio.WouldBlock:
            return None
        except anyio.EndOfStream:
            ctx.finished = True
            raise
        return self._count(message)

    def _count(self, message: Message) -> Message:
        ctx = self._ctx
        ctx._messages_in += 1
        if isinstance(message, Chunk):
            ctx._rows_in += message.num_rows
        return message
