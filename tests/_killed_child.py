"""Running a child process that kills itself at a chosen point (the SIGKILL tests' children
print ``@ MARKER value...`` lines, and ``@ KILLING <point> <facts as JSON>`` right before)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
from _timeouts import scaled

ROOT = Path(__file__).resolve().parents[1]

#: The exit code of a child that ran to its end without meeting its kill point (it prints
#: ``@ MISSED``): the run was timed so that the point never came, nothing was killed.
MISSED = 3


class MissedKillPointError(AssertionError):
    """The child never met its kill point (see :data:`MISSED`)."""


async def run_killed_child(
    child: Path, args: Sequence[str], point: str
) -> tuple[dict[str, list[str]], Any]:
    """Run ``child`` with ``args`` until it SIGKILLs itself; its markers, and the facts of the
    kill point (asserting it died where it meant to, not by anything else)."""
    command = [sys.executable, str(child), *args]
    with anyio.fail_after(scaled(60)):  # run_process kills the child when cancelled
        done = await anyio.run_process(command, cwd=ROOT, check=False)
    out, err = done.stdout.decode(), done.stderr.decode()
    if done.returncode == MISSED and "\n@ MISSED" in f"\n{out}":
        raise MissedKillPointError(out[-3000:])
    assert done.returncode == -9, (done.returncode, out[-3000:], err[-3000:])
    markers: dict[str, list[str]] = {}
    for line in out.splitlines():
        if line.startswith("@ "):
            marker, *values = line[2:].split(maxsplit=1)
            markers.setdefault(marker, []).extend(values)
    (killing,) = markers["KILLING"]
    killed_at, facts = killing.split(maxsplit=1)
    assert killed_at == point
    return markers, json.loads(facts)
