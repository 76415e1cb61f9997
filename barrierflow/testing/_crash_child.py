"""The child processes of the crash conformance suite (:mod:`.crash_conformance`): the fork
server that starts them (:func:`serve`), its client (:class:`ForkServer`), and their script.

``python -m barrierflow.testing._crash_child`` is a small fork server: it imports barrierflow
once (about a second — a fresh interpreter per scenario would make the suite a dozen seconds
slower), then reads one JSON spec a line from stdin, forks a child for it, waits for the
child and answers its exit code (``-9``: killed by SIGKILL) on a line of stdout. Like
multiprocessing's forkserver it imports the table factory's module before forking (and the
event loop's library); it runs no event loop and no table code, so nothing is in flight when
it forks. (A module that starts threads at import would lose them in the children.)

Each child imports the user's table factory (``make``) by name, builds a table, takes its
staging writer ``"0"`` and its committer, drives them through one scripted epoch sequence over
the table's storage — what one writer and its coordinator do — and SIGKILLs itself at the kill
point the spec names: after the call of that name returned, before anything else happens. No
cleanup runs: that is the point. Its stdout and stderr go to ``<report>.out``.

What the coordinator would have made durable is appended to the report file, one JSON object a
line, written and fsynced *before* the child goes on — the parent reads it after the child
died, so "durable" means exactly "the parent received it":

* ``{"pending": epoch, "metadata": {...}}`` — the coordinator persisted the epoch's commit
  metadata as *pending* in its meta store (the epoch is durable): a restarted coordinator
  passes it to ``recover`` and commits it;
* ``{"committed": epoch}`` — the coordinator marked the epoch committed: it is not pending
  any more;
* ``{"killing": point}`` — the last line before the SIGKILL, so the parent knows the child
  died where it was meant to and not of something else.

The script, with its kill points in order (``e1``, ``e2``, ``e3`` and their ids come from the
spec, ``pending`` too: the epochs earlier children of the scenario left pending)::

    w = table.writer("0"); c = table.committer()
    w.open()                                        -> "open"
    c.recover(pending); c.commit(e, metadata) for each pending epoch, oldest first
                                                    -> "recover"
    w.begin(e1)                                     -> "begin"
    w.write(ids1)                                   -> "write"
    w.flush()                                       -> "flush"
    meta1 = c.prepare(e1, [w.stage(e1)])            -> "prepare_unrecorded"  (not durable)
    report {"pending": e1, "metadata": meta1}       -> "prepare"  (persisted: durable)
    w.begin(e2); w.write(ids2)                         (the next epoch begins before e1 commits)
    c.commit(e1, meta1)                             -> "commit"   (returned, its mark not recorded)
    report {"committed": e1}
    w.discard(e2)                                   -> "discard"
    w.begin(e3); w.write(ids3); c.prepare(e3, [w.stage(e3)])   (never reported)
    w.close()                                       -> "close"

``prepare`` returning ``None`` for an epoch with rows, or metadata that is not JSON (the meta
store could not persist it), ends the child with an error instead of the SIGKILL: the
scenario's rule fails with the child's output.
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

__all__ = ["KILL_POINTS", "ForkServer", "ReportFile", "child_env", "resolve_name", "serve"]

#: Every kill point of the script, in the order the script passes them.
KILL_POINTS = (
    "open",
    "recover",
    "begin",
    "write",
    "flush",
    "prepare_unrecorded",
    "prepare",
    "commit",
    "discard",
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


class ReportFile:
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
    make: Callable[[], Any] = resolve_name(spec["make"])
    report = ReportFile(spec["report"])
    kill = spec["kill"]
    e1, e2, e3 = spec["epochs"]
    ids1, ids2, ids3 = spec["ids"]
    pending = {int(epoch): metadata for epoch, metadata in spec["pending"]}

    def reached(point: str) -> None:
        if point == kill:
            report.write({"killing": point})
            os.kill(os.getpid(), signal.SIGKILL)

    table = make()
    if spec["rows"] is not None:
        rows: Callable[[list[int]], pa.RecordBatch] = resolve_name(spec["rows"])
    else:
        schema = table.schema  # a single integer column ``id``: the parent checked it

        def rows(ids: list[int]) -> pa.RecordBatch:
            return pa.record_batch([pa.array(ids, schema.field(0).type)], schema=schema)

    async def prepare(epoch: int) -> Any:
        metadata = await committer.prepare(epoch, [await writer.stage(epoch)])
        if metadata is None:
            raise RuntimeError(f"prepare({epoch}) returned None for an epoch with rows")
        return metadata

    writer = table.writer("0")
    committer = table.committer()
    # File I/O here is a few small appends on the way to a SIGKILL: done inline on purpose,
    # so nothing is in flight on another thread when the process dies.
    await writer.open()
    reached("open")
    await committer.recover(pending)
    for epoch in sorted(pending):
        await committer.commit(epoch, pending[epoch])
    reached("recover")
    await writer.begin(e1)
    reached("begin")
    await writer.write(rows(ids1))
    reached("write")
    await writer.flush()
    reached("flush")
    metadata = await prepare(e1)
    reached("prepare_unrecorded")
    report.write({"pending": e1, "metadata": dict(metadata)})  # TypeError: not JSON
    reached("prepare")
    await writer.begin(e2)
    await writer.write(rows(ids2))
    await committer.commit(e1, metadata)
    reached("commit")
    report.write({"committed": e1})
    await writer.discard(e2)
    reached("discard")
    await writer.begin(e3)
    await writer.write(rows(ids3))
    await prepare(e3)
    await writer.close()
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
            for name in (spec["make"], spec["rows"]):
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
                            env=child_env(),
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


def child_env() -> dict[str, str]:
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
