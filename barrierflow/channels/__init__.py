"""How messages travel: the message vocabulary, bounded channels, fan-out and aligned fan-in.

This package knows nothing of actors; the runtime and the actors are built on it. It is the one
home of the names it exports (``tests/public_api.txt``).
"""

import typing as _typing

from barrierflow.channels.barrier import Barrier as Barrier
from barrierflow.channels.barrier import BarrierKind as BarrierKind
from barrierflow.channels.channel import ChannelStatistics as ChannelStatistics
from barrierflow.channels.channel import ReceiveChannel as ReceiveChannel
from barrierflow.channels.channel import SendChannel as SendChannel
from barrierflow.channels.channel import create_channel as create_channel
from barrierflow.channels.chunk import Chunk as Chunk
from barrierflow.channels.chunk import Op as Op
from barrierflow.channels.dispatch import BroadcastDispatcher as BroadcastDispatcher
from barrierflow.channels.dispatch import Dispatcher as Dispatcher
from barrierflow.channels.dispatch import HashDispatcher as HashDispatcher
from barrierflow.channels.dispatch import RoundRobinDispatcher as RoundRobinDispatcher
from barrierflow.channels.epoch import EpochClock as EpochClock
from barrierflow.channels.epoch import EpochPair as EpochPair
from barrierflow.channels.epoch import epoch_from_unix_ms as epoch_from_unix_ms
from barrierflow.channels.epoch import physical_time_ms as physical_time_ms
from barrierflow.channels.errors import CHANNELS_REMOVED as _CHANNELS_REMOVED
from barrierflow.channels.errors import removed_name_lookup as _removed_name_lookup
from barrierflow.channels.merge import merge_aligned as merge_aligned
from barrierflow.channels.messages import Committable as Committable
from barrierflow.channels.messages import Message as Message
from barrierflow.channels.messages import Watermark as Watermark
from barrierflow.channels.mutation import Add as Add
from barrierflow.channels.mutation import Mutation as Mutation
from barrierflow.channels.mutation import Pause as Pause
from barrierflow.channels.mutation import Resume as Resume
from barrierflow.channels.mutation import SourceChangeSplit as SourceChangeSplit
from barrierflow.channels.mutation import Split as Split
from barrierflow.channels.mutation import Stop as Stop
from barrierflow.channels.mutation import Throttle as Throttle
from barrierflow.channels.mutation import Update as Update
from barrierflow.channels.vnode import VnodeBitmap as VnodeBitmap
from barrierflow.channels.vnode import compute_vnodes as compute_vnodes

__all__ = [
    "Add",
    "Barrier",
    "BarrierKind",
    "BroadcastDispatcher",
    "ChannelStatistics",
    "Chunk",
    "Committable",
    "Dispatcher",
    "EpochClock",
    "EpochPair",
    "HashDispatcher",
    "Message",
    "Mutation",
    "Op",
    "Pause",
    "ReceiveChannel",
    "Resume",
    "RoundRobinDispatcher",
    "SendChannel",
    "SourceChangeSplit",
    "Split",
    "Stop",
    "Throttle",
    "Update",
    "VnodeBitmap",
    "Watermark",
    "compute_vnodes",
    "create_channel",
    "epoch_from_unix_ms",
    "merge_aligned",
    "physical_time_ms",
]

if not _typing.TYPE_CHECKING:
    # A removed name says what replaced it (see CHANGELOG.md); a type checker does not see
    # this, so it still reports a removed or misspelt name as missing.
    __getattr__ = _removed_name_lookup(__name__, _CHANNELS_REMOVED, {})
