"""The job catalog under real SIGKILLs: a child process runs a runtime, adds job ``audit`` to
it with ``add_job`` and kills itself at an exact point around that call; a fresh runtime on
the same state store then recovers (see :mod:`barrierflow.runtime.job_catalog`).

A job is durable with the first checkpoint after the barrier that added it: killed before that
checkpoint, the job does not exist after recovery (a restart need not declare it); killed
after it, the job must be declared again (or forgotten) and keeps its creation epoch.

What is durable is read from the SQLite state store, not guessed from timing.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pytest
from _timeouts import scaled

from barrierflow.channels import Chunk, Message
from barrierflow.errors import JobNotDeclaredError
from barrierflow.runtime import ActorContext, Job, Runtime, RuntimeConfig, StateStore, StreamActor

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]

# The child: source "src" and a counting actor "count" (the default job); it pushes rows 1-3,
# checkpoints, pushes 4-5, adds job "audit" (a counting actor "audit" reading "src"), pushes
# 6-8, and then, depending on MODE:
#
# * "added": kills itself, no checkpoint after add_job.
# * "add-checkpoint": the same, but every barrier is a checkpoint (checkpoint_frequency 1), so
#   the Add barrier itself is one; it commits its ``prev`` (rows 4-5), not the catalog entry,
#   which is written under its ``curr``.
# * "during": kills itself inside add_job, once the Add barrier was collected by every actor,
#   before add_job returns (InFlightBarrier.wait of the Add barrier is patched).
# * "checkpointed": checkpoints after add_job, then kills itself.
#
# barrier_interval=3600: no periodic barrier is injected while the child runs, so every barrier
# is one the child injects (the initial one, its checkpoints, the Add barrier). Outside
# "add-checkpoint", checkpoint_frequency is huge: a barrier whose kind is left to the manager
# (the Add barrier: ``inject(mutation=...)``) is a checkpoint only every N-th injection, and
# with the default N=1 the Add barrier would be a checkpoint too, committing the epoch before
# it and moving the committed epoch past the child's last explicit checkpoint.
#
# Each of its lines is "@ MARKER epoch", flushed before the next step (structlog logs to
# stdout too).
CHILD = """
import os, signal, sys
import anyio, pyarrow as pa
from barrierflow.channels import Chunk, Message
from barrierflow.channels.mutation import Add
from barrierflow.runtime import Job, Runtime, RuntimeConfig, StreamActor
from barrierflow.runtime.barrier_manager import InFlightBarrier

path, backend, mode = sys.argv[1], sys.argv[2], sys.argv[3]

def say(*words):
    print("@", *words, flush=True)

def die():
    say("KILLING")
    os.kill(os.getpid(), signal.SIGKILL)

if mode == "during":
    real_wait = InFlightBarrier.wait

    async def wait(self):
        barrier = await real_wait(self)
        if isinstance(barrier.mutation, Add):  # only add_job waits on an Add barrier here
            say("ADD_COLLECTED", barrier.epoch.curr)
            die()
        return barrier

    InFlightBarrier.wait = wait

class Counter(StreamActor):
    async def restore(self, ctx):
        self.table = ctx.table("count")
        self.rows = await self.table.get("rows", 0)

    async def process(self, message: Message, ctx):
        if isinstance(message, Chunk):
            self.rows += message.cardinality
            self.table.put("rows", self.rows)
        await ctx.emit(message)

def chunk(*ids):
    return Chunk(pa.record_batch({"id": pa.array(ids, pa.int64())}))

async def main():
    frequency = 1 if mode == "add-checkpoint" else 1_000_000
    config = RuntimeConfig(state_path=path, barrier_interval=3600, checkpoint_frequency=frequency)
    rt = Runtime(config)
    rt.add_source("src")
    rt.add_actor("count", Counter, inputs=["src"])
    async with rt:
        await rt.push("src", chunk(1, 2, 3))
        say("CHECKPOINT", await rt.checkpoint())
        await rt.push("src", chunk(4, 5))
        job = Job("audit")
        job.add_actor("audit", Counter, inputs=["src"])
        handle = await rt.add_job(job)
        say("ADDED", handle.created_epoch)
        await rt.push("src", chunk(6, 7, 8))
        if mode == "checkpointed":
            say("CHECKPOINT", await rt.checkpoint())
        die()
    say("NOT KILLED")

