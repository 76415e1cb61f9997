"""An error in one line: ``Type: first line of its message``.

What a log field, a summary line or the CLI shows of an error, wherever a traceback (or a
message that embeds one, as Spark's do) would bury the cause. One helper for the whole
package, so every one-line report reads the same.
"""

from __future__ import annotations

__all__ = ["one_line"]


def one_line(exc: BaseException) -> str:
    """``"<ErrorType>: <first non-empty line of its message>"`` (the type alone when the
    message is empty)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
