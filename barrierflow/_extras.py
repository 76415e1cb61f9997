"""Optional dependencies as extras: import a connector's package, or say which extra to install.

The core (channels, runtime, actors) needs anyio and pyarrow only; each connector's package —
redis, pyiceberg, deltalake, pyspark, prometheus-client, psycopg — is an extra of the distribution
(``pip install 'barrierflow[redis]'``). A connector imports its package through
:func:`require` when it is built, never at module import, so that ``import barrierflow`` and
the core load none of them, and a missing one is a :class:`MissingExtraError` naming the extra
to install rather than a bare ``ModuleNotFoundError`` from deep inside a constructor.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import final

from barrierflow.channels.errors import BarrierflowError, InvalidArgumentError

__all__ = ["EXTRAS", "MissingExtraError", "require"]

#: The extras of the distribution (``pyproject.toml``'s ``[project.optional-dependencies]``)
#: that hold a connector's package, by name.
EXTRAS = frozenset({"iceberg", "delta", "redis", "spark", "metrics", "postgres"})


@final
class MissingExtraError(BarrierflowError, ImportError):
    """A connector's package is not installed: the extra that provides it is missing.

    Also an ``ImportError``, so code that guards an optional import the usual way still
    catches it. The ``ImportError`` that failed is the ``__cause__``.

    Attributes:
        extra: the extra to install (``"redis"``, ``"iceberg"``, ``"delta"``, ``"spark"``,
            ``"metrics"``, ``"postgres"``).
        module: the module that could not be imported (``"redis"``,
            ``"pyiceberg.catalog.sql"``).
    """

    def __init__(self, extra: str, module: str) -> None:
        self.extra = extra
        self.module = module
        super().__init__(
            f"module {module!r} is not installed: expected the {extra!r} extra — "
            f"pip install 'barrierflow[{extra}]'",
            name=module,
        )


def require(extra: str, module: str) -> ModuleType:
    """Import ``module`` (dotted), which the extra ``extra`` installs, and return it.

    Args:
        extra: the extra that provides the module (one of :data:`EXTRAS`).
        module: the dotted module name to import.

    Returns:
        The imported module.

    Raises:
        MissingExtraError: the module (or a package it needs) cannot be imported; its
            ``__cause__`` is the ``ImportError``.
        InvalidArgumentError: ``extra`` is not one of :data:`EXTRAS` (a mistake in the
            caller, not a missing package).
    """
    if extra not in EXTRAS:
        raise InvalidArgumentError("extra", f"one of {sorted(EXTRAS)}", extra)
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(extra, module) from exc
