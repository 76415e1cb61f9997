"""The sink task: one command actor per sink writer that owns its staging writer exclusively.

The sink writer actor and a checkpoint driver talk to the staging writer through
:class:`SinkTaskHandle`\\ s — cheap to clone — over one bounded inbox (default 128 commands),
so nobody contends on a lock around the writer and a slow sink slows its writers down instead
of filling memory. Commands are served one at a time, in arrival order. The task stages; it
never commits: commits are the coordinator's (:mod:`barrierflow.actors.sinks.coordinator`),
once per epoch, for every writer of the table.

The rules (after LaminarDB's ``sink_task.rs``):

* **Writes are fire-and-forget; a failed write poisons the epoch.** ``write`` returns once
  the batch is queued. If the writer then fails it (or its schema is not the sink's), the
  write-error counter goes up and the epoch is *poisoned*: ``stage`` raises
  :class:`~barrierflow.errors.EpochPoisonedError` until the next *successful* ``begin`` —
  staging would hand the coordinator an epoch with rows missing.
* **Epoch commands are ordered.** ``begin`` takes increasing epochs, and only once the
  previous epoch was staged or discarded; ``stage`` takes the open epoch. Anything else is
  :class:`~barrierflow.errors.SinkEpochError`.
* **A periodic flush** runs every ``flush_interval`` (first one an interval after start; ticks
  missed while a command ran are skipped, not bursted), bounded by a timeout equal to the
  interval. A flush that overruns it is cancelled and reported as a stuck sink (a warning
  naming the sink, ``stuck_flushes`` in the stats); the task goes on serving.
* **Discard is fire-and-forget**: its failure is logged and counted, never raised.
* **Shutdown**: when the last handle is released, or on :meth:`SinkTaskHandle.close`, the task
  flushes then closes the writer, each step bounded by ``shutdown_timeout``. A failed flush
  is logged; a failed close fails the task with
  :class:`~barrierflow.errors.SinkConnectorError` (operation ``"close"``, the writer's error
  as ``__cause__``) — a writer that could not close may not have made its last rows durable,
  so its owner must hear of it. If the task is cancelled instead (its runtime failed), it
  closes the writer without flushing, and a close error is only logged (the cancellation wins).
* A command whose reply can never come (the task stopped, this handle was released) raises
  :class:`~barrierflow.errors.ActorGoneError` naming the sink; writer failures of the
  commands that reply are :class:`~barrierflow.errors.SinkConnectorError`.
"""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import Any, final

import anyio
import pyarrow as pa
from anyio.abc import TaskGroup, TaskStatus

from barrierflow._taskgroups import single_error
from barrierflow.actors.sinks._sink_actor import SinkCommandHandler
from barrierflow.actors.sinks._sink_commands import (
    DEFAULT_CAPACITY,
    DEFAULT_FLUSH_INTERVAL,
    DEFAULT_SHUTDOWN_TIMEOUT,
    SinkTaskStats,
    TaskState,
)
from barrierflow.actors.sinks.errors import SinkConnectorError
from barrierflow.actors.sinks.sink_task_handle import SinkTaskHandle
from barrierflow.actors.sinks.table import StagingWriter, TakesChanges
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.runtime.command import Ticker, open_command_actor, serve_commands
from barrierflow.runtime.config import check_seconds

__all__ = [
    "DEFAULT_CAPACITY",
    "DEFAULT_FLUSH_INTERVAL",
    "DEFAULT_SHUTDOWN_TIMEOUT",
    "SinkTask",
    "SinkTaskHandle",
    "SinkTaskStats",
    "check_task_options",
    "start_sink_task",
]


def check_task_options(
    name: object, capacity: object, flush_interval: object, shutdown_timeout: object
) -> tuple[float, float]:
    """Check a sink task's options (where it is started, and where it is declared, so that a
    bad one is refused at the call and not inside a running graph); return the two
    intervals as floats.

    Raises:
        InvalidArgumentError: ``name`` not a non-empty str, ``capacity`` not an int >= 1, or
            an interval that is not a finite number of seconds > 0.
    """
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError("name", "a non-empty str", name)
    if type(capacity) is not int or capacity < 1:
        raise InvalidArgumentError("capacity", "an int >= 1", capacity)
    return (
        check_seconds("flush_interval", flush_interval, InvalidArgumentError),
        check_seconds("shutdown_timeout", shutdown_timeout, InvalidArgumentError),
    )


