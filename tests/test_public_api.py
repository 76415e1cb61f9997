"""The public API is a reviewed file (``tests/public_api.txt``): every name a public package
exports, one ``module.Name`` a line, so that the surface grows only deliberately (issue 35).

The rules: each public name is exported from one place (its home: the package of its layer,
and :mod:`barrierflow.errors` for every error); at most :data:`MAX_NAMES_BESIDES_ERRORS` names
besides the errors; the README's examples import only public names, from their home.
"""

from __future__ import annotations

import importlib
from collections import defaultdict
from pathlib import Path

from test_readme import _readme_imports

import barrierflow.errors

#: Every package whose ``__all__`` is public API. The subpackages listed export nothing (their
#: modules organize the code; their names' home is the layer's package).
PUBLIC_PACKAGES = (
    "barrierflow",
    "barrierflow.channels",
    "barrierflow.runtime",
    "barrierflow.runtime.state",
    "barrierflow.actors",
    "barrierflow.actors.sinks",
    "barrierflow.actors.sinks.coordinator",
    "barrierflow.actors.sources",
    "barrierflow.actors.backfill",
    "barrierflow.operators",
    "barrierflow.connectors",
    "barrierflow.spark_bridge",
    "barrierflow.testing",
    "barrierflow.app.chaos",
    "barrierflow.errors",
)

#: The target for a surface one can learn: 120 when issue 35 set it, raised by 15 for the
#: operators layer of issue 36 (the factories a user calls by name, and the fluent stream).
MAX_NAMES_BESIDES_ERRORS = 135

API_FILE = Path(__file__).resolve().parent / "public_api.txt"


def _exported() -> set[str]:
    """``module.Name`` for every name of every public package's ``__all__``."""
    return {
        f"{package}.{name}"
        for package in PUBLIC_PACKAGES
        for name in importlib.import_module(package).__all__
    }


def _reviewed() -> set[str]:
    lines = (line.strip() for line in API_FILE.read_text().splitlines())
    return {line for line in lines if line and not line.startswith("#")}


def test_the_public_api_is_the_reviewed_file() -> None:
    exported, reviewed = _exported(), _reviewed()
    added, removed = sorted(exported - reviewed), sorted(reviewed - exported)
    assert (added, removed) == ([], []), (
        "the public API changed: "
        + (f"added {added} " if added else "")
        + (f"removed {removed} " if removed else "")
        + f"— if that is deliberate, update {API_FILE.name} (and, for a removed name, "
        "barrierflow/_removed.py and CHANGELOG.md)"
    )


def test_the_reviewed_file_is_sorted_without_duplicates() -> None:
    lines = [line for line in API_FILE.read_text().splitlines() if line and line[0] != "#"]
    assert lines == sorted(set(lines)), f"keep {API_FILE.name} sorted, one name a line"


def test_each_public_name_is_exported_from_one_place() -> None:
    homes: dict[str, list[str]] = defaultdict(list)
    for dotted in _exported():
        package, _, name = dotted.rpartition(".")
        homes[name].append(package)
    shared = {name: sorted(packages) for name, packages in homes.items() if len(packages) > 1}
    assert not shared, f"exported from more than one place (keep one home each): {shared}"


def test_the_errors_are_exported_from_the_error_hub_only() -> None:
    errors = set(barrierflow.errors.__all__)
    elsewhere = sorted(
        dotted
        for dotted in _exported()
        if dotted.rpartition(".")[2] in errors and not dotted.startswith("barrierflow.errors.")
    )
    assert not elsewhere, f"errors exported outside barrierflow.errors: {elsewhere}"
    # and every exported exception class is one of the hub's
    for dotted in _exported():
        package, _, name = dotted.rpartition(".")
        value = getattr(importlib.import_module(package), name)
        if isinstance(value, type) and issubclass(value, BaseException):
            assert name in errors, f"{dotted} is an error: export it from barrierflow.errors"


def test_at_most_135_public_names_besides_errors() -> None:
    errors = set(barrierflow.errors.__all__)
    others = sorted(d for d in _exported() if d.rpartition(".")[2] not in errors)
    assert len(others) <= MAX_NAMES_BESIDES_ERRORS, (
        f"{len(others)} public names besides errors, more than {MAX_NAMES_BESIDES_ERRORS}: "
        "make a helper private, or give two names one"
    )


def _is_module(dotted: str) -> bool:
    try:
        importlib.import_module(dotted)
    except ImportError:
        return False
    return True


def test_the_readme_imports_public_names_from_their_home() -> None:
    """Its examples and its prose's "`Name` (`module`)" name only reviewed ``module.Name``s
    (or a public module, ``from barrierflow.testing import strategies``)."""
    reviewed = _reviewed()
    wrong = sorted(
        f"{module}.{name}"
        for module, name in _readme_imports()
        if name is not None
        and f"{module}.{name}" not in reviewed
        and not _is_module(f"{module}.{name}")
    )
    assert not wrong, f"the README imports what is not public from there: {wrong}"
