"""The barrier watchdog: when a barrier stays in flight too long, say which actor holds it.

A barrier is stuck when some actor has not passed it on. The actors that hold it are the ones
whose every upstream actor has passed it: the barrier reached them and went no further (an
actor that forgot ``await ctx.emit(barrier)``, or one blocked in its own code). Everything
downstream of them only waits. :func:`diagnose` names those culprits and, for each, what the
channels around it show — the input it waits on or left unread, the output it is blocked on —
in one line; the watchdog logs that line as a warning once a barrier has been in flight for
``RuntimeConfig.stuck_barrier_intervals`` barrier intervals, then again each time the wait
doubles (not once per interval), and ``Runtime.checkpoint(timeout=...)`` and leaving
``async with`` past ``RuntimeConfig.stop_timeout`` raise it as a
:class:`~barrierflow.runtime.errors.BarrierStuckError`. An actor that *finished* without
passing a barrier on holds it for good: leaving ``async with`` raises the same error at once
when that barrier is the final ``Stop`` checkpoint, whose rows would otherwise be left
uncommitted behind a clean exit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import final

import anyio
import structlog

from barrierflow.channels.channel import ChannelStatistics
from barrierflow.runtime.barrier_manager import BarrierManager, InFlightBarrier
from barrierflow.runtime.errors import BarrierStuckError

__all__ = ["BarrierWatchdog", "diagnose"]


def diagnose(
    flight: InFlightBarrier,
    names: Mapping[int, str],
    upstreams: Mapping[str, Iterable[str]],
    channels: Iterable[ChannelStatistics],
) -> BarrierStuckError:
    """The error that names who holds ``flight``: the actors that have not passed it on —
    still running (:attr:`~InFlightBarrier.remaining`) or finished without it
    (:attr:`~InFlightBarrier.missed`) — split into the culprits, whose every upstream passed
    it, and those downstream of them that only never got it. An actor that finished because
    its input ended before the barrier was sent to it (its upstream was stopped earlier) lost
    nothing and is not named (see :func:`_lost_by`); with no culprit left, the error names
    nobody (``culprits`` is empty).

    Args:
        flight: the stuck barrier.
        names: actor id → name, for every actor of the graph.
        upstreams: actor name → the names of the actors it reads.
        channels: the graph's channels now (``"a->b"`` edges, ``"a inbox"`` inboxes).
    """
    ended = _lost_by(flight, names, upstreams)
    stuck = ended.union(names.get(i, f"actor {i}") for i in flight.remaining)
    culprits = sorted(a for a in stuck if not stuck.intersection(upstreams.get(a, ())))
    waiting = sorted(stuck.difference(culprits))
    stats = list(channels)
    detail = (
        "; ".join(f"{a!r} ({_FINISHED if a in ended else _doing(a, stats)})" for a in culprits)
        or "nobody: every actor passed it, its checkpoint is still being committed"
    )
    waited = anyio.current_time() - flight.injected_at
    return BarrierStuckError(flight.barrier.epoch.curr, waited, culprits, waiting, detail)


def _lost_by(
    flight: InFlightBarrier, names: Mapping[int, str], upstreams: Mapping[str, Iterable[str]]
) -> set[str]:
    """The names of the actors that finished without passing ``flight`` on although it was
    sent to them — every upstream passed it (a source: it was injected into it) — and of the
    finished ones downstream of such an actor or of one still holding it. A finished actor
    whose upstream ended before passing it (stopped alone at an earlier barrier) was never
    sent it: its input ended, and nothing behind the barrier was lost there."""
    passed = {names.get(i, f"actor {i}") for i in flight.passed}
    missed = {names.get(i, f"actor {i}") for i in flight.missed}
    lost = {a for a in missed if passed.issuperset(upstreams.get(a, ()))}
    holding = lost.union(names.get(i, f"actor {i}") for i in flight.remaining)
    grew = True
    while grew:  # the finished actors downstream of one that lost or holds it
        behind = {a for a in missed - lost if holding.intersection(upstreams.get(a, ()))}
        grew = bool(behind)
        lost |= behind
        holding |= behind
    return lost


#: What a culprit that finished without collecting the barrier did (its input ended after the
#: barrier reached it, or before: a source that ended on its own).
_FINISHED = "finished without passing it on"


def _doing(actor: str, channels: list[ChannelStatistics]) -> str:
    """What the channels around ``actor`` show it doing: waiting on an input (it read the
    barrier and did not pass it), blocked on a full output, or neither — busy in its own code."""
    waits: list[str] = []
    unread: list[str] = []
    blocked: list[str] = []
    for st in channels:
        upstream, arrow, downstream = st.name.partition("->")
        if (arrow and downstream == actor) or st.name == f"{actor} inbox":
            source = repr(upstream) if arrow else "its inbox"
            if st.buffered_messages:
                unread.append(f"{st.buffered_messages} message(s) unread from {source}")
            elif st.tasks_waiting_receive:
                waits.append(f"waiting on input {source} after reading the barrier")
        if arrow and upstream == actor and st.tasks_waiting_send:
            blocked.append(f"blocked sending to {downstream!r}, whose input is full")
    if not waits and not blocked:
        waits.append("busy in its own code: not reading its input, not blocked on an output")
    return ", ".join(waits + blocked + unread)


@final
class BarrierWatchdog:
    """Warns, naming the actors that hold it, when the oldest barrier in flight has waited
    ``after_intervals`` barrier intervals; warns again each time that wait doubles.

    Args:
        manager: the barrier manager whose barriers it watches.
        describe: builds the error naming who holds the oldest barrier (see :func:`diagnose`).
        after_intervals: barrier intervals in flight before the first warning.
    """

    def __init__(
        self,
        manager: BarrierManager,
        describe: Callable[[], BarrierStuckError],
        *,
        after_intervals: int,
    ) -> None:
        self._manager = manager
        self._describe = describe
        self._after = after_intervals * manager.barrier_interval
        self._log = structlog.get_logger("barrierflow.watchdog")

    async def run(self) -> None:
        """Check the oldest barrier twice per warning period, until cancelled."""
        watched: InFlightBarrier | None = None
        warn_at = self._after
        while True:
            await anyio.sleep(self._after / 2)
            flight = self._manager.oldest()
            if flight is None or not flight.remaining:
                continue  # nothing in flight, or only its commit is pending
            if flight is not watched:
                watched, warn_at = flight, self._after
            waited = anyio.current_time() - flight.injected_at
            if waited >= warn_at:
                error = self._describe()
                self._log.warning(
                    str(error),
                    epoch=error.epoch,
                    culprits=list(error.culprits),
                    waited_s=round(waited, 3),
                )
                warn_at = 2 * waited  # the next one once the wait doubled, however late this was
