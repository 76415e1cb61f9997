"""Bounded channels: delivery, backpressure, row permits, close semantics, cancellation."""

from __future__ import annotations

import time

import anyio
import pyarrow as pa
import pytest
from anyio import wait_all_tasks_blocked
from anyio.lowlevel import checkpoint
from hypothesis import given
from hypothesis import strategies as st

from barrierflow.channels import Barrier, Chunk, EpochPair, Message, Watermark, create_channel
from barrierflow.channels.channel import COOPERATIVE_BUDGET
from barrierflow.errors import ChannelBrokenError, ChannelClosedError, ConfigError
from barrierflow.testing import drain

pytestmark = pytest.mark.anyio

BARRIER = Barrier(EpochPair(2 << 16, 1 << 16))


def chunk(rows: int, first: int = 0) -> Chunk:
    return Chunk(pa.record_batch({"id": pa.array(range(first, first + rows), pa.int64())}))


def ids(messages: list[Message]) -> list[int]:
    return [i for m in messages if isinstance(m, Chunk) for i in m.batch.column("id").to_pylist()]


@given(
    max_messages=st.integers(1, 8),
    max_rows=st.one_of(st.none(), st.integers(1, 50)),
    producers=st.lists(
        st.lists(st.tuples(st.integers(0, 30), st.integers(0, 3)), max_size=25),
        min_size=1,
        max_size=3,
    ),
    consumer_pauses=st.lists(st.integers(0, 3), max_size=50),
)
async def test_every_message_delivered_once_in_order(
    max_messages: int,
    max_rows: int | None,
    producers: list[list[tuple[int, int]]],
    consumer_pauses: list[int],
) -> None:
    # Each producer sends chunks of the drawn sizes, pausing a drawn number of scheduling
    # rounds between sends; the consumer pauses too. Speeds vary; delivery must not.
    tx, rx = create_channel[Message](max_messages, max_rows)
    expected: list[list[int]] = []

    async def produce(sender: object, script: list[tuple[int, int]], base: int) -> None:
        assert hasattr(sender, "send")
        with sender:  # type: ignore[attr-defined]
            next_id = base
            for rows, pause in script:
                for _ in range(pause):
                    await checkpoint()
                await sender.send(chunk(rows, next_id))
                next_id += rows
                await sender.send(BARRIER)

    received: list[Message] = []
    largest = max((rows for script in producers for rows, _ in script), default=0)
    async with anyio.create_task_group() as tg:
        for n, script in enumerate(producers):
            base = n * 10_000
            expected.append(list(range(base, base + sum(rows for rows, _ in script))))
            tg.start_soon(produce, tx.clone(), script, base)
        tx.close()
        pauses = iter(consumer_pauses)
        async for message in rx:
            received.append(message)
            for _ in range(next(pauses, 0)):
                await checkpoint()
            stats = rx.statistics()
            assert stats.buffered_messages <= max_messages
            if max_rows is not None:  # an oversized chunk may only ever be alone
                assert stats.buffered_rows <= max(max_rows, largest)

    got = ids(received)
    assert sorted(got) == sorted(i for seq in expected for i in seq)  # nothing lost or doubled
    for seq in expected:  # each producer's order kept
        mine = [i for i in got if seq and seq[0] <= i <= seq[-1]]
        assert mine == seq
    assert sum(isinstance(m, Barrier) for m in received) == sum(len(p) for p in producers)


async def test_sender_blocks_while_channel_is_full() -> None:
    tx, rx = create_channel[Message](2)
    tx.send_nowait(chunk(1))
    tx.send_nowait(chunk(1))
    done = anyio.Event()

    async def send_third() -> None:
        await tx.send(chunk(1, 2))
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(send_third)
        await wait_all_tasks_blocked()
        stats = tx.statistics()
        assert stats.tasks_waiting_send == 1
        assert stats.buffered_messages == 2
        assert not done.is_set()
        await wait_all_tasks_blocked()
        assert tx.statistics().tasks_waiting_send == 1  # still blocked: nothing was taken
        await rx.receive()
        await done.wait()
    stats = tx.statistics()
    assert stats.blocked_sends == 1
    assert stats.blocked_seconds > 0
    assert stats.buffered_messages == 2


