"""What the committers of the file tables (Parquet, Iceberg, Delta) share.

A file table's commit is two steps that fail differently: moving the epoch's staged files
into the table (the file system's), then the format's own atomic commit (a rename, a catalog
transaction, a Delta log entry). :func:`file_commit_outcome` classifies a failure of either
into the protocol's outcomes, so each format only names its catalog's own errors.
"""

from __future__ import annotations

from pathlib import Path

from barrierflow.actors.sinks.errors import PositionOverlapError, SinkRecoveryError
from barrierflow.actors.sinks.table import CommitOutcome, Failed, RetryLater

__all__ = ["file_commit_outcome"]


def file_commit_outcome(
    exc: Exception,
    root: Path,
    *,
    retryable: tuple[type[BaseException], ...] = (),
    permanent: tuple[type[BaseException], ...] = (),
) -> CommitOutcome:
    """The outcome of a file table's commit that raised ``exc``.

    * ``permanent`` (the format's: a missing table, a schema conflict), a pending epoch whose
      files are lost (:class:`~barrierflow.errors.SinkRecoveryError`), an epoch partly held
      already (:class:`~barrierflow.errors.PositionOverlapError`), a :class:`PermissionError`,
      or a :class:`FileNotFoundError` once the table's ``root`` itself is gone:
      :class:`Failed` — retrying cannot help.
    * ``retryable`` (the format's: a concurrent writer won the race), or any other
      :class:`OSError` (a full disk, an NFS hiccup): :class:`RetryLater`.

    Raises:
        Exception: ``exc`` itself, when it is none of these (the coordinator retries it as
            unclassified, and logs it so).
    """
    if isinstance(exc, (*permanent, SinkRecoveryError, PositionOverlapError, PermissionError)):
        return Failed(exc)
    if isinstance(exc, FileNotFoundError) and not root.exists():
        return Failed(exc)
    if isinstance(exc, (*retryable, OSError)):
        return RetryLater(exc)
    raise exc
