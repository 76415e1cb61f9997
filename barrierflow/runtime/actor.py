"""Stream actors: long-lived tasks that read messages and write messages, driven by barriers.

Subclass :class:`StreamActor` and override :meth:`~StreamActor.process` (and
:meth:`~StreamActor.restore` if the actor keeps state). The runtime gives each actor an
:class:`ActorContext`: its identity, a structlog logger bound with actor name, id and epoch,
its state tables, and :meth:`~ActorContext.emit`.

Lifecycle contract:

* :meth:`~StreamActor.restore` runs once per (re)start, before the first message; state tables
  then hold the last committed checkpoint.
* :meth:`~StreamActor.process` runs once per message, in order. An actor passes a barrier on by
  emitting it — the default ``process`` forwards everything. Emitting a barrier seals the
  actor's state tables under the epoch it closes, sends it to every output, and reports it
  collected to the barrier manager, in that order: a barrier is collected only after it was
  passed downstream.
* After emitting a barrier whose ``Stop`` (or ``Update.dropped_actors``) names the actor, its
  outputs are closed and its input is no longer read: the actor has finished.
* An exception from any hook stops the graph; the runtime reports it as
  :class:`~barrierflow.errors.ActorFailedError` naming the actor (or recovers, if configured).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import structlog

from barrierflow.channels.barrier import Barrier, BarrierKind
from barrierflow.channels.chunk import Chunk
from barrierflow.channels.dispatch import Dispatcher, HashDispatcher
from barrierflow.channels.endpoints import Receiver
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.channels.messages import Message, Watermark
from barrierflow.channels.mutation import Update
from barrierflow.channels.vnode import VnodeBitmap
from barrierflow.runtime.barrier_manager import BarrierManager
from barrierflow.runtime.positions import check_positions
from barrierflow.runtime.state.state_store import CommittedEpochs, StateStore, StateTable

__all__ = ["ActorContext", "ActorStats", "StreamActor"]


@dataclass(frozen=True, slots=True)
class ActorStats:
    """A snapshot of one actor's counters."""

    #: The actor's name and id.
    name: str
    actor_id: int
    #: Messages read from its input.
    messages_in: int
    #: Rows of chunks read from its input.
    rows_in: int
    #: Rows of chunks emitted.
    rows_out: int
    #: Barriers passed downstream.
    barriers: int
    #: The ``curr`` epoch of the last barrier it passed (0 before the first).
    current_epoch: int
    #: Whether it has finished (stopped by a barrier, or its input ended).
    finished: bool


