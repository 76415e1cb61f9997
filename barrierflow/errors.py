"""The one error hierarchy of barrierflow.

Every error barrierflow raises derives from :class:`BarrierflowError`, split by cause the way
trio splits its own: the caller closed the resource, the peer went away, the input was bad,
or a peer broke the protocol. Constructors take structured fields and build the message, so
that a test asserts on fields and a user reads what was expected and what arrived.

Channel errors also derive from anyio's matching classes, so code written against anyio
streams catches them unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, final

import anyio

__all__ = [
    "BarrierflowError",
    "InvalidArgumentError",
    "ConfigError",
    "SchemaMismatchError",
    "EpochOrderError",
    "VnodeOwnershipError",
    "ChannelClosedError",
    "ChannelBrokenError",
    "ProtocolError",
    "BarrierMisalignedError",
    "StateStoreError",
    "StoreLockedError",
    "StoreFormatError",
    "StoreVersionError",
    "ActorError",
    "ActorGoneError",
    "ActorFailedError",
    "GraphError",
    "SinkError",
    "EpochPoisonedError",
    "SinkEpochError",
    "SinkConnectorError",
    "SinkRecoveryError",
    "DuplicateVnodeError",
    "SchemaChangeMismatchError",
    "CoordinatorAbortedError",
    "NotRunningError",
    "BatchOrderError",
    "BatchAbortedError",
    "SparkUnavailableError",
    "DuplicateWriterError",
    "SinkLockedError",
    "SinkStateMismatchError",
    "PositionOverlapError",
    "CoordinatorMissingError",
    "StoreCorruptedError",
    "StorePathError",
    "StoreIOError",
]


def _short(vnodes: Iterable[int], limit: int = 16) -> str:
    """Render a sorted list of vnodes, eliding the middle of a long one."""
    items = sorted(vnodes)
    if len(items) <= limit:
        return str(items)
    head = ", ".join(str(v) for v in items[: limit // 2])
    tail = ", ".join(str(v) for v in items[-limit // 2 :])
    return f"[{head}, ... ({len(items) - limit} more) ..., {tail}]"


class BarrierflowError(Exception):
    """Root of every error barrierflow raises."""


class InvalidArgumentError(BarrierflowError, ValueError):
    """A public function or constructor was given a value it cannot accept.

    Attributes:
        argument: the name of the offending argument (``"max_messages"``, ``"ops"``).
        expected: what would have been accepted, in words.
        got: what arrived.
    """

    def __init__(self, argument: str, expected: str, got: Any) -> None:
        self.argument = argument
        self.expected = expected
        self.got = got
        super().__init__(f"{argument}: expected {expected}, got {got!r}")


@final
class ConfigError(InvalidArgumentError):
    """A configuration value is out of range (a capacity ≤ 0, an interval ≤ 0, ...)."""


@final
class SchemaMismatchError(InvalidArgumentError):
    """Data arrived whose schema differs from the one the receiver was built for.

    Attributes:
        expected_schema: the schema the receiver requires.
        actual_schema: the schema that arrived.

    The message renders each schema on one line (``(user: int64, clicks: int64)``) so that the
    whole error reads on one line, where Arrow prints a schema one field per line.
    """

    def __init__(self, argument: str, expected_schema: Any, actual_schema: Any) -> None:
        self.expected_schema = expected_schema
        self.actual_schema = actual_schema
        super().__init__(argument, f"schema ({_one_line(expected_schema)})", actual_schema)
        # ``got`` stays the schema itself; only the message uses the one-line rendering.
        self.args = (
            f"{argument}: expected schema ({_one_line(expected_schema)}), "
            f"got schema ({_one_line(actual_schema)})",
        )


def _one_line(schema: Any) -> str:
    """A schema as ``name: type, ...`` (fields of a ``pyarrow.Schema``, or any text with its
    line breaks folded) — one line, whatever Arrow's own rendering."""
    names, types = getattr(schema, "names", None), getattr(schema, "types", None)
    if isinstance(names, list) and isinstance(types, list) and len(names) == len(types):
        nullable = [getattr(schema.field(i), "nullable", True) for i in range(len(names))]
        fields = ", ".join(
            f"{name}: {typ}{'' if ok else ' not null'}"
            for name, typ, ok in zip(names, types, nullable, strict=True)
        )
        return fields or "(no columns)"
    return ", ".join(line.strip() for line in str(schema).splitlines() if line.strip())


@final
class EpochOrderError(InvalidArgumentError):
    """Epochs that must strictly increase did not.

    Attributes:
        previous: the epoch that came first.
        current: the epoch that should have been greater.
    """

    def __init__(self, argument: str, previous: int, current: int) -> None:
        self.previous = previous
        self.current = current
        super().__init__(argument, f"an epoch greater than {previous}", current)