anyio.run(main, backend=backend)
"""


def chunk(*ids: int) -> Chunk:
    return Chunk(pa.record_batch({"id": pa.array(ids, pa.int64())}))


def counter(seen: list[int] | None = None) -> Callable[[], StreamActor]:
    """A factory of actors counting the rows they read in state table ``count`` (and appending
    their ids to ``seen``)."""

    class Counter(StreamActor):
        async def restore(self, ctx: ActorContext) -> None:
            self.table = ctx.table("count")
            self.rows = await self.table.get("rows", 0)

        async def process(self, message: Message, ctx: ActorContext) -> None:
            if isinstance(message, Chunk):
                self.rows += message.cardinality
                self.table.put("rows", self.rows)
                if seen is not None:
                    seen.extend(message.compact().batch.column("id").to_pylist())
            await ctx.emit(message)

    return Counter


def audit_job(seen: list[int] | None = None) -> Job:
    job = Job("audit")
    job.add_actor("audit", counter(seen), inputs=["src"])
    return job


def restarted(tmp_path: Path) -> Runtime:
    """The child's default graph on the same store, without job ``audit``."""
    rt = Runtime(RuntimeConfig(state_path=tmp_path / "state.db", barrier_interval=3600))
    rt.add_source("src")
    rt.add_actor("count", counter(), inputs=["src"])
    return rt


async def run_child(tmp_path: Path, backend: str, mode: str) -> dict[str, list[int]]:
    """Run the child until it kills itself; every epoch it printed, by marker."""
    command = [sys.executable, "-c", CHILD, str(tmp_path / "state.db"), backend, mode]
    with anyio.fail_after(scaled(30)):  # run_process kills the child when cancelled
        done = await anyio.run_process(command, cwd=ROOT, check=False)
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == -signal.SIGKILL, (done.returncode, out[-2000:], err[-2000:])
    markers: dict[str, list[int]] = {}
    for line in out.splitlines():
        if not line.startswith("@ "):
            continue  # a log line
        _, marker, *epoch = line.split()
        markers.setdefault(marker, []).extend(int(e) for e in epoch)
    assert "KILLING" in markers, out  # killed itself where it meant to, not by anything else
    return markers


async def durable(tmp_path: Path) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """The store's committed epoch, its job catalog, and each counter's committed row count."""
    async with await StateStore.open(tmp_path / "state.db") as store:
        catalog = await store.read_all("__runtime__", "jobs")
        rows = {a: await store.read(a, "count", "rows") for a in ("count", "audit")}
        return store.committed_epoch, catalog, rows


async def assert_gone_after_restart(tmp_path: Path, committed: int, rows: int) -> None:
    """A restart that does not declare ``audit`` runs without it, from epoch ``committed``
    with ``rows`` counted; the name is free to add again."""
    seen: list[int] = []
    with anyio.fail_after(scaled(20)):
        async with restarted(tmp_path) as rt:  # no JobNotDeclaredError
            assert rt.jobs() == ["main"]
            assert rt.committed_epoch == committed
            await rt.push("src", chunk(100))
            epoch = await rt.checkpoint()
            again = await rt.add_job(audit_job(seen))  # not a DuplicateJobError
            await rt.push("src", chunk(101))
            await rt.checkpoint()
            assert again.created_epoch > epoch
    assert seen == [101]
    _, catalog, counted = await durable(tmp_path)
    assert sorted(catalog) == ["audit", "main"]
    # "count" went on from the child's checkpoint; the new "audit" started from nothing.
    assert counted == {"count": rows + 2, "audit": 1}


@pytest.mark.subprocess
async def test_a_job_added_but_not_checkpointed_is_gone_after_a_kill(
    tmp_path: Path, anyio_backend: str
) -> None:
    markers = await run_child(tmp_path, anyio_backend, "added")
    (checkpoint,) = markers["CHECKPOINT"]
    (created,) = markers["ADDED"]
    assert created > checkpoint

    committed, catalog, rows = await durable(tmp_path)
    assert committed == checkpoint  # the Add barrier was no checkpoint, nor any later one
    assert sorted(catalog) == ["main"]
    assert rows == {"count": 3, "audit": None}  # rows 1-3 only; the job's state never was
    await assert_gone_after_restart(tmp_path, checkpoint, rows=3)


