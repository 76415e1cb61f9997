"""The runtime's own metrics, read from the counters its parts keep (see
:mod:`barrierflow.runtime.metrics`): runtime, jobs, actors, channels — and whatever the actors
and services that report metrics of their own (:class:`~.metrics.ReportsMetrics`) add.

**Busy, backpressured, idle.** An actor is *backpressured* while it waits to send into a full
output channel (the blocked seconds of the channels it sends into), *idle* while it waits for
input (the seconds it spent parked on its input channel; with several aligned inputs, on the
channel its merge feeds it through — the merge's own waits on each input go on while the actor
works or is blocked on its output; with several inputs it reads itself, the longest: it reads
them concurrently, so their waits overlap), and *busy* the rest of the time since its graph
started — Flink's ``busyTimeMsPerSecond`` / ``backPressuredTimeMsPerSecond`` /
``idleTimeMsPerSecond`` as counters of seconds (a dashboard takes their ``rate``).

Busy is uptime less the waits, so each counter must only grow: a wait counts as it goes (see
:meth:`~barrierflow.channels.channel.SendChannel.statistics`), not whole once it ended —
else busy time would rise through a long wait and fall back by its length at its end, which
Prometheus reads as a counter reset — and the uptime and every wait are read at one instant.
(Waits that overlap — an actor blocked on its output while a task of its own waits for its
input — would still make it fall; no actor of barrierflow's does that.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, final

from barrierflow.channels.channel import ChannelStatistics
from barrierflow.runtime.metrics import MetricFamily, ReportsMetrics, counter, gauge
from barrierflow.runtime.progress import JobProgress

__all__ = ["ActorTimes", "runtime_families"]

Values = list[tuple[Mapping[str, str], float]]

#: What each of the runtime's metrics means (its HELP line).
_HELP = {
    "epoch": "curr of the last injected barrier",
    "committed": "the last durable checkpoint epoch",
    "in_flight": "barriers injected, not yet completed (epochs in flight)",
    "restarts": "graph restarts (recovery)",
    "ready": "1 once every backfilling actor of the job finished",
    "backfill_rows": "rows the job's actors backfilled",
    "backfill_fraction": "how far the job's backfill is, 0..1",
    "phase": "1 for the job's phase now (ready, snapshot, change_log, backfilling, ...)",
    "splits_finished": "splits the job's source backfills finished",
    "splits": "splits the job's source backfills read",
    "vnodes_done": "vnodes the job's snapshot backfills finished",
    "vnodes": "vnodes the job's snapshot backfills read",
    "epochs_owed": "epochs whose change log the job's snapshot backfills still owe",
    "rows_in": "rows of the chunks an actor read",
    "rows_out": "rows of the chunks an actor emitted",
    "messages_in": "messages an actor read",
    "barriers": "barriers an actor passed on",
    "busy": "seconds an actor worked: neither waiting for input nor blocked on output",
    "pressured": "seconds an actor waited to send into a full output channel",
    "idle": "seconds an actor waited for input",
    "buffered": "messages buffered in a channel now",
    "buffered_rows": "row permits held by a channel's buffered chunks now",
    "capacity": "a channel's capacity in messages",
    "messages": "messages a channel accepted",
    "rows": "rows of the chunks a channel accepted",
    "blocked": "sends that waited for room (backpressure events)",
    "wait": "seconds senders waited for room in a channel",
    "alignment": "seconds an actor's merge spent aligning barriers (first to last input)",
    "state_rows": "state rows (upserts and deletes) checkpoints wrote to the store",
}


#: The per-job backfill gauges (``barrierflow_backfill_<name>``) and what each reads.
_BACKFILL: dict[str, Callable[[JobProgress], float]] = {
    "splits_finished": lambda p: p.splits[0],
    "splits": lambda p: p.splits[1],
    "vnodes_done": lambda p: p.vnodes[0],
    "vnodes": lambda p: p.vnodes[1],
    "epochs_owed": lambda p: p.epochs_owed,
}


def _edges(name: str) -> tuple[str, str] | None:
    """``(sender, receiver)`` of an edge channel ``"a->b"``; a source's inbox ``"a inbox"``
    is ``("", "a")``."""
    if "->" in name:
        sender, receiver = name.split("->", 1)
        return sender, receiver
    if name.endswith(" inbox"):
        return "", name.removesuffix(" inbox")
    return None


def _actor_times(
    actors: Iterable[str],
    channels: Mapping[str, ChannelStatistics],
    uptime: float,
    merged_waits: Mapping[str, float],
) -> dict[str, tuple[float, float, float]]:
    """Actor → (busy, backpressured, idle) seconds (see the module docstring); an actor of
    ``merged_waits`` waited that long on the channel its merge feeds it through."""
    sent: dict[str, float] = {}
    waited: dict[str, float] = {}
    for name, stats in channels.items():
        ends = _edges(name)
        if ends is None:
            continue
        sender, receiver = ends
        if sender:
            sent[sender] = sent.get(sender, 0.0) + stats.blocked_seconds
        waited[receiver] = max(waited.get(receiver, 0.0), stats.receive_wait_seconds)
    waited.update(merged_waits)
    times: dict[str, tuple[float, float, float]] = {}
    for actor in actors:
        pressured = min(sent.get(actor, 0.0), uptime)
        idle = min(waited.get(actor, 0.0), uptime - pressured)
        times[actor] = (max(uptime - pressured - idle, 0.0), pressured, idle)
    return times


@final
class ActorTimes:
    """The busy, backpressured and idle seconds reported for each actor of one graph
    incarnation, each never less than the last reported.

    The derivation (see the module docstring) only grows in exact arithmetic; in floating
    point, uptime less waits that grow as fast as it (an actor idle, or blocked) can come out
    an ulp below the last reading — a decrease all the same to Prometheus. So each value
    reported is the larger of the new one and the last one: a guard against rounding, at most
    a few ulps above the derivation, never a way to hide a wait counted late (a wait counts as
    it goes, so there is none to hide).
    """

    def __init__(self) -> None:
        self._reported: dict[str, tuple[float, float, float]] = {}

    def read(
        self,
        actors: Iterable[str],
        channels: Mapping[str, ChannelStatistics],
        uptime: float,
        merged_waits: Mapping[str, float],
    ) -> dict[str, tuple[float, float, float]]:
        """Actor → (busy, backpressured, idle) seconds now, from the ``channels`` and
        ``merged_waits`` (the seconds an actor with a merge waited on the channel the merge
        feeds it through) as of ``uptime`` seconds since the graph started."""
        times = _actor_times(actors, channels, uptime, merged_waits)
        for actor, now in times.items():
            last = self._reported.get(actor)
            if last is not None:
                times[actor] = (max(now[0], last[0]), max(now[1], last[1]), max(now[2], last[2]))
        self._reported.update(times)
        return times


def runtime_families(
    stats: Any,
    progress: Mapping[str, JobProgress],
    parts: Iterable[object],
    uptime: float,
    alignment: Mapping[str, float] | None = None,
    rows_written: int = 0,
    *,
    merged_waits: Mapping[str, float] | None = None,
    actor_times: ActorTimes | None = None,
) -> list[MetricFamily]:
    """The runtime's families from its ``stats`` (a ``RuntimeStats``), its jobs' ``progress``,
    the ``parts`` (actor instances, services) that may report their own, the seconds since its
    graph started, its merges' ``alignment`` seconds, the state rows checkpoints wrote, the
    seconds each actor with a merge waited on the channel the merge feeds it through (taken
    when ``stats`` and ``uptime`` were), and what its incarnation's ``actor_times`` reported
    before (default: nothing)."""
    job_of = {actor: job for job, s in stats.jobs.items() for actor in s.actors}
    labels = {name: {"job": job_of.get(name, ""), "actor": name} for name in stats.actors}
    reader = ActorTimes() if actor_times is None else actor_times
    times = reader.read(stats.actors, stats.channels, uptime, merged_waits or {})

    def runtime(value: float) -> Values:
        return [({}, value)]

    def per_job(value: Callable[[str], float]) -> Values:
        return [({"job": job}, value(job)) for job in stats.jobs]

    def per_actor(field: str) -> Values:
        return [(labels[n], getattr(s, field)) for n, s in stats.actors.items()]

    def per_time(index: int) -> Values:
        return [(labels[n], t[index]) for n, t in times.items()]

    def per_channel(field: str) -> Values:
        return [({"channel": n}, getattr(s, field)) for n, s in stats.channels.items()]

    def rows(job: str) -> float:
        return progress[job].rows if job in progress else 0

    def done(job: str) -> float:
        return progress[job].fraction_done if job in progress else 1.0

    def backfill(read: Callable[[JobProgress], float]) -> Values:
        return [({"job": job}, read(progress[job])) for job in stats.jobs if job in progress]

    families = [
        gauge("barrierflow_epoch_current", _HELP["epoch"], runtime(stats.current_epoch)),
        gauge("barrierflow_epoch_committed", _HELP["committed"], runtime(stats.committed_epoch)),
        gauge(
            "barrierflow_barriers_in_flight", _HELP["in_flight"], runtime(stats.barriers_in_flight)
        ),
        counter("barrierflow_restarts", _HELP["restarts"], runtime(stats.restarts)),
        gauge("barrierflow_job_ready", _HELP["ready"], per_job(lambda j: stats.jobs[j].ready)),
        gauge("barrierflow_backfill_rows", _HELP["backfill_rows"], per_job(rows)),
        gauge("barrierflow_backfill_fraction", _HELP["backfill_fraction"], per_job(done)),
        gauge(
            "barrierflow_job_phase",
            _HELP["phase"],
            [
                ({"job": j, "phase": progress[j].phase if j in progress else "ready"}, 1.0)
                for j in stats.jobs
            ],
        ),
        *(
            gauge(f"barrierflow_backfill_{name}", _HELP[name], backfill(read))
            for name, read in _BACKFILL.items()
        ),
        counter("barrierflow_actor_rows_in", _HELP["rows_in"], per_actor("rows_in")),
        counter("barrierflow_actor_rows_out", _HELP["rows_out"], per_actor("rows_out")),
        counter("barrierflow_actor_messages_in", _HELP["messages_in"], per_actor("messages_in")),
        counter("barrierflow_actor_barriers", _HELP["barriers"], per_actor("barriers")),
        counter("barrierflow_actor_busy_seconds", _HELP["busy"], per_time(0)),
        counter("barrierflow_actor_backpressured_seconds", _HELP["pressured"], per_time(1)),
        counter("barrierflow_actor_idle_seconds", _HELP["idle"], per_time(2)),
        gauge(
            "barrierflow_channel_buffered_messages",
            _HELP["buffered"],
            per_channel("buffered_messages"),
        ),
        gauge(
            "barrierflow_channel_buffered_rows",
            _HELP["buffered_rows"],
            per_channel("buffered_rows"),
        ),
        gauge(
            "barrierflow_channel_capacity_messages", _HELP["capacity"], per_channel("max_messages")
        ),
        counter("barrierflow_channel_messages", _HELP["messages"], per_channel("messages_sent")),
        counter("barrierflow_channel_rows", _HELP["rows"], per_channel("rows_sent")),
        counter(
            "barrierflow_channel_blocked_sends", _HELP["blocked"], per_channel("blocked_sends")
        ),
        counter(
            "barrierflow_channel_sender_wait_seconds", _HELP["wait"], per_channel("blocked_seconds")
        ),
        counter("barrierflow_checkpoint_rows_written", _HELP["state_rows"], runtime(rows_written)),
        counter(
            "barrierflow_merge_alignment_seconds",
            _HELP["alignment"],
            [(labels.get(a, {"actor": a}), v) for a, v in (alignment or {}).items()],
        ),
    ]
    for part in parts:
        if isinstance(part, ReportsMetrics):
            families.extend(part.metric_families())
    return families
