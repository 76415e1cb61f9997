"""Source positions: where the rows a sink committed came from, recorded with the rows.

The runtime's state store is the usual source of truth for what a pipeline has done: a source
keeps its positions (for the batch source, ``stream → last batch id``) in its state and the
checkpoint makes them durable with the sinks' pre-commit records. That is not enough if the
store itself is lost: a new, empty store would let the upstream replay everything, and a
sink that already holds those rows would commit them a second time.

So an exactly-once sink also records, **in the same atomic commit as the rows**, the source
positions those rows reach — as Delta Lake's idempotent writes record an application id and a
version. This module holds what the runtime and the sinks share for that:

* :class:`SourcePositions` maps a position key to a batch id. A key names one numbered stream
  of one source actor: ``"<source actor>/<stream>"`` (see :func:`position_key`).
* Sources report their positions with each barrier they pass (``ActorContext.
  report_positions``); a sink writer asks, at a checkpoint barrier, for the positions every
  source reported with it (``ActorContext.positions_at``) — the positions its epoch's rows
  reach.
* On an empty store, an actor whose output storage already holds rows (a sink's table) may
  hand the runtime the positions it holds (:class:`~barrierflow.runtime.startup.HoldsPositions`);
  the runtime adopts the smallest per key and gives them to every actor as
  ``ctx.adopted_positions`` (see ``RuntimeConfig.adopt_sink_positions``). What a table holds
  and whether to refuse is the sinks' business (:mod:`barrierflow.actors.sinks`).
* Whether an epoch's rows are already in a sink (a replay after the store went back in
  time) is the sink's decision at commit:
  :func:`barrierflow.actors.sinks.positions.epoch_already_held`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from barrierflow.channels.errors import InvalidArgumentError

__all__ = [
    "SourcePositions",
    "check_positions",
    "merge_positions",
    "position_key",
]

#: Position key → the last batch id whose rows are included.
SourcePositions = Mapping[str, int]


def position_key(source: str, stream: str) -> str:
    """The position key of ``stream`` of source actor ``source``."""
    return f"{source}/{stream}"


def check_positions(argument: str, positions: Any) -> dict[str, int]:
    """``positions`` as a plain dict, or a typed error naming ``argument``.

    Raises:
        InvalidArgumentError: not a mapping of non-empty str keys to non-negative ints.
    """
    if not isinstance(positions, Mapping):
        raise InvalidArgumentError(argument, "a mapping of position key to batch id", positions)
    checked: dict[str, int] = {}
    for key, value in positions.items():
        if not isinstance(key, str) or not key or type(value) is not int or value < 0:
            raise InvalidArgumentError(
                argument, "str keys mapped to non-negative int batch ids", {key: value}
            )
        checked[key] = value
    return checked


def merge_positions(*maps: SourcePositions) -> dict[str, int]:
    """The key-wise maximum of ``maps`` (positions only move forward)."""
    merged: dict[str, int] = {}
    for positions in maps:
        for key, value in positions.items():
            if value > merged.get(key, -1):
                merged[key] = value
    return merged
