"""The sink task: one command actor per sink that owns its connector exclusively.

Writers and a checkpoint driver talk to the sink through :class:`SinkTaskHandle`\\ s — cheap to
clone — over one bounded inbox (default 128 commands), so nobody contends on a lock around the
connector and a slow sink slows its writers down instead of filling memory. Commands are
served one at a time, in arrival order.

The rules (after LaminarDB's ``sink_task.rs``):

* **Writes are fire-and-forget; a failed write poisons the epoch.** ``write_batch`` returns once
  the batch is queued. If the connector then fails it (or its schema is not the sink's), the
  write-error counter goes up and the epoch is *poisoned*: ``pre_commit`` and ``commit_epoch``
  raise :class:`~barrierflow.errors.EpochPoisonedError` until the next *successful*
  ``begin_epoch`` — committing would publish an epoch with rows missing.
* **Epoch commands are ordered.** ``begin_epoch`` takes increasing epochs, and only once the
  previous epoch was pre-committed or rolled back; ``pre_commit`` takes the open epoch;
  ``commit_epoch`` takes the oldest pre-committed epoch. Anything else is
  :class:`~barrierflow.errors.SinkEpochError`.
* **A periodic flush** runs every ``flush_interval`` (first one an interval after start; ticks
  missed while a command ran are skipped, not bursted), bounded by a timeout equal to the
  interval. A flush that overruns it is cancelled and reported as a stuck sink (a warning
  naming the sink, ``stuck_flushes`` in the stats); the task goes on serving.
* **Rollback is fire-and-forget**: its failure is logged and counted, never raised.
* **Shutdown**: when the last handle is released, or on :meth:`SinkTaskHandle.close`, the task
  flushes then closes the connector; errors of either are logged, and each step is bounded by
  ``shutdown_timeout``. If the task is cancelled instead (its runtime failed), it closes the
  connector without flushing.
* A command whose reply can never come (the task stopped, this handle was released) raises
  :class:`~barrierflow.errors.ActorGoneError` naming the sink; connector failures of the
  commands that reply are :class:`~barrierflow.errors.SinkConnectorError`.
"""

from __future__ import annotations

import contextlib
import sys
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, final

import anyio
import pyarrow as pa
import structlog
from anyio.abc import TaskGroup, TaskStatus

from barrierflow.actors.sinks.errors import EpochPoisonedError, SinkConnectorError, SinkEpochError
from barrierflow.actors.sinks.protocol import (
    CommitMetadata,
    PendingCommit,
    PositionRecorder,
    SinkConnector,
)
from barrierflow.channels.errors import InvalidArgumentError, SchemaMismatchError
from barrierflow.runtime.command import (
    ActorRef,
    Finish,
    Ticker,
    open_command_actor,
    serve_commands,
)
from barrierflow.runtime.errors import ActorGoneError
from barrierflow.runtime.positions import check_positions

__all__ = ["SinkTask", "SinkTaskHandle", "SinkTaskStats", "start_sink_task"]

DEFAULT_CAPACITY = 128
DEFAULT_FLUSH_INTERVAL = 5.0
DEFAULT_SHUTDOWN_TIMEOUT = 30.0


# The commands (private: the handle is the API).
@dataclass(frozen=True, slots=True)
class _WriteBatch:
    batch: pa.RecordBatch


@dataclass(frozen=True, slots=True)
class _BeginEpoch:
    epoch: int


@dataclass(frozen=True, slots=True)
class _Flush:
    pass


@dataclass(frozen=True, slots=True)
class _PreCommit:
    epoch: int
    # Source positions the epoch's rows span (after the first, up to the second), if known.
    positions: tuple[dict[str, int], dict[str, int]] | None = None


@dataclass(frozen=True, slots=True)
class _CommitEpoch:
    epoch: int


@dataclass(frozen=True, slots=True)
class _RollbackEpoch:
    epoch: int


@dataclass(frozen=True, slots=True)
class _Recover:
    pending: tuple[PendingCommit, ...]


@dataclass(frozen=True, slots=True)
class _Close:
    pass


@final
@dataclass(frozen=True, slots=True)
class SinkTaskStats:
    """A snapshot of one sink task's counters."""

    #: The sink's name, and whether its connector is exactly-once.
    name: str
    exactly_once: bool
    #: Batches and rows the connector accepted.
    batches_written: int
    rows_written: int
    #: Writes that failed (each poisoned its epoch).
    write_errors: int
    #: Whether the current epoch is poisoned.
    epoch_poisoned: bool
    #: Flushes that succeeded, failed, or overran their timeout (a stuck sink).
    flushes: int
    flush_errors: int
    stuck_flushes: int
    #: The epoch begun and not yet pre-committed or rolled back, if any.
    open_epoch: int | None
    #: Pre-committed epochs waiting for their commit, oldest first.
    pre_committed: tuple[int, ...]
    #: The last epoch committed by this task (or by recovery); 0 before the first.
    committed_epoch: int
    #: Rollbacks run, and those that failed.
    rollbacks: int
    rollback_errors: int
    #: Whether the task has stopped.
    finished: bool


