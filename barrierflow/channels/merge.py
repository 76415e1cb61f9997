"""Fan-in: several upstream streams merged into one, with barriers aligned.

Alignment is what keeps epochs consistent across a parallel graph: once an input delivers
barrier *e*, that input is not read again until every input has delivered *e*; then *e* is
emitted exactly once, after every chunk that preceded it on any input. Chunks of the same epoch
from different inputs interleave in arrival order; each input's own order is kept.

Rules a user can rely on:

* Barriers must agree: an input that delivers a barrier of another epoch than the one being
  aligned raises :class:`~barrierflow.errors.BarrierMisalignedError` naming both inputs and
  both epochs.
* Watermarks are per column: the merge emits ``min`` over the inputs' latest watermarks, and
  only when every live input has one for that column and the minimum has advanced.
* An input that ends (end of stream) leaves the merge: later barriers align over the inputs
  still live, a barrier being aligned completes if the ended input was the last one missing,
  and the ended input no longer holds watermarks back. The merged stream ends when every input
  has ended, and the merge then closes its output.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, final

import anyio

from barrierflow._taskgroups import single_error
from barrierflow.channels.barrier import Barrier
from barrierflow.channels.channel import ReceiveChannel, create_channel
from barrierflow.channels.endpoints import Receiver, Sender
from barrierflow.channels.errors import (
    BarrierMisalignedError,
    InvalidArgumentError,
    WatermarkTypeMismatchError,
)
from barrierflow.channels.messages import Message, Watermark

__all__ = ["AlignedMerge", "merge_aligned"]


class _Alignment:
    """The barrier currently being aligned and who has delivered it."""

    __slots__ = ("arrived", "barrier", "first_input", "released", "started")

    def __init__(self, barrier: Barrier, first_input: str) -> None:
        self.barrier = barrier
        self.first_input = first_input
        self.arrived = {first_input}
        self.released = anyio.Event()
        self.started = time.perf_counter()  # the first input's barrier arrived


@final
class AlignedMerge:
    """Merges named inputs into one output, aligning barriers (see the module docstring).

    Args:
        inputs: input name → receiver; names appear in errors.

    Raises:
        InvalidArgumentError: no inputs, or an input without ``receive()``.
    """

    def __init__(self, inputs: Mapping[str, Receiver[Message]]) -> None:
        if not isinstance(inputs, Mapping) or not inputs:
            raise InvalidArgumentError("inputs", "a non-empty mapping of name to receiver", inputs)
        for name, receiver in inputs.items():
            if not isinstance(name, str) or not isinstance(receiver, Receiver):
                raise InvalidArgumentError(
                    "inputs", "str names mapped to receivers", (name, receiver)
                )
        self._inputs = dict(inputs)
        self._live = set(self._inputs)
        self._aligning: _Alignment | None = None
        self._watermarks: dict[str, dict[str, Any]] = {}
        self._emitted_watermarks: dict[str, Any] = {}
        self._barriers_emitted = 0
        self._alignment_seconds = 0.0

    @property
    def alignment_seconds(self) -> float:
        """Seconds spent aligning barriers: from the first input's barrier to the last one's,
        summed (Flink's checkpoint alignment time)."""
        return self._alignment_seconds

    @property
    def live_inputs(self) -> frozenset[str]:
        """Inputs that have not ended yet."""
        return frozenset(self._live)

    @property
    def barriers_emitted(self) -> int:
        """How many aligned barriers have been emitted."""
        return self._barriers_emitted

    async def run(self, output: Sender[Message]) -> None:
        """Pump every input into ``output`` until all inputs end, then close ``output``.

        Raises:
            BarrierMisalignedError: two inputs delivered barriers of different epochs.
            ChannelBrokenError: the output's receiver went away.
            InvalidArgumentError: ``output`` has no ``send()`` and ``close()``.
            WatermarkTypeMismatchError: inputs sent watermarks of one column that cannot be
                compared.
        """
        if not isinstance(output, Sender):
            raise InvalidArgumentError("output", "a sender with send() and close()", output)
        try:
            with single_error():
                async with anyio.create_task_group() as tg:
                    for name, receiver in self._inputs.items():
                        tg.start_soon(
                            self._pump, name, receiver, output, name=f"merge input {name}"
                        )
        finally:
            output.close()

    async def _pump(self, name: str, receiver: Receiver[Message], output: Sender[Message]) -> None:
        while True:
            try:
                message = await receiver.receive()
            except anyio.EndOfStream:
                break
            if isinstance(message, Barrier):
                await self._arrive(name, message, output)
            elif isinstance(message, Watermark):
                await self._watermark(name, message, output)
            else:
                await output.send(message)
        await self._leave(name, output)

    async def _arrive(self, name: str, barrier: Barrier, output: Sender[Message]) -> None:
        alignment = self._aligning
        if alignment is None:
            alignment = self._aligning = _Alignment(barrier, name)
        elif barrier.epoch != alignment.barrier.epoch:
            raise BarrierMisalignedError(
                alignment.first_input, alignment.barrier.epoch.curr, name, barrier.epoch.curr
            )
        else:
            alignment.arrived.add(name)
        if alignment.arrived >= self._live:
            await self._release(alignment, output)
        else:
            # This input is not read again until every live input has delivered the barrier.
            await alignment.released.wait()

    async def _release(self, alignment: _Alignment, output: Sender[Message]) -> None:
        self._aligning = None
        self._alignment_seconds += time.perf_counter() - alignment.started
        await output.send(alignment.barrier)
        self._barriers_emitted += 1
        alignment.released.set()

    async def _watermark(self, name: str, watermark: Watermark, output: Sender[Message]) -> None:
        self._watermarks.setdefault(watermark.column, {})[name] = watermark.value
        await self._emit_watermark(watermark.column, output)

    async def _emit_watermark(self, column: str, output: Sender[Message]) -> None:
        values = self._watermarks.get(column, {})
        if not self._live or not self._live <= values.keys():
            return
        previous = self._emitted_watermarks.get(column)
        try:
            low = min(values[name] for name in self._live)
            advanced = previous is None or low > previous
        except TypeError as exc:
            # Each watermark is orderable on its own; inputs disagreeing on the type is a
            # protocol error of the stream, not a crash of the merge.
            raise WatermarkTypeMismatchError(
                column,
                {name: type(values[name]).__name__ for name in sorted(self._live)},
                None if previous is None else type(previous).__name__,
            ) from exc
        if advanced:
            self._emitted_watermarks[column] = low
            await output.send(Watermark(column, low))

    async def _leave(self, name: str, output: Sender[Message]) -> None:
        self._live.discard(name)
        alignment = self._aligning
        if alignment is not None and self._live and alignment.arrived >= self._live:
            await self._release(alignment, output)
        for column in list(self._watermarks):
            self._watermarks[column].pop(name, None)
            await self._emit_watermark(column, output)


@asynccontextmanager
async def merge_aligned(
    inputs: Mapping[str, Receiver[Message]],
    *,
    max_messages: int = 16,
    max_rows: int | None = None,
    name: str = "merge",
) -> AsyncIterator[ReceiveChannel[Message]]:
    """Run an :class:`AlignedMerge` in the background and yield the merged stream.

    The merge runs in a task group owned by this context; leaving the block cancels it if it
    is still running, and errors of the merge (a misaligned barrier) propagate out of it.

    Example::

        async with merge_aligned({"left": rx1, "right": rx2}) as merged:
            async for message in merged:
                ...
    """
    merge = AlignedMerge(inputs)
    tx, rx = create_channel[Message](max_messages, max_rows, name=name)
    with single_error():
        async with anyio.create_task_group() as tg:
            tg.start_soon(merge.run, tx, name=f"{name} pump")
            try:
                yield rx
            finally:
                rx.close()
                tg.cancel_scope.cancel()
