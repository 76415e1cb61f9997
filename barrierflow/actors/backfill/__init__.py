"""Backfills: a new job that must also see what happened before it joined.

* :mod:`.source_backfill` — the source backfill actor (a split log's history, then its live
  records), driving the pure per-split state machine of :mod:`.source_backfill_state`.
* :mod:`.snapshot_backfill` — the snapshot backfill actor (a materialized view's snapshot at a
  pinned epoch, then its change log, then the live upstream), with its progress in
  :mod:`.snapshot_progress`; :mod:`.materialize` — the materialize actor that keeps the view.
"""

from barrierflow.actors.backfill.materialize import Materialize as Materialize
from barrierflow.actors.backfill.snapshot_backfill import SnapshotBackfill as SnapshotBackfill
from barrierflow.actors.backfill.source_backfill import SourceBackfill as SourceBackfill
from barrierflow.actors.backfill.source_backfill_state import BackfillPhase as BackfillPhase
from barrierflow.actors.backfill.source_backfill_state import SplitBackfill as SplitBackfill

__all__ = ["BackfillPhase", "Materialize", "SnapshotBackfill", "SourceBackfill", "SplitBackfill"]
