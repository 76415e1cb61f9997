"""Tables for tests: an in-memory exactly-once table that records rows per epoch, and a
wrapper that makes any table's writers or committer fail or hang on cue.

* :class:`ListTable` — the commit protocol kept in memory (:mod:`barrierflow.actors.sinks.table`):
  writers stage batches per epoch, the committer publishes an epoch's batches at once into
  :attr:`ListTable.committed` (epoch → rows), a replayed commit is a no-op (the table's
  committed marker is its last committed epoch), ``recover`` drops every staged epoch no
  pending commit names, and the source positions are recorded with each commit. It lives in
  one process: declare the sink with the *same* instance and it survives the runtime's
  recoveries and restarts in that process — not a process crash (use a file-backed table,
  such as :class:`~barrierflow.connectors.ParquetTable`, for those).
* :class:`FailingTable` — wraps a table; ``fail("commit", times=2)`` makes the next two
  commits raise :class:`InjectedFaultError` (before reaching the wrapped committer: the
  coordinator retries them as unclassified), ``fail("commit", permanent=True)`` makes the
  next one say :class:`~barrierflow.actors.sinks.table.Failed` (the pipeline fails with
  :class:`~barrierflow.errors.TableCommitFailedError`), ``hang("flush")`` makes writers'
  flushes wait until :meth:`FailingTable.release`. Every call is recorded in
  :attr:`FailingTable.calls`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, final

import anyio
import pyarrow as pa

from barrierflow._sync import Notifier
from barrierflow.actors.sinks.positions import epoch_already_held, table_commits
from barrierflow.actors.sinks.table import (
    AlreadyCommitted,
    CommitMetadata,
    CommitOutcome,
    Committed,
    Committer,
    Failed,
    Manifest,
    SinkCommits,
    StagedFile,
    StagingWriter,
    Table,
    manifests_positions,
)
from barrierflow.channels.errors import BarrierflowError, InvalidArgumentError
from barrierflow.runtime.positions import merge_positions

__all__ = [
    "COMMITTER_METHODS",
    "METHODS",
    "WRITER_METHODS",
    "FailingTable",
    "InjectedFaultError",
    "ListTable",
]

#: The staging writer methods a fault can be injected into.
WRITER_METHODS = ("open", "begin", "write", "flush", "stage", "discard", "close")
#: The committer methods a fault can be injected into.
COMMITTER_METHODS = ("recover", "prepare", "commit", "abort")
#: Every method a fault can be injected into.
METHODS = WRITER_METHODS + COMMITTER_METHODS


class InjectedFaultError(BarrierflowError):
    """The failure a :class:`FailingTable` was told to raise.

    Attributes:
        method: the writer or committer method that failed.
    """

    def __init__(self, method: str) -> None:
        super().__init__(f"injected fault: {method} failed on cue")
        self.method = method


@final
class ListTable:
    """An in-memory exactly-once table (see the module).

    Raises:
        InvalidArgumentError: ``schema`` is not a pyarrow Schema.
    """

    def __init__(self, schema: pa.Schema) -> None:
        if not isinstance(schema, pa.Schema):
            raise InvalidArgumentError("schema", "a pyarrow Schema", schema)
        self._schema = schema
        #: Staged batches by path (``mem/<epoch>/w<id>/<n>``): one "file" per batch.
        self.staged: dict[str, pa.RecordBatch] = {}
        #: Committed epochs, in commit order: epoch → its rows.
        self.committed: dict[int, pa.Table] = {}
        #: The source positions the committed rows reach.
        self.positions: dict[str, int] = {}

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    def rows(self) -> pa.Table:
        """Every committed row, in commit order."""
        tables = list(self.committed.values())
        return pa.concat_tables(tables) if tables else self._schema.empty_table()

    @property
    def last_committed(self) -> int:
        """The table's committed marker: the last epoch committed (0: none)."""
        return max(self.committed, default=0)

    def writer(self, writer_id: str) -> ListWriter:
        return ListWriter(self, writer_id)

    def committer(self) -> ListCommitter:
        return ListCommitter(self)


