"""An at-least-once sink that prints rows: for looking at a stream while debugging.

**Not exactly-once.** Rows are printed as they are written, before their epoch is durable, so
after a crash the rows since the last checkpoint are printed again (the upstream replays
them). Use it to see what flows, never as a record of what was committed; for that use an
exactly-once sink such as :class:`~barrierflow.connectors.parquet_sink.ParquetFileSink`.

Each batch prints as one header line (epoch and row count) and up to ``max_rows`` rows as
``key=value`` pairs; printing is a per-row Python loop, which is fine for a debugging aid and
the reason this sink is not for production volumes.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TextIO, final

import anyio.lowlevel
import pyarrow as pa

from barrierflow.actors.sinks.protocol import CommitMetadata, PendingCommit
from barrierflow.channels.errors import InvalidArgumentError

__all__ = ["PrintSink"]


@final
class PrintSink:
    """Prints each written batch to ``out`` (default: standard output). At-least-once.

    Args:
        schema: the schema of every batch.
        out: a text stream.
        max_rows: rows printed per batch (the rest are counted, not printed).
        prefix: starts every line (e.g. the sink's name).
    """

    exactly_once = False

    def __init__(
        self,
        schema: pa.Schema,
        *,
        out: TextIO | None = None,
        max_rows: int = 20,
        prefix: str = "",
    ) -> None:
        if not isinstance(schema, pa.Schema):
            raise InvalidArgumentError("schema", "a pyarrow.Schema", type(schema).__name__)
        if type(max_rows) is not int or max_rows < 0:
            raise InvalidArgumentError("max_rows", "an int >= 0", max_rows)
        self._schema = schema
        self._out = out
        self._max_rows = max_rows
        self._prefix = prefix
        self._epoch: int | None = None
        #: Rows printed (or counted) so far, and epochs seen through pre-commit.
        self.rows = 0
        self.epochs = 0

    @property
    def schema(self) -> pa.Schema:
        """The schema of every batch."""
        return self._schema

    def _print(self, line: str) -> None:
        out = self._out if self._out is not None else sys.stdout
        print(f"{self._prefix}{line}", file=out)

    async def open(self) -> None:
        """Nothing to open."""
        await anyio.lowlevel.checkpoint()

    async def recover(self, pending: Sequence[PendingCommit]) -> None:
        """Nothing to recover: rows since the last checkpoint will simply be printed again."""
        await anyio.lowlevel.checkpoint()

    async def begin_epoch(self, epoch: int) -> None:
        """Remember the epoch, for the header lines."""
        self._epoch = epoch
        await anyio.lowlevel.checkpoint()

    async def write_batch(self, batch: pa.RecordBatch) -> None:
        """Print ``batch``: a header, then up to ``max_rows`` rows."""
        self.rows += batch.num_rows
        self._print(f"epoch={self._epoch} rows={batch.num_rows}")
        for row in batch.slice(0, self._max_rows).to_pylist():
            self._print("  " + " ".join(f"{k}={v!r}" for k, v in row.items()))
        if batch.num_rows > self._max_rows:
            self._print(f"  ... {batch.num_rows - self._max_rows} more")
        await anyio.lowlevel.checkpoint()

    async def flush(self) -> None:
        """Flush ``out``."""
        out = self._out if self._out is not None else sys.stdout
        out.flush()
        await anyio.lowlevel.checkpoint()

    async def pre_commit(self, epoch: int) -> CommitMetadata:
        """Flush; there is nothing to stage."""
        self.epochs += 1
        await self.flush()
        return {"epoch": epoch}

    async def commit_epoch(self, epoch: int) -> None:
        """Nothing to publish: the rows were printed already."""
        await anyio.lowlevel.checkpoint()

    async def rollback_epoch(self, epoch: int) -> None:
        """Printed rows cannot be taken back; says so."""
        self._print(f"epoch={epoch} rolled back (its rows above may be printed again)")
        await anyio.lowlevel.checkpoint()

    async def close(self) -> None:
        """Flush ``out``."""
        await self.flush()
