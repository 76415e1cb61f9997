"""Mistakes a graph's declaration already shows are refused when it is declared or starts,
naming the actor, column or path — not on the first rows, in the wrong actor (issue 24, items
6 and 7).

* A hash key column that the input's known schema lacks is a ``KeyColumnError`` naming the
  reading actor, the column and the input's columns: at declaration against a source declared
  with ``schema=``, at start against what a source says (a batch feed's, a split log's).
* A sink whose schema differs from its input's known schema is a ``SinkSchemaError`` naming the
  sink and the difference, with the cast that fixes a time zone or an integer width.
* A file sink's path that cannot be used is a ``SinkPathError`` naming the sink and the path:
  at the constructor for what ``stat`` tells (a file, under a file, not writable), at start,
  before any row, for what only creating it tells (``/proc``) — in the state store's words.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pytest
from _timeouts import scaled

from barrierflow.actors import BatchFeed, Coordinator, SplitSource, add_sink
from barrierflow.actors.sinks.sink_writer import SinkWriter
from barrierflow.channels import Chunk, Message
from barrierflow.connectors import ParquetStagingWriter, ParquetTable, open_local_catalog
from barrierflow.connectors.parquet_committer import ParquetCommitter
from barrierflow.errors import (
    ActorFailedError,
    InvalidArgumentError,
    KeyColumnError,
    SinkPathError,
    SinkSchemaError,
    StorePathError,
)
from barrierflow.runtime import (
    ActorContext,
    Fanout,
    Job,
    Runtime,
    RuntimeConfig,
    StateStore,
    StreamActor,
)
from barrierflow.testing.split_log import MemorySplitLog

pytestmark = pytest.mark.anyio

EVENTS = pa.schema([("user", pa.int64()), ("ts", pa.timestamp("us"))])
AWARE = pa.schema([("user", pa.int64()), ("ts", pa.timestamp("us", tz="UTC"))])
NARROW = pa.schema([("user", pa.int32()), ("ts", pa.timestamp("us"))])


def runtime(tmp_path: Path) -> Runtime:
    return Runtime(RuntimeConfig(state_path=str(tmp_path / "state.db"), barrier_interval=3600.0))


class Pass(StreamActor):
    """Forwards everything (its output schema is unknown to the runtime)."""

    async def process(self, message: Message, ctx: ActorContext) -> None:
        await ctx.emit(message)


def hand_sink(target: Runtime | Job, name: str, path: Path, schema: pa.Schema, input: str) -> None:
    """A writer and its coordinator declared by hand (add_sink would check the schema at
    declaration already)."""
    table = ParquetTable(path, schema)
    coordinator = Coordinator(name, table.committer())
    target.add_service(f"{name}.coordinator", coordinator)
    target.add_actor(
        name,
        lambda: SinkWriter(lambda: table.writer("0"), coordinator=coordinator, writer_id="0"),
        inputs=[input],
    )


async def start_and_stop(rt: Runtime) -> None:
    with anyio.fail_after(scaled(30)):
        async with rt:
            pass


# Item 6: hash key columns.


def test_hash_key_missing_from_a_declared_source_is_refused_at_declaration(
    tmp_path: Path,
) -> None:
    rt = runtime(tmp_path)
    rt.add_source("events", schema=EVENTS)
    with pytest.raises(KeyColumnError) as info:
        rt.add_actor("agg", lambda i: Pass(), inputs=["events"], parallelism=2, key=["usr"])
    error = info.value
    assert (error.actor, error.column, error.upstream) == ("agg", "usr", "events")
    assert error.columns == ("user: int64", "ts: timestamp[us]")
    assert error.argument == "key"
    assert str(error).startswith("actor 'agg': hash key column 'usr' is not a column")
    assert not rt.name_in_use("agg.0")  # all or nothing: the name is free again


def test_hash_fanout_of_a_declared_source_is_checked_for_its_readers(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    rt.add_source("events", fanout=Fanout("hash", ("usr",)), schema=EVENTS)
    with pytest.raises(KeyColumnError) as info:
        rt.add_actor("agg", Pass, inputs=["events"])
    assert (info.value.actor, info.value.column) == ("agg", "usr")


def test_unhashable_key_column_of_a_declared_source_is_refused(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    rt.add_source("events", schema=pa.schema([("tags", pa.list_(pa.string()))]))
    with pytest.raises(KeyColumnError) as info:
        rt.add_actor("agg", lambda i: Pass(), inputs=["events"], parallelism=2, key=["tags"])
    assert info.value.column == "tags"


async def test_hash_key_missing_from_a_batch_feed_is_refused_at_start(tmp_path: Path) -> None:
    feed = BatchFeed(EVENTS)
    rt = runtime(tmp_path)
    rt.add_source("events", feed.source)  # its schema is known once the actor exists
    rt.add_actor("agg", lambda i: Pass(), inputs=["events"], parallelism=2, key=["usr"])
    with pytest.raises(KeyColumnError) as info:
        await start_and_stop(rt)
    assert (info.value.actor, info.value.column, info.value.upstream) == ("agg", "usr", "events")


async def test_hash_key_missing_from_a_split_log_is_refused_at_start(tmp_path: Path) -> None:
    log = MemorySplitLog(pa.schema([("user", pa.int64())]), splits=["p0"])
    rt = runtime(tmp_path)
    rt.add_source("events", lambda: SplitSource(log))
    rt.add_actor("agg", lambda i: Pass(), inputs=["events"], parallelism=2, key=["usr"])
    with pytest.raises(KeyColumnError) as info:
        await start_and_stop(rt)
    assert info.value.actor == "agg"
    assert "user: int64" in info.value.columns
    assert any(c.startswith("_split") for c in info.value.columns)


async def test_hash_key_error_of_an_unknown_schema_names_its_readers(tmp_path: Path) -> None:
    # Behind an actor whose output schema nobody knows, the first chunk finds it: the error
    # is raised in that actor, and says whose key it is.
    rt = runtime(tmp_path)
    rt.add_source("events")
    rt.add_actor("pass", Pass, inputs=["events"])
    rt.add_actor("agg", lambda i: Pass(), inputs=["pass"], parallelism=2, key=["usr"])
    with pytest.raises(ActorFailedError) as info, anyio.fail_after(scaled(30)):
        async with rt:
            await rt.push("events", Chunk.from_pydict({"user": [1], "ts": [0]}, EVENTS))
            await rt.checkpoint()
    cause = info.value.cause
    assert isinstance(cause, InvalidArgumentError)
    assert cause.argument == "key_columns"
    assert "['pass->agg.0', 'pass->agg.1']" in cause.expected


# Item 6: a sink's schema against its input's.


def test_sink_schema_differing_from_its_input_is_refused_at_declaration(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    rt.add_source("events", schema=EVENTS)
    table = ParquetTable(tmp_path / "out", AWARE)
    with pytest.raises(SinkSchemaError) as info:
        add_sink(rt, "clicks", table, input="events", parallelism=2, key=["user"])
    error = info.value
    assert (error.sink, error.upstream) == ("clicks", "events")
    assert "timestamp[us, tz=UTC] in the sink, timestamp[us] in the input" in error.difference
    assert "cast column 'ts' to timestamp[us, tz=UTC]" in error.fix
    assert not rt.name_in_use("clicks.0")


async def test_sink_schema_differing_from_its_input_is_refused_at_start(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    rt.add_source("events", schema=NARROW)
    hand_sink(rt, "out", tmp_path / "out", EVENTS, "events")
    with pytest.raises(SinkSchemaError) as info:
        await start_and_stop(rt)
    error = info.value
    assert (error.sink, error.upstream) == ("out", "events")
    assert "column 'user' is int64 in the sink, int32 in the input" in error.difference
    assert "cast column 'user' to int64" in error.fix
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("epoch=*"))


async def test_sink_schema_that_differs_by_more_than_a_cast_gives_no_fix(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    rt.add_source("events", schema=pa.schema([("user", pa.int64())]))
    hand_sink(rt, "out", tmp_path / "out", EVENTS, "events")
    with pytest.raises(SinkSchemaError) as info:
        await start_and_stop(rt)
    assert "column 'ts' (timestamp[us]) is missing from the input" in info.value.difference
    assert info.value.fix == ""


async def test_push_source_with_a_declared_schema_refuses_another(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    rt.add_source("events", schema=EVENTS)
    with pytest.raises(ActorFailedError) as info, anyio.fail_after(scaled(30)):
        async with rt:
            await rt.push("events", Chunk.from_pydict({"user": [1], "ts": [0]}, NARROW))
            await rt.checkpoint()
    assert info.value.actor == "events"


# Item 7: sink paths.


def unusable(tmp_path: Path) -> dict[str, Path]:
    """Paths no table directory can live at, that ``stat`` recognizes."""
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    return {"under-a-file": a_file / "out", "a-file": a_file}


@pytest.mark.parametrize("case", ["under-a-file", "a-file"])
@pytest.mark.parametrize("kind", ["ParquetStagingWriter", "ParquetTable", "ParquetCommitter"])
def test_unusable_sink_path_is_refused_by_the_constructor(
    tmp_path: Path, case: str, kind: str
) -> None:
    path = unusable(tmp_path)[case]
    make: dict[str, Any] = {
        "ParquetStagingWriter": lambda: ParquetStagingWriter(path, EVENTS, "0"),
        "ParquetTable": lambda: ParquetTable(path, EVENTS),
        "ParquetCommitter": lambda: ParquetCommitter(path),
    }
    with pytest.raises(SinkPathError) as info:
        make[kind]()
    error = info.value
    assert isinstance(error, InvalidArgumentError)
    assert (error.argument, error.sink, error.path) == ("path", kind, os.path.realpath(path))
    assert "writable" in error.expected
    assert error.got in (
        f"a parent {str(tmp_path / 'a-file')!r} that is a file, not a directory",
        "a regular file",
    )


def test_sink_path_that_is_not_writable_is_refused_by_the_constructor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the OS answers for a directory without write permission, even for root.
    locked = str(tmp_path / "locked")
    os.mkdir(locked)
    access = os.access

    def no_write_to_locked(path: Any, mode: int, **kwargs: Any) -> bool:
        if str(path) == locked and mode & os.W_OK:
            return False
        return access(path, mode, **kwargs)

    monkeypatch.setattr(os, "access", no_write_to_locked)
    with pytest.raises(SinkPathError) as info:
        ParquetTable(Path(locked) / "out", EVENTS)
    assert info.value.got == f"a parent {locked!r} that is not writable"


def test_sink_path_and_state_path_are_refused_in_the_same_words(tmp_path: Path) -> None:
    path = unusable(tmp_path)["under-a-file"]
    with pytest.raises(SinkPathError) as sink:
        ParquetTable(path, EVENTS)

    async def open_store() -> None:
        await StateStore.open(path / "state.db")

    with pytest.raises(StorePathError) as store:
        anyio.run(open_store)
    assert sink.value.got == store.value.got  # one check, shared (barrierflow._fs)


def test_catalog_root_under_a_file_is_a_sink_path_error(tmp_path: Path) -> None:
    with pytest.raises(SinkPathError) as info:
        open_local_catalog(unusable(tmp_path)["under-a-file"], "lake")
    assert info.value.sink == "catalog 'lake'"
    assert info.value.argument == "path"


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="no /proc on this system")
@pytest.mark.parametrize("parallelism", [1, 2])
async def test_sink_path_that_cannot_be_created_is_refused_at_start_naming_the_sink(
    tmp_path: Path, parallelism: int
) -> None:
    # /proc passes every stat check (a directory root may write to); only mkdir tells.
    path = Path("/proc/barrierflow-out")
    rt = runtime(tmp_path)
    rt.add_source("events", schema=EVENTS)
    add_sink(rt, "clicks", ParquetTable(path, EVENTS), input="events", parallelism=parallelism)
    with pytest.raises(SinkPathError) as info:
        await start_and_stop(rt)
    error = info.value
    assert (error.sink, error.path, error.argument) == ("clicks", str(path), "path")
    assert "cannot be created" in error.got


async def test_a_joining_job_is_checked_against_the_running_graph(tmp_path: Path) -> None:
    feed = BatchFeed(EVENTS)
    rt = runtime(tmp_path)
    rt.add_source("events", feed.source)
    with anyio.fail_after(scaled(30)):
        async with rt:
            keyed = Job("keyed")
            keyed.add_actor("agg", lambda i: Pass(), inputs=["events"], parallelism=2, key=["u"])
            with pytest.raises(KeyColumnError) as key:
                await rt.add_job(keyed)
            assert (key.value.actor, key.value.column) == ("agg", "u")
            export = Job("export")
            out = tmp_path / "out"
            hand_sink(export, "out", out, AWARE, "events")
            with pytest.raises(SinkSchemaError) as sink:
                await rt.add_job(export)
            assert (sink.value.sink, sink.value.upstream) == ("out", "events")
            assert await rt.checkpoint() > 0  # the running graph is untouched
