"""The handle writers and a checkpoint driver hold on a sink task: one command per call over
the task's bounded inbox (see :mod:`.sink_task` for the rules the task enforces)."""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import Any, final

import anyio
import pyarrow as pa
import structlog

from barrierflow.actors.sinks._sink_commands import (
    DEFAULT_SHUTDOWN_TIMEOUT,
    Begin,
    Close,
    Discard,
    Flush,
    SinkTaskStats,
    Stage,
    TaskState,
    Write,
    WriteChanges,
)
from barrierflow.actors.sinks.table import Manifest
from barrierflow.channels.epoch import check_epoch
from barrierflow.channels.errors import InvalidArgumentError, SchemaMismatchError
from barrierflow.runtime.command import ActorRef
from barrierflow.runtime.config import check_seconds
from barrierflow.runtime.errors import ActorGoneError

__all__ = ["SinkTaskHandle"]


@final
class SinkTaskHandle:
    """A handle on a running sink task. Create with :func:`start_sink_task` or
    :class:`SinkTask`; :meth:`clone` for another holder; :meth:`release` when done.

    The task ends when every handle is released (it then flushes and closes the writer),
    or on :meth:`close`.
    """

    __slots__ = ("_ref", "_schema", "_state")

    def __init__(self, ref: ActorRef[Any], state: TaskState, schema: pa.Schema) -> None:
        self._ref = ref
        self._state = state
        self._schema = schema

    @property
    def name(self) -> str:
        """The sink's name."""
        return self._state.name

    @property
    def schema(self) -> pa.Schema:
        """The schema every written batch must have."""
        return self._schema

    async def write(self, batch: pa.RecordBatch) -> None:
        """Queue ``batch`` for the open epoch; waits only for room in the inbox.

        A batch the writer then fails to write poisons the epoch (see the module docstring).

        Raises:
            InvalidArgumentError: ``batch`` is not a ``pyarrow.RecordBatch``.
            SchemaMismatchError: its schema is not the sink's (names both). The batch is still
                handed to the task, which counts the failed write and poisons the epoch, so
                the epoch cannot be staged with these rows missing.
            ActorGoneError: the task stopped, or this handle was released.
        """
        if not isinstance(batch, pa.RecordBatch):
            raise InvalidArgumentError("batch", "a pyarrow.RecordBatch", type(batch).__name__)
        await self._ref.tell(Write(batch))
        if not batch.schema.equals(self._schema):
            raise SchemaMismatchError(f"batch for sink {self.name!r}", self._schema, batch.schema)

    @property
    def takes_changes(self) -> bool:
        """Whether the writer applies changelogs
        (:class:`~barrierflow.actors.sinks.table.TakesChanges`): :meth:`write_changes` is for
        it only."""
        return self._state.takes_changes

    async def write_changes(self, batch: pa.RecordBatch, ops: pa.Array) -> None:
        """Queue the changelog ``batch`` (``ops``: one ``int8`` op code per row) for the open
        epoch, as :meth:`write` does a batch of inserts.

        Raises:
            InvalidArgumentError: ``batch`` is not a ``pyarrow.RecordBatch``, ``ops`` not one
                ``int8`` code per row, or the writer takes no changes (:attr:`takes_changes`).
            SchemaMismatchError: as for :meth:`write` (the epoch is poisoned).
            ActorGoneError: the task stopped, or this handle was released.
        """
        if not isinstance(batch, pa.RecordBatch):
            raise InvalidArgumentError("batch", "a pyarrow.RecordBatch", type(batch).__name__)
        if not isinstance(ops, pa.Array) or ops.type != pa.int8() or len(ops) != batch.num_rows:
            raise InvalidArgumentError("ops", f"{batch.num_rows} int8 op codes", ops)
        if not self._state.takes_changes:
            raise InvalidArgumentError(
                "batch", f"inserts only (sink {self.name!r} takes no changes)", "a changelog"
            )
        await self._ref.tell(WriteChanges(batch, ops))
        if not batch.schema.equals(self._schema):
            raise SchemaMismatchError(f"batch for sink {self.name!r}", self._schema, batch.schema)

    async def begin(self, epoch: int) -> None:
        """Begin ``epoch``; success clears a poisoned epoch.

        Raises:
            SinkEpochError: ``epoch`` is not greater than the last one begun, or the previous
                epoch is still open (neither staged nor discarded).
            SinkConnectorError: the writer failed (the poison, if any, stays).
        """
        await self._ref.ask(Begin(check_epoch("epoch", epoch)))

    async def flush(self) -> None:
        """Flush the writer now and wait for it (no timeout; the periodic one has one).

        Raises:
            SinkConnectorError: the writer's flush failed.
        """
        await self._ref.ask(Flush())

    async def stage(self, epoch: int) -> Manifest:
        """Stage the open epoch ``epoch``: its rows durable, not visible; returns the
        writer's manifest.

        Raises:
            EpochPoisonedError: a write of this epoch failed.
            SinkEpochError: ``epoch`` is not the open epoch.
            SinkConnectorError: the writer's stage failed (the epoch stays open, to be
                discarded), or it returned something other than a manifest of ``epoch``.
        """
        manifest: Manifest = await self._ref.ask(Stage(check_epoch("epoch", epoch)))
        return manifest

    async def discard(self, epoch: int) -> None:
        """Queue a discard of ``epoch`` (fire-and-forget: a failure is logged, not raised)."""
        await self._ref.tell(Discard(check_epoch("epoch", epoch)))

    def clone(self) -> SinkTaskHandle:
        """Another handle on the same task."""
        return SinkTaskHandle(self._ref.clone(), self._state, self._schema)

    def release(self) -> None:
        """Drop this handle (idempotent); the task flushes and closes once all are dropped."""
        self._ref.close()

    async def close(self, timeout: float = DEFAULT_SHUTDOWN_TIMEOUT) -> bool:  # noqa: ASYNC109
        """Flush and close the writer, stop the task, and wait for it to end.

        Other handles then get ``ActorGoneError``. Idempotent.

        Returns:
            Whether the task ended within ``timeout`` seconds.
        """
        timeout = check_seconds("timeout", timeout, InvalidArgumentError)
        try:
            with anyio.move_on_after(timeout):
                with contextlib.suppress(ActorGoneError):  # closing again is a no-op
                    await self._ref.ask(Close())
                await self._state.finished.wait()
                return True
            structlog.get_logger("barrierflow.sink").warning(
                "sink did not close in time", sink=self.name, timeout_s=timeout
            )
            return False
        finally:
            self._ref.close()

    def stats(self) -> SinkTaskStats:
        """A snapshot of the task's counters."""
        return self._state.snapshot()

    async def __aenter__(self) -> SinkTaskHandle:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
