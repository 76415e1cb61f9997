"""The names of an actor's outputs: ``None`` for its main output, a side output's name else.

A side output is read downstream as ``"<actor>:<output>"``, so neither an actor's name nor an
output's may hold a ``":"`` (:data:`SEPARATOR`, also what the graph splits inputs at). One
check serves the outputs that route by name (:class:`~barrierflow.channels.outputs.Outputs`),
the outputs joining at a barrier (:class:`~barrierflow.channels.mutation.NewOutput`) and the
side outputs an actor's context is given.
"""

from __future__ import annotations

from barrierflow.channels.errors import InvalidArgumentError

__all__ = ["SEPARATOR", "check_output_name"]

#: What separates an actor's name from its side output's in an input (``"win:late"``).
SEPARATOR = ":"


def check_output_name(argument: str, output: object) -> str | None:
    """``output`` if it names an output: ``None`` (the main output) or a non-empty str without
    ``":"``.

    Raises:
        InvalidArgumentError: anything else (named ``argument``).
    """
    if output is None or (isinstance(output, str) and output and SEPARATOR not in output):
        return output
    raise InvalidArgumentError(
        argument,
        "None (the main output) or a side output's name (a non-empty str without ':')",
        output,
    )
