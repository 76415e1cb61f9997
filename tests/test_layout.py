"""The package's layout: no import cycles, layers that point one way, no private names across
packages, a light ``import``, and optional dependencies as extras.

The import graph is built from the source (every ``import`` and ``from ... import``, those under
``if TYPE_CHECKING:`` and inside functions included), so a cycle hidden from the interpreter
is still a cycle here: it says a boundary is in the wrong place.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import barrierflow
from barrierflow._extras import EXTRAS, MissingExtraError, require
from barrierflow.errors import BarrierflowError, InvalidArgumentError

PACKAGE_ROOT = Path(barrierflow.__file__).parent
PACKAGE = "barrierflow"

#: The library's layers, each allowed to import only what comes before it (and the root
#: helpers); ``app`` (the product) may import them all, and none of them imports ``app``.
FORBIDDEN = {
    "channels": {"runtime", "actors", "operators", "connectors", "spark_bridge", "testing", "app"},
    "runtime": {"actors", "operators", "connectors", "spark_bridge", "testing", "app"},
    "actors": {"operators", "connectors", "spark_bridge", "testing", "app"},
    "operators": {"connectors", "spark_bridge", "testing", "app"},
    "connectors": {"spark_bridge", "testing", "app"},
    "spark_bridge": {"testing", "app"},
    "testing": {"app"},
}

#: The root hub modules a library module must not import: ``barrierflow.errors`` names every
#: layer (for a type checker), so a layer importing it would depend on all the others.
HUBS = {"barrierflow", "barrierflow.errors"}

#: Imports of another package's private module (``from x._y import``, ``x`` not the importer's
#: package or one of its ancestors), each with why it is still there. The list only shrinks:
#: an entry that no longer occurs fails the test, so it is removed with the import.
PRIVATE_ALLOWED: dict[tuple[str, str], str] = {
    (
        "barrierflow.app.demo_views",
        "barrierflow.connectors._staging",
    ): "the views act waits until the copy's Parquet table has no staged epoch left, by its "
    "staging directory's name; goes when the table protocol offers a public staged-epochs query",
    (
        "barrierflow.spark_bridge.task_state",
        "barrierflow.operators._keyed_state",
    ): "a Spark task writes the keyed operator's meta beside the state it loaded, so that the "
    "unchanged operator restores it as its own; goes when keyed operators offer a public "
    "restore-from-rows entry",
}

#: The optional packages (each an extra) that the core must not load.
OPTIONAL = ("redis", "pyiceberg", "deltalake", "pyspark")


# The import graph.


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE_ROOT.rglob("*.py"))}


def _package_of(module: str) -> str:
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def _is_within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _imported(module: str) -> Iterator[tuple[str, str | None]]:
    """``(module, name)`` for every import statement of ``module`` (``name``: the name of a
    ``from`` import, else ``None``), relative imports resolved."""
    tree = ast.parse(MODULES[module].read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _package_of(module).split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                yield source, alias.name


def _targets(module: str) -> set[str]:
    """The barrierflow modules that importing ``module`` runs: each module it names (a
    ``from x import y`` names ``x.y`` when ``y`` is a module, else ``x``) and the packages
    above them, except the importer's own ancestors (which are always imported first)."""
    found: set[str] = set()
    for source, name in _imported(module):
        if not _is_within(source, PACKAGE):
            continue
        named = f"{source}.{name}" if name and f"{source}.{name}" in MODULES else source
        parts = named.split(".")
        for i in range(2, len(parts) + 1):
            target = ".".join(parts[:i])
            if target in MODULES and target != module and not _is_within(module, target):
                found.add(target)
    return found