class _State:
    """The task's mutable state, shared with its handles (read-only for them)."""

    def __init__(self, name: str, exactly_once: bool) -> None:
        self.name = name
        self.exactly_once = exactly_once
        self.batches_written = 0
        self.rows_written = 0
        self.write_errors = 0
        self.poisoned = False
        self.flushes = 0
        self.flush_errors = 0
        self.stuck_flushes = 0
        self.last_begun: int | None = None
        self.open_epoch: int | None = None
        self.pre_committed: deque[int] = deque()
        self.committed_epoch = 0
        self.rollbacks = 0
        self.rollback_errors = 0
        self.finished = anyio.Event()

    def snapshot(self) -> SinkTaskStats:
        return SinkTaskStats(
            name=self.name,
            exactly_once=self.exactly_once,
            batches_written=self.batches_written,
            rows_written=self.rows_written,
            write_errors=self.write_errors,
            epoch_poisoned=self.poisoned,
            flushes=self.flushes,
            flush_errors=self.flush_errors,
            stuck_flushes=self.stuck_flushes,
            open_epoch=self.open_epoch,
            pre_committed=tuple(self.pre_committed),
            committed_epoch=self.committed_epoch,
            rollbacks=self.rollbacks,
            rollback_errors=self.rollback_errors,
            finished=self.finished.is_set(),
        )


def _check_epoch(epoch: Any) -> int:
    if type(epoch) is not int or epoch < 0:
        raise InvalidArgumentError("epoch", "a non-negative int", epoch)
    return epoch


def _check_seconds(argument: str, value: Any) -> float:
    # ``<= float max``, not ``< inf``: a huge int passes the latter and overflows float().
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 < value <= sys.float_info.max
    ):
        raise InvalidArgumentError(argument, "a positive finite number of seconds", value)
    return float(value)


@final
class SinkTaskHandle:
    """A handle on a running sink task. Create with :func:`start_sink_task` or
    :class:`SinkTask`; :meth:`clone` for another holder; :meth:`release` when done.

    The task ends when every handle is released (it then flushes and closes the connector),
    or on :meth:`close`.
    """

    __slots__ = ("_ref", "_schema", "_state")

    def __init__(self, ref: ActorRef[Any], state: _State, schema: pa.Schema) -> None:
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
        await self._ref.tell(_WriteBatch(batch))
        if not batch.schema.equals(self._schema):
            raise SchemaMismatchError(f"batch for sink {self.name!r}", self._schema, batch.schema)

    async def begin_epoch(self, epoch: int) -> None:
        """Begin ``epoch``; success clears a poisoned epoch.

        Raises:
            SinkEpochError: ``epoch`` is not greater than the last one begun, or the previous
                epoch is still open (neither pre-committed nor rolled back).
            SinkConnectorError: the connector failed (the poison, if any, stays).
        """
        await self._ref.ask(_BeginEpoch(_check_epoch(epoch)))

    async def flush(self) -> None:
        """Flush the connector now and wait for it (no timeout; the periodic one has one).

        Raises:
            SinkConnectorError: the connector's flush failed.
        """
        await self._ref.ask(_Flush())

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
        metadata: CommitMetadata = await self._ref.ask(_PreCommit(_check_epoch(epoch), checked))
        return metadata

    async def commit_epoch(self, epoch: int) -> None:
        """Phase 2: commit the oldest pre-committed epoch, ``epoch``.

        Raises:
            EpochPoisonedError: a write failed since the last successful begin-epoch.
            SinkEpochError: ``epoch`` was never pre-committed, or an older one is pending.
            SinkConnectorError: the connector's commit failed (the epoch stays pre-committed).
        """
        await self._ref.ask(_CommitEpoch(_check_epoch(epoch)))

    async def rollback_epoch(self, epoch: int) -> None:
        """Queue a rollback of ``epoch`` (fire-and-forget: a failure is logged, not raised)."""
        await self._ref.tell(_RollbackEpoch(_check_epoch(epoch)))

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
        await self._ref.ask(_Recover(items))

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
        timeout = _check_seconds("timeout", timeout)
        try:
            with anyio.move_on_after(timeout):
                with contextlib.suppress(ActorGoneError):  # closing again is a no-op
                    await self._ref.ask(_Close())
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


