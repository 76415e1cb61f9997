"""Tables for the crash conformance tests, made by module-level factories: the suite's child
processes import these by name (``_conformance_tables:parquet_table``; ``tests/`` is on
``sys.path``, which the suite hands its children).

Every factory reaches the directory named by :data:`STORAGE_ENV`, which the test sets: the
parent and its children see the same environment, so the same storage.

:class:`JsonDirTable` is a small exactly-once table over JSON files, committed the way
:class:`~barrierflow.connectors.ParquetTable` is (an epoch's whole staging directory at once);
each subclass breaks the commit protocol in one way the suite must name.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds

from barrierflow.actors.sinks.table import CommitMetadata, Manifest, StagedFile
from barrierflow.connectors import ParquetTable
from barrierflow.testing.sinks import ListTable

#: The environment variable naming the storage directory of every factory here.
STORAGE_ENV = "BARRIERFLOW_CONFORMANCE_STORAGE"

SCHEMA = pa.schema([("id", pa.int64())])


def _storage() -> Path:
    return Path(os.environ[STORAGE_ENV])


def parquet_table() -> ParquetTable:
    """The repository's Parquet table over ``$STORAGE_ENV/table``."""
    return ParquetTable(_storage() / "table", SCHEMA)


def read_parquet() -> list[int]:
    """The ids a reader of :func:`parquet_table`'s directory sees."""
    table = _storage() / "table"
    if not table.exists():
        return []
    ids: list[int] = ds.dataset(table, SCHEMA, format="parquet").to_table()["id"].to_pylist()
    return ids


def list_table() -> ListTable:
    """An in-memory table: importable, but nothing of it survives a SIGKILL."""
    return ListTable(SCHEMA)


