"""Errors of the runtime: actors that failed or went away, a graph that cannot run, a runtime
that is not running, jobs and barriers.

Every public name is re-exported from :mod:`barrierflow.errors`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import final

from barrierflow.channels.errors import BarrierflowError, InvalidArgumentError, ProtocolError

__all__ = [
    "ActorError",
    "ActorGoneError",
    "ActorFailedError",
    "GraphError",
    "NotRunningError",
    "MetricsPortError",
    "JobError",
    "DuplicateJobError",
    "UnknownJobError",
    "JobNotDeclaredError",
    "JobDroppingError",
    "BarrierCollectError",
    "BarrierNotPassedError",
    "BarrierStuckError",
    "NotAwaitedError",
    "KeyColumnError",
    "SinkSchemaError",
]


class ActorError(BarrierflowError):
    """Something went wrong with an actor of a runtime."""


@final
class ActorGoneError(ActorError):
    """A request can never be answered: the actor has stopped or its inbox is closed."""

    def __init__(self, actor: str, reason: str) -> None:
        self.actor = actor
        self.reason = reason
        super().__init__(f"actor {actor!r}: expected it to be running, but {reason}")


@final
class ActorFailedError(ActorError):
    """An actor raised, which stopped its graph; ``__cause__`` is what it raised.

    Attributes:
        failed_at: when the failure was reported (``time.perf_counter_ns()``, taken as the
            error is made, before the actor's outputs close): of several failures of one
            graph, the first in time is the cause of the others — a peer that saw its input
            end or its writer leave fails only after — so the runtime raises that one.
    """

    def __init__(self, actor: str, actor_id: int, cause: BaseException) -> None:
        self.actor = actor
        self.actor_id = actor_id
        self.cause = cause
        self.failed_at = time.perf_counter_ns()
        super().__init__(f"actor {actor!r} (id {actor_id}) failed: {type(cause).__name__}: {cause}")


class GraphError(InvalidArgumentError):
    """The graph handed to a runtime is not one it can run (cycle, missing input, ...)."""


@final
class NotRunningError(BarrierflowError):
    """A runtime (or something that needs one) was used while it is not running."""

    def __init__(self, what: str, how: str) -> None:
        self.what = what
        super().__init__(f"{what} is not running: {how}")


@final
class MetricsPortError(InvalidArgumentError):
    """The metrics endpoint (``RuntimeConfig.metrics_port``) could not bind its address when
    the runtime started: the port is taken (by another runtime or program, or a previous run
    that has not let go of it yet), needs privileges, or the host is not an address of this
    machine. The runtime does not start. ``__cause__`` is the operating system's error (also an
    :class:`InvalidArgumentError`).

    Attributes:
        argument: ``"metrics_port"``, the setting to change.
        host: ``RuntimeConfig.metrics_host``, the address it tried.
        port: the port it tried.
        reason: what the operating system said (``"Address already in use"``).
        expected, got: as for every :class:`InvalidArgumentError`.
    """

    def __init__(self, host: str, port: int, reason: str) -> None:
        self.argument = "metrics_port"
        self.host = host
        self.port = port
        self.reason = reason
        self.expected = f"a port free to bind on {host}"
        self.got = port
        Exception.__init__(
            self,
            f"RuntimeConfig.metrics_port: expected a port free to bind on {host} for the "
            f"metrics endpoint, got {port}, which cannot be bound ({reason}); choose another "
            "port, 0 for any free one, or None for no endpoint",
        )


class JobError(GraphError):
    """A job cannot be added, dropped or restored as asked.

    Attributes:
        job: the job's name.
    """

    def __init__(self, job: object, expected: str, got: object) -> None:
        super().__init__("job", expected, got)
        self.job = job


@final
class DuplicateJobError(JobError):
    """A job was declared or added under a name another job has."""

    def __init__(self, job: object) -> None:
        super().__init__(job, "a name not used by another job", job)


@final
class UnknownJobError(JobError):
    """A job that does not exist (or no longer runs) was named.

    Attributes:
        known: the jobs that exist.
    """

    def __init__(self, job: object, known: list[str]) -> None:
        super().__init__(job, f"one of the jobs {known}", job)
        self.known = list(known)


@final
class JobNotDeclaredError(JobError):
    """The state store holds a job the program did not declare before starting.

    Factories are code, not data: a job added at runtime must be declared again when the program
    restarts (``rt.declare_job(job)``), or dropped explicitly (``rt.forget_job(name)``), so
    that its state is never silently orphaned or reused.

    Attributes:
        created_epoch: the epoch the job was created at.
    """

    def __init__(self, job: str, created_epoch: int) -> None:
        super().__init__(
            job,
            "every job in the state store declared before start (declare it, or forget it)",
            f"job {job!r} (created at epoch {created_epoch}) not declared",
        )
        self.created_epoch = created_epoch


@final
class JobDroppingError(JobError):
    """A new job reads an actor of a job that is being dropped.

    Attributes:
        upstream: the actor read.
        dropping: the job being dropped.
    """

    def __init__(self, job: object, upstream: str, dropping: str) -> None:
        super().__init__(
            job,
            "upstreams of running jobs",
            f"actor {upstream!r} of job {dropping!r}, which is being dropped",
        )
        self.upstream = upstream
        self.dropping = dropping


@final
class BarrierCollectError(ProtocolError):
    """An actor reported a barrier collected that the barrier manager does not wait for it to
    collect: the barrier's epoch is not in flight (never injected, or already completed), or
    the actor already collected it (or was not part of the graph when it was injected).

    Attributes:
        actor_id: the actor that reported the barrier.
        epoch: the barrier's epoch (``curr``).
        in_flight: the epochs in flight, oldest first.
        epoch_in_flight: whether ``epoch`` is in flight (``True``: the actor collected it
            twice, or was not waited for; ``False``: it was never injected or already completed).
    """

    def __init__(self, actor_id: int, epoch: int, in_flight: Iterable[int]) -> None:
        self.actor_id = actor_id
        self.epoch = epoch
        self.in_flight = tuple(in_flight)
        self.epoch_in_flight = epoch in self.in_flight
        got = (
            f"epoch {epoch} again (it is in flight, but this actor already collected it or was "
            "not part of the graph when it was injected)"
            if self.epoch_in_flight
            else f"epoch {epoch}, which is not in flight (never injected, or already completed)"
        )
        super().__init__(
            f"actor {actor_id}: expected to collect each in-flight barrier once (in flight: "
            f"{list(self.in_flight)}), got {got}"
        )


@final
class BarrierStuckError(BarrierflowError):
    """A barrier was not passed on by every actor in time: ``checkpoint(timeout=...)`` ran out,
    or leaving ``async with`` hit ``RuntimeConfig.stop_timeout``.

    The actors named first are the culprits: they hold the barrier while every actor upstream
    of them has passed it (an actor that forgot ``await ctx.emit(barrier)``, or one blocked in
    its own code). The others only wait for them.

    Attributes:
        epoch: the stuck barrier's epoch (``curr``).
        waited: seconds since it was injected.
        culprits: the names of the actors holding it.
        waiting: the names of the actors downstream of them that wait for it.
        detail: per culprit, what it is doing (the input it waits on or left unread, the
            output it is blocked on).
    """

    def __init__(
        self,
        epoch: int,
        waited: float,
        culprits: Iterable[str],
        waiting: Iterable[str],
        detail: str,
    ) -> None:
        self.epoch = epoch
        self.waited = waited
        self.culprits = tuple(culprits)
        self.waiting = tuple(waiting)
        self.detail = detail
        also = f"; downstream still waiting: {list(self.waiting)}" if self.waiting else ""
        super().__init__(
            f"barrier of epoch {epoch} not passed on after {waited:.1f} s by {detail}{also} "
            "(every actor must pass each barrier it reads: `await ctx.emit(barrier)`)"
        )


@final
class BarrierNotPassedError(ProtocolError):
    """An actor emitted rows before passing on its first barrier: its downstream would fail on
    rows that belong to no epoch, and be blamed for it. (An actor that holds a later barrier
    for good is named by the barrier watchdog: see :class:`BarrierStuckError`.)

    Attributes:
        actor: the actor's name.
        then: what it did instead.
    """

    def __init__(self, actor: str, then: str) -> None:
        self.actor = actor
        self.then = then
        super().__init__(
            f"actor {actor!r} {then} before passing on its first barrier: every barrier an "
            "actor reads must be passed downstream with `await ctx.emit(barrier)`, and no row "
            "may go before the first one"
        )


@final
class KeyColumnError(GraphError):
    """An actor's input is hash-dispatched by a column its upstream does not emit (or cannot
    hash), found from the upstream's known schema when the actor is declared or the graph
    starts — not on the first chunk, where it would fail in the upstream.

    Attributes:
        actor: the actor (or parallel group) reading the hash-dispatched input.
        column: the key column that is missing or not hashable.
        upstream: the actor whose output is dispatched.
        columns: the columns ``upstream`` emits (``"name: type"``).
    """

    def __init__(
        self, actor: str, column: str, upstream: str, columns: Iterable[str], why: str
    ) -> None:
        self.actor = actor
        self.column = column
        self.upstream = upstream
        self.columns = tuple(columns)
        super().__init__("key", f"key columns {why}", column)
        self.args = (
            f"actor {actor!r}: hash key column {column!r} {why} (input {upstream!r} has "
            f"columns: {', '.join(self.columns) or 'none'})",
        )


@final
class SinkSchemaError(GraphError):
    """A sink's schema differs from the schema its input is known to emit: every batch would
    be refused at the first checkpoint, so the graph is refused when it is declared or starts.

    Attributes:
        sink: the sink writer (the actor's name).
        upstream: the actor whose output it reads.
        difference: what differs, in words (a field's type, a missing or extra column, ...).
        fix: how to fix a difference of time zone or integer width (a cast), else ``""``.
    """

    def __init__(self, sink: str, upstream: str, difference: str, fix: str) -> None:
        self.sink = sink
        self.upstream = upstream
        self.difference = difference
        self.fix = fix
        super().__init__("schema", f"the schema of input {upstream!r}", difference)
        hint = f"; {fix}" if fix else ""
        self.args = (
            f"sink {sink!r}: its schema differs from that of its input {upstream!r}: "
            f"{difference}{hint}",
        )


@final
class NotAwaitedError(BarrierflowError):
    """Runtime calls were made without ``await``: they did nothing (rows never pushed, a
    checkpoint never taken). Raised when leaving ``async with rt:`` (each call was also logged
    as an error when Python collected it).

    Attributes:
        calls: how each call read, e.g. ``"rt.push('events', ...)"``.
    """

    def __init__(self, calls: Iterable[str]) -> None:
        self.calls = tuple(calls)
        super().__init__(
            f"{self.calls[0]} was called without `await` ({len(self.calls)} such call(s): "
            f"{sorted(set(self.calls))}): it did nothing; write `await {self.calls[0]}`"
        )
