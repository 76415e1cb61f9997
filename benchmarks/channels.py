"""Benchmarks of the channel layer: one hop, a four-stage chain, hash dispatch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from barrierflow.channels import Chunk, HashDispatcher, VnodeBitmap, compute_vnodes, create_channel
from barrierflow.channels.vnode import vnode_owners
from benchmarks.harness import (
    Comparison,
    Settings,
    compare,
    make_record,
    median,
    paired_ratio,
    rounded,
    sampled,
    samples,
)

__all__ = ["BENCHMARKS"]

#: Capacity of the channel in the single-hop benchmark.
HOP_CAPACITY = 64
#: Rows per chunk, and channel capacity in messages, of the chain benchmark.
CHAIN_ROWS = 4096
CHAIN_CAPACITY = 16
CHAIN_STAGES = 4
#: Hash dispatch: outputs, rows per chunk, vnodes, capacity of each output channel.
DISPATCH_OUTPUTS = 4
DISPATCH_ROWS = 4096
DISPATCH_VNODES = 256
DISPATCH_CAPACITY = 16
DISPATCH_KEY = ("k",)

# A factory of (send, receive) ends: barrierflow's create_channel or anyio's stream factory.
ChannelFactory = Callable[[int], Any]


def _anyio_stream(capacity: int) -> Any:
    return anyio.create_memory_object_stream[Any](capacity)


def _barrierflow_channel(capacity: int) -> Any:
    return create_channel(capacity)


def _one_row_chunk() -> Chunk:
    return Chunk(pa.record_batch({"x": pa.array([1], pa.int64())}))


def _chunk_of(rows: int, seed: int) -> Chunk:
    rng = np.random.default_rng(seed)
    return Chunk(
        pa.record_batch(
            {
                "k": pa.array(rng.integers(0, 1 << 40, rows, dtype=np.int64)),
                "v": pa.array(rng.random(rows)),
                "w": pa.array(rng.integers(0, 1000, rows, dtype=np.int64)),
            }
        )
    )


# --- (a) one hop -------------------------------------------------------------------------------


def _hop(factory: ChannelFactory, message: Any) -> Callable[[int], Any]:
    async def run(n: int) -> None:
        tx, rx = factory(HOP_CAPACITY)
        received = 0

        async def produce() -> None:
            with tx:
                for _ in range(n):
                    await tx.send(message)

        async def consume() -> None:
            nonlocal received
            with rx:
                async for _ in rx:
                    received += 1

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            tg.start_soon(produce)
        if received != n:
            raise AssertionError(f"hop: sent {n} messages, received {received}")

    return run


def _channel_hop(settings: Settings, backend: str) -> dict[str, Any]:
    message = _one_row_chunk()

    async def main() -> Comparison:
        return await compare(
            _hop(_barrierflow_channel, message),
            _hop(_anyio_stream, message),
            budget=settings.budget,
            reps=settings.reps,
            start_n=1000,
        )

    result: Comparison = anyio.run(main, backend=backend)
    ours = result.per_unit("candidate", 1e6)
    theirs = result.per_unit("baseline", 1e6)
    return make_record(
        f"channel_hop_{backend}",
        median(ours),
        "us/message",
        median(theirs),
        "<= 1.0",
        details={
            "backend": backend,
            "capacity": HOP_CAPACITY,
            "messages_per_run": result.n,
            **sampled(ours, theirs),
            "baseline_impl": "anyio.create_memory_object_stream",
        },
    )


def channel_hop_asyncio(settings: Settings) -> dict[str, Any]:
    return _channel_hop(settings, "asyncio")


def channel_hop_trio(settings: Settings) -> dict[str, Any]:
    return _channel_hop(settings, "trio")


# --- (b) four-stage chain ----------------------------------------------------------------------


def _chain(factory: ChannelFactory, chunk: Chunk) -> Callable[[int], Any]:
    async def run(n: int) -> None:
        ends = [factory(CHAIN_CAPACITY) for _ in range(CHAIN_STAGES)]
        received_rows = 0

        async def produce(tx: Any) -> None:
            with tx:
                for _ in range(n):
                    await tx.send(chunk)

        async def forward(rx: Any, tx: Any) -> None:
            with rx, tx:
                async for m in rx:
                    await tx.send(m)

        async def consume(rx: Any) -> None:
            nonlocal received_rows
            with rx:
                async for m in rx:
                    received_rows += m.num_rows

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume, ends[-1][1])
            for i in range(CHAIN_STAGES - 1, 0, -1):
                tg.start_soon(forward, ends[i - 1][1], ends[i][0])
            tg.start_soon(produce, ends[0][0])
        if received_rows != n * chunk.num_rows:
            raise AssertionError(f"chain: sent {n * chunk.num_rows} rows, got {received_rows}")

    return run


def _chain_on(backend: str, settings: Settings, budget: float) -> Comparison:
    chunk = _chunk_of(CHAIN_ROWS, seed=1)

    async def main() -> Comparison:
        return await compare(
            _chain(_barrierflow_channel, chunk),
            _chain(_anyio_stream, chunk),
            budget=budget,
            reps=settings.reps,
            start_n=200,
        )

    result: Comparison = anyio.run(main, backend=backend)
    return result


def chain4_rows_per_s(settings: Settings) -> dict[str, Any]:
    # Most of the budget on asyncio (the reported figure), the rest on trio (details only).
    main = _chain_on("asyncio", settings, settings.budget * 0.6)
    trio = _chain_on("trio", settings, settings.budget * 0.4)
    ours, theirs = main.rate("candidate", CHAIN_ROWS), main.rate("baseline", CHAIN_ROWS)
    trio_ours, trio_theirs = trio.rate("candidate", CHAIN_ROWS), trio.rate("baseline", CHAIN_ROWS)
    return make_record(
        "chain4_rows_per_s",
        median(ours),
        "rows/s",
        median(theirs),
        ">= 100000000",
        goal_on="value",
        details={
            "backend": "asyncio",
            "stages": CHAIN_STAGES,
            "rows_per_chunk": CHAIN_ROWS,
            "capacity": CHAIN_CAPACITY,
            "chunks_per_run": main.n,
            **sampled(ours, theirs),
            "baseline_impl": "anyio.create_memory_object_stream",
            "trio": {
                "value": rounded(median(trio_ours)),
                "baseline": rounded(median(trio_theirs)),
                "ratio": rounded(median(trio_ours) / median(trio_theirs)),
                "chunks_per_run": trio.n,
                "samples": samples(trio_ours),
                "baseline_samples": samples(trio_theirs),
                "paired_ratio": paired_ratio(trio_ours, trio_theirs),
            },
        },
    )


# --- (c) hash dispatch to four outputs ---------------------------------------------------------


def _dispatch_candidate(bitmaps: list[VnodeBitmap], chunks: list[Chunk]) -> Callable[[int], Any]:
    async def run(n: int) -> None:
        ends = [create_channel[Any](DISPATCH_CAPACITY) for _ in range(DISPATCH_OUTPUTS)]
        dispatcher = HashDispatcher([tx for tx, _ in ends], bitmaps, DISPATCH_KEY)
        received_rows = [0] * DISPATCH_OUTPUTS

        async def drain(i: int, rx: Any) -> None:
            with rx:
                async for m in rx:
                    received_rows[i] += m.num_rows

        async with anyio.create_task_group() as tg:
            for i, (_, rx) in enumerate(ends):
                tg.start_soon(drain, i, rx)
            try:
                for j in range(n):
                    await dispatcher.dispatch(chunks[j % len(chunks)])
            finally:
                dispatcher.close()
        if sum(received_rows) != n * DISPATCH_ROWS:
            raise AssertionError(f"dispatch: sent {n * DISPATCH_ROWS}, got {sum(received_rows)}")

    return run


def _kernel(batch: pa.RecordBatch, owners: npt.NDArray[np.int16]) -> list[pa.RecordBatch]:
    """The bare routing work: vnodes, owner index, one argsort, one take, one slice per output."""
    dest = owners[compute_vnodes(batch, DISPATCH_KEY, DISPATCH_VNODES)]
    order = np.argsort(dest, kind="stable")
    bounds = np.zeros(DISPATCH_OUTPUTS + 1, dtype=np.int64)
    np.cumsum(np.bincount(dest, minlength=DISPATCH_OUTPUTS), out=bounds[1:])
    taken = batch.take(pa.array(order))
    return [
        taken.slice(int(bounds[i]), int(bounds[i + 1] - bounds[i])) for i in range(DISPATCH_OUTPUTS)
    ]


def _dispatch_baseline(owners: npt.NDArray[np.int16], chunks: list[Chunk]) -> Callable[[int], Any]:
    batches = [c.batch for c in chunks]

    async def run(n: int) -> None:
        rows = 0
        for j in range(n):
            for part in _kernel(batches[j % len(batches)], owners):
                rows += part.num_rows
        if rows != n * DISPATCH_ROWS:
            raise AssertionError(f"kernel: {n * DISPATCH_ROWS} rows in, {rows} out")

    return run


def _check_kernel_matches_route(
    bitmaps: list[VnodeBitmap], owners: npt.NDArray[np.int16], chunk: Chunk
) -> None:
    """The baseline must do the same work as the dispatcher: same parts, same rows."""
    ends = [create_channel[Any](1) for _ in range(DISPATCH_OUTPUTS)]
    routed = HashDispatcher([tx for tx, _ in ends], bitmaps, DISPATCH_KEY).route(chunk)
    for part, expected in zip(routed, _kernel(chunk.batch, owners), strict=True):
        got = pa.record_batch([], schema=chunk.schema) if part is None else part.batch
        if not got.equals(expected):
            raise AssertionError("the baseline kernel and HashDispatcher.route disagree")


def dispatch_hash4(settings: Settings) -> dict[str, Any]:
    bitmaps = VnodeBitmap.split(DISPATCH_OUTPUTS, DISPATCH_VNODES)
    owners = vnode_owners(bitmaps).astype(np.int16)
    chunks = [_chunk_of(DISPATCH_ROWS, seed) for seed in range(8)]
    _check_kernel_matches_route(bitmaps, owners, chunks[0])

    async def main() -> Comparison:
        return await compare(
            _dispatch_candidate(bitmaps, chunks),
            _dispatch_baseline(owners, chunks),
            budget=settings.budget,
            reps=settings.reps,
            start_n=20,
        )

    result: Comparison = anyio.run(main, backend="asyncio")
    ours = result.rate("candidate", DISPATCH_ROWS)
    theirs = result.rate("baseline", DISPATCH_ROWS)
    return make_record(
        "dispatch_hash4",
        median(ours),
        "rows/s",
        median(theirs),
        ">= 0.7",
        details={
            "backend": "asyncio",
            "outputs": DISPATCH_OUTPUTS,
            "rows_per_chunk": DISPATCH_ROWS,
            "columns": 3,
            "vnodes": DISPATCH_VNODES,
            "capacity": DISPATCH_CAPACITY,
            "chunks_per_run": result.n,
            **sampled(ours, theirs),
            "baseline_impl": "compute_vnodes + argsort + RecordBatch.take + 4 slices, no channel",
        },
    )


#: Every benchmark of this module, by name, in run order.
BENCHMARKS: dict[str, Callable[[Settings], dict[str, Any]]] = {
    "channel_hop_asyncio": channel_hop_asyncio,
    "channel_hop_trio": channel_hop_trio,
    "chain4_rows_per_s": chain4_rows_per_s,
    "dispatch_hash4": dispatch_hash4,
}