GRAPH = {module: _targets(module) for module in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_import_graph_has_no_cycle_not_even_behind_type_checking() -> None:
    cycles = _cycles(GRAPH)
    described = [
        [f"{a} -> {b}" for a in cycle for b in sorted(GRAPH[a]) if b in cycle] for cycle in cycles
    ]
    assert not cycles, f"import cycles: {described}"


def test_the_cycle_check_sees_a_cycle() -> None:
    """The check itself: two modules that import each other (one only for a type checker)
    are one cycle."""
    graph = {"a": {"b"}, "b": {"a"}, "c": {"a"}}
    assert _cycles(graph) == [["a", "b"]]


def _layer(module: str) -> str | None:
    """The top-level package or root module under ``barrierflow`` (``None``: the root)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_layers_point_one_way() -> None:
    """channels ← runtime ← actors ← operators ← connectors ← spark_bridge ← testing ← app: a layer
    imports only the layers before it, and no library module imports the product (``app``)
    or the error hub."""
    wrong: list[str] = []
    for module in MODULES:
        layer = _layer(module)
        if layer not in FORBIDDEN:
            continue
        for source, name in _imported(module):
            if not _is_within(source, PACKAGE):
                continue
            named = f"{source}.{name}" if name and f"{source}.{name}" in MODULES else source
            target_layer = _layer(named)
            if target_layer in FORBIDDEN[layer] or named in HUBS:
                wrong.append(f"{module} imports {named}")
    assert not wrong, wrong


def test_channels_import_only_channels_and_root_helpers() -> None:
    """The bottom layer: nothing of barrierflow but itself and the root's small helpers
    (``barrierflow/_*.py``), which in turn import only the channel errors."""
    helpers = {m for m in MODULES if m.count(".") == 1 and m.rpartition(".")[2].startswith("_")}
    helpers -= {"barrierflow.__main__"}
    wrong = [
        f"{module} imports {target}"
        for module in MODULES
        if _is_within(module, "barrierflow.channels")
        for target in GRAPH[module]
        if not _is_within(target, "barrierflow.channels") and target not in helpers
    ]
    wrong += [
        f"{helper} imports {target}"
        for helper in helpers
        for target in GRAPH[helper]
        if target not in helpers | {"barrierflow.channels.errors", "barrierflow.channels"}
    ]
    assert not wrong, wrong


def _private_imports() -> set[tuple[str, str]]:
    """``(importer, private module)`` for each import of another package's private module,
    and ``(importer, "module.name")`` for each private name imported from another package."""
    found: set[tuple[str, str]] = set()
    for module in MODULES:
        package = _package_of(module)
        for source, name in _imported(module):
            if not _is_within(source, PACKAGE):
                continue
            named = f"{source}.{name}" if name and f"{source}.{name}" in MODULES else source
            parts = named.split(".")
            private = next(
                (i for i, p in enumerate(parts) if p.startswith("_") and not p.startswith("__")),
                None,
            )
            if private is not None:
                owner = ".".join(parts[:private])
                if not _is_within(package, owner):
                    found.add((module, ".".join(parts[: private + 1])))
            elif name and name.startswith("_") and not name.startswith("__") and named == source:
                owner = _package_of(source) if source in MODULES else source
                if not _is_within(package, owner):
                    found.add((module, f"{source}.{name}"))
    return found


def test_no_module_imports_another_packages_private_names() -> None:
    found = _private_imports()
    new = sorted(found - set(PRIVATE_ALLOWED))
    assert not new, f"private names imported across packages: {new}"
    gone = sorted(set(PRIVATE_ALLOWED) - found)
    assert not gone, f"no longer imported: remove from PRIVATE_ALLOWED: {gone}"


def test_nothing_of_the_product_lives_in_the_package_root() -> None:
    """The demos, the CLI, the chaos harness and their helpers are in ``barrierflow.app``;
    the root holds the library's entry (``__init__``, ``errors``), ``__main__`` (which only
    delegates to the CLI) and small helpers."""
    root = {p.name for p in PACKAGE_ROOT.iterdir() if p.suffix == ".py" or p.is_dir()}
    product = {
        name
        for name in root
        if name.startswith(("demo", "_demo", "cli", "chaos", "_trace", "_interrupt"))
    }
    assert not product, product
    main = ast.parse((PACKAGE_ROOT / "__main__.py").read_text())
    imports = [n for n in ast.walk(main) if isinstance(n, ast.Import | ast.ImportFrom)]
    assert {getattr(n, "module", None) for n in imports} <= {None, "barrierflow.app.cli"}


# The error hub.


def _type_checking_imports(path: Path) -> set[tuple[str, str]]:
    tree = ast.parse(path.read_text())
    found: set[tuple[str, str]] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                if isinstance(stmt, ast.ImportFrom) and stmt.module:
                    for alias in stmt.names:
                        assert alias.asname == alias.name, f"{alias.name}: import it `as` itself"
                        found.add((stmt.module, alias.name))
    return found


def test_the_error_hub_names_each_error_once_for_the_interpreter_and_the_type_checker() -> None:
    """``barrierflow.errors`` re-exports lazily from a table (``_DEFINED_IN``) and, for a
    type checker, from ``if TYPE_CHECKING:`` imports: the two list the same errors, each
    from the module that defines it."""
    import barrierflow.errors as hub

    table = {(module, name) for name, module in hub._DEFINED_IN.items()}
    assert table == _type_checking_imports(PACKAGE_ROOT / "errors.py")
    assert set(hub.__all__) == set(hub._DEFINED_IN)
    for name, module in hub._DEFINED_IN.items():
        error = getattr(hub, name)
        assert error.__module__ == module, name
        assert issubclass(error, BarrierflowError), name


def test_every_layers_error_is_in_the_hub() -> None:
    import barrierflow.errors as hub

    for path in PACKAGE_ROOT.rglob("errors.py"):
        module = _module_name(path)
        if module == "barrierflow.errors":
            continue
        listed = ast.literal_eval(
            next(
                n.value
                for n in ast.parse(path.read_text()).body
                if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "__all__"
            )
        )
        assert set(listed) <= set(hub.__all__), (module, set(listed) - set(hub.__all__))


# A light import, in a fresh interpreter.


def _loaded_after(statement: str) -> list[str]:
    """The modules of interest loaded by a fresh interpreter after ``statement``."""
    code = textwrap.dedent(
        f"""
        import json, sys
        {statement}
        watched = {list(OPTIONAL)!r} + [
            "barrierflow.runtime", "barrierflow.actors", "barrierflow.connectors",
            "barrierflow.spark_bridge", "barrierflow.testing", "barrierflow.app",
        ]
        print(json.dumps(sorted(m for m in watched if m in sys.modules)))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    loaded: list[str] = json.loads(done.stdout)
    return loaded


