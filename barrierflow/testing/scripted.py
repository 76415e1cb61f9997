"""Scripted sources: play a list of batches and sentinels into a running graph.

A test describes what a source delivers and what happens to the graph meanwhile as one list::

    rt.add_source("src", ScriptedSource)   # a push source that also obeys CRASH and FAIL
    rt.add_actor("double", Double, inputs=["src"])
    async with rt:
        await play(rt, "src", [batch1, CHECKPOINT, batch2, CRASH, batch3, CHECKPOINT])

Items are ``pyarrow.RecordBatch``/``Table`` (pushed as insert-only chunks; a table one chunk
per record batch, zero-copy) or :class:`~barrierflow.channels.Chunk` (pushed as they are), and
sentinels:

* :data:`CHECKPOINT` — ``await rt.checkpoint()``: the driver waits until the epoch is durable.
  :attr:`Playback.checkpoints` lists the epochs, in order.
* :data:`PAUSE` / :data:`RESUME` — a barrier carrying ``Pause`` / ``Resume`` (``rt.mutate``)
  at this point of the stream, for the actors that honour them (split sources, backfills, a
  user's own actor). A push source has nothing of its own to pause, so a paused script holds
  no data: data between ``PAUSE`` and ``RESUME``, a second ``PAUSE`` or a ``RESUME`` without
  one is a script error.
* :data:`CRASH` — the source actor raises :class:`ScriptedCrashError` at this point, which
  fails the graph mid-epoch as a dying process would; the runtime (which needs
  ``recovery=True``) rebuilds it from the last committed checkpoint. What was pushed after
  that checkpoint is lost with the graph, so ``play`` pushes it again — as a real upstream
  replays what was not acknowledged — then goes on after the ``CRASH``. It knows what was
  lost from the epoch each chunk was pushed in, so checkpoints the runtime took on its own
  (its barrier interval, a ``PAUSE`` barrier when every barrier is a checkpoint) count too;
  a chunk pushed while such a barrier was being injected may be pushed again although it was
  durable (at least once, never lost). A ``Pause`` in force is applied again (a rebuilt
  graph starts unpaused).
* :data:`FAIL` — the source actor raises :class:`ScriptedFailureError`; ``play`` raises the
  runtime's :class:`~barrierflow.errors.ActorFailedError` for it (``cause`` is the
  ``ScriptedFailureError``) even when the runtime recovers, so the run ends with it.

Why a driver function over a push source, not a source actor that reads its own script: only
the driver can wait for a checkpoint to be durable and inject mutations (``rt.checkpoint()``,
``rt.mutate()``), and a push source is what the runtime's public entry points feed. The one
thing a driver cannot do — fail the graph *inside* it, at an exact point of the stream — is
what :class:`ScriptedSource` adds: ``play`` pushes an empty *poison* chunk whose schema
metadata names the fault, and the source raises on it (a source declared without it lets the
poison through, and ``play`` reports that as a script error). The same mechanism injects the
crashes of :func:`~barrierflow.testing.check_stream_actor`.

For a *split* source (offsets, replays by the source itself) script the log instead:
:class:`~barrierflow.testing.split_log.MemorySplitLog` is an in-memory split log a test appends
to while :class:`~barrierflow.actors.SplitSource` reads it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TypeAlias, final

import anyio.lowlevel
import pyarrow as pa

from barrierflow.channels.chunk import Chunk
from barrierflow.channels.errors import BarrierflowError, InvalidArgumentError
from barrierflow.channels.messages import Message
from barrierflow.channels.mutation import Pause, Resume
from barrierflow.runtime.actor import ActorContext
from barrierflow.runtime.errors import ActorFailedError
from barrierflow.runtime.job import PushSource
from barrierflow.runtime.runtime import Runtime

__all__ = [
    "CHECKPOINT",
    "CRASH",
    "FAIL",
    "PAUSE",
    "POISON_KEY",
    "RESUME",
    "Playback",
    "ScriptedCrashError",
    "ScriptedFailureError",
    "ScriptedSource",
    "Sentinel",
    "Item",
    "play",
    "poison",
]

#: The schema metadata key of a poison chunk; its value is ``b"crash:<position>"`` or
#: ``b"fail:<position>"``.
POISON_KEY = b"barrierflow.testing.poison"


class Sentinel(enum.Enum):
    """A scripted event between data items (see the module)."""

    CHECKPOINT = "checkpoint"
    PAUSE = "pause"
    RESUME = "resume"
    CRASH = "crash"
    FAIL = "fail"


CHECKPOINT = Sentinel.CHECKPOINT
PAUSE = Sentinel.PAUSE
RESUME = Sentinel.RESUME
CRASH = Sentinel.CRASH
FAIL = Sentinel.FAIL

#: What a script holds.
Item: TypeAlias = Chunk | pa.RecordBatch | pa.Table | Sentinel


@final
class ScriptedCrashError(BarrierflowError):
    """The crash a script asked for (recovered by the runtime).

    Attributes:
        position: the index of the ``CRASH`` item in the script.
    """

    def __init__(self, position: int) -> None:
        super().__init__(f"scripted crash at item {position}")
        self.position = position


@final
class ScriptedFailureError(BarrierflowError):
    """The failure a script asked for (``FAIL``): the run ends with it.

    Attributes:
        position: the index of the ``FAIL`` item in the script.
    """

    def __init__(self, position: int) -> None:
        super().__init__(f"scripted failure at item {position}")
        self.position = position


@final
class ScriptedSource(PushSource):
    """A push source that raises on a poison chunk (:func:`poison`) and forwards the rest.

    Lifecycle: as :class:`~barrierflow.runtime.job.PushSource`; it keeps no state, so a restart
    changes nothing but the graph around it. A poison never goes downstream.
    """

    async def process(self, message: Message, ctx: ActorContext) -> None:
        if isinstance(message, Chunk):
            tag = (message.batch.schema.metadata or {}).get(POISON_KEY)
            if tag is not None:
                kind, _, position = tag.decode().partition(":")
                error = ScriptedCrashError if kind == "crash" else ScriptedFailureError
                raise error(int(position))
        await ctx.emit(message)


def poison(schema: pa.Schema, sentinel: Sentinel, position: int) -> Chunk:
    """The empty chunk that makes a :class:`ScriptedSource` raise for ``sentinel``.

    Args:
        schema: the schema of the source's chunks (downstream never sees the poison, but a
            source that is not scripted lets it through, and it should then not be odd).
        sentinel: :data:`CRASH` or :data:`FAIL`.
        position: reported by the error as its ``position``.

    Raises:
        InvalidArgumentError: ``schema`` is not a Schema, ``sentinel`` neither ``CRASH`` nor
            ``FAIL``, or ``position`` not an int >= 0.
    """
    if not isinstance(schema, pa.Schema):
        raise InvalidArgumentError("schema", "a pyarrow Schema", schema)
    if sentinel not in (CRASH, FAIL):
        raise InvalidArgumentError("sentinel", "CRASH or FAIL", sentinel)
    if type(position) is not int or position < 0:
        raise InvalidArgumentError("position", "an int >= 0", position)
    metadata = dict(schema.metadata or {})
    metadata[POISON_KEY] = f"{sentinel.value}:{position}".encode()
    marked = schema.with_metadata(metadata)
    return Chunk(pa.record_batch([pa.array([], f.type) for f in schema], schema=marked))


@final
@dataclass(frozen=True, slots=True)
class Playback:
    """What :func:`play` did."""

    #: The epoch each ``CHECKPOINT`` made durable, in order.
    checkpoints: tuple[int, ...]
    #: Crashes injected (each recovered).
    crashes: int
    #: Chunks pushed, replays after a crash included.
    pushed: int


def _check_script(script: object) -> tuple[list[Item], pa.Schema]:
    """The script's items and the schema of its first data item (empty if it has none)."""
    if not isinstance(script, list | tuple):
        raise InvalidArgumentError("script", "a list or tuple of items", type(script).__name__)
    schema: pa.Schema | None = None
    paused = False
    for index, item in enumerate(script):
        if isinstance(item, Sentinel):
            if (item is PAUSE and paused) or (item is RESUME and not paused):
                raise InvalidArgumentError(
                    "script", "PAUSE and RESUME alternating, PAUSE first", f"{item} at {index}"
                )
            paused = item is PAUSE if item in (PAUSE, RESUME) else paused
            continue
        if not isinstance(item, Chunk | pa.RecordBatch | pa.Table):
            raise InvalidArgumentError(
                "script",
                "Chunks, RecordBatches, Tables or sentinels (CHECKPOINT, PAUSE, RESUME, CRASH, "
                "FAIL)",
                f"{type(item).__name__} at {index}",
            )
        if paused:
            raise InvalidArgumentError(
                "script", "no data between PAUSE and RESUME", f"data at {index}"
            )
        if schema is None:
            schema = item.schema.remove_metadata()
    return list(script), pa.schema([]) if schema is None else schema


