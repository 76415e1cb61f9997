"""Fan-out: hash by vnode, broadcast, round-robin; barriers and watermarks to every output."""

from __future__ import annotations

from collections import Counter

import anyio
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from barrierflow.channels import (
    Barrier,
    BroadcastDispatcher,
    Chunk,
    Committable,
    Dispatcher,
    HashDispatcher,
    Message,
    Op,
    ReceiveChannel,
    RoundRobinDispatcher,
    VnodeBitmap,
    Watermark,
    compute_vnodes,
    create_channel,
)
from barrierflow.errors import DroppedOutputRowsError, InvalidArgumentError, VnodeOwnershipError
from barrierflow.testing import drain, rows_per_epoch
from barrierflow.testing.strategies import StreamSpec, message_streams

pytestmark = pytest.mark.anyio


async def run_dispatch(
    make: type[Dispatcher] | None, spec: StreamSpec, n_out: int, **kwargs: object
) -> tuple[Dispatcher, list[list[Message]]]:
    senders, receivers = [], []
    for i in range(n_out):
        tx, rx = create_channel[Message](4, name=f"out{i}")
        senders.append(tx)
        receivers.append(rx)
    dispatcher: Dispatcher = (
        make(senders, **kwargs) if make is not None else HashDispatcher(senders, **kwargs)  # type: ignore[arg-type]
    )
    outputs: list[list[Message]] = [[] for _ in range(n_out)]

    async def collect(rx: ReceiveChannel[Message], into: list[Message]) -> None:
        into.extend(await drain(rx))

    async with anyio.create_task_group() as tg:
        for rx, into in zip(receivers, outputs, strict=True):
            tg.start_soon(collect, rx, into)
        for message in spec.messages:
            await dispatcher.dispatch(message)
        dispatcher.close()
    return dispatcher, outputs


def visible_ids(messages: list[Message]) -> list[int]:
    out: list[int] = []
    for m in messages:
        if isinstance(m, Chunk):
            out.extend(m.compact().batch.column("id").to_pylist())
    return out


@given(spec=message_streams(with_masks=True, with_watermarks=True), n_out=st.integers(1, 5))
async def test_hash_dispatch_routes_every_visible_row_to_its_vnode_owner(
    spec: StreamSpec, n_out: int
) -> None:
    bitmaps = VnodeBitmap.split(n_out)
    _, outputs = await run_dispatch(None, spec, n_out, bitmaps=bitmaps, key_columns=["key"])
    # Every visible row to exactly one output ...
    expected = visible_ids(spec.messages)
    got = [i for out in outputs for i in visible_ids(out)]
    assert sorted(got) == sorted(expected)
    # ... the one owning its vnode, so all rows of a vnode land together ...
    for out, bitmap in zip(outputs, bitmaps, strict=True):
        for m in out:
            if isinstance(m, Chunk):
                vnodes = compute_vnodes(m.batch, ["key"])
                assert all(int(v) in bitmap for v in vnodes)
                assert m.visibility is None  # outputs receive compacted parts
    # ... in the order they came, and between the same two barriers.
    source_epochs = rows_per_epoch(spec.messages, "id")
    merged = [Counter[object]() for _ in source_epochs]
    for out in outputs:
        assert [m for m in out if isinstance(m, Barrier)] == spec.barriers
        for index, counter in enumerate(rows_per_epoch(out, "id")):
            merged[index].update(counter)
        ids = visible_ids(out)
        assert ids == sorted(ids)  # generated ids increase, so order is kept
    assert merged == source_epochs
    # Watermarks reach every output.
    watermarks = [m for m in spec.messages if isinstance(m, Watermark)]
    for out in outputs:
        assert [m for m in out if isinstance(m, Watermark)] == watermarks


async def test_update_pair_split_across_outputs_becomes_delete_insert() -> None:
    # Two outputs; keys chosen so that 0 and 1 land on different owners.
    bitmaps = VnodeBitmap.split(2)
    probe = pa.record_batch({"key": pa.array(range(64), pa.int64())})
    owner = [0 if int(v) < 128 else 1 for v in compute_vnodes(probe, ["key"])]
    k0 = owner.index(0)
    k1 = owner.index(1)
    batch = pa.record_batch(
        {"id": pa.array([0, 1, 2, 3], pa.int64()), "key": pa.array([k0, k1, k0, k0], pa.int64())}
    )
    ops = [Op.UPDATE_DELETE, Op.UPDATE_INSERT, Op.UPDATE_DELETE, Op.UPDATE_INSERT]
    spec = StreamSpec([Chunk(batch, ops)], [])
    _, outputs = await run_dispatch(None, spec, 2, bitmaps=bitmaps, key_columns=["key"])
    by_id = {}
    for out in outputs:
        for m in out:
            assert isinstance(m, Chunk)
            for i, op in zip(m.batch.column("id").to_pylist(), m.ops_numpy(), strict=True):
                by_id[i] = Op(int(op))
    # The split pair is now a plain delete and insert; the pair kept together stays an update.
    assert by_id == {0: Op.DELETE, 1: Op.INSERT, 2: Op.UPDATE_DELETE, 3: Op.UPDATE_INSERT}


