"""Public test helpers: what barrierflow's own tests use, and what users use to test theirs.

* :mod:`barrierflow.testing.strategies` — Hypothesis strategies for batches, chunks and whole
  message streams (imports hypothesis; install the ``test`` extra).
* :class:`FakeClock` — a wall clock that moves only when told to.
* :func:`drain` / :func:`rows_per_epoch` — collect a stream and summarize it per epoch.
"""

from barrierflow.testing.clock import FakeClock as FakeClock
from barrierflow.testing.streams import drain as drain
from barrierflow.testing.streams import rows_per_epoch as rows_per_epoch

__all__ = ["FakeClock", "drain", "rows_per_epoch"]
