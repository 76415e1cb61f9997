"""The whole snapshot backfill under random programs: a view changing at random (inserts,
update pairs, deletes), checkpoints and plain barriers, a job added at a random moment, and
crashes at random moments (an actor fails; the runtime rebuilds the graph from the last
checkpoint). Whatever happened, the job ends with the view's final contents, and its change
stream holds the view's snapshot then every later change, none missing, none twice."""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pytest
from _timeouts import scaled
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_snapshot_backfill import SCHEMA, Change, Upserts, assert_exactly_once, copy_job

from barrierflow.actors.backfill.materialize import Materialize
from barrierflow.channels import Chunk, Message, Throttle
from barrierflow.errors import ActorFailedError
from barrierflow.runtime import ActorContext, Runtime, RuntimeConfig, StreamActor

pytestmark = pytest.mark.anyio

#: The key that makes :class:`Faulty` fail (a crash mid-epoch).
POISON = -1

STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("change"), st.integers(0, 60), st.integers(1, 40)),
        st.tuples(st.just("delete"), st.integers(0, 60), st.integers(1, 10)),
        st.tuples(st.just("checkpoint")),
        st.tuples(st.just("barrier")),
        st.tuples(st.just("add")),
        st.tuples(st.just("crash")),
    ),
    min_size=1,
    max_size=25,
)


class Faulty(StreamActor):
    """Fails on a chunk holding the poison key (the driver never sends it again)."""

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk) and POISON in message.batch.column("k").to_pylist():
            raise RuntimeError("poisoned: a crash mid-epoch")
        await ctx.emit(message)


class Driver(Upserts):
    """:class:`Upserts` that can go back to its last checkpoint (a crash loses what came
    after it, in the view too); values stay unique across the rollback."""

    def __init__(self) -> None:
        super().__init__()
        self.durable: tuple[dict[int, int], dict[int, list[Change]]] = ({}, {})

    def checkpointed(self) -> None:
        self.durable = (dict(self.state), copy.deepcopy(self.changes))

    def crashed(self) -> None:
        self.state, self.changes = dict(self.durable[0]), copy.deepcopy(self.durable[1])


def poison() -> Chunk:
    return Chunk(pa.record_batch({"k": [POISON], "v": [0]}, SCHEMA))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=STEPS)
async def test_a_job_added_at_any_moment_ends_with_the_view_exactly_once_despite_crashes(
    steps: list[tuple[Any, ...]],
) -> None:
    driver = Driver()
    seen: dict[int, list[Change]] = {}
    with tempfile.TemporaryDirectory() as directory, anyio.fail_after(scaled(60)):
        config = RuntimeConfig(
            state_path=Path(directory) / "state.db",
            barrier_interval=3600,
            checkpoint_frequency=1_000_000,  # only the test's checkpoints are checkpoints
            recovery=True,
            max_restarts=len(steps) + 1,
            restart_backoff=0.001,
        )
        rt = Runtime(config)
        rt.add_source("src")
        rt.add_actor("faulty", Faulty, inputs=["src"])
        rt.add_actor("view", lambda: Materialize(SCHEMA, ["k"], compact_after=2), inputs=["faulty"])
        async with rt:
            for step in steps:
                if step[0] == "change":
                    await rt.push("src", driver.change(range(step[1], step[1] + step[2])))
                elif step[0] == "delete":
                    await rt.push("src", driver.delete(range(step[1], step[1] + step[2])))
                elif step[0] == "checkpoint":
                    await rt.checkpoint()
                    driver.checkpointed()
                elif step[0] == "barrier":
                    await rt.mutate(Throttle({}))
                elif step[0] == "add" and "copy" not in rt.jobs():
                    await rt.add_job(copy_job(seen, batch_rows=7))
                elif step[0] == "crash":
                    await rt.push("src", poison())
                    with pytest.raises(ActorFailedError):
                        await rt.checkpoint()
                    await rt.wait_running()  # rebuilt from the last checkpoint:
                    driver.crashed()  # a job not durable yet is gone, and so are changes
            if "copy" not in rt.jobs():
                await rt.add_job(copy_job(seen, batch_rows=7))
            handle = rt.job("copy")
            while not handle.progress().ready:  # barriers are the test's: it drives them
                await rt.checkpoint()
            await rt.checkpoint()
            assert handle.progress().actors["backfill"].detail["phase"] == "forward"
    assert_exactly_once(driver, seen)
    replayed: dict[int, int] = {}
    for k, changes in seen.items():
        for v, op in changes:
            if op in (0, 3):
                replayed[k] = v
            else:
                replayed.pop(k, None)
    assert replayed == driver.state