@final
class VnodeOwnershipError(InvalidArgumentError):
    """Vnode bitmaps of a set of owners do not cover every vnode exactly once.

    Attributes:
        overlapping: vnodes owned by more than one owner.
        missing: vnodes owned by nobody.
    """

    def __init__(self, argument: str, overlapping: Iterable[int], missing: Iterable[int]) -> None:
        self.overlapping = frozenset(overlapping)
        self.missing = frozenset(missing)
        problems = []
        if self.overlapping:
            problems.append(f"vnodes owned twice {_short(self.overlapping)}")
        if self.missing:
            problems.append(f"vnodes owned by nobody {_short(self.missing)}")
        super().__init__(
            argument, "bitmaps that cover every vnode exactly once", "; ".join(problems)
        )


class ChannelClosedError(BarrierflowError, anyio.ClosedResourceError):
    """This end of the channel was closed by its owner and then used again."""

    def __init__(self, channel: str, end: str) -> None:
        self.channel = channel
        self.end = end
        super().__init__(f"channel {channel!r}: this {end} end was closed and cannot be used")


class ChannelBrokenError(BarrierflowError, anyio.BrokenResourceError):
    """The other end of the channel went away, so this operation can never complete."""

    def __init__(self, channel: str, reason: str) -> None:
        self.channel = channel
        self.reason = reason
        super().__init__(f"channel {channel!r}: {reason}")


class ProtocolError(BarrierflowError):
    """A peer broke the stream protocol (barrier order, vnode coverage, ...)."""


@final
class BarrierMisalignedError(ProtocolError):
    """Two inputs of an aligned merge delivered barriers of different epochs.

    Attributes:
        first_input, first_epoch: the input that set the epoch being aligned, and that epoch.
        other_input, other_epoch: the input that disagreed, and its epoch.
    """

    def __init__(
        self, first_input: str, first_epoch: int, other_input: str, other_epoch: int
    ) -> None:
        self.first_input = first_input
        self.first_epoch = first_epoch
        self.other_input = other_input
        self.other_epoch = other_epoch
        super().__init__(
            f"input {other_input!r}: expected barrier for epoch {first_epoch} "
            f"(as delivered by input {first_input!r}), got epoch {other_epoch}"
        )


class StateStoreError(BarrierflowError):
    """The durable state store cannot be opened or used as asked."""


@final
class StoreLockedError(StateStoreError):
    """Another runtime (this process or another) holds the store file."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(
            f"state store {path!r}: expected to be the only runtime using it, but another "
            "one holds its lock; stop it first or use another file"
        )


@final
class StoreFormatError(StateStoreError):
    """The file is not a barrierflow state store (another SQLite file, or not SQLite)."""

    def __init__(self, path: str, found: str) -> None:
        self.path = path
        self.found = found
        super().__init__(
            f"state store {path!r}: expected a barrierflow state store or a new file, got {found}"
        )


@final
class StoreVersionError(StateStoreError):
    """The store was written by a newer barrierflow whose schema this one cannot read."""

    def __init__(self, path: str, found: int, supported: int) -> None:
        self.path = path
        self.found = found
        self.supported = supported
        super().__init__(
            f"state store {path!r}: expected schema version <= {supported}, got {found} "
            "(written by a newer barrierflow)"
        )


class ActorError(BarrierflowError):
    """Something went wrong with an actor of a runtime."""


@final
class ActorGoneError(ActorError):
    """A request can never be answered: the actor has stopped or its inbox is closed."""

    def __init__(self, actor: str, reason: str) -> None:
        self.actor = actor
        self.reason = reason
        super().__init__(f"actor {actor!r}: expected it to be running, but {reason}")


@final
class ActorFailedError(ActorError):
    """An actor raised, which stopped its graph; ``__cause__`` is what it raised."""

    def __init__(self, actor: str, actor_id: int, cause: BaseException) -> None:
        self.actor = actor
        self.actor_id = actor_id
        self.cause = cause
        super().__init__(f"actor {actor!r} (id {actor_id}) failed: {type(cause).__name__}: {cause}")


class GraphError(InvalidArgumentError):
    """The graph handed to a runtime is not one it can run (cycle, missing input, ...)."""


class SinkError(BarrierflowError):
    """A sink refused or failed an operation.

    Attributes:
        sink: the sink's name.
    """

    sink: str


@final
class EpochPoisonedError(SinkError):
    """A write of the current epoch failed, so the epoch cannot be pre-committed or committed.

    Committing it would publish an epoch with rows missing; the only way forward is to roll it
    back and begin a new epoch (whose successful begin clears the poison).

    Attributes:
        sink: the sink's name.
        operation: ``"pre_commit"`` or ``"commit_epoch"``.
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
            f"failed write ({write_errors} write error(s) so far); expected a rollback and a "
            "successful begin_epoch first"
        )


