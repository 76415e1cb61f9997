"""Spark's errors reduced to their cause: what stopped a query, in one line.

An error raised inside a ``foreachBatch`` callback reaches the driver as a
``StreamingQueryException`` (or a ``Py4JJavaError``) whose text is a wall: Spark's error class
and query id, the JVM stack (``ForeachBatchUserFuncException``, ``Py4JException``), the Python
traceback of the callback *as text*, the query's plan — 180 to 250 lines once printed, with
the one line that matters in the middle. The error object itself stayed on the Python side.

:func:`unwrap_spark_error` finds the cause, in this order:

1. an error the caller kept when the callback raised it (the bridge keeps the last one:
   :attr:`~barrierflow.spark_bridge.SparkBridge.last_error`) whose type the Spark error's text
   names — the original typed error is returned, fields and ``__cause__`` intact, so a driver
   can catch :class:`~barrierflow.errors.BatchOrderError` or
   :class:`~barrierflow.errors.SchemaMismatchError` as such;
2. else the last Python exception line in the text (the error the callback raised), or the
   first line of Spark's own message without its query prefix and ``SQLSTATE`` suffix, as a
   :class:`~barrierflow.errors.SparkQueryFailedError` whose ``__cause__`` is the Spark error.

Errors that do not come from Spark (nor from Py4J) are returned as they are. Text is parsed
only when no kept error matches: pyspark gives no structured access to a Python error raised
in a callback.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from barrierflow._one_line import one_line
from barrierflow.spark_bridge.errors import SparkQueryFailedError

__all__ = ["is_spark_error", "unwrap_spark_error"]

_TRACEBACK = "Traceback (most recent call last):"
_QUERY = re.compile(r"Query (?:(\S+) )?\[id = ([0-9a-fA-F-]+)")
_STREAM_FAILED = re.compile(r"^\[STREAM_FAILED\] Query .*?\] terminated with exception: ")
_SQLSTATE = re.compile(r"\s*SQLSTATE: \w+.*$")
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?:: (.*))?$")


def is_spark_error(exc: BaseException) -> bool:
    """Whether ``exc`` is one of pyspark's or Py4J's exceptions (checked by module, so pyspark
    need not be importable)."""
    return type(exc).__module__.partition(".")[0] in ("pyspark", "py4j")


def unwrap_spark_error(
    exc: BaseException, kept: Iterable[BaseException] = (), *, query: str | None = None
) -> BaseException:
    """The error behind ``exc`` (see the module): one of ``kept`` that Spark's text names, else
    a :class:`~barrierflow.errors.SparkQueryFailedError` with the cause in one line; ``exc``
    itself if it is not a Spark or Py4J error.

    Args:
        exc: what the driver caught (``awaitTermination``) or ``query.exception()`` returned.
        kept: errors raised in callbacks on the Python side, the most recent last.
        query: the query's name, when the caller knows it (Spark's text names its id only).
    """
    if not is_spark_error(exc):
        return exc
    text = str(exc)
    for error in reversed(list(kept)):
        if type(error).__name__ in text:
            return error
    failed = SparkQueryFailedError(query or _query(text), _cause(text) or one_line(exc))
    failed.__cause__ = exc
    return failed


def _query(text: str) -> str | None:
    """The query's name (else its id) from Spark's ``Query <name> [id = ...]``."""
    found = _QUERY.search(text)
    if found is None:
        return None
    return found.group(1) or found.group(2)


def _cause(text: str) -> str | None:
    """The last Python exception line of the text (the outermost error the callback raised),
    else Spark's first line without its prefix and suffix."""
    at = text.rfind(_TRACEBACK)
    if at >= 0:
        for line in text[at + len(_TRACEBACK) :].splitlines():
            if not line.strip() or line[0].isspace():
                continue  # frames and source lines are indented
            found = _EXCEPTION_LINE.match(_SQLSTATE.sub("", line).strip())
            if found is not None:
                kind = found.group(1).rpartition(".")[2]
                return f"{kind}: {found.group(2)}" if found.group(2) else kind
            break
    for line in text.splitlines():
        line = _SQLSTATE.sub("", _STREAM_FAILED.sub("", line.strip())).strip()
        if line and not line.startswith(_TRACEBACK):
            return line
    return None
