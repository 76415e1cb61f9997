"""Services: long-lived tasks of a runtime that are not part of the dataflow graph.

A sink's coordinator is one: it serves the graph's sink writers, reads and writes the meta
store, and follows the committed epoch, but it neither reads nor emits messages and takes no
part in barriers. Register one with ``Runtime.add_service(name, service)``; it runs in every
incarnation of the graph (started before the actors, restarted with them by recovery,
cancelled once every actor finished). A service that raises fails the graph exactly as an actor
does — :class:`~barrierflow.errors.ActorFailedError` names it.
"""

from __future__ import annotations

from typing import Any, Protocol, final, runtime_checkable

import structlog

from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.runtime.metrics import MetricsRegistry
from barrierflow.runtime.state.state_store import CommittedEpochs, StateStore

__all__ = ["Service", "ServiceContext"]


@final
class ServiceContext:
    """What the runtime hands a service: its name, logging, the store, committed epochs and
    the runtime's metrics.

    Raises:
        InvalidArgumentError: ``name`` is not a non-empty str or ``store`` not a StateStore.
    """

    def __init__(
        self, name: str, store: StateStore, *, metrics: MetricsRegistry | None = None
    ) -> None:
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError("name", "a non-empty service name", name)
        if not isinstance(store, StateStore):
            raise InvalidArgumentError("store", "a StateStore", type(store).__name__)
        if metrics is not None and not isinstance(metrics, MetricsRegistry):
            raise InvalidArgumentError("metrics", "None or a MetricsRegistry", metrics)
        self.name = name
        self.store = store
        #: The runtime's metrics (a registry of its own when the service runs alone).
        self.metrics = MetricsRegistry() if metrics is None else metrics
        self.log: Any = structlog.get_logger("barrierflow.service").bind(service=name)

    @property
    def committed_epoch(self) -> int:
        """The last durable checkpoint epoch."""
        return self.store.committed_epoch

    def committed_epochs(self) -> CommittedEpochs:
        """The committed epoch now, then each newer one (ends when the store closes)."""
        return self.store.committed_epochs()


@runtime_checkable
class Service(Protocol):
    """A runtime service (see the module docstring)."""

    async def run(self, ctx: ServiceContext) -> None:
        """Serve until cancelled (returning early is allowed)."""
        ...
