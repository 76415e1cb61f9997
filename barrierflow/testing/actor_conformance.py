"""The conformance suite of a user's stream actor: does its state survive restarts?

``await check_stream_actor(factory, chunks, state_dir=...)`` runs the actor twice over the same
input — ``push source → actor → exactly-once sink`` — and compares what the sink committed:

1. **undisturbed**: every chunk pushed, checkpoints at seeded random points (after each chunk
   with probability ``1 / checkpoint_every``, and after the last);
2. **with crashes**: the same, but at seeded random moments the graph fails mid-epoch (a
   scripted ``CRASH`` of its :class:`~barrierflow.testing.scripted.ScriptedSource`) and the
   runtime rebuilds it from the last checkpoint; :func:`~barrierflow.testing.scripted.play`
   pushes again the chunks after that checkpoint (a push source's rows since the last
   checkpoint are lost with the crash, as a real upstream would replay them).

If the actor keeps its state in its state tables (restored in ``restore``), both runs commit
the same rows; an actor that keeps state only in memory, or restores it wrongly, commits other
rows after a crash. Rules reported (a :class:`~barrierflow.testing.conformance.
ConformanceReport`): ``same_rows_with_crashes`` (the committed rows as multisets) and
``same_rows_in_order`` (also in commit order — only for actors whose output order is defined).

A crash in process leaves the process's memory, its threads and its open files alive, so it
misses what only a dying process loses. ``await check_stream_actor_kills(factory, chunks,
state_dir=...)`` runs the second run in **child processes killed with SIGKILL** instead
(:mod:`._actor_kill_child`): each child runs ``push source → actor →``
:class:`~barrierflow.connectors.ParquetTable` (exactly once, on disk) over the same state
store, resumes at the first chunk its last durable checkpoint does not hold (the chunks come
from an input file; each push is journalled with its epoch, as ``play`` tracks them in
process) and kills its own process group at its kill point; the next child resumes after it,
and the last runs to the end. Kill points, drawn from ``seed``: right after a chunk was pushed
(its epoch open, the actor perhaps mid-chunk), during a checkpoint (a seeded number of
scheduler turns into it), right after a checkpoint returned (the sink's commit perhaps
half-done). The table is read back with ``pyarrow.dataset`` in commit order and compared with
the undisturbed run as above; a third rule, ``killed_where_planned``, says where each kill
landed and fails — and the row rules with it, uncompared — when a child exited otherwise: an
error (its output in the detail) or a hang (no exit within 60 s times
``BARRIERFLOW_TEST_TIMEOUT_SCALE``; its process group is killed).

Decisions, and why:

* **A separate function**, not a keyword of :func:`check_stream_actor`: it asks more of its
  caller — a factory importable by name (each child imports it; a lambda or closure is
  refused when called), a POSIX system, a backend for the children (``backend=``, default
  the running one) — and reports one more rule. Both share the argument checks, the
  checkpoint draw, the undisturbed run and the comparison.
* **A push source and a journal**, not a split source: the driver decides where chunks and
  checkpoints fall, so the kill points are exact and described in chunk terms; what a
  resumed child replays follows from the runtime's committed epoch, read from the store.
* **A fresh interpreter per child** (about a second of imports each): a fork of this process
  would copy its running event loop and threads.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pyarrow as pa
import pyarrow.dataset as ds
import sniffio

from barrierflow._timeout_scale import timeout_scale
from barrierflow.actors.sinks.add_sink import add_sink
from barrierflow.channels.chunk import Chunk
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.runtime.actor import StreamActor
from barrierflow.runtime.config import RuntimeConfig
from barrierflow.runtime.runtime import Runtime
from barrierflow.testing._actor_kill_child import (
    MISSED,
    KillPoint,
    check_input_schema,
    write_chunks,
    write_spec,
)
from barrierflow.testing._crash_child import child_env, resolve_name
from barrierflow.testing._server_process import check_directory
from barrierflow.testing.conformance import ConformanceReport, RuleResult
from barrierflow.testing.crash_conformance import importable_name
from barrierflow.testing.scripted import CHECKPOINT, CRASH, Item, ScriptedSource, play
from barrierflow.testing.sinks import ListTable

__all__ = ["check_stream_actor", "check_stream_actor_kills"]

_CHILD_DEADLINE = 60.0  # seconds, times the timeout scale, for one child (its imports too)
_CLEANUP_DEADLINE = 5.0  # seconds to wait for a killed child


async def check_stream_actor(
    factory: Callable[[], StreamActor],
    chunks: Sequence[Chunk],
    *,
    output: pa.Schema,
    state_dir: str | Path,
    checkpoint_every: int = 3,
    crashes: int = 3,
    seed: int = 0,
) -> ConformanceReport:
    """Run ``factory``'s actor over ``chunks`` without and with crashes (see the module).

    Args:
        factory: makes the actor under test (called at every (re)start).
        chunks: its input, in order (one schema).
        output: the schema of the chunks the actor emits.
        state_dir: a directory for the two runs' state stores (created if missing).
        checkpoint_every: chunks between checkpoints, on average (where they fall is drawn
            from ``seed``; both runs checkpoint at the same points).
        crashes: crashes injected in the second run.
        seed: picks the moments of the crashes and of the checkpoints.

    Raises:
        InvalidArgumentError: ``factory`` is not callable, no chunks, chunks of several
            schemas, ``output`` is not a Schema, ``state_dir`` not a path, or a bad count or
            seed.
    """
    _check_arguments(factory, chunks, output, state_dir, checkpoint_every, seed)
    if type(crashes) is not int or crashes < 0:
        raise InvalidArgumentError("crashes", "an int >= 0", crashes)
    directory = Path(state_dir)
    await anyio.Path(directory).mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    crash_at = set(rng.sample(range(len(chunks)), min(crashes, len(chunks))))
    checkpoints = _draw_checkpoints(rng, len(chunks), checkpoint_every)
    calm = await _run(factory, chunks, output, directory / "calm.db", checkpoints, set())
    shaken = await _run(factory, chunks, output, directory / "crashes.db", checkpoints, crash_at)
    report = ConformanceReport()
    _compare(_rows(calm.rows()), _rows(shaken.rows()), "crashes", report)
    return report


async def check_stream_actor_kills(
    factory: Callable[[], StreamActor] | str,
    chunks: Sequence[Chunk],
    *,
    output: pa.Schema,
    state_dir: str | Path,
    checkpoint_every: int = 3,
    kills: int = 3,
    seed: int = 0,
    backend: str | None = None,
) -> ConformanceReport:
    """Run ``factory``'s actor over ``chunks`` undisturbed, then in child processes killed
    with SIGKILL at seeded points, and compare what the sinks committed (see the module).

    Args:
        factory: makes the actor under test; each child imports it, so either a module-level
            class or function (importable by its own name), or the ``"module:name"`` of one
            that is a value (an :class:`~barrierflow.operators.Operator` declared at module
            level: ``"my_tests:DOUBLED"``).
        chunks: its input, in order (one schema).
        output: the schema of the chunks the actor emits.
        state_dir: a directory (created if missing) for the runs' state stores, the killed
            run's table, its input file and each child's output (``<state_dir>/kills/``,
            which must not exist yet).
        checkpoint_every: chunks between checkpoints, on average (where they fall is drawn
            from ``seed``; both runs checkpoint at the same points).
        kills: SIGKILLs of the killed run, each of a new child (fewer if the input has fewer
            kill points).
        seed: picks the checkpoints, the kill points and how far into a checkpoint a kill
            lands.
        backend: the children's event loop, ``"asyncio"`` or ``"trio"`` (default: the one
            this call runs on).

    Returns:
        The report of ``killed_where_planned`` (every child died at its kill point, the last
        ran to the end; its detail says where each kill landed), ``same_rows_with_crashes``
        and ``same_rows_in_order``.

    Raises:
        InvalidArgumentError: ``factory`` is not importable by name (a lambda, a closure, an
            Operator not named by a string), no chunks, chunks of several schemas (or with a
            column the input file uses itself), ``output`` is not a Schema, ``state_dir`` not
            a path, a bad count or seed, an unknown or missing ``backend``,
            ``<state_dir>/kills`` exists, the timeout scale is malformed, or not a POSIX
            system.

    Cancellation: a running child's process group is killed and waited for.
    """
    name, factory = _factory_name(factory)
    _check_arguments(factory, chunks, output, state_dir, checkpoint_every, seed)
    check_input_schema(chunks[0].batch.schema)
    if type(kills) is not int or kills < 1:
        raise InvalidArgumentError("kills", "an int >= 1", kills)
    if not hasattr(os, "killpg"):
        raise InvalidArgumentError(
            "kills", "a POSIX system (SIGKILL of a process group)", sys.platform
        )
    backend = sniffio.current_async_library() if backend is None else backend
    if backend not in ("asyncio", "trio") or importlib.util.find_spec(backend) is None:
        raise InvalidArgumentError("backend", "'asyncio' or 'trio' (installed)", backend)
    deadline = _CHILD_DEADLINE * timeout_scale()
    directory = Path(state_dir) / "kills"
    if await anyio.Path(directory).exists():
        raise InvalidArgumentError(
            "state_dir", "a directory without a 'kills' entry (left by an earlier run)", state_dir
        )
    await anyio.Path(directory).mkdir(parents=True)
    rng = random.Random(seed)
    checkpoints = _draw_checkpoints(rng, len(chunks), checkpoint_every)
    plan = _draw_kills(rng, len(chunks), checkpoints, kills)
    await anyio.to_thread.run_sync(write_chunks, directory / "input.arrows", chunks)
    calm = await _run(factory, chunks, output, directory / "calm.db", checkpoints, set())
    run = _KilledRun(directory, name, output, checkpoints, backend, deadline)
    failure = await run.play(plan)
    report = ConformanceReport()
    landings = "; ".join(run.landings)
    report.results.append(
        RuleResult(
            "killed_where_planned",
            failure is None,
            landings if failure is None else f"{failure} (before: {landings or 'nothing'})",
        )
    )
    if failure is not None:
        for rule in ("same_rows_with_crashes", "same_rows_in_order"):
            report.results.append(RuleResult(rule, False, f"not compared: {failure}"))
        return report
    killed = await anyio.to_thread.run_sync(_table_rows, directory / "table", output)
    _compare(_rows(calm.rows()), killed, "kills", report)
    return report


def _factory_name(
    factory: Callable[[], StreamActor] | str,
) -> tuple[str, Callable[[], StreamActor]]:
    """The name a child imports ``factory`` by, and the factory.

    Raises:
        InvalidArgumentError: ``factory`` is neither importable by its own name nor a
            ``"module:name"`` naming a callable.
    """
    if not isinstance(factory, str):
        return importable_name(factory, "factory"), factory
    expected = "a 'module:name' of a factory importable in a child process"
    try:
        found = resolve_name(factory) if ":" in factory else None
    except (ImportError, AttributeError, ValueError):
        found = None
    if not callable(found):
        raise InvalidArgumentError("factory", expected, factory)
    made: Callable[[], StreamActor] = found
    return factory, made


def _check_arguments(
    factory: object,
    chunks: Sequence[Chunk],
    output: object,
    state_dir: object,
    checkpoint_every: object,
    seed: object,
) -> None:
    """Refuse what both runs cannot run, naming the argument."""
    if not callable(factory):
        raise InvalidArgumentError("factory", "a callable that makes a StreamActor", factory)
    if not chunks or not all(isinstance(c, Chunk) for c in chunks):
        raise InvalidArgumentError("chunks", "a non-empty sequence of Chunks", chunks)
    if len({c.batch.schema.remove_metadata() for c in chunks}) != 1:
        raise InvalidArgumentError("chunks", "chunks of one schema", "several schemas")
    if not isinstance(output, pa.Schema):
        raise InvalidArgumentError("output", "a pyarrow Schema", output)
    if type(checkpoint_every) is not int or checkpoint_every < 1:
        raise InvalidArgumentError("checkpoint_every", "an int >= 1", checkpoint_every)
    if type(seed) is not int:
        raise InvalidArgumentError("seed", "an int", seed)
    check_directory("state_dir", state_dir)


def _draw_checkpoints(rng: random.Random, count: int, every: int) -> set[int]:
    """The chunks followed by a checkpoint: each with probability ``1 / every``, and the last."""
    checkpoints = {i for i in range(count) if rng.random() < 1 / every}
    checkpoints.add(count - 1)
    return checkpoints


def _draw_kills(
    rng: random.Random, count: int, checkpoints: set[int], kills: int
) -> list[KillPoint]:
    """``kills`` distinct kill points, in script order: after any chunk's push, during or
    right after any checkpoint."""
    candidates = [(i, 0) for i in range(count)]
    candidates += [(i, m) for i in sorted(checkpoints) for m in (1, 2)]
    chosen = sorted(rng.sample(candidates, min(kills, len(candidates))))
    return [KillPoint(i, m, rng.randint(0, 30) if m == 1 else 0) for i, m in chosen]


def _compare(
    calm: list[tuple[Any, ...]], shaken: list[tuple[Any, ...]], how: str, report: ConformanceReport
) -> None:
    """Append the two row rules: the same rows as multisets, and in the same order."""
    # By repr: rows may hold lists or dicts, which neither hash nor sort.
    without, with_ = Counter(map(repr, calm)), Counter(map(repr, shaken))
    only_calm, only_shaken = without - with_, with_ - without
    same = not only_calm and not only_shaken
    detail = (
        f"without {how} {len(calm)} rows, with {len(shaken)}: "
        f"{only_calm.total()} only without (first: {next(iter(only_calm), 'none')}), "
        f"{only_shaken.total()} only with (first: {next(iter(only_shaken), 'none')})"
    )
    report.results.append(RuleResult("same_rows_with_crashes", same, "" if same else detail))
    ordered = calm == shaken
    report.results.append(
        RuleResult("same_rows_in_order", ordered, "" if ordered else "the commit order differs")
    )


async def _run(
    factory: Callable[[], StreamActor],
    chunks: Sequence[Chunk],
    output: pa.Schema,
    path: Path,
    checkpoints: set[int],
    crash_at: set[int],
) -> ListTable:
    sink = ListTable(output)
    config = RuntimeConfig(
        state_path=path,
        barrier_interval=3600,
        recovery=True,
        max_restarts=len(crash_at) + 1,
        restart_backoff=0.001,
    )
    rt = Runtime(config)
    rt.add_source("input", ScriptedSource)  # raises on the CRASH poison play() pushes
    rt.add_actor("actor", factory, inputs=["input"])
    add_sink(rt, "output", sink, input="actor")
    script: list[Item] = []
    for i, chunk in enumerate(chunks):
        script.append(chunk)
        if i in crash_at:
            script.append(CRASH)  # play() pushes again what followed the last checkpoint
        if i in checkpoints:
            script.append(CHECKPOINT)
    async with rt:
        await play(rt, "input", script)
        await rt.checkpoint()
    # Leaving the runtime stops it gracefully: the sink's last checkpoint is committed first.
    return sink


def _rows(table: pa.Table) -> list[tuple[Any, ...]]:
    """The rows of ``table``, in order, as tuples."""
    columns = [table.column(i).to_pylist() for i in range(table.num_columns)]
    return list(zip(*columns, strict=True))


def _table_rows(path: Path, output: pa.Schema) -> list[tuple[Any, ...]]:
    """The rows committed to the Parquet table ``path``, in commit order (its epoch
    directories, zero-padded, sort by epoch; an epoch's files by writer and part)."""
    if not path.exists():
        return []
    files = sorted(ds.dataset(path, schema=output, format="parquet").files)  # committed only
    return _rows(ds.dataset(files, schema=output, format="parquet").to_table())


class _KilledRun:
    """The killed run: one child per kill point, then one that runs to the end (see
    :mod:`._actor_kill_child`), over the same state store, table and push journal."""

    def __init__(
        self,
        directory: Path,
        factory: str,
        output: pa.Schema,
        checkpoints: set[int],
        backend: str,
        deadline: float,
    ) -> None:
        self._directory = directory
        self._deadline = deadline
        self._spec: dict[str, Any] = {
            "factory": factory,
            "input": str(directory / "input.arrows"),
            "output": output.serialize().to_pybytes().hex(),
            "checkpoints": sorted(checkpoints),
            "state": str(directory / "killed.db"),
            "table": str(directory / "table"),
            "journal": str(directory / "journal.jsonl"),
            "backend": backend,
        }
        #: Where each incarnation resumed and died, for the report.
        self.landings: list[str] = []

    async def play(self, plan: Sequence[KillPoint]) -> str | None:
        """Run the incarnations; what went wrong (naming the incarnation), or None."""
        for number, kill in enumerate([*plan, None], start=1):
            planned = "to run to the end" if kill is None else f"to die {kill.describe()}"
            facts_path = self._directory / f"incarnation-{number}.facts"
            out = self._directory / f"incarnation-{number}.out"
            spec_path = self._directory / f"incarnation-{number}.json"
            spec = {
                **self._spec,
                "kill": None if kill is None else [kill.chunk, kill.moment_index, kill.turns],
                "facts": str(facts_path),
            }
            await anyio.to_thread.run_sync(write_spec, spec_path, spec)
            code = await self._child(spec_path, out)
            facts = await anyio.to_thread.run_sync(_facts, facts_path)
            resumed = next((f for f in facts if "resumed" in f), None)
            killing = [f["killing"] for f in facts if "killing" in f]
            expected = 0 if kill is None else -signal.SIGKILL
            if code != expected or (kill is not None and not killing):
                got = code if isinstance(code, str) else f"exit code {code}"
                if code == MISSED:
                    got = "it ran to the end without meeting its kill point"
                tail = await anyio.to_thread.run_sync(_tail, out)
                return f"incarnation {number} ({planned}): {got}; its output: {tail or '(empty)'}"
            start = (
                ""
                if resumed is None
                else f" ({resumed['backend']}) resumed at chunk {resumed['resumed']} "
                f"(committed epoch {resumed['committed']}) and"
            )
            end = "ran to the end" if kill is None else f"was killed {killing[-1]}"
            self.landings.append(f"incarnation {number}{start} {end}")
        return None

    async def _child(self, spec_path: Path, out: Path) -> int | str:
        """Run one child, as the leader of its own process group; its exit code (``-9``:
        killed by SIGKILL), or why there is none. The group is killed (and the child waited
        for) when the child overran its deadline or this call is cancelled."""
        with out.open("ab") as log:
            process = await anyio.open_process(
                [sys.executable, "-m", "barrierflow.testing._actor_kill_child", str(spec_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=child_env(),
                start_new_session=True,
            )
        hung = False
        try:
            with anyio.move_on_after(self._deadline) as waited:
                await process.wait()
            hung = waited.cancelled_caught
        finally:
            if process.returncode is None:  # hung, or this call was cancelled
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
            with anyio.move_on_after(_CLEANUP_DEADLINE, shield=True):
                await process.aclose()  # waits for it
        if hung:
            return f"no exit within {self._deadline:g}s (a hang; its process group was killed)"
        assert process.returncode is not None
        return process.returncode


def _facts(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def _tail(path: Path) -> str:
    return path.read_text(errors="replace").strip()[-1500:] if path.exists() else ""
