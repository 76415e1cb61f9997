"""The durable state store: key→value tables that commit with checkpoints, the sink meta-store
records, and the two SQLite adapters (aiosqlite on asyncio, one worker thread on trio)."""

from barrierflow.runtime.state.sink_states import SinkState as SinkState
from barrierflow.runtime.state.sink_states import SinkStateRecord as SinkStateRecord
from barrierflow.runtime.state.sink_states import SinkStates as SinkStates
from barrierflow.runtime.state.state_store import CommittedEpochs as CommittedEpochs
from barrierflow.runtime.state.state_store import StateStore as StateStore
from barrierflow.runtime.state.state_store import StateTable as StateTable

__all__ = [
    "CommittedEpochs",
    "SinkState",
    "SinkStateRecord",
    "SinkStates",
    "StateStore",
    "StateTable",
]