async def test_waits_going_on_count_in_the_totals_as_they_go() -> None:
    # A sender parked on a full channel and a receiver parked on an empty one: their waits
    # grow in every snapshot while they last, and the snapshot after they end is not less
    # (the finished wait was counted as it went, not added whole at its end).
    full_tx, full_rx = create_channel[Message](1)
    full_tx.send_nowait(chunk(1))
    empty_tx, empty_rx = create_channel[Message](1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(full_tx.send, chunk(1, 1))
        tg.start_soon(empty_rx.receive)
        await wait_all_tasks_blocked()
        at = time.perf_counter()
        for tx, field in ((full_tx, "blocked_seconds"), (empty_tx, "receive_wait_seconds")):
            first = getattr(tx.statistics(at + 1.0), field)
            second = getattr(tx.statistics(at + 3.0), field)
            assert first >= 1.0  # the wait so far, though it has not ended
            assert second - first == pytest.approx(2.0)
        waited = full_tx.statistics(), empty_tx.statistics()
        await full_rx.receive()
        empty_tx.send_nowait(chunk(1))
    assert full_tx.statistics().blocked_seconds >= waited[0].blocked_seconds
    assert empty_tx.statistics().receive_wait_seconds >= waited[1].receive_wait_seconds
    assert full_tx.statistics().tasks_waiting_send == 0


async def test_chunk_waits_for_row_permits() -> None:
    tx, rx = create_channel[Message](10, max_rows=10)
    tx.send_nowait(chunk(8))
    with pytest.raises(anyio.WouldBlock):
        tx.send_nowait(chunk(5, 8))
    async with anyio.create_task_group() as tg:
        tg.start_soon(tx.send, chunk(5, 8))
        await wait_all_tasks_blocked()
        assert tx.statistics().tasks_waiting_send == 1
        assert tx.statistics().buffered_rows == 8
        first = await rx.receive()
        assert isinstance(first, Chunk)
        assert first.num_rows == 8
    assert tx.statistics().buffered_rows == 5


async def test_oversized_chunk_is_admitted_alone() -> None:
    tx, rx = create_channel[Message](10, max_rows=10)
    tx.send_nowait(chunk(25))  # larger than the whole capacity, channel empty: admitted
    assert tx.statistics().buffered_rows == 25
    with pytest.raises(anyio.WouldBlock):
        tx.send_nowait(chunk(1, 25))
    tx.send_nowait(BARRIER)  # barriers take no row permits
    assert (await rx.receive()).num_rows == 25  # type: ignore[union-attr]
    tx.send_nowait(chunk(1, 25))


async def test_barrier_never_overtakes_a_waiting_chunk() -> None:
    tx, rx = create_channel[Message](10, max_rows=10)
    tx.send_nowait(chunk(8))
    other = tx.clone()
    async with anyio.create_task_group() as tg:
        tg.start_soon(tx.send, chunk(5, 8))  # parks: needs 5 permits, 2 free
        await wait_all_tasks_blocked()
        tg.start_soon(other.send, BARRIER)  # room for a message, but must queue behind
        await wait_all_tasks_blocked()
        assert tx.statistics().tasks_waiting_send == 2
        received = [await rx.receive() for _ in range(3)]
    assert [type(m) for m in received] == [Chunk, Chunk, Barrier]
    assert ids(received) == list(range(13))


async def test_watermark_takes_no_row_permits() -> None:
    tx, _rx = create_channel[Message](3, max_rows=4)
    tx.send_nowait(chunk(4))
    tx.send_nowait(Watermark("ts", 1))
    assert tx.statistics().buffered_rows == 4


async def test_end_of_stream_after_every_clone_closes() -> None:
    tx, rx = create_channel[Message](4)
    clone = tx.clone()
    await tx.send(chunk(1))
    await tx.aclose()
    assert (await rx.receive()).num_rows == 1  # type: ignore[union-attr]
    with pytest.raises(anyio.WouldBlock):
        rx.receive_nowait()  # a clone is still open
    clone.close()
    with pytest.raises(anyio.EndOfStream):
        await rx.receive()


async def test_parked_receiver_sees_end_of_stream() -> None:
    tx, rx = create_channel[Message](4)
    async with anyio.create_task_group() as tg:

        async def receive() -> None:
            with pytest.raises(anyio.EndOfStream):
                await rx.receive()

        tg.start_soon(receive)
        await wait_all_tasks_blocked()
        tx.close()


async def test_send_after_receiver_gone_is_broken() -> None:
    tx, rx = create_channel[Message](4)
    await tx.send(chunk(1))
    rx.close()
    assert tx.statistics().buffered_messages == 0  # dropped with the last receiver
    with pytest.raises(ChannelBrokenError) as info:
        await tx.send(chunk(1))
    assert isinstance(info.value, anyio.BrokenResourceError)
    assert info.value.channel == "channel"


async def test_parked_sender_is_broken_when_receiver_closes() -> None:
    tx, rx = create_channel[Message](1, name="orders")
    tx.send_nowait(chunk(1))
    async with anyio.create_task_group() as tg:

        async def send() -> None:
            with pytest.raises(ChannelBrokenError) as info:
                await tx.send(chunk(1))
            assert info.value.channel == "orders"

        tg.start_soon(send)
        await wait_all_tasks_blocked()
        await rx.aclose()


async def test_using_a_closed_end_raises_closed() -> None:
    tx, rx = create_channel[Message](1)
    tx.close()
    tx.close()  # idempotent
    with pytest.raises(ChannelClosedError) as info:
        await tx.send(chunk(1))
    assert isinstance(info.value, anyio.ClosedResourceError)
    assert info.value.end == "send"
    with pytest.raises(ChannelClosedError):
        tx.clone()
    rx.close()
    with pytest.raises(ChannelClosedError) as info:
        await rx.receive()
    assert info.value.end == "receive"


async def test_cancelled_sender_enqueues_nothing_and_unblocks_the_queue() -> None:
    tx, rx = create_channel[Message](1)
    tx.send_nowait(chunk(1, 0))
    async with anyio.create_task_group() as tg:
        scope = anyio.CancelScope()

        async def doomed() -> None:
            with scope:
                await tx.send(chunk(1, 100))

        tg.start_soon(doomed)
        await wait_all_tasks_blocked()
        tg.start_soon(tx.send, chunk(1, 1))  # queued behind the doomed one
        await wait_all_tasks_blocked()
        scope.cancel()
        await wait_all_tasks_blocked()
        assert tx.statistics().tasks_waiting_send == 1
        tx_done = await rx.receive()
        assert ids([tx_done]) == [0]
        await wait_all_tasks_blocked()
    tx.close()
    assert ids(await drain(rx)) == [1]


async def test_cancelled_receiver_loses_no_message() -> None:
    tx, rx = create_channel[Message](4)
    other = rx.clone()
    async with anyio.create_task_group() as tg:
        scope = anyio.CancelScope()

        taken: list[Message] = []

        async def doomed() -> None:
            with scope:
                taken.append(await rx.receive())

        tg.start_soon(doomed)
        await wait_all_tasks_blocked()
        tx.send_nowait(chunk(1))  # wakes the doomed receiver ...
        scope.cancel()  # ... which is cancelled before it runs
    tx.close()
    # Either the receive completed before the cancellation landed, or the message is still
    # there for the other receiver: never both, never neither.
    assert ids(taken) + ids(await drain(other)) == [0]


async def test_each_message_goes_to_exactly_one_receiver_clone() -> None:
    tx, rx = create_channel[Message](2)
    got: list[list[Message]] = [[], []]

    async def consume(receiver: object, into: list[Message]) -> None:
        into.extend(await drain(receiver))  # type: ignore[arg-type]

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume, rx, got[0])
        tg.start_soon(consume, rx.clone(), got[1])
        async with tx:
            for i in range(100):
                await tx.send(chunk(1, i))
    assert sorted(ids(got[0]) + ids(got[1])) == list(range(100))


