"""What an actor that reads a split log reports per split: records read, and the lag in
records behind the log's latest — Flink's ``numRecordsIn`` and ``pendingRecords``, RisingWave's
source throughput and Kafka lag. The live split source and the source backfill's history
stage each keep one.

Records read are counted per batch (:func:`~.split_log.split_ends`: a loop per split, not per
row). The lag is asked of the log — :meth:`~.split_log.CountsRecords.records_after` the
actor's position in each split — when metrics are *refreshed* (a scrape of the Prometheus
endpoint, ``await rt.metrics.snapshot()``), never on the actor's path: a log that must ask a
server does so only when somebody looks. A log that cannot count (no ``records_after``)
reports no lag; a split whose lag the log cannot tell reports ``NaN``.

A runtime mechanism, not an API: the package does not export it (the backfill package imports
it, as it does :mod:`.split_reader`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import final

from barrierflow.actors.sources.split_log import CountsRecords, Offset, SplitLog
from barrierflow.runtime.metrics import MetricFamily, counter, gauge

__all__ = ["SplitMetrics"]


@final
class SplitMetrics:
    """Records read and lag per split of one actor (see the module).

    Args:
        log: the split log the actor reads.
        kind: what the actor is, the metrics' ``kind`` label (``"source"``, ``"backfill"``).
    """

    def __init__(self, log: SplitLog, kind: str) -> None:
        self._log = log
        self._kind = kind
        self._read: dict[str, int] = {}
        self._lag: dict[str, int | None] = {}

    def count(self, ends: Mapping[str, tuple[Offset, int]]) -> None:
        """Count a batch's rows per split (``split_ends`` of it)."""
        for split, (_, rows) in ends.items():
            self._read[split] = self._read.get(split, 0) + rows

    def set_read(self, split: str, rows: int) -> None:
        """The records read of ``split`` so far, where the actor keeps the count itself."""
        self._read[split] = rows

    async def refresh(
        self, positions: Mapping[str, Offset | None], caught_up: frozenset[str] = frozenset()
    ) -> None:
        """Ask the log how far behind each position is (``caught_up`` splits lag 0 without
        asking). Until it answered, or when it failed, the lag is unknown (not reported)."""
        self._lag = {}
        lag: dict[str, int | None] = dict.fromkeys(caught_up, 0)
        if isinstance(self._log, CountsRecords):
            for split, offset in positions.items():
                lag[split] = await self._log.records_after(split, offset)
        self._lag = lag

    def lag(self, split: str) -> int | None:
        """The lag of ``split`` as of the last refresh (``None``: unknown)."""
        return self._lag.get(split)

    def families(self, actor: str) -> list[MetricFamily]:
        """``barrierflow_source_records_read`` and ``barrierflow_source_lag_records`` per
        split, labelled with the ``actor``, its ``kind`` and the ``split``."""

        def labels(split: str) -> dict[str, str]:
            return {"actor": actor, "kind": self._kind, "split": split}

        return [
            counter(
                "barrierflow_source_records_read",
                "records an actor read from a split of its log",
                [(labels(s), n) for s, n in self._read.items()],
            ),
            gauge(
                "barrierflow_source_lag_records",
                "records of a split after the actor's position (NaN: the log cannot tell)",
                [(labels(s), math.nan if n is None else n) for s, n in self._lag.items()],
            ),
        ]
