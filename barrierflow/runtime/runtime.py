"""The runtime: runs a graph of actors in one task group, with barriers, state and recovery.

Usage::

    rt = Runtime(RuntimeConfig(state_path="state.db"))
    rt.add_source("events")                       # a PushSource fed by rt.push()
    rt.add_actor("enrich", Enrich(), inputs=["events"])
    async with rt:
        await rt.push("events", chunk)
        epoch = await rt.checkpoint()             # returns once durable

Supervision is structured concurrency: every actor of the graph runs in one task group. An
actor that raises stops the graph and ``async with`` raises
:class:`~barrierflow.errors.ActorFailedError` naming it, with the actor's exception as
``__cause__``. With ``recovery=True`` the graph is rebuilt instead, from the last committed
checkpoint (uncommitted state is discarded, actors are re-created by their factories and
restore their tables), after ``restart_backoff`` seconds doubling per restart, at most
``max_restarts`` times. Rows pushed after the last checkpoint are not replayed by the runtime:
a pushing driver learns it from the ``ActorFailedError`` its pending ``checkpoint()`` raises,
and pushes them again (the Spark bridge does exactly that).

Leaving ``async with`` normally stops the graph cleanly: a final checkpoint barrier carrying
``Stop`` for every actor, then the store is closed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import final

import anyio
import structlog
from anyio.abc import TaskGroup

from barrierflow.channels.barrier import BarrierKind
from barrierflow.channels.channel import ChannelStatistics
from barrierflow.channels.chunk import Chunk
from barrierflow.channels.epoch import EpochPair
from barrierflow.channels.errors import ChannelBrokenError, ChannelClosedError, InvalidArgumentError
from barrierflow.channels.mutation import (
    MUTATION_TYPES,
    Add,
    Mutation,
    SourceChangeSplit,
    Stop,
    Throttle,
    Update,
)
from barrierflow.runtime._awaited import must_await
from barrierflow.runtime._incarnation import Incarnation
from barrierflow.runtime._lifecycle import Lifecycle
from barrierflow.runtime.actor import ActorStats
from barrierflow.runtime.config import RuntimeConfig, check_seconds
from barrierflow.runtime.errors import (
    ActorFailedError,
    NotRunningError,
)
from barrierflow.runtime.job import JobStats, PushSource
from barrierflow.runtime.state.state_store import CommittedEpochs, StateStore

__all__ = ["PushSource", "Runtime", "RuntimeStats"]


@final
@dataclass(frozen=True, slots=True)
class RuntimeStats:
    """A snapshot of a runtime's counters."""

    #: Actor name → its counters.
    actors: dict[str, ActorStats]
    #: Channel name → its counters (``"a->b"`` for edges, ``"a inbox"`` for sources).
    channels: dict[str, ChannelStatistics]
    #: ``curr`` of the last injected barrier.
    current_epoch: int
    #: The last durable checkpoint epoch.
    committed_epoch: int
    #: Barriers injected but not yet completed.
    barriers_in_flight: int
    #: Graph restarts so far (recovery).
    restarts: int
    #: Job name → its counters.
    jobs: dict[str, JobStats]


