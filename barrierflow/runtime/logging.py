"""structlog set-up: JSON lines for machines or colored console lines for people."""

from __future__ import annotations

import logging
from typing import Literal

import structlog

__all__ = ["configure_logging"]


def configure_logging(fmt: Literal["console", "json"], level: int = logging.INFO) -> None:
    """Configure structlog process-wide (structlog's configuration is global by design).

    Every barrierflow logger is bound with ``actor``, ``actor_id`` and ``epoch`` where they
    apply; this chooses how those events are rendered.
    """
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
