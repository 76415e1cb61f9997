"""Driving a runtime from synchronous code: a PySpark ``foreachBatch`` callback, a script.

:class:`BlockingRuntime` runs the runtime's event loop (asyncio or trio) on a background thread
through an anyio blocking portal; every method blocks the calling thread until the async call
finished there. Backpressure reaches the caller: :meth:`push` blocks while the source's inbox
is full.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Literal, TypeVar, final

from anyio.from_thread import BlockingPortal, start_blocking_portal

from barrierflow.channels.chunk import Chunk
from barrierflow.channels.epoch import EpochPair
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.channels.mutation import Mutation
from barrierflow.runtime.errors import NotRunningError
from barrierflow.runtime.runtime import Runtime, RuntimeStats

__all__ = ["BlockingRuntime"]

T = TypeVar("T")


@final
class BlockingRuntime:
    """A blocking handle on a :class:`Runtime`, for code that is not async.

    Usage::

        rt = Runtime(config); rt.add_source("events") ...
        with BlockingRuntime(rt, backend="trio") as handle:
            handle.push("events", chunk)
            epoch = handle.checkpoint()      # returns once durable

    Raises:
        InvalidArgumentError: ``runtime`` is not a Runtime or ``backend`` is unknown.
    """

    def __init__(self, runtime: Runtime, backend: Literal["asyncio", "trio"] = "asyncio") -> None:
        if not isinstance(runtime, Runtime):
            raise InvalidArgumentError("runtime", "a Runtime", runtime)
        if not isinstance(backend, str) or backend not in ("asyncio", "trio"):
            raise InvalidArgumentError("backend", "'asyncio' or 'trio'", backend)
        self._runtime = runtime
        self._backend = backend
        self._stack: contextlib.ExitStack | None = None
        self._portal: BlockingPortal | None = None

    @property
    def backend(self) -> str:
        """The anyio backend the runtime runs on (``"asyncio"`` or ``"trio"``)."""
        return self._backend

    def __enter__(self) -> BlockingRuntime:
        stack = contextlib.ExitStack()
        try:
            portal = stack.enter_context(start_blocking_portal(self._backend))
            stack.enter_context(portal.wrap_async_context_manager(self._runtime))
        except BaseException:
            stack.close()
            raise
        self._stack, self._portal = stack, portal
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack, self._stack, self._portal = self._stack, None, None
        if stack is not None:
            stack.__exit__(exc_type, exc, tb)

    def _call_portal(self) -> BlockingPortal:
        if self._portal is None:
            raise NotRunningError(
                "the blocking runtime", "use it inside `with BlockingRuntime(rt):`"
            )
        return self._portal

    @property
    def runtime(self) -> Runtime:
        """The runtime this handle drives."""
        return self._runtime

    @property
    def running(self) -> bool:
        """Whether the handle is inside its ``with`` block."""
        return self._portal is not None

    def call(self, func: Callable[..., Awaitable[T]], *args: object) -> T:
        """Run ``await func(*args)`` on the runtime's thread and block until it returns.

        Raises:
            InvalidArgumentError: ``func`` is not callable.
            NotRunningError: the handle is not inside its ``with`` block.
        """
        if not callable(func):
            raise InvalidArgumentError("func", "an async callable", func)
        return self._call_portal().call(func, *args)

    def push(self, source: str, chunk: Chunk) -> None:
        """Push ``chunk`` into ``source``, blocking while its inbox is full."""
        self._call_portal().call(self._runtime.push, source, chunk)

    def checkpoint(self) -> int:
        """Inject a checkpoint and block until it is durable; returns its epoch."""
        epoch: int = self._call_portal().call(self._runtime.checkpoint)
        return epoch

    def mutate(self, mutation: Mutation) -> EpochPair:
        """Inject a barrier carrying ``mutation`` and block until it is collected."""
        pair: EpochPair = self._call_portal().call(self._runtime.mutate, mutation)
        return pair

    def stats(self) -> RuntimeStats:
        """The runtime's counters (read on the runtime's thread)."""
        return self._call_portal().call(self._sync_stats)

    async def _sync_stats(self) -> RuntimeStats:
        return self._runtime.stats()

    @property
    def committed_epoch(self) -> int:
        """The last durable checkpoint epoch."""
        return self._runtime.committed_epoch
