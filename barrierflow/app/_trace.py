"""Where a running demo is, for the crash harness: one line per event in a trace file.

``barrierflow chaos`` starts each demo run with ``BARRIERFLOW_CHAOS_TRACE=<file>``; the demos
then append a line per event they pass (``start``, ``batch-begin 3``, ``pre-commit <epoch>``,
``backfill-phase catching_up``, ``verify`` ...). The harness tails the file to kill the run at
a chosen event (plus a seeded delay) and, after the kill, reads the last line to say where in
the pipeline the kill landed.

Each line is one ``write`` to a file opened with ``O_APPEND``: whole lines, in order, and
already in the page cache when the process is SIGKILLed (no flush is lost with it). With the
variable unset, :func:`trace` is a no-op that costs one global lookup.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import anyio

__all__ = ["ENV", "TracedConnector", "follow_job", "trace", "tracing"]

#: The environment variable that names the trace file.
ENV = "BARRIERFLOW_CHAOS_TRACE"

_path = os.environ.get(ENV) or None
_fd: int | None = None
_lock = threading.Lock()


def trace(event: str, detail: object = "") -> None:
    """Append ``<monotonic seconds> <event> <detail>`` to the trace file, if one is set."""
    global _fd
    if _path is None:
        return
    line = f"{time.monotonic():.6f} {event} {detail}".rstrip() + "\n"
    with _lock:
        if _fd is None:
            _fd = os.open(_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(_fd, line.encode())


def tracing() -> bool:
    """Whether a trace file is set (the harness is watching)."""
    return _path is not None


async def follow_job(handle: Any, every: float = 0.01) -> None:
    """Trace a job's backfill phases as they change (``backfill-phase <phases>``: every
    backfilling actor's phase strings, e.g. per split), then ``job-ready``; returns then."""
    last: tuple[str, ...] = ()
    while True:
        progress = handle.progress()
        phases = tuple(
            sorted(
                {
                    v
                    for p in progress.actors.values()
                    for v in p.detail.values()
                    if isinstance(v, str)
                }
            )
        )
        if phases != last:
            trace("backfill-phase", "+".join(phases))
            last = phases
        if progress.ready:
            trace("job-ready")
            return
        await anyio.sleep(every)


class TracedConnector:
    """A sink connector that traces its two-phase steps (``pre-commit <epoch>``,
    ``commit-begin <epoch>``, ``commit-done <epoch>``) and otherwise is ``inner``."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def pre_commit(self, epoch: int) -> Any:
        trace("pre-commit", epoch)
        return await self._inner.pre_commit(epoch)

    async def commit_epoch(self, epoch: int) -> None:
        trace("commit-begin", epoch)
        await self._inner.commit_epoch(epoch)
        trace("commit-done", epoch)