@final
class SinkEpochError(SinkError, ProtocolError):
    """An epoch command arrived out of the sink's order (begin → pre-commit → commit).

    Attributes:
        sink: the sink's name.
        operation: the refused operation (``"begin_epoch"``, ``"pre_commit"``, ...).
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
    """A sink's connector raised; ``__cause__`` is what it raised.

    Attributes:
        sink: the sink's name.
        operation: the connector method that failed.
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
            f"{_short(self.vnodes)} from two writers"
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
class NotRunningError(BarrierflowError):
    """A runtime (or something that needs one) was used while it is not running."""

    def __init__(self, what: str, how: str) -> None:
        self.what = what
        super().__init__(f"{what} is not running: {how}")


@final
class BatchOrderError(InvalidArgumentError):
    """A numbered batch id went backwards or skipped ahead of the last durable one.

    A replay of the last durable batch is not an error (it is skipped); anything else out of
    sequence would lose or duplicate rows, so it is refused before any row is delivered.

    Attributes:
        stream: the batch stream (a Spark query, a pump).
        last: the last durable batch id (``None``: nothing durable yet).
        batch_id: the id that arrived.
    """

    def __init__(self, stream: str, last: int | None, batch_id: int, expected: int) -> None:
        self.stream = stream
        self.last = last
        self.batch_id = batch_id
        problem = "goes backwards" if last is not None and batch_id < last else "skips ahead"
        super().__init__(
            f"batch id of stream {stream!r}",
            f"{expected} (the last durable batch is {last}; {last} itself is a replay and is "
            f"skipped) — this id {problem}",
            batch_id,
        )


@final
class BatchAbortedError(ProtocolError):
    """A batch was abandoned after some of its rows went downstream; the graph fails so that
    recovery discards them (they are not covered by a durable batch id)."""

    def __init__(self, stream: str, batch_id: int) -> None:
        self.stream = stream
        self.batch_id = batch_id
        super().__init__(
            f"batch {batch_id} of stream {stream!r} was abandoned part-way: expected its end "
            "mark after its rows"
        )


@final
class SparkUnavailableError(BarrierflowError):
    """Spark cannot run here: pyspark is not installed, or Java is missing."""

    def __init__(self, missing: str, install: str) -> None:
        self.missing = missing
        super().__init__(f"Spark is unavailable: {missing}; expected it installed — {install}")


# Sinks, writers and source positions (issue 12: no silent loss).


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
class SinkLockedError(SinkError):
    """A sink's table directory (or an Iceberg table's staging area) is held by another writer
    group — another process, or another sink of this one.

    Attributes:
        sink: the sink (its path).
        holder: who holds it, as far as known (``"another process"``, a writer group).
    """

    def __init__(self, sink: str, holder: str) -> None:
        self.sink = sink
        self.holder = holder
        super().__init__(
            f"sink {sink!r}: expected to be its only writer group, but {holder} holds its lock; "
            "stop it first or write to another location"
        )


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
class StoreCorruptedError(StateStoreError):
    """The file is a damaged state store: empty, cut short, unreadable pages, or missing or
    malformed metadata rows. barrierflow never treats such a file as a new store (that would
    replay from nothing and duplicate what sinks already hold) and never changes it; restore it
    or move it away.

    Attributes:
        path: the store's file (symlinks resolved).
        found: what was found, in words.
    """

    def __init__(self, path: str, found: str) -> None:
        self.path = path
        self.found = found
        super().__init__(
            f"state store {path!r}: expected an intact barrierflow state store, got {found}"
        )


@final
class StorePathError(StateStoreError, InvalidArgumentError):
    """``state_path`` cannot hold a state store: a directory, a parent that cannot be created
    or written, a file that is not a regular file, ... (also an :class:`InvalidArgumentError`).

    Attributes:
        argument: ``"state_path"``.
        path: the path as resolved (absolute, symlinks followed).
        expected: what would have been accepted, in words.
        got: what was found, in words.
    """

    def __init__(self, path: str, expected: str, got: str) -> None:
        self.argument = "state_path"
        self.path = path
        self.expected = expected
        self.got = got
        Exception.__init__(self, f"state_path {path!r}: expected {expected}, got {got}")


@final
class StoreIOError(StateStoreError):
    """The operating system or SQLite failed on the store's file (an I/O error, a full disk,
    ...); ``__cause__`` is what it raised.

    Attributes:
        path: the store's file.
        operation: what was being done (``"open"``, ...).
        cause: the underlying error.
    """

    def __init__(self, path: str, operation: str, cause: BaseException) -> None:
        self.path = path
        self.operation = operation
        self.cause = cause
        super().__init__(
            f"state store {path!r}: {operation} failed: {type(cause).__name__}: {cause}"
        )
