"""The commit queue of a two-phase coordinator: pre-committed epochs waiting for the runtime's
committed epoch, then committed in epoch order, a failed commit retried after a backoff.

An epoch is *pending* while its checkpoint is not durable, then *prepared* (due). A commit that
fails is retried after an exponential backoff (``base_delay`` doubling to ``max_delay``, full
jitter) while the coordinator keeps serving writers; a commit running long logs a warning
every ``warn_interval`` seconds.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

import anyio

from barrierflow._taskgroups import single_error
from barrierflow.actors.sinks.coordinator.committer import CommitCoordinator, SchemaChange
from barrierflow.actors.sinks.coordinator.meta_store import SinkStates
from barrierflow.actors.sinks.protocol import CommitMetadata

__all__ = ["RECENT_DELAYS", "CommitItem", "CommitQueue", "RetryBackoff", "run_with_warnings"]

#: How many of the latest retry delays a coordinator keeps for its stats: a sink whose commits
#: fail for days must not grow a list for ever.
RECENT_DELAYS = 64


@dataclass
class CommitItem:
    """One pre-committed epoch: what its commit publishes."""

    epoch: int
    metadata: CommitMetadata | None
    schema_change: SchemaChange | None


class CommitQueue:
    """A sink's epochs from acknowledgement to commit: they wait for durability (``pending``),
    then for their commit (``prepared``), in epoch order.

    Args:
        committer: the sink side that commits.
        states: the sink's meta store.
        committed_epoch: the runtime's committed epoch now.
        last_committed: the last epoch the sink committed (0 before the first).
        backoff: the retry schedule of failed commits.
        warn_interval: seconds between warnings while one commit runs.
        log: where warnings go.
    """

    def __init__(
        self,
        committer: CommitCoordinator,
        states: SinkStates,
        committed_epoch: int,
        last_committed: int,
        backoff: RetryBackoff,
        warn_interval: float,
        log: Any,
    ) -> None:
        self.committer = committer
        self.states = states
        self.committed_epoch = committed_epoch
        #: The last epoch committed (0 before the first), and how many were in this run.
        self.last_committed = last_committed
        self.commits = 0
        self.pending: deque[CommitItem] = deque()
        self.prepared: deque[CommitItem] = deque()
        self.retry_at: float | None = None
        self.retries = 0
        self._backoff = backoff
        self._warn_interval = warn_interval
        self._log = log
        self._unmarked: list[int] = []  # committed, mark not written yet

    def push(self, item: CommitItem) -> None:
        """Queue a pre-committed epoch (due at once if its checkpoint is already durable)."""
        if item.epoch > self.committed_epoch:
            self.pending.append(item)
        else:
            self.prepared.append(item)

    def on_committed_epoch(self, epoch: int) -> None:
        """The runtime's committed epoch moved: pending epochs up to it become due."""
        self.committed_epoch = max(self.committed_epoch, epoch)
        while self.pending and self.pending[0].epoch <= self.committed_epoch:
            self.prepared.append(self.pending.popleft())

    def due(self, now: float) -> CommitItem | None:
        """The oldest prepared epoch, unless its retry is not due yet."""
        if not self.prepared or (self.retry_at is not None and now < self.retry_at):
            return None
        return self.prepared[0]

    def deadline(self) -> float:
        """When the next commit is due (``inf``: none is)."""
        if not self.prepared:
            return math.inf
        return -math.inf if self.retry_at is None else self.retry_at

    def is_empty(self) -> bool:
        return not self.pending and not self.prepared

    def holds_through(self, epoch: int) -> bool:
        """Whether an epoch up to ``epoch`` still waits for its commit."""
        return any(item.epoch <= epoch for item in (*self.prepared, *self.pending))

    def has_uncommitted_schema_change(self) -> bool:
        return any(item.schema_change is not None for item in (*self.prepared, *self.pending))

    async def complete(
        self, epoch: int, metadatas: list[CommitMetadata], change: SchemaChange | None
    ) -> None:
        """Every vnode's writer sent its metadata of ``epoch``: commit it now (single-phase)
        or pre-commit it and persist it as pending (two-phase). Returns once the writers may
        be acknowledged."""
        if not self.committer.two_phase:
            await run_with_warnings(
                self.committer.commit_data(epoch, metadatas), self._warn_interval, self._log,
                epoch,
            )  # fmt: skip
            self.commits += 1
            self.last_committed = epoch
            if change is not None:  # the schema change still commits in phase 2
                await self._persist_pending(CommitItem(epoch, None, change))
        else:
            metadata = await self.committer.pre_commit(epoch, metadatas, change)
            if metadata is not None or change is not None:
                await self._persist_pending(CommitItem(epoch, metadata, change))

    async def commit(self, item: CommitItem) -> bool:
        """Commit ``item`` (the due head); returns whether it went through. On failure, log
        it and schedule the retry."""
        try:
            await run_with_warnings(
                self.committer.commit(item.epoch, item.metadata, item.schema_change),
                self._warn_interval, self._log, item.epoch,
            )  # fmt: skip
        except Exception as exc:
            delay = self._backoff.failed(self)
            self._log.error(
                "commit failed; retrying after backoff",
                epoch=item.epoch,
                error=repr(exc),
                backoff_s=round(delay, 4),
            )
            return False
        self.prepared.popleft()
        self.retry_at = None
        self.retries = 0
        # The committed mark rides on the next pending record's transaction (one fsync per
        # epoch, not two). A mark lost in a crash only makes recovery commit the epoch again,
        # which every committer skips (commits are idempotent).
        self._unmarked.append(item.epoch)
        self.last_committed = item.epoch
        self.commits += 1
        return True

    async def _persist_pending(self, item: CommitItem) -> None:
        marks, self._unmarked = self._unmarked, []
        await self.states.persist_pending(
            item.epoch, item.metadata, item.schema_change, committed=marks[-1] if marks else None
        )
        await self._delete_covered(marks)
        self.push(item)

    async def _delete_covered(self, marks: list[int]) -> None:
        """Epochs committed back to back get one mark, the last one's (pruning only deletes
        *committed* records): delete the records of the others, which it covers."""
        if len(marks) > 1:
            await self.states.delete(marks[:-1])

    async def mark_committed(self) -> None:
        """Write a committed mark that no pending record carried yet (at the end of a run).

        Cancellation: shielded, for at most 2 seconds.
        """
        marks, self._unmarked = self._unmarked, []
        if marks:
            with anyio.move_on_after(2, shield=True):
                await self.states.commit_and_prune(marks[-1])
                await self._delete_covered(marks)


