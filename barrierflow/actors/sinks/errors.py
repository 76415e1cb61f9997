"""Errors of the sink actors: the sink task, the sink writer and the coordinator worker.

Every public name is re-exported from :mod:`barrierflow.errors`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, final

from barrierflow.channels.errors import BarrierflowError, ProtocolError, short_vnodes
from barrierflow.runtime.errors import GraphError

__all__ = [
    "CommittedEpochsEndedError",
    "CoordinatorAbortedError",
    "CoordinatorMissingError",
    "DuplicateVnodeError",
    "DuplicateWriterError",
    "EpochPoisonedError",
    "PartitionCoverageError",
    "PositionOverlapError",
    "SchemaChangeMismatchError",
    "SinkConnectorError",
    "SinkEpochError",
    "SinkError",
    "SinkRecordsOrderError",
    "SinkRecoveryError",
    "SinkStateMismatchError",
    "SinkWriterInputError",
    "StagedFilesGoneError",
    "TableCommitFailedError",
    "UnexpectedWriterRequestError",
]


class SinkError(BarrierflowError):
    """A sink refused or failed an operation.

    Attributes:
        sink: the sink's name.
    """

    sink: str


@final
class SinkStateMismatchError(SinkError):
    """The runtime's state store is new or empty, but a sink already holds commits: starting
    anyway would make the upstream replay rows the sink has (duplicates).

    Attributes:
        sink: the sink that holds commits.
        state_path: the store.
        committed_epoch: the sink's last committed epoch.
        positions: the source positions recorded with it.
    """

    def __init__(
        self, sink: str, state_path: str, committed_epoch: int, positions: dict[str, int]
    ) -> None:
        self.sink = sink
        self.state_path = state_path
        self.committed_epoch = committed_epoch
        self.positions = dict(positions)
        recorded = f"positions {self.positions}" if self.positions else "no source positions"
        super().__init__(
            f"sink {sink!r}: holds commits up to epoch {committed_epoch} ({recorded}), but the "
            f"state store {state_path!r} is new or empty; expected the store those commits came "
            "with — restore it, write to a new sink location, or set "
            "RuntimeConfig(adopt_sink_positions=True) to continue from the sink's positions"
        )


@final
class EpochPoisonedError(SinkError):
    """A write of the current epoch failed, so the epoch cannot be staged.

    Staging it would send the coordinator an epoch with rows missing; the only way forward is
    to discard it and begin a new epoch (whose successful begin clears the poison).

    Attributes:
        sink: the sink's name.
        operation: ``"stage"``.
        epoch: the epoch that was asked for.
        write_errors: failed writes counted by the sink so far.
    """

    def __init__(self, sink: str, operation: str, epoch: int, write_errors: int) -> None:
        self.sink = sink
        self.operation = operation
        self.epoch = epoch
        self.write_errors = write_errors
        super().__init__(
            f"sink {sink!r}: {operation} of epoch {epoch} refused: the epoch is poisoned by a "
            f"failed write ({write_errors} write error(s) so far); expected a discard and a "
            "successful begin first"
        )


@final
class SinkEpochError(SinkError, ProtocolError):
    """An epoch command arrived out of the sink's order (begin → write → stage or discard).

    Attributes:
        sink: the sink's name.
        operation: the refused operation (``"begin"``, ``"stage"``, ...).
        epoch: the epoch that was asked for.
        expected: what the sink would have accepted, in words.
    """

    def __init__(self, sink: str, operation: str, epoch: int, expected: str) -> None:
        self.sink = sink
        self.operation = operation
        self.epoch = epoch
        self.expected = expected
        super().__init__(f"sink {sink!r}: {operation}({epoch}): expected {expected}")


@final
class SinkConnectorError(SinkError):
    """A sink's staging writer raised; ``__cause__`` is what it raised.

    Attributes:
        sink: the sink's name.
        operation: the writer method that failed.
        epoch: the epoch it concerned, if any.
    """

    def __init__(self, sink: str, operation: str, epoch: int | None, cause: BaseException) -> None:
        self.sink = sink
        self.operation = operation
        self.epoch = epoch
        self.cause = cause
        at = "" if epoch is None else f" of epoch {epoch}"
        super().__init__(f"sink {sink!r}: {operation}{at} failed: {type(cause).__name__}: {cause}")


@final
class SinkRecoveryError(SinkError):
    """A sink's files or records do not allow it to recover what its checkpoint promises
    (an epoch recorded as pre-committed is neither staged nor committed, a manifest is
    unreadable, ...). Nothing is deleted when this is raised.

    Attributes:
        sink: the sink's name (or its path).
        reason: what was found, in words.
    """

    def __init__(self, sink: str, reason: str) -> None:
        self.sink = sink
        self.reason = reason
        super().__init__(f"sink {sink!r}: cannot recover: {reason}")


@final
class DuplicateVnodeError(ProtocolError):
    """Two sink writers claimed the same vnodes (at registration or in one epoch's commit).

    Attributes:
        sink: the sink's name.
        vnodes: the vnodes claimed twice.
        stage: what was being aligned (``"registration"``, ``"epoch 123"``, ...).
    """

    def __init__(self, sink: str, vnodes: Iterable[int], stage: str) -> None:
        self.sink = sink
        self.vnodes = sorted(vnodes)
        self.stage = stage
        super().__init__(
            f"sink {sink!r}: expected every vnode exactly once in {stage}, got vnodes "
            f"{short_vnodes(self.vnodes)} from two writers"
        )


@final
class SchemaChangeMismatchError(ProtocolError):
    """The writers of one epoch sent different schema changes.

    Attributes:
        sink, epoch: where.
        first, other: the two schema changes.
    """

    def __init__(self, sink: str, epoch: int, first: Any, other: Any) -> None:
        self.sink = sink
        self.epoch = epoch
        self.first = first
        self.other = other
        super().__init__(
            f"sink {sink!r}: epoch {epoch}: expected one schema change from every writer, got "
            f"{first!r} and {other!r}"
        )


@final
class CoordinatorAbortedError(SinkError):
    """The sink's coordinator failed; every writer handle is aborted with its cause.

    Attributes:
        sink: the sink's name.
        cause: what the coordinator failed with (also ``__cause__``).
    """

    def __init__(self, sink: str, cause: BaseException) -> None:
        self.sink = sink
        self.cause = cause
        super().__init__(f"sink {sink!r}: the coordinator failed: {type(cause).__name__}: {cause}")


@final
class DuplicateWriterError(SinkError, ProtocolError):
    """Two parallel writers of one sink use the same writer id, so their staged files would
    overwrite each other (rows lost without a trace).

    Attributes:
        sink: the sink's name.
        writer: the writer id both use.
        first, second: the two writers (actor names, or how they were registered).
    """

    def __init__(self, sink: str, writer: str, first: str, second: str) -> None:
        self.sink = sink
        self.writer = writer
        self.first = first
        self.second = second
        super().__init__(
            f"sink {sink!r}: expected a unique writer id per parallel writer, got writer id "
            f"{writer!r} for both {first!r} and {second!r}"
        )


@final
class CoordinatorMissingError(GraphError):
    """A coordinated sink writer cannot run: its coordinator is not a service of the runtime,
    or its parallel siblings disagree on the coordinator.

    Attributes:
        writer: the writer actor's name.
        sink: the coordinator's sink name (or ``None``: the writer has none).
    """

    def __init__(self, writer: str, sink: str | None, expected: str, got: str) -> None:
        self.writer = writer
        self.sink = sink
        super().__init__(f"sink writer {writer!r}", expected, got)


@final
class UnexpectedWriterRequestError(ProtocolError):
    """A writer sent its coordinator a request the coordinator cannot take at this stage (a
    commit during realignment, an initial epoch after init, a writer that is not running).

    Attributes:
        sink: the sink's name.
        stage: where the coordinator was (``"init"``, ``"realignment"``, ``"running"``, ...).
        expected: what it would have accepted, in words.
        request: the request that arrived (``"Commit"``, ``"AlignInitial"``, ...).
        writer: the handle id of the writer that sent it (``None``: none known).
        epoch: the epoch the request carried, if any.
    """

    def __init__(
        self,
        sink: str,
        stage: str,
        expected: str,
        request: str,
        writer: int | None = None,
        epoch: int | None = None,
    ) -> None:
        self.sink = sink
        self.stage = stage
        self.expected = expected
        self.request = request
        self.writer = writer
        self.epoch = epoch
        source = "" if writer is None else f" from writer {writer}"
        at = "" if epoch is None else f" for epoch {epoch}"
        super().__init__(
            f"sink {sink!r} during {stage}: expected {expected}, got {request}{source}{at}"
        )


@final
class SinkRecordsOrderError(ProtocolError):
    """A coordinated sink's meta-store records are not in the order the coordinator writes
    them (the last committed, then pending ones, then aborted ones).

    Attributes:
        sink: the sink's name.
        expected: the rule the records break, in words.
        records: every record as ``(epoch, state)``, in epoch order.
    """

    def __init__(self, sink: str, expected: str, records: Iterable[tuple[int, str]]) -> None:
        self.sink = sink
        self.expected = expected
        self.records = tuple(records)
        super().__init__(
            f"sink {sink!r}: expected {expected} in the meta store, got {list(self.records)}"
        )


@final
class SinkWriterInputError(ProtocolError):
    """A sink writer's input broke the sink's contract: rows before the first barrier, or
    deletes and updates into an append-only sink.

    Attributes:
        writer: the sink writer actor's name.
        expected: what the writer accepts, in words.
        got: what arrived, in words.
    """

    def __init__(self, writer: str, expected: str, got: str) -> None:
        self.writer = writer
        self.expected = expected
        self.got = got
        super().__init__(f"sink writer {writer!r}: expected {expected}, got {got}")


@final
class CommittedEpochsEndedError(SinkError):
    """The runtime's stream of committed epochs ended while a sink's coordinator still ran.

    A two-phase coordinator commits an epoch only once the runtime's committed epoch reached
    it; without the stream no pre-committed epoch would ever commit again, and the sink would
    stop committing without a word. The seed fails its coordinator likewise ("Hummock
    committed epoch sender closed unexpectedly").

    Attributes:
        sink: the sink's name.
        last_epoch: the last committed epoch the stream delivered (``None``: none).
        waiting: the pre-committed epochs still waiting for their commit, in epoch order.
    """

    def __init__(self, sink: str, last_epoch: int | None, waiting: Iterable[int]) -> None:
        self.sink = sink
        self.last_epoch = last_epoch
        self.waiting = tuple(waiting)
        after = "before its first epoch" if last_epoch is None else f"after epoch {last_epoch}"
        super().__init__(
            f"sink {sink!r}: expected the runtime's committed epochs to continue while the "
            f"coordinator runs, got the end of the stream {after}; epochs "
            f"{short_vnodes(list(self.waiting))} wait for their commit"
        )


@final
class PositionOverlapError(SinkError):
    """An epoch holds batches the sink already committed together with new ones, so neither
    committing nor skipping it is exact.

    Attributes:
        sink, epoch: where.
        key: the position key (``"<source>/<stream>"``).
        first, last: the batch ids of ``key`` in the epoch.
        held: the last batch id of ``key`` the sink holds.
    """

    def __init__(self, sink: str, epoch: int, key: str, first: int, last: int, held: int) -> None:
        self.sink = sink
        self.epoch = epoch
        self.key = key
        self.first = first
        self.last = last
        self.held = held
        super().__init__(
            f"sink {sink!r}: epoch {epoch} holds batches {first}..{last} of {key!r}, but the "
            f"sink already holds up to batch {held}; expected an epoch wholly new or wholly held"
        )


@final
class PartitionCoverageError(ProtocolError):
    """The manifests of a micro-batch staged on Spark executors do not cover each of its
    partitions exactly once (the shares the coordinator checks there instead of vnodes).

    Attributes:
        sink: the sink's name.
        batch: the micro-batch (``"<position key>#<batch id>"``).
        partitions: how many partitions the micro-batch has.
        got: the partitions the manifests name, in order (a repeat is a duplicate).
    """

    def __init__(self, sink: str, batch: str, partitions: int, got: Iterable[int]) -> None:
        self.sink = sink
        self.batch = batch
        self.partitions = partitions
        self.got = list(got)
        super().__init__(
            f"sink {sink!r}: expected every partition 0..{partitions - 1} of {batch} exactly "
            f"once, got partitions {sorted(self.got)}"
        )


@final
class StagedFilesGoneError(SinkError):
    """A committable reached its sink's writer, but a file it names is gone: the coordinator's
    recovery cleaned the staging area between the staging and the delivery (the files were
    staged while the graph recovered). The epoch fails, and the bridge stages the batch again.

    Attributes:
        sink: the sink's name.
        batch: the micro-batch (``"<position key>#<batch id>"``).
        path: the first missing file.
    """

    def __init__(self, sink: str, batch: str, path: str) -> None:
        self.sink = sink
        self.batch = batch
        self.path = path
        super().__init__(
            f"sink {sink!r}: expected the files staged for {batch} to exist, but {path} is gone "
            "(a recovery cleaned the staging area meanwhile); the batch is staged again"
        )


@final
class TableCommitFailedError(SinkError):
    """A table's commit of an epoch failed for good: the table said so (the committer
    returned :class:`~barrierflow.actors.sinks.table.Failed`: the table is gone, its schema
    conflicts, a permission is missing), or it kept failing for a reason that might have
    passed (:class:`~barrierflow.actors.sinks.table.RetryLater`, or an unclassified error)
    for longer than the coordinator's ``commit_retry_timeout``.

    The coordinator fails with it, which fails the pipeline: no writer is acknowledged after
    it, so a table that can no longer commit stops the run instead of one that looks alive and
    never commits again. The epoch stays pending in the meta store: once the cause is fixed,
    a restart commits it.

    Attributes:
        sink: the sink's name (the table's, as declared with ``add_sink``).
        epoch: the epoch whose commit failed.
        cause: what the commit failed with (also ``__cause__``).
        retry_timeout: ``None`` when the table said the failure is permanent; else the retry
            bound, in seconds, that ran out.
    """

    def __init__(
        self, sink: str, epoch: int, cause: BaseException, retry_timeout: float | None = None
    ) -> None:
        self.sink = sink
        self.epoch = epoch
        self.cause = cause
        self.retry_timeout = retry_timeout
        why = (
            "permanently (the table says retrying will not help)"
            if retry_timeout is None
            else f"after retrying for {retry_timeout:g} s (commit_retry_timeout ran out)"
        )
        detail = " ".join(f"{type(cause).__name__}: {cause}".split())
        super().__init__(
            f"sink {sink!r}: expected the table to commit epoch {epoch}, got a failure {why}: "
            f"{detail}"
        )

    @property
    def permanent(self) -> bool:
        """Whether the table classified the failure as permanent (not a retry bound)."""
        return self.retry_timeout is None
