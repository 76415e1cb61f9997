"""Backfills: a new job that must also see what happened before it joined.

* :mod:`.source_backfill` — the source backfill actor (a split log's history, then its live
  records), driving the pure per-split state machine of :mod:`.source_backfill_state`.
* :mod:`.snapshot_backfill` — the snapshot backfill actor (a materialized view's snapshot at a
  pinned epoch, then its change log, then the live upstream), with its progress in
  :mod:`.snapshot_progress`; :mod:`.materialize` — the materialize actor that keeps the view.
"""

import typing as _typing

from barrierflow._removed import removed_names as _removed_names

#: Nothing: the backfills' public names have one home, :mod:`barrierflow.actors`.
__all__: list[str] = []

if not _typing.TYPE_CHECKING:
    # A removed name says what replaced it (see CHANGELOG.md); a type checker does not see
    # this, so it still reports a removed or misspelt name as missing.
    __getattr__ = _removed_names(__name__)
