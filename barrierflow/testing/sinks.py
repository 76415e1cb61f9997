"""Sink connectors for tests: an in-memory exactly-once sink that records rows per epoch, and
a wrapper that makes any connector fail or hang on cue.

* :class:`ListSink` — the two-phase lifecycle kept in memory: rows staged per epoch,
  pre-committed epochs, committed epochs (:attr:`ListSink.committed`, epoch → rows). It keeps
  the connector contract (:mod:`barrierflow.actors.sinks.protocol`): a replayed commit is a
  no-op, ``recover`` commits the pending epochs it still holds and drops every other staged
  one. It lives in one process: give the runtime a factory that returns the *same* instance
  (``lambda: sink``) and it survives the runtime's recoveries and restarts in that process —
  not a process crash (use a file-backed sink, such as the Parquet one, for those).
* :class:`FailingConnector` — wraps a connector; ``fail("commit_epoch", times=2)`` makes the
  next two commits raise :class:`InjectedFaultError` (before reaching the wrapped connector),
  ``hang("flush")`` makes flushes wait until :meth:`FailingConnector.release`. Every call is
  recorded in :attr:`FailingConnector.calls`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, final

import anyio
import pyarrow as pa

from barrierflow._sync import Notifier
from barrierflow.actors.sinks.protocol import CommitMetadata, PendingCommit, SinkConnector
from barrierflow.channels.errors import BarrierflowError, InvalidArgumentError

__all__ = ["METHODS", "FailingConnector", "InjectedFaultError", "ListSink"]

#: The connector methods a fault can be injected into.
METHODS = (
    "open",
    "recover",
    "begin_epoch",
    "write_batch",
    "flush",
    "pre_commit",
    "commit_epoch",
    "rollback_epoch",
    "close",
)


class InjectedFaultError(BarrierflowError):
    """The failure a :class:`FailingConnector` was told to raise.

    Attributes:
        method: the connector method that failed.
    """

    def __init__(self, method: str) -> None:
        super().__init__(f"injected fault: {method} failed on cue")
        self.method = method


@final
class ListSink:
    """An in-memory exactly-once sink connector (see the module).

    Raises:
        InvalidArgumentError: ``schema`` is not a pyarrow Schema.
    """

    exactly_once = True

    def __init__(self, schema: pa.Schema) -> None:
        if not isinstance(schema, pa.Schema):
            raise InvalidArgumentError("schema", "a pyarrow Schema", schema)
        self._schema = schema
        self._open: int | None = None
        self._staged: dict[int, list[pa.RecordBatch]] = {}
        self._precommitted: set[int] = set()
        #: Committed epochs, in commit order: epoch → its rows.
        self.committed: dict[int, pa.Table] = {}

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    def rows(self) -> pa.Table:
        """Every committed row, in commit order."""
        tables = list(self.committed.values())
        return pa.concat_tables(tables) if tables else self._schema.empty_table()

    async def open(self) -> None:
        self._open = None

    async def recover(self, pending: Sequence[PendingCommit]) -> None:
        for commit in sorted(pending, key=lambda p: p.epoch):
            if commit.epoch in self._staged:
                self._commit(commit.epoch)
        self._staged.clear()  # every other staged epoch is replayed by the upstream
        self._precommitted.clear()

    async def begin_epoch(self, epoch: int) -> None:
        self._open = epoch
        self._staged[epoch] = []

    async def write_batch(self, batch: pa.RecordBatch) -> None:
        assert self._open is not None, "write_batch before begin_epoch"
        self._staged[self._open].append(batch)

    async def flush(self) -> None:
        """Nothing to flush: rows are staged in memory."""

    async def pre_commit(self, epoch: int) -> CommitMetadata:
        self._precommitted.add(epoch)
        self._open = None
        return {"rows": sum(b.num_rows for b in self._staged.get(epoch, []))}

    async def commit_epoch(self, epoch: int) -> None:
        if epoch in self.committed:
            return  # a replayed commit
        self._commit(epoch)

    def _commit(self, epoch: int) -> None:
        batches = self._staged.pop(epoch, [])
        self._precommitted.discard(epoch)
        self.committed[epoch] = pa.Table.from_batches(batches, self._schema)

    async def rollback_epoch(self, epoch: int) -> None:
        self._staged.pop(epoch, None)
        self._precommitted.discard(epoch)

    async def close(self) -> None:
        self._open = None


@final
class FailingConnector:
    """Wraps ``inner``, failing or hanging its methods on cue (see the module)."""

    def __init__(self, inner: SinkConnector) -> None:
        if not isinstance(inner, SinkConnector):
            raise InvalidArgumentError("inner", "a SinkConnector", type(inner).__name__)
        self.inner = inner
        self.exactly_once = inner.exactly_once
        #: Every call, as ``(method, argument)`` (an epoch, a row count, pending epochs).
        self.calls: list[tuple[str, Any]] = []
        self._failures: dict[str, int] = {}
        self._hangs: dict[str, anyio.Event] = {}
        self._called = Notifier()

    @property
    def schema(self) -> pa.Schema:
        return self.inner.schema

    def fail(self, method: str, times: int = 1) -> None:
        """Make the next ``times`` calls of ``method`` raise :class:`InjectedFaultError`.

        Raises:
            InvalidArgumentError: an unknown method, or ``times`` not an int >= 1.
        """
        _check_method(method)
        if type(times) is not int or times < 1:
            raise InvalidArgumentError("times", "an int >= 1", times)
        self._failures[method] = self._failures.get(method, 0) + times

    def hang(self, method: str) -> None:
        """Make calls of ``method`` wait until :meth:`release` (cancellable, like a stuck
        network call).

        Raises:
            InvalidArgumentError: an unknown method.
        """
        _check_method(method)
        self._hangs.setdefault(method, anyio.Event())

    def release(self, method: str) -> None:
        """Let the calls of ``method`` that hang go on (and the next ones not hang)."""
        event = self._hangs.pop(method, None)
        if event is not None:
            event.set()

    def called(self, method: str) -> list[Any]:
        """The arguments of every call of ``method`` so far."""
        return [argument for name, argument in self.calls if name == method]

    async def wait_called(self, method: str, times: int = 1) -> None:
        """Wait until ``method`` has been called ``times`` times in all (a test's way to wait
        for a recovery, a retried commit).

        Raises:
            InvalidArgumentError: an unknown method, or ``times`` not an int >= 1.
        """
        _check_method(method)
        if type(times) is not int or times < 1:
            raise InvalidArgumentError("times", "an int >= 1", times)
        while len(self.called(method)) < times:
            await self._called.wait()

    async def _enter(self, method: str, argument: Any = None) -> None:
        self.calls.append((method, argument))
        self._called.notify()
        hang = self._hangs.get(method)
        if hang is not None:
            await hang.wait()
        if self._failures.get(method, 0) > 0:
            self._failures[method] -= 1
            raise InjectedFaultError(method)

    async def open(self) -> None:
        await self._enter("open")
        await self.inner.open()

    async def recover(self, pending: Sequence[PendingCommit]) -> None:
        await self._enter("recover", tuple(p.epoch for p in pending))
        await self.inner.recover(pending)

    async def begin_epoch(self, epoch: int) -> None:
        await self._enter("begin_epoch", epoch)
        await self.inner.begin_epoch(epoch)

    async def write_batch(self, batch: pa.RecordBatch) -> None:
        await self._enter("write_batch", batch.num_rows)
        await self.inner.write_batch(batch)

    async def flush(self) -> None:
        await self._enter("flush")
        await self.inner.flush()

    async def pre_commit(self, epoch: int) -> CommitMetadata:
        await self._enter("pre_commit", epoch)
        return await self.inner.pre_commit(epoch)

    async def commit_epoch(self, epoch: int) -> None:
        await self._enter("commit_epoch", epoch)
        await self.inner.commit_epoch(epoch)

    async def rollback_epoch(self, epoch: int) -> None:
        await self._enter("rollback_epoch", epoch)
        await self.inner.rollback_epoch(epoch)

    async def close(self) -> None:
        await self._enter("close")
        await self.inner.close()


def _check_method(method: object) -> None:
    if method not in METHODS:
        raise InvalidArgumentError("method", f"one of {list(METHODS)}", method)
