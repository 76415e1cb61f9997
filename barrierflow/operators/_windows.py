"""Event time: how a column's values, durations and watermarks compare, and which windows a row
falls in — shared by :func:`~barrierflow.operators.watermarks.with_watermark` and
:func:`~barrierflow.operators.window.window_aggregate`.

**Ticks.** An event-time column is compared as NumPy numbers, its *ticks*: a timestamp column
as int64 nanoseconds since the epoch, UTC (whatever its unit and time zone; timestamps between
the years 1678 and 2262), an integer column as int64, a floating column as float64. Other
types are refused with :class:`~barrierflow.errors.SchemaMismatchError`.

**Durations** (a window's size and step, a delay, an allowed lateness) are a
``datetime.timedelta`` or a number: on a timestamp column a number is seconds, on a numeric
column it is the column's own unit (an int for an integer column; a timedelta is refused
there, as is a window step that is not a whole number of a timestamp column's unit).

**Watermark values** on a timestamp column are ``numpy.datetime64`` (what
:func:`~barrierflow.operators.watermarks.with_watermark` emits, nanoseconds) or
``datetime.datetime`` (naive: UTC; microseconds); on a numeric column numbers (a float one on
an integer column is floored: the watermark only says less).

**Windows** align to tick 0 (the Unix epoch for timestamps), as Flink's do: a tumbling window
of size ``s`` holds ``[k·s, (k+1)·s)``; a sliding window of size ``s`` every ``e`` starts at
each multiple of ``e`` and a row falls in ``s / e`` of them (``s`` must be a multiple of ``e``,
so that every row falls in the same number of windows — decided for a vectorized assignment
with one ``repeat``; Flink allows any pair).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from barrierflow.channels.errors import InvalidArgumentError, SchemaMismatchError
from barrierflow.operators._operator import as_number, is_real

__all__ = [
    "Assigner",
    "Duration",
    "EventTime",
    "Sliding",
    "Tumbling",
    "Window",
    "check_non_negative",
    "check_positive",
    "watermark_ticks",
]

#: A duration as a user gives it: a timedelta, or a number (see the module).
Duration = timedelta | int | float

_EPOCH = datetime(1970, 1, 1)
_MICROSECOND = timedelta(microseconds=1)
_NS_PER_UNIT = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
_DURATION = "a timedelta or a number"


def _duration(value: object) -> float | None:
    """``value`` in its own unit if it is a finite duration (see the module), else ``None``."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    number = as_number(value)  # an int beyond a float: no duration anything compares with
    return number if number is not None and math.isfinite(number) else None


def check_positive(argument: str, value: object) -> Duration:
    """``value`` if it is a positive duration (see the module).

    Raises:
        InvalidArgumentError: anything else.
    """
    number = _duration(value)
    if number is None or number <= 0:
        raise InvalidArgumentError(argument, "a positive timedelta or number", value)
    return value  # type: ignore[return-value]


def check_non_negative(argument: str, value: object) -> Duration:
    """``value`` if it is a duration ``>= 0`` (see the module).

    Raises:
        InvalidArgumentError: anything else.
    """
    number = _duration(value)
    if number is None or number < 0:
        raise InvalidArgumentError(argument, "a non-negative timedelta or number", value)
    return value  # type: ignore[return-value]


def _seconds(value: Duration) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


