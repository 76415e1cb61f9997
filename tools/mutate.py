"""Mutation testing of the seed actors: ``make mutate``.

Why mutmut (3.x) and not cosmic-ray: mutmut forks one worker per mutant from a process that
has already imported pytest, the plugins (anyio's among them) and the test modules, and it
runs for each mutant only the tests that executed the mutated function in a first
instrumented run, fastest first, stopping at the first failure. cosmic-ray starts the whole
test command again per mutant, which here (pyarrow, pyiceberg and Spark-free imports alone
cost ~2 s) would put a run of the ~4,000 mutants far beyond an hour on two cores. mutmut's
trampolines work with anyio's pytest plugin and with both backends unchanged.

The run is cut into **groups**, one per actor (the sink task, the sink writer, the
coordinator package with its retry schedule, the source backfill, the snapshot backfill, the
split source with its reader task). Each group mutates only its own modules and collects its
tests only from the test files that
exercise it, in a copy of the repository under ``build/mutate/<group>`` (mutmut keeps its
state in the working directory, so groups cannot share one). Tests that only run code in a
child process (the SIGKILL crash tests) cannot see a mutant and are left out; Redis-marked
tests are kept where the rule needs the real server (the split source, the backfill).

The report (``build/mutate/report.md`` and ``report.json``) gives, per module, the mutants
generated / killed / survived / timed out / with no test, and the score

    score = (killed + timed out) / (generated - equivalents)

where an equivalent is a survivor that cannot change behaviour: one named in
``tests/MUTANTS.md`` with its reason, or one of the class that file describes (a mutant that
only changes a log line). Every other survivor is listed with its location and diff. A run
resumes where it stopped (mutmut remembers results); ``--fresh`` starts over. Changing a
group's test files or pytest arguments below makes mutmut discard all that group's results
(they are part of its configuration): add tests to the files a group already lists.

Usage: ``python tools/mutate.py [--groups coordinator,sink_task] [--fresh] [--jobs N]``;
after adding tests, ``--groups G --survivors`` re-tests only G's survivors (``make mutate
MUTATE_ARGS="--groups sink_task --survivors"``).
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "mutate"
#: This run's copy of the package and the tests (one per run: runs of other groups may go on
#: beside it).
SNAPSHOT = BUILD / f"_source-{os.getpid()}"
EQUIVALENTS = ROOT / "tests" / "MUTANTS.md"


@dataclass(frozen=True)
class Group:
    """One actor: the modules mutated and the test files that exercise them."""

    name: str
    modules: tuple[str, ...]
    tests: tuple[str, ...]
    #: Extra pytest arguments. Tests that run their code in a child process (marked
    #: ``subprocess``, ``spark`` or ``slow``), such as the crash tests, are out of a
    #: mutant's reach, so they are deselected; a mutant that hangs a test fails it after
    #: 20 s (the slowest test of these files takes ~3 s) instead of the suite's 120 s.
    pytest_args: tuple[str, ...] = (
        "-m", "not slow and not spark and not subprocess", "--timeout=20"
    )  # fmt: skip


SINKS = "barrierflow/actors/sinks"
BACKFILL = "barrierflow/actors/backfill"
OPERATORS = "barrierflow/operators"

GROUPS: tuple[Group, ...] = (
    Group(
        "sink_task",
        (f"{SINKS}/sink_task.py", f"{SINKS}/sink_task_handle.py", f"{SINKS}/_sink_actor.py"),
        (
            "tests/test_sink_task.py",
            "tests/test_sink_wiring.py",
            "tests/test_sink_writer_changes.py",  # the WriteChanges command
        ),
    ),
    Group(
        "sink_writer",
        (f"{SINKS}/sink_writer.py",),
        (
            "tests/test_sink_writer.py",
            "tests/test_coordinated_sink.py",
            "tests/test_sink_model.py",
            "tests/test_parquet_sink.py",
            "tests/test_source_positions.py",
            "tests/test_sink_wiring.py",
            "tests/test_executor_staging.py",  # committables the writer takes
            "tests/test_sink_writer_changes.py",  # changelogs to a writer that takes them
        ),
    ),
    Group(
        "coordinator",
        # The commit retry schedule moved to the package root (shared with the Redis split
        # log's retries); the coordinator's tests are the ones that pin it to the seed's.
        (f"{SINKS}/coordinator/*.py", f"{SINKS}/committables.py", "barrierflow/_backoff.py"),
        (
            "tests/test_coordinator.py",
            "tests/test_coordinator_worker.py",
            "tests/test_coordinator_commits.py",
            "tests/test_coordinated_sink.py",
            "tests/test_sink_wiring.py",
            "tests/test_add_sink.py",
            "tests/test_executor_staging.py",  # batches staged on executors (committables.py)
        ),
    ),
    Group(
        "source_backfill",
        (
            f"{BACKFILL}/source_backfill_state.py",
            f"{BACKFILL}/_backfill_stage.py",
            f"{BACKFILL}/source_backfill.py",
        ),
        (
            "tests/test_source_backfill.py",
            "tests/test_source_backfill_state.py",
            "tests/test_source_backfill_rules.py",
            "tests/test_source_backfill_parallel.py",
            "tests/test_source_backfill_redis.py",
            "tests/test_split_discovery.py",
            "tests/test_metrics.py",  # records read, lag and the expected total per split
        ),
    ),
    Group(
        "snapshot_backfill",
        (f"{BACKFILL}/snapshot_backfill.py", f"{BACKFILL}/snapshot_progress.py"),
        (
            "tests/test_snapshot_backfill.py",
            "tests/test_snapshot_progress.py",
            "tests/test_snapshot_backfill_model.py",
        ),
    ),
    Group(
        "split_source",
        # The reader task is shared with the source backfill, whose tests guard its failure
        # reports and its delayed start.
        (
            "barrierflow/actors/sources/split_source.py",
            "barrierflow/actors/sources/split_reader.py",
            "barrierflow/actors/sources/split_metrics.py",
        ),
        (
            "tests/test_split_source.py",
            "tests/test_source_backfill_redis.py",
            "tests/test_split_discovery.py",
            "tests/test_source_backfill_rules.py",
            "tests/test_metrics.py",  # records read and lag per split
        ),
    ),
)

# The operators (issue 36: each module's score at least 90 %).
GROUPS += (
    Group(
        "transform",
        (f"{OPERATORS}/transform.py", f"{OPERATORS}/_operator.py", f"{OPERATORS}/stream.py"),
        (
            "tests/test_operators_transform.py",
            "tests/test_stream_api.py",
            "tests/test_placement.py",
        ),
    ),
    Group("async_map", (f"{OPERATORS}/async_map.py",), ("tests/test_async_map.py",)),
    Group(
        "aggregate",
        (
            f"{OPERATORS}/aggregate.py",
            f"{OPERATORS}/_accumulators.py",
            f"{OPERATORS}/_keyed_state.py",
        ),
        ("tests/test_aggregate.py", "tests/test_keyed_state.py"),
    ),
    Group(
        "windows",
        (f"{OPERATORS}/window.py", f"{OPERATORS}/watermarks.py", f"{OPERATORS}/_windows.py"),
        ("tests/test_windows.py", "tests/test_watermarks.py"),
    ),
)

# The graph on Spark's executors (issue 37): which actors may run in Spark's tasks.
GROUPS += (
    Group("chain", ("barrierflow/spark_bridge/chain.py",), ("tests/test_chain_plan.py",)),
    Group(
        "state_commit",
        ("barrierflow/connectors/state_commit.py", "barrierflow/connectors/vnode_state.py"),
        ("tests/test_state_commit.py", "tests/test_vnode_state.py"),
        # The two runs against a model (Hypothesis) take 5-40 s each on a loaded machine (an
        # fsync per file): too slow to run for every mutant; the files' unit tests guard the
        # rules one by one.
        pytest_args=(
            "-m",
            "not slow and not spark and not subprocess",
            "--timeout=20",
            "--deselect",
            "tests/test_vnode_state.py::test_the_store_agrees_with_a_dict_model",
            "--deselect",
            "tests/test_state_commit.py::test_epochs_cut_short_at_random_points",
        ),
    ),
)

DETECTED = {"killed", "timeout", "caught by type check", "segfault"}


@dataclass
class ModuleReport:
    """What one module's mutants came to."""

    module: str
    group: str
    generated: int = 0
    killed: int = 0
    timed_out: int = 0
    survived: int = 0
    no_tests: int = 0
    other: int = 0
    equivalent: int = 0
    survivors: list[dict[str, object]] = field(default_factory=list)

    @property
    def score(self) -> float:
        live = self.generated - self.equivalent
        return 1.0 if live <= 0 else (self.killed + self.timed_out) / live


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", default="", help="comma-separated group names (default all)")
    parser.add_argument("--fresh", action="store_true", help="forget earlier results")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--report-only", action="store_true", help="only rebuild the report")
    parser.add_argument(
        "--survivors",
        action="store_true",
        help="re-test only each group's survivors that are not equivalent, against the "
        "current work tree (after adding tests: quick)",
    )
    args = parser.parse_args(argv)
    wanted = {g for g in args.groups.split(",") if g}
    unknown = wanted - {g.name for g in GROUPS}
    if unknown:
        parser.error(
            f"unknown group(s) {sorted(unknown)}; expected some of {[g.name for g in GROUPS]}"
        )
    groups = [g for g in GROUPS if not wanted or g.name in wanted]
    started = time.monotonic()
    if not args.report_only:
        _snapshot_sources()
    try:
        _run_groups(groups, args)
    finally:
        shutil.rmtree(SNAPSHOT, ignore_errors=True)
    reports = [r for g in GROUPS for r in _group_reports(g)]
    elapsed = time.monotonic() - started
    _write_report(reports, elapsed)
    low = [r for r in reports if r.score < 0.9 or _unexplained(r)]
    print(f"report: {BUILD / 'report.md'} ({elapsed / 60:.1f} min)")
    for r in reports:
        print(
            f"  {r.module}: {r.generated} mutants, {r.killed} killed, {r.timed_out} timed out, "
            f"{r.survived} survived ({r.equivalent} equivalent), {r.no_tests} no test, "
            f"score {r.score:.1%}"
        )
    return 1 if low else 0


