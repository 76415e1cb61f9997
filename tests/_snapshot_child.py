"""The child process of ``test_snapshot_backfill_crash.py``: a snapshot backfill that kills
itself (run as a script: ``python tests/_snapshot_child.py STATE_DIR BACKEND POINT``).

The pipeline is ``test_snapshot_backfill.py``'s: the push source ``src`` into the materialized
view ``view``; job ``copy`` (a :class:`SnapshotBackfill` ``backfill`` over the view, then the
exactly-once ``Replay`` ``replay``) joins it at run time.

The child runs with ``barrier_interval=3600``: every barrier after the first is one it injects
itself (its checkpoints and the ``Add`` barrier of the job), so the backfill's durable state
moves only when the child says so, and each kill point is picked from the durable state a
checkpoint it injected has just made (read through the running runtime's own store, which
reads committed rows only) — never from a sleep:

* it pushes :data:`INITIAL_KEYS` keys, checkpoints, adds the job (``@ ADDED e``), then, round
  after round, pushes :data:`round_changes` (updates of existing keys, new keys, deletes: more
  than :data:`BATCH_ROWS` rows an epoch, so an epoch's change log takes several chunks) and
  checkpoints; after every completed checkpoint it writes the driver (every change per key and
  its value counter) to ``STATE_DIR/driver.json`` atomically, so the parent knows exactly
  which changes the view holds durably;
* the backfill is rate limited (:data:`RATE` rows/s, :data:`BATCH_ROWS` rows a chunk), and a
  chunk waits for the rate to allow it: the child's barriers come back to back, so in practice
  one chunk goes out per barrier — the snapshot spans dozens of checkpoints, and so does the
  catch-up (every epoch is owed; each barrier in ``change_log`` replays one or two);
* it kills itself (``@ KILLING POINT {facts}`` then ``SIGKILL``), by ``POINT``:

  - ``mid_snapshot``: right after the first checkpoint that made durable the phase
    ``snapshot`` with at least half the snapshot emitted and some vnode cut mid-way (its
    ``after`` key set, not ``done``, fewer rows emitted than the vnode holds as of the
    snapshot epoch);
  - ``between_phases``: right after the first checkpoint that made durable the phase
    ``change_log`` (every vnode done). The snapshot's end and the first change-log chunk go
    out in one step between two barriers, and a barrier in ``change_log`` replays at least the
    oldest owed epoch whole before it passes (the owed epochs must shrink): ``replayed`` is
    past the snapshot epoch already in the first durable state after the snapshot;
  - ``mid_change_log_epoch``: right after a checkpoint that made durable the phase
    ``change_log`` with ``log_offset > 0``, past the first checkpoint in that phase, the
    oldest owed epoch holding more change-log rows than ``log_offset`` (half replayed: every
    epoch holds more than a chunk, and is not a whole number of chunks);
  - ``right_after_forward``: right after the first checkpoint that made durable the phase
    ``forward``;
  - ``between_barrier_and_checkpoint``: ``StateStore.commit`` is patched to kill the process
    on the first commit after the job was added whose sealed writes of the backfill's state
    show the phase ``change_log``: every actor collected the barrier, its checkpoint is never
    written (the durable phase is still ``snapshot``).

Each line of its own on stdout is ``@ MARKER value...`` (structlog logs to stdout too). A child
that misses its kill point prints ``@ MISSED`` and exits with code 3.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import anyio
from test_snapshot_backfill import Upserts, copy_job, runtime

from barrierflow.actors.backfill.snapshot_backfill import TABLE
from barrierflow.channels import Chunk
from barrierflow.runtime import Runtime, StateStore

#: Keys in the view when the job is added.
INITIAL_KEYS = 2000
#: Rows of the snapshot emitted before ``mid_snapshot`` may kill (half of it).
HALF = INITIAL_KEYS // 2
#: Rows per backfill chunk, and the backfill's rate (rows/s): a chunk waits for the rate, so
#: with the child's back-to-back barriers about one chunk goes out per barrier.
BATCH_ROWS = 50
RATE = 10000.0
#: The actor whose state the tests read, and its table.
BACKFILL = "backfill"
#: The kill points (see the module).
POINTS = (
    "mid_snapshot",
    "between_phases",
    "mid_change_log_epoch",
    "right_after_forward",
    "between_barrier_and_checkpoint",
)
#: Rounds (one checkpoint each) before the child gives up on its point.
MAX_ROUNDS = 3000


def round_changes(driver: Upserts, round_: int, next_key: int) -> list[Chunk]:
    """One round's changes: 40 updates (80 rows), 10 new keys, 3 deletes (93 rows)."""
    start = (round_ * 37) % (INITIAL_KEYS - 40)
    gone = (round_ * 53 + 7) % INITIAL_KEYS
    return [
        driver.change(range(start, start + 40)),
        driver.change(range(next_key, next_key + 10)),
        driver.delete(range(gone, gone + 3)),
    ]


