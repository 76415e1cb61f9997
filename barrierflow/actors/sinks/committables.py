"""Micro-batches staged outside the graph, travelling to their sink as committables.

When the Spark bridge writes on executors (:mod:`barrierflow.spark_bridge.executors`), no row
of a micro-batch flows through the sink's writers: each Spark task stages its partition's
files and returns only its manifest. The bridge wraps the batch's manifests in one
:class:`StagedBatch` and delivers it **through the feed**, with the batch's end mark, as a
:class:`~barrierflow.channels.messages.Committable` message: it flows to the sink's writer like
rows do, the writer hands it to the coordinator with its own manifest of the epoch whose
barrier follows it, and that epoch commits the batch's files. Nothing matches files to epochs
afterwards: an epoch holds exactly the batches that arrived before its barrier.

Seed 000's rules hold, with the micro-batch's **partitions as the shares** inside an epoch:

* **Each partition exactly once.** A batch's manifests must name every partition
  ``0..P-1`` exactly once, and an epoch must not hold a batch twice
  (:class:`~barrierflow.errors.PartitionCoverageError`): Spark returns the result of one
  successful attempt per partition, and the feed delivers a batch id once.
* **Pending before ack, commit after durable, recovery.** Unchanged: the batch's files are
  part of the epoch's commit, persisted as pending before the writers are acknowledged, so
  before the checkpoint that makes the batch id durable.
* **Nothing lost.** A batch whose epoch fails is discarded with it: the feed's delivery fails,
  and the bridge stages the batch again. The coordinator's recovery deletes staged files no
  pending commit references — so files staged while the graph recovered may be gone by the
  time their committable arrives: the writer checks that they exist and fails the epoch with
  :class:`~barrierflow.errors.StagedFilesGoneError` if not (the bridge stages again), instead
  of committing a batch without its rows.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, final, runtime_checkable

from barrierflow.actors.sinks.errors import PartitionCoverageError
from barrierflow.actors.sinks.table import Manifest
from barrierflow.channels.errors import InvalidArgumentError

__all__ = ["ChecksStaged", "StagedBatch", "check_epoch_batches", "partition_writer"]


def partition_writer(partition: int) -> str:
    """The writer id of the files a micro-batch's partition staged: ``p<partition>``."""
    return f"p{partition}"


def _partition(manifest: Manifest) -> int:
    """The partition a staged manifest's writer id (``p<partition>``) names; -1 if none."""
    writer = manifest.writer
    digits = writer[1:]
    return int(digits) if writer.startswith("p") and digits.isdigit() else -1


@runtime_checkable
class ChecksStaged(Protocol):
    """How a table whose tasks stage no files under its root tells what is gone (a
    PostgreSQL table's prepared transactions:
    :class:`~barrierflow.connectors.postgres_executors.PostgresExecutorWrites`)."""

    def missing(self, manifests: Sequence[Manifest]) -> str | None:
        """The first staged item of ``manifests`` that is gone (``None``: all are there).
        Blocking."""
        ...


@final
@dataclass(frozen=True, slots=True)
class StagedBatch:
    """One micro-batch staged on executors: the payload of its committable.

    Attributes:
        key: the position key of the stream it belongs to (``"<source>/<stream>"``).
        batch_id: its batch id.
        partitions: how many partitions it has (each staged one manifest, maybe of no file).
        manifests: one per partition, writer ids ``p<partition>``.
        root: the table's root the manifests' paths are relative to (where the writer checks
            that the files exist).
        check: what tells which staged item is gone when the manifests name no files under
            ``root`` (``None``: they do).

    Raises:
        InvalidArgumentError: a field of the wrong type.
    """

    key: str
    batch_id: int
    partitions: int
    manifests: tuple[Manifest, ...]
    root: str
    check: ChecksStaged | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key:
            raise InvalidArgumentError("key", "a position key '<source>/<stream>'", self.key)
        for name, value in (("batch_id", self.batch_id), ("partitions", self.partitions)):
            if type(value) is not int or value < 0:
                raise InvalidArgumentError(name, "an int >= 0", value)
        if not isinstance(self.manifests, tuple) or not all(
            isinstance(m, Manifest) for m in self.manifests
        ):
            raise InvalidArgumentError("manifests", "a tuple of Manifests", self.manifests)
        if not isinstance(self.root, str) or not self.root:
            raise InvalidArgumentError("root", "the table's root directory", self.root)
        if self.check is not None and not isinstance(self.check, ChecksStaged):
            raise InvalidArgumentError("check", "None or a ChecksStaged", self.check)

    @property
    def label(self) -> str:
        """How errors name it: ``"<position key>#<batch id>"``."""
        return f"{self.key}#{self.batch_id}"

    @property
    def rows(self) -> int:
        """The rows its files hold."""
        return sum(manifest.rows for manifest in self.manifests)

    def check_coverage(self, sink: str) -> None:
        """Check that the manifests name each partition exactly once.

        Raises:
            PartitionCoverageError: they do not.
        """
        got = [_partition(manifest) for manifest in self.manifests]
        if sorted(got) != list(range(self.partitions)):
            raise PartitionCoverageError(sink, self.label, self.partitions, got)

    def missing_file(self) -> str | None:
        """The first staged file that is not there (``None``: all are), or what ``check``
        finds gone. Blocking: one ``stat`` per file (or ``check``'s own query)."""
        if self.check is not None:
            return self.check.missing(self.manifests)
        for manifest in self.manifests:
            for staged in manifest.files:
                path = os.path.join(self.root, staged.path)
                if not os.path.exists(path):
                    return path
        return None


def check_epoch_batches(sink: str, batches: Sequence[StagedBatch]) -> list[Manifest]:
    """The manifests with files of the batches an epoch holds, after checking each covers its
    partitions exactly once and none comes twice.

    Raises:
        PartitionCoverageError: a batch's partitions are not each named once, or a batch
            comes twice (its partitions are then named twice).
    """
    seen: dict[str, StagedBatch] = {}
    manifests: list[Manifest] = []
    for batch in batches:
        batch.check_coverage(sink)
        first = seen.setdefault(batch.label, batch)
        if first is not batch:
            got = [_partition(m) for m in (*first.manifests, *batch.manifests)]
            raise PartitionCoverageError(sink, batch.label, batch.partitions, got)
        # Only files and state are committed: a partition that staged neither was counted,
        # and is done.
        manifests.extend(m for m in batch.manifests if m.files or m.state)
    return manifests
