"""Asynchronous enrichment: :func:`async_map` calls an outside service (an HTTP API, a model
endpoint, a database lookup) for each row — or each small batch of rows — with many calls in
flight at once, a bound, backpressure and exactly-once output: Flink's Async I/O operator, on
anyio.

**Calls.** ``fn`` is an ``async def`` of one row (a ``dict`` of the input's columns) returning
one row (a ``dict`` of ``schema``'s columns), or with ``batch_size=n`` of a ``pyarrow.
RecordBatch`` of up to ``n`` rows returning a batch of ``schema`` with as many rows. It runs on
the actor's event loop, so it uses the running backend (asyncio or trio) and its libraries.
Rows hidden by a visibility mask are not called (the chunk is compacted first).

**The window.** At most ``concurrency`` calls are in flight per actor: a pool of that many
worker tasks, each making one call at a time (the gauge ``barrierflow_operator_calls_in_flight``
counts the attempts under way). A result the emitter has not sent yet — one waiting behind a
slower row in ordered mode — still counts: once ``concurrency`` results wait, no new call
starts, so the rows held in memory are bounded too (Flink bounds its queue the same way; here
a worker that completed a call starts the next one at once, without waiting for its result to
be emitted, which keeps the window full at high rates). A full window stops reading input: the
actor does not read its next message until every row of the chunk it holds has started its
call, and the channels upstream fill and push back.

**Order.** ``ordered=True`` (the default) emits rows in input order: whenever the oldest calls
have completed, that completed prefix goes out as one chunk (one ``RecordBatch.from_pylist``
per emitted run, never a chunk per row). ``ordered=False`` emits results as they complete, in
chunks of whatever completed together — but never across a barrier or a watermark: those
wait for every call before them (below), so an epoch's rows stay in their epoch.

**Ops.** Row for row, a result keeps its input row's op, so a changelog stays a changelog — in
order. Two modes would break one, and are refused on a changelog input (a chunk with deletes
or updates) with :class:`~barrierflow.errors.ChangelogInputError`: ``ordered=False`` (an
``UPDATE_DELETE`` could overtake its ``UPDATE_INSERT``, a ``DELETE`` the ``INSERT`` it
retracts) and ``dead_letters=True`` (a dead row has no output row, so one half of an update,
or the retraction of a delete, would be lost — which downstream could not see).

**Failures.** A call that raises, or gives no answer within ``timeout`` seconds, is retried up
to ``retries`` times (so ``retries + 1`` attempts) after the library's backoff
(:class:`~barrierflow._backoff.RetryBackoff`: the n-th retry of a call waits up to *b*^n ms for
a ``retry_delay`` of *b* ms, capped at ``max_retry_delay``, with full jitter — up to 10 ms,
100 ms, then 1 s for the defaults; ``retry_delay=0`` retries at once, for tests). Every retry and
every timeout is counted (``call_retries``, ``call_timeouts``). When the attempts are spent,
the actor fails with :class:`~barrierflow.errors.AsyncCallFailedError` naming the row — its
``key`` columns' values, or its position in its chunk without a key — and the last cause; the
runtime restarts the graph from the last checkpoint if recovery is configured. With
``dead_letters=True`` the row goes instead to the side output ``"dead_letters"`` (read
downstream as ``"<actor>:dead_letters"``): the input row with two more columns, ``error``
(``"<type>: <message>"`` of the last cause) and ``attempts`` (int32), and no main output row
for it. A result that is not what ``fn`` promises (not a dict, not a batch of ``schema`` with
as many rows, values that do not convert) is a bug, not an outage: it fails the actor at once,
unretried, with :class:`~barrierflow.errors.InvalidArgumentError` or
:class:`~barrierflow.errors.SchemaMismatchError`.

**Barriers: drain.** When a barrier (or a watermark) arrives, the actor stops reading, waits
for every call in flight to complete and its result to be emitted, and only then passes the
barrier on. The checkpoint it seals therefore holds no call in flight: every row before the
barrier has its result before it downstream, every row after it is read after it. Flink's
Async I/O instead *snapshots* its in-flight queue (the input rows of unfinished calls go into
the checkpoint, and are called again on restore), which lets a barrier pass without waiting
for slow calls. Here drain is enough: barriers are injected every second or so and calls take
milliseconds, so the wait is one call's latency at most (a timeout bounds it), and the actor
keeps no state — a restart needs nothing restored. A watermark is treated like a barrier, in
order: it promises no earlier rows follow, which holds only once every earlier row's result
was emitted.

**Exactly once.** After a crash the input since the last checkpoint is replayed, and the
output of those rows, which the failed epoch never committed, is produced again: the output
is exactly once. The *calls* are at least once — a call made before the crash for a row after
the checkpoint is made again — so ``fn`` must be safe to repeat (a lookup, an idempotent
write).

**Cancellation.** The calls run in a task group inside the actor: when the actor is cancelled
(the graph stops or fails) the calls in flight are cancelled with it; when one call fails for
good, the others are cancelled and the actor fails with that call's error alone (not a group
around it).
"""

