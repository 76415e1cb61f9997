"""The graph while it runs, as a runtime's callers reach it: waiting for it (also while
recovery rebuilds it), pushing into its sources, injecting checkpoints and mutations, and
seeing its failure instead of a closed channel.

:class:`LiveGraph` is the part of a :class:`~barrierflow.runtime.runtime.Runtime` that holds
what the lifecycle (:mod:`._lifecycle`) started — the task group, the current incarnation, the
failures — and that the callers and the running jobs (:mod:`._jobs`) read. It is kept apart
from the lifecycle so that the lifecycle (its writer) and the running jobs (given two of its
methods: :meth:`LiveGraph.running` and :meth:`LiveGraph.as_failure`) each depend on it, and
neither on the other's internals: the lifecycle uses the running jobs, never the reverse."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import anyio
from anyio.abc import TaskGroup

from barrierflow.channels.barrier import BarrierKind
from barrierflow.channels.chunk import Chunk
from barrierflow.channels.epoch import EpochPair
from barrierflow.channels.errors import ChannelBrokenError, ChannelClosedError, InvalidArgumentError
from barrierflow.channels.mutation import Add, Mutation, SourceChangeSplit, Stop, Throttle, Update
from barrierflow.runtime._declare import Declarations
from barrierflow.runtime._incarnation import Incarnation
from barrierflow.runtime.errors import ActorFailedError, NotRunningError

__all__ = ["LiveGraph"]


class LiveGraph:
    """The running graph of a runtime (see the module).

    It owns, between entering and leaving ``async with``, a reference to the runtime's task
    group (its presence is what "running" means to a caller, and a checkpoint with a timeout
    runs in it), the current :class:`~barrierflow.runtime._incarnation.Incarnation` (``None``
    while recovery rebuilds it, with an event set once it runs again), the last actor failure
    (what a send into the graph it killed raises) and the failure for good, if any. The
    lifecycle is its only writer (:meth:`attach`, :meth:`install`, :meth:`lose`, ...); it reads
    the graph's actors in the ``declarations`` it is given.
    """

    def __init__(self, declarations: Declarations) -> None:
        self._declarations = declarations
        self._task_group: TaskGroup | None = None
        self._incarnation: Incarnation | None = None
        self._rebuilt: anyio.Event | None = None
        self._failure: ActorFailedError | None = None
        self._last_failure: ActorFailedError | None = None

    # What the lifecycle writes.

    def attach(self, task_group: TaskGroup) -> None:
        """The runtime entered ``async with``: callers may wait for its first incarnation."""
        self._rebuilt = anyio.Event()
        self._task_group = task_group

    def detach(self) -> None:
        """The runtime is leaving ``async with``: a caller is told it does not run."""
        self._task_group = None

    def install(self, incarnation: Incarnation) -> None:
        """``incarnation`` is the graph now (callers wait until it is ready, see
        :meth:`announce_ready`)."""
        self._incarnation = incarnation

    def announce_ready(self) -> None:
        """The installed incarnation runs: wake the callers that waited for it."""
        if self._incarnation is not None:
            self._incarnation.ready.set()
        if self._rebuilt is not None:
            self._rebuilt.set()

    def lose(self, failure: ActorFailedError) -> None:
        """An actor failed and took the incarnation with it: its barriers in flight fail with
        ``failure``, its channels close (pushes parked on it fail now), and callers wait for
        the rebuild (or :meth:`fail`)."""
        self._last_failure = failure
        old, self._incarnation = self._incarnation, None
        self._rebuilt = anyio.Event()
        if old is not None:
            old.manager.fail_in_flight(failure)
            for tx in old.channels:
                tx.close()

    def fail(self, failure: ActorFailedError) -> None:
        """The graph failed for good: every caller, waiting or to come, gets ``failure``."""
        self._failure = failure
        if self._rebuilt is not None:
            self._rebuilt.set()  # wake callers waiting for a rebuild: there is none

    # What the others read.

    @property
    def attached(self) -> bool:
        """Whether the runtime is inside ``async with``."""
        return self._task_group is not None

    @property
    def incarnation(self) -> Incarnation | None:
        """The current incarnation (``None``: not started, or being rebuilt)."""
        return self._incarnation

    @property
    def failure(self) -> ActorFailedError | None:
        """The failure for good, if the graph failed without recovery."""
        return self._failure

    async def running(self) -> Incarnation:
        """The current graph, waiting while recovery rebuilds it.

        Raises:
            ActorFailedError: the graph failed for good.
            NotRunningError: the runtime is not running, or every actor finished.
        """
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

    @contextmanager
    def as_failure(self) -> Iterator[None]:
        """A send into a graph that just failed surfaces as the failure itself."""
        try:
            yield
        except (ChannelClosedError, ChannelBrokenError) as exc:
            failure = self._last_failure
            if failure is None:
                raise
            raise failure from exc

    # Driving it (the contracts: the methods of Runtime of the same names).

    async def push(self, source: str, chunk: Chunk) -> None:
        """Send ``chunk`` into the inbox of push source ``source``."""
        incarnation = await self.running()
        inbox = incarnation.inboxes.get(source)
        if inbox is None:
            raise InvalidArgumentError("source", f"one of {list(incarnation.inboxes)}", source)
        with self.as_failure():
            await inbox.send(chunk)

    async def checkpoint(self, timeout: float | None) -> int:  # noqa: ASYNC109
        """Inject a checkpoint barrier and return the epoch it made durable (``timeout``
        checked by the caller)."""
        incarnation = await self.running()
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
            raise incarnation.stuck_error(self._declarations.graph.nodes)
        result = outcome[0]
        if isinstance(result, Exception):
            raise result
        return result

    async def _checkpoint_in(self, incarnation: Incarnation) -> int:
        with self.as_failure():
            flight = await incarnation.manager.inject(BarrierKind.CHECKPOINT)
        barrier = await flight.wait()
        return barrier.epoch.prev

    async def mutate(self, mutation: Mutation) -> EpochPair:
        """Inject a barrier carrying ``mutation``, once every actor id it names is checked
        against the graph; returns its epoch once collected."""
        ids = {n.actor_id for n in self._declarations.graph.nodes.values()}
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
        incarnation = await self.running()
        with self.as_failure():
            flight = await incarnation.manager.inject(mutation=mutation)
        return (await flight.wait()).epoch
