"""The child processes of the crash conformance suite (:mod:`.crash_conformance`): the fork
server that starts them (:func:`serve`), its client (:class:`ForkServer`), and their script.

``python -m barrierflow.testing._crash_child`` is a small fork server: it imports barrierflow
once (about a second — a fresh interpreter per scenario would make the suite a dozen seconds
slower), then reads one JSON spec a line from stdin, forks a child for it, waits for the
child and answers its exit code (``-9``: killed by SIGKILL) on a line of stdout. Like
multiprocessing's forkserver it imports the factory's module before forking (and the event
loop's library); it runs no event loop and no connector code, so nothing is in flight when
it forks. (A module that starts threads at import would lose them in the children.)

Each child imports the user's factory by name, builds a connector, drives it through one
scripted lifecycle over the factory's storage and SIGKILLs itself at the kill point the spec
names — after the call of that name returned, before anything else happens. No cleanup runs:
that is the point. Its stdout and stderr go to ``<report>.out``.

What a runtime would have made durable is appended to the report file, one JSON object a line,
written and fsynced *before* the child goes on — the parent reads it after the child died, so
"durable" means exactly "the parent received it":

* ``{"pre_committed": epoch, "metadata": {...}}`` — the epoch's checkpoint is durable: a
  recovering runtime passes it to ``recover``;
* ``{"committed": epoch}`` — the runtime recorded the commit: it is not passed any more;
* ``{"killing": point}`` — the last line before the SIGKILL, so the parent knows the child
  died where it was meant to and not of something else.

The script, with its kill points in order (``e1``, ``e2``, ``e3`` and their ids come from the
spec)::

    open                                   -> "open"
    recover(pending from the spec)         -> "recover"
    begin_epoch(e1)                        -> "begin_epoch"
    write_batch(ids1)                      -> "write_batch"
    flush()                                -> "flush"
    pre_commit(e1)                         -> "pre_commit_unrecorded"  (checkpoint not durable)
    report pre_committed e1                -> "pre_commit"
    begin_epoch(e2); write_batch(ids2)        (the next epoch begins before e1 commits)
    commit_epoch(e1)                       -> "commit_epoch"  (returned, not yet recorded)
    report committed e1
    rollback_epoch(e2)                     -> "rollback_epoch"
    begin_epoch(e3); write_batch(ids3); pre_commit(e3)   (never reported)
    close()                                -> "close"
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, final

import anyio
import pyarrow as pa
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from barrierflow.actors.sinks.protocol import PendingCommit

__all__ = ["KILL_POINTS", "ForkServer", "resolve_name", "serve"]

#: Every kill point of the script, in the order the script passes them.
KILL_POINTS = (
    "open",
    "recover",
    "begin_epoch",
    "write_batch",
    "flush",
    "pre_commit_unrecorded",
    "pre_commit",
    "commit_epoch",
    "rollback_epoch",
    "close",
)


def resolve_name(name: str) -> Any:
    """The object ``"package.module:Qual.name"`` names (imported if need be).

    Raises:
        ImportError: the module cannot be imported.
        AttributeError: the module has no such attribute.
    """
    module_name, _, qualname = name.partition(":")
    found: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


class _Report:
    """The append-only report file; each line is on disk before the script goes on."""

    def __init__(self, path: str) -> None:
        self._path = path

    def write(self, fact: dict[str, Any]) -> None:
        fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(fact) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)


async def _drive(spec: dict[str, Any]) -> None:
    factory: Callable[[], Any] = resolve_name(spec["factory"])
    report = _Report(spec["report"])
    kill = spec["kill"]
    e1, e2, e3 = spec["epochs"]
    ids1, ids2, ids3 = spec["ids"]

    def reached(point: str) -> None:
        if point == kill:
            report.write({"killing": point})
            os.kill(os.getpid(), signal.SIGKILL)

    sink = factory()
    if spec["rows"] is not None:
        make: Callable[[list[int]], pa.RecordBatch] = resolve_name(spec["rows"])
    else:
        schema = sink.schema  # a single integer column ``id``: the parent checked it

        def make(ids: list[int]) -> pa.RecordBatch:
            return pa.record_batch([pa.array(ids, schema.field(0).type)], schema=schema)

    # File I/O here is a few small appends on the way to a SIGKILL: done inline on purpose,
    # so nothing is in flight on another thread when the process dies.
    await sink.open()
    reached("open")
    await sink.recover([PendingCommit(epoch, metadata) for epoch, metadata in spec["pending"]])
    reached("recover")
    await sink.begin_epoch(e1)
    reached("begin_epoch")
    await sink.write_batch(make(ids1))
    reached("write_batch")
    await sink.flush()
    reached("flush")
    metadata = await sink.pre_commit(e1)
    reached("pre_commit_unrecorded")
    report.write({"pre_committed": e1, "metadata": dict(metadata)})
    reached("pre_commit")
    await sink.begin_epoch(e2)
    await sink.write_batch(make(ids2))
    await sink.commit_epoch(e1)
    reached("commit_epoch")
    report.write({"committed": e1})
    await sink.rollback_epoch(e2)
    reached("rollback_epoch")
    await sink.begin_epoch(e3)
    await sink.write_batch(make(ids3))
    await sink.pre_commit(e3)
    await sink.close()
    reached("close")


def _child(spec: dict[str, Any]) -> None:
    """The forked child: run the script, never return to the server's loop."""
    code = 1
    try:
        out = os.open(spec["report"] + ".out", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(out, 1)  # the server's stdout is its answer channel: keep it clean
        os.dup2(out, 2)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        anyio.run(_drive, spec, backend=spec["backend"])
        code = 0
    except BaseException:  # reported through the exit code and <report>.out
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve() -> None:
    """Fork one child per spec line of stdin; answer each child's exit code; end at EOF."""
    for line in sys.stdin:
        spec = json.loads(line)
        # Imported once here, not again in every child: each import costs about as much as
        # the child's whole run. A failure shows in the child, which imports them again.
        with contextlib.suppress(Exception):
            importlib.import_module(spec["backend"])
            for name in (spec["factory"], spec["rows"]):
                if name is not None:
                    resolve_name(name)
        pid = os.fork()
        if pid == 0:
            _child(spec)
        _, status = os.waitpid(pid, 0)
        sys.stdout.write(f"{os.waitstatus_to_exitcode(status)}\n")
        sys.stdout.flush()


@final
class ForkServer:
    """The parent's end of the fork server (:func:`serve`): started on first use, and again
    after a child overran its deadline (then the server and the child were killed).

    Args:
        log: where the server's own stderr goes (its children write to ``<report>.out``).
        deadline: seconds a child may take, from the spec sent to its exit code.
    """

    def __init__(self, log: Path, deadline: float) -> None:
        self._log = log
        self._deadline = deadline
        self._process: Process | None = None
        self._answers: BufferedByteReceiveStream | None = None
        self._busy = False  # a child is running: closing must kill, not wait

    async def run(self, spec: dict[str, Any]) -> int | str:
        """Fork a child for ``spec``: its exit code, or why there is none."""
        try:
            with anyio.fail_after(self._deadline):
                if self._process is None:
                    with self._log.open("ab") as log:  # the server's own errors, if any
                        self._process = await anyio.open_process(
                            [sys.executable, "-m", "barrierflow.testing._crash_child"],
                            stderr=log,
                            env=_server_env(),
                            start_new_session=True,  # a group: one kill ends a hung child too
                        )
                    assert self._process.stdout is not None
                    self._answers = BufferedByteReceiveStream(self._process.stdout)
                assert self._process.stdin is not None
                assert self._answers is not None
                self._busy = True
                await self._process.stdin.send(json.dumps(spec).encode() + b"\n")
                answer = int(await self._answers.receive_until(b"\n", 64))
                self._busy = False
                return answer
        except TimeoutError:
            await self.aclose(kill=True)
            return f"no exit within {self._deadline:g}s"
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError):
            await self.aclose(kill=True)
            said = self._log.read_text(errors="replace").strip()[-1500:]
            return f"the server forking the children died: {said or '(no output)'}"

    async def aclose(self, *, kill: bool = False) -> None:
        """End the server: by closing its stdin, else (``kill``, a child running, no exit
        in time) by killing its process group, which holds its children too."""
        process, self._process = self._process, None
        if process is None:
            return
        deadline = min(5.0, self._deadline)
        with anyio.move_on_after(deadline, shield=True):
            if not kill and not self._busy and process.stdin is not None:
                await process.stdin.aclose()  # EOF: the server ends its loop
                with anyio.move_on_after(deadline / 2):
                    await process.wait()
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
            await process.aclose()
        self._busy = False


def _server_env() -> dict[str, str]:
    """This process's environment, with its ``sys.path`` (minus what the child's interpreter
    adds itself) as ``PYTHONPATH``, so the child imports the same factory."""
    own = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}

    def inherited(entry: str) -> bool:
        real = os.path.realpath(entry or os.curdir)
        return not any(real == p or real.startswith(p + os.sep) for p in own)

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p or os.curdir for p in sys.path if inherited(p))
    return env


if __name__ == "__main__":
    serve()
