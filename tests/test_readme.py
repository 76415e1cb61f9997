"""The README stays true: its commands are the Makefile's and its example runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_opens_with_the_two_commands() -> None:
    first_block = re.search(r"```sh\n(.*?)```", README, re.S)
    assert first_block is not None
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["make demo", "make test"]
    assert "exec make test" in (ROOT / ".ci" / "run").read_text()


def test_readme_example_runs() -> None:
    example = re.search(r"```python\n(.*?)```", README, re.S)
    assert example is not None
    done = subprocess.run(
        [sys.executable, "-c", example.group(1)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "Barrier(" in done.stdout.splitlines()[-1]
