"""The coordinator worker: the :class:`Coordinator` service that applies the rules of the
package (see :mod:`barrierflow.actors.sinks.coordinator`) to the events its writers send.

After RisingWave's ``coordinator_worker.rs``. One coordinator per sink runs as a runtime
service (:func:`~barrierflow.actors.sinks.add_sink.add_sink` declares it with the writers);
each parallel sink writer registers with its vnode bitmap and gets a
:class:`~.handles.WriterHandle`. One task owns all state: it reads events (registrations,
commit requests, committed epochs) from one inbox, in order. Beside it run the follower of the
runtime's committed epochs (whose end is an error: no commit could ever run again) and the
writer of committed marks (:meth:`~.commit_queue.CommitQueue.write_marks`).

The inbox is a command actor's (:func:`~barrierflow.runtime.command.open_command_actor`,
named ``<sink>.coordinator`` like the service): writers reach it through an
:class:`~barrierflow.runtime.command.ActorRef`, ``tell`` for what needs no answer and ``ask``
for a commit or the initial epoch, and a request that can never be answered is an
:class:`~barrierflow.errors.ActorGoneError` naming it, as for every command actor. The loop is
its own, not :func:`~barrierflow.runtime.command.serve_commands`: a coverage round takes
requests as they come and answers them only once every vnode is covered (an epoch's
acknowledgement waits for the last writer of that epoch), which one-request-one-reply
serving cannot express. A run that fails answers what it took and what is still queued with
:class:`~barrierflow.errors.CoordinatorAbortedError` (:func:`~.replies.abort_run`).
"""

from __future__ import annotations

import random
from typing import Any, final

import anyio
import anyio.abc
import structlog

from barrierflow._sync import Notifier
from barrierflow._taskgroups import single_error
from barrierflow.actors.sinks.committables import check_epoch_batches
from barrierflow.actors.sinks.coordinator.commit_queue import (
    MILLISECOND,
    CommitItem,
    CommitQueue,
    RetryBackoff,
)
from barrierflow.actors.sinks.coordinator.coverage import (
    CoverageRound,
    EpochRounds,
    align_initial,
    realign,
    register_all,
)
from barrierflow.actors.sinks.coordinator.handles import (
    AlignInitial,
    Commit,
    CommittedEpoch,
    Event,
    Inbound,
    NewHandle,
    StopHandle,
    UpdateBitmap,
    WriterHandle,
    WriterRegistry,
    event_name,
    take,
)
from barrierflow.actors.sinks.coordinator.meta_store import SinkStates
from barrierflow.actors.sinks.coordinator.recovery import recover
from barrierflow.actors.sinks.coordinator.replies import OpenReplies, abort_run, refuse
from barrierflow.actors.sinks.coordinator.stats import CoordinatorStats
from barrierflow.actors.sinks.errors import (
    CommittedEpochsEndedError,
    SchemaChangeMismatchError,
    UnexpectedWriterRequestError,
)
from barrierflow.actors.sinks.metrics import (
    DurableMarks,
    commit_histograms,
    coordinator_families,
)
from barrierflow.actors.sinks.table import Committer
from barrierflow.channels.channel import ReceiveChannel
from barrierflow.channels.errors import EpochOrderError, InvalidArgumentError
from barrierflow.channels.vnode import DEFAULT_VNODE_COUNT, VnodeBitmap
from barrierflow.runtime.command import ActorRef, open_command_actor
from barrierflow.runtime.config import check_seconds
from barrierflow.runtime.metrics import MetricFamily
from barrierflow.runtime.service import ServiceContext

__all__ = ["Coordinator"]


