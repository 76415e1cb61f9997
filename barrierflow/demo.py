"""The demo pipeline: generated events → hash dispatch → 4 workers → aligned merge → check.

Until the Spark bridge lands this is the main job of ``make demo``: it exercises the channel
layer end to end and verifies what came out. A generator emits chunks of events
``(id, key, value)`` cut into epochs by barriers; a :class:`HashDispatcher` spreads them by
``key`` over four workers (each doubles ``value``, vectorized); an :class:`AlignedMerge` joins
the workers again; the sink counts rows per epoch and checks that every id arrived exactly
once and every barrier exactly once, in order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import anyio
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.channels import (
    Barrier,
    BarrierKind,
    Chunk,
    EpochClock,
    HashDispatcher,
    Message,
    ReceiveChannel,
    SendChannel,
    VnodeBitmap,
    create_channel,
    merge_aligned,
)
from barrierflow.errors import ConfigError

SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.int64()), ("value", pa.float64())])


@dataclass(frozen=True)
class DemoResult:
    """What the demo measured and verified."""

    backend: str
    rows_in: int
    rows_out: int
    duplicates: int
    epochs: int
    barriers_out: int
    seconds: float
    blocked_seconds: float

    @property
    def verified(self) -> bool:
        """Every row and every barrier exactly once."""
        return (
            self.rows_in == self.rows_out
            and self.duplicates == 0
            and self.barriers_out == self.epochs
        )

    def summary_line(self) -> str:
        """The machine-readable last line: ``VERIFIED ...`` or ``FAILED ...``."""
        word = "VERIFIED" if self.verified else "FAILED"
        return (
            f"{word} rows_in={self.rows_in} rows_out={self.rows_out} "
            f"duplicates={self.duplicates} epochs={self.epochs}"
        )


async def _generate(
    tx: SendChannel[Message], rows: int, chunk_rows: int, chunks_per_epoch: int
) -> int:
    clock = EpochClock()
    pair = clock.next_pair()
    epochs = 0
    rng = np.random.default_rng(7)
    for chunks, start in enumerate(range(0, rows, chunk_rows), start=1):
        n = min(chunk_rows, rows - start)
        ids = np.arange(start, start + n, dtype=np.int64)
        batch = pa.RecordBatch.from_arrays(
            [pa.array(ids), pa.array(rng.integers(0, 10_000, n)), pa.array(rng.random(n))],
            schema=SCHEMA,
        )
        await tx.send(Chunk(batch))
        if chunks % chunks_per_epoch == 0:
            kind = BarrierKind.CHECKPOINT if epochs % 4 == 3 else BarrierKind.BARRIER
            await tx.send(Barrier(pair, kind))
            epochs += 1
            pair = pair.advance(clock.next())
    await tx.send(Barrier(pair, BarrierKind.CHECKPOINT))
    return epochs + 1


async def _worker(rx: ReceiveChannel[Message], tx: SendChannel[Message]) -> None:
    with rx, tx:
        async for message in rx:
            if isinstance(message, Chunk):
                batch = message.batch
                doubled = pc.multiply(batch.column("value"), 2.0)
                message = Chunk(batch.set_column(2, "value", doubled), message.ops)
            await tx.send(message)


async def run_demo(
    rows: int = 2_000_000, chunk_rows: int = 4_096, chunks_per_epoch: int = 16, workers: int = 4
) -> DemoResult:
    """Run the pipeline once on the current backend and verify its output.

    Raises:
        ConfigError: a size is not a positive int.
    """
    for name, value in (
        ("rows", rows),
        ("chunk_rows", chunk_rows),
        ("chunks_per_epoch", chunks_per_epoch),
        ("workers", workers),
    ):
        if type(value) is not int or value < 1:
            raise ConfigError(name, "an int >= 1", value)
    source_tx, source_rx = create_channel[Message](16, 16 * chunk_rows, name="source")
    to_workers = [create_channel[Message](8, 8 * chunk_rows, name=f"w{i}") for i in range(workers)]
    from_workers = [create_channel[Message](8, name=f"w{i}-out") for i in range(workers)]
    dispatcher = HashDispatcher([tx for tx, _ in to_workers], VnodeBitmap.split(workers), ["key"])
    epochs = 0
    seen: list[np.ndarray] = []
    barriers_out = 0
    started = time.perf_counter()

    async def source() -> None:
        nonlocal epochs
        with source_tx:
            epochs = await _generate(source_tx, rows, chunk_rows, chunks_per_epoch)

    async def dispatch() -> None:
        with source_rx:
            async for message in source_rx:
                await dispatcher.dispatch(message)
        dispatcher.close()

    async with anyio.create_task_group() as tg:
        tg.start_soon(source)
        tg.start_soon(dispatch)
        for (_, rx), (tx, _) in zip(to_workers, from_workers, strict=True):
            tg.start_soon(_worker, rx, tx)
        inputs = {f"w{i}": rx for i, (_, rx) in enumerate(from_workers)}
        async with merge_aligned(inputs, max_messages=16) as merged:
            async for message in merged:
                if isinstance(message, Chunk):
                    seen.append(message.batch.column("id").to_numpy())
                elif isinstance(message, Barrier):
                    barriers_out += 1
    seconds = time.perf_counter() - started
    all_ids = np.concatenate(seen) if seen else np.zeros(0, np.int64)
    duplicates = int(len(all_ids) - len(np.unique(all_ids)))
    blocked = source_tx.statistics().blocked_seconds + sum(
        tx.statistics().blocked_seconds for tx, _ in to_workers
    )
    return DemoResult(
        backend=anyio_backend_name(),
        rows_in=rows,
        rows_out=len(all_ids),
        duplicates=duplicates,
        epochs=epochs,
        barriers_out=barriers_out,
        seconds=seconds,
        blocked_seconds=blocked,
    )


def anyio_backend_name() -> str:
    """The name of the running async backend (``asyncio`` or ``trio``)."""
    import sniffio

    return str(sniffio.current_async_library())
