"""One run of a demo act as its own process group, killed at a chosen event of its trace or at a
chosen moment of its wall-clock time.

The run is started in a new session (``start_new_session``), so the driver and everything it
starts — the Spark JVM, the Valkey server — share one process group, and ``killpg(SIGKILL)``
takes them all down at once, as a power cut or an OOM kill of a container would. PySpark's
Python daemon and its workers put themselves in a group of their own: a ``killpg`` misses them
as it would in a real crash, and they exit on their own once their JVM is gone. So the
descendants found outside the group at the kill are given :data:`ORPHAN_GRACE_SECONDS` (times
``BARRIERFLOW_TEST_TIMEOUT_SCALE``) to exit; only those still running then are survivors —
reported, and killed, so that nothing they write reaches the run that resumes after them. The run's
trace file (:mod:`barrierflow.app._trace`) tells the harness when the chosen event has happened;
after the kill its last line tells where the run was. A :class:`KillAfter` ignores the trace
and kills a fixed number of seconds after the run was started: the moments no traced event
marks (between two events, or in code that traces nothing) are reachable only that way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import final

from barrierflow._timeout_scale import timeout_scale
from barrierflow.app._trace import ENV as TRACE_ENV

__all__ = ["KillAfter", "KillAt", "RunOutcome", "escaped", "group_members", "run_until"]

#: How often the trace file is polled for new lines.
_POLL_SECONDS = 0.002
#: How long the members of a killed group may take to disappear from ``/proc``.
_REAP_SECONDS = 10.0
#: How long processes that had left the killed group (PySpark's daemon and workers) may take
#: to exit on their own, before the scale of ``BARRIERFLOW_TEST_TIMEOUT_SCALE``.
ORPHAN_GRACE_SECONDS = 10.0


@final
@dataclass(frozen=True, slots=True)
class KillAt:
    """Kill the run ``delay`` seconds after the ``occurrence``-th ``event`` line of its trace
    (whose detail contains ``detail``, if given)."""

    event: str
    occurrence: int = 1
    delay: float = 0.0
    detail: str = ""

    def matches(self, event: str, detail: str) -> bool:
        return event == self.event and self.detail in detail

    def describe(self) -> str:
        what = f"{self.event}[{self.detail}]" if self.detail else self.event
        return f"{what}#{self.occurrence}+{self.delay * 1000:.0f}ms"


@final
@dataclass(frozen=True, slots=True)
class KillAfter:
    """Kill the run ``seconds`` after it was started (wall clock, whatever it traced)."""

    seconds: float

    def describe(self) -> str:
        return f"t+{self.seconds:.3f}s"


@final
@dataclass(frozen=True, slots=True)
class RunOutcome:
    """How a run ended.

    Attributes:
        killed: the harness killed it (else it exited by itself with ``returncode``).
        returncode: the driver's exit status (``-9`` when killed).
        seconds: from start to the end of the run.
        where: the last trace line before the kill or exit (event and detail), ``""`` if none.
        events: trace lines seen in this run.
        survivors: pids of the group still alive after the kill, descendants of the driver
            that had left its group, or processes left running after the driver exited
            (should be none).
        timed_out: the run passed its time limit and was killed for it.
        orphans: processes that had left the group and exited on their own after the kill,
            within the grace (PySpark's daemon and workers; not survivors).
    """

    killed: bool
    returncode: int
    seconds: float
    where: str
    events: int
    survivors: tuple[int, ...] = ()
    timed_out: bool = False
    #: Processes in the group when it was killed (the driver, the Spark JVM, a server...).
    members: int = 0
    orphans: int = 0


def _processes() -> dict[int, tuple[int, int]]:
    """Every live (not zombie) process: pid → (parent pid, process group), from ``/proc``."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name (field 2) is in parentheses and may hold spaces.
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z":
            table[int(entry.name)] = (int(fields[1]), int(fields[2]))
    return table


def group_members(pgid: int) -> list[int]:
    """Pids of the live processes of process group ``pgid``."""
    return [pid for pid, (_, group) in _processes().items() if group == pgid]


def escaped(pid: int) -> list[int]:
    """Descendants of ``pid`` that left its process group (a ``killpg`` would miss them)."""
    table = _processes()
    children: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    found, stack = [], list(children.get(pid, []))
    while stack:
        child = stack.pop()
        if table[child][1] != pid:
            found.append(child)
        stack.extend(children.get(child, []))
    return found


def _start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), ``None`` if it is gone or a zombie: with
    the pid it names one process, never a later one that reuses the pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] == "Z" else int(fields[19])


