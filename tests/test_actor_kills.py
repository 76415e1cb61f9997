"""The stream-actor conformance suite under real SIGKILLs (``check_stream_actor_kills``): an
actor whose counts live in its state table commits, across children killed at seeded points
and resumed from the state store and the table on disk, the same rows as an undisturbed run,
on asyncio and on trio; one that keeps its counts in memory is caught; what a child cannot
import is refused when called."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import anyio
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest
from _timeouts import ENV
from hypothesis import given, settings
from hypothesis import strategies as st

from barrierflow.channels import Chunk, Message
from barrierflow.errors import InvalidArgumentError
from barrierflow.operators import map_batches
from barrierflow.runtime import ActorContext, StreamActor
from barrierflow.testing._actor_kill_child import read_chunks, write_chunks
from barrierflow.testing.actor_conformance import check_stream_actor_kills
from barrierflow.testing.strategies import chunks, schemas

pytestmark = pytest.mark.anyio

INPUT = pa.schema([("key", pa.string())])
OUTPUT = pa.schema([("key", pa.string()), ("count", pa.int64())])
KEYS = ["a", "b", "c"]
CHILD_MODULE = "barrierflow.testing._actor_kill_child"
# Nine chunks of three keys each, rotating, so every chunk moves two or three counts.
CHUNKS = [
    Chunk(pa.record_batch({"key": [KEYS[(i + j) % 3] for j in range(i % 2 + 2)]}, schema=INPUT))
    for i in range(9)
]


def _counted(batch: pa.RecordBatch) -> tuple[list[str], list[int]]:
    """Each key of ``batch`` and how often it occurs there (vectorized)."""
    grouped = pa.table(batch).group_by("key").aggregate([("key", "count")])
    return grouped.column("key").to_pylist(), grouped.column("key_count").to_pylist()


class KeyedCount(StreamActor):
    """Emits, for each key of a chunk, its running count; the counts are state (its state
    table ``counts``, restored at every start)."""

    async def restore(self, ctx: ActorContext) -> None:
        self.counts = ctx.table("counts")

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk):
            keys, added = _counted(message.compact().batch)
            totals = [
                int(await self.counts.get(k, 0)) + n for k, n in zip(keys, added, strict=True)
            ]
            for key, total in zip(keys, totals, strict=True):  # a few keys a chunk
                self.counts.put(key, total)
            message = Chunk(pa.record_batch([pa.array(keys), pa.array(totals)], schema=OUTPUT))
        await ctx.emit(message)


class ForgetfulCount(StreamActor):
    """The same, with the counts only in memory: a new process starts them from 0 again."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk):
            keys, added = _counted(message.compact().batch)
            for key, n in zip(keys, added, strict=True):
                self.counts[key] = self.counts.get(key, 0) + n
            totals = [self.counts[k] for k in keys]
            message = Chunk(pa.record_batch([pa.array(keys), pa.array(totals)], schema=OUTPUT))
        await ctx.emit(message)


@pytest.mark.subprocess
async def test_an_actor_with_its_state_in_tables_survives_kills(
    tmp_path: Path, anyio_backend_name: str
) -> None:
    # The children run on the other backend: both backends run children across the suite.
    other = {"asyncio": "trio", "trio": "asyncio"}[anyio_backend_name]
    report = await check_stream_actor_kills(
        KeyedCount, CHUNKS, output=OUTPUT, state_dir=tmp_path, kills=3, seed=1, backend=other
    )
    report.raise_for_failures()
    rules = [r.rule for r in report.results]
    assert rules == ["killed_where_planned", "same_rows_with_crashes", "same_rows_in_order"]
    # Three children were killed where planned, a fourth resumed and ran to the end.
    landed = report.results[0].detail.split("; ")
    assert [part.split(" ")[1] for part in landed] == ["1", "2", "3", "4"]
    assert all(" was killed " in part for part in landed[:3])
    assert landed[3].endswith("ran to the end")
    assert all(part.startswith(f"incarnation {n} ({other}) ") for n, part in enumerate(landed, 1))
    assert (tmp_path / "kills" / "table").is_dir()  # the killed run committed to disk


def _shout(batch: pa.RecordBatch) -> pa.RecordBatch:
    return pa.record_batch([pc.utf8_upper(batch.column("key"))], schema=INPUT)


#: An operator declared at module level: a child imports it by its "module:name".
SHOUT = map_batches(_shout, schema=INPUT)


