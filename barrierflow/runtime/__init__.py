"""The runtime: actors and their supervision, barriers and checkpoints, the durable state store,
and embedding in async or sync drivers.

This package exports what a user of the runtime calls; the machinery behind it (the barrier
manager, epoch records, wiring) lives in its modules and may change between versions."""

import typing as _typing

from barrierflow._removed import removed_names as _removed_names
from barrierflow.runtime.actor import ActorContext as ActorContext
from barrierflow.runtime.actor import ActorStats as ActorStats
from barrierflow.runtime.actor import StreamActor as StreamActor
from barrierflow.runtime.blocking import BlockingRuntime as BlockingRuntime
from barrierflow.runtime.command import ActorRef as ActorRef
from barrierflow.runtime.command import CommandHandler as CommandHandler
from barrierflow.runtime.command import Finish as Finish
from barrierflow.runtime.command import Ticker as Ticker
from barrierflow.runtime.command import open_command_actor as open_command_actor
from barrierflow.runtime.command import serve_commands as serve_commands
from barrierflow.runtime.config import RuntimeConfig as RuntimeConfig
from barrierflow.runtime.graph import Fanout as Fanout
from barrierflow.runtime.job import Job as Job
from barrierflow.runtime.job import JobHandle as JobHandle
from barrierflow.runtime.job import JobStats as JobStats
from barrierflow.runtime.job_catalog import stored_jobs as stored_jobs
from barrierflow.runtime.logging import configure_logging as configure_logging
from barrierflow.runtime.placement import Placement as Placement
from barrierflow.runtime.progress import JobProgress as JobProgress
from barrierflow.runtime.progress import Progress as Progress
from barrierflow.runtime.runtime import Runtime as Runtime
from barrierflow.runtime.runtime import RuntimeStats as RuntimeStats
from barrierflow.runtime.service import Service as Service
from barrierflow.runtime.service import ServiceContext as ServiceContext
from barrierflow.runtime.state.state_store import StateStore as StateStore
from barrierflow.runtime.state.state_store import StateTable as StateTable

__all__ = [
    "ActorContext",
    "ActorRef",
    "ActorStats",
    "BlockingRuntime",
    "CommandHandler",
    "Fanout",
    "Finish",
    "Job",
    "JobHandle",
    "JobProgress",
    "JobStats",
    "Placement",
    "Progress",
    "Runtime",
    "RuntimeConfig",
    "RuntimeStats",
    "Service",
    "ServiceContext",
    "StateStore",
    "StateTable",
    "StreamActor",
    "Ticker",
    "configure_logging",
    "open_command_actor",
    "serve_commands",
    "stored_jobs",
]

if not _typing.TYPE_CHECKING:
    # A removed name says what replaced it (see CHANGELOG.md); a type checker does not see
    # this, so it still reports a removed or misspelt name as missing.
    __getattr__ = _removed_names(__name__)