async def test_update_pair_with_hidden_half_becomes_plain_op() -> None:
    batch = pa.record_batch({"id": pa.array([0, 1], pa.int64()), "key": pa.array([5, 5])})
    chunk = Chunk(batch, [Op.UPDATE_DELETE, Op.UPDATE_INSERT], np.array([False, True]))
    spec = StreamSpec([chunk], [])
    _, outputs = await run_dispatch(
        None, spec, 1, bitmaps=[VnodeBitmap.full()], key_columns=["key"]
    )
    (part,) = outputs[0]
    assert isinstance(part, Chunk)
    assert part.batch.column("id").to_pylist() == [1]
    assert part.ops_numpy().tolist() == [Op.INSERT]


@given(spec=message_streams(with_masks=True), n_out=st.integers(1, 4))
async def test_broadcast_sends_everything_to_every_output(spec: StreamSpec, n_out: int) -> None:
    _, outputs = await run_dispatch(BroadcastDispatcher, spec, n_out)
    for out in outputs:
        assert out == spec.messages


@given(spec=message_streams(), n_out=st.integers(1, 4))
async def test_round_robin_sends_whole_chunks_in_turn(spec: StreamSpec, n_out: int) -> None:
    _, outputs = await run_dispatch(RoundRobinDispatcher, spec, n_out)
    chunks = [m for m in spec.messages if isinstance(m, Chunk)]
    for i, out in enumerate(outputs):
        assert [m for m in out if isinstance(m, Chunk)] == chunks[i::n_out]
        assert [m for m in out if isinstance(m, Barrier)] == spec.barriers


async def test_hash_dispatch_rebalances_after_bitmap_update() -> None:
    bitmaps = VnodeBitmap.split(2)
    tx0, rx0 = create_channel[Message](8)
    tx1, rx1 = create_channel[Message](8)
    dispatcher = HashDispatcher([tx0, tx1], bitmaps, ["key"])
    batch = pa.record_batch({"key": pa.array(range(100), pa.int64())})
    dispatcher.update_bitmaps([VnodeBitmap.full(), VnodeBitmap.empty()])
    await dispatcher.dispatch(Chunk(batch))
    dispatcher.close()
    assert sum(m.num_rows for m in await drain(rx0) if isinstance(m, Chunk)) == 100
    assert await drain(rx1) == []


def test_hash_dispatch_rejects_bad_ownership() -> None:
    tx0, _ = create_channel[Message](1)
    tx1, _ = create_channel[Message](1)
    halves = VnodeBitmap.split(2)
    with pytest.raises(VnodeOwnershipError) as info:
        HashDispatcher([tx0, tx1], [halves[0], halves[0]], ["key"])
    assert info.value.overlapping == frozenset(range(128))
    assert info.value.missing == frozenset(range(128, 256))
    with pytest.raises(InvalidArgumentError) as wrong_count:
        HashDispatcher([tx0, tx1], [VnodeBitmap.full()], ["key"])
    assert wrong_count.value.argument == "bitmaps"
    with pytest.raises(InvalidArgumentError) as sizes:
        HashDispatcher([tx0, tx1], [VnodeBitmap.full(16), VnodeBitmap.empty(32)], ["key"])
    assert sizes.value.argument == "bitmaps"
    with pytest.raises(InvalidArgumentError) as keys:
        HashDispatcher([tx0, tx1], halves, [])
    assert keys.value.argument == "key_columns"
    with pytest.raises(InvalidArgumentError) as outputs:
        HashDispatcher([], [], ["key"])
    assert outputs.value.argument == "outputs"


async def test_hash_dispatch_rejects_chunk_without_key_column() -> None:
    tx, _rx = create_channel[Message](1)
    dispatcher = HashDispatcher([tx], [VnodeBitmap.full()], ["customer"])
    with pytest.raises(InvalidArgumentError) as info:
        await dispatcher.dispatch(Chunk(pa.record_batch({"key": [1]})))
    assert info.value.argument == "key_columns"
    assert info.value.got == "customer"


