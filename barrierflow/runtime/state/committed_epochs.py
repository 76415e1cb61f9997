"""The stream of a store's committed epochs (:meth:`StateStore.committed_epochs`): what a
two-phase sink waits on before it commits."""

from __future__ import annotations

from collections.abc import Callable
from typing import final

import anyio.lowlevel

from barrierflow._sync import Notifier

__all__ = ["CommittedEpochs"]


@final
class CommittedEpochs:
    """An async iterator over a store's committed epochs (see
    :meth:`StateStore.committed_epochs`). A plain iterator, not an async generator, so
    breaking out of ``async for`` needs no finalization on any backend.

    Args:
        committed: the store's committed epoch now, ``None`` once the store is closed (the
            iteration ends).
        changed: notified whenever either changes.
    """

    __slots__ = ("_changed", "_committed", "_seen")

    def __init__(self, committed: Callable[[], int | None], changed: Notifier) -> None:
        self._committed = committed
        self._changed = changed
        self._seen = -1

    def __aiter__(self) -> CommittedEpochs:
        return self

    async def __anext__(self) -> int:
        while (committed := self._committed()) is not None:
            if committed > self._seen:
                self._seen = committed
                await anyio.lowlevel.checkpoint()
                return self._seen
            await self._changed.wait()
        raise StopAsyncIteration