@final
class ListWriter:
    """One writer of a :class:`ListTable`: stages each batch as one in-memory "file"."""

    def __init__(self, table: ListTable, writer_id: str) -> None:
        self._table = table
        self._id = writer_id
        self._open: int | None = None
        self._paths: list[str] = []

    @property
    def schema(self) -> pa.Schema:
        return self._table.schema

    async def open(self) -> None:
        await anyio.lowlevel.checkpoint()

    async def begin(self, epoch: int) -> None:
        await anyio.lowlevel.checkpoint()
        self._open, self._paths = epoch, []

    async def write(self, batch: pa.RecordBatch) -> None:
        await anyio.lowlevel.checkpoint()
        assert self._open is not None, "write before begin"
        path = f"mem/{self._open}/w{self._id}/{len(self._paths)}"
        self._table.staged[path] = batch
        self._paths.append(path)

    async def flush(self) -> None:
        """Nothing to flush: rows are staged in memory."""
        await anyio.lowlevel.checkpoint()

    async def stage(self, epoch: int) -> Manifest:
        await anyio.lowlevel.checkpoint()
        staged = self._table.staged
        files = tuple(StagedFile(p, staged[p].num_rows, staged[p].nbytes) for p in self._paths)
        self._open, self._paths = None, []
        return Manifest(self._id, epoch, files)

    async def discard(self, epoch: int) -> None:
        await anyio.lowlevel.checkpoint()
        prefix = f"mem/{epoch}/w{self._id}/"
        for path in [p for p in self._table.staged if p.startswith(prefix)]:
            del self._table.staged[path]
        if self._open == epoch:
            self._open, self._paths = None, []

    async def close(self) -> None:
        await anyio.lowlevel.checkpoint()
        self._open = None


@final
class ListCommitter:
    """The committer of a :class:`ListTable`."""

    def __init__(self, table: ListTable) -> None:
        self._table = table

    async def recover(self, pending: Mapping[int, CommitMetadata]) -> None:
        await anyio.lowlevel.checkpoint()
        keep = {path for metadata in pending.values() for path in metadata.get("paths", [])}
        for path in [p for p in self._table.staged if p not in keep]:
            del self._table.staged[path]

    async def prepare(self, epoch: int, manifests: Sequence[Manifest]) -> CommitMetadata | None:
        await anyio.lowlevel.checkpoint()
        paths = [f.path for m in manifests for f in m.files]
        if not paths:
            return None
        return {"paths": paths, **manifests_positions(manifests)}

    async def commit(self, epoch: int, metadata: CommitMetadata) -> CommitOutcome:
        await anyio.lowlevel.checkpoint()
        table = self._table
        if epoch <= table.last_committed:
            return AlreadyCommitted()  # a replayed commit
        positions = metadata.get("positions", {})
        if epoch_already_held(
            "ListTable", epoch, table.positions, metadata.get("positions_from", {}), positions
        ):
            await self.abort(epoch, metadata)
            return AlreadyCommitted()
        batches = [table.staged.pop(path) for path in metadata["paths"]]
        table.committed[epoch] = pa.Table.from_batches(batches, table.schema)
        table.positions = merge_positions(table.positions, positions)
        return Committed()

    async def abort(self, epoch: int, metadata: CommitMetadata | None) -> None:
        await anyio.lowlevel.checkpoint()
        for path in [] if metadata is None else metadata.get("paths", []):
            self._table.staged.pop(path, None)

    async def sink_commits(self) -> SinkCommits | None:
        """What the table holds (``None``: nothing committed)."""
        await anyio.lowlevel.checkpoint()
        table = self._table
        if not table.committed:
            return None
        return SinkCommits("ListTable", table.last_committed, dict(table.positions))