@final
class Runtime(Lifecycle):
    """Runs a graph of stream actors, made of jobs (see the module docstring).

    Args:
        config: how to run.
        clock: wall-clock seconds for epochs; a test may pass a fake.

    Raises:
        InvalidArgumentError: ``config`` is not a :class:`RuntimeConfig`, or ``clock`` is
            neither ``None`` nor callable. (What the clock returns is checked where it is
            read: a reading that is not a finite number is an error naming ``clock``.)
    """

    def __init__(self, config: RuntimeConfig, *, clock: Callable[[], float] | None = None) -> None:
        if not isinstance(config, RuntimeConfig):
            raise InvalidArgumentError("config", "a RuntimeConfig", config)
        if clock is not None and not callable(clock):
            raise InvalidArgumentError("clock", "None or a callable returning seconds", clock)
        super().__init__()
        self._config = config
        self._clock = clock
        self._store: StateStore | None = None
        self._task_group: TaskGroup | None = None
        self._incarnation: Incarnation | None = None
        self._restarts = 0
        self._failure: ActorFailedError | None = None
        self._last_failure: ActorFailedError | None = None
        self._rebuilt: anyio.Event | None = None
        self._jobs_lock = anyio.Lock()
        self._forget: set[str] = set()
        self._log = structlog.get_logger("barrierflow.runtime")

    # Driving a running graph.

    async def _running(self) -> Incarnation:
        """The current graph, waiting while recovery rebuilds it."""
        while True:
            if self._task_group is None:
                raise NotRunningError("the runtime", "use it inside `async with rt:`")
            if self._failure is not None:
                # The graph failed for good: a caller outside the runtime's task group (a
                # blocking portal's call from a Spark thread) must not wait for a rebuild.
                raise self._failure
            incarnation = self._incarnation
            if incarnation is not None:
                await incarnation.ready.wait()
                if incarnation.finished:
                    raise NotRunningError(
                        "the graph", "a graph with running actors (every actor has finished)"
                    )
                return incarnation
            assert self._rebuilt is not None
            await self._rebuilt.wait()

    @must_await
    async def wait_running(self) -> None:
        """Return once the graph runs (at once, or after recovery rebuilt it).

        Raises:
            ActorFailedError: the graph failed for good (no recovery, or no restarts left).
            NotRunningError: the runtime is not running.
        """
        await self._running()

    @must_await
    async def push(self, source: str, chunk: Chunk) -> None:
        """Send ``chunk`` into the inbox of push source ``source`` (waits while it is full).

        Raises:
            InvalidArgumentError: ``source`` is not a source, or ``chunk`` not a Chunk.
            ActorFailedError: the graph failed while the chunk waited for room (with recovery,
                the graph is rebuilt from the last checkpoint; push again what followed it).
            NotRunningError: the runtime is not running.
        """
        if not isinstance(source, str):
            raise InvalidArgumentError("source", "a source's name (a str)", source)
        if not isinstance(chunk, Chunk):
            raise InvalidArgumentError("chunk", "a Chunk", type(chunk).__name__)
        incarnation = await self._running()
        inbox = incarnation.inboxes.get(source)
        if inbox is None:
            raise InvalidArgumentError("source", f"one of {list(incarnation.inboxes)}", source)
        with self._as_failure():
            await inbox.send(chunk)

    @must_await
    async def checkpoint(self, timeout: float | None = None) -> int:  # noqa: ASYNC109
        # (A timeout of its own, not ``fail_after``: on expiry the caller gets the error that
        # names who holds the barrier, and the injection is never cancelled half way.)
        """Inject a checkpoint barrier now and return the epoch it made durable.

        Args:
            timeout: seconds to wait at most (``None``: as long as it takes). The checkpoint is
                not withdrawn when the wait gives up: it completes, or fails, with the graph.

        Raises:
            ActorFailedError: the graph failed before the checkpoint completed.
            BarrierStuckError: ``timeout`` passed first; it names the actors that hold the
                barrier.
            ConfigError: ``timeout`` is not ``None`` or a finite number of seconds > 0.
        """
        if timeout is not None:
            check_seconds("timeout", timeout)
        incarnation = await self._running()
        if timeout is None:
            return await self._checkpoint_in(incarnation)
        # The checkpoint runs as a task of the runtime, so that giving up on it never cancels
        # an injection half way (a barrier some sources got and others did not).
        outcome: list[int | Exception] = []
        done = anyio.Event()

        async def run() -> None:
            try:
                outcome.append(await self._checkpoint_in(incarnation))
            except Exception as exc:  # handed to the caller below
                outcome.append(exc)
            finally:
                done.set()

        assert self._task_group is not None
        self._task_group.start_soon(run, name="checkpoint")
        with anyio.move_on_after(timeout):
            await done.wait()
        if not outcome:
            raise incarnation.stuck_error(self._graph.nodes)
        result = outcome[0]
        if isinstance(result, Exception):
            raise result
        return result

    async def _checkpoint_in(self, incarnation: Incarnation) -> int:
        with self._as_failure():
            flight = await incarnation.manager.inject(BarrierKind.CHECKPOINT)
        barrier = await flight.wait()
        return barrier.epoch.prev

    @contextlib.contextmanager
    def _as_failure(self) -> Iterator[None]:
        """A send into a graph that just failed surfaces as the failure itself."""
        try:
            yield
        except (ChannelClosedError, ChannelBrokenError) as exc:
            failure = self._last_failure
            if failure is None:
                raise
            raise failure from exc

    @must_await
    async def mutate(self, mutation: Mutation) -> EpochPair:
        """Inject a barrier carrying ``mutation`` now; returns its epoch once collected.

        Raises:
            InvalidArgumentError: ``mutation`` is not a mutation (checked before anything is
                injected), or names an actor id that is not in the graph.
        """
        if not isinstance(mutation, MUTATION_TYPES):
            raise InvalidArgumentError(
                "mutation", "a Mutation (Add, Pause, Resume, ...)", type(mutation).__name__
            )
        ids = {n.actor_id for n in self._graph.nodes.values()}
        named: set[int] = set()
        if isinstance(mutation, Add | SourceChangeSplit):
            named |= set(mutation.splits)
        elif isinstance(mutation, Throttle):
            named |= set(mutation.rates)
        elif isinstance(mutation, Update):
            named |= set(mutation.splits) | set(mutation.vnode_bitmaps) | mutation.dropped_actors
        elif isinstance(mutation, Stop):
            named |= mutation.actors
        unknown = sorted(named - ids)
        if unknown:
            raise InvalidArgumentError(
                "mutation", f"actor ids of this graph {sorted(ids)}", unknown
            )
        incarnation = await self._running()
        with self._as_failure():
            flight = await incarnation.manager.inject(mutation=mutation)
        return (await flight.wait()).epoch

    def actor_id(self, name: str) -> int:
        """The id of the actor named ``name``.

        Raises:
            InvalidArgumentError: no actor is named ``name``.
        """
        node = self._graph.nodes.get(name) if isinstance(name, str) else None
        if node is None:
            raise InvalidArgumentError("name", f"one of {list(self._graph.nodes)}", name)
        return node.actor_id

    @property
    def committed_epoch(self) -> int:
        """The last durable checkpoint epoch."""
        return 0 if self._store is None else self._store.committed_epoch

    def committed_epochs(self) -> CommittedEpochs:
        """The committed epoch now, then each newer one (see ``StateStore.committed_epochs``)."""
        if self._store is None:
            raise NotRunningError("the runtime", "use it inside `async with rt:`")
        return self._store.committed_epochs()

    def stats(self) -> RuntimeStats:
        """Per-actor, per-channel and per-job counters, epochs and restarts."""
        incarnation = self._incarnation
        if incarnation is None:
            return RuntimeStats({}, {}, 0, self.committed_epoch, 0, self._restarts, {})
        actors = {name: ctx.stats() for name, ctx in incarnation.contexts.items()}
        jobs: dict[str, JobStats] = {}
        for name, record in self._records.items():
            members = tuple(n for n in record.job.actor_names() if n in actors)
            jobs[name] = JobStats(
                job=name,
                actors=members,
                created_epoch=record.created_epoch,
                rows_in=sum(actors[n].rows_in for n in members),
                rows_out=sum(actors[n].rows_out for n in members),
                ready=record.snapshot().ready,
            )
        return RuntimeStats(
            actors=actors,
            channels={tx.name: tx.statistics() for tx in incarnation.channels},
            current_epoch=incarnation.manager.current_epoch,
            committed_epoch=self.committed_epoch,
            barriers_in_flight=incarnation.manager.in_flight,
            restarts=self._restarts,
            jobs=jobs,
        )

    def __repr__(self) -> str:
        state = "running" if self._task_group is not None else "stopped"
        return f"<Runtime {state} actors={list(self._graph.nodes)}>"
