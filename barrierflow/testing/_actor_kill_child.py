"""One incarnation of the killed run of :func:`~barrierflow.testing.actor_conformance.
check_stream_actor_kills`: a child process that runs ``push source → actor → ParquetTable``
over the input file, resumes where the last durable checkpoint left it, and SIGKILLs its own
process group at the kill point its spec names.

``python -m barrierflow.testing._actor_kill_child <spec.json>`` reads the spec the parent
wrote (:func:`write_spec`): the actor factory's importable name, the input file
(:func:`write_chunks`: every chunk, in order), the output schema, the chunk indices followed by
a checkpoint, the state store, the table directory, the push journal, the facts file, the
backend and the kill point (``None`` for the last incarnation, which runs to the end).

Where to resume: a push source keeps no position, so the child records each push in the
*journal* (``{"chunk": i, "epoch": e}``, ``e`` the runtime's current epoch once the push
returned — never older than the epoch the chunk belongs to, as
:func:`~barrierflow.testing.scripted.play` estimates it), appended and fsynced before it goes
on. The next incarnation opens the same state store, reads its committed epoch ``C`` and
resumes at the first chunk not journalled or journalled with an epoch above ``C`` — what a
real upstream replays, from what was acknowledged. It rewrites the journal up to there (a
rename) before it pushes anything, so that epochs of the dead incarnation, which a new one
may number again, never count as durable.

Kill points (:class:`KillPoint`): right after chunk ``i`` was pushed and journalled (its
epoch open, the actor perhaps mid-chunk); while the checkpoint after chunk ``i`` is in flight
(after a seeded number of scheduler turns; the fact says if it had completed by then); right
after that checkpoint returned (durable; the sink's commit may still be running). The child
appends ``{"killing": where}`` to its facts file, then kills its whole process group with
SIGKILL: no cleanup, no ``finally``, no graceful stop of the runtime. The parent waits for
it and checks the exit status and that last fact.

Exit codes besides the kill: 0 (the last incarnation ran to its end and stopped gracefully),
:data:`MISSED` (the kill point never came), 1 (anything raised; the traceback is in the
child's output file).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, final

import anyio
import anyio.lowlevel
import pyarrow as pa
import sniffio

from barrierflow.actors.sinks.add_sink import add_sink
from barrierflow.channels.chunk import Chunk
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.connectors.parquet_table import ParquetTable
from barrierflow.runtime.actor import StreamActor
from barrierflow.runtime.config import RuntimeConfig
from barrierflow.runtime.runtime import Runtime
from barrierflow.testing._crash_child import ReportFile, resolve_name

__all__ = [
    "MISSED",
    "KillPoint",
    "check_input_schema",
    "read_chunks",
    "write_chunks",
    "write_spec",
]

#: The exit code of an incarnation that ran to the end without meeting its kill point.
MISSED = 3

#: The moments around chunk ``i`` a kill may land at, in the order the script passes them.
Moment = Literal["pushed", "checkpointing", "checkpointed"]
MOMENTS: tuple[Moment, ...] = ("pushed", "checkpointing", "checkpointed")

# The columns that carry a chunk's ops and visibility next to its own in the input file.
_OPS = "__barrierflow_kill_ops"
_VISIBILITY = "__barrierflow_kill_visibility"


@final
@dataclass(frozen=True, slots=True, order=True)
class KillPoint:
    """Where an incarnation kills itself: at ``moment`` of chunk ``chunk`` (ordered as the
    script passes them)."""

    #: The index of the chunk in the input.
    chunk: int
    #: The position of the moment in :data:`MOMENTS` (so that points sort in script order).
    moment_index: int
    #: Scheduler turns between starting the checkpoint and the kill (``checkpointing`` only).
    turns: int = 0

    @property
    def moment(self) -> Moment:
        return MOMENTS[self.moment_index]

    def describe(self) -> str:
        """Where it lands, for a report: ``"after chunk 7, epoch open"``."""
        if self.moment == "pushed":
            return f"after chunk {self.chunk}, epoch open"
        if self.moment == "checkpointing":
            return f"during the checkpoint after chunk {self.chunk} ({self.turns} turns in)"
        return f"right after the checkpoint after chunk {self.chunk}"


def check_input_schema(schema: pa.Schema) -> None:
    """Refuse a chunk schema the input file cannot carry (see :func:`write_chunks`).

    Raises:
        InvalidArgumentError: it has a column named as the file's ops or visibility column.
    """
    if {_OPS, _VISIBILITY} & set(schema.names):
        raise InvalidArgumentError(
            "chunks", f"no column named {_OPS!r} or {_VISIBILITY!r}", schema.names
        )


def write_chunks(path: Path, chunks: Sequence[Chunk]) -> None:
    """Write ``chunks`` to the input file ``path`` (an Arrow IPC stream, one record batch per
    chunk, its ops and visibility as two more columns: null where the chunk has none).

    Raises:
        InvalidArgumentError: a chunk's schema already has a column of those names.
    """
    schema = chunks[0].batch.schema.remove_metadata()
    check_input_schema(schema)
    wide = schema.append(pa.field(_OPS, pa.int8())).append(pa.field(_VISIBILITY, pa.bool_()))
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, wide) as writer:
        for chunk in chunks:
            rows = chunk.num_rows
            ops = pa.nulls(rows, pa.int8()) if chunk.ops is None else chunk.ops
            mask = pa.nulls(rows, pa.bool_()) if chunk.visibility is None else chunk.visibility
            columns = [*chunk.batch.columns, ops, mask]
            writer.write_batch(pa.record_batch(columns, schema=wide))


def read_chunks(path: Path) -> list[Chunk]:
    """The chunks :func:`write_chunks` wrote to ``path``, in order."""
    with pa.memory_map(str(path)) as source, pa.ipc.open_stream(source) as reader:
        batches = list(reader)
    chunks = []
    for wide in batches:
        # A column all null (an empty chunk's too) stands for "none": insert-only, all shown.
        ops, mask, rows = wide.column(_OPS), wide.column(_VISIBILITY), wide.num_rows
        batch = wide.drop_columns([_OPS, _VISIBILITY])
        chunks.append(
            Chunk(
                batch,
                None if ops.null_count == rows else ops,
                None if mask.null_count == rows else mask,
            )
        )
    return chunks


def write_spec(path: Path, spec: dict[str, Any]) -> None:
    """Write an incarnation's spec (see the module) where the child reads it."""
    path.write_text(json.dumps(spec), encoding="utf-8")


