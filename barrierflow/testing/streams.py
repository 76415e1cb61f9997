"""Collecting and summarizing message streams in tests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence

import anyio

from barrierflow.channels.barrier import Barrier
from barrierflow.channels.chunk import Chunk
from barrierflow.channels.endpoints import Receiver
from barrierflow.channels.messages import Message


async def drain(receiver: Receiver[Message]) -> list[Message]:
    """Receive until end of stream and return everything, in order."""
    received: list[Message] = []
    while True:
        try:
            received.append(await receiver.receive())
        except anyio.EndOfStream:
            return received


def rows_per_epoch(messages: Sequence[Message], column: str) -> list[Counter[Hashable]]:
    """The multiset of visible ``column`` values between consecutive barriers.

    Element *i* holds the rows after the *i*-th barrier (element 0: before the first one).
    """
    epochs: list[Counter[Hashable]] = [Counter()]
    for message in messages:
        if isinstance(message, Barrier):
            epochs.append(Counter())
        elif isinstance(message, Chunk):
            epochs[-1].update(message.compact().batch.column(column).to_pylist())
    return epochs