async def test_dropped_output_is_closed_and_gets_nothing_more() -> None:
    ends = [create_channel[Message](8) for _ in range(3)]
    dispatcher = RoundRobinDispatcher([tx for tx, _ in ends])
    dispatcher.drop_output(1)
    with pytest.raises(anyio.EndOfStream):
        ends[1][1].receive_nowait()  # closed: end of stream for its reader
    chunk = Chunk(pa.record_batch({"k": pa.array([1], pa.int64())}))
    for _ in range(4):
        await dispatcher.dispatch(chunk)
    await dispatcher.dispatch(Watermark("k", 1))
    assert [ends[i][1].statistics().buffered_messages for i in (0, 2)] == [3, 3]
    with pytest.raises(InvalidArgumentError):
        dispatcher.drop_output(7)


async def test_hash_dispatch_refuses_rows_for_a_dropped_output_with_vnodes() -> None:
    ends = [create_channel[Message](8) for _ in range(2)]
    dispatcher = HashDispatcher([tx for tx, _ in ends], VnodeBitmap.split(2), ["k"])
    dispatcher.drop_output(1)
    chunk = Chunk(pa.record_batch({"k": pa.array(range(100), pa.int64())}))
    stray = int(VnodeBitmap.split(2)[1].mask[compute_vnodes(chunk.batch, ["k"])].sum())
    assert 0 < stray < 100
    with pytest.raises(DroppedOutputRowsError) as info:
        await dispatcher.dispatch(chunk)
    assert (info.value.output, info.value.rows) == (1, stray)
    assert ends[0][1].statistics().buffered_messages == 0  # refused before any output got rows
    dispatcher.update_bitmaps([VnodeBitmap.full(), VnodeBitmap.empty()])
    await dispatcher.dispatch(chunk)
    assert ends[0][1].receive_nowait().num_rows == 100


@pytest.mark.parametrize("make", [BroadcastDispatcher, RoundRobinDispatcher, None])
async def test_a_committable_goes_to_one_live_output_never_copied_within_a_group(
    make: type[Dispatcher] | None,
) -> None:
    # Every output of a group is a writer of the same sink: a copy to each would be committed
    # once per writer. The first live output gets it, also after output 0 was dropped.
    senders, receivers = [], []
    for i in range(3):
        tx, rx = create_channel[Message](4, name=f"out{i}")
        senders.append(tx)
        receivers.append(rx)
    dispatcher = (
        make(senders)
        if make is not None
        else HashDispatcher(senders, VnodeBitmap.split(3, 8), ("k",))
    )
    first, second = Committable("sink", 1), Committable("sink", 2)
    await dispatcher.dispatch(first)
    dispatcher.drop_output(0)
    await dispatcher.dispatch(second)
    dispatcher.close()
    got = [await drain(rx) for rx in receivers]
    assert got == [[first], [second], []]


def _epochs_of_committables(messages: list[Message]) -> list[tuple[int, object]]:
    """Each committable's payload with the number of barriers before it."""
    barriers, found = 0, []
    for message in messages:
        if isinstance(message, Barrier):
            barriers += 1
        elif isinstance(message, Committable):
            found.append((barriers, message.payload))
    return found


@given(
    spec=message_streams(with_watermarks=True),
    n_out=st.integers(1, 4),
    places=st.lists(st.integers(0, 40), max_size=6),
    make=st.sampled_from(["hash", "round robin", "broadcast"]),
)
async def test_each_committable_reaches_one_output_in_the_epoch_it_was_sent_in(
    spec: StreamSpec, n_out: int, places: list[int], make: str
) -> None:
    # The rule the sink relies on: an epoch holds exactly the committables that arrived before
    # its barrier — so through a dispatcher each lands once, between the same barriers.
    messages: list[Message] = list(spec.messages)
    for number, place in enumerate(places):
        messages.insert(min(place, len(messages)), Committable("sink", number))
    sent = _epochs_of_committables(messages)
    kinds: dict[str, type[Dispatcher] | None] = {
        "hash": None, "round robin": RoundRobinDispatcher, "broadcast": BroadcastDispatcher,
    }  # fmt: skip
    _, outputs = await run_dispatch(
        kinds[make],
        StreamSpec(messages, spec.barriers),
        n_out,
        **(
            {}
            if kinds[make] is not None
            else {"bitmaps": VnodeBitmap.split(n_out), "key_columns": ["key"]}
        ),
    )
    received = [found for out in outputs for found in _epochs_of_committables(out)]
    assert sorted(received, key=lambda f: f[1]) == sorted(sent, key=lambda f: f[1])
