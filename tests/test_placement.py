"""Placement declared by operators and actor classes decides dispatch and is checked when
``add_actor`` is called: round robin for partition-local, hash by the key for keyed, a global
actor never split."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from barrierflow.channels import Chunk, Message
from barrierflow.errors import GraphError
from barrierflow.operators import Operator, filter_rows
from barrierflow.runtime import ActorContext, Job, Placement, Runtime, RuntimeConfig, StreamActor
from barrierflow.runtime.placement import declared_key, declared_placement, declared_side_outputs

pytestmark = pytest.mark.anyio

SCHEMA = pa.schema([("user", pa.int64()), ("clicks", pa.int64())])


class Seen(StreamActor):
    """Records which instance saw which users."""

    placement: ClassVar[Placement] = Placement.PARTITION_LOCAL
    users: ClassVar[dict[str, list[int]]] = {}

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk):
            Seen.users.setdefault(ctx.name, []).extend(message.compact().batch["user"].to_pylist())
        await ctx.emit(message)


class KeyedSeen(StreamActor):
    placement: ClassVar[Placement] = Placement.KEYED
    key: ClassVar[tuple[str, ...] | None] = ("user",)

    async def process(self, message: Message, ctx: ActorContext) -> None:
        await Seen.process(self, message, ctx)  # type: ignore[arg-type]


class Whole(StreamActor):
    """Declares nothing: global."""


def _keyed(key: tuple[str, ...] | None) -> Operator:
    return Operator("test_keyed", Placement.KEYED, KeyedSeen, key=key)


def test_what_factories_declare() -> None:
    assert declared_placement(Whole) is Placement.GLOBAL
    assert declared_placement(Seen) is Placement.PARTITION_LOCAL
    assert declared_placement(lambda: Whole()) is None
    assert declared_key(KeyedSeen) == ("user",)
    assert declared_key(_keyed(("user", "clicks"))) == ("user", "clicks")
    assert declared_side_outputs(Whole) == ()
    assert declared_side_outputs(lambda: Whole()) is None
    op = Operator("x", Placement.PARTITION_LOCAL, Whole, side_outputs=("late",))
    assert declared_side_outputs(op) == ("late",)


def test_a_global_actor_is_refused_in_parallel_when_declared(tmp_path: Path) -> None:
    for target in (Runtime(RuntimeConfig(str(tmp_path / "s.db"))), Job("j")):
        target.add_source("events")
        with pytest.raises(GraphError) as caught:
            target.add_actor("whole", Whole, inputs=["events"], parallelism=2)
        assert caught.value.argument == "parallelism"
        assert "a global actor sees the whole stream" in str(caught.value)
        # One instance is fine, and the name stays free after the refusal.
        target.add_actor("whole", Whole, inputs=["events"], parallelism=1)


def test_a_lambda_declares_nothing_and_is_taken_as_written(tmp_path: Path) -> None:
    rt = Runtime(RuntimeConfig(str(tmp_path / "s.db")))
    rt.add_source("events")
    rt.add_actor("p", lambda i: Whole(), inputs=["events"], parallelism=2)


def test_a_keyed_operator_without_a_key_is_refused_in_parallel(tmp_path: Path) -> None:
    rt = Runtime(RuntimeConfig(str(tmp_path / "s.db")))
    rt.add_source("events")
    with pytest.raises(GraphError) as caught:
        rt.add_actor("k", _keyed(None), inputs=["events"], parallelism=2)
    assert caught.value.argument == "key"
    rt.add_actor("k", _keyed(None), inputs=["events"], parallelism=2, key=["user"])


def test_a_key_outside_the_operators_key_is_refused(tmp_path: Path) -> None:
    rt = Runtime(RuntimeConfig(str(tmp_path / "s.db")))
    rt.add_source("events")
    with pytest.raises(GraphError) as caught:
        rt.add_actor("k", _keyed(("user",)), inputs=["events"], parallelism=2, key=["clicks"])
    assert "rows of a key to one actor" in str(caught.value)
    # A subset of the operator's key keeps each key on one actor.
    rt.add_actor("k", _keyed(("user", "clicks")), inputs=["events"], parallelism=2, key=["user"])


async def test_a_keyed_operator_is_hash_dispatched_by_its_own_key(tmp_path: Path) -> None:
    Seen.users = {}
    rt = Runtime(RuntimeConfig(str(tmp_path / "s.db")))
    rt.add_source("events")
    rt.add_actor("k", _keyed(("user",)), inputs=["events"], parallelism=2)
    async with rt:
        for _ in range(3):
            users = pa.array(range(40), pa.int64())
            await rt.push("events", Chunk(pa.record_batch([users, users], schema=SCHEMA)))
        await rt.checkpoint()
    a, b = Seen.users["k.0"], Seen.users["k.1"]
    assert sorted(a + b) == sorted(list(range(40)) * 3)
    assert not set(a) & set(b)  # every key reached one instance, every time


async def test_a_partition_local_operator_is_fed_round_robin(tmp_path: Path) -> None:
    Seen.users = {}
    rt = Runtime(RuntimeConfig(str(tmp_path / "s.db")))
    rt.add_source("events")
    rt.add_actor("f", filter_rows(pc.field("clicks") >= 0), inputs=["events"], parallelism=2)
    rt.add_actor("seen", Seen, inputs=["f"])
    rt.add_actor("local", Seen, inputs=["events"], parallelism=2)
    async with rt:
        for i in range(4):
            users = pa.array([i, i], pa.int64())
            await rt.push("events", Chunk(pa.record_batch([users, users], schema=SCHEMA)))
        await rt.checkpoint()
    # Whole chunks in turn: each instance got two of the four.
    assert sorted(Seen.users["local.0"]) == [0, 0, 2, 2]
    assert sorted(Seen.users["local.1"]) == [1, 1, 3, 3]
    assert sorted(Seen.users["seen"]) == [0, 0, 1, 1, 2, 2, 3, 3]


def test_a_job_refuses_a_name_with_a_colon_when_declared() -> None:
    job = Job("j")
    job.add_source("events")
    with pytest.raises(GraphError) as caught:
        job.add_actor("a:b", Whole, inputs=["events"])
    assert caught.value.argument == "name"
    assert "without ':'" in str(caught.value)