class _SinkActor:
    """The command handler: owns the connector and the epoch state machine."""

    def __init__(
        self,
        connector: SinkConnector,
        state: _State,
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
        self.log = structlog.get_logger("barrierflow.sink").bind(sink=state.name)

    async def handle(self, command: Any) -> Any:
        match command:
            case _WriteBatch(batch):
                await self._write(batch)
                return None
            case _BeginEpoch(epoch):
                await self._begin(epoch)
                return None
            case _PreCommit(epoch, positions):
                return await self._pre_commit(epoch, positions)
            case _CommitEpoch(epoch):
                await self._commit(epoch)
                return None
            case _RollbackEpoch(epoch):
                await self._rollback(epoch)
                return None
            case _Flush():
                await self._call("flush", None, self.connector.flush())
                self.state.flushes += 1
                return None
            case _Recover(pending):
                await self._recover(pending)
                return None
            case _Close():
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
                self.log.warning("sink close failed", error=repr(exc))
        if scope.cancelled_caught:
            self.log.warning("sink close timed out", timeout_s=self.shutdown_timeout)


async def start_sink_task(
    task_group: TaskGroup,
    connector: SinkConnector,
    *,
    name: str,
    capacity: int = DEFAULT_CAPACITY,
    flush_interval: float = DEFAULT_FLUSH_INTERVAL,
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
) -> SinkTaskHandle:
    """Open ``connector`` and serve it from a new task in ``task_group``; returns a handle.

    Args:
        task_group: owns the task.
        connector: the sink; owned by the task from now on.
        name: names the sink in logs, stats and errors.
        capacity: commands the inbox holds before writers wait.
        flush_interval: seconds between periodic flushes (also each flush's timeout).
        shutdown_timeout: seconds each of the final flush and close may take.

    Raises:
        InvalidArgumentError: a bad argument (the connector is not a ``SinkConnector``, a
            non-positive interval, ...).
        SinkConnectorError: the connector's ``open`` failed.
    """
    if not isinstance(connector, SinkConnector):
        raise InvalidArgumentError("connector", "a SinkConnector", type(connector).__name__)
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError("name", "a non-empty str", name)
    if type(capacity) is not int or capacity < 1:
        raise InvalidArgumentError("capacity", "an int >= 1", capacity)
    flush_interval = _check_seconds("flush_interval", flush_interval)
    shutdown_timeout = _check_seconds("shutdown_timeout", shutdown_timeout)
    schema = connector.schema
    if not isinstance(schema, pa.Schema):
        raise InvalidArgumentError("connector.schema", "a pyarrow.Schema", type(schema).__name__)
    state = _State(name, bool(connector.exactly_once))
    ref, inbox = open_command_actor(name, capacity)
    actor = _SinkActor(connector, state, schema, flush_interval, shutdown_timeout)

    async def run(*, task_status: TaskStatus[None]) -> None:
        try:
            try:
                await connector.open()
            except Exception as exc:
                inbox.close()
                raise SinkConnectorError(name, "open", None, exc) from exc
            task_status.started()
            try:
                await serve_commands(
                    name,
                    actor,
                    inbox,
                    ticker=Ticker(flush_interval, actor.periodic_flush),
                    on_end=actor.shutdown,
                )
            finally:
                await actor.abort()
        finally:
            state.finished.set()

    await task_group.start(run, name=f"sink task {name}")
    return SinkTaskHandle(ref, state, schema)


@final
class SinkTask:
    """Runs a sink task for the body of ``async with``; yields its first handle.

    Leaving the block releases that handle (the task flushes and closes the connector once
    every clone is released too) and waits for the task to end.
    """

    def __init__(
        self,
        connector: SinkConnector,
        *,
        name: str,
        capacity: int = DEFAULT_CAPACITY,
        flush_interval: float = DEFAULT_FLUSH_INTERVAL,
        shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
    ) -> None:
        self._connector = connector
        self._options: dict[str, Any] = {
            "name": name,
            "capacity": capacity,
            "flush_interval": flush_interval,
            "shutdown_timeout": shutdown_timeout,
        }
        self._group: TaskGroup | None = None
        self._handle: SinkTaskHandle | None = None

    async def __aenter__(self) -> SinkTaskHandle:
        group = anyio.create_task_group()
        await group.__aenter__()
        try:
            self._handle = await start_sink_task(group, self._connector, **self._options)
        except BaseException as exc:
            group.cancel_scope.cancel()
            with contextlib.suppress(BaseExceptionGroup):
                await group.__aexit__(type(exc), exc, exc.__traceback__)
            raise exc from exc.__cause__  # the error itself, not a group around it
        self._group = group
        return self._handle

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._group is not None
        assert self._handle is not None
        self._handle.release()
        if exc is not None:
            self._group.cancel_scope.cancel()
        return await self._group.__aexit__(exc_type, exc, tb)