@final
@dataclass(frozen=True, slots=True)
class EventTime:
    """An event-time column's type, and how its values, durations and watermarks become ticks
    (see the module). Made by :meth:`of`."""

    #: The column's name.
    column: str
    #: The column's Arrow type.
    type: pa.DataType

    @staticmethod
    def of(schema: pa.Schema, column: str, argument: str) -> EventTime:
        """The event time of ``schema``'s ``column``.

        Raises:
            SchemaMismatchError: the column is missing, or not a timestamp, integer or
                floating column (``argument`` names what asked for it).
        """
        index = schema.get_field_index(column)
        if index < 0:
            raise SchemaMismatchError(argument, f"a schema with the column {column!r}", schema)
        typ = schema.field(index).type
        if not (
            pa.types.is_timestamp(typ) or pa.types.is_integer(typ) or pa.types.is_floating(typ)
        ):
            raise SchemaMismatchError(
                argument,
                f"a timestamp, integer or floating column {column!r}",
                f"{column}: {typ}",
            )
        return EventTime(column, typ)

    @property
    def is_time(self) -> bool:
        """Whether the column holds timestamps (ticks are nanoseconds)."""
        return bool(pa.types.is_timestamp(self.type))

    @property
    def is_float(self) -> bool:
        """Whether ticks are float64."""
        return bool(pa.types.is_floating(self.type))

    def ticks(self, values: pa.Array | pa.ChunkedArray) -> npt.NDArray[Any]:
        """The column's values as ticks (no nulls: the caller checked)."""
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        if self.is_time:  # (UTC either way: Arrow keeps a zoned timestamp in UTC)
            values = values.cast(pa.timestamp("ns")).cast(pa.int64())
        elif self.is_float:
            values = values.cast(pa.float64())
        else:
            values = values.cast(pa.int64())
        return np.asarray(values)

    def column_of(self, ticks: npt.NDArray[Any]) -> pa.Array:
        """Ticks back as values of the column's type."""
        if self.is_time:
            return pa.array(ticks, pa.timestamp("ns")).cast(self.type)
        return pa.array(ticks).cast(self.type)

    def span(self, argument: str, value: Duration) -> int | float:
        """A duration in ticks (nanoseconds for a timestamp column).

        Raises:
            InvalidArgumentError: a timedelta on a numeric column, or a number that is not an
                int on an integer column.
        """
        if self.is_time:
            if isinstance(value, timedelta):
                return (value // timedelta(microseconds=1)) * 1000
            return round(float(value) * 1e9)
        if isinstance(value, timedelta):
            raise InvalidArgumentError(
                argument,
                f"a number (in the unit of the numeric column {self.column!r})",
                value,
            )
        if self.is_float:
            return float(value)
        if not isinstance(value, int | np.integer):
            raise InvalidArgumentError(
                argument, f"an int (the integer column {self.column!r})", value
            )
        return int(value)

    def check_watermark(self, is_time: bool, value: Any) -> None:
        """Refuse a watermark of another kind than the column (see :func:`watermark_ticks`).

        Raises:
            InvalidArgumentError: a number on a timestamp column, a time on a numeric one.
        """
        if is_time != self.is_time:
            raise InvalidArgumentError(
                f"Watermark({self.column!r}).value",
                "a numpy.datetime64 or datetime (a timestamp column)"
                if self.is_time
                else "a number (a numeric column)",
                value,
            )

    def watermark_value(self, ticks: int | float) -> Any:
        """The value of a watermark at ``ticks``: a ``numpy.datetime64`` in nanoseconds for a
        timestamp column, an int or a float for a numeric one."""
        if self.is_time:
            return np.datetime64(int(ticks), "ns")
        return float(ticks) if self.is_float else int(ticks)

    def unit_ticks(self) -> int:
        """Ticks in one unit of the column (nanoseconds of a timestamp unit; 1 otherwise)."""
        return _NS_PER_UNIT[self.type.unit] if self.is_time else 1


def watermark_ticks(column: str, value: Any) -> tuple[int | float, bool]:
    """A watermark's value in ticks, and whether it is a time (see the module) — known from
    the value alone, so a watermark is kept (and checkpointed) before its column is seen.

    Raises:
        InvalidArgumentError: neither a time nor a number.
    """
    if isinstance(value, np.datetime64):
        return int(value.astype("datetime64[ns]").astype(np.int64)), True
    if isinstance(value, datetime):
        # Integer arithmetic: a float of nanoseconds since 1970 is not exact.
        since = value.replace(tzinfo=None) - (value.utcoffset() or timedelta(0)) - _EPOCH
        return since // _MICROSECOND * 1000, True
    if is_real(value):
        return (float(value) if isinstance(value, float | np.floating) else int(value)), False
    raise InvalidArgumentError(
        f"Watermark({column!r}).value", "a numpy.datetime64, a datetime or a number", value
    )


@final
@dataclass(frozen=True, slots=True)
class Assigner:
    """Windows of ``size`` ticks starting every ``every`` ticks, assigned to rows vectorized."""

    size: int | float
    every: int | float

    @property
    def count(self) -> int:
        """Windows each row falls in."""
        return round(self.size / self.every)

    def last_start(self, ticks: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """The start of each row's last window (the latest start at or before the row)."""
        # np.mod floors (a negative tick's window starts before it), for ints and floats alike.
        return np.asarray(ticks - np.mod(ticks, self.every))

    def assign(self, ticks: npt.NDArray[Any]) -> tuple[npt.NDArray[np.int64], npt.NDArray[Any]]:
        """Each row's windows: ``(rows, starts)``, a row's windows together, earliest first —
        one ``repeat``, no loop per row."""
        n = self.count
        last = self.last_start(ticks)
        rows = np.repeat(np.arange(len(ticks)), n)
        if n == 1:
            return rows, last
        back = np.tile(np.arange(n - 1, -1, -1), len(ticks)) * self.every
        return rows, np.repeat(last, n) - back


@final
@dataclass(frozen=True, slots=True)
class Tumbling:
    """Windows of ``size`` one after the other: ``[k·size, (k+1)·size)``, each row in one.

    Args:
        size: a positive timedelta or number (seconds on a timestamp column, the column's unit
            on a numeric one).

    Raises:
        InvalidArgumentError: ``size`` is not a positive timedelta or number.
    """

    size: Duration

    def __post_init__(self) -> None:
        check_positive("size", self.size)

    def assigner(self, time: EventTime) -> Assigner:
        """The windows in ``time``'s ticks.

        Raises:
            InvalidArgumentError: ``size`` does not fit the column (see :meth:`EventTime.span`),
                or is not a whole, positive number of a timestamp column's unit.
        """
        size = _step(time, "Tumbling.size", self.size)
        return Assigner(size, size)


@final
@dataclass(frozen=True, slots=True)
class Sliding:
    """Windows of ``size`` starting every ``every``: ``[k·every, k·every + size)``; a row falls
    in ``size / every`` of them (hopping windows).

    Args:
        size: a positive timedelta or number (as :class:`Tumbling`).
        every: the step, the same way; ``size`` must be a whole multiple of it.

    Raises:
        InvalidArgumentError: either is not a positive timedelta or number, or ``size`` is not
            a whole multiple of ``every`` (the error's argument is ``Sliding(size, every)``: the
            pair is wrong).
    """

    size: Duration
    every: Duration

    def __post_init__(self) -> None:
        check_positive("size", self.size)
        check_positive("every", self.every)
        ratio = _seconds(self.size) / _seconds(self.every)
        if not math.isfinite(ratio) or ratio < 1 or abs(ratio - round(ratio)) > 1e-9:
            raise InvalidArgumentError(
                "Sliding(size, every)", "a size that is a whole multiple of every", self
            )

    def assigner(self, time: EventTime) -> Assigner:
        """The windows in ``time``'s ticks.

        Raises:
            InvalidArgumentError: as :meth:`Tumbling.assigner`, or ``size`` in ticks is not a
                whole multiple of ``every`` in ticks.
        """
        size = _step(time, "Sliding.size", self.size)
        every = _step(time, "Sliding.every", self.every)
        # Floats were checked when made (in seconds or units, with a tolerance); integer ticks
        # (nanoseconds of a number of seconds, an integer column) must divide exactly.
        if not time.is_float and size % every:
            raise InvalidArgumentError(
                "Sliding(size, every)",
                f"a size that is a whole multiple of every in {time.column!r}'s ticks",
                f"{size} and {every} ticks",
            )
        return Assigner(size, every)


#: A window spec.
Window = Tumbling | Sliding


def _step(time: EventTime, argument: str, value: Duration) -> int | float:
    """A window's size or step in ticks. A positive number stays positive on a numeric
    column; on a timestamp column it must also be a whole number of the column's unit (and
    not round to nothing)."""
    ticks = time.span(argument, value)
    if time.is_time and (ticks <= 0 or ticks % time.unit_ticks()):
        raise InvalidArgumentError(
            argument,
            f"a whole, positive number of {time.type.unit} (the column {time.column!r} is "
            f"{time.type})",
            value,
        )
    return ticks
