"""barrierflow: streaming dataflow for Python.

Actors talk over bounded channels, exchanging Arrow chunks and barriers that cut the stream
into epochs. Start with :mod:`barrierflow.channels`.
"""

from barrierflow import errors as _errors
from barrierflow.errors import *  # noqa: F403 - every public error, listed once in errors.py

__version__ = "0.1.0"

__all__ = [*_errors.__all__, "__version__"]
