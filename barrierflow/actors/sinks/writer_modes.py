"""The two ways a :class:`~barrierflow.actors.sinks.SinkWriter` commits, one strategy each.

* :class:`LocalCommits` — a single writer: it records each pre-committed epoch in its own state
  table (sealed by the checkpoint barrier, so durable with that checkpoint) and commits it
  through its sink task once the runtime's committed epoch reaches the checkpoint.
* :class:`CoordinatedCommits` — one of several parallel writers of a sink: it registers with the
  sink's :class:`~barrierflow.actors.sinks.Coordinator`, which aligns, records and commits.

The writer calls, per run: :meth:`~WriterMode.join` (before the sink task starts),
:meth:`~WriterMode.recover` once, :meth:`~WriterMode.background` in its task group, then per
barrier :meth:`~WriterMode.on_first_barrier` (the first barrier of an incarnation),
:meth:`~WriterMode.on_checkpoint` (after a successful pre-commit), :meth:`~WriterMode.on_stop`
/ :meth:`~WriterMode.on_rescale`; and :meth:`~WriterMode.finish` at a graceful stop.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol, final

import anyio

from barrierflow._sync import Notifier
from barrierflow.actors.sinks.coordinator import Coordinator, WriterHandle
from barrierflow.actors.sinks.protocol import PendingCommit, SinkConnector
from barrierflow.actors.sinks.sink_task import SinkTaskHandle
from barrierflow.actors.sinks.table import Manifest
from barrierflow.channels.barrier import Barrier
from barrierflow.channels.mutation import Update
from barrierflow.channels.vnode import VnodeBitmap
from barrierflow.runtime.actor import ActorContext
from barrierflow.runtime.state.state_store import StateTable

__all__ = ["CoordinatedCommits", "LocalCommits", "WriterMode"]


class WriterMode(Protocol):
    """How a sink writer commits (see the module docstring for the call order)."""

    async def join(self, ctx: ActorContext, connector: SinkConnector) -> None: ...

    async def recover(
        self, handle: SinkTaskHandle, table: StateTable, records: Mapping[str, Any]
    ) -> None: ...

    async def background(
        self, ctx: ActorContext, handle: SinkTaskHandle, table: StateTable
    ) -> None: ...

    async def on_first_barrier(self, barrier: Barrier) -> None: ...

    async def on_checkpoint(
        self, handle: SinkTaskHandle, table: StateTable, epoch: int, checkpoint: int,
        metadata: Mapping[str, Any],
    ) -> None: ...  # fmt: skip

    async def on_stop(self, barrier: Barrier) -> None: ...

    async def on_rescale(self, bitmap: VnodeBitmap) -> None: ...

    async def finish(self) -> None: ...

    async def wait_committed(self, checkpoint: int) -> None: ...


@dataclass(frozen=True, slots=True)
class _Pending:
    epoch: int  # the sink epoch
    checkpoint: int  # the checkpoint epoch whose durability allows the commit
    key: str  # its record in the state table


def _record_key(epoch: int) -> str:
    return f"{epoch:020d}"


@final
class LocalCommits:
    """A single writer's own two-phase commits (see the module docstring)."""

    def __init__(self, open_epoch: Callable[[], int | None]) -> None:
        self._open_epoch = open_epoch  # the writer's open epoch (rolled back if a commit fails)
        self._pending: deque[_Pending] = deque()
        #: The checkpoint up to which rows are committed (0 until the first commit).
        self.committed_checkpoint = 0
        self._committed_one: Notifier | None = None  # made on first wait (async context)

    async def join(self, ctx: ActorContext, connector: SinkConnector) -> None:
        self._pending = deque()
        await anyio.lowlevel.checkpoint()

    async def recover(
        self, handle: SinkTaskHandle, table: StateTable, records: Mapping[str, Any]
    ) -> None:
        """Commit the durable records' epochs (the sink rolls back every other staged one)."""
        pending = sorted(records.values(), key=lambda r: r["epoch"])
        await handle.recover([PendingCommit(r["epoch"], r["metadata"]) for r in pending])
        for key in records:
            table.delete(key)  # committed; the delete is durable at the next checkpoint

    async def background(
        self, ctx: ActorContext, handle: SinkTaskHandle, table: StateTable
    ) -> None:
        """Commit each recorded epoch once its checkpoint is durable, oldest first."""
        async for committed in ctx.committed_epochs():
            while self._pending and self._pending[0].checkpoint <= committed:
                pending = self._pending[0]
                try:
                    await handle.commit_epoch(pending.epoch)
                except Exception:
                    # The failed epoch stays pre-committed for recovery to commit; only the
                    # open epoch, which the upstream will replay, is rolled back.
                    open_epoch = self._open_epoch()
                    if open_epoch is not None:
                        await handle.rollback_epoch(open_epoch)
                    raise
                self._pending.popleft()
                table.delete(pending.key)
                self.committed_checkpoint = pending.checkpoint
                if self._committed_one is not None:
                    self._committed_one.notify()

    async def on_first_barrier(self, barrier: Barrier) -> None:
        await anyio.lowlevel.checkpoint()

    async def on_checkpoint(
        self, handle: SinkTaskHandle, table: StateTable, epoch: int, checkpoint: int,
        metadata: Mapping[str, Any],
    ) -> None:  # fmt: skip
        """Record the pre-committed epoch; the record is sealed by this barrier, so it is
        durable with its checkpoint."""
        key = _record_key(epoch)
        table.put(key, {"epoch": epoch, "checkpoint": checkpoint, "metadata": dict(metadata)})
        self._pending.append(_Pending(epoch, checkpoint, key))
        await anyio.lowlevel.checkpoint()

    async def on_stop(self, barrier: Barrier) -> None:
        await anyio.lowlevel.checkpoint()

    async def on_rescale(self, bitmap: VnodeBitmap) -> None:
        await anyio.lowlevel.checkpoint()

    async def finish(self) -> None:
        """Wait until every recorded epoch is committed."""
        while self._pending:
            await self._wait()

    async def wait_committed(self, checkpoint: int) -> None:
        """Wait until rows before ``checkpoint`` are committed (before the writer runs too)."""
        while self.committed_checkpoint < checkpoint:
            await self._wait()

    async def _wait(self) -> None:
        if self._committed_one is None:
            self._committed_one = Notifier()
        await self._committed_one.wait()


