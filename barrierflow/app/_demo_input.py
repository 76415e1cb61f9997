"""The demo's input: what a run was asked to produce, and the Parquet files that hold it.

A run records what it was asked for — rows, micro-batches and the table — in a small manifest
(``<workdir>/demo-run.json``) before it writes anything else. The input files are a pure
function of that manifest and the file's index (keys ``0 .. rows-1`` split evenly, shuffled
and given values by a generator seeded with the index), and each is written under a temporary
name and renamed into place, so a file either exists whole or not at all.

That is what makes ``--resume`` exact after a driver killed while it was still generating:
the files missing are written again, identical to what the first run would have written, and
the verification compares the table with what the manifest asked for, never with whatever
happens to be on disk.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from barrierflow._fs import fsync_path, write_atomically
from barrierflow.channels.errors import ConfigError

__all__ = [
    "MANIFEST",
    "SCHEMA",
    "TABLES",
    "RunManifest",
    "TableChoice",
    "complete_input",
    "file_name",
]

#: The events: a unique key (hash-dispatched, checked for duplicates) and a value.
SCHEMA = pa.schema([("key", pa.int64()), ("value", pa.float64())])
#: The manifest's file name, in the run's work directory.
MANIFEST = "demo-run.json"
TableChoice = Literal["iceberg", "delta", "postgres"]
#: The tables a run may write (``--table``); the first is a new run's default.
TABLES: tuple[TableChoice, ...] = ("iceberg", "delta", "postgres")
#: Bumped when the generated data changes, so a resume never mixes two generations.
_FORMAT = 1


@dataclass(frozen=True)
class RunManifest:
    """What a demo run was asked to produce; written once, when the run starts."""

    #: Events in the input (keys ``0 .. rows-1``).
    rows: int
    #: Input files, one per micro-batch.
    batches: int
    #: The generator's format (see ``_FORMAT``).
    format: int = _FORMAT
    #: The table the run writes (``"iceberg"``, ``"delta"`` or ``"postgres"``): a resume
    #: writes the same one.
    #: A manifest written before the choice existed has none and is an Iceberg run.
    table: TableChoice = "iceberg"

    def write(self, workdir: Path) -> None:
        """Record the manifest in ``workdir`` atomically (temporary file, fsync, rename)."""
        workdir.mkdir(parents=True, exist_ok=True)
        write_atomically(workdir / MANIFEST, json.dumps(asdict(self)).encode())

    @classmethod
    def read(cls, workdir: Path) -> RunManifest:
        """The manifest of the run started in ``workdir``.

        Raises:
            ConfigError: (argument ``resume``) no run was started there, or its manifest is
                unreadable or from another version of the demo.
        """
        path = workdir / MANIFEST
        try:
            fields = json.loads(path.read_text())
            manifest = cls(**fields)
        except FileNotFoundError:
            raise ConfigError(
                "resume", f"a previous run's state in {workdir}", "nothing there"
            ) from None
        except (ValueError, TypeError) as exc:
            raise ConfigError("resume", f"a readable {MANIFEST} in {workdir}", str(exc)) from exc
        if manifest.format != _FORMAT:
            raise ConfigError(
                "resume", f"a run started by this demo (format {_FORMAT})", manifest.format
            )
        if manifest.table not in TABLES:
            raise ConfigError("resume", f"a {MANIFEST} naming one of {TABLES}", manifest.table)
        return manifest

    def check_resume(self, rows: int | None, batches: int | None, table: str | None = None) -> None:
        """Refuse a ``--resume`` that asks for another run than the one started.

        Raises:
            ConfigError: (argument ``rows``, ``batches`` or ``table``) a value given differs
                from the manifest's (resuming an Iceberg run into a Delta table would
                commit its remaining batches into a second table).
        """
        for name, given, started in (
            ("rows", rows, self.rows),
            ("batches", batches, self.batches),
            ("table", table, self.table),
        ):
            if given is not None and given != started:
                raise ConfigError(
                    name, f"{started}, as the run being resumed (or leave it out)", given
                )


def file_name(index: int) -> str:
    """The input file of micro-batch ``index``; sorted names are in batch order."""
    return f"part-{index:05d}.parquet"


def complete_input(directory: Path, manifest: RunManifest) -> int:
    """Write the input files of ``manifest`` that are missing; returns how many were written.

    Files already there are whole (they were renamed into place) and identical to what this
    call would write, so they are kept; temporary files left by a killed run are removed.
    """
    directory.mkdir(parents=True, exist_ok=True)
    for leftover in directory.glob(".*.tmp"):
        leftover.unlink()
    bounds = np.linspace(0, manifest.rows, manifest.batches + 1, dtype=np.int64)
    written = 0
    for index in range(manifest.batches):
        target = directory / file_name(index)
        if target.exists():
            continue
        table = _generate(int(bounds[index]), int(bounds[index + 1]), index)
        temporary = directory / f".{target.name}.tmp"
        pq.write_table(table, temporary)
        fsync_path(temporary)
        temporary.rename(target)
        fsync_path(directory)
        written += 1
    return written


def _generate(start: int, stop: int, index: int) -> pa.Table:
    """File ``index``'s events: keys ``start .. stop-1`` shuffled, with random values — the
    same every time for the same arguments."""
    rng = np.random.default_rng([7, index])
    keys = rng.permutation(np.arange(start, stop, dtype=np.int64))
    return pa.table({"key": keys, "value": rng.random(len(keys))}, schema=SCHEMA)
