"""One knob for deadlines on a slow or busy machine: ``BARRIERFLOW_TEST_TIMEOUT_SCALE``.

The test suite, the crash part of :func:`~barrierflow.testing.check_table` and
``barrierflow chaos`` all multiply their deadlines by it (default 1): on a loaded machine
everything takes longer while nothing is wrong, and a deadline is there to turn a hang into a
failure, never to judge speed.
"""

from __future__ import annotations

import os

from barrierflow.channels.errors import InvalidArgumentError

__all__ = ["ENV", "timeout_scale"]

#: The environment variable that multiplies every deadline.
ENV = "BARRIERFLOW_TEST_TIMEOUT_SCALE"


def timeout_scale() -> float:
    """The factor from :data:`ENV` (default 1).

    Raises:
        InvalidArgumentError: (a ``ValueError``) it is set to anything but a positive finite
            number — a typo must not silently leave the deadlines short.
    """
    text = os.environ.get(ENV, "").strip()
    if not text:
        return 1.0
    try:
        scale = float(text)
    except ValueError:
        scale = float("nan")
    if not 0 < scale < float("inf"):
        raise InvalidArgumentError(ENV, "a positive number such as 1 or 4", text)
    return scale
