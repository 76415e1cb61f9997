"""A public name that was removed fails with a message naming its replacement (issue 34): one
case per removed name of ``barrierflow._removed.REMOVED``, which ``CHANGELOG.md`` lists too."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from barrierflow._removed import DEPRECATED, REMOVED
from barrierflow.errors import BarrierflowError, RemovedNameError

CHANGELOG = Path(__file__).resolve().parent.parent / "CHANGELOG.md"

CASES = [
    pytest.param(module, name, id=f"{module}.{name}")
    for module, names in REMOVED.items()
    for name in names
]


def _resolve(dotted: str) -> object:
    """The object ``dotted`` names: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            found = getattr(found, attr)
        return found
    raise AssertionError(f"{dotted}: no module of it imports")


@pytest.mark.parametrize(("module", "name"), CASES)
def test_importing_a_removed_name_names_its_replacement(module: str, name: str) -> None:
    with pytest.raises(RemovedNameError) as info:
        exec(f"from {module} import {name}", {})
    error, entry = info.value, REMOVED[module][name]
    assert (error.module, error.removed) == (module, name)
    assert (error.version, error.replacement) == (entry.version, entry.replacement)
    assert str(error) == (
        f"{module}.{name} was removed in {entry.version}; use {entry.replacement} "
        "(see CHANGELOG.md)"
    )
    # Caught as what it is: an import that failed, and one of barrierflow's errors.
    assert isinstance(error, ImportError)
    assert isinstance(error, BarrierflowError)


@pytest.mark.parametrize(("module", "name"), CASES)
def test_each_replacement_a_removed_name_points_to_exists(module: str, name: str) -> None:
    replacement = REMOVED[module][name].replacement
    named = re.findall(r"barrierflow(?:\.\w+)+", replacement)
    assert named, f"{module}.{name}: the replacement names no barrierflow object"
    for dotted in named:
        _resolve(dotted)


def _entries(changelog: str) -> list[str]:
    """The changelog's entries: its bullets, each with the lines that continue it."""
    return re.split(r"\n(?=- )", changelog)


@pytest.mark.parametrize(("module", "name"), CASES)
def test_the_changelog_lists_each_removed_name(module: str, name: str) -> None:
    """Named in full (`` `module.Name` ``), or in an entry that names the module and lists the
    names it no longer exports (`` `barrierflow.actors.sources`: `BatchFeed`, … ``)."""
    changelog = CHANGELOG.read_text()
    assert f"`{module}.{name}`" in changelog or any(
        f"`{module}`" in entry and f"`{name}`" in entry for entry in _entries(changelog)
    )


@pytest.mark.parametrize("module", sorted(REMOVED))
def test_a_name_that_never_existed_is_still_an_attribute_error(module: str) -> None:
    imported = importlib.import_module(module)
    assert not hasattr(imported, "NoSuchName")
    with pytest.raises(ImportError) as info:
        exec(f"from {module} import NoSuchName", {})
    assert not isinstance(info.value, RemovedNameError)


DEPRECATED_CASES = [
    pytest.param(module, name, id=f"{module}.{name}")
    for module, names in DEPRECATED.items()
    for name in names
]


@pytest.mark.parametrize(("module", "name"), DEPRECATED_CASES)
def test_a_renamed_name_is_served_for_one_release_with_a_warning_naming_the_new_one(
    module: str, name: str
) -> None:
    entry = DEPRECATED[module][name]
    namespace: dict[str, object] = {}
    with pytest.warns(DeprecationWarning, match=f"use {module}.{entry.new} ") as caught:
        exec(f"from {module} import {name}", namespace)
    assert namespace[name] is getattr(importlib.import_module(module), entry.new)
    # (Importing from a package looks the name up twice: each says the same.)
    assert {str(w.message) for w in caught} == {
        f"{module}.{name} is deprecated since {entry.version}: use {module}.{entry.new} "
        "(the old name goes in the next release)"
    }
    assert f"`{name}`" in CHANGELOG.read_text()