from __future__ import annotations

import inspect
import math
import random
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, final

import anyio
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from barrierflow._backoff import MILLISECOND, RetryBackoff
from barrierflow._taskgroups import single_error
from barrierflow.channels.chunk import Chunk
from barrierflow.channels.errors import InvalidArgumentError, SchemaMismatchError
from barrierflow.channels.messages import Committable
from barrierflow.operators._operator import (
    Operator,
    OperatorActor,
    as_number,
    check_columns,
    refuse_changes,
)
from barrierflow.operators.errors import AsyncCallFailedError
from barrierflow.runtime.actor import ActorContext
from barrierflow.runtime.placement import Placement

__all__ = ["DEAD_LETTERS", "async_map"]

#: An ``async_map`` function of one row: the row's columns in, the output row's out.
RowFn = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
#: An ``async_map`` function of a batch (``batch_size=n``): up to n rows in, as many out.
BatchFn = Callable[[pa.RecordBatch], Awaitable[pa.RecordBatch]]

#: The side output of the rows whose calls failed, with ``dead_letters=True``.
DEAD_LETTERS = "dead_letters"
#: The columns a dead letter adds to its input row.
_DEAD_COLUMNS = (pa.field("error", pa.string()), pa.field("attempts", pa.int32()))


def async_map(
    fn: RowFn | BatchFn,
    *,
    schema: pa.Schema,
    concurrency: int = 16,
    ordered: bool = True,
    timeout: float = 30.0,
    retries: int = 3,
    batch_size: int | None = None,
    key: str | list[str] | tuple[str, ...] | None = None,
    dead_letters: bool = False,
    retry_delay: float = 0.01,
    max_retry_delay: float = 1.0,
) -> Operator:
    """Call ``fn`` for every row (or every ``batch_size`` rows), many at once; emit its results
    (see the module for order, ops, failures and barriers).

    Args:
        fn: ``async def fn(row: dict) -> dict`` (the output row, of ``schema``'s columns), or
            with ``batch_size`` ``async def fn(rows: pa.RecordBatch) -> pa.RecordBatch`` (as
            many rows, of ``schema``). It may be called again for the same row: after a
            failure, and after a crash (at-least-once calls).
        schema: the schema of the output rows.
        concurrency: calls in flight per actor, at most (and results awaiting their turn).
        ordered: emit in input order (``True``), or as results complete within an epoch.
        timeout: seconds one attempt may take (``math.inf``: no limit).
        retries: attempts after the first, for a call that raised or timed out.
        batch_size: call ``fn`` with batches of up to this many rows (``None``: one row).
        key: the column(s) naming a row in errors — the value of one, a tuple of several's
            (``None``: the row's position in its chunk); a failed batch call names the list
            of its rows'.
        dead_letters: send a row whose attempts are spent to the side output
            ``"dead_letters"`` instead of failing the actor.
        retry_delay: the backoff's first delay, in seconds (0: retry at once; else >= 1 ms).
        max_retry_delay: the backoff's cap, in seconds.

    Returns:
        A partition-local :class:`Operator` (any instance takes any row), declaring the side
        output ``"dead_letters"`` if asked.

    Raises:
        InvalidArgumentError: ``fn`` is not a coroutine function; ``schema`` not a Schema;
            ``concurrency`` not an int >= 1; ``ordered`` or ``dead_letters`` not a bool;
            ``timeout`` not a number > 0; ``retries`` not an int >= 0; ``batch_size`` not
            ``None`` or an int >= 1; ``key`` not ``None``, a column name or a list of them;
            ``retry_delay`` not 0 or a finite number >= 0.001; ``max_retry_delay`` not a
            finite number >= ``retry_delay``.
    """
    if not _is_coroutine_function(fn):
        expected = "an async function of a " + ("RecordBatch" if batch_size else "row dict")
        raise InvalidArgumentError("fn", expected, fn)
    if not isinstance(schema, pa.Schema):
        raise InvalidArgumentError("schema", "a pyarrow.Schema of the output rows", schema)
    if type(concurrency) is not int or concurrency < 1:
        raise InvalidArgumentError("concurrency", "an int >= 1", concurrency)
    for name, flag in (("ordered", ordered), ("dead_letters", dead_letters)):
        if not isinstance(flag, bool):
            raise InvalidArgumentError(name, "a bool", flag)
    seconds = as_number(timeout)
    if seconds is None or not seconds > 0:
        raise InvalidArgumentError("timeout", "a number of seconds > 0", timeout)
    if type(retries) is not int or retries < 0:
        raise InvalidArgumentError("retries", "an int >= 0", retries)
    if batch_size is not None and (type(batch_size) is not int or batch_size < 1):
        raise InvalidArgumentError("batch_size", "None or an int >= 1", batch_size)
    columns = None if key is None else check_columns("key", key)
    delay = as_number(retry_delay)
    if delay is None or not math.isfinite(delay) or not (delay == 0 or delay >= MILLISECOND):
        raise InvalidArgumentError("retry_delay", "0 or a finite number >= 0.001", retry_delay)
    cap = as_number(max_retry_delay)
    if cap is None or not math.isfinite(cap) or not cap >= delay:
        raise InvalidArgumentError(
            "max_retry_delay", f"a finite number >= retry_delay ({retry_delay})", max_retry_delay
        )
    settings = _Settings(
        fn=fn,
        schema=schema,
        concurrency=concurrency,
        ordered=ordered,
        timeout=seconds,
        retries=retries,
        batch_size=batch_size,
        key=columns,
        dead_letters=dead_letters,
        retry_delay=delay,
        max_retry_delay=cap,
    )
    return Operator(
        "async_map",
        Placement.PARTITION_LOCAL,
        lambda: _AsyncMap(settings),
        side_outputs=(DEAD_LETTERS,) if dead_letters else (),
    )