@pytest.mark.parametrize(
    ("statement", "may_load"),
    [
        ("import barrierflow", set()),
        ("import barrierflow.channels", set()),
        ("import barrierflow.runtime", {"barrierflow.runtime"}),
        ("import barrierflow.actors", {"barrierflow.runtime", "barrierflow.actors"}),
        (
            "import barrierflow.connectors",
            {"barrierflow.runtime", "barrierflow.actors", "barrierflow.connectors"},
        ),
    ],
)
@pytest.mark.subprocess
def test_importing_the_core_loads_no_optional_package(statement: str, may_load: set[str]) -> None:
    """``import barrierflow`` and the core load none of redis, pyiceberg, deltalake, pyspark
    (nor a layer above the one imported): a connector imports its extra when it is built."""
    assert set(_loaded_after(statement)) <= may_load


@pytest.mark.subprocess
def test_an_error_from_the_hub_loads_only_its_layer() -> None:
    loaded = _loaded_after("from barrierflow.errors import ChannelClosedError, StoreIOError")
    assert set(loaded) <= {"barrierflow.runtime"}


# Extras.


def test_require_returns_an_installed_module() -> None:
    assert require("redis", "json") is json


def test_require_names_the_extra_of_a_missing_module() -> None:
    with pytest.raises(MissingExtraError) as caught:
        require("delta", "barrierflow_no_such_module")
    error = caught.value
    assert (error.extra, error.module) == ("delta", "barrierflow_no_such_module")
    assert isinstance(error, BarrierflowError)
    assert isinstance(error, ImportError)  # code guarding an optional import still catches it
    assert isinstance(error.__cause__, ImportError)
    assert "pip install 'barrierflow[delta]'" in str(error)
    assert barrierflow.errors.MissingExtraError is MissingExtraError


def test_require_refuses_an_unknown_extra() -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        require("nosuch", "json")
    assert caught.value.argument == "extra"
    assert set(EXTRAS) == {"iceberg", "delta", "redis", "spark", "metrics", "postgres"}


def _missing_extra(blocked: str, statement: str) -> dict[str, str]:
    """Run ``statement`` in a fresh interpreter where ``blocked`` cannot be imported; what it
    raised (type, extra, module)."""
    code = textwrap.dedent(
        f"""
        import json, sys
        sys.modules[{blocked!r}] = None  # installed, but as if it were not
        import pyarrow as pa
        from barrierflow.errors import MissingExtraError
        try:
            {statement}
        except MissingExtraError as exc:
            print(json.dumps({{"type": "MissingExtraError", "extra": exc.extra,
                               "module": exc.module, "message": str(exc)}}))
        else:
            print(json.dumps({{"type": "nothing raised"}}))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    result: dict[str, str] = json.loads(done.stdout)
    return result


@pytest.mark.parametrize(
    ("blocked", "statement", "extra"),
    [
        (
            "redis",
            "from barrierflow.connectors import RedisStreamLog; "
            "RedisStreamLog('redis://127.0.0.1:1', payload=pa.schema([('v', pa.int64())]), "
            "splits=['s'])",
            "redis",
        ),
        (
            "pyiceberg",
            "from barrierflow.connectors import open_local_catalog; "
            "open_local_catalog('/nonexistent-barrierflow-test')",
            "iceberg",
        ),
        (
            "pyiceberg",
            "from barrierflow.connectors import IcebergTable; "
            "IcebergTable(object(), 'ns.t', pa.schema([('v', pa.int64())]))",
            "iceberg",
        ),
        (
            "psycopg",
            "from barrierflow.connectors import PostgresTable; "
            "PostgresTable('dbname=x', 't', pa.schema([('v', pa.int64())]))",
            "postgres",
        ),
        (
            "pyspark",
            "from barrierflow.spark_bridge.bridge import arrow_schema_of; "
            "arrow_schema_of(type('Frame', (), {'schema': None})())",
            "spark",
        ),
    ],
)
@pytest.mark.subprocess
def test_a_connector_without_its_extra_raises_missing_extra_naming_it(
    blocked: str, statement: str, extra: str
) -> None:
    result = _missing_extra(blocked, statement)
    assert result["type"] == "MissingExtraError", result
    assert result["extra"] == extra
    assert result["module"].split(".")[0] == blocked
    assert f"pip install 'barrierflow[{extra}]'" in result["message"]
