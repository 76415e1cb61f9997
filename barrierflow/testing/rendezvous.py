"""A rendezvous between a test and Spark tasks running on other processes (executors): a task
says it has reached a point and waits for the test's cue; the test waits for the tasks it
expects, acts (kills an executor, say), then lets them go — all on sockets, so that neither
side polls a file on the wall clock.

The test holds a :class:`Rendezvous` (a listening socket on loopback and a thread that
accepts); a task calls :func:`arrive` with its port (the task imports this module on the
executor, so it must be importable there, like barrierflow itself). Both waits are bounded:
a test names what never came, a task stops waiting when the test closes the rendezvous (or
after its hang guard).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType
from typing import Self, final

__all__ = ["Rendezvous", "arrive"]


def arrive(port: int, tag: str, timeout: float) -> bool:
    """Tell the rendezvous on ``port`` that ``tag`` arrived, then wait for its cue; returns
    whether the cue came (``False``: the rendezvous closed, or ``timeout`` seconds passed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as connection:
        connection.sendall(tag.encode() + b"\n")
        try:
            return connection.recv(1) == b"g"
        except TimeoutError:
            return False


@final
class Rendezvous:
    """The test's side (see the module docstring); a context manager that releases and closes
    everything on exit."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._arrived: list[str] = []
        self._waiting: list[socket.socket] = []
        self._changed = threading.Condition()
        self._closed = False
        self._released = False
        self._thread = threading.Thread(target=self._accept, name="rendezvous", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        """The port tasks connect to."""
        port: int = self._listener.getsockname()[1]
        return port

    @property
    def arrived(self) -> list[str]:
        """The tags that arrived so far, in order."""
        with self._changed:
            return list(self._arrived)

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return  # closed
            with connection.makefile("rb") as lines:
                tag = lines.readline().decode().strip()
            with self._changed:
                if self._closed:
                    connection.close()
                    return
                self._arrived.append(tag)
                self._changed.notify_all()
                if not self._released:
                    self._waiting.append(connection)
                    continue
            _cue(connection)  # released already: a late arrival (a retried task) goes on

    def wait_for(self, count: int, timeout: float) -> bool:
        """Wait until ``count`` tags have arrived; ``False`` if ``timeout`` passed first."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self._arrived) >= count, timeout)

    def release(self) -> None:
        """Give every waiting task its cue, and every later one at once (a task whose
        executor died is skipped)."""
        with self._changed:
            waiting, self._waiting = self._waiting, []
            self._released = True
        for connection in waiting:
            _cue(connection)

    def close(self) -> None:
        """Release the waiting tasks and stop accepting (idempotent)."""
        with self._changed:
            self._closed = True
        self.release()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread (Linux)
        self._listener.close()
        self._thread.join()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _cue(connection: socket.socket) -> None:
    with contextlib.suppress(OSError):
        connection.sendall(b"g")
    connection.close()
