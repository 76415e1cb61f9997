"""Package structure: explicit exports, anyio only in the core, a typed package (the
layering, cycles and the light import are in ``test_layout.py``)."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import types
from pathlib import Path

import pytest

import barrierflow

PACKAGE_ROOT = Path(barrierflow.__file__).parent
PUBLIC_PACKAGES = [
    "barrierflow",
    "barrierflow.channels",
    "barrierflow.runtime",
    "barrierflow.actors",
    "barrierflow.actors.sinks",
    "barrierflow.actors.sources",
    "barrierflow.actors.backfill",
    "barrierflow.connectors",
    "barrierflow.runtime.state",
    "barrierflow.testing",
    "barrierflow.spark_bridge",
    "barrierflow.actors.sinks.coordinator",
    "barrierflow.app.chaos",
]


@pytest.mark.parametrize("name", PUBLIC_PACKAGES)
def test_all_matches_what_is_exported(name: str) -> None:
    module = importlib.import_module(name)
    exported = set(module.__all__)
    # ``dir``, not ``vars``: a lazy package (the root) lists what it re-exports before it is
    # first looked up.
    public = {
        attr
        for attr in dir(module)
        if not attr.startswith("_") and not isinstance(getattr(module, attr), types.ModuleType)
    }
    assert exported == public | ({"__version__"} & exported)
    for attr in exported:
        assert hasattr(module, attr), f"{name}.__all__ names missing {attr}"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_core_uses_anyio_only() -> None:
    for layer in ["channels", "runtime", "actors", "connectors"]:
        directory = PACKAGE_ROOT / layer
        if not directory.exists():
            continue
        for path in directory.rglob("*.py"):
            if path.stem.endswith("_backend"):
                continue  # backend adapters are the one place allowed
            roots = {imported.split(".")[0] for imported in _imports(path)}
            assert not roots & {"asyncio", "trio"}, f"{path.name} imports {roots}"


def test_every_module_imports() -> None:
    imported = set()
    for info in pkgutil.walk_packages([str(PACKAGE_ROOT)], prefix="barrierflow."):
        if not info.name.endswith("__main__"):  # that one runs the CLI
            importlib.import_module(info.name)
            imported.add(info.name)
    # The walk reached every layer: a wrong root would import nothing and pass.
    layers = {f"barrierflow.{layer}" for layer in ("channels", "runtime", "actors", "spark_bridge")}
    assert layers <= imported


def test_package_is_typed() -> None:
    assert (PACKAGE_ROOT / "py.typed").exists()


def test_every_public_error_has_one_home_the_error_hub() -> None:
    """The errors are exported from ``barrierflow.errors`` only: looked up at the root (which
    re-exported them before 0.2.0), each names its home."""
    import barrierflow.errors
    from barrierflow.errors import RemovedNameError

    assert not set(barrierflow.errors.__all__) & set(barrierflow.__all__)
    for name in barrierflow.errors.__all__:
        with pytest.raises(RemovedNameError) as caught:
            getattr(barrierflow, name)
        error = caught.value
        assert (error.module, error.removed) == ("barrierflow", name)
        assert (error.version, error.replacement) == ("0.2.0", f"barrierflow.errors.{name}")
    with pytest.raises(AttributeError):
        barrierflow.NoSuchError  # noqa: B018 - the lookup is the test
