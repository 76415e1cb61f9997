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
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import anyio.lowlevel
import pyarrow as pa

from barrierflow.actors.sinks.positions import table_commits
from barrierflow.actors.sinks.table import (
    CommitMetadata,
    CommitOutcome,
    Committer,
    Manifest,
    SinkCommits,
    StagingWriter,
    Table,
)
from barrierflow.connectors.state_commit import commits_state

__all__ = ["ENV", "TracedCommitter", "TracedTable", "follow_job", "trace", "tracing"]

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


class TracedCommitter:
    """A table's committer that traces its steps (``pre-commit <epoch>`` when an epoch is
    prepared, ``commit-begin <epoch>`` and ``commit-done <epoch>`` around its commit) and
    otherwise is ``inner``."""

    def __init__(self, inner: Committer) -> None:
        self.inner = inner

    @property
    def commits_state(self) -> bool:
        """Whether the committer it wraps commits keyed state (see ``state_commit``)."""
        return commits_state(self.inner)

    async def recover(self, pending: Mapping[int, CommitMetadata]) -> None:
        await self.inner.recover(pending)

    async def prepare(self, epoch: int, manifests: Sequence[Manifest]) -> CommitMetadata | None:
        trace("pre-commit", epoch)
        return await self.inner.prepare(epoch, manifests)

    async def commit(self, epoch: int, metadata: CommitMetadata) -> CommitOutcome:
        trace("commit-begin", epoch)
        outcome = await self.inner.commit(epoch, metadata)
        trace("commit-done", epoch)
        return outcome

    async def abort(self, epoch: int, metadata: CommitMetadata | None) -> None:
        await self.inner.abort(epoch, metadata)

    async def sink_commits(self) -> SinkCommits | None:
        """What the table holds, if its committer can tell (the runtime asks on an empty
        state store)."""
        return await table_commits(self.inner)


class TracedTable:
    """A table whose committer traces its steps (:class:`TracedCommitter`); its writers are
    ``inner``'s."""

    def __init__(self, inner: Table) -> None:
        self.inner = inner

    @property
    def schema(self) -> pa.Schema:
        """The table's schema."""
        return self.inner.schema

    def writer(self, writer_id: str) -> StagingWriter:
        """Writer ``writer_id`` of ``inner``."""
        return self.inner.writer(writer_id)

    def committer(self) -> TracedCommitter:
        """``inner``'s committer, traced."""
        return TracedCommitter(self.inner.committer())