def _run_groups(groups: list[Group], args: argparse.Namespace) -> None:
    for group in groups:
        if args.survivors:
            # First the mutants of functions changed since the last run (mutmut re-tests
            # those by itself), then every survivor named (mutmut lets other results stand).
            _run_group(group, fresh=False, jobs=args.jobs)
            names = [
                str(s["key"])
                for r in _group_reports(group)
                for s in r.survivors
                if not s["equivalent"]
            ]
            if names:
                _run_group(group, fresh=False, jobs=args.jobs, names=names)
        elif not args.report_only:
            _run_group(group, fresh=args.fresh, jobs=args.jobs)


def _unexplained(report: ModuleReport) -> int:
    return sum(1 for s in report.survivors if not s["equivalent"])


def _workdir(group: Group) -> Path:
    return BUILD / group.name


def _snapshot_sources() -> None:
    """Copy the package and the tests once, at the start: every group of one run tests the
    same code, whatever is edited in the work tree while the run goes on."""
    for name in ("barrierflow", "tests"):
        target = SNAPSHOT / name
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(ROOT / name, target, ignore=shutil.ignore_patterns("__pycache__"))


def _run_group(group: Group, *, fresh: bool, jobs: int, names: list[str] | None = None) -> None:
    """Copy the run's snapshot into the group's working directory and run mutmut there."""
    work = _workdir(group)
    if fresh and work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    for name in ("barrierflow", "tests"):
        target = work / name
        if target.exists():
            shutil.rmtree(target)
        # Fresh modification times (``copy``, not ``copy2``): mutmut regenerates a module's
        # mutants only when the source is newer than them, and keeps the results of every
        # function whose text did not change.
        shutil.copytree(SNAPSHOT / name, target, copy_function=shutil.copy)
    pyproject = (ROOT / "pyproject.toml").read_text()
    (work / "pyproject.toml").write_text(pyproject + _mutmut_config(group))
    print(f"== {group.name}: mutmut run in {work}", flush=True)
    env = dict(os.environ, BARRIERFLOW_MUTATING="1")
    mutmut = Path(sys.executable).with_name("mutmut")
    with (work / "mutmut.log").open("w") as log:
        subprocess.run(
            [str(mutmut), "run", "--max-children", str(jobs), *(names or [])],
            cwd=work,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            check=False,
        )


