"""Micro-batches staged on Spark executors, waiting for the epoch that holds them.

When the Spark bridge writes on executors (see
:mod:`barrierflow.spark_bridge.executors`), no row of a micro-batch flows through the sink's
writer actors: Spark tasks stage the files, and the bridge hands the coordinator one manifest
per partition (:class:`~.handles.AdoptStaged`) *before* it delivers the batch's end mark to
the feed. The writer actors still pass every barrier and send their (empty) manifests, with
the source positions their epoch reaches; the epoch whose positions first reach the batch id
takes the batch's files. Seed 000's rules, with the micro-batch's **partitions as the
shares**:

* **Coverage exactly once.** The manifests of a batch must name every partition
  ``0..P-1`` exactly once (:class:`~barrierflow.errors.PartitionCoverageError`); Spark returns
  the result of one successful attempt per partition.
* **Pending before ack.** The batch's files join the epoch's commit, which is persisted as
  pending before the writers are acknowledged — so before the checkpoint that makes the batch
  id durable.
* **Commit after durable, recovery.** Unchanged: they are the epoch's.
* **Nothing lost.** An epoch that reaches a batch of an executor-written stream with no files
  for it (the coordinator restarted between the hand-over and the end mark) fails with
  :class:`~barrierflow.errors.StagedBatchMissingError` instead of committing without them: the
  graph recovers and the bridge stages the batch again.
* **Nothing stale.** A hand-over staged during an earlier coordinator run is refused
  (:class:`~barrierflow.errors.StaleStagingError`): that run's successor recovered, and recovery
  deletes staged files no pending commit references.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import final

from barrierflow.actors.sinks.coordinator.handles import AdoptStaged
from barrierflow.actors.sinks.errors import (
    PartitionCoverageError,
    StagedBatchMissingError,
    StaleStagingError,
)
from barrierflow.actors.sinks.table import Manifest, manifests_positions

__all__ = ["ExecutorBatches", "partition_writer"]


def partition_writer(partition: int) -> str:
    """The writer id of the files a micro-batch's partition staged: ``p<partition>``."""
    return f"p{partition}"


@final
class ExecutorBatches:
    """The batches handed over in one coordinator run, by position key and batch id.

    Args:
        sink: the sink's name, for errors.
        keys: the position keys ever written on executors — kept across runs by the
            coordinator, so that a run that never saw a hand-over still refuses an epoch
            that reaches one of their batches without files.
        generation: the coordinator run this pool belongs to.
    """

    def __init__(self, sink: str, keys: set[str], generation: int) -> None:
        self._sink = sink
        self._keys = keys
        self._generation = generation
        self._batches: dict[str, dict[int, tuple[Manifest, ...]]] = {}

    def __len__(self) -> int:
        """Batches held, waiting for their epoch."""
        return sum(len(batches) for batches in self._batches.values())

    def add(self, event: AdoptStaged) -> None:
        """Hold ``event``'s batch for the epoch that reaches it.

        Raises:
            StaleStagingError: it was staged during another coordinator run.
            PartitionCoverageError: its manifests do not name each partition exactly once.
        """
        if event.generation != self._generation:
            raise StaleStagingError(self._sink, event.generation, self._generation)
        got = [_partition(manifest) for manifest in event.manifests]
        if sorted(got) != list(range(event.partitions)):
            batch = f"{event.key}#{event.batch}"
            raise PartitionCoverageError(self._sink, batch, event.partitions, got)
        self._keys.add(event.key)
        # Only files are committed: a partition that staged none was counted, and is done.
        staged = tuple(manifest for manifest in event.manifests if manifest.files)
        self._batches.setdefault(event.key, {})[event.batch] = staged

    def claim(self, epoch: int, manifests: Sequence[Manifest]) -> list[Manifest]:
        """The staged manifests of the batches epoch ``epoch`` reaches, by the positions its
        writers' ``manifests`` report (taken out of the pool).

        Raises:
            StagedBatchMissingError: the epoch reaches a batch of an executor-written key
                that was not handed over.
        """
        reach = manifests_positions(manifests)
        positions = reach.get("positions", {})
        started_after = reach.get("positions_from", {})
        claimed: list[Manifest] = []
        for key in sorted(self._keys):
            last = positions.get(key)
            if last is None:
                continue
            held = self._batches.get(key, {})
            first = started_after.get(key)
            # Without a start (the key's first epoch), the batch the epoch ends at is known.
            wanted = range(last, last + 1) if first is None else range(first + 1, last + 1)
            missing = [batch for batch in wanted if batch not in held]
            if missing:
                raise StagedBatchMissingError(self._sink, epoch, key, missing)
            for batch in sorted(b for b in held if b <= last):
                claimed.extend(held.pop(batch))
        return claimed


def _partition(manifest: Manifest) -> int:
    """The partition a staged manifest's writer id (``p<partition>``) names; -1 if none."""
    writer = manifest.writer
    digits = writer[1:]
    return int(digits) if writer.startswith("p") and digits.isdigit() else -1
