"""Connectors for the crash conformance tests, made by module-level factories: the suite's
child processes import these by name (``_conformance_connectors:parquet_sink``; ``tests/`` is
on ``sys.path``, which the suite hands its children).

Every factory reaches the directory named by :data:`STORAGE_ENV`, which the test sets: the
parent and its children see the same environment, so the same storage.

:class:`JsonDirSink` is a small exactly-once connector over JSON files; each subclass breaks
the contract in one way a crash reveals.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds

from barrierflow.actors.sinks.protocol import CommitMetadata, PendingCommit
from barrierflow.connectors import ParquetFileSink
from barrierflow.testing.sinks import ListSink

#: The environment variable naming the storage directory of every factory here.
STORAGE_ENV = "BARRIERFLOW_CONFORMANCE_STORAGE"

SCHEMA = pa.schema([("id", pa.int64())])


def _storage() -> Path:
    return Path(os.environ[STORAGE_ENV])


def parquet_sink() -> ParquetFileSink:
    """The repository's exactly-once Parquet sink over ``$STORAGE_ENV/table``."""
    return ParquetFileSink(_storage() / "table", SCHEMA)


def read_parquet() -> list[int]:
    """The ids a reader of :func:`parquet_sink`'s table sees."""
    table = _storage() / "table"
    if not table.exists():
        return []
    ids: list[int] = ds.dataset(table, SCHEMA, format="parquet").to_table()["id"].to_pylist()
    return ids


def list_sink() -> ListSink:
    """An in-memory sink: importable, but nothing of it survives a SIGKILL."""
    return ListSink(SCHEMA)


def _write_json(path: Path, value: Any) -> None:
    """Replace ``path`` atomically: a crash leaves the old content or the new one."""
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("w") as file:
        json.dump(value, file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


class JsonDirSink:
    """Exactly-once over a directory: ``staged-<epoch>.json`` holds an epoch's ids once
    flushed or pre-committed; ``committed.json`` maps each committed epoch to its ids, and
    its values are what a reader sees. Small files, so the I/O is inline."""

    exactly_once = True

    def __init__(self) -> None:
        self.root = _storage() / "json"
        self.buffers: dict[int, list[int]] = {}
        self.open_epoch = -1

    @property
    def schema(self) -> pa.Schema:
        return SCHEMA

    def staged(self, epoch: int) -> Path:
        return self.root / f"staged-{epoch}.json"

    def committed(self) -> dict[str, list[int]]:
        path = self.root / "committed.json"
        found: dict[str, list[int]] = json.loads(path.read_text()) if path.exists() else {}
        return found

    async def open(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    async def recover(self, pending: Sequence[PendingCommit]) -> None:
        for commit in pending:
            await self.commit_epoch(commit.epoch)
        self.drop_staged()

    def drop_staged(self) -> None:
        for path in self.root.glob("staged-*.json"):
            path.unlink()

    async def begin_epoch(self, epoch: int) -> None:
        self.open_epoch = epoch
        self.buffers[epoch] = []

    async def write_batch(self, batch: pa.RecordBatch) -> None:
        self.buffers[self.open_epoch] += batch.column(0).to_pylist()

    async def flush(self) -> None:
        if self.open_epoch in self.buffers:
            _write_json(self.staged(self.open_epoch), self.buffers[self.open_epoch])

    async def pre_commit(self, epoch: int) -> CommitMetadata:
        ids = self.buffers.pop(epoch)
        _write_json(self.staged(epoch), ids)
        return {"rows": len(ids)}

    async def commit_epoch(self, epoch: int) -> None:
        committed = self.committed()
        if str(epoch) in committed or not self.staged(epoch).exists():
            return  # committed already: a replay is a no-op
        committed[str(epoch)] = json.loads(self.staged(epoch).read_text())
        _write_json(self.root / "committed.json", committed)
        self.staged(epoch).unlink()

    async def rollback_epoch(self, epoch: int) -> None:
        self.buffers.pop(epoch, None)
        self.staged(epoch).unlink(missing_ok=True)

    async def close(self) -> None: ...


def read_json() -> list[int]:
    """The ids a reader of a :class:`JsonDirSink` sees."""
    path = _storage() / "json" / "committed.json"
    committed: dict[str, list[int]] = json.loads(path.read_text()) if path.exists() else {}
    return [i for ids in committed.values() for i in ids]


class IgnoresPending(JsonDirSink):
    """Broken: ``recover`` drops every staged epoch, also those it is told to commit."""

    async def recover(self, pending: Sequence[PendingCommit]) -> None:
        self.drop_staged()


class PublishesAtPreCommit(JsonDirSink):
    """Broken: ``pre_commit`` makes the rows visible (commit comes early)."""

    async def pre_commit(self, epoch: int) -> CommitMetadata:
        metadata = await super().pre_commit(epoch)
        await super().commit_epoch(epoch)
        return metadata


class ForgetsCommits(JsonDirSink):
    """Broken: a commit is a no-op only if *this instance* made it, and it keeps the staged
    file — so a commit replayed by ``recover`` after a crash adds the rows again."""

    def __init__(self) -> None:
        super().__init__()
        self.done: set[int] = set()

    async def commit_epoch(self, epoch: int) -> None:
        if epoch in self.done or not self.staged(epoch).exists():
            return
        self.done.add(epoch)
        committed = self.committed()
        committed.setdefault(str(epoch), []).extend(json.loads(self.staged(epoch).read_text()))
        _write_json(self.root / "committed.json", committed)

    async def recover(self, pending: Sequence[PendingCommit]) -> None:
        for commit in pending:
            await self.commit_epoch(commit.epoch)
        keep = {self.staged(commit.epoch) for commit in pending}
        for path in self.root.glob("staged-*.json"):
            if path not in keep:
                path.unlink()


class UnserializableMetadata(JsonDirSink):
    """Broken: ``pre_commit`` returns metadata a checkpoint cannot store (not JSON)."""

    async def pre_commit(self, epoch: int) -> CommitMetadata:
        await super().pre_commit(epoch)
        return {"rows": object()}
