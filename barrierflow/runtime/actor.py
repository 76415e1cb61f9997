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

from typing import ClassVar

from barrierflow.channels.messages import Message
from barrierflow.runtime.context import ActorContext as ActorContext
from barrierflow.runtime.context import ActorStats as ActorStats
from barrierflow.runtime.placement import Placement

__all__ = ["ActorContext", "ActorStats", "StreamActor"]


class StreamActor:
    """Base of stream actors: forwards every message unless :meth:`process` is overridden.

    Class attributes an actor may set:

    * ``aligned_inputs`` (default ``True``): several inputs are merged by the runtime with
      barriers aligned, and read with ``ctx.messages()``. ``False``: each named input is read
      on its own (``ctx.inputs["upstream"]``, ``ctx.select(...)``) and the actor aligns
      barriers itself — what a backfill does.
    * ``backfills`` (default ``False``): the actor reports :class:`~barrierflow.runtime.
      progress.Progress` and its job is not ready until it reports ``finished``.
    * ``placement`` (default :attr:`Placement.GLOBAL`): what the actor needs of its rows
      (see :mod:`barrierflow.runtime.placement`). A global actor runs as one instance;
      declare ``PARTITION_LOCAL`` (any instance takes any row) or ``KEYED`` (rows by key) to
      run several.
    * ``key`` (default ``None``): the columns a ``KEYED`` actor's state is keyed by; its
      parallel instances are hash-dispatched by them unless ``add_actor`` names a key.
    * ``side_outputs`` (default none): names of outputs besides the main one that the actor
      emits rows to with ``ctx.emit(chunk, output=name)`` (late rows, dead letters); a
      downstream reads one as ``"actor:name"``.
    """

    aligned_inputs: ClassVar[bool] = True
    backfills: ClassVar[bool] = False
    placement: ClassVar[Placement] = Placement.GLOBAL
    key: ClassVar[tuple[str, ...] | None] = None
    side_outputs: ClassVar[tuple[str, ...]] = ()

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