def _is_coroutine_function(fn: object) -> bool:
    """An ``async def`` function, a bound method or partial of one, or an object whose
    ``__call__`` is one."""
    if inspect.iscoroutinefunction(fn):
        return True
    # The type's: an instance's own ``__call__`` attribute is not what calling it runs.
    return not isinstance(fn, type) and inspect.iscoroutinefunction(type(fn).__call__)


@dataclass(frozen=True, slots=True)
class _Settings:
    """The arguments of one :func:`async_map`, checked (see there)."""

    fn: Callable[[Any], Awaitable[Any]]
    schema: pa.Schema
    concurrency: int
    ordered: bool
    timeout: float
    retries: int
    batch_size: int | None
    key: tuple[str, ...] | None
    dead_letters: bool
    retry_delay: float
    max_retry_delay: float


@final
class _Rows:
    """The visible rows of one input chunk that its calls share: the batch, its ops, where
    each row was in the chunk (for errors) and each call's argument (a row as a dict, or a
    slice of ``batch_size`` rows)."""

    __slots__ = ("arguments", "batch", "ops", "positions")

    def __init__(self, chunk: Chunk, batch_size: int | None) -> None:
        visible = chunk.compact()
        batch = self.batch = visible.batch
        self.ops: npt.NDArray[np.int8] | None = None if chunk.ops is None else visible.ops_numpy()
        mask = chunk.visibility
        self.positions: npt.NDArray[np.intp] | None = (
            None if mask is None else np.flatnonzero(np.asarray(mask))
        )
        self.arguments: list[Any] = (
            batch.to_pylist()
            if batch_size is None
            else [batch.slice(i, batch_size) for i in range(0, batch.num_rows, batch_size)]
        )

    def names(self, start: int, stop: int, key: tuple[str, ...] | None) -> list[Any]:
        """How errors name rows ``start:stop``: their key (a value for one column, a tuple
        for several), else their positions in the chunk."""
        if key is None:
            if self.positions is None:
                return list(range(start, stop))
            return [int(p) for p in self.positions[start:stop]]
        columns = [self.batch.column(c)[start:stop].to_pylist() for c in key]
        return columns[0] if len(columns) == 1 else list(zip(*columns, strict=True))


