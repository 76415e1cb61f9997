"""Comparing two Arrow schemas in words: what differs, and the cast that fixes a difference
that is only a time zone or an integer width (the two a user meets most — Spark and pandas
hand out naive timestamps and 32-bit integers where a table declares them otherwise)."""

from __future__ import annotations

import pyarrow as pa

from barrierflow.channels.schema import cast_fixes

__all__ = ["describe_difference"]


def _type(field: pa.Field) -> str:
    return f"{field.type}{'' if field.nullable else ' not null'}"


def _cast_fix(name: str, want: pa.DataType, have: pa.DataType) -> str | None:
    """The cast that turns ``have`` into ``want``, if they differ only in time zone or integer
    width (or signedness)."""
    if cast_fixes(want, have):
        return (
            f"fix: cast column {name!r} to {want} before the sink (pyarrow.compute.cast), or "
            f"declare the sink's field as {have}"
        )
    return None


def describe_difference(expected: pa.Schema, got: pa.Schema) -> tuple[str, str]:
    """What differs between ``expected`` (a sink's schema) and ``got`` (its input's), and how
    to fix it when every difference is one a cast fixes.

    Returns:
        ``(difference, fix)``: the differences in one line; the fix, or ``""``.
    """
    problems: list[str] = []
    fixes: list[str | None] = []
    have = {field.name: field for field in got}
    want = {field.name: field for field in expected}
    for field in expected:
        other = have.get(field.name)
        if other is None:
            problems.append(f"column {field.name!r} ({_type(field)}) is missing from the input")
            fixes.append(None)
        elif not other.type.equals(field.type):
            problems.append(
                f"column {field.name!r} is {_type(field)} in the sink, {_type(other)} in the input"
            )
            fixes.append(_cast_fix(field.name, field.type, other.type))
        elif other.nullable != field.nullable:
            problems.append(
                f"column {field.name!r} is {_type(field)} in the sink, {_type(other)} in the input"
            )
            fixes.append(None)
    for field in got:
        if field.name not in want:
            problems.append(f"the input has column {field.name!r} ({_type(field)}) the sink lacks")
            fixes.append(None)
    if not problems and expected.names != got.names:
        problems.append(
            f"columns in another order (sink: {', '.join(expected.names)}; input: "
            f"{', '.join(got.names)})"
        )
        fixes.append(None)
    if not problems:
        problems.append("field metadata differs")
        fixes.append(None)
    fix = "; ".join(f for f in fixes if f) if all(fixes) else ""
    return "; ".join(problems), fix
