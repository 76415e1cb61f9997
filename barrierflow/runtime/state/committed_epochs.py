"""The stream of a store's committed epochs (:meth:`StateStore.committed_epochs`): what a
two-phase sink waits on before it commits."""

from __future__ import annotations

from typing import TYPE_CHECKING, final

import anyio.lowlevel

if TYPE_CHECKING:
    from barrierflow.runtime.state.state_store import StateStore

__all__ = ["CommittedEpochs"]


@final
class CommittedEpochs:
    """An async iterator over a store's committed epochs (see
    :meth:`StateStore.committed_epochs`). A plain iterator, not an async generator, so
    breaking out of ``async for`` needs no finalization on any backend."""

    __slots__ = ("_seen", "_store")

    def __init__(self, store: StateStore) -> None:
        self._store = store
        self._seen = -1

    def __aiter__(self) -> CommittedEpochs:
        return self

    async def __anext__(self) -> int:
        store = self._store
        while not store._closed:
            if store._committed > self._seen:
                self._seen = store._committed
                await anyio.lowlevel.checkpoint()
                return self._seen
            await store._committed_changed.wait()
        raise StopAsyncIteration
