"""The message vocabulary: what travels on a channel between stream actors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, final

from barrierflow.channels.barrier import Barrier
from barrierflow.channels.chunk import Chunk
from barrierflow.channels.errors import InvalidArgumentError

__all__ = ["Watermark", "Message", "message_rows"]


@final
@dataclass(frozen=True, slots=True)
class Watermark:
    """No row with ``column`` below ``value`` will follow on this stream.

    A merge takes the minimum of its inputs' watermarks, so ``value`` must be ordered against
    itself: ``None``, NaN (which compares false with everything, so the merged watermark would
    never advance again) and unorderable objects are refused here rather than in the merge.

    Raises:
        InvalidArgumentError: ``column`` is not a non-empty str, or ``value`` is ``None``, NaN
            or not orderable (``value < value`` fails).
    """

    column: str
    value: Any

    def __post_init__(self) -> None:
        if not isinstance(self.column, str) or not self.column:
            raise InvalidArgumentError("Watermark.column", "a non-empty column name", self.column)
        value = self.value
        try:
            orderable = value is not None and value == value and not value < value
        except Exception:  # whatever a user's __lt__ / __eq__ raises
            orderable = False
        if orderable is not True:
            raise InvalidArgumentError("Watermark.value", "an orderable value (not NaN)", value)


#: What a stream actor reads and writes.
Message = Chunk | Barrier | Watermark


def message_rows(message: object) -> int:
    """Row permits a message takes in a channel: a chunk's rows, 0 for anything else."""
    return message.num_rows if type(message) is Chunk else 0
