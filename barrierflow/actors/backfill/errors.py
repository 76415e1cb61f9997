"""Errors of the snapshot backfill and the materialize actor.

Every public name is re-exported from :mod:`barrierflow.errors`.
"""

from __future__ import annotations

from typing import final

from barrierflow.channels.errors import ProtocolError
from barrierflow.runtime.errors import GraphError

__all__ = [
    "NotAMaterializedViewError",
    "SnapshotBackfillStateError",
    "VnodeUpdateDuringBackfillError",
]


@final
class NotAMaterializedViewError(GraphError):
    """A snapshot backfill was declared over an actor that keeps no materialized view.

    Attributes:
        view: the actor (or parallel group) named as the view.
        table: the view table looked for.
    """

    def __init__(self, view: str, table: str) -> None:
        super().__init__(
            "view",
            f"a materialized view (a Materialize actor keeping table {table!r}) running in "
            "this runtime",
            view,
        )
        self.view = view
        self.table = table


@final
class VnodeUpdateDuringBackfillError(ProtocolError):
    """A vnode-bitmap update reached a snapshot backfill before it finished: its progress is
    per vnode, so the vnodes it owns cannot change until it forwards (as in the seed).

    Attributes:
        actor: the backfill actor.
        phase: the phase it was in.
    """

    def __init__(self, actor: str, phase: str) -> None:
        super().__init__(
            f"snapshot backfill {actor}: expected no vnode-bitmap update before it forwards "
            f"the live upstream, got one in phase {phase}"
        )
        self.actor = actor
        self.phase = phase


@final
class SnapshotBackfillStateError(ProtocolError):
    """A snapshot backfill's saved state contradicts itself (a restarted job that finished
    with a vnode whose snapshot was not done, or a snapshot epoch the view no longer holds).

    Attributes:
        actor: the backfill actor.
        found: what the state holds.
    """

    def __init__(self, actor: str, expected: str, found: str) -> None:
        super().__init__(f"snapshot backfill {actor}: expected {expected}, got {found}")
        self.actor = actor
        self.found = found
