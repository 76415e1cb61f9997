"""Ctrl-C without the noise, for the command line (:mod:`barrierflow.app.cli`)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from types import FrameType, TracebackType

__all__ = ["QuietInterrupt"]

#: How long Ctrl-C waits for Spark to turn its logging off (a live JVM takes milliseconds).
_QUIETING_SECONDS = 5.0


class QuietInterrupt:
    """Ctrl-C without the noise: on the first SIGINT, silence this process's stderr and the
    loggers of Spark and Py4J, then raise ``KeyboardInterrupt`` as usual.

    Stopping a driver mid-query makes Py4J, Spark and the event loop's shutdown print hundreds
    of lines of tracebacks that say nothing the user needs; what the user needs is one line
    (:meth:`say`, written to the real stderr). The state left behind is what a crash leaves,
    which ``--resume`` continues from.
    """

    def __init__(self) -> None:
        self._previous: object = None
        self._stderr: int | None = None

    def __enter__(self) -> QuietInterrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)  # type: ignore[arg-type]

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        self.quiet()
        raise KeyboardInterrupt

    def quiet(self) -> None:
        """Send fd 2 to /dev/null (keeping the real stderr for :meth:`say`) and turn Spark's
        and Py4J's logging off."""
        if self._stderr is not None:
            return
        sys.stderr.flush()
        self._stderr = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
        for name in ("py4j", "pyspark"):
            logging.getLogger(name).disabled = True
        if "pyspark" in sys.modules:
            # On its own thread (with its own Py4J connection): the main thread may be inside
            # a Py4J call right now. Waited for, briefly, because the JVM logs the callback's
            # failure as soon as the runtime is torn down, and its stderr is not ours to mute.
            quieting = threading.Thread(target=_spark_logs_off, name="quiet-spark", daemon=True)
            quieting.start()
            quieting.join(_QUIETING_SECONDS)

    def say(self, line: str) -> None:
        """Write ``line`` to the real stderr, even once it is silenced."""
        sys.stdout.flush()
        os.write(2 if self._stderr is None else self._stderr, f"{line}\n".encode())


def _spark_logs_off() -> None:
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is not None:
        # The JVM may be going away already: then there is nothing left to silence.
        with contextlib.suppress(Exception):
            context.setLogLevel("OFF")
