"""The job catalog: which jobs exist, committed with checkpoints in the state store.

One state table owned by the runtime (``__runtime__/jobs``): job name → ``{"created_epoch",
"actors"}``. An entry is written (or deleted) under the epoch of the barrier that adds (or
drops) the job, so it becomes durable with the first checkpoint after that barrier — the same
checkpoint that first holds the job's actors' state. A job added and then lost to a crash
before that checkpoint does not exist after recovery; one whose drop was not yet durable comes
back.

On start the program declares its jobs again (factories are code, not data): a job in the
catalog that is not declared is refused by name (:class:`~barrierflow.errors.
JobNotDeclaredError`) until it is declared again or forgotten.
"""

from __future__ import annotations

import os
from typing import Any, final

import anyio

from barrierflow._fs import check_path_argument
from barrierflow.runtime.state.state_store import StateStore, StateTable

__all__ = ["CATALOG_OWNER", "JobCatalog", "stored_jobs"]

#: The owner name of the runtime's own tables (not a valid actor of a user's graph).
CATALOG_OWNER = "__runtime__"
_TABLE = "jobs"


@final
class JobCatalog:
    """The runtime's view of the catalog table of one incarnation."""

    __slots__ = ("_store", "_table")

    def __init__(self, store: StateStore) -> None:
        self._store = store
        self._table: StateTable = store.table(CATALOG_OWNER, _TABLE)

    async def committed(self) -> dict[str, dict[str, Any]]:
        """Every job in the last committed checkpoint."""
        return await self._store.read_all(CATALOG_OWNER, _TABLE)

    def record(
        self,
        epoch: int,
        *,
        created: dict[str, list[str]] | None = None,
        dropped: tuple[str, ...] = (),
    ) -> None:
        """At the barrier of ``epoch`` (its ``curr``): jobs created (name → actor names) and
        jobs dropped. Called under the runtime's job lock, in epoch order."""
        for job, actors in (created or {}).items():
            self._table.put(job, {"created_epoch": epoch, "actors": list(actors)})
        for job in dropped:
            self._table.delete(job)
        self._table.seal(epoch)


async def stored_jobs(state_path: str | os.PathLike[str]) -> dict[str, int]:
    """The jobs a state store's last checkpoint holds (name → created epoch), read before a
    runtime starts on it — to declare again the ones added at run time (``rt.declare_job``), or
    forget them. A path with no store holds none (and is not created).

    Raises:
        InvalidArgumentError: ``state_path`` is not a path (``argument="path"``).
        StateStoreError: as :meth:`StateStore.open` (a store another runtime holds, a
            damaged or foreign file).
    """
    path = check_path_argument(state_path)
    if not await anyio.Path(path).exists():
        return {}
    async with await StateStore.open(path) as store:
        committed = await JobCatalog(store).committed()
    return {name: int(entry["created_epoch"]) for name, entry in committed.items()}
