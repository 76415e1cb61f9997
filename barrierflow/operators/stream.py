"""The fluent stream API: ``Stream(rt, "events").map_batches(f).filter(p).key_by("user")
.aggregate(total=("clicks", "sum"))`` declares one actor per step on a runtime (or a job).

A :class:`Stream` names the output of one declared actor — or one of its side outputs,
``stream.side("late")`` — and each method declares an operator reading it and returns the
operator's stream; nothing runs until the runtime starts. The methods are the operator factories
of :mod:`barrierflow.operators` declared with ``add_actor``, so everything a stream does can be
written with ``rt.add_actor(name, map_batches(f), inputs=[...])`` as well, and mixed with a
user's own :class:`~barrierflow.runtime.StreamActor` (:meth:`Stream.apply`).

**Names.** Every step is an actor, and an actor's name is what its state and its place in a
checkpoint are kept under. ``name=`` names a step; without it the step is named after its
upstream and its kind (``events.map_batches``, then ``events.map_batches_2`` for a second one):
deterministic for one program, but a keyed step (an aggregate, a window) whose state must
survive an edit of the program should be named.

**Parallelism.** ``parallelism=N`` runs N instances: a partition-local step (map, filter,
async_map) is fed round robin, a keyed one by hash of its key (``key_by``), as the operator
declares (:mod:`barrierflow.runtime.placement`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Protocol, final

import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.operators._accumulators import CombineFn
from barrierflow.operators._operator import check_columns
from barrierflow.operators._windows import Duration
from barrierflow.operators.aggregate import aggregate, reduce
from barrierflow.operators.async_map import BatchFn as AsyncBatchFn
from barrierflow.operators.async_map import RowFn, async_map
from barrierflow.operators.transform import (
    BatchFn,
    MaskFn,
    changelog_rows,
    filter_rows,
    map_batches,
)
from barrierflow.operators.watermarks import with_watermark
from barrierflow.operators.window import Sliding, Tumbling, window_aggregate
from barrierflow.runtime.actor import StreamActor

__all__ = ["KeyedStream", "Stream", "WindowedStream"]


class _Declares(Protocol):
    """What a stream declares its steps on: a :class:`~barrierflow.runtime.Runtime` or a
    :class:`~barrierflow.runtime.Job`."""

    def add_actor(
        self,
        name: str,
        actor: Callable[..., StreamActor],
        *,
        inputs: Sequence[str] | Mapping[str, str],
        parallelism: int | None = None,
        key: Sequence[str] | None = None,
    ) -> Any: ...

    def name_in_use(self, name: str) -> bool: ...


def _check_target(target: object) -> _Declares:
    if not callable(getattr(target, "add_actor", None)) or not callable(
        getattr(target, "name_in_use", None)
    ):
        raise InvalidArgumentError("target", "a Runtime or a Job", target)
    return target  # type: ignore[return-value]


@final
class Stream:
    """The output of the declared actor ``name`` of ``target`` (a Runtime or a Job), or its
    side output ``name:output`` (see the module).

    Raises:
        InvalidArgumentError: ``target`` is neither a Runtime nor a Job, or ``name`` is not a
            non-empty str.
    """

    __slots__ = ("_name", "_target")

    def __init__(self, target: Any, name: str) -> None:
        self._target = _check_target(target)
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError("name", "the name of a declared actor", name)
        self._name = name

    @property
    def name(self) -> str:
        """What a downstream names as its input (``add_sink(..., input=stream.name)``)."""
        return self._name

    def __repr__(self) -> str:
        return f"Stream({self._name!r})"

    # Declaring the next step.

    def step_name(self, name: str | None, kind: str) -> str:
        """``name``, or the name a step of ``kind`` reading this stream gets without one: its
        upstream's and its kind's, numbered if taken (see the module).

        Raises:
            InvalidArgumentError: ``name`` is neither ``None`` nor a non-empty str.
        """
        if name is not None:
            if not isinstance(name, str) or not name:
                raise InvalidArgumentError("name", "None or a non-empty actor name", name)
            return name
        base = f"{self._name.replace(':', '.')}.{kind}"
        candidate, n = base, 1
        while self._target.name_in_use(candidate):
            n += 1
            candidate = f"{base}_{n}"
        return candidate

    def apply(
        self,
        name: str,
        actor: Callable[..., StreamActor],
        *,
        parallelism: int | None = None,
        key: Sequence[str] | None = None,
    ) -> Stream:
        """Declare ``actor`` (a factory: an operator, a :class:`StreamActor` class or a
        function returning one) reading this stream, as ``add_actor`` does; its stream."""
        self._target.add_actor(name, actor, inputs=[self._name], parallelism=parallelism, key=key)
        return Stream(self._target, name)

    def map_batches(
        self,
        fn: BatchFn,
        *,
        schema: pa.Schema | None = None,
        name: str | None = None,
        parallelism: int | None = None,
    ) -> Stream:
        """A vectorized map (:func:`~barrierflow.operators.map_batches`)."""
        step = map_batches(fn, schema=schema)
        return self.apply(self.step_name(name, "map_batches"), step, parallelism=parallelism)

    def filter(
        self,
        predicate: pc.Expression | MaskFn,
        *,
        name: str | None = None,
        parallelism: int | None = None,
    ) -> Stream:
        """Keep the rows where ``predicate`` holds (:func:`~barrierflow.operators.filter_rows`)."""
        step = filter_rows(predicate)
        return self.apply(self.step_name(name, "filter"), step, parallelism=parallelism)

    def changelog_rows(
        self,
        column: str = "op",
        *,
        name: str | None = None,
        parallelism: int | None = None,
    ) -> Stream:
        """The changelog as plain rows with its ops in ``column``
        (:func:`~barrierflow.operators.changelog_rows`)."""
        step = changelog_rows(column)
        return self.apply(self.step_name(name, "changelog_rows"), step, parallelism=parallelism)

    def async_map(
        self,
        fn: RowFn | AsyncBatchFn,
        *,
        schema: pa.Schema,
        concurrency: int = 16,
        ordered: bool = True,
        timeout: float = 30.0,
        retries: int = 3,
        batch_size: int | None = None,
        key: str | list[str] | tuple[str, ...] | None = None,
        dead_letters: bool = False,
        name: str | None = None,
        parallelism: int | None = None,
    ) -> Stream:
        """Many calls of an async function in flight, results exactly once
        (:func:`~barrierflow.operators.async_map`); ``stream.side("dead_letters")`` reads the
        rows whose calls failed, with ``dead_letters=True``."""
        step = async_map(
            fn,
            schema=schema,
            concurrency=concurrency,
            ordered=ordered,
            timeout=timeout,
            retries=retries,
            batch_size=batch_size,
            key=key,
            dead_letters=dead_letters,
        )
        return self.apply(self.step_name(name, "async_map"), step, parallelism=parallelism)

    def with_watermark(
        self,
        column: str,
        *,
        delay: Duration,
        name: str | None = None,
        parallelism: int | None = None,
    ) -> Stream:
        """Watermarks on ``column``, ``delay`` behind the newest row
        (:func:`~barrierflow.operators.with_watermark`)."""
        step = with_watermark(column, delay=delay)
        return self.apply(self.step_name(name, "with_watermark"), step, parallelism=parallelism)

    def key_by(self, *columns: str) -> KeyedStream:
        """This stream keyed by ``columns``: what keyed steps (aggregate, reduce, windows)
        read. Declares nothing by itself.

        Raises:
            InvalidArgumentError: no columns, or a column that is not a non-empty str.
        """
        return KeyedStream(self, check_columns("columns", list(columns)))

    def side(self, output: str) -> Stream:
        """This step's side output ``output`` (``"late"``, ``"dead_letters"``), as a stream.

        Raises:
            InvalidArgumentError: ``output`` is not a non-empty name, or this is already a
                side output.
        """
        if not isinstance(output, str) or not output or ":" in output:
            raise InvalidArgumentError("output", "a side output's name", output)
        if ":" in self._name:
            raise InvalidArgumentError("output", "a side output of a step", self._name)
        return Stream(self._target, f"{self._name}:{output}")


@final
class KeyedStream:
    """A stream keyed by columns (:meth:`Stream.key_by`): keyed steps read it, each instance
    owning the keys of its vnodes."""

    __slots__ = ("_key", "_stream")

    def __init__(self, stream: Stream, key: tuple[str, ...]) -> None:
        self._stream = stream
        self._key = key

    @property
    def key(self) -> tuple[str, ...]:
        """The key columns."""
        return self._key

    @property
    def stream(self) -> Stream:
        """The stream before keying."""
        return self._stream

    def __repr__(self) -> str:
        return f"KeyedStream({self._stream.name!r}, key={list(self._key)})"

    def aggregate(
        self,
        *,
        name: str | None = None,
        parallelism: int | None = None,
        schema: pa.Schema | None = None,
        **aggregations: tuple[str, str],
    ) -> Stream:
        """Aggregate each key's rows, emitted as a changelog and kept as a view
        (:func:`~barrierflow.operators.aggregate`): ``.aggregate(total=("clicks", "sum"))``."""
        step = aggregate(self._key, schema=schema, **aggregations)
        return self._stream.apply(
            self._stream.step_name(name, "aggregate"), step, parallelism=parallelism
        )

    def reduce(
        self,
        fn: CombineFn,
        *,
        name: str | None = None,
        parallelism: int | None = None,
        schema: pa.Schema | None = None,
    ) -> Stream:
        """Fold each key's rows with a vectorized ``fn(acc, rows)``
        (:func:`~barrierflow.operators.reduce`)."""
        step = reduce(self._key, fn, schema=schema)
        return self._stream.apply(
            self._stream.step_name(name, "reduce"), step, parallelism=parallelism
        )

    def window(
        self,
        window: Tumbling | Sliding,
        *,
        on: str,
        allowed_lateness: Duration = 0,
        late: Literal["drop", "output"] = "drop",
    ) -> WindowedStream:
        """Event-time windows of each key on column ``on``, closed by watermarks; aggregate
        them with :meth:`WindowedStream.aggregate`. Declares nothing by itself."""
        return WindowedStream(self, window, on, allowed_lateness, late)


@final
class WindowedStream:
    """A keyed stream cut into event-time windows (:meth:`KeyedStream.window`)."""

    __slots__ = ("_keyed", "_late", "_lateness", "_on", "_window")

    def __init__(
        self,
        keyed: KeyedStream,
        window: Tumbling | Sliding,
        on: str,
        allowed_lateness: Duration,
        late: Literal["drop", "output"],
    ) -> None:
        self._keyed = keyed
        self._window = window
        self._on = on
        self._lateness = allowed_lateness
        self._late = late

    def __repr__(self) -> str:
        return f"WindowedStream({self._keyed!r}, {self._window!r}, on={self._on!r})"

    def aggregate(
        self,
        *,
        name: str | None = None,
        parallelism: int | None = None,
        schema: pa.Schema | None = None,
        **aggregations: tuple[str, str],
    ) -> Stream:
        """Aggregate each key's window, emitted when a watermark closes it
        (:func:`~barrierflow.operators.window_aggregate`); with ``late="output"``,
        ``stream.side("late")`` reads the rows beyond the allowed lateness."""
        keyed = self._keyed
        step = window_aggregate(
            keyed.key,
            self._window,
            on=self._on,
            allowed_lateness=self._lateness,
            late=self._late,
            schema=schema,
            **aggregations,
        )
        stream = keyed.stream
        return stream.apply(stream.step_name(name, "window"), step, parallelism=parallelism)
