"""The README stays true: its commands are the Makefile's and its example runs."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
import textwrap
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


@pytest.mark.spark
@pytest.mark.postgres
def test_readme_examples_run(tmp_path: Path) -> None:
    examples = re.findall(r"```python\n(.*?)```", README, re.S)
    assert len(examples) == 15
    outputs = []
    for example in examples:
        command = [sys.executable, "-c", example]
        if example.startswith("# test_"):  # a test file: pytest runs it, as a user would
            (tmp_path / "test_readme_example.py").write_text(example)
            command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
            command += ["test_readme_example.py"]
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=scaled(120), cwd=tmp_path
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr
        outputs.append(done.stdout.splitlines()[-1])
    # The operators first: windows closed by watermarks, then async_map.
    assert outputs[0] == (
        "[{'user': 1, 'clicks': 5, 'events': 2}, {'user': 2, 'clicks': 4, 'events': 1}]"
    )
    assert outputs[1] == "1000 orders enriched, 100 at a time"
    assert outputs[2].startswith("3 rows committed")
    assert outputs[3] == "3 rows delivered exactly once"
    assert outputs[4] == "857 rows in 2 tasks, none through the driver: True"
    assert outputs[5] == "1000 rows in one snapshot per epoch"
    assert outputs[6] == "[3, 4, 5] ['clicks.0', 'clicks.1']"
    assert outputs[7] == "2002 rows, each once"
    assert outputs[8] == "[(1, 15), (2, 20), (3, 5)]"
    assert outputs[9] == "{'user': [1, 3], 'clicks': [10, 14]} [0, 1]"
    assert "Barrier(" in outputs[10]
    assert outputs[11] == "9 rules kept; committed [1, 2] once"
    assert outputs[12].startswith("2 passed")  # on asyncio and on trio
    assert outputs[13].startswith("2 passed")  # the JSON-lines table, on both backends
    assert outputs[14] == "[(1, 9.5), (2, 4.0)]"  # PostgreSQL, upserted by id


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
