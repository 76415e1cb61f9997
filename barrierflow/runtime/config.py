"""Runtime configuration: one frozen record, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, final

from barrierflow.errors import ConfigError

__all__ = ["RuntimeConfig"]


@final
@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    """How a :class:`~barrierflow.runtime.Runtime` runs its graph.

    Attributes:
        state_path: the SQLite state store file (created if missing).
        barrier_interval: seconds between injected barriers.
        checkpoint_frequency: every N-th barrier is a checkpoint (1: every barrier).
        max_in_flight: barriers injected but not yet collected by every actor, at most; the
            manager waits rather than run ahead of a slow graph.
        channel_capacity: messages per channel between actors.
        channel_rows: rows per channel between actors (``None``: count messages only).
        recovery: rebuild the graph from the last checkpoint when an actor fails, instead of
            stopping the runtime.
        max_restarts: restarts allowed (per runtime) before a failure stops it after all.
        restart_backoff: seconds before the first restart; doubles for each further restart.
        log_format: ``"console"`` or ``"json"`` configures structlog; ``None`` leaves it alone.
        store_adapter: the state store's SQLite adapter (see ``StateStore.open``).
    """

    state_path: str | Path
    barrier_interval: float = 1.0
    checkpoint_frequency: int = 1
    max_in_flight: int = 8
    channel_capacity: int = 16
    channel_rows: int | None = None
    recovery: bool = False
    max_restarts: int = 3
    restart_backoff: float = 0.1
    log_format: Literal["console", "json"] | None = None
    store_adapter: Literal["auto", "aiosqlite", "thread"] = "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.state_path, str | Path) or not str(self.state_path):
            raise ConfigError("state_path", "a file path", self.state_path)
        for name in ("barrier_interval", "restart_backoff"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(name, "a number of seconds > 0", value)
        for name in ("checkpoint_frequency", "max_in_flight", "channel_capacity"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ConfigError(name, "an int >= 1", value)
        if type(self.max_restarts) is not int or self.max_restarts < 0:
            raise ConfigError("max_restarts", "an int >= 0", self.max_restarts)
        if self.channel_rows is not None and (
            type(self.channel_rows) is not int or self.channel_rows < 1
        ):
            raise ConfigError("channel_rows", "None or an int >= 1", self.channel_rows)
        if self.log_format not in (None, "console", "json"):
            raise ConfigError("log_format", "None, 'console' or 'json'", self.log_format)
        if self.store_adapter not in ("auto", "aiosqlite", "thread"):
            raise ConfigError(
                "store_adapter", "'auto', 'aiosqlite' or 'thread'", self.store_adapter
            )
