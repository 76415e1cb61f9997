"""A Hypothesis state machine run on one event-loop thread for all its examples."""

from __future__ import annotations

from typing import Any

from anyio.from_thread import start_blocking_portal


def portal_case(machine: Any) -> Any:
    """The machine's test case, with one blocking portal (event loop thread) for all of its
    examples, started and stopped around the run."""

    class Case(machine.TestCase):  # type: ignore[name-defined,misc]
        _portal_cm: Any = None

        @classmethod
        def setUpClass(cls) -> None:
            super().setUpClass()
            cls._portal_cm = start_blocking_portal(machine.backend)
            machine.shared_portal = cls._portal_cm.__enter__()

        @classmethod
        def tearDownClass(cls) -> None:
            machine.shared_portal = None
            cls._portal_cm.__exit__(None, None, None)
            super().tearDownClass()

    return Case
