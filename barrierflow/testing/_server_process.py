"""What the test servers (:mod:`.postgres_server`, :mod:`.redis_server`, :mod:`.spark_cluster`)
share: the checks of their constructors' arguments, a free loopback port, the end of a log
for an error message, reading a process's state from ``/proc``, and waiting for killed
processes to exit.

Private: each server module keeps its own public surface; this is one copy of the mechanics
they would otherwise repeat.
"""

from __future__ import annotations

import os
import select
import socket
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from barrierflow.channels.errors import InvalidArgumentError


def check_directory(argument: str, value: object) -> None:
    """Refuse ``value`` unless it is a non-empty path (a ``str`` or ``os.PathLike``).

    Raises:
        InvalidArgumentError: it is not, naming ``argument``.
    """
    if not isinstance(value, str | os.PathLike) or not os.fspath(value):
        raise InvalidArgumentError(argument, "a directory path", value)


def check_seconds(argument: str, value: object) -> None:
    """Refuse ``value`` unless it is a positive finite number of seconds (a bool is not one).

    Raises:
        InvalidArgumentError: it is not, naming ``argument``.
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 < value <= sys.float_info.max
    ):
        raise InvalidArgumentError(argument, "a positive finite number of seconds", value)


def check_bool(argument: str, value: object) -> None:
    """Refuse ``value`` unless it is exactly a ``bool`` (not ``0``/``1``).

    Raises:
        InvalidArgumentError: it is not, naming ``argument``.
    """
    if type(value) is not bool:
        raise InvalidArgumentError(argument, "a bool", value)


def free_port(host: str) -> int:
    """A TCP port on ``host`` that nothing listens on now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def log_tail(path: Path, lines: int) -> list[str]:
    """The last ``lines`` non-empty lines of ``path``, stripped (none if it is unreadable).

    Reads only the file's last 8 KiB: a server's log can be long, an error message wants its
    end.
    """
    try:
        with path.open("rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - 8192))
            text = log.read().decode(errors="replace")
    except OSError:
        return []
    found = [line.strip() for line in text.splitlines() if line.strip()]
    return found[-lines:]


def proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command (state first, then the parent's
    pid, then the process group), or ``None`` if the process is gone (or no ``/proc``).

    The command may hold spaces and parentheses, so the fields start after its last ``)``.
    """
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def lives(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has: it holds nothing)."""
    fields = proc_stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def wait_exited(pids: Iterable[int], timeout: float) -> list[int]:
    """Wait until every process of ``pids`` has exited (a zombie counts: it holds nothing),
    for at most ``timeout`` seconds in all; returns those still running.

    They need not be this process's children (a killed server's backends): each is watched
    through a pidfd, which becomes readable when it exits — no polling. Where pidfds are
    missing, ``/proc`` is read every 20 ms instead.
    """
    deadline = time.monotonic() + timeout
    running: list[int] = []
    for pid in pids:
        if not _wait_one(pid, deadline):
            running.append(pid)
    return running


def _wait_one(pid: int, deadline: float) -> bool:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    except (AttributeError, OSError):  # no pidfds (not Linux, or a kernel before 5.3)
        while lives(pid):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True
    try:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        return bool(ready) or not lives(pid)
    finally:
        os.close(fd)
