"""File helpers shared by the store, the sinks and the demo (blocking; run them on a
worker thread from async code).

A rename is atomic but not durable until the directory holding it is fsynced, and a file's
bytes are not durable until the file is: these helpers do both, so that after a power loss a
file written with :func:`write_atomically` is either the old one or the whole new one.

Where a path given by the user cannot be used — a directory under a regular file, in
``/proc``, not writable — the state store (``state_path``) and the file sinks (a table
directory) say so in the same words: :func:`directory_problem` (stat only, certain, cheap
enough for a constructor) and :func:`make_directory` (creates it, the only certain test of
``/proc``-like places and of root's permissions) describe what was found, and each caller
raises its own typed error with it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from barrierflow.channels.errors import InvalidArgumentError

__all__ = [
    "check_path_argument",
    "describe_os_error",
    "directory_problem",
    "file_kind",
    "fsync_path",
    "make_directory",
    "not_a_directory",
    "write_atomically",
]

_WRITE = os.W_OK | os.X_OK


def check_path_argument(path: object) -> str:
    """``path`` as a str, if it is a usable file path argument (the state store's
    ``state_path``, wherever it is given: the store, the job catalog).

    Bytes paths are refused: a store's path is text (it is logged and named in errors), and
    ``str`` or :class:`os.PathLike` [``str``] (such as :class:`pathlib.Path`) cover every file.

    Raises:
        InvalidArgumentError: ``path`` is not a non-empty ``str`` or ``os.PathLike[str]``
            without NUL characters (``argument="path"``).
    """
    value: object = path
    if isinstance(path, os.PathLike):
        with contextlib.suppress(TypeError):
            value = os.fspath(path)
    if not isinstance(value, str) or not value or "\x00" in value:
        raise InvalidArgumentError(
            "path", "a non-empty str or os.PathLike[str] naming the store file", path
        )
    return value


def file_kind(mode: int) -> str:
    """What a ``st_mode`` is, in words (``"a directory"``, ``"a FIFO"``, ...)."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISREG, "a regular file"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def describe_os_error(exc: OSError) -> str:
    """An OS error in words, with its errno name (``No such file or directory [ENOENT]``)."""
    code = errno.errorcode.get(exc.errno or 0, "?")
    return f"{exc.strerror or exc} [{code}]"


def not_a_directory(real: str) -> str:
    """Name the nearest ancestor of ``real`` that exists and is not a directory."""
    ancestor = os.path.dirname(real)
    while ancestor != os.path.dirname(ancestor):
        if os.path.lexists(ancestor) and not os.path.isdir(ancestor):
            return f"a parent {ancestor!r} that is a file, not a directory"
        ancestor = os.path.dirname(ancestor)
    return "a parent that is not a directory"


def directory_problem(real: str) -> str | None:
    """Why the directory ``real`` (absolute) cannot be used, found without changing anything:
    it is not a directory, lies under a file, or it (or, if missing, its nearest existing
    ancestor) is not writable. ``None``: it may be usable (only creating it is certain)."""
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        ancestor = os.path.dirname(real)
        while not os.path.lexists(ancestor) and ancestor != os.path.dirname(ancestor):
            ancestor = os.path.dirname(ancestor)
        if not os.path.isdir(ancestor):
            return not_a_directory(real)
        if not os.access(ancestor, _WRITE):
            return f"a parent {ancestor!r} that is not writable"
        return None
    except NotADirectoryError:
        return not_a_directory(real)
    except OSError as exc:
        return describe_os_error(exc)
    if not stat.S_ISDIR(mode):
        return file_kind(mode)
    if not os.access(real, _WRITE):
        return "a directory that is not writable"
    return None


def make_directory(real: str, *, what: str = "a directory") -> str | None:
    """Create the directory ``real`` and its parents if missing (``mkdir -p``); ``None`` if it
    now exists and is writable, else what was found, in words (``what`` names it)."""
    try:
        os.makedirs(real, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        if os.path.lexists(real) and not os.path.isdir(real):
            return f"{what} {real!r} that is a file, not a directory"
        return not_a_directory(real)
    except OSError as exc:
        return f"{what} that cannot be created ({describe_os_error(exc)})"
    if not os.access(real, _WRITE):
        return f"{what} {real!r} that is not writable"
    return None


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
