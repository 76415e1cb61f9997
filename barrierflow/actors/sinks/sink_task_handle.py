"""The handle writers and a checkpoint driver hold on a sink task: one command per call over
the task's bounded inbox (see :mod:`.sink_task` for the rules the task enforces)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, final

import anyio
import pyarrow as pa
import structlog

from barrierflow.actors.sinks._sink_commands import (
    DEFAULT_SHUTDOWN_TIMEOUT,
    BeginEpoch,
    Close,
    CommitEpoch,
    Flush,
    PreCommit,
    Recover,
    RollbackEpoch,
    SinkTaskStats,
    TaskState,
    WriteBatch,
)
from barrierflow.actors.sinks.protocol import CommitMetadata, PendingCommit
from barrierflow.channels.epoch import check_epoch
from barrierflow.channels.errors import InvalidArgumentError, SchemaMismatchError
from barrierflow.runtime.command import ActorRef
from barrierflow.runtime.config import check_seconds
from barrierflow.runtime.errors import ActorGoneError
from barrierflow.runtime.positions import check_positions

__all__ = ["SinkTaskHandle"]


@final
class SinkTaskHandle:
    """A handle on a running sink task. Create with :func:`start_sink_task` or
    :class:`SinkTask`; :meth:`clone` for another holder; :meth:`release` when done.

    The task ends when every handle is released (it then flushes and closes the connector),
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
    def exactly_once(self) -> bool:
        """Whether the sink's connector is exactly-once."""
        return self._state.exactly_once

    @property
    def schema(self) -> pa.Schema:
        """The schema every written batch must have."""
        return self._schema

    async def write_batch(self, batch: pa.RecordBatch) -> None:
        """Queue ``batch`` for the open epoch; waits only for room in the inbox.

        A batch the connector then fails to write poisons the epoch (see the module docstring).

        Raises:
            InvalidArgumentError: ``batch`` is not a ``pyarrow.RecordBatch``.
            SchemaMismatchError: its schema is not the sink's (names both). The batch is still
                handed to the task, which counts the failed write and poisons the epoch, so
                the epoch cannot be committed with these rows missing.
            ActorGoneError: the task stopped, or this handle was released.
        """
        if not isinstance(batch, pa.RecordBatch):
            raise InvalidArgumentError("batch", "a pyarrow.RecordBatch", type(batch).__name__)
        await self._ref.tell(WriteBatch(batch))
        if not batch.schema.equals(self._schema):
            raise SchemaMismatchError(f"batch for sink {self.name!r}", self._schema, batch.schema)

    async def begin_epoch(self, epoch: int) -> None:
        """Begin ``epoch``; success clears a poisoned epoch.

        Raises:
            SinkEpochError: ``epoch`` is not greater than the last one begun, or the previous
                epoch is still open (neither pre-committed nor rolled back).
            SinkConnectorError: the connector failed (the poison, if any, stays).
        """
        await self._ref.ask(BeginEpoch(check_epoch("epoch", epoch)))

    async def flush(self) -> None:
        """Flush the connector now and wait for it (no timeout; the periodic one has one).

        Raises:
            SinkConnectorError: the connector's flush failed.
        """
        await self._ref.ask(Flush())

    async def pre_commit(
        self,
        epoch: int,
        *,
        positions: tuple[Mapping[str, int], Mapping[str, int]] | None = None,
    ) -> CommitMetadata:
        """Phase 1 of the commit of the open epoch ``epoch``; returns the connector's metadata.

        ``positions`` — the source positions the epoch's rows span, ``(start, end)`` — go to a
        connector that records them
        (:class:`~barrierflow.actors.sinks.protocol.PositionRecorder`) right before its
        ``pre_commit``; other connectors ignore them.

        Raises:
            EpochPoisonedError: a write of this epoch failed.
            SinkEpochError: ``epoch`` is not the open epoch.
            SinkConnectorError: the connector's pre-commit failed (the epoch stays open, to be
                rolled back).
        """
        checked = None
        if positions is not None:
            if not isinstance(positions, tuple) or len(positions) != 2:
                raise InvalidArgumentError("positions", "None or a (start, end) pair", positions)
            checked = (
                check_positions("positions", positions[0]),
                check_positions("positions", positions[1]),
            )
        metadata: CommitMetadata = await self._ref.ask(
            PreCommit(check_epoch("epoch", epoch), checked)
        )
        return metadata

    async def commit_epoch(self, epoch: int) -> None:
        """Phase 2: commit the oldest pre-committed epoch, ``epoch``.

        Raises:
            EpochPoisonedError: a write failed since the last successful begin-epoch.
            SinkEpochError: ``epoch`` was never pre-committed, or an older one is pending.
            SinkConnectorError: the connector's commit failed (the epoch stays pre-committed).
        """
        await self._ref.ask(CommitEpoch(check_epoch("epoch", epoch)))

    async def rollback_epoch(self, epoch: int) -> None:
        """Queue a rollback of ``epoch`` (fire-and-forget: a failure is logged, not raised)."""
        await self._ref.tell(RollbackEpoch(check_epoch("epoch", epoch)))

    async def recover(self, pending: Sequence[PendingCommit]) -> None:
        """Bring the connector to its last checkpoint: commit ``pending``, roll back any other
        staged epoch. Must come before the first ``begin_epoch``.

        Raises:
            SinkEpochError: an epoch was already begun.
            SinkConnectorError: the connector's recovery failed.
        """
        items = tuple(pending)
        for item in items:
            if not isinstance(item, PendingCommit):
                raise InvalidArgumentError("pending", "PendingCommit items", item)
        await self._ref.ask(Recover(items))

    def clone(self) -> SinkTaskHandle:
        """Another handle on the same task."""
        return SinkTaskHandle(self._ref.clone(), self._state, self._schema)

    def release(self) -> None:
        """Drop this handle (idempotent); the task flushes and closes once all are dropped."""
        self._ref.close()

    async def close(self, timeout: float = DEFAULT_SHUTDOWN_TIMEOUT) -> bool:  # noqa: ASYNC109
        """Flush and close the connector, stop the task, and wait for it to end.

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
