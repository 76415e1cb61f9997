"""One writer group per sink directory: an OS lock across processes.

Two pipelines writing one Parquet table directory (or one Iceberg table's staging area) stage
and rename each other's epochs: rows vanish without an error. So a sink's writers hold an
exclusive ``flock`` on ``<dir>/.barrierflow.lock`` (a dot name: readers of the table skip it)
while they are open, and a writer of another process is refused with
:class:`~barrierflow.errors.SinkLockedError`. The kernel drops the lock when the process dies,
so a crashed pipeline never leaves the directory locked.

Within one process the writers of a directory share the lock (one ``flock``, counted leases):
the parallel writers of a coordinated sink all write there, and a graph rebuilt by recovery
opens its writers again while the old incarnation's may still be closing. What would go wrong
within one process is caught elsewhere: two runtimes cannot share a state store (its own
lock), and two parallel writers with one writer id are
:class:`~barrierflow.errors.DuplicateWriterError` at start and at registration.

The lock is keyed by the directory's real path, so a symlink or a ``..`` spelling is the same
directory.
"""

from __future__ import annotations

import fcntl
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import final

from barrierflow.connectors.errors import SinkLockedError

__all__ = ["DirectoryLease", "lock_directory"]

LOCK_FILE = ".barrierflow.lock"


@dataclass
class _Held:
    fd: int
    leases: int


_registry: dict[str, _Held] = {}
_registry_lock = threading.Lock()


@final
class DirectoryLease:
    """A writer's hold on a sink directory; :meth:`release` once (idempotent)."""

    def __init__(self, key: str) -> None:
        self._key = key
        self._released = False

    def release(self) -> None:
        """Give the hold back; the last lease of the process releases the OS lock."""
        with _registry_lock:
            if self._released:
                return
            self._released = True
            held = _registry[self._key]
            held.leases -= 1
            if not held.leases:
                del _registry[self._key]
                os.close(held.fd)  # closing the descriptor drops the flock


def lock_directory(directory: Path, *, sink: str) -> DirectoryLease:
    """Hold ``directory`` (which must exist) for one writer of a sink (blocking).

    Raises:
        SinkLockedError: another process holds the directory.
    """
    key = os.path.realpath(directory)
    with _registry_lock:
        held = _registry.get(key)
        if held is None:
            fd = os.open(os.path.join(key, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise SinkLockedError(sink, "another process") from None
            except BaseException:
                os.close(fd)
                raise
            held = _registry[key] = _Held(fd, 0)
        held.leases += 1
        return DirectoryLease(key)