@final
class CoordinatedCommits:
    """One parallel writer of a coordinated sink (see the module docstring)."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator
        self._handle: WriterHandle | None = None
        #: The rewind epoch the coordinator started this writer with (``None``: fresh).
        self.rewind: int | None = None
        self._last_checkpoint = 0

    async def join(self, ctx: ActorContext, connector: SinkConnector) -> None:
        """Register this writer's vnodes and wait to be started."""
        bitmap = ctx.vnode_bitmap
        if bitmap is None:
            # Round-robin writers: a row of any vnode may reach any of them, so the vnodes are
            # only the coordinator's ledger of who must register; each takes an even share
            # (all of them, for a writer declared alone).
            shares = VnodeBitmap.split(len(ctx.peers), self.coordinator.vnode_count)
            bitmap = shares[ctx.peers.index(ctx.name)]
        self._handle = await self.coordinator.register(
            bitmap, writer=getattr(connector, "writer", None), name=ctx.name
        )
        self.rewind = await self._handle.wait_started()

    async def recover(
        self, handle: SinkTaskHandle, table: StateTable, records: Mapping[str, Any]
    ) -> None:
        await anyio.lowlevel.checkpoint()  # recovery is the coordinator's

    async def background(
        self, ctx: ActorContext, handle: SinkTaskHandle, table: StateTable
    ) -> None:
        await anyio.lowlevel.checkpoint()  # commits are the coordinator's

    async def on_first_barrier(self, barrier: Barrier) -> None:
        """A fresh coordinated sink: every writer starts at the same (the latest) epoch —
        the epoch its first barrier opens (the initial barrier, or the ``Add`` barrier of a
        sink joining a running graph)."""
        if self._handle is not None and self.rewind is None:
            await self._handle.align_initial_epoch(barrier.epoch.curr)

    async def on_checkpoint(
        self, handle: SinkTaskHandle, table: StateTable, epoch: int, checkpoint: int,
        metadata: Mapping[str, Any],
    ) -> None:  # fmt: skip
        """Send the manifest (what the connector's pre-commit returned, with this writer's
        vnodes); acknowledged only once every writer's part of the epoch is in and recorded
        as pending — the checkpoint cannot become durable without that record.

        Raises:
            InvalidArgumentError: the connector's pre-commit did not return a manifest (a
                connector of a coordinated table returns ``Manifest.to_json()``).
        """
        assert self._handle is not None
        manifest = replace(Manifest.from_json(metadata), vnodes=self._handle.bitmap.runs())
        await self._handle.commit(checkpoint, manifest)
        await handle.commit_epoch(epoch)  # the sink task's bookkeeping; a no-op write
        self._last_checkpoint = checkpoint

    async def on_stop(self, barrier: Barrier) -> None:
        """Dropped by a rescale (a ``Stop`` in an ``Update``): leave now, so the coordinator
        can realign the others (waiting for a commit here would wait on that realignment)."""
        if self._handle is not None and isinstance(barrier.mutation, Update):
            await self._handle.stop()
            self._handle = None

    async def on_rescale(self, bitmap: VnodeBitmap) -> None:
        """Every writer of the sink gets the same barrier, so the coordinator sees every new
        bitmap (or stop) and realigns before the next commit."""
        if self._handle is not None:
            await self._handle.update_vnode_bitmap(bitmap)
            await self._handle.wait_started()

    async def finish(self) -> None:
        """Wait until the last checkpoint is committed, then leave the coordinator."""
        if self._handle is None:
            return  # left already (dropped by a rescale)
        await self.coordinator.wait_committed(self._last_checkpoint)
        await self._handle.stop()

    async def wait_committed(self, checkpoint: int) -> None:
        await self.coordinator.wait_committed(checkpoint)
