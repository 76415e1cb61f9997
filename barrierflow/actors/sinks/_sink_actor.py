"""The sink task's command handler: it owns the staging writer and the epoch state machine
(begin → write → stage, poison on a failed write), the periodic flush and the shutdown. See
:mod:`.sink_task` for the rules."""

from __future__ import annotations

from typing import Any

import anyio
import pyarrow as pa
import structlog

from barrierflow.actors.sinks._sink_commands import (
    Begin,
    Close,
    Discard,
    Flush,
    Stage,
    TaskState,
    Write,
    WriteChanges,
)
from barrierflow.actors.sinks.errors import EpochPoisonedError, SinkConnectorError, SinkEpochError
from barrierflow.actors.sinks.table import Manifest, StagingWriter, TakesChanges
from barrierflow.channels.errors import InvalidArgumentError, SchemaMismatchError
from barrierflow.runtime.command import Finish

__all__ = ["SinkCommandHandler"]


class SinkCommandHandler:
    """The sink task's command handler (package-internal; :class:`SinkTaskHandle` is the API):
    owns the staging writer and the epoch state machine."""

    def __init__(
        self,
        writer: StagingWriter,
        state: TaskState,
        schema: pa.Schema,
        flush_interval: float,
        shutdown_timeout: float,
    ) -> None:
        self.writer = writer
        self.state = state
        self.schema = schema
        self.flush_interval = flush_interval
        self.shutdown_timeout = shutdown_timeout
        self.closed = False
        #: What the writer's ``close`` raised, if it did (surfaced by the task).
        self.close_error: Exception | None = None
        self.log = structlog.get_logger("barrierflow.sink").bind(sink=state.name)

    async def handle(self, command: Any) -> Any:
        match command:
            case Write(batch):
                await self._write(batch, None)
                return None
            case WriteChanges(batch, ops):
                await self._write(batch, ops)
                return None
            case Begin(epoch):
                await self._begin(epoch)
                return None
            case Stage(epoch):
                return await self._stage(epoch)
            case Discard(epoch):
                await self._discard(epoch)
                return None
            case Flush():
                await self._call("flush", None, self.writer.flush())
                self.state.flushes += 1
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

    async def _write(self, batch: pa.RecordBatch, ops: pa.Array | None) -> None:
        state = self.state
        error: Exception | None = None
        if not batch.schema.equals(self.schema):
            error = SchemaMismatchError(f"batch for sink {state.name!r}", self.schema, batch.schema)
        elif state.open_epoch is None:
            error = SinkEpochError(
                state.name, "write", state.last_begun or 0, "a begun epoch to write into"
            )
        else:
            try:
                if ops is None:
                    await self.writer.write(batch)
                elif isinstance(self.writer, TakesChanges):
                    await self.writer.write_changes(batch, ops)
                else:  # the handle sends changes only to a writer that takes them
                    raise InvalidArgumentError("batch", "inserts only", "a changelog")
            except Exception as exc:
                error = exc
        if error is None:
            state.batches_written += 1
            state.rows_written += batch.num_rows
            return
        # The rows are gone from this epoch: it must never be staged (the seed's poison rule).
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
                state.name, "begin", epoch, f"an epoch greater than {state.last_begun}"
            )
        if state.open_epoch is not None:
            raise SinkEpochError(
                state.name,
                "begin",
                epoch,
                f"open epoch {state.open_epoch} staged or discarded first",
            )
        await self._call("begin", epoch, self.writer.begin(epoch))
        state.last_begun = epoch
        state.open_epoch = epoch
        state.poisoned = False  # only a successful begin clears the poison

    async def _stage(self, epoch: int) -> Manifest:
        state = self.state
        if state.poisoned:
            raise EpochPoisonedError(state.name, "stage", epoch, state.write_errors)
        if epoch != state.open_epoch:
            expected = (
                "an epoch begun first"
                if state.open_epoch is None
                else f"the open epoch {state.open_epoch}"
            )
            raise SinkEpochError(state.name, "stage", epoch, expected)
        manifest = await self._call("stage", epoch, self.writer.stage(epoch))
        if not isinstance(manifest, Manifest) or manifest.epoch != epoch:
            raise SinkConnectorError(
                state.name,
                "stage",
                epoch,
                InvalidArgumentError("stage()", f"a Manifest of epoch {epoch}", manifest),
            )
        state.open_epoch = None
        state.staged_epochs += 1
        state.last_staged = epoch
        return manifest

    async def _discard(self, epoch: int) -> None:
        state = self.state
        state.discards += 1
        if state.open_epoch == epoch:
            state.open_epoch = None
        try:
            await self.writer.discard(epoch)
        except Exception as exc:
            state.discard_errors += 1
            self.log.warning("sink discard failed", epoch=epoch, error=repr(exc))

    async def periodic_flush(self) -> None:
        """The periodic flush, bounded by the interval so a stuck sink cannot wedge the task."""
        state = self.state
        with anyio.move_on_after(self.flush_interval) as scope:
            try:
                await self.writer.flush()
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
        """Flush then close the writer; errors are logged, each step bounded in time."""
        if self.closed:
            return
        # ``closed`` is set by _close_writer, not here: cancelled during this flush, the
        # task must still close the writer (abort).
        await anyio.lowlevel.checkpoint_if_cancelled()  # cancelled already: abort, no flush
        with anyio.move_on_after(self.shutdown_timeout) as scope:
            try:
                await self.writer.flush()
            except Exception as exc:
                self.log.warning("sink flush failed at shutdown", error=repr(exc))
        if scope.cancelled_caught:
            self.log.warning("sink flush timed out at shutdown", timeout_s=self.shutdown_timeout)
        await self._close_writer()

    async def abort(self) -> None:
        """Close the writer without flushing (the task was cancelled)."""
        if not self.closed:
            await self._close_writer()

    async def _close_writer(self) -> None:
        self.closed = True
        with anyio.move_on_after(self.shutdown_timeout, shield=True) as scope:
            try:
                await self.writer.close()
            except Exception as exc:
                self.close_error = exc
                self.log.warning("sink close failed", error=repr(exc))
        if scope.cancelled_caught:
            self.log.warning("sink close timed out", timeout_s=self.shutdown_timeout)
