"""Enums of the message vocabulary whose lookup by value raises a typed error."""

from __future__ import annotations

import enum
from typing import Any

from barrierflow.channels.errors import InvalidArgumentError


class TypedEnumType(enum.EnumType):
    """``Kind(value)`` raises :class:`InvalidArgumentError` (still a ``ValueError``) naming the
    valid values, for an unknown value and for an unhashable one alike — where plain enum
    raises a bare ``ValueError``, or whatever ``==`` of the value raises (a NumPy array's
    "truth value is ambiguous").

    An int enum is looked up by ints only: ``1.0`` and ``True`` equal ``1`` but are refused, as
    everywhere a float or a bool arrives where an int is expected.
    """

    def __call__(cls, value: Any, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:  # the functional API (creating an enum), not a lookup
            return super().__call__(value, *args, **kwargs)
        members: dict[str, Any] = dict(cls.__members__)
        valid = [member.value for member in members.values()]
        if issubclass(cls, int) and (type(value) is bool or not isinstance(value, int)):
            raise InvalidArgumentError(cls.__name__, f"one of {valid}", value)
        try:
            return super().__call__(value)
        except (ValueError, TypeError) as exc:
            raise InvalidArgumentError(cls.__name__, f"one of {valid}", value) from exc