def save_driver(driver: Upserts, path: Path) -> None:
    """The driver's changes and value counter, written atomically (temp file, rename)."""
    data = {"value": driver._value, "changes": driver.changes}  # ops are IntEnums: ints
    temp = path.with_suffix(".tmp")
    temp.write_text(json.dumps(data, separators=(",", ":")), encoding="utf-8")
    os.replace(temp, path)


def load_driver(path: Path) -> Upserts:
    """The driver ``save_driver`` wrote: its changes, its state (their replay), its counter."""
    data = json.loads(path.read_text(encoding="utf-8"))
    driver = Upserts()
    driver._value = int(data["value"])
    for key, changes in data["changes"].items():
        k = int(key)
        driver.changes[k] = [(int(v), int(op)) for v, op in changes]
        for v, op in driver.changes[k]:
            if op in (0, 3):  # INSERT, UPDATE_INSERT
                driver.state[k] = v
            else:
                driver.state.pop(k, None)
    return driver


def sealed_progress(store: StateStore, epoch: int) -> dict[str, Any] | None:
    """The backfill's ``progress`` row that ``store.commit(epoch)`` is about to make durable
    (its state table's writes sealed up to ``epoch``; read, not taken)."""
    table = store._tables.get((BACKFILL, TABLE))
    writes = table._take_through(epoch) if table is not None else {}
    value = writes.get("progress")
    return json.loads(value) if isinstance(value, str) else None


async def committed_state(rt: Runtime) -> dict[str, Any]:
    """The backfill's committed state rows (the running store reads committed rows only)."""
    assert rt._store is not None
    return await rt._store.read_all(BACKFILL, TABLE)


async def cut_vnodes(rt: Runtime, state: dict[str, Any], epoch: int) -> dict[str, list[int]]:
    """The vnodes the durable ``state`` left mid-way: ``vnode -> [rows emitted, rows]``."""
    assert rt._store is not None
    view = rt._store.versioned("view", "view")
    cut: dict[str, list[int]] = {}
    for key, row in state.items():
        if key.startswith("vnode:") and row["after"] is not None and not row["done"]:
            total = (await view.read_vnode(int(key[6:]), epoch)).num_rows
            if row["rows"] < total:
                cut[key] = [row["rows"], total]
    return cut


def say(*words: object) -> None:
    print("@", *words, flush=True)


def die(point: str, **facts: object) -> None:
    say("KILLING", point, json.dumps(facts, separators=(",", ":"), sort_keys=True))
    os.kill(os.getpid(), signal.SIGKILL)


