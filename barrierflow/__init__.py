"""barrierflow: streaming dataflow for Python.

Actors talk over bounded channels, exchanging Arrow chunks and barriers that cut the stream
into epochs. Start with :mod:`barrierflow.runtime` (a :class:`~barrierflow.runtime.Runtime`)
and :mod:`barrierflow.channels` (the messages).

**Each public name has one home**, the package of its layer, and is exported from there only:

* :mod:`barrierflow.channels` — messages (chunks, barriers, mutations), channels, dispatch and
  the aligned merge;
* :mod:`barrierflow.runtime` — the runtime, actors, jobs, services and the state store;
* :mod:`barrierflow.actors` — sinks and the table protocol (``add_sink``, ``Table``, …),
  sources and backfills (its subpackages ``sinks``, ``sources`` and ``backfill`` organize the
  code and export nothing);
* :mod:`barrierflow.connectors` — the tables and split logs of real systems;
* :mod:`barrierflow.spark_bridge` — Spark in and out;
* :mod:`barrierflow.testing` — the test kit;
* :mod:`barrierflow.errors` — **every** error, and only there (its layer's ``errors`` module
  defines it; that module is not a place to import it from).

The root exports ``__version__`` only. ``tests/public_api.txt`` lists every public name, so
that the surface grows only deliberately; a name that left a place it used to be exported from
fails there with :class:`~barrierflow.errors.RemovedNameError` naming its home (see
``CHANGELOG.md``). ``import barrierflow`` imports none of the layers and none of the
connectors' optional packages (redis, pyiceberg, deltalake, pyspark).
"""

import typing as _typing

from barrierflow import errors as _errors
from barrierflow._version import __version__ as __version__

__all__ = ["__version__"]

if not _typing.TYPE_CHECKING:
    # A type checker sees no ``__getattr__``, so that a removed or misspelt name is still an
    # error to it.

    def __getattr__(name: str) -> object:
        """Say where a name the root no longer exports went (the errors: to
        :mod:`barrierflow.errors`, their one home).

        Raises:
            RemovedNameError: ``name`` is an error of :mod:`barrierflow.errors` (re-exported
                here until 0.2.0) or another removed name.
            AttributeError: any other name.
        """
        # Imported on a miss only: ``_removed`` imports the channel layer (pyarrow, anyio),
        # and ``import barrierflow`` stays light.
        from barrierflow._removed import ERRORS_LEFT_THE_ROOT, RemovedNameError, removed_names

        if name in _errors.__all__:
            raise RemovedNameError(
                __name__, name, ERRORS_LEFT_THE_ROOT, f"barrierflow.errors.{name}"
            )
        return removed_names(__name__)(name)