@final
class Coordinator:
    """The coordinator worker of one sink (see the module docstring). A runtime service.

    Args:
        sink: the sink's name (also its key in the meta store).
        committer: the sink side that commits.
        vnode_count: vnodes the writers' bitmaps partition.
        base_delay, max_delay: the retry backoff of failed commits, the seed's (tokio-retry's
            ``ExponentialBackoff::from_millis(10)``, ``max_delay(60 s)``, full jitter): with
            ``base_delay`` = *b* ms the n-th retry waits *b*^n ms — 10 ms, 100 ms, 1 s, 10 s,
            ... (base^n, not doubling) — capped at ``max_delay``, times a uniform draw in
            [0, 1); a successful commit starts it over (see
            :class:`~.commit_queue.RetryBackoff`). ``base_delay`` is at least 1 ms.
        warn_interval: seconds between warnings while one commit runs (the seed's 5 s).
        commit_retry_timeout: seconds an epoch's failing commit is retried, from its first
            failure, before the coordinator fails with
            :class:`~barrierflow.errors.TableCommitFailedError` (the seed retries for ever,
            which hides a table that can no longer commit behind writers that keep being
            acknowledged); a warning each time the time spent retrying doubles. A committer
            saying :class:`~barrierflow.actors.sinks.table.Failed` fails it at once.
        rng: the jitter's random source (a test may pass a seeded one).
    """

    def __init__(
        self,
        sink: str,
        committer: Committer,
        *,
        vnode_count: int = DEFAULT_VNODE_COUNT,
        base_delay: float = 0.01,
        max_delay: float = 60.0,
        warn_interval: float = 5.0,
        commit_retry_timeout: float = 300.0,
        rng: random.Random | None = None,
    ) -> None:
        if not isinstance(sink, str) or not sink:
            raise InvalidArgumentError("sink", "a non-empty str", sink)
        if not isinstance(committer, Committer):
            raise InvalidArgumentError("committer", "a Committer", committer)
        for name, value in (
            ("base_delay", base_delay),
            ("max_delay", max_delay),
            ("warn_interval", warn_interval),
            ("commit_retry_timeout", commit_retry_timeout),
        ):
            check_seconds(name, value)
        if base_delay < MILLISECOND:
            # Its number of milliseconds is the backoff's growth factor (tokio-retry's
            # from_millis): below 1 ms the delays would shrink.
            raise InvalidArgumentError("base_delay", "at least 0.001 seconds (1 ms)", base_delay)
        if type(vnode_count) is not int or not 1 <= vnode_count <= 1 << 15:
            raise InvalidArgumentError("vnode_count", "an int in 1..32768", vnode_count)
        if rng is not None and not isinstance(rng, random.Random):
            raise InvalidArgumentError("rng", "None or a random.Random", rng)
        self.sink = sink
        self._committer = committer
        self._vnode_count = vnode_count
        self._base_delay = float(base_delay)
        self._max_delay = float(max_delay)
        self._warn_interval = float(warn_interval)
        self._commit_retry_timeout = float(commit_retry_timeout)
        self._rng = rng or random.Random()
        self._log = structlog.get_logger("barrierflow.coordinator").bind(sink=sink)
        # Notifiers hold an anyio.Event, which needs async context: made on first use.
        self._ready: Notifier | None = None  # the inbox opened
        self._progress: Notifier | None = None  # an epoch was acknowledged or committed
        self._ref: ActorRef[Event] | None = None  # the inbox of the current run
        self._next_id = 0
        self._reset_run_state()

    @property
    def vnode_count(self) -> int:
        """Vnodes the writers' bitmaps partition."""
        return self._vnode_count

    @property
    def committer(self) -> Committer:
        """The sink side that commits."""
        return self._committer

    @property
    def base_delay(self) -> float:
        """Seconds before the first retry of a failed commit (times the jitter)."""
        return self._base_delay

    @property
    def max_delay(self) -> float:
        """The cap, in seconds, of the delay between retries of a failed commit."""
        return self._max_delay

    @property
    def warn_interval(self) -> float:
        """Seconds between warnings while one commit (or a round) runs."""
        return self._warn_interval

    @property
    def commit_retry_timeout(self) -> float:
        """Seconds a failing commit is retried before the coordinator fails."""
        return self._commit_retry_timeout

    def _reset_run_state(self) -> None:
        self._writers = WriterRegistry(self.sink)
        self._last_acked: int | None = None
        self._acked = 0
        self._backoff = RetryBackoff(self._base_delay, self._max_delay, self._rng)
        self._aborted: list[int] = []
        self._replies = OpenReplies()
        self._state_waiting: set[int] | None = None  # writers waiting for a flushed schema change
        self._queue: CommitQueue | None = None
        self._durable = DurableMarks()  # the runtime's committed epochs, and when

    # The writers' side.

    def check_bitmap(self, bitmap: Any) -> None:
        """Refuse a writer's bitmap this coordinator cannot use (what
        :meth:`register` and a handle's ``update_vnode_bitmap`` check first).

        Raises:
            InvalidArgumentError: not a non-empty bitmap of this coordinator's vnode count.
        """
        if not isinstance(bitmap, VnodeBitmap):
            raise InvalidArgumentError("bitmap", "a VnodeBitmap", type(bitmap).__name__)
        if bitmap.vnode_count != self._vnode_count:
            raise InvalidArgumentError(
                "bitmap", f"a bitmap of {self._vnode_count} vnodes", f"{bitmap.vnode_count} vnodes"
            )
        if not bitmap.count():
            raise InvalidArgumentError("bitmap", "a bitmap with at least one vnode", bitmap)

    async def register(
        self, bitmap: VnodeBitmap, *, writer: str | None = None, name: str | None = None
    ) -> WriterHandle:
        """Register a writer owning ``bitmap``; waits until the coordinator runs.

        Args:
            bitmap: the vnodes the writer owns.
            writer: the writer id its connector stages files under; two running writers of
                one sink with the same id would overwrite each other's files, so the
                coordinator fails with :class:`~barrierflow.errors.DuplicateWriterError`.
            name: who registers (the writer actor's name), for logs and errors.

        Raises:
            InvalidArgumentError: the bitmap is not a non-empty bitmap of ``vnode_count``
                vnodes, or ``writer``/``name`` is not ``None`` or a non-empty str.
        """
        self.check_bitmap(bitmap)
        for argument, value in (("writer", writer), ("name", name)):
            if value is not None and (not isinstance(value, str) or not value):
                raise InvalidArgumentError(argument, "None or a non-empty str", value)
        self._next_id += 1
        handle = WriterHandle(self, self._next_id, bitmap, writer, name)
        await self.tell(NewHandle(handle))
        return handle

    @property
    def actor(self) -> str:
        """The name of the coordinator's inbox (``<sink>.coordinator``), as errors give it."""
        return f"{self.sink}.coordinator"

    async def tell(self, event: Event) -> None:
        """Queue a writer handle's event for the run without waiting for an answer (what a
        :class:`~barrierflow.actors.sinks.coordinator.handles.WriterHandle` sends; waits for the
        run to start).

        Raises:
            ActorGoneError: the coordinator stopped.
        """
        await (await self._running_ref()).tell(event)

    async def ask(self, event: Commit | AlignInitial) -> Any:
        """Queue a writer handle's request and wait for its answer (waits for the run to
        start).

        Raises:
            ActorGoneError: the coordinator stopped before it took the request.
            CoordinatorAbortedError: the run failed before it answered.
            Exception: the error the coordinator refused the request with.
        """
        return await (await self._running_ref()).ask(event)

    async def _running_ref(self) -> ActorRef[Event]:
        while self._ref is None:
            if self._ready is None:
                self._ready = Notifier()
            await self._ready.wait()
        return self._ref

    def is_committed(self, epoch: int) -> bool:
        """Whether every epoch up to ``epoch`` was acknowledged and committed in this run."""
        if self._last_acked is None or epoch > self._last_acked or self._queue is None:
            return False
        return not self._queue.holds_through(epoch)

    async def wait_committed(self, epoch: int) -> None:
        """Wait until every epoch up to ``epoch`` is committed (what a writer waits for before
        it leaves at a graceful stop, so the last epoch is visible when the runtime stops)."""
        while not self.is_committed(epoch):
            if self._progress is None:
                self._progress = Notifier()
            await self._progress.wait()

    async def wait_commits_through(self, epoch: int) -> None:
        """Wait until no epoch up to ``epoch`` waits for its commit: the coordinator has
        recovered (the pending epochs of the last run are queued) and every epoch acknowledged
        up to ``epoch`` is committed. A reader of what commits with the table's epochs (the
        keyed state of a Spark bridge's tasks) waits for it with the runtime's committed
        epoch before reading "as of the last commit"."""
        while self._queue is None or self._queue.holds_through(epoch):
            if self._progress is None:
                self._progress = Notifier()
            await self._progress.wait()

    def _made_progress(self) -> None:
        if self._progress is not None:
            self._progress.notify()

    def stats(self) -> CoordinatorStats:
        """A snapshot of the counters of the current run."""
        queue = self._queue
        return CoordinatorStats(
            writers=len(self._writers.handles),
            running=len(self._writers.running),
            acked_epochs=self._acked,
            committed_epochs=0 if queue is None else queue.commits,
            pending_epochs=0 if queue is None else queue.waiting,
            last_acked_epoch=self._last_acked or 0,
            last_committed_epoch=0 if queue is None else queue.last_committed,
            commit_failures=self._backoff.failures,
            commit_replays=0 if queue is None else queue.replays,
            retry_delays=tuple(self._backoff.recent),
            aborted_epochs=tuple(self._aborted),
            rows_committed=0 if queue is None else queue.rows_committed,
            last_commit_time=None if queue is None else queue.last_commit_time,
        )

    def metric_families(self) -> list[MetricFamily]:
        """The coordinator's counters as metrics (the runtime collects them; its commit
        latencies are histograms of the runtime's registry)."""
        return coordinator_families(self.sink, self.stats())

    def _observe_commit(self, item: CommitItem, started: float) -> None:
        """Time a commit that went through: how long it took, and how long after its
        checkpoint became durable it landed."""
        now = anyio.current_time()
        self._commit_seconds.observe(now - started, self.sink)
        durable = self._durable.since(item.epoch)
        if durable is not None:
            self._commit_latency.observe(now - durable, self.sink)

    # The service.

    async def run(self, ctx: ServiceContext) -> None:
        """Coordinate until cancelled; on failure abort every writer handle, then raise."""
        self._reset_run_state()
        self._commit_seconds, self._commit_latency = commit_histograms(ctx.metrics)
        ref, receive = open_command_actor(self.actor, 1024)
        self._ref = ref
        if self._ready is not None:
            self._ready.notify()
        try:
            with single_error():
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._follow_committed_epochs, ctx, ref.clone())
                    await self._coordinate(ctx, receive, tg)
        except BaseException as exc:
            abort_run(self.sink, exc, receive, self._writers, self._replies)
            raise
        finally:
            # Closed before anything awaits: a writer blocked on the full inbox gets
            # ActorGoneError ("its inbox is closed") now, and nothing can slip into it after
            # abort_run emptied it. The ref itself is left open: writers send through it, and
            # closing it would tell a blocked one that *its* handle was closed.
            self._ref = None
            receive.close()
            if self._queue is not None:
                await self._queue.mark_committed()

    async def _follow_committed_epochs(self, ctx: ServiceContext, ref: ActorRef[Event]) -> None:
        """Post each committed epoch to the inbox.

        Raises:
            CommittedEpochsEndedError: the stream ended while the run goes on (the runtime
                cancels its services before it closes the store). Commits wait for it, so the
                seed fails its coordinator then instead of silently stopping every commit.
        """
        last: int | None = None
        try:
            async for epoch in ctx.committed_epochs():
                last = epoch
                await ref.tell(CommittedEpoch(epoch))
        finally:
            ref.close()
        queue = self._queue
        waiting = [] if queue is None else [i.epoch for i in (*queue.prepared, *queue.pending)]
        raise CommittedEpochsEndedError(self.sink, last, waiting)

    async def _coordinate(
        self, ctx: ServiceContext, inbox: ReceiveChannel[Inbound], tg: anyio.abc.TaskGroup
    ) -> None:
        self._inbox_rx = inbox
        states = SinkStates(ctx.store, self.sink)
        recovered = await recover(self.sink, states, self._committer, self._log)
        self._aborted = recovered.aborted
        self._last_acked = recovered.rewind
        last_committed = recovered.last_committed or 0
        queue = self._queue = CommitQueue(
            self._committer, states, ctx.committed_epoch, last_committed, self._backoff,
            self._warn_interval, self._log, self._made_progress,
            sink=self.sink, retry_timeout=self._commit_retry_timeout,
        )  # fmt: skip
        tg.start_soon(queue.write_marks)
        for item in recovered.pending:
            queue.push(item)
        self._made_progress()  # recovered: a wait_commits_through sees the queue now
        await self._committer.recover(
            {item.epoch: item.metadata for item in recovered.pending if item.metadata is not None}
        )
        running = await register_all(self.sink, self._vnode_count, self._round_event, self._writers)
        await self._try_start(running)
        epochs = EpochRounds(self.sink, self._vnode_count)
        new_handles: list[WriterHandle] = []
        while True:
            if self._state_waiting is not None and queue.is_empty():
                waiting, self._state_waiting = self._state_waiting, None
                await self._start(waiting)
            due = queue.due(anyio.current_time())
            if due is not None:
                started = anyio.current_time()
                if await queue.commit(due):
                    self._observe_commit(due, started)
                    self._made_progress()
                continue
            event = await self._next_event(queue.deadline())
            if event is None:
                continue  # a retry is due
            if isinstance(event, NewHandle):
                new_handles.append(event.handle)
            elif isinstance(event, UpdateBitmap | StopHandle):
                altered = new_handles
                if isinstance(event, UpdateBitmap):
                    event.handle.bitmap = event.bitmap
                    altered = [*new_handles, event.handle]
                else:
                    self._writers.remove(event.handle)
                running = await realign(
                    self.sink, self._vnode_count, self._round_event, self._writers, altered
                )
                new_handles = []
                await self._try_start(running)
            elif isinstance(event, AlignInitial):
                raise UnexpectedWriterRequestError(
                    self.sink, "running", "AlignInitial only during init", event_name(event),
                    event.handle.handle_id, event.epoch,
                )  # fmt: skip
            elif isinstance(event, Commit):
                await self._on_commit_request(event, epochs)

    async def _next_event(self, deadline: float) -> Event | None:
        """The next writer event; committed epochs are absorbed on the way. ``None`` once the
        deadline (a due retry) passed."""
        while True:
            received: Inbound | None = None
            with anyio.move_on_after(deadline - anyio.current_time()):
                received = await self._inbox_rx.receive()
            if received is None:
                return None
            event = take(*received)
            if isinstance(event, CommittedEpoch):
                assert self._queue is not None
                self._durable.add(event.epoch, anyio.current_time())
                self._queue.on_committed_epoch(event.epoch)
                return None  # re-evaluate what is due
            self._replies.track(event)
            return event

    async def _round_event(self, round_: CoverageRound[Any]) -> Event:
        return await round_.next_event(self._next_event, self._warn_interval, self._log)

    async def _try_start(self, handles: set[int]) -> None:
        assert self._queue is not None
        if self._queue.has_uncommitted_schema_change():
            # New writers must load the new schema: wait until every pending commit flushed.
            self._state_waiting = set(handles)
        else:
            await self._start(handles)

    async def _start(self, handles: set[int]) -> None:
        rewind = self._last_acked
        for handle_id in handles:
            handle = self._writers.handles.get(handle_id)
            if handle is None:
                raise UnexpectedWriterRequestError(
                    self.sink, "start", f"writer {handle_id} registered", "StopHandle", handle_id
                )
            handle._started.set(rewind)
            self._writers.running.add(handle_id)
        if rewind is None:
            requests = await align_initial(self.sink, self._vnode_count, self._round_event)
            aligned = max(request.epoch for request in requests)
            for request in requests:
                self._replies.answer(request.reply, aligned)

    # Per epoch.

    async def _on_commit_request(self, event: Commit, epochs: EpochRounds) -> None:
        handle_id = event.handle.handle_id
        if handle_id not in self._writers.running:
            raise refuse(
                event.reply,
                UnexpectedWriterRequestError(
                    self.sink, "running", f"commit requests from running writers "
                    f"{sorted(self._writers.running)}", "Commit", handle_id, event.epoch,
                ),
            )  # fmt: skip
        if self._last_acked is not None and event.epoch <= self._last_acked:
            raise refuse(
                event.reply,
                EpochOrderError(
                    f"commit epoch of writer {handle_id}", self._last_acked, event.epoch
                ),
            )
        self._replies.add(event.reply)
        for epoch, requests in epochs.add(event):
            await self._complete_epoch(epoch, requests)

    async def _complete_epoch(self, oldest: int, requests: list[Commit]) -> None:
        change = requests[0].manifest.schema_change
        for request in requests[1:]:
            if request.manifest.schema_change != change:
                raise SchemaChangeMismatchError(
                    self.sink, oldest, change, request.manifest.schema_change
                )
        assert self._queue is not None
        manifests = [request.manifest for request in requests]
        # The batches staged outside the graph whose committables arrived in this epoch.
        manifests += check_epoch_batches(self.sink, [b for r in requests for b in r.staged])
        await self._queue.complete(oldest, manifests, change)
        for request in requests:
            self._replies.answer(request.reply)
        self._acked += 1
        self._last_acked = oldest
        self._made_progress()
