"""Durable file helpers shared by the store, the sinks and the demo (blocking; run them on a
worker thread from async code).

A rename is atomic but not durable until the directory holding it is fsynced, and a file's
bytes are not durable until the file is: these helpers do both, so that after a power loss a
file written with :func:`write_atomically` is either the old one or the whole new one.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_path", "write_atomically"]


def fsync_path(path: str | os.PathLike[str]) -> None:
    """Flush ``path`` (a file or a directory) to stable storage."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary name beside ``path``, fsync it, rename it over ``path``
    and fsync the directory: all of it or none survives a crash."""
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    fsync_path(path.parent)
