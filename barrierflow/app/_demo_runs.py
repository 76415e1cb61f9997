"""What the demo's acts share about a run in a work directory: the command that resumes it, and
its small JSON manifest — read back on ``--resume``, which refuses other sizes than the started
run's."""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from barrierflow.channels.errors import ConfigError

__all__ = ["check_sizes", "read_manifest", "resume_command"]

T = TypeVar("T")


def resume_command(act: str | None, workdir: Path, backend: str) -> str:
    """``barrierflow demo [act] --resume`` with the options that differ from the defaults."""
    words = ["barrierflow", "demo", *([act] if act else []), "--resume"]
    if workdir != Path(f"demo-{act}" if act else "demo-data"):
        words += ["--workdir", str(workdir)]
    if backend != "asyncio":
        words += ["--backend", backend]
    return shlex.join(words)


def read_manifest(cls: type[T], workdir: Path, name: str, what: str) -> T:
    """The manifest ``name`` a run of ``what`` wrote in ``workdir``, as a ``cls``.

    Raises:
        ConfigError: (argument ``resume``) no such run, or an unreadable manifest.
    """
    try:
        return cls(**json.loads((workdir / name).read_text()))
    except FileNotFoundError:
        raise ConfigError("resume", f"a {what} run started in {workdir}", "nothing there") from None
    except (ValueError, TypeError) as exc:
        raise ConfigError("resume", f"a readable {name} in {workdir}", str(exc)) from exc


def check_sizes(manifest: Any, config: Any, names: Sequence[str]) -> None:
    """Refuse a resume whose ``config`` asks for other sizes than the started run's.

    Raises:
        ConfigError: (argument: the size's name) a size given that differs.
    """
    for name in names:
        given, started = getattr(config, name), getattr(manifest, name)
        if given is not None and given != started:
            raise ConfigError(name, f"{started}, as the run being resumed (or leave it out)", given)
