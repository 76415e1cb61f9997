"""The README stays true: its commands are the Makefile's and its example runs."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from _timeouts import scaled

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_opens_with_the_two_commands() -> None:
    first_block = re.search(r"```sh\n(.*?)```", README, re.S)
    assert first_block is not None
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["make demo", "make test"]
    assert "exec make test" in (ROOT / ".ci" / "run").read_text()


EXAMPLES = re.findall(r"```python\n(.*?)```", README, re.S)

#: What each example prints last, in README order (a string: equal; a callable: holds).
LAST_LINES: list[str | Callable[[str], bool]] = [
    # The operators first: windows closed by watermarks, then async_map.
    "[{'user': 1, 'clicks': 5, 'events': 2}, {'user': 2, 'clicks': 4, 'events': 1}]",
    "1000 orders enriched, 100 at a time",
    lambda line: line.startswith("3 rows committed"),
    "3 rows delivered exactly once",
    "857 rows in 2 tasks, none through the driver: True",
    "10 users, 9000 clicks counted once",  # keyed, on the executors
    "1000 rows in one snapshot per epoch",
    "[3, 4, 5] ['clicks.0', 'clicks.1']",
    "2002 rows, each once",
    "[(1, 15), (2, 20), (3, 5)]",
    "{'user': [1, 3], 'clicks': [10, 14]} [0, 1]",
    lambda line: "Barrier(" in line,
    "9 rules kept; committed [1, 2] once",
    lambda line: line.startswith("2 passed"),  # on asyncio and on trio
    lambda line: line.startswith("2 passed"),  # the JSON-lines table, on both backends
    "[(1, 9.5), (2, 4.0)]",  # PostgreSQL, upserted by id
]


def test_readme_has_an_expected_last_line_for_each_example() -> None:
    assert len(EXAMPLES) == len(LAST_LINES) == 16


@pytest.mark.spark
@pytest.mark.postgres
@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_readme_example_runs(tmp_path: Path, index: int) -> None:
    """Each example runs on its own (a process of its own, in an empty directory) and prints
    what the README says it prints."""
    example = EXAMPLES[index]
    command = [sys.executable, "-c", example]
    if example.startswith("# test_"):  # a test file: pytest runs it, as a user would
        (tmp_path / "test_readme_example.py").write_text(example)
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        command += ["test_readme_example.py"]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=scaled(110), cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    last = done.stdout.splitlines()[-1]
    expected = LAST_LINES[index]
    assert last == expected if isinstance(expected, str) else expected(last), last


@pytest.mark.subprocess
def test_readme_add_a_table_example_passes_check_table_with_crash_steps(tmp_path: Path) -> None:
    # The worked example of "Adding a table", run as a user would (pytest on their file): a
    # table on FileCommitter, checked rule by rule, crash steps included, on both backends.
    (example,) = [
        e for e in re.findall(r"```python\n(.*?)```", README, re.S) if "JsonLinesTable" in e
    ]
    assert example.startswith("# test_jsonl_table.py")
    assert "class JsonLinesCommitter(FileCommitter)" in example
    assert "check_table(make, read, crash_steps=True)" in example
    (tmp_path / "test_jsonl_table.py").write_text(example)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    done = subprocess.run(
        [*command, "test_jsonl_table.py"],
        capture_output=True,
        text=True,
        timeout=scaled(300),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    assert done.stdout.splitlines()[-1].startswith("2 passed")


def test_readme_links_only_inside_the_repository() -> None:
    # A user has only the repository: every relative link must resolve inside it.
    prose = re.sub(r"```.*?```", "", README, flags=re.S)  # links live in the prose
    for target in re.findall(r"\]\(([^)#\s]+)\)", prose):
        if "://" in target:
            continue
        path = (ROOT / target).resolve()
        assert path.is_relative_to(ROOT), target
        assert path.exists(), target
    assert "../" not in README


def _readme_imports() -> list[tuple[str, str | None]]:
    """``(module, name)`` of every barrierflow import in the README's Python examples (name
    ``None`` for ``import module``), and of every "`Name` (`barrierflow.module`)" in its
    prose, which tells a reader where to import a name from."""
    found: list[tuple[str, str | None]] = []
    for example in re.findall(r"```python\n(.*?)```", README, re.S):
        for node in ast.walk(ast.parse(textwrap.dedent(example))):  # (also in a list item)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("barrierflow"):
                assert node.module is not None
                found.extend((node.module, alias.name) for alias in node.names)
            elif isinstance(node, ast.Import):
                names = (alias.name for alias in node.names)
                found.extend((name, None) for name in names if name.startswith("barrierflow"))
    prose = re.sub(r"```.*?```", "", README, flags=re.S)
    mentions = re.findall(r"`(\w+)` \(`(barrierflow(?:\.\w+)*)`\)", prose)
    found.extend((module, name) for name, module in mentions)
    return found


def test_every_import_the_readme_shows_resolves() -> None:
    # The Python examples run only in the slow tier (they need Spark); their import lines,
    # and the prose's "`Name` (`module`)", are checked here in-process.
    imports = _readme_imports()
    assert ("barrierflow.testing", "MemorySplitLog") in imports
    for module, name in imports:
        imported = importlib.import_module(module)
        if name is not None:
            assert hasattr(imported, name), f"README: {name} is not importable from {module}"