@final
class FailingTable:
    """Wraps ``inner``, failing or hanging its writers' and committer's methods on cue (see
    the module).

    Raises:
        InvalidArgumentError: ``inner`` is not a Table.
    """

    def __init__(self, inner: Table) -> None:
        if not isinstance(inner, Table):
            raise InvalidArgumentError("inner", "a Table", type(inner).__name__)
        self.inner = inner
        #: Every call, as ``(method, argument)`` (an epoch, a row count, pending epochs).
        self.calls: list[tuple[str, Any]] = []
        self._failures: dict[str, int] = {}
        self._hangs: dict[str, anyio.Event] = {}
        self._called = Notifier()

    @property
    def schema(self) -> pa.Schema:
        return self.inner.schema

    def writer(self, writer_id: str) -> FailingWriter:
        return FailingWriter(self, self.inner.writer(writer_id))

    def committer(self) -> FailingCommitter:
        return FailingCommitter(self, self.inner.committer())

    def fail(self, method: str, times: int = 1, *, permanent: bool = False) -> None:
        """Make the next ``times`` calls of ``method`` raise :class:`InjectedFaultError` —
        or, with ``permanent`` (``"commit"`` only), the next ``times`` commits return
        :class:`~barrierflow.actors.sinks.table.Failed` with it, as a table that can never
        commit again says.

        Raises:
            InvalidArgumentError: an unknown method, ``times`` not an int >= 1, or
                ``permanent`` not a bool or given for a method other than ``"commit"``.
        """
        _check_method(method)
        if type(times) is not int or times < 1:
            raise InvalidArgumentError("times", "an int >= 1", times)
        if type(permanent) is not bool or (permanent and method != "commit"):
            raise InvalidArgumentError("permanent", "a bool, True only for 'commit'", permanent)
        key = "commit-for-good" if permanent else method
        self._failures[key] = self._failures.get(key, 0) + times

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

    async def enter(self, method: str, argument: Any = None) -> None:
        """Record a call of ``method``; hang or fail it if told to (what the wrapped writers
        and committers call first)."""
        self.calls.append((method, argument))
        self._called.notify()
        hang = self._hangs.get(method)
        if hang is not None:
            await hang.wait()
        if self.take_failure(method):
            raise InjectedFaultError(method)

    def take_failure(self, key: str) -> bool:
        """Whether a failure is due for ``key`` (a method, or ``"commit-for-good"``); counts
        it off."""
        if self._failures.get(key, 0) > 0:
            self._failures[key] -= 1
            return True
        return False


@final
class FailingWriter:
    """A writer of a :class:`FailingTable`: the inner table's writer behind the faults."""

    def __init__(self, faults: FailingTable, inner: StagingWriter) -> None:
        self._faults = faults
        self.inner = inner

    @property
    def schema(self) -> pa.Schema:
        return self.inner.schema

    async def open(self) -> None:
        await self._faults.enter("open")
        await self.inner.open()

    async def begin(self, epoch: int) -> None:
        await self._faults.enter("begin", epoch)
        await self.inner.begin(epoch)

    async def write(self, batch: pa.RecordBatch) -> None:
        await self._faults.enter("write", batch.num_rows)
        await self.inner.write(batch)

    async def flush(self) -> None:
        await self._faults.enter("flush")
        await self.inner.flush()

    async def stage(self, epoch: int) -> Manifest:
        await self._faults.enter("stage", epoch)
        return await self.inner.stage(epoch)

    async def discard(self, epoch: int) -> None:
        await self._faults.enter("discard", epoch)
        await self.inner.discard(epoch)

    async def close(self) -> None:
        await self._faults.enter("close")
        await self.inner.close()


@final
class FailingCommitter:
    """The committer of a :class:`FailingTable`: the inner committer behind the faults."""

    def __init__(self, faults: FailingTable, inner: Committer) -> None:
        self._faults = faults
        self.inner = inner

    async def recover(self, pending: Mapping[int, CommitMetadata]) -> None:
        await self._faults.enter("recover", tuple(sorted(pending)))
        await self.inner.recover(pending)

    async def prepare(self, epoch: int, manifests: Sequence[Manifest]) -> CommitMetadata | None:
        await self._faults.enter("prepare", epoch)
        return await self.inner.prepare(epoch, manifests)

    async def commit(self, epoch: int, metadata: CommitMetadata) -> CommitOutcome:
        await self._faults.enter("commit", epoch)
        if self._faults.take_failure("commit-for-good"):
            return Failed(InjectedFaultError("commit"))
        return await self.inner.commit(epoch, metadata)

    async def abort(self, epoch: int, metadata: CommitMetadata | None) -> None:
        await self._faults.enter("abort", epoch)
        await self.inner.abort(epoch, metadata)

    async def sink_commits(self) -> SinkCommits | None:
        """What the inner table holds, if its committer can tell."""
        return await table_commits(self.inner)


def _check_method(method: object) -> None:
    if method not in METHODS:
        raise InvalidArgumentError("method", f"one of {list(METHODS)}", method)
