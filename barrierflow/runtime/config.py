"""Runtime configuration: one frozen record, validated on construction."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, final

from barrierflow.channels.errors import ConfigError, InvalidArgumentError

__all__ = ["RuntimeConfig"]

_MAX = sys.float_info.max


def check_seconds(
    argument: str, value: Any, error: type[InvalidArgumentError] = ConfigError
) -> float:
    """``value`` if it is a finite number of seconds > 0 (an int or float, not a bool).

    ``value <= 0`` alone would let NaN through; an infinite duration never elapses. The one
    check of every duration barrierflow takes: a configuration value raises ``ConfigError``,
    an argument of a call (a sink task's timeout) passes ``error=InvalidArgumentError``.

    Raises:
        ConfigError: it is not (or ``error``).
    """
    # Compared, not math.isfinite(): a huge int overflows it (and float() of it).
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= _MAX:
        raise error(argument, "a finite number of seconds > 0", value)
    return float(value)


def check_count(argument: str, value: Any, low: int = 1) -> int:
    """``value`` if it is an ``int`` ≥ ``low`` (a bool or a float is refused).

    Raises:
        ConfigError: it is not.
    """
    if type(value) is not int or value < low:
        raise ConfigError(argument, f"an int >= {low}", value)
    return value


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
        adopt_sink_positions: what to do when the state store is new or empty but a sink
            already holds commits (the store was lost or replaced): ``False`` (the default)
            refuses to start with :class:`~barrierflow.errors.SinkStateMismatchError`;
            ``True`` adopts the source positions the sinks recorded with their commits, so
            the sources skip the batches the sinks hold (see
            :mod:`barrierflow.runtime.startup`).
        stuck_barrier_intervals: barrier intervals a barrier may stay in flight before the
            watchdog logs a warning naming the actors that hold it (then again each time the
            wait doubles); see :mod:`barrierflow.runtime.watchdog`.
        stop_timeout: seconds leaving ``async with`` waits for the final ``Stop`` checkpoint;
            past it the exit fails with :class:`~barrierflow.errors.BarrierStuckError` naming
            the actors that hold the barrier, instead of hanging (nothing acknowledged is
            lost: what followed the last committed checkpoint is replayed at the next start).
        metrics_port: serve the runtime's metrics (:mod:`barrierflow.runtime.metrics`) in
            Prometheus's text format at ``http://<metrics_host>:<port>/metrics`` while it runs
            (``0``: a free port, see ``Runtime.metrics_url``); ``None`` (the default): no
            endpoint. Needs the ``metrics`` extra (prometheus-client). A port that cannot be
            bound when the runtime starts (in use) fails the start with
            :class:`~barrierflow.errors.MetricsPortError`.
        metrics_host: the address the endpoint binds to; loopback by default, so that a
            pipeline's metrics are not on the network unless asked for.

    Every field is checked here, so a bad value fails at construction, not when the runtime
    starts: durations must be finite numbers of seconds > 0 (``value <= 0`` alone would let NaN
    through, and an infinite interval would never inject a barrier); counts are ints, not bools
    or floats; flags are bools.

    Raises:
        ConfigError: a field is out of range or of the wrong type (``argument`` names it).
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
    adopt_sink_positions: bool = False
    stuck_barrier_intervals: int = 30
    stop_timeout: float = 120.0
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        if (
            not isinstance(self.state_path, str | Path)
            or not str(self.state_path)
            or "\x00" in str(self.state_path)
        ):
            raise ConfigError("state_path", "a file path (non-empty, no NUL)", self.state_path)
        for name in ("barrier_interval", "restart_backoff", "stop_timeout"):
            check_seconds(name, getattr(self, name))
        if type(self.recovery) is not bool:
            raise ConfigError("recovery", "a bool", self.recovery)
        for name in (
            "checkpoint_frequency",
            "max_in_flight",
            "channel_capacity",
            "stuck_barrier_intervals",
        ):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ConfigError(name, "an int >= 1", value)
        if type(self.max_restarts) is not int or self.max_restarts < 0:
            raise ConfigError("max_restarts", "an int >= 0", self.max_restarts)
        if self.channel_rows is not None and (
            type(self.channel_rows) is not int or self.channel_rows < 1
        ):
            raise ConfigError("channel_rows", "None or an int >= 1", self.channel_rows)
        if not (
            self.log_format is None
            or (isinstance(self.log_format, str) and self.log_format in ("console", "json"))
        ):
            raise ConfigError("log_format", "None, 'console' or 'json'", self.log_format)
        if self.metrics_port is not None and (
            type(self.metrics_port) is not int or not 0 <= self.metrics_port <= 65535
        ):
            raise ConfigError("metrics_port", "None or a port number 0..65535", self.metrics_port)
        if not isinstance(self.metrics_host, str) or not self.metrics_host:
            raise ConfigError("metrics_host", "a host name or address", self.metrics_host)
        if not isinstance(self.adopt_sink_positions, bool):
            raise ConfigError("adopt_sink_positions", "a bool", self.adopt_sink_positions)
        if not isinstance(self.store_adapter, str) or self.store_adapter not in (
            "auto",
            "aiosqlite",
            "thread",
        ):
            raise ConfigError(
                "store_adapter", "'auto', 'aiosqlite' or 'thread'", self.store_adapter
            )