@dataclass(slots=True, eq=False)
class _Call:
    """One call: rows ``start:stop`` of ``rows`` and, once done, its result or failure."""

    rows: _Rows
    start: int
    stop: int
    #: What ``fn`` is called with: the row, or the slice of rows.
    argument: Any
    result: Any = None
    #: Set when the attempts were spent and the rows go to the dead letters.
    error: str | None = None
    attempts: int = 0
    done: bool = False


@final
class _AsyncMap(OperatorActor):
    kind: ClassVar[str] = "async_map"

    def __init__(self, settings: _Settings) -> None:
        super().__init__()
        self._s = settings
        self._rng = random.Random()
        # Calls started and not yet emitted, in input order (ordered mode), and the completed
        # ones awaiting the emitter (unordered mode).
        self._queue: deque[_Call] = deque()
        self._ready: list[_Call] = []
        # Calls started and not completed (retries and their waits included), and started
        # and not emitted (so ``_pending - _running`` results wait for the emitter).
        self._running = 0
        self._pending = 0
        # The rows of the chunk being read, from ``_next`` on not started yet (both set by
        # ``_read``, with the event set once the chunk's last call started).
        self._rows: _Rows | None = None
        self._next: int
        self._all_started: anyio.Event
        # Workers with nothing to do, each waiting for its event.
        self._parked: deque[anyio.Event] = deque()

    async def run(self, ctx: ActorContext) -> None:
        """Read, call, emit (see the module); barriers and watermarks after a drain."""
        self.started(ctx)
        self._wake = anyio.Event()  # a call completed: the emitter has work
        self._idle: anyio.Event | None = None  # set when the last pending call was emitted
        self._emitting = anyio.Lock()  # one task emits at a time
        self._first_failure: AsyncCallFailedError | None = None
        try:
            with single_error():
                async with anyio.create_task_group() as tg:
                    for _ in range(self._s.concurrency):
                        tg.start_soon(self._worker, ctx.name)
                    tg.start_soon(self._emitter, ctx)
                    async for message in ctx.messages(committables=True):
                        if isinstance(message, Chunk):
                            await self._read(message, ctx.name)
                            continue
                        if not isinstance(message, Committable):
                            await self._drain()  # a barrier or a watermark
                        async with self._emitting:
                            await ctx.emit(message)
                    await self._drain()
                    tg.cancel_scope.cancel()
        except BaseExceptionGroup:
            # Several calls ran out of retries at once (their workers raised before the
            # first one's cancellation reached them): the first to fail is the failure.
            if self._first_failure is None:
                raise
        else:
            return
        raise self._first_failure  # outside the handler: the group is not chained on

    async def _read(self, chunk: Chunk, actor: str) -> None:
        """Offer ``chunk``'s visible rows to the workers; return once every row's call has
        started, so that a full window stops the reading of input."""
        count = chunk.cardinality
        self.stats.rows_in += count
        if not count:
            return
        self._check_input(chunk, actor)
        self._rows, self._next = _Rows(chunk, self._s.batch_size), 0
        self._all_started = started = anyio.Event()
        self._unpark()
        await started.wait()

    def _take(self) -> _Call | None:
        """The next call to make, if a row waits and the window has room: fewer than
        ``concurrency`` calls running (one per worker) and fewer than ``concurrency``
        results waiting to be emitted."""
        rows = self._rows
        s = self._s
        if rows is None or self._pending - self._running >= s.concurrency:
            return None
        start = self._next
        count = rows.batch.num_rows
        step = s.batch_size or 1
        call = _Call(rows, start, min(start + step, count), rows.arguments[start // step])
        self._next = call.stop
        self._running += 1
        self._pending += 1
        if s.ordered:
            self._queue.append(call)
        if call.stop == count:
            self._rows = None
            self._all_started.set()
        return call

    def _unpark(self) -> None:
        """Wake as many idle workers as there are calls the window has room for."""
        rows = self._rows
        if rows is None:
            return
        step = self._s.batch_size or 1
        calls = -(-(rows.batch.num_rows - self._next) // step)
        room = self._s.concurrency - (self._pending - self._running)
        for _ in range(min(len(self._parked), calls, room)):
            self._parked.popleft().set()

    def _check_input(self, chunk: Chunk, actor: str) -> None:
        """Refuse input the settings cannot keep correct (see the module)."""
        s = self._s
        names = chunk.schema.names
        if s.key is not None and not set(s.key) <= set(names):
            missing = [c for c in s.key if c not in names]
            raise InvalidArgumentError(
                f"async_map {actor!r}: key", f"columns of the input {names}", missing
            )
        if s.dead_letters and any(f.name in names for f in _DEAD_COLUMNS):
            raise InvalidArgumentError(
                f"async_map {actor!r}: input",
                "no column named 'error' or 'attempts' (a dead letter adds them)",
                names,
            )
        if s.dead_letters or not s.ordered:
            why = "dead_letters=True" if s.dead_letters else "ordered=False"
            ops, visible = chunk.ops, chunk.visibility
            refuse_changes(
                ops if ops is None or visible is None else ops.filter(visible),
                actor,
                "async_map",
                f"an insert-only input with {why} (it would break the changelog)",
            )

    async def _worker(self, actor: str) -> None:
        """Make calls while rows wait and the window has room — a worker that completed a
        call starts the next at once, without an event-loop turn — else wait to be woken."""
        s = self._s
        while True:
            call = self._take()
            if call is None:
                parked = anyio.Event()
                self._parked.append(parked)
                await parked.wait()
                continue
            try:
                await self._call(call, actor)
            except AsyncCallFailedError as exc:
                if self._first_failure is None:
                    self._first_failure = exc
                raise
            self._running -= 1
            call.done = True
            if not s.ordered:
                self._ready.append(call)
            self._wake.set()

    async def _call(self, call: _Call, actor: str) -> None:
        """Call ``fn`` for ``call``'s rows with timeout and retries; keep the result, or the
        error for the dead letters, or fail."""
        s = self._s
        rows = call.rows
        argument = call.argument
        backoff: RetryBackoff | None = None  # made at the first failure: most calls have none
        stats = self.stats
        attempts = 0
        while True:
            attempts += 1
            stats.calls_in_flight += 1
            timed_out = False
            try:
                if s.timeout == math.inf:
                    # A cancel scope costs as much as the rest of a call's handling.
                    result = await s.fn(argument)
                else:
                    with anyio.move_on_after(s.timeout) as scope:
                        result = await s.fn(argument)
                    timed_out = scope.cancelled_caught
            except Exception as exc:
                cause: Exception = exc
            else:
                if not timed_out:
                    self._check_result(result, call, actor)
                    call.result = result
                    return
                stats.call_timeouts += 1
                cause = TimeoutError(f"no answer within {s.timeout} s")
            finally:
                stats.calls_in_flight -= 1
            if attempts > s.retries:
                break
            stats.call_retries += 1
            if backoff is None:
                backoff = RetryBackoff(s.retry_delay, s.max_retry_delay, self._rng)
            await anyio.sleep(backoff.failed())
        if not s.dead_letters:
            names = rows.names(call.start, call.stop, s.key)
            key = names[0] if s.batch_size is None else names
            raise AsyncCallFailedError(actor, key, attempts, cause) from cause
        call.error = f"{type(cause).__name__}: {cause}"
        call.attempts = attempts

    def _check_result(self, result: object, call: _Call, actor: str) -> None:
        """Fail at once on a result ``fn`` does not promise (a bug: never retried)."""
        s = self._s
        if s.batch_size is None:
            if not isinstance(result, dict):
                raise InvalidArgumentError(
                    f"async_map {actor!r}: fn's result", "a dict of the output's columns", result
                )
            return
        rows = call.stop - call.start
        if not isinstance(result, pa.RecordBatch) or result.num_rows != rows:
            got = f"{result.num_rows} rows" if isinstance(result, pa.RecordBatch) else result
            raise InvalidArgumentError(
                f"async_map {actor!r}: fn's result", f"a pyarrow.RecordBatch of {rows} rows", got
            )
        if not result.schema.equals(s.schema):
            raise SchemaMismatchError(f"async_map {actor!r}: fn's result", s.schema, result.schema)

    async def _emitter(self, ctx: ActorContext) -> None:
        """Emit completed calls whenever some complete (see :meth:`_emit_ready`)."""
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            await self._emit_ready(ctx)

    async def _emit_ready(self, ctx: ActorContext) -> None:
        """Emit what may go now — the completed prefix (ordered), or every completed call —
        then give their places in the window back."""
        if self._s.ordered:
            queue = self._queue
            calls: list[_Call] = []
            while queue and queue[0].done:
                calls.append(queue.popleft())
        else:
            calls, self._ready = self._ready, []
        if not calls:
            return
        async with self._emitting:
            await self._emit(calls, ctx)
        self._pending -= len(calls)
        self._unpark()
        if not self._pending and self._idle is not None:
            self._idle.set()

    async def _emit(self, calls: list[_Call], ctx: ActorContext) -> None:
        """One chunk of the calls' results to the main output, one of the failed calls' rows
        to the dead letters."""
        results = [c for c in calls if c.error is None]
        failed = [c for c in calls if c.error is not None]
        if results:
            batch = self._results(results, ctx.name)
            ops = None
            if any(c.rows.ops is not None for c in results):
                ops = np.concatenate([_ops(c) for c in results])
            self.stats.rows_out += batch.num_rows
            await ctx.emit(Chunk(batch, ops))
        if failed:
            dead = _dead_letters(failed)
            self.stats.dead_letters += dead.num_rows
            await ctx.emit(Chunk(dead), output=DEAD_LETTERS)

    def _results(self, calls: list[_Call], actor: str) -> pa.RecordBatch:
        """The calls' results as one batch of the output schema."""
        schema = self._s.schema
        if self._s.batch_size is not None:
            return pa.concat_batches([c.result for c in calls])
        try:
            return pa.RecordBatch.from_pylist([c.result for c in calls], schema=schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
            raise InvalidArgumentError(
                f"async_map {actor!r}: fn's results", f"rows of {schema.names}", str(exc)
            ) from exc

    async def _drain(self) -> None:
        """Wait until every call read so far was emitted."""
        if self._pending:
            self._idle = anyio.Event()
            await self._idle.wait()
            self._idle = None


def _ops(call: _Call) -> npt.NDArray[np.int8]:
    """The op codes of ``call``'s rows (all inserts for a chunk without ops)."""
    ops = call.rows.ops
    if ops is None:
        return np.zeros(call.stop - call.start, np.int8)
    return ops[call.start : call.stop]


def _dead_letters(calls: list[_Call]) -> pa.RecordBatch:
    """The failed calls' input rows with their ``error`` and ``attempts`` columns."""
    parts = []
    for call in calls:
        rows = call.rows.batch.slice(call.start, call.stop - call.start)
        count = rows.num_rows
        error, attempts = _DEAD_COLUMNS
        rows = rows.append_column(error, pa.array([call.error] * count))
        parts.append(rows.append_column(attempts, pa.array([call.attempts] * count, pa.int32())))
    return pa.concat_batches(parts)