async def main(state_dir: Path, point: str) -> None:
    driver = Upserts()
    seen: dict[int, list[Any]] = {}
    rt = runtime(state_dir, barrier_interval=3600)
    journal = state_dir / "driver.json"
    armed = {"on": False}

    real_commit = StateStore.commit

    async def commit(self: StateStore, epoch: int) -> None:
        if armed["on"] and point == "between_barrier_and_checkpoint":
            sealed = sealed_progress(self, epoch)
            if sealed is not None and sealed["phase"] == "change_log":
                durable = await self.read(BACKFILL, TABLE, "progress")
                die(
                    point,
                    epoch=epoch,
                    committed=self.committed_epoch,
                    sealed=sealed,
                    durable=durable,
                )
        await real_commit(self, epoch)

    StateStore.commit = commit  # type: ignore[method-assign]

    async with rt:
        await rt.push("src", driver.change(range(INITIAL_KEYS)))
        await rt.checkpoint()
        save_driver(driver, journal)
        handle = await rt.add_job(copy_job(seen, batch_rows=BATCH_ROWS, rate_limit=RATE))
        say("ADDED", handle.progress().created_epoch)
        armed["on"] = True
        next_key = INITIAL_KEYS
        phases: list[str] = []
        in_change_log = 0  # checkpoints that made the phase ``change_log`` durable
        trace = os.environ.get("SNAPSHOT_CHILD_TRACE") == "1"
        for round_ in range(MAX_ROUNDS):
            for chunk in round_changes(driver, round_, next_key):
                await rt.push("src", chunk)
            next_key += 10
            epoch = await rt.checkpoint()
            save_driver(driver, journal)
            state = await committed_state(rt)
            progress = state.get("progress")
            if progress is None:
                continue
            phase = progress["phase"]
            in_change_log += phase == "change_log"
            if trace:
                say("TRACE", epoch, json.dumps(progress), handle.progress().actors[BACKFILL].detail)
            if not phases or phases[-1] != phase:
                phases.append(phase)
                say("PHASE", phase, epoch)
            facts = {"epoch": epoch, "progress": progress, "round": round_}
            if point == "mid_snapshot" and phase == "snapshot" and progress["rows"] >= HALF:
                cut = await cut_vnodes(rt, state, progress["snapshot_epoch"])
                if cut:
                    die(point, cut=cut, **facts)
            elif point == "between_phases" and phase != "snapshot":
                undone = [k for k, r in state.items() if k.startswith("vnode:") and not r["done"]]
                die(point, undone=undone, **facts)
            elif (
                point == "mid_change_log_epoch"
                and phase == "change_log"
                and in_change_log > 1
                and progress["log_offset"] > 0
            ):
                assert rt._store is not None
                view = rt._store.versioned("view", "view")
                first, *_ = view.epochs_after(progress["replayed"])
                rows = (await view.change_log(first)).num_rows
                if rows > progress["log_offset"]:
                    die(point, owed=first, owed_rows=rows, **facts)
            elif point == "right_after_forward" and phase == "forward":
                die(point, **facts)
            if point == "mid_change_log_epoch" and phase == "change_log":
                # Back-to-back barriers each finish an owed epoch before anything of the next
                # one is read; letting a few chunks of the replay through before the next
                # barrier gets it part way into the next epoch, so a half-replayed epoch is
                # durable. Waited for by the rows the job's output has seen, not by the clock.
                await rows_seen_grow(seen, 3 * BATCH_ROWS)
            if phase == "forward" and point != "right_after_forward":
                break
        say("MISSED", json.dumps(phases))
    sys.exit(3)


async def rows_seen_grow(seen: dict[int, list[Any]], rows: int) -> None:
    """Return once the job's output has seen ``rows`` more changes, or once it stops growing
    (the owed epochs are replayed): polled every two chunks of the replay's rate."""
    start = last = sum(map(len, seen.values()))
    while last - start < rows:
        await anyio.sleep(2 * BATCH_ROWS / RATE)
        now = sum(map(len, seen.values()))
        if now == last:
            return  # nothing more arrived in two chunks' time: the replay has caught up
        last = now


if __name__ == "__main__":
    state, backend, kill_point = sys.argv[1:4]
    assert kill_point in POINTS, kill_point
    anyio.run(main, Path(state), kill_point, backend=backend)
