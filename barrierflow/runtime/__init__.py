"""The runtime: the durable state store (actors, supervision and the barrier manager follow)."""

from barrierflow.runtime.state_store import CommittedEpochs as CommittedEpochs
from barrierflow.runtime.state_store import StateStore as StateStore
from barrierflow.runtime.state_store import StateTable as StateTable

__all__ = ["CommittedEpochs", "StateStore", "StateTable"]
