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

import os

__all__ = ["ENV", "scaled", "timeout_scale"]

#: The environment variable that multiplies every test deadline.
ENV = "BARRIERFLOW_TEST_TIMEOUT_SCALE"


def timeout_scale() -> float:
    """The factor from :data:`ENV` (default 1).

    Raises:
        ValueError: the variable is set to something other than a positive finite number
            (a typo must not silently leave the deadlines short).
    """
    text = os.environ.get(ENV, "").strip()
    if not text:
        return 1.0
    try:
        scale = float(text)
    except ValueError:
        scale = float("nan")
    if not (0 < scale < float("inf")):
        raise ValueError(f"{ENV}: expected a positive number such as 1 or 4, got {text!r}")
    return scale


def scaled(seconds: float) -> float:
    """``seconds`` times the suite's timeout scale: use it for every test deadline."""
    return seconds * timeout_scale()
