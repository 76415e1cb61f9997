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
        ctx = self._ctx
        if ctx.finished:
            raise StopAsyncIteration
        try:
            message = await ctx._input.receive()
        except anyio.EndOfStream:
            ctx.finished = True
            raise StopAsyncIteration from None
        ctx._messages_in += 1
        if isinstance(message, Chunk):
            ctx._rows_in += message.num_rows
        return message
