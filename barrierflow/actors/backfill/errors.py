"""Errors of the snapshot backfill, the source backfill and the materialize actor.

Every public name is re-exported from :mod:`barrierflow.errors`.
"""

from __future__ import annotations

from typing import final

from barrierflow.channels.errors import ProtocolError
from barrierflow.runtime.errors import GraphError

__all__ = [
    "NotAMaterializedViewError",
    "SnapshotBackfillStateError",
    "UnfinishedSplitMigratedError",
    "UpstreamEndedDuringBackfillError",
    "UpstreamEndedDuringSourceBackfillError",
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
        expected: what the state should hold.
        found: what the state holds.
    """

    def __init__(self, actor: str, expected: str, found: str) -> None:
        super().__init__(f"snapshot backfill {actor}: expected {expected}, got {found}")
        self.actor = actor
        self.expected = expected
        self.found = found


@final
class UpstreamEndedDuringBackfillError(ProtocolError):
    """A snapshot backfill's upstream ended before the backfill forwarded it: the live chunks
    it dropped while backfilling (the snapshot unfinished, or closed epochs whose change log
    it has not replayed yet) would be lost without a word. The seed fails the same way
    (``anyhow!("end of upstream")``); only a backfill already forwarding may see its upstream
    end.

    Attributes:
        actor: the backfill actor.
        phase: the phase it was in (``"snapshot"`` or ``"change_log"``).
        epochs_owed: the closed epochs whose change log it still owed, oldest first (the
            epoch in progress is owed too: its live chunks were dropped).
        vnodes_left: the vnodes whose snapshot was unfinished.
    """

    def __init__(
        self, actor: str, phase: str, epochs_owed: list[int], vnodes_left: list[int]
    ) -> None:
        super().__init__(
            f"snapshot backfill {actor}: expected its upstream to go on until the backfill "
            f"forwards it, got the end of the upstream in phase {phase} with "
            f"{len(vnodes_left)} vnodes of the snapshot unfinished and the change log of "
            f"epochs {epochs_owed} (and of the epoch in progress) owed"
        )
        self.actor = actor
        self.phase = phase
        self.epochs_owed = list(epochs_owed)
        self.vnodes_left = list(vnodes_left)


@final
class UnfinishedSplitMigratedError(ProtocolError):
    """A split whose backfill is not finished was moved to a source backfill that already
    forwards the live source only (as in the seed, an error: that stage reads no history, so
    adopting the split would skip the rest of it).

    Attributes:
        actor: the source backfill actor the split moved to.
        split: the migrated split.
        phase: the split's committed backfill phase (``"backfilling"`` or ``"caching_up"``).
    """

    def __init__(self, actor: str, split: str, phase: str) -> None:
        super().__init__(
            f"source backfill {actor}: expected split {split!r}, migrated to it after its "
            f"backfill stage, to be finished, got one in phase {phase}"
        )
        self.actor = actor
        self.split = split
        self.phase = phase


@final
class UpstreamEndedDuringSourceBackfillError(ProtocolError):
    """A source backfill's upstream (the live source) ended while the backfill stage still ran:
    no barrier could come any more, so the history still to read could never be checkpointed
    nor handed over — without this error the actor would wait for ever. A source backfill's
    upstream ends only after a stop barrier, as in the seed, whose upstream never ends first.

    Attributes:
        actor: the source backfill actor.
        splits: the splits not finished yet (their history or their catch-up was owed), sorted.
    """

    def __init__(self, actor: str, splits: list[str]) -> None:
        super().__init__(
            f"source backfill {actor}: expected its upstream to go on until the backfill "
            f"stage ends, got the end of the upstream with splits {splits} not finished"
        )
        self.actor = actor
        self.splits = list(splits)