def _resume(journal: Path, committed: int) -> int:
    """The first chunk to push again (see the module); the journal is cut there first."""
    latest: dict[int, int] = {}
    if journal.exists():
        for line in journal.read_text(encoding="utf-8").splitlines():
            if line:
                fact = json.loads(line)
                latest[fact["chunk"]] = fact["epoch"]
    start = 0
    while start in latest and latest[start] <= committed:
        start += 1
    kept = "".join(json.dumps({"chunk": i, "epoch": latest[i]}) + "\n" for i in range(start))
    cut = journal.with_suffix(".cut")
    cut.write_text(kept, encoding="utf-8")
    os.replace(cut, journal)
    return start


async def _incarnation(spec: dict[str, Any]) -> int:
    """Run one incarnation (see the module); the exit code when it was not killed."""
    factory: Callable[[], StreamActor] = resolve_name(spec["factory"])
    chunks = read_chunks(Path(spec["input"]))
    output = pa.ipc.read_schema(pa.py_buffer(bytes.fromhex(spec["output"])))
    checkpoints = set(spec["checkpoints"])
    kill = None if spec["kill"] is None else KillPoint(*spec["kill"])
    # Appends of a line each, done inline on purpose: when the kill comes, what the journal
    # and the facts say is exactly what happened before it, nothing still on a thread.
    facts = ReportFile(spec["facts"])
    journal = ReportFile(spec["journal"])

    def reached(chunk: int, moment: Moment, done: bool = False) -> None:
        if kill is not None and (kill.chunk, kill.moment) == (chunk, moment):
            where = kill.describe() + (" (it had completed)" if done else "")
            facts.write({"killing": where})
            os.killpg(os.getpgrp(), signal.SIGKILL)

    # recovery=False: an actor that fails in a fresh process is a finding, not a restart.
    config = RuntimeConfig(state_path=spec["state"], barrier_interval=3600, recovery=False)
    rt = Runtime(config)
    rt.add_source("input")
    rt.add_actor("actor", factory, inputs=["input"])
    add_sink(rt, "output", ParquetTable(spec["table"], output), input="actor")
    async with rt:
        committed = rt.committed_epoch
        start = _resume(Path(spec["journal"]), committed)
        backend = sniffio.current_async_library()
        facts.write({"resumed": start, "committed": committed, "backend": backend})
        for index in range(start, len(chunks)):
            await rt.push("input", chunks[index])
            journal.write({"chunk": index, "epoch": rt.stats().current_epoch})
            reached(index, "pushed")
            if index not in checkpoints:
                continue
            if kill is not None and (kill.chunk, kill.moment) == (index, "checkpointing"):
                await _kill_mid_checkpoint(rt, kill, reached)
            await rt.checkpoint()
            reached(index, "checkpointed")
        if kill is not None:
            return MISSED
        await rt.checkpoint()
    # Leaving the runtime stopped it gracefully: the sink's last checkpoint is committed.
    return 0


async def _kill_mid_checkpoint(
    rt: Runtime, kill: KillPoint, reached: Callable[[int, Moment, bool], None]
) -> None:
    """Start the checkpoint, let the graph run ``kill.turns`` scheduler turns, then die."""
    done = anyio.Event()

    async def checkpoint() -> None:
        await rt.checkpoint()
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(checkpoint)
        for _ in range(kill.turns):
            await anyio.lowlevel.checkpoint()
        reached(kill.chunk, "checkpointing", done.is_set())


def main(spec_path: str) -> None:
    """Run the incarnation ``spec_path`` describes; exit with its code (or die killed)."""
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    code = 1
    try:
        if os.getpgrp() != os.getpid():  # the kill would reach the parent's group too
            raise RuntimeError("start the child as a process group leader (a new session)")
        code = anyio.run(_incarnation, spec, backend=spec["backend"])
    except BaseException:  # reported through the exit code and the output file
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1])
