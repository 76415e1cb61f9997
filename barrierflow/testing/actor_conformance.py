"""The conformance suite of a user's stream actor: does its state survive restarts?

``await check_stream_actor(factory, chunks, state_dir=...)`` runs the actor twice over the same
input — ``push source → actor → exactly-once sink`` — and compares what the sink committed:

1. **undisturbed**: every chunk pushed, checkpoints at seeded random points (after each chunk
   with probability ``1 / checkpoint_every``, and after the last);
2. **with crashes**: the same, but at seeded random moments the graph fails mid-epoch (a
   scripted ``CRASH`` of its :class:`~barrierflow.testing.scripted.ScriptedSource`) and the
   runtime rebuilds it from the last checkpoint; :func:`~barrierflow.testing.scripted.play`
   pushes again the chunks after that checkpoint (a push source's rows since the last
   checkpoint are lost with the crash, as a real upstream would replay them).

If the actor keeps its state in its state tables (restored in ``restore``), both runs commit
the same rows; an actor that keeps state only in memory, or restores it wrongly, commits other
rows after a crash. Rules reported (a :class:`~barrierflow.testing.conformance.
ConformanceReport`): ``same_rows_with_crashes`` (the committed rows as multisets) and
``same_rows_in_order`` (also in commit order — only for actors whose output order is defined).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa

from barrierflow.actors.sinks.add_sink import add_sink
from barrierflow.channels.chunk import Chunk
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.runtime.actor import StreamActor
from barrierflow.runtime.config import RuntimeConfig
from barrierflow.runtime.runtime import Runtime
from barrierflow.testing.conformance import ConformanceReport, RuleResult
from barrierflow.testing.scripted import CHECKPOINT, CRASH, Item, ScriptedSource, play
from barrierflow.testing.sinks import ListTable

__all__ = ["check_stream_actor"]


async def check_stream_actor(
    factory: Callable[[], StreamActor],
    chunks: Sequence[Chunk],
    *,
    output: pa.Schema,
    state_dir: str | Path,
    checkpoint_every: int = 3,
    crashes: int = 3,
    seed: int = 0,
) -> ConformanceReport:
    """Run ``factory``'s actor over ``chunks`` without and with crashes (see the module).

    Args:
        factory: makes the actor under test (called at every (re)start).
        chunks: its input, in order (one schema).
        output: the schema of the chunks the actor emits.
        state_dir: a directory for the two runs' state stores (created if missing).
        checkpoint_every: chunks between checkpoints, on average (where they fall is drawn
            from ``seed``; both runs checkpoint at the same points).
        crashes: crashes injected in the second run.
        seed: picks the moments of the crashes and of the checkpoints.

    Raises:
        InvalidArgumentError: no chunks, chunks of several schemas, or a bad count.
    """
    if not chunks or not all(isinstance(c, Chunk) for c in chunks):
        raise InvalidArgumentError("chunks", "a non-empty sequence of Chunks", chunks)
    if len({c.batch.schema.remove_metadata() for c in chunks}) != 1:
        raise InvalidArgumentError("chunks", "chunks of one schema", "several schemas")
    for name, value in (("checkpoint_every", checkpoint_every), ("crashes", crashes)):
        if type(value) is not int or value < (1 if name == "checkpoint_every" else 0):
            raise InvalidArgumentError(name, "a positive int (crashes: >= 0)", value)
    directory = Path(state_dir)
    await anyio.Path(directory).mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    crash_at = set(rng.sample(range(len(chunks)), min(crashes, len(chunks))))
    checkpoints = {i for i in range(len(chunks)) if rng.random() < 1 / checkpoint_every}
    checkpoints.add(len(chunks) - 1)
    calm = await _run(factory, chunks, output, directory / "calm.db", checkpoints, set())
    shaken = await _run(factory, chunks, output, directory / "crashes.db", checkpoints, crash_at)
    report = ConformanceReport()
    same = sorted(_rows(calm)) == sorted(_rows(shaken))
    report.results.append(
        RuleResult(
            "same_rows_with_crashes",
            same,
            "" if same else f"without crashes {len(_rows(calm))} rows, with {len(_rows(shaken))}",
        )
    )
    ordered = _rows(calm) == _rows(shaken)
    report.results.append(
        RuleResult("same_rows_in_order", ordered, "" if ordered else "the commit order differs")
    )
    return report


async def _run(
    factory: Callable[[], StreamActor],
    chunks: Sequence[Chunk],
    output: pa.Schema,
    path: Path,
    checkpoints: set[int],
    crash_at: set[int],
) -> ListTable:
    sink = ListTable(output)
    config = RuntimeConfig(
        state_path=path,
        barrier_interval=3600,
        recovery=True,
        max_restarts=len(crash_at) + 1,
        restart_backoff=0.001,
    )
    rt = Runtime(config)
    rt.add_source("input", ScriptedSource)  # raises on the CRASH poison play() pushes
    rt.add_actor("actor", factory, inputs=["input"])
    add_sink(rt, "output", sink, input="actor")
    script: list[Item] = []
    for i, chunk in enumerate(chunks):
        script.append(chunk)
        if i in crash_at:
            script.append(CRASH)  # play() pushes again what followed the last checkpoint
        if i in checkpoints:
            script.append(CHECKPOINT)
    async with rt:
        await play(rt, "input", script)
        await rt.checkpoint()
    # Leaving the runtime stops it gracefully: the sink's last checkpoint is committed first.
    return sink


def _rows(sink: ListTable) -> list[tuple[Any, ...]]:
    table = sink.rows()
    columns = [table.column(i).to_pylist() for i in range(table.num_columns)]
    return list(zip(*columns, strict=True))
