"""The kit's Hypothesis strategies produce only valid values: schemas of supported types, chunks
the Chunk type accepts with update pairs adjacent, barriers whose mutations validate and name
only the given actors, and schedules a runtime can play to the end, exactly once."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from barrierflow.actors import add_sink
from barrierflow.channels import Barrier, BarrierKind, Chunk, Op
from barrierflow.channels.mutation import (
    Add,
    Pause,
    SourceChangeSplit,
    Stop,
    Throttle,
    Update,
)
from barrierflow.errors import InvalidArgumentError
from barrierflow.runtime import Job, Runtime, RuntimeConfig
from barrierflow.testing import ListTable
from barrierflow.testing.graph_strategies import (
    AddJob,
    CheckpointStep,
    CrashStep,
    DropJob,
    GraphSchedule,
    MutateStep,
    PushStep,
    graph_schedules,
)
from barrierflow.testing.scripted import CRASH, ScriptedSource, play
from barrierflow.testing.strategies import (
    FIELD_TYPES,
    MUTATION_KINDS,
    SCHEMA,
    barriers,
    chunks,
    schemas,
)


@given(schemas())
def test_schemas_have_unique_names_of_supported_types(schema: pa.Schema) -> None:
    assert 1 <= len(schema) <= 5
    assert len(set(schema.names)) == len(schema.names)
    assert all(field.type in FIELD_TYPES for field in schema)


@given(schemas(nullable=False, min_fields=0, max_fields=2))
def test_schemas_can_be_made_non_nullable(schema: pa.Schema) -> None:
    assert len(schema) <= 2
    assert not any(field.nullable for field in schema)


def check_chunk(chunk: Chunk, schema: pa.Schema | None = None) -> None:
    """Everything a valid chunk of the kit satisfies (asserted, not trusted)."""
    chunk.batch.validate(full=True)
    rebuilt = Chunk(chunk.batch, chunk.ops, chunk.visibility)  # the constructor validates
    assert rebuilt.equals(chunk)
    if schema is not None:
        assert chunk.schema.equals(schema)
    for field, column in zip(chunk.schema, chunk.batch.columns, strict=True):
        assert field.nullable or column.null_count == 0
    ops = chunk.ops_numpy()
    deletes = np.flatnonzero(ops == Op.UPDATE_DELETE)
    inserts = np.flatnonzero(ops == Op.UPDATE_INSERT)
    # Every UPDATE_DELETE directly followed by its UPDATE_INSERT, and nothing else.
    assert np.array_equal(deletes + 1, inserts)
    if chunk.visibility is not None:
        shown = chunk.visibility.to_numpy(zero_copy_only=False)
        assert np.array_equal(shown[deletes], shown[inserts])  # a pair is shown or hidden whole


@given(chunks(max_rows=12))
def test_chunks_of_random_schemas_are_valid(chunk: Chunk) -> None:
    assert chunk.num_rows <= 12
    check_chunk(chunk)


@given(st.data())
def test_chunks_of_a_given_schema_keep_it(data: st.DataObject) -> None:
    schema = data.draw(schemas())
    chunk = data.draw(chunks(schema))
    check_chunk(chunk, schema)


@given(chunks(SCHEMA, with_ops=False, with_visibility=False))
def test_chunks_without_ops_or_masks_are_plain_inserts(chunk: Chunk) -> None:
    check_chunk(chunk, SCHEMA)
    assert chunk.ops is None
    assert chunk.visibility is None


def named_actors(barrier: Barrier) -> set[int]:
    mutation = barrier.mutation
    if isinstance(mutation, Throttle):
        return set(mutation.rates)
    if isinstance(mutation, Stop):
        return set(mutation.actors)
    if isinstance(mutation, Add):
        return set(mutation.splits) | set(mutation.added_actors)
    if isinstance(mutation, SourceChangeSplit):
        return set(mutation.splits)
    if isinstance(mutation, Update):
        return set(mutation.splits) | set(mutation.dropped_actors)
    return set()


@given(barriers(actor_ids=(4, 9)))
def test_barriers_are_valid_and_name_only_the_given_actors(barrier: Barrier) -> None:
    assert barrier.epoch.curr > barrier.epoch.prev
    assert barrier.kind in (BarrierKind.BARRIER, BarrierKind.CHECKPOINT)
    rebuilt = Barrier(barrier.epoch, barrier.kind, barrier.mutation)
    assert rebuilt == barrier
    if barrier.mutation is not None:  # the mutation's own checks run again
        assert dataclasses.replace(barrier.mutation) == barrier.mutation
    assert named_actors(barrier) <= {4, 9}
    if isinstance(barrier.mutation, Stop):
        assert barrier.mutation.actors


@given(barriers(checkpoint=True, mutations=("pause",), mutation_probability=1))
def test_barriers_follow_their_arguments(barrier: Barrier) -> None:
    assert barrier.is_checkpoint
    assert isinstance(barrier.mutation, Pause)


def test_every_mutation_kind_is_drawn() -> None:
    seen: set[str] = set()

    @settings(max_examples=200)
    @given(barriers(mutation_probability=1))
    def collect(barrier: Barrier) -> None:
        seen.add(type(barrier.mutation).__name__)

    collect()
    assert len(seen) == len(MUTATION_KINDS)


def check_schedule(schedule: GraphSchedule) -> None:
    """The feasibility rules of graph_schedules (see its module), asserted step by step."""
    paused = changed = False
    running: set[str] = set()
    added: set[str] = set()
    for step in schedule.steps:
        if isinstance(step, PushStep):
            assert not paused
            assert 0 <= step.source < schedule.sources
            check_chunk(step.chunk, SCHEMA)
        elif isinstance(step, MutateStep):
            assert paused is not isinstance(step.mutation, Pause)
            paused = isinstance(step.mutation, Pause)
        elif isinstance(step, CheckpointStep):
            changed = False
        elif isinstance(step, CrashStep):
            assert not changed
            assert 0 <= step.source < schedule.sources
        elif isinstance(step, AddJob):
            assert step.name not in added
            assert 0 <= step.source < schedule.sources
            added.add(step.name)
            running.add(step.name)
            changed = True
        else:
            assert isinstance(step, DropJob)
            running.remove(step.name)
            changed = True
        assert len(running) <= 2
    assert not paused
    assert isinstance(schedule.steps[-1], CheckpointStep)
    ids = [i for s in range(schedule.sources) for i in schedule.pushed(s)]
    assert len(ids) == len(set(ids))


@given(graph_schedules())
def test_graph_schedules_are_feasible(schedule: GraphSchedule) -> None:
    check_schedule(schedule)


@pytest.mark.parametrize(
    ("strategy", "kwargs", "argument"),
    [
        (schemas, {"max_fields": -1}, "max_fields"),
        (schemas, {"nullable": 1}, "nullable"),
        (chunks, {"schema": pa.schema([("d", pa.date32())])}, "schema"),
        (chunks, {"max_rows": -1}, "max_rows"),
        (barriers, {"actor_ids": ()}, "actor_ids"),
        (barriers, {"mutations": ("explode",)}, "mutations"),
        (barriers, {"mutation_probability": 2}, "mutation_probability"),
        (graph_schedules, {"max_sources": 0}, "max_sources"),
        (graph_schedules, {"crashes": "yes"}, "crashes"),
    ],
)
def test_bad_arguments_are_refused(strategy: Any, kwargs: dict[str, Any], argument: str) -> None:
    @given(strategy(**kwargs))
    def draw(value: object) -> None:
        raise AssertionError(f"drew {value!r}")

    with pytest.raises(InvalidArgumentError) as refused:
        draw()
    assert refused.value.argument == argument


async def interpret(
    schedule: GraphSchedule, path: Path
) -> tuple[list[ListTable], dict[str, ListTable]]:
    """Play ``schedule``: a scripted source per source, each into its own ListTable, and every
    job a ListTable of its source. A crash pushes again what the last committed checkpoint
    does not hold: the chunks pushed in a newer epoch than it (as ``play`` does)."""
    names = schedule.source_names()
    sinks = [ListTable(SCHEMA) for _ in names]
    job_sinks: dict[str, ListTable] = {}
    config = RuntimeConfig(
        state_path=path, barrier_interval=3600, recovery=True, max_restarts=100,
        restart_backoff=0.001,
    )  # fmt: skip
    rt = Runtime(config)
    for name, sink in zip(names, sinks, strict=True):
        rt.add_source(name, ScriptedSource)
        add_sink(rt, f"{name}_out", sink, input=name)
    pushed: list[tuple[int, PushStep]] = []  # (the epoch it was pushed in, at most; step)
    async with rt:
        for step in schedule.steps:
            if isinstance(step, PushStep):
                await rt.push(names[step.source], step.chunk)
                pushed.append((rt.stats().current_epoch, step))
            elif isinstance(step, MutateStep):
                await rt.mutate(step.mutation)
            elif isinstance(step, CheckpointStep):
                await rt.checkpoint()
            elif isinstance(step, CrashStep):
                committed = rt.committed_epoch
                await play(rt, names[step.source], [CRASH])
                lost, pushed = [s for e, s in pushed if e > committed], []
                for again in lost:
                    await rt.push(names[again.source], again.chunk)
                    pushed.append((rt.stats().current_epoch, again))
            elif isinstance(step, AddJob):
                job, sink = Job(step.name), ListTable(SCHEMA)
                job_sinks[step.name] = sink
                add_sink(job, f"{step.name}_out", sink, input=names[step.source])
                await rt.add_job(job)
            else:
                await rt.drop_job(step.name)
        await rt.checkpoint()  # the sinks commit what the schedule's last checkpoint sealed
    return sinks, job_sinks


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@settings(max_examples=6)
@given(schedule=graph_schedules(max_steps=10, max_sources=2))
def test_a_schedule_plays_to_the_end_exactly_once(backend: str, schedule: GraphSchedule) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        sinks, job_sinks = anyio.run(interpret, schedule, Path(tmp) / "s.db", backend=backend)
    for source, sink in enumerate(sinks):
        assert sorted(sink.rows().column("id").to_pylist()) == sorted(schedule.pushed(source))
    for step in schedule.steps:
        if isinstance(step, AddJob):  # a job sees its source's rows at most once each
            seen = job_sinks[step.name].rows().column("id").to_pylist()
            assert len(seen) == len(set(seen))
            assert set(seen) <= set(schedule.pushed(step.source))
