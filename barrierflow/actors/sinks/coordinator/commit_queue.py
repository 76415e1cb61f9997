"""The commit queue of a coordinator: pre-committed epochs waiting for the runtime's
committed epoch, then committed in epoch order, a failed commit retried after a backoff for a
bounded time.

An epoch is *pending* while its checkpoint is not durable, then *prepared* (due). Its commit
says what happened (:data:`~barrierflow.actors.sinks.table.CommitOutcome`). A commit that
may succeed later (``RetryLater``, or an exception the committer did not classify) is retried
after the seed's exponential backoff (tokio-retry's
``ExponentialBackoff::from_millis(10)``: the n-th retry waits 10^n ms — 10 ms, 100 ms, 1 s,
10 s — base^n, not doubling, capped at ``max_delay``, full jitter; the library's one schedule,
:class:`barrierflow._backoff.RetryBackoff`) while the coordinator keeps
serving writers; the next epoch's retries start again from the first delay. Unlike the seed,
which retries for ever, the retries of one epoch are bounded by ``retry_timeout`` seconds from
its first failure (a warning each time the time spent retrying doubles): past it — or at once
when the table says ``Failed`` — the queue raises
:class:`~barrierflow.errors.TableCommitFailedError`, which fails the coordinator and the
pipeline, so a table that can no longer commit is not hidden behind writers that keep being
acknowledged. A commit running long logs a warning every ``warn_interval`` seconds. A commit
that went through is marked *committed* in the meta store at once
(:meth:`CommitQueue.write_marks`), so a restart does not run it again.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio

# The retry schedule lives at the library's root, shared with the Redis split log's retries;
# imported here under its former names too (the coordinator and tests import it from here).
from barrierflow._backoff import MILLISECOND as MILLISECOND
from barrierflow._backoff import RECENT_DELAYS, RetryBackoff
from barrierflow._taskgroups import single_error
from barrierflow.actors.sinks.coordinator.meta_store import SinkStates
from barrierflow.actors.sinks.errors import TableCommitFailedError
from barrierflow.actors.sinks.table import (
    AlreadyCommitted,
    CommitMetadata,
    CommitOutcome,
    Committer,
    Failed,
    Manifest,
    RetryLater,
    SchemaChange,
)

__all__ = ["RECENT_DELAYS", "CommitItem", "CommitQueue", "RetryBackoff", "run_with_warnings"]

_T = TypeVar("_T")


@dataclass
class CommitItem:
    """One prepared epoch: what its commit publishes, and the schema change it carries (new
    writers wait until it is committed)."""

    epoch: int
    metadata: CommitMetadata
    schema_change: SchemaChange | None
    #: The rows the commit publishes: its writers' manifests' (an epoch recovered from the
    #: meta store: the ``rows`` its metadata records, where the table records them).
    rows: int = 0


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
        on_marked: called once a committed mark is written (the epoch now counts as committed).
        sink: the sink's name (what a :class:`~barrierflow.errors.TableCommitFailedError`
            names).
        retry_timeout: seconds an epoch's commit is retried, from its first failure, before
            the queue gives up with :class:`~barrierflow.errors.TableCommitFailedError`.
        clock: the monotonic clock retries are timed by (``anyio.current_time``; a test may
            pass a fake one).
    """

    def __init__(
        self,
        committer: Committer,
        states: SinkStates,
        committed_epoch: int,
        last_committed: int,
        backoff: RetryBackoff,
        warn_interval: float,
        log: Any,
        on_marked: Callable[[], None] = lambda: None,
        *,
        sink: str,
        retry_timeout: float,
        clock: Callable[[], float] = anyio.current_time,
    ) -> None:
        self.committer = committer
        self.states = states
        self.committed_epoch = committed_epoch
        #: The last epoch committed (0 before the first), and how many were in this run.
        self.last_committed = last_committed
        self.commits = 0
        #: Rows the commits that went through published.
        self.rows_committed = 0
        #: When the last commit of this run went through (Unix seconds; ``None`` before the
        #: first): a wall-clock time, so that an alert can compute ``time() - x`` on it.
        self.last_commit_time: float | None = None
        #: Commits that found the epoch committed already (:class:`AlreadyCommitted`).
        self.replays = 0
        self.pending: deque[CommitItem] = deque()
        self.prepared: deque[CommitItem] = deque()
        self.retry_at: float | None = None
        self._backoff = backoff
        self._warn_interval = warn_interval
        self._log = log
        self._on_marked = on_marked
        self._sink = sink
        self._retry_timeout = retry_timeout
        self._clock = clock
        #: When the head epoch's commit first failed (``None``: it has not), and the time
        #: spent retrying at which the next "still retrying" warning is due.
        self._failing_since: float | None = None
        self._warn_after = 0.0
        #: The epoch committed whose committed mark is not written yet (at most one: the next
        #: commit waits for it).
        self.unmarked: int | None = None
        self._mark_wanted = anyio.Event()
        self._mark_written = anyio.Event()
        self._mark_written.set()

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

    @property
    def waiting(self) -> int:
        """Epochs whose commit is still to go through (pending their checkpoint, or due): an
        epoch with nothing to commit never is, nor one committed whose mark is unwritten."""
        return len(self.pending) + len(self.prepared)

    def holds_through(self, epoch: int) -> bool:
        """Whether an epoch up to ``epoch`` still waits for its commit or its committed mark."""
        if self.unmarked is not None and self.unmarked <= epoch:
            return True
        return any(item.epoch <= epoch for item in (*self.prepared, *self.pending))

    def has_uncommitted_schema_change(self) -> bool:
        return any(item.schema_change is not None for item in (*self.prepared, *self.pending))

    async def complete(
        self, epoch: int, manifests: list[Manifest], change: SchemaChange | None
    ) -> None:
        """Every vnode's writer sent its manifest of ``epoch``: prepare its commit and persist
        it as pending (nothing to commit: nothing is persisted). Returns once the writers may
        be acknowledged."""
        metadata = await self.committer.prepare(epoch, manifests)
        if metadata is not None:
            rows = sum(m.rows for m in manifests)
            await self._persist_pending(CommitItem(epoch, metadata, change, rows))

    async def commit(self, item: CommitItem) -> bool:
        """Commit ``item`` (the due head); returns whether it went through. A failure that
        may pass is logged and its retry scheduled, within the retry bound. The previous
        commit's mark is written first: marks are written in commit order, so at most the
        last commit is ever unmarked.

        Raises:
            TableCommitFailedError: the committer said :class:`Failed`, or the epoch's commit
                kept failing for ``retry_timeout`` seconds.
        """
        if self.unmarked is not None:
            await self._mark_written.wait()
        outcome, classified = await self._attempt(item)
        if isinstance(outcome, RetryLater | Failed):
            self._failed(item, outcome, classified)
            return False
        self.prepared.popleft()
        self.retry_at = None
        self._failing_since, self._warn_after = None, 0.0
        # The seed drops its backoff state on success (``ack_committed``): the next epoch's
        # retries start again from the first delay.
        self._backoff.succeeded()
        if isinstance(outcome, AlreadyCommitted):
            self.replays += 1
        # The seed marks the epoch committed at once (``commit_and_prune_epoch`` in
        # ``ack_committed``), so a restart does not commit it again. The mark is written by
        # :meth:`write_marks` beside the coordinator's loop: writers' requests are not held up
        # by the transaction, and the next commit waits for it (above).
        self.unmarked = item.epoch
        self._mark_written = anyio.Event()
        self._mark_wanted.set()
        self._went_through(item.epoch, item.rows)
        return True

    async def _attempt(self, item: CommitItem) -> tuple[CommitOutcome | None, bool]:
        """One call of the committer's commit, as its outcome and whether the committer
        classified it: an exception it lets escape is an unclassified :class:`RetryLater`.
        ``None`` (a committer from before outcomes) goes through as :class:`Committed` does."""
        try:
            outcome: CommitOutcome | None = await run_with_warnings(
                self.committer.commit(item.epoch, item.metadata),
                self._warn_interval, self._log, item.epoch,
            )  # fmt: skip
        except Exception as exc:
            return RetryLater(exc), False
        return outcome, True

    def _failed(self, item: CommitItem, outcome: RetryLater | Failed, classified: bool) -> None:
        """Schedule the retry of a failed commit, or give up on it."""
        cause = outcome.cause
        if isinstance(outcome, Failed):
            raise TableCommitFailedError(self._sink, item.epoch, cause) from cause
        now = self._clock()
        if self._failing_since is None:
            self._failing_since = now
        spent = now - self._failing_since
        if spent >= self._retry_timeout:
            raise TableCommitFailedError(
                self._sink, item.epoch, cause, self._retry_timeout
            ) from cause
        delay = self._backoff.failed()
        # The last retry runs at the bound, not a backoff past it: the run fails within it.
        self.retry_at = min(now + delay, self._failing_since + self._retry_timeout)
        self._log.error(
            "commit failed; retrying after backoff",
            epoch=item.epoch,
            error=repr(cause),
            # An exception the committer let escape: retried like RetryLater, but the table
            # should say whether it can pass.
            classified=classified,
            backoff_s=round(delay, 4),
        )
        if spent > 0 and spent >= self._warn_after:
            self._warn_after = 2 * spent
            self._log.warning(
                "commit still failing; the pipeline fails once the retry bound runs out",
                epoch=item.epoch,
                retrying_s=round(spent, 4),
                retry_timeout_s=self._retry_timeout,
            )

    def _went_through(self, epoch: int, rows: int) -> None:
        """Count the commit of ``epoch`` (publishing ``rows``) that went through."""
        self.last_committed = epoch
        self.commits += 1
        self.rows_committed += rows
        self.last_commit_time = time.time()

    async def write_marks(self) -> None:
        """Write each committed mark (one small transaction: mark the epoch committed, prune
        the committed records before it) as soon as its commit went through. Runs for the
        coordinator's run, beside its loop; a failed write fails the run, as in the seed."""
        while True:
            await self._mark_wanted.wait()
            self._mark_wanted = anyio.Event()
            epoch = self.unmarked
            # Set with the event by commit(), which waits for this mark before the next one.
            assert epoch is not None
            await self.states.commit_and_prune(epoch)
            self.unmarked = None
            self._mark_written.set()
            self._on_marked()

    async def _persist_pending(self, item: CommitItem) -> None:
        await self.states.persist_pending(item.epoch, item.metadata, item.schema_change)
        self.push(item)

    async def mark_committed(self) -> None:
        """Write the committed mark still unwritten when the run ends (its writer was
        cancelled); writing it twice is harmless.

        Cancellation: shielded, for at most 2 seconds.
        """
        epoch, self.unmarked = self.unmarked, None
        if epoch is not None:
            with anyio.move_on_after(2, shield=True):
                await self.states.commit_and_prune(epoch)


async def run_with_warnings(
    commit: Awaitable[_T], warn_interval: float, log: Any, epoch: int
) -> _T:
    """Await ``commit``, logging a warning every ``warn_interval`` seconds while it runs, and
    return its result; its error is raised as itself (not in a group)."""
    started = anyio.current_time()

    async def warn() -> None:
        while True:
            await anyio.sleep(warn_interval)
            log.warning(
                "commit still running", epoch=epoch, elapsed_s=anyio.current_time() - started
            )

    error: Exception | None = None
    result: list[_T] = []  # the commit's result, once it returned
    with single_error():
        async with anyio.create_task_group() as tg:
            tg.start_soon(warn)
            try:
                result.append(await commit)
            except Exception as exc:
                # Raised below, as itself: inside the group it would be wrapped, and grouped
                # with a cancellation of the run arriving meanwhile.
                error = exc
            finally:
                tg.cancel_scope.cancel()
    if error is not None:
        raise error
    return result[0]
