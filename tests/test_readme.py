"""The README stays true: its commands are the Makefile's and its example runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_opens_with_the_two_commands() -> None:
    first_block = re.search(r"```sh\n(.*?)```", README, re.S)
    assert first_block is not None
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["make demo", "make test"]
    assert "exec make test" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.spark
def test_readme_examples_run(tmp_path: Path) -> None:
    examples = re.findall(r"```python\n(.*?)```", README, re.S)
    assert len(examples) == 3
    outputs = []
    for example in examples:
        done = subprocess.run(
            [sys.executable, "-c", example],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout.splitlines()[-1])
    assert outputs[0].startswith("3 rows committed")
    assert outputs[1] == "3 rows delivered exactly once"
    assert "Barrier(" in outputs[2]