async def test_statistics_count_messages_rows_and_bytes() -> None:
    tx, rx = create_channel[Message](8, max_rows=100, name="stats")
    first, second = chunk(3), chunk(4, 3)
    await tx.send(first)
    await tx.send(BARRIER)
    await tx.send(second)
    stats = tx.statistics()
    assert stats.name == "stats"
    assert (stats.max_messages, stats.max_rows) == (8, 100)
    assert stats.messages_sent == 3
    assert stats.chunks_sent == 2
    assert stats.rows_sent == 7
    assert stats.bytes_sent == first.nbytes + second.nbytes
    assert stats.buffered_messages == 3
    assert stats.buffered_rows == 7
    assert (stats.open_send_channels, stats.open_receive_channels) == (1, 1)
    await rx.receive()
    assert rx.statistics().buffered_rows == 4
    with pytest.raises(AttributeError):
        stats.messages_sent = 0  # type: ignore[misc]


async def test_producer_that_never_blocks_still_lets_others_run() -> None:
    tx, rx = create_channel[Message](10_000)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        await checkpoint()
        before = ticks
        for i in range(COOPERATIVE_BUDGET * 4):
            await tx.send(chunk(1, i))
        assert ticks - before >= 3  # the producer yielded about once per budget
        tg.cancel_scope.cancel()
    assert rx.statistics().buffered_messages == COOPERATIVE_BUDGET * 4


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"max_messages": 0}, "max_messages"),
        ({"max_messages": -3}, "max_messages"),
        ({"max_messages": 1.5}, "max_messages"),
        ({"max_messages": 4, "max_rows": 0}, "max_rows"),
        ({"max_messages": 4, "max_rows": -1}, "max_rows"),
    ],
)
def test_bad_capacity_is_a_config_error(kwargs: dict[str, object], argument: str) -> None:
    with pytest.raises(ConfigError) as info:
        create_channel(**kwargs)  # type: ignore[arg-type]
    assert info.value.argument == argument
    assert "expected" in str(info.value)
    assert repr(kwargs[argument]) in str(info.value)


async def test_closing_an_end_fails_sends_parked_on_it_at_once() -> None:
    tx, rx = create_channel[Message](1)
    other = tx.clone()
    tx.send_nowait(chunk(1))
    async with anyio.create_task_group() as tg:

        async def parked_on_tx() -> None:
            with pytest.raises(ChannelClosedError):
                await tx.send(chunk(1, 1))

        tg.start_soon(parked_on_tx)
        await wait_all_tasks_blocked()
        tg.start_soon(other.send, chunk(1, 2))  # parked on another end: unaffected
        await wait_all_tasks_blocked()
        tx.close()
        await wait_all_tasks_blocked()
        assert tx.statistics().tasks_waiting_send == 1
        received = [await rx.receive(), await rx.receive()]
    assert ids(received) == [0, 2]


async def test_empty_chunks_are_counted_as_chunks() -> None:
    tx, _rx = create_channel[Message](2)
    await tx.send(chunk(0))
    stats = tx.statistics()
    assert (stats.messages_sent, stats.chunks_sent, stats.rows_sent) == (1, 1, 0)
