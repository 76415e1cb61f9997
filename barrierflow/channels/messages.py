"""The message vocabulary: what travels on a channel between stream actors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, final

from barrierflow.channels.barrier import Barrier
from barrierflow.channels.chunk import Chunk
from barrierflow.channels.errors import InvalidArgumentError

__all__ = ["Committable", "Message", "Watermark", "message_rows"]


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


@final
@dataclass(frozen=True, slots=True)
class Committable:
    """Work staged outside the graph for the sink ``sink`` — a Spark task's files — travelling
    to that sink like rows do, so that it belongs to the epoch whose barrier follows it.

    The sink's writer that receives it hands ``payload`` to the sink's coordinator with its
    own part of that epoch (Flink's ``CommittableMessage``; RisingWave's writers reporting at
    the barrier): an epoch holds exactly the committables that arrived before its barrier,
    and one whose epoch fails is discarded with the epoch and staged again by its producer.

    A dispatcher sends a committable to one output of each of its groups (never copies it
    within a group: the sink would commit it twice), and an actor that does not take
    committables passes them on untouched (:attr:`~barrierflow.runtime.StreamActor
    .takes_committables`).

    Raises:
        InvalidArgumentError: ``sink`` is not a non-empty str.
    """

    sink: str
    payload: Any

    def __post_init__(self) -> None:
        if not isinstance(self.sink, str) or not self.sink:
            raise InvalidArgumentError("Committable.sink", "a non-empty sink name", self.sink)


#: What a stream actor reads and writes.
Message = Chunk | Barrier | Watermark | Committable

#: The message kinds, for the type checks of the places that route them.
MESSAGE_TYPES = (Chunk, Barrier, Watermark, Committable)
#: How a refusal names what was expected.
MESSAGE_EXPECTED = "a Message (Chunk, Barrier, Watermark or Committable)"


def message_rows(message: object) -> int:
    """Row permits a message takes in a channel: a chunk's rows, 0 for anything else."""
    return message.num_rows if type(message) is Chunk else 0
