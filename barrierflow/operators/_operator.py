"""What every operator shares: its declaration (:class:`Operator`, a factory the runtime calls
at every (re)start, that says what its actors need) and its actors' counters, reported in the
runtime's metrics registry.

An :class:`Operator` is what ``map_batches(...)``, ``aggregate(...)`` and the others return,
and what ``Runtime.add_actor`` takes as a factory: the runtime reads its
:attr:`~Operator.placement` and :attr:`~Operator.key` when the actor is declared (round-robin
dispatch for a partition-local operator run in parallel, hash dispatch by the key for a keyed
one; see :mod:`barrierflow.runtime.placement`), and calls it for a fresh actor at every start —
an operator holds only its arguments, never state, so a restart begins from the checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeGuard, final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.channels.chunk import Op
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.operators.errors import ChangelogInputError
from barrierflow.runtime.actor import ActorContext, StreamActor
from barrierflow.runtime.metrics import MetricFamily, counter, gauge
from barrierflow.runtime.placement import Placement

__all__ = [
    "Operator",
    "OperatorActor",
    "OperatorStats",
    "as_number",
    "check_columns",
    "is_real",
    "refuse_changes",
]


@final
@dataclass(frozen=True, slots=True)
class Operator:
    """An operator's declaration: calling it makes a fresh actor (see the module).

    Attributes:
        kind: the operator's name (``"map_batches"``, ``"async_map"``, ...), its metrics'
            ``operator`` label.
        placement: what its actors need of their rows.
        make: builds one actor.
        key: the key columns of a keyed operator (rows of one key reach one actor).
        side_outputs: outputs besides the main one its actors emit to (``"late"``,
            ``"dead_letters"``), read downstream as ``"<actor>:<output>"``.
    """

    kind: str
    placement: Placement
    make: Callable[[], StreamActor] = field(repr=False)
    key: tuple[str, ...] | None = None
    side_outputs: tuple[str, ...] = ()

    def __call__(self, index: int | None = None) -> StreamActor:
        """A fresh actor (``index``: its place in a parallel group; every instance is alike)."""
        return self.make()


@dataclass(slots=True)
class OperatorStats:
    """An operator actor's counters (each a metric family, labelled by actor and operator)."""

    #: Rows read (visible rows of the chunks it was given).
    rows_in: int = 0
    #: Rows emitted on its main output.
    rows_out: int = 0
    #: Calls to an outside service in flight now (``async_map``).
    calls_in_flight: int = 0
    #: Calls retried after a failure or a timeout.
    call_retries: int = 0
    #: Calls that timed out.
    call_timeouts: int = 0
    #: Rows sent to the dead-letter output.
    dead_letters: int = 0
    #: Rows that came after their window closed: within the allowed lateness they update it,
    #: beyond it they are dropped or sent to the late output (``late_rows_dropped`` counts
    #: those).
    late_rows: int = 0
    late_rows_dropped: int = 0
    #: Rows of state the actor holds now (keys of an aggregate, open windows).
    state_rows: int = 0


#: Metric help, and which counters are gauges (the rest only grow).
_HELP = {
    "rows_in": "rows an operator read",
    "rows_out": "rows an operator emitted on its main output",
    "calls_in_flight": "calls of an async_map in flight",
    "call_retries": "calls of an async_map retried",
    "call_timeouts": "calls of an async_map that timed out",
    "dead_letters": "rows an operator sent to its dead-letter output",
    "late_rows": "rows that reached a window after it closed",
    "late_rows_dropped": "late rows beyond the allowed lateness (dropped or sent aside)",
    "state_rows": "rows of state an operator holds",
}
_GAUGES = frozenset({"calls_in_flight", "state_rows"})


class OperatorActor(StreamActor):
    """The base of the operators' actors: keeps :class:`OperatorStats` and reports them as
    metrics of the runtime (``barrierflow_operator_<counter>{actor, operator}``)."""

    #: The operator's kind, the ``operator`` label of its metrics.
    kind: ClassVar[str] = "operator"

    def __init__(self) -> None:
        self.stats = OperatorStats()
        self._actor = ""

    def started(self, ctx: ActorContext) -> None:
        """Note the actor's name for its metrics (an actor that overrides :meth:`run` calls it
        first)."""
        self._actor = ctx.name

    async def run(self, ctx: ActorContext) -> None:
        """Note the actor's name for its metrics, then run as any stream actor."""
        self.started(ctx)
        await super().run(ctx)

    def metric_families(self) -> Iterable[MetricFamily]:
        """The counters, labelled by actor and operator (read when metrics are collected)."""
        labels = {"actor": self._actor, "operator": self.kind}
        for item in fields(self.stats):
            name = item.name
            value: Any = getattr(self.stats, name)
            make = gauge if name in _GAUGES else counter
            yield make(f"barrierflow_operator_{name}", _HELP[name], [(labels, float(value))])


def check_columns(argument: str, columns: object, *, allow_empty: bool = False) -> tuple[str, ...]:
    """``columns`` as a tuple of column names: one name, or a list or tuple of names.

    Raises:
        InvalidArgumentError: anything else (or no names, unless ``allow_empty``).
    """
    names = (columns,) if isinstance(columns, str) else columns
    if (
        not isinstance(names, list | tuple)
        or not all(isinstance(c, str) and c for c in names)
        or (not names and not allow_empty)
    ):
        raise InvalidArgumentError(argument, "a column name or a list of column names", columns)
    if len(set(names)) != len(names):
        raise InvalidArgumentError(argument, "each column once", list(names))
    return tuple(names)


def is_real(value: object) -> TypeGuard[int | float | np.integer[Any] | np.floating[Any]]:
    """Whether ``value`` is a real number's type: an int or a float, NumPy's too, not a bool."""
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(
        value, bool | np.bool_
    )


def as_number(value: object) -> float | None:
    """``value`` as a float if it is a real number (:func:`is_real`) a float holds — the
    infinities are numbers, NaN is not — else ``None`` (an int too large for a float, too:
    every operator's argument checks refuse it alike)."""
    if not is_real(value):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return None if number != number else number


def refuse_changes(ops: pa.Array | None, actor: str, operator: str, expected: str) -> None:
    """Refuse rows whose ``ops`` (a chunk's op codes, ``None``: all inserts) hold a delete or
    an update half — for an operator that keeps no changelog correct under retractions.

    Raises:
        ChangelogInputError: naming ``actor``, ``operator``, what it takes (``expected``) and
            how many such rows came.
    """
    changes = 0 if ops is None else int(pc.sum(pc.not_equal(ops, Op.INSERT)).as_py() or 0)
    if changes:
        raise ChangelogInputError(
            actor, operator, expected, f"a chunk with {changes} delete(s) or update(s)"
        )