def _outlast(orphans: Mapping[int, int], grace: float) -> tuple[int, ...]:
    """Wait up to ``grace`` seconds for the ``orphans`` (pid → start time) to exit; kill and
    return those still running then."""
    deadline = time.monotonic() + grace
    alive = dict(orphans)
    while True:
        alive = {pid: t for pid, t in alive.items() if _start_time(pid) == t}
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    for pid, started in alive.items():
        if _start_time(pid) == started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return tuple(alive)


def _kill_group(pgid: int) -> tuple[int, ...]:
    """SIGKILL the group; the pids still alive after :data:`_REAP_SECONDS`."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return ()
    return _still_running(pgid)


def _still_running(pgid: int) -> tuple[int, ...]:
    """The group's members that have not gone within :data:`_REAP_SECONDS`."""
    deadline = time.monotonic() + _REAP_SECONDS
    while (alive := group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return tuple(alive)


class _Tail:
    """The lines a run has appended to its trace file since the last :meth:`read`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.pending = b""
        self.lines = 0
        #: The last line read, as ``event detail``.
        self.last = ""

    def read(self) -> list[tuple[str, str]]:
        """The new whole lines, as ``(event, detail)``."""
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        *whole, self.pending = (self.pending + chunk).split(b"\n")
        events = [_event_of(raw.decode(errors="replace")) for raw in whole]
        self.lines += len(events)
        if events:
            self.last = " ".join(events[-1]).strip()
        return events


def _event_of(line: str) -> tuple[str, str]:
    """``(event, detail)`` of a trace line ``<seconds> <event> [detail]``."""
    parts = line.split(maxsplit=2)
    if len(parts) < 2:
        return "", ""
    return parts[1], parts[2] if len(parts) > 2 else ""


def run_until(
    command: Sequence[str],
    *,
    trace: Path,
    log: Path,
    kill: KillAt | KillAfter | None,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    orphan_grace: float | None = None,
) -> RunOutcome:
    """Run ``command`` in its own process group until it exits, or kill the whole group at
    ``kill`` — a traced event, or a moment after the start — (or when ``timeout`` seconds
    have passed). Its output goes to ``log``. After a kill, the descendants that had left the
    group get ``orphan_grace`` seconds (default :data:`ORPHAN_GRACE_SECONDS` times
    ``BARRIERFLOW_TEST_TIMEOUT_SCALE``) to exit on their own (see the module docstring)."""
    grace = ORPHAN_GRACE_SECONDS * timeout_scale() if orphan_grace is None else orphan_grace
    trace.unlink(missing_ok=True)
    environment = {**os.environ, **(env or {}), TRACE_ENV: str(trace)}
    started = time.monotonic()
    with log.open("ab") as out:
        process = subprocess.Popen(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=environment,
            cwd=cwd,
            start_new_session=True,
        )
    tail = _Tail(trace)
    seen = 0
    fire_at = started + kill.seconds if isinstance(kill, KillAfter) else None
    try:
        while True:
            now = time.monotonic()
            for event, detail in tail.read():
                if isinstance(kill, KillAt) and fire_at is None and kill.matches(event, detail):
                    seen += 1
                    if seen == kill.occurrence:
                        fire_at = now + kill.delay
            if (fire_at is not None and now >= fire_at) or now - started > timeout:
                timed_out = fire_at is None or now < fire_at
                members = len(group_members(process.pid))
                outside = {
                    pid: t for pid in escaped(process.pid) if (t := _start_time(pid)) is not None
                }
                survivors = _kill_group(process.pid)
                process.wait()
                stayed = _outlast(outside, grace)
                tail.read()  # what it traced between the last poll and the kill
                return RunOutcome(
                    True, process.returncode, now - started, tail.last, tail.lines,
                    survivors + stayed, timed_out, members, len(outside) - len(stayed),
                )  # fmt: skip
            if process.poll() is not None:
                # What the driver left running in its group (after a grace period for the
                # JVM to notice its driver is gone) is reported, then killed.
                survivors = _still_running(process.pid)
                _kill_group(process.pid)
                tail.read()
                return RunOutcome(
                    False, process.returncode, now - started, tail.last, tail.lines, survivors
                )
            time.sleep(_POLL_SECONDS)
    finally:
        if process.poll() is None:
            _kill_group(process.pid)
            process.wait()