def _mutmut_config(group: Group) -> str:
    lines = [
        "",
        "[tool.mutmut]",
        'source_paths = ["barrierflow"]',
        f"only_mutate = {json.dumps(list(group.modules))}",
        f"pytest_add_cli_args_test_selection = {json.dumps(list(group.tests))}",
        f"pytest_add_cli_args = {json.dumps(list(group.pytest_args))}",
        "use_git_change_detection = false",
        "",
    ]
    return "\n".join(lines)


def _group_reports(group: Group) -> Iterator[ModuleReport]:
    """Read mutmut's per-file results (``mutants/<path>.meta``) of one group."""
    work = _workdir(group)
    equivalents = _listed_equivalents()
    for meta in sorted((work / "mutants").rglob("*.py.meta")):
        module = str(meta.relative_to(work / "mutants"))[: -len(".meta")]
        if not (work / module).exists():
            # A module deleted since an earlier run: its results describe nothing now.
            meta.unlink()
            (work / "mutants" / module).unlink(missing_ok=True)
            continue
        data = json.loads(meta.read_text())
        report = ModuleReport(module=module, group=group.name)
        for key, code in sorted(data["exit_code_by_key"].items(), key=_natural):
            status = _status(code)
            report.generated += 1
            if status == "killed" or status in DETECTED - {"timeout"}:
                report.killed += 1
            elif status == "timeout":
                report.timed_out += 1
            elif status == "no tests":
                report.no_tests += 1
            elif status == "survived":
                report.survived += 1
            else:
                report.other += 1
            if status in ("survived", "no tests", "suspicious"):
                where = _locate(work, module, key)
                if key in equivalents:
                    reason = "listed"
                elif _in_log_call(work / module, int(str(where["line"]))):
                    reason = "log call"
                else:
                    reason = ""
                report.equivalent += bool(reason)
                report.survivors.append(
                    {"key": key, "status": status, "equivalent": reason, **where}
                )
        yield report


