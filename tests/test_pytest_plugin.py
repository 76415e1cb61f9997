"""The pytest plugin: a user's conftest enables it and gets a running runtime per test, on both
backends unless the user chose the backend; the graph and the configuration can be overridden.

Each test runs pytest on a small user project (``pytester``, in this process), as a user would.
"""

from __future__ import annotations

import pytest

# Imported here, before pytester runs: an in-process run forgets the modules it imported
# itself, and numpy (under pyarrow) cannot be loaded twice in one process.
import barrierflow.actors
import barrierflow.testing.pytest_plugin
import barrierflow.testing.scripted  # noqa: F401

#: The plugin was imported before pytester ran (see above), so pytest cannot rewrite it.
ARGS = ("-p", "no:randomly", "-W", "ignore::pytest.PytestAssertRewriteWarning")
CONFTEST = 'pytest_plugins = ["barrierflow.testing.pytest_plugin"]\n'

PLAY = """
import pyarrow as pa
import pytest
import sniffio

from barrierflow.testing.scripted import CHECKPOINT, play

pytestmark = pytest.mark.anyio


async def test_play(bf_runtime, bf_state_dir, anyio_backend):
    assert sniffio.current_async_library() == anyio_backend
    playback = await play(bf_runtime, "source", [pa.record_batch({"n": [1]}), CHECKPOINT])
    assert bf_runtime.committed_epoch == playback.checkpoints[0] > 0
    assert (bf_state_dir / "state.db").exists()
"""


def test_the_runtime_fixture_runs_on_both_backends(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_user=PLAY)
    result = pytester.runpytest("-v", "--setup-show", *ARGS)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_play?asyncio?*PASSED*", "*test_play?trio?*PASSED*"])
    # The plugin's own anyio_backend (function-scoped, F), not anyio's default (module, M).
    result.stdout.fnmatch_lines(["*SETUP    F anyio_backend?'asyncio'?*"])


def test_a_users_own_anyio_backend_wins(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        CONFTEST
        + """
import pytest

@pytest.fixture
def anyio_backend():
    return "trio"
"""
    )
    pytester.makepyfile(test_user=PLAY)
    result = pytester.runpytest("-v", *ARGS)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*test_play PASSED*"])


def test_the_graph_and_config_can_be_overridden(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_user="""
import pyarrow as pa
import pytest

from barrierflow.actors import add_sink
from barrierflow.runtime import RuntimeConfig
from barrierflow.testing import ListTable
from barrierflow.testing.scripted import CHECKPOINT, CRASH, ScriptedSource, play

pytestmark = pytest.mark.anyio
SCHEMA = pa.schema([("n", pa.int64())])


@pytest.fixture
def sink():
    return ListTable(SCHEMA)  # one per test: a new store next to old commits is refused


@pytest.fixture
def declared():
    return []  # the sink as bf_graph declared it


@pytest.fixture
def bf_config(bf_state_dir):
    return RuntimeConfig(
        state_path=bf_state_dir / "mine.db", barrier_interval=3600, recovery=True,
        max_restarts=1, restart_backoff=0.001,
    )


@pytest.fixture
def bf_graph(sink, declared):
    def declare(rt):
        rt.add_source("events", ScriptedSource)
        declared.append(add_sink(rt, "out", sink, input="events"))
    return declare


async def test_crash_and_recover(bf_runtime, bf_state_dir, sink, declared):
    one, two = (pa.record_batch({"n": [i]}, schema=SCHEMA) for i in (1, 2))
    playback = await play(bf_runtime, "events", [one, CHECKPOINT, two, CRASH, CHECKPOINT])
    epoch = await bf_runtime.checkpoint()
    await declared[0].coordinator.wait_committed(epoch)  # committed once durable
    assert playback.crashes == 1
    assert sorted(sink.rows().column("n").to_pylist()) == [1, 2]
    assert (bf_state_dir / "mine.db").exists()
"""
    )
    result = pytester.runpytest(*ARGS)
    result.assert_outcomes(passed=2)


def test_a_bad_graph_declaration_is_an_error(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_user="""
import pytest

pytestmark = pytest.mark.anyio


@pytest.fixture
def bf_graph():
    return "not a callable"


async def test_uses_it(bf_runtime):
    pass
"""
    )
    result = pytester.runpytest(*ARGS)
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*InvalidArgumentError: bf_graph: expected a callable*"])