def _chunks(item: Chunk | pa.RecordBatch | pa.Table) -> Iterator[Chunk]:
    if isinstance(item, Chunk):
        yield item
    elif isinstance(item, pa.RecordBatch):
        yield Chunk(item)
    else:
        for batch in item.to_batches():
            yield Chunk(batch)


async def play(rt: Runtime, source: str, script: Sequence[Item]) -> Playback:
    """Play ``script`` into push source ``source`` of the running ``rt`` (see the module).

    Args:
        rt: a running runtime (inside ``async with rt:``).
        source: a push source; a :class:`ScriptedSource` when the script holds ``CRASH`` or
            ``FAIL``.
        script: data items and sentinels, in order.

    Returns:
        The checkpoints, crashes and pushes, once every item was played.

    Raises:
        InvalidArgumentError: ``rt`` is not a Runtime, ``source`` not a source of it (or not a
            :class:`ScriptedSource` where the script crashes or fails), or ``script`` not a list
            or tuple of items with ``PAUSE``/``RESUME`` alternating and no data while paused.
            The script is checked whole before anything is played.
        ActorFailedError: at ``FAIL`` (``cause`` is :class:`ScriptedFailureError`); at
            ``CRASH`` when the runtime does not recover; or an actor failed on its own.
        NotRunningError: the runtime is not running.
    """
    if not isinstance(rt, Runtime):
        raise InvalidArgumentError("rt", "a Runtime", type(rt).__name__)
    if not isinstance(source, str):
        raise InvalidArgumentError("source", "a source's name (a str)", source)
    items, schema = _check_script(script)
    await anyio.lowlevel.checkpoint()
    checkpoints: list[int] = []
    crashes = pushed = 0
    paused = False
    unsealed: list[tuple[int, Chunk]] = []  # (its epoch at most, chunk), not known durable
    for index, item in enumerate(items):
        if item is CHECKPOINT:
            epoch = await rt.checkpoint()
            checkpoints.append(epoch)
            unsealed = [(e, chunk) for e, chunk in unsealed if e > epoch]
        elif item is PAUSE or item is RESUME:
            await rt.mutate(Pause() if item is PAUSE else Resume())
            paused = item is PAUSE
        elif item is FAIL:
            await _inject(rt, source, poison(schema, FAIL, index))
        elif item is CRASH:
            # Read before the crash: a checkpoint of the rebuilt graph holds none of the rows.
            committed = rt.committed_epoch
            await _inject(rt, source, poison(schema, CRASH, index))
            crashes += 1
            await rt.wait_running()
            lost, unsealed = [chunk for e, chunk in unsealed if e > committed], []
            for chunk in lost:
                unsealed.append(await _push(rt, source, chunk))
            pushed += len(lost)
            if paused:
                await rt.mutate(Pause())
        else:
            assert not isinstance(item, Sentinel)
            for chunk in _chunks(item):
                unsealed.append(await _push(rt, source, chunk))
                pushed += 1
    return Playback(tuple(checkpoints), crashes, pushed)