class ActorContext:
    """What the runtime hands an actor: identity, logging, state, and the way out.

    Raises:
        InvalidArgumentError: an argument of the wrong type (``actor_id`` not an int >= 0,
            ``name`` not a non-empty str, ``input`` without ``receive()``, ``output`` not a
            Dispatcher or ``None``, ``store`` not a StateStore, ``manager`` not a
            BarrierManager).
    """

    def __init__(
        self,
        actor_id: int,
        name: str,
        input: Receiver[Message],
        output: Dispatcher | None,
        store: StateStore,
        manager: BarrierManager,
    ) -> None:
        for argument, value, ok in (
            ("actor_id", actor_id, type(actor_id) is int and actor_id >= 0),
            ("name", name, isinstance(name, str) and bool(name)),
            ("input", input, isinstance(input, Receiver)),
            ("output", output, output is None or isinstance(output, Dispatcher)),
            ("store", store, isinstance(store, StateStore)),
            ("manager", manager, isinstance(manager, BarrierManager)),
        ):
            if not ok:
                raise InvalidArgumentError(argument, f"a valid {argument}", value)
        self.actor_id = actor_id
        self.name = name
        #: The vnodes this actor owns, if its input is hash-dispatched (else ``None``).
        self.vnode_bitmap: VnodeBitmap | None = None
        #: The actor ids behind each output of ``output``, in order (set by the runtime).
        self.downstream_ids: list[int] = []
        #: Source positions adopted from a sink's storage when the run started on an empty
        #: store with ``RuntimeConfig.adopt_sink_positions`` (empty otherwise; see
        #: :mod:`barrierflow.runtime.positions`).
        self.adopted_positions: dict[str, int] = {}
        self._input = input
        self._output = output
        self._store = store
        self._manager = manager
        self._tables: list[StateTable] = []
        self.log: Any = structlog.get_logger("barrierflow.actor").bind(
            actor=name, actor_id=actor_id, epoch=0
        )
        self.epoch = 0
        self.finished = False
        self._messages_in = 0
        self._rows_in = 0
        self._rows_out = 0
        self._barriers = 0

    def table(self, name: str) -> StateTable:
        """This actor's state table ``name`` (sealed at each barrier this actor emits).

        Raises:
            InvalidArgumentError: ``name`` is not a non-empty str.
        """
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError("name", "a non-empty table name", name)
        table = self._store.table(self.name, name)
        self._tables.append(table)
        return table

    @property
    def committed_epoch(self) -> int:
        """The runtime's last durable checkpoint epoch (0 before the first)."""
        return self._store.committed_epoch

    def committed_epochs(self) -> CommittedEpochs:
        """The committed epoch now, then each newer one as checkpoints become durable (ends
        when the store closes); what an actor with a two-phase commit waits on."""
        return self._store.committed_epochs()

    def report_positions(self, barrier: Barrier, positions: Mapping[str, int]) -> None:
        """Report this source's positions as of ``barrier`` (every row emitted before it);
        call it before emitting the barrier. Sinks record them with the epoch's rows (see
        :mod:`barrierflow.runtime.positions`).

        Raises:
            InvalidArgumentError: ``barrier`` is not a Barrier, or ``positions`` does not map
                non-empty str keys to non-negative int batch ids.
        """
        if not isinstance(barrier, Barrier):
            raise InvalidArgumentError("barrier", "a Barrier", type(barrier).__name__)
        self._manager.report_positions(barrier, check_positions("positions", positions))

    def positions_at(self, barrier: Barrier) -> dict[str, int]:
        """The positions every source reported with ``barrier``: where the rows before it
        come from (what a sink writer records with an epoch's commit). Ask before passing the
        barrier on: the runtime forgets them once every actor collected it.

        Raises:
            InvalidArgumentError: ``barrier`` is not a Barrier.
        """
        if not isinstance(barrier, Barrier):
            raise InvalidArgumentError("barrier", "a Barrier", type(barrier).__name__)
        return self._manager.positions_at(barrier)

    def messages(self) -> _Messages:
        """The actor's input, until it ends or the actor has finished."""
        return _Messages(self)

    async def emit(self, message: Message) -> None:
        """Send ``message`` downstream; for a barrier, also seal state and report collection.

        Raises:
            InvalidArgumentError: ``message`` is not a Message (Chunk, Barrier or Watermark),
                even when the actor has no output.
        """
        if isinstance(message, Barrier):
            await self._pass_barrier(message)
            return
        if isinstance(message, Chunk):
            self._rows_out += message.cardinality
        elif not isinstance(message, Watermark):
            raise InvalidArgumentError(
                "message", "a Message (Chunk, Barrier or Watermark)", type(message).__name__
            )
        if self._output is not None:
            await self._output.dispatch(message)

    async def _pass_barrier(self, barrier: Barrier) -> None:
        if barrier.kind is not BarrierKind.INITIAL:
            for table in self._tables:
                table.seal(barrier.epoch.prev)
        if self._output is not None:
            await self._output.dispatch(barrier)
            if isinstance(barrier.mutation, Update):
                self._rescale_outputs(barrier.mutation)
        self.epoch = barrier.epoch.curr
        self.log = self.log.bind(epoch=self.epoch)
        self._barriers += 1
        stopping = barrier.is_stop(self.actor_id)
        if stopping:
            self.finished = True
            if self._output is not None:
                self._output.close()
        self._manager.collect(self.actor_id, barrier)
        if stopping:
            self._manager.retire(self.actor_id, barrier)

    def _rescale_outputs(self, update: Update) -> None:
        """Apply a rescale to the outputs, after the barrier carrying it went out on all of
        them: new vnode bitmaps for the next chunks, and no more messages to dropped actors."""
        output = self._output
        assert output is not None
        ids = self.downstream_ids
        if isinstance(output, HashDispatcher) and (update.vnode_bitmaps or update.dropped_actors):
            current = output.bitmaps
            output.update_bitmaps(
                [
                    VnodeBitmap.empty(bitmap.vnode_count)
                    if actor in update.dropped_actors
                    else update.vnode_bitmaps.get(actor, bitmap)
                    for actor, bitmap in zip(ids, current, strict=True)
                ]
            )
        for index, actor in enumerate(ids):
            if actor in update.dropped_actors:
                output.drop_output(index)

    def stats(self) -> ActorStats:
        """A snapshot of this actor's counters."""
        return ActorStats(
            name=self.name,
            actor_id=self.actor_id,
            messages_in=self._messages_in,
            rows_in=self._rows_in,
            rows_out=self._rows_out,
            barriers=self._barriers,
            current_epoch=self.epoch,
            finished=self.finished,
        )


class _Messages:
    """Iterator over an actor's input (a class, not an async generator, so that an actor
    raising mid-iteration leaves nothing to finalize)."""

    __slots__ = ("_ctx",)

    def __init__(self, ctx: ActorContext) -> None:
        self._ctx = ctx

    def __aiter__(self) -> _Messages:
        return self

    async def __anext__(self) -> Message:
        ctx = self._ctx
        if ctx.finished:
            raise StopAsyncIteration
        try:
            message = await ctx._input.receive()
        except anyio.EndOfStream:
            ctx.finished = True
            raise StopAsyncIteration from None
        ctx._messages_in += 1
        if isinstance(message, Chunk):
            ctx._rows_in += message.num_rows
        return message


class StreamActor:
    """Base of stream actors: forwards every message unless :meth:`process` is overridden."""

    async def restore(self, ctx: ActorContext) -> None:
        """Load state from ``ctx.table(...)`` before the first message (default: nothing)."""

    async def process(self, message: Message, ctx: ActorContext) -> None:
        """Handle one message; emit what should go downstream (default: the message)."""
        await ctx.emit(message)

    async def run(self, ctx: ActorContext) -> None:
        """The actor's whole life: restore, then process every message in order."""
        await self.restore(ctx)
        async for message in ctx.messages():
            await self.process(message, ctx)