@pytest.mark.subprocess
async def test_a_job_whose_add_barrier_was_a_checkpoint_is_still_gone_after_a_kill(
    tmp_path: Path, anyio_backend: str
) -> None:
    markers = await run_child(tmp_path, anyio_backend, "add-checkpoint")
    (checkpoint,) = markers["CHECKPOINT"]
    (created,) = markers["ADDED"]

    # The Add barrier (curr=created) committed the epoch before it (rows 4-5), not its own,
    # which holds the catalog entry.
    committed, catalog, rows = await durable(tmp_path)
    assert checkpoint < committed < created
    assert sorted(catalog) == ["main"]
    assert rows == {"count": 5, "audit": None}
    await assert_gone_after_restart(tmp_path, committed, rows=5)


@pytest.mark.subprocess
async def test_a_job_killed_during_add_job_is_gone_after_restart(
    tmp_path: Path, anyio_backend: str
) -> None:
    markers = await run_child(tmp_path, anyio_backend, "during")
    (checkpoint,) = markers["CHECKPOINT"]
    (collected,) = markers["ADD_COLLECTED"]
    assert "ADDED" not in markers  # add_job never returned
    assert collected > checkpoint

    committed, catalog, rows = await durable(tmp_path)
    assert committed == checkpoint
    assert sorted(catalog) == ["main"]
    assert rows == {"count": 3, "audit": None}
    await assert_gone_after_restart(tmp_path, checkpoint, rows=3)


async def checkpointed_child(tmp_path: Path, anyio_backend: str) -> int:
    """Run the child that checkpoints after add_job; check what is durable; the job's
    creation epoch."""
    markers = await run_child(tmp_path, anyio_backend, "checkpointed")
    first, checkpoint = markers["CHECKPOINT"]
    (created,) = markers["ADDED"]
    assert first < created <= checkpoint

    committed, catalog, rows = await durable(tmp_path)
    assert committed == checkpoint
    assert sorted(catalog) == ["audit", "main"]
    assert catalog["audit"] == {"created_epoch": created, "actors": ["audit"]}
    assert rows == {"count": 8, "audit": 3}  # the job saw rows 6-8, after its barrier
    return created


@pytest.mark.subprocess
async def test_a_checkpointed_job_is_refused_undeclared_after_a_kill(
    tmp_path: Path, anyio_backend: str
) -> None:
    created = await checkpointed_child(tmp_path, anyio_backend)
    with anyio.fail_after(scaled(20)), pytest.raises(JobNotDeclaredError) as undeclared:
        async with restarted(tmp_path):
            pytest.fail("a runtime that does not declare job 'audit' started")
    assert undeclared.value.job == "audit"
    assert undeclared.value.created_epoch == created
    _, catalog, _ = await durable(tmp_path)
    assert sorted(catalog) == ["audit", "main"]  # the refusal changed nothing


@pytest.mark.subprocess
async def test_a_checkpointed_job_declared_again_after_a_kill_keeps_its_epoch_and_sees_new_rows(
    tmp_path: Path, anyio_backend: str
) -> None:
    created = await checkpointed_child(tmp_path, anyio_backend)
    seen: list[int] = []
    rt = restarted(tmp_path)
    rt.declare_job(audit_job(seen))
    with anyio.fail_after(scaled(20)):
        async with rt:
            assert rt.jobs() == ["main", "audit"]
            assert rt.job("audit").created_epoch == created
            await rt.push("src", chunk(9, 10))
            await rt.checkpoint()
            assert rt.job("audit").created_epoch == created
    assert seen == [9, 10]
    _, catalog, rows = await durable(tmp_path)
    assert catalog["audit"]["created_epoch"] == created
    assert rows == {"count": 10, "audit": 5}  # both restored from the child's checkpoint


@pytest.mark.subprocess
async def test_a_checkpointed_job_forgotten_after_a_kill_is_gone(
    tmp_path: Path, anyio_backend: str
) -> None:
    await checkpointed_child(tmp_path, anyio_backend)
    rt = restarted(tmp_path)
    rt.forget_job("audit")
    with anyio.fail_after(scaled(20)):
        async with rt:
            assert rt.jobs() == ["main"]
            await rt.push("src", chunk(9))
            await rt.checkpoint()
        _, catalog, rows = await durable(tmp_path)
        assert sorted(catalog) == ["main"]
        assert rows["count"] == 9
        async with restarted(tmp_path) as again:  # forgotten for good: nothing to declare
            assert again.jobs() == ["main"]