def _write_json(path: Path, value: Any) -> None:
    """Replace ``path`` atomically: a crash leaves the old content or the new one."""
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("w") as file:
        json.dump(value, file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


def _root() -> Path:
    return _storage() / "json"


def _committed() -> dict[str, list[int]]:
    path = _root() / "committed.json"
    found: dict[str, list[int]] = json.loads(path.read_text()) if path.exists() else {}
    return found


def read_json() -> list[int]:
    """The ids a reader of a :class:`JsonDirTable` sees."""
    return [i for ids in _committed().values() for i in ids]


class JsonWriter:
    """Stages an epoch's ids in ``staging/<epoch>/w<id>-<incarnation>.json`` (written by
    ``flush`` and ``stage``). Small files, so the I/O is inline."""

    def __init__(self, writer_id: str) -> None:
        self.id = writer_id
        self.file = f"w{writer_id}-{uuid.uuid4().hex[:8]}.json"
        self.epoch: int | None = None
        self.buffer: list[int] = []

    @property
    def schema(self) -> pa.Schema:
        return SCHEMA

    def staged(self, epoch: int) -> Path:
        return _root() / "staging" / str(epoch) / self.file

    async def open(self) -> None:
        (_root() / "staging").mkdir(parents=True, exist_ok=True)

    async def begin(self, epoch: int) -> None:
        self.epoch = epoch

    async def write(self, batch: pa.RecordBatch) -> None:
        self.buffer += batch.column(0).to_pylist()

    async def flush(self) -> None:
        if self.epoch is not None:
            self.staged(self.epoch).parent.mkdir(exist_ok=True)
            _write_json(self.staged(self.epoch), self.buffer)

    async def stage(self, epoch: int) -> Manifest:
        await self.flush()
        path = self.staged(epoch)
        rows = len(self.buffer)
        self.epoch, self.buffer = None, []
        relative = str(path.relative_to(_root()))
        return Manifest(self.id, epoch, (StagedFile(relative, rows, path.stat().st_size),))

    async def discard(self, epoch: int) -> None:
        if self.epoch == epoch:
            self.epoch, self.buffer = None, []
        self.staged(epoch).unlink(missing_ok=True)

    async def close(self) -> None:
        self.epoch, self.buffer = None, []


class JsonCommitter:
    """Commits an epoch's whole staging directory into ``committed.json`` (epoch → ids, the
    committed marker too) and deletes it; ``recover`` deletes every staged file no pending
    epoch references."""

    async def recover(self, pending: Mapping[int, CommitMetadata]) -> None:
        keep = {path for metadata in pending.values() for path in metadata["paths"]}
        for path in (_root() / "staging").glob("*/*.json"):
            if str(path.relative_to(_root())) not in keep:
                path.unlink()

    async def prepare(self, epoch: int, manifests: Sequence[Manifest]) -> CommitMetadata | None:
        paths = [f.path for m in manifests for f in m.files]
        return {"paths": paths} if paths else None

    def staged_ids(self, epoch: int) -> list[int]:
        directory = _root() / "staging" / str(epoch)
        if not directory.exists():
            raise RuntimeError(f"epoch {epoch} is pending but its staged files are gone")
        return [
            i for path in sorted(directory.glob("*.json")) for i in json.loads(path.read_text())
        ]

    async def commit(self, epoch: int, metadata: CommitMetadata) -> None:
        committed = _committed()
        if str(epoch) in committed:
            return  # a replayed commit: a no-op
        committed[str(epoch)] = self.staged_ids(epoch)
        _write_json(_root() / "committed.json", committed)
        shutil.rmtree(_root() / "staging" / str(epoch))

    async def abort(self, epoch: int, metadata: CommitMetadata | None) -> None:
        shutil.rmtree(_root() / "staging" / str(epoch), ignore_errors=True)


class JsonDirTable:
    """Exactly-once over ``$STORAGE_ENV/json`` (see the module)."""

    writer_class: type[JsonWriter] = JsonWriter
    committer_class: type[JsonCommitter] = JsonCommitter

    @property
    def schema(self) -> pa.Schema:
        return SCHEMA

    def writer(self, writer_id: str) -> JsonWriter:
        return self.writer_class(writer_id)

    def committer(self) -> JsonCommitter:
        return self.committer_class()


class _IgnoresPendingCommitter(JsonCommitter):
    async def recover(self, pending: Mapping[int, CommitMetadata]) -> None:
        await super().recover({})


class IgnoresPending(JsonDirTable):
    """Broken: ``recover`` deletes every staged file, also the pending epochs' ones."""

    committer_class = _IgnoresPendingCommitter


class _PublishingCommitter(JsonCommitter):
    async def prepare(self, epoch: int, manifests: Sequence[Manifest]) -> CommitMetadata | None:
        metadata = await super().prepare(epoch, manifests)
        if metadata is not None:
            await self.commit(epoch, metadata)
        return metadata

    def staged_ids(self, epoch: int) -> list[int]:
        return [] if str(epoch) in _committed() else super().staged_ids(epoch)


class PublishesAtPrepare(JsonDirTable):
    """Broken: ``prepare`` makes the rows visible (the commit comes before the epoch is
    durable)."""

    committer_class = _PublishingCommitter


class _ForgetfulCommitter(JsonCommitter):
    def __init__(self) -> None:
        self.done: set[int] = set()

    async def commit(self, epoch: int, metadata: CommitMetadata) -> None:
        if epoch in self.done:
            return
        self.done.add(epoch)
        committed = _committed()
        committed.setdefault(str(epoch), []).extend(self.staged_ids(epoch))
        _write_json(_root() / "committed.json", committed)


class ForgetsCommits(JsonDirTable):
    """Broken: a commit is a no-op only if *this committer* made it (no committed marker in
    the table), and it keeps the staged files — so a commit replayed after a crash adds the
    rows again."""

    committer_class = _ForgetfulCommitter


class _LeakingWriter(JsonWriter):
    async def discard(self, epoch: int) -> None:
        pass  # the buffered rows stay, and the next epoch stages them


class LeaksDiscarded(JsonDirTable):
    """Broken: a writer's ``discard`` keeps the epoch's rows, which the next epoch stages."""

    writer_class = _LeakingWriter


class _HoardingCommitter(JsonCommitter):
    async def recover(self, pending: Mapping[int, CommitMetadata]) -> None:
        pass


class KeepsStaging(JsonDirTable):
    """Broken: ``recover`` keeps the staged files no pending epoch references, so an epoch
    staged again after a restart commits the dead incarnation's rows with its own."""

    committer_class = _HoardingCommitter


class _UnserializableCommitter(JsonCommitter):
    async def prepare(self, epoch: int, manifests: Sequence[Manifest]) -> CommitMetadata | None:
        metadata = await super().prepare(epoch, manifests)
        return None if metadata is None else {**metadata, "written": object()}


class UnserializableMetadata(JsonDirTable):
    """Broken: ``prepare`` returns metadata a meta store cannot persist (not JSON)."""

    committer_class = _UnserializableCommitter