async def _push(rt: Runtime, source: str, chunk: Chunk) -> tuple[int, Chunk]:
    """Push ``chunk``; return it with the epoch it belongs to at most.

    A pushed chunk belongs to the ``curr`` of the last barrier ahead of it in the inbox, which
    is never newer than the last barrier injected once the push returned: the estimate errs
    towards pushing a durable chunk again after a crash, never towards losing one.
    """
    await rt.push(source, chunk)
    return rt.stats().current_epoch, chunk


async def _inject(rt: Runtime, source: str, chunk: Chunk) -> None:
    """Push a poison and wait until the graph failed on it (and, for a crash, was rebuilt).

    The checkpoint after the poison cannot complete in the graph that reads it; it either
    fails with that graph, or — when the failure won the race to it — completes in the
    rebuilt one, which the restart count tells apart from a source that let the poison by.
    """
    tag = (chunk.batch.schema.metadata or {})[POISON_KEY].decode()
    fail, position = tag.startswith("fail"), int(tag.partition(":")[2])
    expected = ScriptedFailureError if fail else ScriptedCrashError
    restarts = rt.stats().restarts
    await rt.push(source, chunk)
    try:
        await rt.checkpoint()
    except ActorFailedError as failure:
        cause = failure.cause
        if not (isinstance(cause, expected) and cause.position == position):
            raise
        if fail:
            raise
        return
    if rt.stats().restarts == restarts:
        raise InvalidArgumentError(
            "source",
            "a ScriptedSource (CRASH and FAIL need rt.add_source(name, ScriptedSource))",
            source,
        )
    if fail:
        error = ScriptedFailureError(position)
        raise ActorFailedError(source, rt.actor_id(source), error) from error
