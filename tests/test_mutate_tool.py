"""`make mutate`'s plan stays true to the tree: every module it mutates and every test file it
runs exists, every mutant listed as equivalent in ``tests/MUTANTS.md`` belongs to a mutated
module, and log lines (the one class of equivalents) are recognised from the syntax tree.

A rename that the mutation plan missed would otherwise only show up as an empty group in the
next (hand-run, hour-long) mutation run.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def mutate() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_mutate_tool", ROOT / "tools" / "mutate.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_every_group_mutates_existing_modules_with_existing_tests(mutate: ModuleType) -> None:
    for group in mutate.GROUPS:
        for pattern in group.modules:
            assert list(ROOT.glob(pattern)), f"{group.name}: no module matches {pattern}"
        for test in group.tests:
            assert (ROOT / test).is_file(), f"{group.name}: test file {test} is missing"


def test_the_groups_cover_the_seed_actors_the_split_source_and_the_operators(
    mutate: ModuleType,
) -> None:
    assert [g.name for g in mutate.GROUPS] == [
        "sink_task",
        "sink_writer",
        "coordinator",
        "source_backfill",
        "snapshot_backfill",
        "split_source",
        "transform",
        "async_map",
        "aggregate",
        "windows",
        "chain",
        "state_commit",
    ]
    operators = {m for g in mutate.GROUPS[6:10] for m in g.modules}
    written = {str(p.relative_to(ROOT)) for p in (ROOT / "barrierflow" / "operators").glob("*.py")}
    # Every operator module is mutated, but the package's exports and its errors.
    assert written - operators == {
        "barrierflow/operators/__init__.py",
        "barrierflow/operators/errors.py",
    }


def test_every_listed_equivalent_names_a_mutated_module(mutate: ModuleType) -> None:
    mutated = {
        str(path.relative_to(ROOT)).removesuffix(".py").replace("/", ".")
        for group in mutate.GROUPS
        for pattern in group.modules
        for path in ROOT.glob(pattern)
    }
    listed = mutate._listed_equivalents()
    for key in listed:
        module = key.rsplit(".", 1)[0]
        assert module in mutated, f"{key} is not a mutant of a mutated module"
    text = (ROOT / "tests" / "MUTANTS.md").read_text()
    for line in text.splitlines():
        if line.startswith("- `") and "__mutmut_" in line:
            assert re.match(r"^- `[^`]+__mutmut_\d+` — \S", line), f"no reason given: {line}"


def test_a_mutant_inside_a_log_call_is_recognised_and_no_other(
    mutate: ModuleType, tmp_path: Path
) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        textwrap.dedent("""\
        async def f(log, ctx, x):
            log.warning(
                "slow", seconds=x + 1,
            )
            ctx.log.info("done")
            y = x + 1
            await ctx.emit(y)
            structlog.get_logger("a").error("boom", y=y)
            raise ValueError(str(x))
        """)
    )
    logged = [n for n in range(1, 10) if mutate._in_log_call(source, n)]
    assert logged == [2, 3, 4, 5, 8]


def test_a_mutant_key_names_its_function(mutate: ModuleType) -> None:
    assert mutate._function_of("a.b.xǁSinkTaskǁclose__mutmut_3") == "SinkTask.close"
    assert mutate._function_of("a.b.x_start_sink_task__mutmut_12") == "start_sink_task"