@pytest.mark.subprocess
async def test_an_operator_named_by_module_and_name_survives_kills(tmp_path: Path) -> None:
    report = await check_stream_actor_kills(
        f"{__name__}:SHOUT", CHUNKS, output=INPUT, state_dir=tmp_path, kills=2, seed=2
    )
    report.raise_for_failures()
    assert len(report.results[0].detail.split("; ")) == 3  # two kills, then the end
    committed = ds.dataset(tmp_path / "kills" / "table", schema=INPUT, format="parquet")
    assert sorted(committed.to_table().column("key").to_pylist()) == sorted(
        k.upper() for c in CHUNKS for k in c.batch.column("key").to_pylist()
    )


@pytest.mark.subprocess
async def test_an_actor_keeping_state_in_memory_is_caught_by_kills(tmp_path: Path) -> None:
    report = await check_stream_actor_kills(
        ForgetfulCount, CHUNKS, output=OUTPUT, state_dir=tmp_path, kills=2, seed=1
    )
    failed = {r.rule for r in report.failures}
    assert "killed_where_planned" not in failed  # the children died where planned
    assert "same_rows_with_crashes" in failed


async def test_a_factory_a_child_cannot_import_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError) as refused:
        await check_stream_actor_kills(
            lambda: KeyedCount(), CHUNKS, output=OUTPUT, state_dir=tmp_path
        )
    assert refused.value.argument == "factory"
    assert not (tmp_path / "kills").exists()  # refused before anything ran
    # An Operator value has no name of its own; a "module:name" must name a callable.
    for factory in (SHOUT, f"{__name__}:NO_SUCH_OPERATOR", f"{__name__}:KEYS", "no_colon"):
        with pytest.raises(InvalidArgumentError) as unnamed:
            await check_stream_actor_kills(factory, CHUNKS, output=INPUT, state_dir=tmp_path)
        assert unnamed.value.argument == "factory"


async def test_bad_kill_arguments_are_refused(tmp_path: Path) -> None:
    clash = pa.schema([("__barrierflow_kill_ops", pa.int8())])  # a column the input file uses
    for keywords, argument in (
        ({"kills": 0}, "kills"),
        ({"kills": True}, "kills"),
        ({"backend": "curio"}, "backend"),
        ({"output": "key: string"}, "output"),
        ({"seed": "1"}, "seed"),
        ({"state_dir": 5}, "state_dir"),
        ({"checkpoint_every": 0}, "checkpoint_every"),
        ({"chunks": [Chunk(pa.record_batch([pa.array([1], pa.int8())], schema=clash))]}, "chunks"),
    ):
        arguments = {"chunks": CHUNKS, "output": OUTPUT, "state_dir": tmp_path, **keywords}
        with pytest.raises(InvalidArgumentError) as refused:
            await check_stream_actor_kills(KeyedCount, **arguments)
        assert refused.value.argument == argument
        assert not (tmp_path / "kills").exists()  # refused before anything ran
    (tmp_path / "kills").mkdir()
    with pytest.raises(InvalidArgumentError) as reused:
        await check_stream_actor_kills(KeyedCount, CHUNKS, output=OUTPUT, state_dir=tmp_path)
    assert reused.value.argument == "state_dir"


class HangsInChild(StreamActor):
    """Forwards everything, except in a child of the killed run: there it never returns."""

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if getattr(sys.modules["__main__"].__spec__, "name", "") == CHILD_MODULE:
            await anyio.sleep_forever()
        await ctx.emit(message)


@pytest.mark.subprocess
async def test_a_hung_child_is_a_finding_not_a_hang(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A child may take 60 s times the scale: 0.05 makes it 3 s (imports take about one).
    monkeypatch.setenv(ENV, "0.05")
    report = await check_stream_actor_kills(
        HangsInChild, CHUNKS, output=INPUT, state_dir=tmp_path, kills=1
    )
    (planned, *rows) = report.results
    assert not planned.passed
    assert "incarnation 1" in planned.detail
    assert "no exit within 3s" in planned.detail
    assert [(r.rule, r.passed) for r in rows] == [
        ("same_rows_with_crashes", False),
        ("same_rows_in_order", False),
    ]


@st.composite
def _inputs(draw: st.DrawFn) -> list[Chunk]:
    schema = draw(schemas())
    return draw(st.lists(chunks(schema, max_rows=6), min_size=1, max_size=4))


@settings(max_examples=40, deadline=None)
@given(_inputs())
def test_the_input_file_gives_the_children_the_chunks_as_they_were(inputs: list[Chunk]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "input.arrows"
        write_chunks(path, inputs)
        read = read_chunks(path)
    assert len(read) == len(inputs)
    for got, sent in zip(read, inputs, strict=True):
        assert got.batch.equals(sent.batch)
        for part in ("ops", "visibility"):
            mine, theirs = getattr(got, part), getattr(sent, part)
            if sent.num_rows:  # an empty chunk has nothing to carry either way
                assert (mine is None) == (theirs is None)
            assert mine is None or theirs is None or mine.equals(theirs)
