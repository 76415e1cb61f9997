"""An at-least-once sink that prints rows: for looking at a stream while debugging.

**Not exactly-once.** Rows are printed as they are written, before their epoch is durable, so
after a crash the rows since the last checkpoint are printed again (the upstream replays
them). Use it to see what flows, never as a record of what was committed; for that use an
exactly-once table such as :class:`~barrierflow.connectors.ParquetTable`. It is a table like
the others (``add_sink(rt, "show", PrintSink(schema), input=...)``), with a committer that has
nothing to commit.

Each batch prints as one header line (epoch and row count) and up to ``max_rows`` rows as
``key=value`` pairs; printing is a per-row Python loop, which is fine for a debugging aid and
the reason this sink is not for production volumes.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import TextIO, final

import anyio.lowlevel
import pyarrow as pa

from barrierflow.actors.sinks.table import CommitMetadata, CommitOutcome, Committed, Manifest
from barrierflow.channels.errors import InvalidArgumentError

__all__ = ["NothingToCommit", "PrintSink", "PrintWriter"]


@final
class PrintSink:
    """A table that prints each written batch to ``out`` (default: standard output) as its
    writers receive it. At-least-once: its committer has nothing to commit.

    Args:
        schema: the schema of every batch.
        out: a text stream.
        max_rows: rows printed per batch (the rest are counted, not printed).
        prefix: starts every line (e.g. the sink's name).
    """

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
        if not isinstance(prefix, str):
            raise InvalidArgumentError("prefix", "a str", prefix)
        self._schema = schema
        self._out = out
        self.max_rows = max_rows
        self.prefix = prefix
        #: Rows printed (or counted) so far, and epochs staged, by every writer.
        self.rows = 0
        self.epochs = 0

    @property
    def schema(self) -> pa.Schema:
        """The schema of every batch."""
        return self._schema

    def print(self, line: str) -> None:
        """Print one line (with the prefix) to ``out``."""
        print(f"{self.prefix}{line}", file=self.out)

    @property
    def out(self) -> TextIO:
        """Where the lines go."""
        return self._out if self._out is not None else sys.stdout

    def writer(self, writer_id: str) -> PrintWriter:
        """Writer ``writer_id``: prints what it is given."""
        return PrintWriter(self, writer_id)

    def committer(self) -> NothingToCommit:
        """A committer with nothing to do: the rows were printed already."""
        return NothingToCommit()


@final
class PrintWriter:
    """One writer of a :class:`PrintSink`: prints each batch when it is written."""

    def __init__(self, table: PrintSink, writer_id: str) -> None:
        self._table = table
        self._writer = writer_id
        self._epoch: int | None = None

    @property
    def schema(self) -> pa.Schema:
        """The table's schema."""
        return self._table.schema

    async def open(self) -> None:
        """Nothing to open."""
        await anyio.lowlevel.checkpoint()

    async def begin(self, epoch: int) -> None:
        """Remember the epoch, for the header lines."""
        self._epoch = epoch
        await anyio.lowlevel.checkpoint()

    async def write(self, batch: pa.RecordBatch) -> None:
        """Print ``batch``: a header, then up to ``max_rows`` rows."""
        table = self._table
        table.rows += batch.num_rows
        table.print(f"epoch={self._epoch} rows={batch.num_rows}")
        for row in batch.slice(0, table.max_rows).to_pylist():
            table.print("  " + " ".join(f"{k}={v!r}" for k, v in row.items()))
        if batch.num_rows > table.max_rows:
            table.print(f"  ... {batch.num_rows - table.max_rows} more")
        await anyio.lowlevel.checkpoint()

    async def flush(self) -> None:
        """Flush ``out``."""
        self._table.out.flush()
        await anyio.lowlevel.checkpoint()

    async def stage(self, epoch: int) -> Manifest:
        """Flush; there is nothing to stage (an empty manifest)."""
        self._table.epochs += 1
        await self.flush()
        return Manifest(self._writer, epoch)

    async def discard(self, epoch: int) -> None:
        """Printed rows cannot be taken back; says so."""
        self._table.print(f"epoch={epoch} discarded (its rows above may be printed again)")
        await anyio.lowlevel.checkpoint()

    async def close(self) -> None:
        """Flush ``out``."""
        await self.flush()


@final
class NothingToCommit:
    """The committer of an at-least-once table whose writers publish as they write."""

    async def recover(self, pending: Mapping[int, CommitMetadata]) -> None:
        """Nothing staged, nothing to recover."""
        await anyio.lowlevel.checkpoint()

    async def prepare(self, epoch: int, manifests: Sequence[Manifest]) -> CommitMetadata | None:
        """Nothing to commit (``None``)."""
        await anyio.lowlevel.checkpoint()
        return None

    async def commit(self, epoch: int, metadata: CommitMetadata) -> CommitOutcome:
        """Never called: nothing was prepared (:class:`Committed` if it were)."""
        await anyio.lowlevel.checkpoint()
        return Committed()

    async def abort(self, epoch: int, metadata: CommitMetadata | None) -> None:
        """Nothing staged to delete."""
        await anyio.lowlevel.checkpoint()
