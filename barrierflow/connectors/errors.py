"""Errors of the connectors (the systems behind the sink protocol).

Every public name is re-exported from :mod:`barrierflow.errors`.
"""

from __future__ import annotations

from typing import final

from barrierflow.runtime.errors import SinkError

__all__ = [
    "SinkLockedError",
]


@final
class SinkLockedError(SinkError):
    """A sink's table directory (or an Iceberg table's staging area) is held by another writer
    group — another process, or another sink of this one.

    Attributes:
        sink: the sink (its path).
        holder: who holds it, as far as known (``"another process"``, a writer group).
    """

    def __init__(self, sink: str, holder: str) -> None:
        self.sink = sink
        self.holder = holder
        super().__init__(
            f"sink {sink!r}: expected to be its only writer group, but {holder} holds its lock; "
            "stop it first or write to another location"
        )