def _natural(item: tuple[str, object]) -> tuple[str, int]:
    name, _, number = item[0].rpartition("__mutmut_")
    return name, int(number) if number.isdigit() else 0


def _status(code: int | None) -> str:
    from mutmut.stats import status_by_exit_code

    return str(status_by_exit_code[code])


def _listed_equivalents() -> set[str]:
    """Mutant keys named in ``tests/MUTANTS.md`` (in backticks at the start of a list item)."""
    if not EQUIVALENTS.exists():
        return set()
    return set(re.findall(r"^- `([^`]+__mutmut_\d+)`", EQUIVALENTS.read_text(), re.M))


def _locate(work: Path, module: str, key: str) -> dict[str, object]:
    """The survivor's diff (as ``mutmut show`` prints it) and the line it changes."""
    from difflib import unified_diff

    import libcst as cst
    from mutmut.mutation.diff_apply import read_mutant_function, read_original_function

    parsed = _MUTANTS_MODULES.get((work, module))
    if parsed is None:
        parsed = _MUTANTS_MODULES[(work, module)] = cst.parse_module(
            (work / "mutants" / module).read_text()
        )
    before, after = (
        cst.Module([fn]).code.strip().splitlines()
        for fn in (read_original_function(parsed, key), read_mutant_function(parsed, key))
    )
    diff = list(unified_diff(before, after, lineterm=""))
    removed = [ln[1:] for ln in diff if ln.startswith("-") and not ln.startswith("---")]
    added = [ln[1:] for ln in diff if ln.startswith("+") and not ln.startswith("+++")]
    line = _line_of(work / module, key, removed[0] if removed else "")
    return {
        "line": line,
        "function": _function_of(key),
        "before": "\n".join(s.strip() for s in removed),
        "after": "\n".join(s.strip() for s in added),
    }


