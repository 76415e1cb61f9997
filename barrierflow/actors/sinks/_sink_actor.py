"""The sink task's command handler: it owns the connector and the epoch state machine (begin →
write → pre-commit → commit, poison on a failed write), the periodic flush and the shutdown.
See :mod:`.sink_task` for the rules."""

from __future__ import annotations

from typing import Any

import anyio
import pyarrow as pa
import structlog

from barrierflow.actors.sinks._sink_commands import (
    BeginEpoch,
    Close,
    CommitEpoch,
    Flush,
    PreCommit,
    Recover,
    RollbackEpoch,
    TaskState,
    WriteBatch,
)
from barrierflow.actors.sinks.errors import EpochPoisonedError, SinkConnectorError, SinkEpochError
from barrierflow.actors.sinks.protocol import (
    CommitMetadata,
    PendingCommit,
    PositionRecorder,
    SinkConnector,
)
from barrierflow.channels.errors import InvalidArgumentError, SchemaMismatchError
from barrierflow.runtime.command import Finish

__all__: list[str] = []


class _SinkActor:
    """The command handler: owns the connector and the epoch state machine."""

    def __init__(
        self,
        connector: SinkConnector,
        state: TaskState,
        schema: pa.Schema,
        flush_interval: float,
        shutdown_timeout: float,
    ) -> None:
        self.connector = connector
        self.state = state
        self.schema = schema
        self.flush_interval = flush_interval
        self.shutdown_timeout = shutdown_timeout
        self.closed = False
        #: What the connector's ``close`` raised, if it did (surfaced by the task).
        self.close_error: Exception | None = None
        self.log = structlog.get_logger("barrierflow.sink").bind(sink=state.name)

    async def handle(self, command: Any) -> Any:
        match command:
            case WriteBatch(batch):
                await self._write(batch)
                return None
            case BeginEpoch(epoch):
                await self._begin(epoch)
                return None
            case PreCommit(epoch, positions):
                return await self._pre_commit(epoch, positions)
            case CommitEpoch(epoch):
                await self._commit(epoch)
                return None
            case RollbackEpoch(epoch):
                await self._rollback(epoch)
                return None
            case Flush():
                await self._call("flush", None, self.connector.flush())
                self.state.flushes += 1
                return None
            case Recover(pending):
                await self._recover(pending)
                return None
            case Close():
                await self.shutdown()
                return Finish()
        raise InvalidArgumentError("command", "a sink task command", command)  # pragma: no cover

    async def _call(self, operation: str, epoch: int | None, call: Any) -> Any:
        try:
            return await call
        except Exception as exc:
            raise SinkConnectorError(self.state.name, operation, epoch, exc) from exc

    async def _write(self, batch: pa.RecordBatch) -> None:
        state = self.state
        error: Exception | None = None
        if not batch.schema.equals(self.schema):
            error = SchemaMismatchError(f"batch for sink {state.name!r}", self.schema, batch.schema)
        elif state.exactly_once and state.open_epoch is None:
            error = SinkEpochError(
                state.name, "write_batch", state.last_begun or 0, "a begun epoch to write into"
            )
        else:
            try:
                await self.connector.write_batch(batch)
            except Exception as exc:
                error = exc
        if error is None:
            state.batches_written += 1
            state.rows_written += batch.num_rows
            return
        # The rows are gone from this epoch: it must never commit (the seed's poison rule).
        state.write_errors += 1
        state.poisoned = True
        self.log.warning(
            "sink write failed; epoch poisoned",
            epoch=state.open_epoch,
            write_errors=state.write_errors,
            error=repr(error),
        )

    async def _begin(self, epoch: int) -> None:
        state = self.state
        if state.last_begun is not None and epoch <= state.last_begun:
            raise SinkEpochError(
                state.name, "begin_epoch", epoch, f"an epoch greater than {state.last_begun}"
            )
        if state.open_epoch is not None:
            raise SinkEpochError(
                state.name,
                "begin_epoch",
                epoch,
                f"open epoch {state.open_epoch} pre-committed or rolled back first",
            )
        await self._call("begin_epoch", epoch, self.connector.begin_epoch(epoch))
        state.last_begun = epoch
        state.open_epoch = epoch
        state.poisoned = False  # only a successful begin clears the poison

    def _refuse_if_poisoned(self, operation: str, epoch: int) -> None:
        if self.state.poisoned:
            raise EpochPoisonedError(self.state.name, operation, epoch, self.state.write_errors)

    async def _pre_commit(
        self, epoch: int, positions: tuple[dict[str, int], dict[str, int]] | None
    ) -> CommitMetadata:
        state = self.state
        self._refuse_if_poisoned("pre_commit", epoch)
        if epoch != state.open_epoch:
            expected = (
                "an epoch begun first"
                if state.open_epoch is None
                else f"the open epoch {state.open_epoch}"
            )
            raise SinkEpochError(state.name, "pre_commit", epoch, expected)
        if positions is not None and isinstance(self.connector, PositionRecorder):
            await self._call(
                "record_positions", epoch, self.connector.record_positions(epoch, *positions)
            )
        metadata = await self._call("pre_commit", epoch, self.connector.pre_commit(epoch))
        state.open_epoch = None
        state.pre_committed.append(epoch)
        return metadata  # type: ignore[no-any-return]

    async def _commit(self, epoch: int) -> None:
        state = self.state
        self._refuse_if_poisoned("commit_epoch", epoch)
        if not state.pre_committed or state.pre_committed[0] != epoch:
            if epoch in state.pre_committed:
                expected = f"the oldest pre-committed epoch {state.pre_committed[0]} first"
            else:
                expected = f"a pre-committed epoch (pre-committed: {list(state.pre_committed)})"
            raise SinkEpochError(state.name, "commit_epoch", epoch, expected)
        await self._call("commit_epoch", epoch, self.connector.commit_epoch(epoch))
        state.pre_committed.popleft()
        state.committed_epoch = epoch

    async def _rollback(self, epoch: int) -> None:
        state = self.state
        state.rollbacks += 1
        if state.open_epoch == epoch:
            state.open_epoch = None
        if epoch in state.pre_committed:
            state.pre_committed.remove(epoch)
        try:
            await self.connector.rollback_epoch(epoch)
        except Exception as exc:
            state.rollback_errors += 1
            self.log.warning("sink rollback failed", epoch=epoch, error=repr(exc))

    async def _recover(self, pending: tuple[PendingCommit, ...]) -> None:
        state = self.state
        if state.last_begun is not None:
            raise SinkEpochError(
                state.name,
                "recover",
                state.last_begun,
                "recovery before the first begin_epoch",
            )
        await self._call("recover", None, self.connector.recover(pending))
        if pending:
            state.committed_epoch = max(p.epoch for p in pending)

    async def periodic_flush(self) -> None:
        """The periodic flush, bounded by the interval so a stuck sink cannot wedge the task."""
        state = self.state
        with anyio.move_on_after(self.flush_interval) as scope:
            try:
                await self.connector.flush()
            except Exception as exc:
                state.flush_errors += 1
                self.log.warning("periodic sink flush failed", error=repr(exc))
                return
        if scope.cancelled_caught:
            state.stuck_flushes += 1
            self.log.warning(
                "periodic sink flush timed out; the sink may be stuck",
                timeout_s=self.flush_interval,
                stuck_flushes=state.stuck_flushes,
            )
        else:
            state.flushes += 1

    async def shutdown(self) -> None:
        """Flush then close the connector; errors are logged, each step bounded in time."""
        if self.closed:
            return
        # ``closed`` is set by _close_connector, not here: cancelled during this flush, the
        # task must still close the connector (abort).
        await anyio.lowlevel.checkpoint_if_cancelled()  # cancelled already: abort, no flush
        with anyio.move_on_after(self.shutdown_timeout) as scope:
            try:
                await self.connector.flush()
            except Exception as exc:
                self.log.warning("sink flush failed at shutdown", error=repr(exc))
        if scope.cancelled_caught:
            self.log.warning("sink flush timed out at shutdown", timeout_s=self.shutdown_timeout)
        await self._close_connector()

    async def abort(self) -> None:
        """Close the connector without flushing (the task was cancelled)."""
        if not self.closed:
            await self._close_connector()

    async def _close_connector(self) -> None:
        self.closed = True
        with anyio.move_on_after(self.shutdown_timeout, shield=True) as scope:
            try:
                await self.connector.close()
            except Exception as exc:
                self.close_error = exc
                self.log.warning("sink close failed", error=repr(exc))
        if scope.cancelled_caught:
            self.log.warning("sink close timed out", timeout_s=self.shutdown_timeout)
