"""The barrier manager: injects barriers, collects them, and completes epochs in order.

Every ``barrier_interval`` (and on demand) the manager makes the next :class:`EpochPair`
(strictly increasing, from an :class:`EpochClock` that starts past the committed epoch), and
sends one barrier into every source's inbox; every ``checkpoint_frequency``-th barrier is a
checkpoint. At most ``max_in_flight`` barriers are in flight: injection waits for the oldest to
complete rather than run ahead of a slow graph.

Each actor reports a barrier collected after passing it downstream. An epoch completes when
every actor has collected it, and epochs complete in injection order: a checkpoint barrier
``(curr, prev)`` then commits every state table up to ``prev`` in one transaction and
publishes ``prev`` as the committed epoch.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import final

import anyio
import structlog

from barrierflow.channels.barrier import Barrier, BarrierKind
from barrierflow.channels.channel import SendChannel
from barrierflow.channels.epoch import EpochClock, EpochPair
from barrierflow.channels.errors import BarrierflowError, InvalidArgumentError
from barrierflow.channels.messages import Message
from barrierflow.channels.mutation import MUTATION_TYPES, Mutation
from barrierflow.runtime.config import check_count, check_seconds
from barrierflow.runtime.errors import BarrierCollectError, NotRunningError
from barrierflow.runtime.metrics import MetricsRegistry
from barrierflow.runtime.positions import merge_positions
from barrierflow.runtime.progress import Progress
from barrierflow.runtime.state.state_store import StateStore

__all__ = ["BarrierManager", "InFlightBarrier"]


@final
class InFlightBarrier:
    """A barrier that was injected; :meth:`wait` returns once its epoch completed.

    Raises:
        InvalidArgumentError: ``barrier`` is not a Barrier, or ``actors`` not a set of int ids.
    """

    __slots__ = (
        "_done",
        "_error",
        "barrier",
        "collected_at",
        "injected_at",
        "missed",
        "passed",
        "remaining",
    )

    def __init__(self, barrier: Barrier, actors: set[int]) -> None:
        if not isinstance(barrier, Barrier):
            raise InvalidArgumentError("barrier", "a Barrier", type(barrier).__name__)
        self.barrier = barrier
        self.remaining = _actor_ids("actors", actors)
        #: When it was injected (:func:`anyio.current_time`; set by the manager that injects
        #: it): how long it has been in flight.
        self.injected_at = 0.0
        #: When every actor had collected it (``None`` until then).
        self.collected_at: float | None = None
        #: The actors that finished without collecting it (their input ended first): it did
        #: not go through them, so it completes without them — and whoever read it and ended
        #: without passing it on lost it for everyone downstream (see
        #: :func:`~barrierflow.runtime.watchdog.diagnose`).
        self.missed: set[int] = set()
        #: The actors that collected it (passed it downstream): an actor whose every upstream
        #: passed it was sent the barrier; one whose upstream ended first never was.
        self.passed: set[int] = set()
        self._done = anyio.Event()
        self._error: BaseException | None = None

    async def wait(self) -> Barrier:
        """Wait until every actor collected the barrier (and, for a checkpoint, it is durable).

        Raises:
            BarrierflowError: the graph failed before the epoch completed.
        """
        await self._done.wait()
        if self._error is not None:
            raise self._error
        return self.barrier

    def _finish(self, error: BaseException | None = None) -> None:
        self._error = error
        self._done.set()


def _actor_ids(argument: str, actors: object) -> set[int]:
    if not isinstance(actors, set | frozenset | list | tuple) or not all(
        type(a) is int for a in actors
    ):
        raise InvalidArgumentError(argument, "a set of int actor ids", actors)
    return set(actors)


def _check_barrier(barrier: object) -> None:
    if not isinstance(barrier, Barrier):
        raise InvalidArgumentError("barrier", "a Barrier", type(barrier).__name__)


@final
class BarrierManager:
    """Injects and collects the barriers of one graph incarnation.

    Every argument is checked on construction (the runtime builds one per incarnation, so a
    bad value must not wait for the first barrier to fail).

    Raises:
        InvalidArgumentError: ``store`` is not a StateStore, ``sources`` not a mapping of int
            actor id to SendChannel, ``actors`` not a set of int ids, or ``clock`` neither
            ``None`` nor callable.
        ConfigError: ``barrier_interval`` is not a finite number of seconds > 0, or
            ``checkpoint_frequency`` / ``max_in_flight`` not an int >= 1.
    """

    def __init__(
        self,
        store: StateStore,
        sources: Mapping[int, SendChannel[Message]],
        actors: set[int],
        *,
        barrier_interval: float,
        checkpoint_frequency: int,
        max_in_flight: int,
        clock: Callable[[], float] | None = None,
        metrics: MetricsRegistry | None = None,
    ) -> None:
        if not isinstance(store, StateStore):
            raise InvalidArgumentError("store", "a StateStore", type(store).__name__)
        if not isinstance(sources, Mapping) or not all(
            type(k) is int and isinstance(v, SendChannel) for k, v in sources.items()
        ):
            raise InvalidArgumentError(
                "sources", "a mapping of int actor id to SendChannel", sources
            )
        if clock is not None and not callable(clock):
            raise InvalidArgumentError("clock", "None or a callable returning seconds", clock)
        self._store = store
        self._sources = dict(sources)
        self._actors = _actor_ids("actors", actors)
        self._interval = check_seconds("barrier_interval", barrier_interval)
        self._frequency = check_count("checkpoint_frequency", checkpoint_frequency)
        self._max_in_flight = check_count("max_in_flight", max_in_flight)
        self._clock = (
            EpochClock(store.committed_epoch)
            if clock is None
            else EpochClock(store.committed_epoch, clock)
        )
        self._pair: EpochPair | None = None
        self._in_flight: OrderedDict[int, InFlightBarrier] = OrderedDict()
        self._closed = False  # drained: every actor finished, nothing more is injected
        self._inject_lock = anyio.Lock()
        self._slot_freed = anyio.Event()
        self._collected = anyio.Event()
        self._injected = 0
        self._completed = 0
        # Source positions reported with each in-flight barrier (see runtime.positions).
        self._positions: dict[int, dict[str, int]] = {}
        # Progress reported with each in-flight barrier, per actor (see runtime.progress).
        self._progress: dict[int, dict[int, Progress]] = {}
        #: Called with each completed barrier and the progress collected with it.
        self.on_complete: Callable[[Barrier, dict[int, Progress]], None] | None = None
        registry = MetricsRegistry() if metrics is None else metrics
        self._latency = registry.histogram(
            "barrierflow_barrier_latency_seconds",
            "seconds from a barrier's injection until every actor collected it "
            "(stage=collected) and, for a checkpoint, until it was durable (stage=durable)",
            ("stage",),
        )
        self._checkpoint_seconds = registry.histogram(
            "barrierflow_checkpoint_seconds",
            "seconds the state store took to commit a checkpoint",
        )
        self._log = structlog.get_logger("barrierflow.barrier_manager")

    @property
    def current_epoch(self) -> int:
        """The ``curr`` of the last injected barrier (0 before the first)."""
        return 0 if self._pair is None else self._pair.curr

    @property
    def barrier_interval(self) -> float:
        """Seconds between injected barriers."""
        return self._interval

    @property
    def in_flight(self) -> int:
        """Barriers injected but not yet completed."""
        return len(self._in_flight)

    def oldest(self) -> InFlightBarrier | None:
        """The oldest barrier in flight (the one every later one completes after), if any."""
        return next(iter(self._in_flight.values()), None)

    @property
    def completed(self) -> int:
        """Barriers whose epoch completed."""
        return self._completed

    async def inject(
        self,
        kind: BarrierKind | None = None,
        mutation: Mutation | None = None,
        *,
        add_actors: Iterable[int] = (),
        add_sources: Mapping[int, SendChannel[Message]] | None = None,
    ) -> InFlightBarrier:
        """Inject the next barrier into every source; waits while too many are in flight.

        Args:
            kind: ``None`` lets the checkpoint frequency decide (the first barrier of a graph
                is always INITIAL).
            mutation: carried by this barrier.
            add_actors: actors that join with this barrier (a job added to the running graph):
                this barrier and every later one wait for them, no earlier one does.
            add_sources: the inboxes of joining sources (they get this barrier first).

        Raises:
            NotRunningError: every actor of the graph has finished (see :meth:`drain`).
            InvalidArgumentError: ``kind`` is neither ``None`` nor a BarrierKind, or
                ``mutation`` neither ``None`` nor a mutation (checked before any epoch is
                taken); (``clock``) the clock returned something that is not a finite time.
        """
        if kind is not None and not isinstance(kind, BarrierKind):
            raise InvalidArgumentError("kind", "None or a BarrierKind", kind)
        if mutation is not None and not isinstance(mutation, MUTATION_TYPES):
            raise InvalidArgumentError("mutation", "None or a Mutation", type(mutation).__name__)
        async with self._inject_lock:
            if self._closed:
                raise NotRunningError("the graph", "a graph with running actors (all finished)")
            while len(self._in_flight) >= self._max_in_flight:
                self._slot_freed = anyio.Event()
                await self._slot_freed.wait()
            if self._pair is None:
                self._pair = EpochPair(self._clock.next(), self._store.committed_epoch)
                kind = BarrierKind.INITIAL
            else:
                self._pair = self._pair.advance(self._clock.next())
                if kind is None:
                    due = (self._injected % self._frequency) == 0
                    kind = BarrierKind.CHECKPOINT if due else BarrierKind.BARRIER
            self._injected += 1
            self._actors.update(_actor_ids("add_actors", list(add_actors)))
            self._sources.update(add_sources or {})
            barrier = Barrier(self._pair, kind, mutation)
            flight = InFlightBarrier(barrier, self._actors)
            flight.injected_at = anyio.current_time()
            self._in_flight[barrier.epoch.curr] = flight
            if not flight.remaining:
                # Every actor retired (the graph is stopping): nobody will collect it, so it
                # completes as soon as the barriers before it have.
                self._collected.set()
            for actor, inbox in list(self._sources.items()):
                if actor not in self._sources:
                    continue  # retired while an earlier send waited
                await inbox.send(barrier)
            return flight

    def remove_sources(self, actors: Iterable[int]) -> None:
        """Inject nothing more into these sources (their job was dropped)."""
        for actor in actors:
            self._sources.pop(actor, None)

    def collect(self, actor_id: int, barrier: Barrier, progress: Progress | None = None) -> None:
        """Record that ``actor_id`` passed ``barrier`` downstream, with the progress it
        reported since its previous barrier.

        Raises:
            InvalidArgumentError: ``barrier`` is not a Barrier.
            BarrierCollectError: the barrier was never injected (or already completed), or
                the actor collected it twice.
        """
        _check_barrier(barrier)
        flight = self._in_flight.get(barrier.epoch.curr)
        if flight is None or actor_id not in flight.remaining:
            raise BarrierCollectError(actor_id, barrier.epoch.curr, self._in_flight)
        flight.remaining.discard(actor_id)
        flight.passed.add(actor_id)
        if progress is not None:
            self._progress.setdefault(barrier.epoch.curr, {})[actor_id] = progress
        if not flight.remaining:
            flight.collected_at = anyio.current_time()
            self._collected.set()

    async def wait_completed(self, barrier: Barrier) -> None:
        """Wait until every actor collected ``barrier`` (and, for a checkpoint, it is durable);
        at once if it completed already.

        Raises:
            InvalidArgumentError: ``barrier`` is not a Barrier.
            BarrierflowError: the graph failed before it completed.
        """
        _check_barrier(barrier)
        flight = self._in_flight.get(barrier.epoch.curr)
        if flight is not None:
            await flight.wait()

    def report_positions(self, barrier: Barrier, positions: Mapping[str, int]) -> None:
        """A source's positions as of ``barrier`` (everything it emitted before it); called
        before the source passes the barrier, so every actor downstream finds them."""
        epoch = barrier.epoch.curr
        self._positions[epoch] = merge_positions(self._positions.get(epoch, {}), positions)

    def positions_at(self, barrier: Barrier) -> dict[str, int]:
        """Every source's positions reported with ``barrier`` (empty if none were)."""
        return dict(self._positions.get(barrier.epoch.curr, {}))

    def retire(self, actor_id: int, barrier: Barrier | None = None) -> None:
        """``actor_id`` finished: at ``barrier`` (stopped or dropped) — later barriers, in
        flight or to come, no longer wait for it — or, with ``None``, because its input ended
        (no barrier it has not collected yet will ever reach it: each in-flight one records
        it in :attr:`InFlightBarrier.missed`). A source gets no more barriers.

        Raises:
            InvalidArgumentError: ``barrier`` is neither ``None`` nor a Barrier.
        """
        if barrier is not None:
            _check_barrier(barrier)
        self._actors.discard(actor_id)
        self._sources.pop(actor_id, None)
        for flight in self._in_flight.values():
            if barrier is None and actor_id in flight.remaining:
                flight.missed.add(actor_id)
            if barrier is None or flight.barrier.epoch.curr > barrier.epoch.curr:
                flight.remaining.discard(actor_id)
        self._collected.set()

    async def run(self) -> None:
        """Inject the initial barrier (unless already injected), then one every interval;
        complete epochs in order."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._complete_in_order)
            if self._pair is None:
                await self.inject()
            while not self._closed:
                await anyio.sleep(self._interval)
                with contextlib.suppress(NotRunningError):  # drained meanwhile: done
                    await self.inject()

    async def _complete_in_order(self) -> None:
        while True:
            await self._collected.wait()
            self._collected = anyio.Event()
            while self._in_flight:
                epoch, flight = next(iter(self._in_flight.items()))
                if flight.remaining:
                    break
                barrier = flight.barrier
                collected = (
                    anyio.current_time() if flight.collected_at is None else flight.collected_at
                )
                self._latency.observe(collected - flight.injected_at, "collected")
                if barrier.is_checkpoint:
                    committing = anyio.current_time()
                    await self._store.commit(barrier.epoch.prev)
                    durable = anyio.current_time()
                    self._checkpoint_seconds.observe(durable - committing)
                    self._latency.observe(durable - flight.injected_at, "durable")
                del self._in_flight[epoch]
                self._positions.pop(epoch, None)
                progress = self._progress.pop(epoch, {})
                if self.on_complete is not None:
                    self.on_complete(barrier, progress)
                self._completed += 1
                self._slot_freed.set()
                flight._finish()

    async def drain(self) -> None:
        """Once every actor finished: wait until each in-flight barrier they all collected has
        completed (its checkpoint committed), and fail the ones no actor is left to collect.

        The graph's last barrier is a ``Stop`` checkpoint: the actors finish as soon as they
        pass it, while its commit may still be ahead. Cancelling the manager then would lose
        that checkpoint and leave its waiter hanging.
        """
        while self._in_flight:
            flight = next(iter(self._in_flight.values()))
            if flight.remaining:
                break
            await flight._done.wait()
        self._closed = True
        self.fail_in_flight(
            NotRunningError("the graph", "every actor finished before this barrier")
        )

    def fail_in_flight(self, error: BarrierflowError) -> None:
        """Release every waiter of an in-flight barrier with ``error`` (the graph failed)."""
        for flight in self._in_flight.values():
            flight._finish(error)
        self._in_flight.clear()
        self._positions.clear()
        self._progress.clear()
        self._slot_freed.set()
