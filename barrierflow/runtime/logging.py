"""structlog set-up: JSON lines for machines or colored console lines for people."""

from __future__ import annotations

import logging
from typing import Literal

import structlog

from barrierflow.channels.errors import ConfigError

__all__ = ["configure_logging"]

_LEVELS = frozenset(
    (logging.NOTSET, logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)
)


def configure_logging(fmt: Literal["console", "json"], level: int = logging.INFO) -> None:
    """Configure structlog process-wide (structlog's configuration is global by design).

    Every barrierflow logger is bound with ``actor``, ``actor_id`` and ``epoch`` where they
    apply; this chooses how those events are rendered.

    Raises:
        ConfigError: ``fmt`` is not ``"console"`` or ``"json"``, or ``level`` is not one of
            the standard levels (``logging.NOTSET``, ``DEBUG``, ``INFO``, ``WARNING``,
            ``ERROR``, ``CRITICAL``; structlog filters by those only); structlog is left as it
            was.
    """
    if not isinstance(fmt, str) or fmt not in ("console", "json"):
        raise ConfigError("fmt", "'console' or 'json'", fmt)
    if type(level) is not int or level not in _LEVELS:
        raise ConfigError("level", f"a standard logging level, one of {sorted(_LEVELS)}", level)
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        cache_logger_on_first_use=False,
    )
