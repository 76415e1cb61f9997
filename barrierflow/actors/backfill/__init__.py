"""Backfills: a new job that must also see what happened before it joined.

* :mod:`.source_backfill` — the source backfill actor (a split log's history, then its live
  records), driving the pure per-split state machine of :mod:`.source_backfill_state`.
* The snapshot backfill and the materialize actor come next.
"""

from barrierflow.actors.backfill.source_backfill import SourceBackfill as SourceBackfill
from barrierflow.actors.backfill.source_backfill_state import BackfillPhase as BackfillPhase
from barrierflow.actors.backfill.source_backfill_state import SplitBackfill as SplitBackfill

__all__ = ["BackfillPhase", "SourceBackfill", "SplitBackfill"]