async def start_sink_task(
    task_group: TaskGroup,
    writer: StagingWriter,
    *,
    name: str,
    capacity: int = DEFAULT_CAPACITY,
    flush_interval: float = DEFAULT_FLUSH_INTERVAL,
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
) -> SinkTaskHandle:
    """Open ``writer`` and serve it from a new task in ``task_group``; returns a handle.

    Args:
        task_group: owns the task.
        writer: the staging writer; owned by the task from now on.
        name: names the sink in logs, stats and errors.
        capacity: commands the inbox holds before writers wait.
        flush_interval: seconds between periodic flushes (also each flush's timeout).
        shutdown_timeout: seconds each of the final flush and close may take.

    Raises:
        InvalidArgumentError: a bad argument (the writer is not a ``StagingWriter``, a
            non-positive interval, ...).
        SinkConnectorError: the writer's ``open`` failed.
    """
    if not isinstance(writer, StagingWriter):
        raise InvalidArgumentError("writer", "a StagingWriter", type(writer).__name__)
    flush_interval, shutdown_timeout = check_task_options(
        name, capacity, flush_interval, shutdown_timeout
    )
    schema = writer.schema
    if not isinstance(schema, pa.Schema):
        raise InvalidArgumentError("writer.schema", "a pyarrow.Schema", type(schema).__name__)
    state = TaskState(name, takes_changes=isinstance(writer, TakesChanges))
    ref, inbox = open_command_actor(name, capacity)
    actor = SinkCommandHandler(writer, state, schema, flush_interval, shutdown_timeout)

    async def run(*, task_status: TaskStatus[None]) -> None:
        try:
            try:
                await writer.open()
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
            if actor.close_error is not None:
                error = actor.close_error
                raise SinkConnectorError(name, "close", None, error) from error
        finally:
            state.finished.set()

    await task_group.start(run, name=f"sink task {name}")
    return SinkTaskHandle(ref, state, schema)


@final
class SinkTask:
    """Runs a sink task for the body of ``async with``; yields its first handle.

    Leaving the block releases that handle (the task flushes and closes the writer once
    every clone is released too) and waits for the task to end.

    Raises:
        InvalidArgumentError: ``writer`` is not a StagingWriter, or a bad option (see
            :func:`check_task_options`) — at the call, not when the task starts.
    """

    # Set by ``__aenter__``, which ``__aexit__`` always follows.
    _stack: contextlib.AsyncExitStack
    _group: TaskGroup
    _handle: SinkTaskHandle

    def __init__(
        self,
        writer: StagingWriter,
        *,
        name: str,
        capacity: int = DEFAULT_CAPACITY,
        flush_interval: float = DEFAULT_FLUSH_INTERVAL,
        shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
    ) -> None:
        if not isinstance(writer, StagingWriter):
            raise InvalidArgumentError("writer", "a StagingWriter", type(writer).__name__)
        check_task_options(name, capacity, flush_interval, shutdown_timeout)
        self._writer = writer
        self._options: dict[str, Any] = {
            "name": name,
            "capacity": capacity,
            "flush_interval": flush_interval,
            "shutdown_timeout": shutdown_timeout,
        }

    async def __aenter__(self) -> SinkTaskHandle:
        """Start the task; raises the error that stopped it (not a group around it).

        Raises:
            InvalidArgumentError: a bad argument (see :func:`start_sink_task`).
            SinkConnectorError: the writer's ``open`` failed.
        """
        with single_error():  # the error itself, not a group around it
            async with contextlib.AsyncExitStack() as stack:
                group = await stack.enter_async_context(anyio.create_task_group())
                self._handle = await start_sink_task(group, self._writer, **self._options)
                self._group, self._stack = group, stack.pop_all()
        return self._handle

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        """Release the handle and wait for the task to end (cancel it if the body raised).

        Raises:
            SinkConnectorError: the writer's ``close`` failed at a graceful shutdown.
        """
        self._handle.release()
        if exc is not None:
            self._group.cancel_scope.cancel()
        with single_error():
            return await self._stack.__aexit__(exc_type, exc, tb)
