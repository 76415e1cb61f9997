"""The message vocabulary: what travels on a channel between stream actors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, final

from barrierflow.channels.barrier import Barrier
from barrierflow.channels.chunk import Chunk
from barrierflow.errors import InvalidArgumentError

__all__ = ["Watermark", "Message", "message_rows"]


@final
@dataclass(frozen=True, slots=True)
class Watermark:
    """No row with ``column`` below ``value`` will follow on this stream.

    Raises:
        InvalidArgumentError: ``column`` is empty or ``value`` is ``None``.
    """

    column: str
    value: Any

    def __post_init__(self) -> None:
        if not isinstance(self.column, str) or not self.column:
            raise InvalidArgumentError("Watermark.column", "a non-empty column name", self.column)
        if self.value is None:
            raise InvalidArgumentError("Watermark.value", "a comparable value", None)


#: What a stream actor reads and writes.
Message = Chunk | Barrier | Watermark


def message_rows(message: object) -> int:
    """Row permits a message takes in a channel: a chunk's rows, 0 for anything else."""
    return message.num_rows if type(message) is Chunk else 0
