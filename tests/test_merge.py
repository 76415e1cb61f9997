"""Fan-in: barrier alignment, epoch mismatch, ended inputs, watermarks."""

from __future__ import annotations

from collections import Counter

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from barrierflow.channels import (
    Barrier,
    Chunk,
    EpochPair,
    Message,
    Watermark,
    create_channel,
    merge_aligned,
)
from barrierflow.channels.merge import AlignedMerge
from barrierflow.errors import BarrierMisalignedError, InvalidArgumentError
from barrierflow.testing import drain, rows_per_epoch
from barrierflow.testing.strategies import StreamSpec, aligned_streams, epoch_pairs

pytestmark = pytest.mark.anyio


class LoggedInput:
    """An input that records, in one shared log, every message the merge reads from it."""

    def __init__(self, name: str, messages: list[Message], log: list[tuple[str, Message]]):
        self.name = name
        self._messages = iter(messages)
        self._log = log

    async def receive(self) -> Message:
        await anyio.lowlevel.checkpoint()
        try:
            message = next(self._messages)
        except StopIteration:
            raise anyio.EndOfStream from None
        self._log.append((self.name, message))
        return message


@given(streams=aligned_streams(), capacity=st.integers(1, 4))
async def test_merge_aligns_barriers_and_keeps_every_row(
    streams: list[StreamSpec], capacity: int
) -> None:
    log: list[tuple[str, Message]] = []
    inputs = {f"in{i}": LoggedInput(f"in{i}", s.messages, log) for i, s in enumerate(streams)}
    async with merge_aligned(inputs, max_messages=capacity) as merged:
        out = await drain(merged)

    barriers = streams[0].barriers
    # Each barrier emitted exactly once, in order.
    assert [m for m in out if isinstance(m, Barrier)] == barriers
    # No input read past barrier e before every input delivered e.
    delivered: dict[int, set[str]] = {}
    for name, message in log:
        done = {e for e, names in delivered.items() if name in names}
        for epoch in done:
            assert delivered[epoch] == set(inputs), (
                f"{name} read past epoch {epoch} before {set(inputs) - delivered[epoch]}"
            )
        if isinstance(message, Barrier):
            delivered.setdefault(message.epoch.curr, set()).add(name)
    # Rows per epoch are the multiset union of the inputs' rows per epoch.
    expected = [Counter[object]() for _ in range(len(barriers) + 1)]
    for s in streams:
        for index, counter in enumerate(rows_per_epoch(s.messages, "id")):
            expected[index].update(counter)
    assert rows_per_epoch(out, "id") == expected
    # Each input's own order is kept.
    ids = [i for m in out if isinstance(m, Chunk) for i in m.batch.column("id").to_pylist()]
    for n in range(len(streams)):
        mine = [i for i in ids if n * 1_000_000 <= i < (n + 1) * 1_000_000]
        assert mine == sorted(mine)


async def test_epoch_mismatch_names_both_inputs_and_epochs() -> None:
    first, second = epoch_pairs(2)
    inputs = {
        "left": LoggedInput("left", [Barrier(first)], []),
        "right": LoggedInput("right", [Barrier(second)], []),
    }
    with pytest.raises(BarrierMisalignedError) as info:
        async with merge_aligned(inputs) as merged:
            await drain(merged)
    error = info.value
    assert {error.first_input, error.other_input} == {"left", "right"}
    by_input = {error.first_input: error.first_epoch, error.other_input: error.other_epoch}
    assert by_input == {"left": first.curr, "right": second.curr}
    assert str(second.curr) in str(error)
    assert str(first.curr) in str(error)


async def test_ended_input_leaves_the_alignment() -> None:
    one, two = epoch_pairs(2)
    # "short" ends after epoch one; "long" goes on alone and its barrier two still comes out.
    tx_long, rx_long = create_channel[Message](8)
    tx_short, rx_short = create_channel[Message](8)
    async with merge_aligned({"long": rx_long, "short": rx_short}) as merged:
        await tx_long.send(Barrier(one))
        await tx_short.send(Barrier(one))
        assert await merged.receive() == Barrier(one)
        await tx_long.send(Barrier(two))
        await anyio.wait_all_tasks_blocked()
        with pytest.raises(anyio.WouldBlock):  # still waiting for "short"
            merged.receive_nowait()
        tx_short.close()  # "short" ends: "long" was the only one left, so two completes
        assert await merged.receive() == Barrier(two)
        tx_long.close()
        assert await drain(merged) == []


async def test_watermark_is_the_minimum_over_inputs() -> None:
    tx_a, rx_a = create_channel[Message](8)
    tx_b, rx_b = create_channel[Message](8)
    async with merge_aligned({"a": rx_a, "b": rx_b}) as merged:
        await tx_a.send(Watermark("ts", 10))
        await anyio.wait_all_tasks_blocked()
        with pytest.raises(anyio.WouldBlock):  # b has no watermark yet
            merged.receive_nowait()
        await tx_b.send(Watermark("ts", 5))
        assert await merged.receive() == Watermark("ts", 5)
        await tx_b.send(Watermark("ts", 20))
        assert await merged.receive() == Watermark("ts", 10)
        tx_a.close()  # a no longer holds it back
        assert await merged.receive() == Watermark("ts", 20)
        tx_b.close()
        assert await drain(merged) == []


async def test_merge_closes_its_output_when_all_inputs_end() -> None:
    tx, rx = create_channel[Message](4)
    out_tx, out_rx = create_channel[Message](4)
    tx.close()
    merge = AlignedMerge({"only": rx})
    await merge.run(out_tx)
    with pytest.raises(anyio.EndOfStream):
        await out_rx.receive()
    assert merge.live_inputs == frozenset()


def test_merge_rejects_bad_inputs() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        AlignedMerge({})
    assert info.value.argument == "inputs"
    with pytest.raises(InvalidArgumentError):
        AlignedMerge({"x": object()})  # type: ignore[dict-item]


async def test_single_input_passes_through_unchanged() -> None:
    pair = EpochPair(2 << 16, 1 << 16)
    messages: list[Message] = [Chunk.from_pydict({"id": [1, 2]}), Barrier(pair)]
    async with merge_aligned({"only": LoggedInput("only", messages, [])}) as merged:
        assert await drain(merged) == messages
