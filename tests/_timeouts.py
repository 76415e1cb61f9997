"""One knob for every deadline in the test suite: ``BARRIERFLOW_TEST_TIMEOUT_SCALE``.

On a loaded machine (CI runners, a laptop building something else) everything takes longer
while nothing is wrong. Every deadline in the tests — pytest-timeout's per-test limit (scaled
by the hook in ``conftest.py``), each ``anyio.fail_after``/``move_on_after`` and each
subprocess ``timeout=`` — goes through :func:`scaled`, so one variable stretches them all::

    BARRIERFLOW_TEST_TIMEOUT_SCALE=4 make test

The default is 1. A deadline is there to turn a hang into a failure, never to judge speed:
a test must pass on a slow machine once its deadlines are scaled.
"""

from __future__ import annotations

from barrierflow._timeout_scale import ENV, timeout_scale

__all__ = ["ENV", "scaled", "timeout_scale"]


def scaled(seconds: float) -> float:
    """``seconds`` times the suite's timeout scale: use it for every test deadline."""
    return seconds * timeout_scale()