class RetryBackoff:
    """Exponential backoff with full jitter, and the counters a coordinator reports: every
    failure is counted; only the latest :data:`RECENT_DELAYS` delays are kept."""

    def __init__(self, base_delay: float, max_delay: float, rng: random.Random) -> None:
        self._base = base_delay
        self._max = max_delay
        self._rng = rng
        #: Failed commit attempts in this run.
        self.failures = 0
        #: The latest backoff delays waited (seconds), oldest first.
        self.recent: deque[float] = deque(maxlen=RECENT_DELAYS)

    def failed(self, queue: CommitQueue) -> float:
        """A commit of ``queue``'s head failed: schedule its retry; returns the delay."""
        self.failures += 1
        delay = min(self._max, self._base * 2.0**queue.retries)
        jittered = delay * self._rng.random()  # full jitter, as the seed's backoff
        queue.retries += 1
        queue.retry_at = anyio.current_time() + jittered
        self.recent.append(jittered)
        return jittered


async def run_with_warnings(
    commit: Awaitable[None], warn_interval: float, log: Any, epoch: int
) -> None:
    """Await ``commit``, logging a warning every ``warn_interval`` seconds while it runs; its
    error is raised as itself (not in a group)."""
    started = anyio.current_time()

    async def warn() -> None:
        while True:
            await anyio.sleep(warn_interval)
            log.warning(
                "commit still running", epoch=epoch, elapsed_s=anyio.current_time() - started
            )

    error: Exception | None = None
    with single_error():
        async with anyio.create_task_group() as tg:
            tg.start_soon(warn)
            try:
                await commit
            except Exception as exc:
                # Raised below, as itself: inside the group it would be wrapped, and grouped
                # with a cancellation of the run arriving meanwhile.
                error = exc
            finally:
                tg.cancel_scope.cancel()
    if error is not None:
        raise error
