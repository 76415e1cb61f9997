"""barrierflow: streaming dataflow for Python.

Actors talk over bounded channels, exchanging Arrow chunks and barriers that cut the stream
into epochs. Start with :mod:`barrierflow.channels`.

The root re-exports every public error (:mod:`barrierflow.errors`) lazily: ``import
barrierflow`` (and so ``import barrierflow.channels``) imports none of the layers and none of
the connectors' optional packages (redis, pyiceberg, deltalake, pyspark); an error's layer is
imported when the name is first looked up.
"""

import typing as _typing

from barrierflow import errors as _errors
from barrierflow._version import __version__ as __version__

if _typing.TYPE_CHECKING:
    from barrierflow.errors import *  # noqa: F403 - every public error of barrierflow.errors

if not _typing.TYPE_CHECKING:
    # A type checker reads the errors from the star import above and sees no
    # ``__getattr__``, so that a misspelt name is still an error to it.
    __all__ = [*_errors.__all__, "__version__"]

    def __getattr__(name: str) -> object:
        """Look a public error up in :mod:`barrierflow.errors` (which imports its layer on
        first use), and keep it here.

        Raises:
            AttributeError: ``name`` is not a public error.
        """
        if name not in _errors.__all__:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(_errors, name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})