#: Parsed ``mutants/<module>`` files, by (working directory, module): parsed once per report.
_MUTANTS_MODULES: dict[tuple[Path, str], Any] = {}


def _function_of(key: str) -> str:
    mangled = key.rsplit(".", 1)[-1].rsplit("__mutmut_", 1)[0]
    if mangled.startswith("xǁ"):
        _, cls, meth = mangled.split("ǁ")
        return f"{cls}.{meth}"
    return mangled.removeprefix("x_")


@functools.cache
def _parsed(path: Path) -> tuple[list[str], ast.Module]:
    """A module's lines and syntax tree, read and parsed once per report (every survivor of
    a module is located in the same text)."""
    text = path.read_text()
    return text.splitlines(), ast.parse(text)


def _line_of(path: Path, key: str, removed: str) -> int:
    """The line in ``path`` of the mutated function that reads ``removed``."""
    lines, tree = _parsed(path)
    qual = _function_of(key).split(".")
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(node, ast.ClassDef | ast.Module) or body is None:
            continue
        if len(qual) == 2 and not (isinstance(node, ast.ClassDef) and node.name == qual[0]):
            continue
        for fn in body:
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and fn.name == qual[-1]:
                end = fn.end_lineno or fn.lineno
                for number in range(fn.lineno, end + 1):
                    if removed and lines[number - 1].strip() == removed.strip():
                        return number
                return fn.lineno
    return 0


#: Methods whose call is a log line: a mutant that changes only what a log line says (or the
#: logger it goes to) cannot change behaviour, as ``tests/MUTANTS.md`` says.
LOG_METHODS = frozenset({"debug", "info", "warning", "warn", "error", "exception", "critical"})


def _in_log_call(path: Path, line: int) -> bool:
    """Whether ``line`` of ``path`` lies in a statement that only logs (``log.warning(...)``,
    ``self._log.info(...)``, ``structlog.get_logger(...).warning(...)``)."""
    if line <= 0:
        return False
    for node in ast.walk(_parsed(path)[1]):
        if not isinstance(node, ast.Expr) or not (node.lineno <= line <= (node.end_lineno or 0)):
            continue
        call = node.value
        if isinstance(call, ast.Await):
            call = call.value
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr in LOG_METHODS
            and "log" in ast.unparse(call.func.value).lower()
        ):
            return True
    return False


def _write_report(reports: list[ModuleReport], elapsed: float) -> None:
    BUILD.mkdir(parents=True, exist_ok=True)
    (BUILD / "report.json").write_text(
        json.dumps(
            [{**r.__dict__, "score": r.score} for r in reports], indent=1, ensure_ascii=False
        )
    )
    out = [
        "# Mutation report (`make mutate`)",
        "",
        f"Run time: {elapsed / 60:.1f} min. Score = (killed + timed out) / "
        "(generated - equivalents).",
        "",
        "| group | module | generated | killed | timed out | survived | no test | "
        "equivalent | score |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in reports:
        out.append(
            f"| {r.group} | `{r.module}` | {r.generated} | {r.killed} | {r.timed_out} | "
            f"{r.survived} | {r.no_tests} | {r.equivalent} | {r.score:.1%} |"
        )
    out += ["", "## Survivors that are not equivalent", ""]
    for r in reports:
        for s in r.survivors:
            if s["equivalent"]:
                continue
            out.append(
                f"- `{s['key']}` ({s['status']}) {r.module}:{s['line']} "
                f"in `{s['function']}`: `{s['before']}` → `{s['after']}`"
            )
    (BUILD / "report.md").write_text("\n".join(out) + "\n")


if __name__ == "__main__":
    sys.exit(main())
