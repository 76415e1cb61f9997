"""A pytest plugin: a running barrierflow runtime per test, on asyncio and on trio.

Enable it in a ``conftest.py``::

    pytest_plugins = ["barrierflow.testing.pytest_plugin"]

and ask for the fixtures in async tests marked ``anyio`` (anyio's pytest plugin runs them):

* ``bf_state_dir`` — a fresh directory for the test's SQLite state store (under ``tmp_path``).
* ``bf_config`` — the :class:`~barrierflow.runtime.RuntimeConfig` the runtime is built with:
  the store in ``bf_state_dir``, recovery on (a scripted ``CRASH`` is recovered) with a 1 ms
  backoff, and a barrier interval of an hour, so that epochs move only when the test asks
  (``rt.checkpoint()``, a ``CHECKPOINT`` sentinel) and no test depends on the clock.
  Override the fixture to change it.
* ``bf_graph`` — declares the graph: a callable given the new, not yet started runtime. The
  default declares one :class:`~barrierflow.testing.scripted.ScriptedSource` named
  ``"source"``. Override it (``@pytest.fixture def bf_graph(): return declare``) to declare
  yours; jobs may also join the running runtime in the test (``await rt.add_job(job)``).
* ``bf_runtime`` — the runtime, running (``async with`` entered) for the test and stopped after
  it: its final checkpoint, then the store is closed. A graph that failed for good (recovery
  off or out of restarts) fails the test at teardown with the runtime's ``ActorFailedError``.
* ``anyio_backend`` — parametrized over ``("asyncio", "trio")``, so every test that uses the
  runtime runs on both backends. pytest prefers a fixture of a ``conftest.py`` or test module
  to a plugin's, so a project that defines its own ``anyio_backend`` keeps it; this one only
  replaces anyio's default (asyncio alone before anyio 4.12, module-scoped after it). Trio
  must be installed (``pip install trio``).

Why fixtures and not a context manager alone: the runtime's task group must be entered and
left by the same task, which anyio's plugin guarantees for an async generator fixture, and a
fixture gives teardown on failure for free.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.runtime.config import RuntimeConfig
from barrierflow.runtime.runtime import Runtime
from barrierflow.testing.scripted import ScriptedSource

__all__ = [
    "GraphDeclaration",
    "anyio_backend",
    "bf_config",
    "bf_graph",
    "bf_runtime",
    "bf_state_dir",
]

#: What ``bf_graph`` returns: declares the graph of a runtime that has not started.
GraphDeclaration = Callable[[Runtime], None]


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Both backends, unless the project defines its own ``anyio_backend`` (see the module)."""
    return str(request.param)


@pytest.fixture
def bf_state_dir(tmp_path: Path) -> Path:
    """A fresh directory for the test's state store (the runtime creates the file)."""
    directory = tmp_path / "barrierflow-state"
    directory.mkdir()
    return directory


@pytest.fixture
def bf_config(bf_state_dir: Path) -> RuntimeConfig:
    """The test runtime's configuration (see the module for why these values)."""
    return RuntimeConfig(
        state_path=bf_state_dir / "state.db",
        barrier_interval=3600,
        recovery=True,
        restart_backoff=0.001,
    )


def _one_scripted_source(rt: Runtime) -> None:
    rt.add_source("source", ScriptedSource)


@pytest.fixture
def bf_graph() -> GraphDeclaration:
    """Declares the graph: one ``ScriptedSource`` named ``"source"`` (override to change)."""
    return _one_scripted_source


@pytest.fixture
async def bf_runtime(
    bf_config: RuntimeConfig, bf_graph: GraphDeclaration, anyio_backend: object
) -> AsyncIterator[Runtime]:
    """A runtime on ``bf_config`` with the graph of ``bf_graph``, running during the test.

    ``anyio_backend`` is asked for so that anyio's plugin runs this fixture even for a test not
    marked ``anyio``; such a test could not drive the runtime, though, as it is not async.

    Raises:
        InvalidArgumentError: ``bf_graph`` is not callable (an overriding fixture returned
            something else).
    """
    if not callable(bf_graph):
        raise InvalidArgumentError("bf_graph", "a callable declaring the graph", bf_graph)
    rt = Runtime(bf_config)
    bf_graph(rt)
    async with rt:
        yield rt
