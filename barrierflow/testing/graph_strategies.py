"""Hypothesis strategies for whole runs: schedules of steps over a small graph, as plain data.

A :class:`GraphSchedule` is what a test does to a graph of ``sources`` push sources (named
``source_names()``, each a :class:`~barrierflow.testing.scripted.ScriptedSource` so that it
can crash): push a chunk into source *i*, inject a pause or resume barrier, checkpoint, crash,
add a job reading a source, drop a job. The strategy only *describes*; the test interprets
each step with the runtime's public calls (``rt.push``, ``rt.mutate``, ``rt.checkpoint``, a
poison chunk, ``rt.add_job``, ``rt.drop_job``) and checks its own model against the sinks.

Every schedule is feasible, by construction:

* chunks are insert-only rows of :data:`~barrierflow.testing.strategies.SCHEMA` whose ``id``
  is unique across the whole schedule, so a sink's rows tell what was lost or duplicated;
* ``Pause`` and ``Resume`` alternate, Pause first, and no chunk is pushed while paused (a
  paused source emits nothing); the schedule ends unpaused;
* a job is added under a new name and dropped only while it runs; at most ``max_jobs`` run at
  once;
* a crash never follows a job change without a checkpoint in between (a job added at runtime
  is durable only from the next checkpoint, and a crash before it is a different scenario
  from the one a schedule describes);
* the last step is a checkpoint, so everything pushed is durable at the end.

An interpreter replays, after a crash, what was pushed since the last checkpoint (as
:func:`~barrierflow.testing.scripted.play` does), and injects again a ``Pause`` in force at
that checkpoint (a rebuilt graph starts unpaused).

Why plain data rather than a ``RuleBasedStateMachine``: a schedule can be shrunk, printed and
replayed as is by Hypothesis, and one interpreter serves every graph a test builds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias, final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import strategies as st

from barrierflow.channels.chunk import Chunk
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.channels.mutation import Pause, Resume
from barrierflow.testing.strategies import SCHEMA

__all__ = [
    "AddJob",
    "CheckpointStep",
    "CrashStep",
    "DropJob",
    "GraphSchedule",
    "MutateStep",
    "PushStep",
    "Step",
    "graph_schedules",
]


@final
@dataclass(frozen=True, slots=True)
class PushStep:
    """Push ``chunk`` into source number ``source``."""

    source: int
    chunk: Chunk


@final
@dataclass(frozen=True, slots=True)
class MutateStep:
    """Inject a barrier carrying ``mutation`` (``rt.mutate``)."""

    mutation: Pause | Resume


@final
@dataclass(frozen=True, slots=True)
class CheckpointStep:
    """Wait for a checkpoint (``rt.checkpoint()``)."""


@final
@dataclass(frozen=True, slots=True)
class CrashStep:
    """Crash the graph at source number ``source`` (a scripted ``CRASH`` there)."""

    source: int


@final
@dataclass(frozen=True, slots=True)
class AddJob:
    """Add a job named ``name`` that reads source number ``source``."""

    name: str
    source: int


@final
@dataclass(frozen=True, slots=True)
class DropJob:
    """Drop the running job named ``name``."""

    name: str


#: One step of a schedule.
Step: TypeAlias = PushStep | MutateStep | CheckpointStep | CrashStep | AddJob | DropJob


@final
@dataclass(frozen=True, slots=True)
class GraphSchedule:
    """A run over ``sources`` push sources: its steps, in order (see the module)."""

    #: How many sources the graph has.
    sources: int
    #: The steps; the last one is a :class:`CheckpointStep`.
    steps: tuple[Step, ...]

    def source_names(self) -> list[str]:
        """The sources' names: ``source0``, ``source1``, …"""
        return [f"source{i}" for i in range(self.sources)]

    def pushed(self, source: int) -> list[int]:
        """The ids pushed into source number ``source``, in order (each once)."""
        return [
            i
            for step in self.steps
            if isinstance(step, PushStep) and step.source == source
            for i in step.chunk.batch.column("id").to_pylist()
        ]


def _rows(first_id: int, keys: list[int]) -> Chunk:
    """Insert-only rows of ``SCHEMA``: ids from ``first_id``, names ``n<id>``."""
    ids = pa.array(np.arange(first_id, first_id + len(keys), dtype=np.int64))
    names = pc.binary_join_element_wise("n", pc.cast(ids, pa.string()), "")
    return Chunk(
        pa.RecordBatch.from_arrays([ids, pa.array(keys, pa.int64()), names], schema=SCHEMA)
    )


def _count(argument: str, value: object, low: int) -> int:
    if type(value) is not int or value < low:
        raise InvalidArgumentError(argument, f"an int >= {low}", value)
    return value


@st.composite
def graph_schedules(
    draw: st.DrawFn,
    *,
    max_sources: int = 3,
    max_steps: int = 20,
    max_rows: int = 10,
    crashes: bool = True,
    max_jobs: int = 2,
) -> GraphSchedule:
    """Feasible schedules over 1..``max_sources`` sources (see the module for the rules).

    Args:
        max_sources: sources of the graph, at most.
        max_steps: steps drawn before the closing resume and checkpoint, at most.
        max_rows: rows per pushed chunk, at most.
        crashes: whether schedules may crash.
        max_jobs: jobs running at once, at most (0: no job steps).

    Raises:
        InvalidArgumentError: a count is not an int in range (``max_sources`` >= 1, the others
            >= 0), or ``crashes`` is not a bool.
    """
    sources = draw(st.integers(1, _count("max_sources", max_sources, 1)))
    _count("max_steps", max_steps, 0)
    _count("max_rows", max_rows, 0)
    _count("max_jobs", max_jobs, 0)
    if type(crashes) is not bool:
        raise InvalidArgumentError("crashes", "a bool", crashes)
    steps: list[Step] = []
    paused = changed = False  # a job changed since the last checkpoint
    running: list[str] = []
    next_id = jobs = 0
    for _ in range(draw(st.integers(0, max_steps))):
        kinds = ["checkpoint"]
        kinds += ["resume"] if paused else ["pause", "push", "push", "push"]
        kinds += ["crash"] if crashes and not changed else []
        kinds += ["add"] if len(running) < max_jobs else []
        kinds += ["drop"] if running else []
        kind = draw(st.sampled_from(kinds))
        if kind == "push":
            rows = draw(st.integers(0, max_rows))
            keys = draw(st.lists(st.integers(0, 20), min_size=rows, max_size=rows))
            steps.append(PushStep(draw(st.integers(0, sources - 1)), _rows(next_id, keys)))
            next_id += rows
        elif kind in ("pause", "resume"):
            steps.append(MutateStep(Pause() if kind == "pause" else Resume()))
            paused = kind == "pause"
        elif kind == "checkpoint":
            steps.append(CheckpointStep())
            changed = False
        elif kind == "crash":
            steps.append(CrashStep(draw(st.integers(0, sources - 1))))
        elif kind == "add":
            steps.append(AddJob(f"job{jobs}", draw(st.integers(0, sources - 1))))
            running.append(f"job{jobs}")
            jobs, changed = jobs + 1, True
        else:
            name = draw(st.sampled_from(running))
            running.remove(name)
            steps.append(DropJob(name))
            changed = True
    if paused:
        steps.append(MutateStep(Resume()))
    steps.append(CheckpointStep())
    return GraphSchedule(sources, tuple(steps))
