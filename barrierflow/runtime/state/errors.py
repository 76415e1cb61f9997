"""Errors of the durable state store: locked, corrupted, of another format or version,
an unusable path, or an I/O failure.

Every public name is re-exported from :mod:`barrierflow.errors`.
"""

from __future__ import annotations

from typing import final

from barrierflow.channels.errors import BarrierflowError, InvalidArgumentError, ProtocolError

__all__ = [
    "StateStoreError",
    "StoreLockedError",
    "StoreFormatError",
    "StoreVersionError",
    "StoreCorruptedError",
    "StorePathError",
    "StoreIOError",
    "ConcurrentCommitError",
    "EpochNotSealedError",
    "VersionCompactedError",
]


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


@final
class ConcurrentCommitError(ProtocolError):
    """A checkpoint commit started while another was still running: checkpoints commit one at a
    time, in epoch order (the barrier manager's rule), so a second one means two committers.

    Attributes:
        path: the store's file.
        epoch: the commit that was refused.
        running: the epoch whose commit was running.
    """

    def __init__(self, path: str, epoch: int, running: int) -> None:
        self.path = path
        self.epoch = epoch
        self.running = running
        super().__init__(
            f"state store {path!r}: expected one checkpoint commit at a time, got a commit of "
            f"epoch {epoch!r} while the commit of epoch {running} runs"
        )


@final
class VersionCompactedError(StateStoreError, LookupError):
    """A read of a versioned table asked for a version compaction has folded away: the table
    is as of ``oldest`` or later, so neither its rows as of ``epoch`` nor the change log of
    ``epoch`` exist any more (pin an epoch to keep what a reader still needs).

    Attributes:
        table: ``owner/name`` of the table.
        epoch: the epoch asked for.
        oldest: the oldest epoch the table can still be read as of.
    """

    def __init__(self, table: str, epoch: int, oldest: int) -> None:
        self.table = table
        self.epoch = epoch
        self.oldest = oldest
        super().__init__(
            f"versioned table {table}: expected an epoch from {oldest} on (a change log: after "
            f"it; older versions are compacted away, pin what a reader needs), got epoch {epoch}"
        )


@final
class EpochNotSealedError(StateStoreError, LookupError):
    """A read of a versioned table asked for an epoch that is not sealed yet: its writes may
    still change, so no version of it can be read.

    Attributes:
        table: ``owner/name`` of the table.
        epoch: the epoch asked for.
        sealed: the last sealed epoch.
    """

    def __init__(self, table: str, epoch: int, sealed: int) -> None:
        self.table = table
        self.epoch = epoch
        self.sealed = sealed
        super().__init__(
            f"versioned table {table}: expected a sealed epoch (at most {sealed}), got epoch "
            f"{epoch}"
        )
