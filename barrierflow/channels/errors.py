"""The root of barrierflow's errors and the errors of the channel layer: bad input, closed
or broken channels, protocol violations between peers.

Every public name is re-exported from :mod:`barrierflow.errors`.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, final

import anyio

__all__ = [
    "BarrierflowError",
    "InvalidArgumentError",
    "ConfigError",
    "SchemaMismatchError",
    "EpochOrderError",
    "VnodeOwnershipError",
    "ChannelClosedError",
    "ChannelBrokenError",
    "ProtocolError",
    "BarrierMisalignedError",
    "DroppedOutputRowsError",
    "WatermarkTypeMismatchError",
    "UnknownInputError",
    "RemovedNameError",
]


def short_vnodes(vnodes: Iterable[int], limit: int = 16) -> str:
    """Render a sorted list of vnodes, eliding the middle of a long one."""
    items = sorted(vnodes)
    if len(items) <= limit:
        return str(items)
    head = ", ".join(str(v) for v in items[: limit // 2])
    tail = ", ".join(str(v) for v in items[-limit // 2 :])
    return f"[{head}, ... ({len(items) - limit} more) ..., {tail}]"


class BarrierflowError(Exception):
    """Root of every error barrierflow raises.

    Every one pickles: its fields and message travel as they are, without calling its
    constructor again (whose arguments are fields, not the message). An error raised in a
    Spark task reaches the driver this way, typed.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuilt, (type(self), self.args, dict(self.__dict__)))


def _rebuilt(
    cls: type[BarrierflowError], args: tuple[Any, ...], fields: dict[str, Any]
) -> BarrierflowError:
    """An error of ``cls`` with ``args`` and ``fields``, its constructor not called (see
    :meth:`BarrierflowError.__reduce__`)."""
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(fields)
    return error


class InvalidArgumentError(BarrierflowError, ValueError):
    """A public function or constructor was given a value it cannot accept.

    Attributes:
        argument: the name of the offending argument (``"max_messages"``, ``"ops"``).
        expected: what would have been accepted, in words.
        got: what arrived.
    """

    def __init__(self, argument: str, expected: str, got: Any) -> None:
        self.argument = argument
        self.expected = expected
        self.got = got
        super().__init__(f"{argument}: expected {expected}, got {got!r}")


@final
class ConfigError(InvalidArgumentError):
    """A configuration value is out of range (a capacity ≤ 0, an interval ≤ 0, ...)."""


@final
class SchemaMismatchError(InvalidArgumentError):
    """Data arrived whose schema differs from the one the receiver was built for, or whose
    column holds nulls where the receiver's schema declares the field not nullable.

    Attributes:
        expected_schema: the schema the receiver requires.
        actual_schema: the schema that arrived.
        null_field: the non-nullable field of ``expected_schema`` whose column holds nulls
            (names and types then match), or ``None`` when names or types differ.
        fix: how to fix it, in words, when the raiser knows (a cast for a difference of time
            zone or integer width), else ``""``; the message ends with it.

    The message renders each schema on one line (``(user: int64, clicks: int64)``) so that the
    whole error reads on one line, where Arrow prints a schema one field per line.
    """

    def __init__(
        self,
        argument: str,
        expected_schema: Any,
        actual_schema: Any,
        *,
        null_field: str | None = None,
        fix: str = "",
    ) -> None:
        self.expected_schema = expected_schema
        self.actual_schema = actual_schema
        self.null_field = null_field
        self.fix = fix
        super().__init__(argument, f"schema ({_one_line(expected_schema)})", actual_schema)
        # ``got`` stays the schema itself; only the message uses the one-line rendering.
        nulls = (
            ""
            if null_field is None
            else f" whose column {null_field!r} holds nulls (expected none: the field is not null)"
        )
        self.args = (
            f"{argument}: expected schema ({_one_line(expected_schema)}), "
            f"got schema ({_one_line(actual_schema)}){nulls}" + (f"; to fix: {fix}" if fix else ""),
        )


def _one_line(schema: Any) -> str:
    """A schema as ``name: type, ...`` (fields of a ``pyarrow.Schema``, or any text with its
    line breaks folded) — one line, whatever Arrow's own rendering."""
    names, types = getattr(schema, "names", None), getattr(schema, "types", None)
    if isinstance(names, list) and isinstance(types, list) and len(names) == len(types):
        nullable = [getattr(schema.field(i), "nullable", True) for i in range(len(names))]
        fields = ", ".join(
            f"{name}: {typ}{'' if ok else ' not null'}"
            for name, typ, ok in zip(names, types, nullable, strict=True)
        )
        return fields or "(no columns)"
    return ", ".join(line.strip() for line in str(schema).splitlines() if line.strip())


@final
class EpochOrderError(InvalidArgumentError):
    """Epochs that must strictly increase did not.

    Attributes:
        previous: the epoch that came first.
        current: the epoch that should have been greater.
    """

    def __init__(self, argument: str, previous: int, current: int) -> None:
        self.previous = previous
        self.current = current
        super().__init__(argument, f"an epoch greater than {previous}", current)


@final
class VnodeOwnershipError(InvalidArgumentError):
    """Vnode bitmaps of a set of owners do not cover every vnode exactly once.

    Attributes:
        overlapping: vnodes owned by more than one owner.
        missing: vnodes owned by nobody.
    """

    def __init__(self, argument: str, overlapping: Iterable[int], missing: Iterable[int]) -> None:
        self.overlapping = frozenset(overlapping)
        self.missing = frozenset(missing)
        problems = []
        if self.overlapping:
            problems.append(f"vnodes owned twice {short_vnodes(self.overlapping)}")
        if self.missing:
            problems.append(f"vnodes owned by nobody {short_vnodes(self.missing)}")
        super().__init__(
            argument, "bitmaps that cover every vnode exactly once", "; ".join(problems)
        )


class ChannelClosedError(BarrierflowError, anyio.ClosedResourceError):
    """This end of the channel was closed by its owner and then used again."""

    def __init__(self, channel: str, end: str) -> None:
        self.channel = channel
        self.end = end
        super().__init__(f"channel {channel!r}: this {end} end was closed and cannot be used")


class ChannelBrokenError(BarrierflowError, anyio.BrokenResourceError):
    """The other end of the channel went away, so this operation can never complete."""

    def __init__(self, channel: str, reason: str) -> None:
        self.channel = channel
        self.reason = reason
        super().__init__(f"channel {channel!r}: {reason}")


class ProtocolError(BarrierflowError):
    """A peer broke the stream protocol (barrier order, vnode coverage, ...)."""


@final
class BarrierMisalignedError(ProtocolError):
    """Two inputs of an aligned merge delivered barriers of different epochs.

    Attributes:
        first_input, first_epoch: the input that set the epoch being aligned, and that epoch.
        other_input, other_epoch: the input that disagreed, and its epoch.
    """

    def __init__(
        self, first_input: str, first_epoch: int, other_input: str, other_epoch: int
    ) -> None:
        self.first_input = first_input
        self.first_epoch = first_epoch
        self.other_input = other_input
        self.other_epoch = other_epoch
        super().__init__(
            f"input {other_input!r}: expected barrier for epoch {first_epoch} "
            f"(as delivered by input {first_input!r}), got epoch {other_epoch}"
        )


@final
class DroppedOutputRowsError(ProtocolError):
    """A hash dispatcher routed rows to an output that was dropped: the vnodes of that output
    were not handed to another one first, so its rows would be lost.

    Attributes:
        output: the index of the dropped output.
        rows: how many rows of the chunk were routed to it.
    """

    def __init__(self, output: int, rows: int) -> None:
        self.output = output
        self.rows = rows
        super().__init__(
            f"hash dispatch: expected no rows for dropped output {output}, got {rows} "
            "(give it an empty bitmap before dropping it)"
        )


@final
class WatermarkTypeMismatchError(ProtocolError):
    """The inputs of a merge sent watermarks of one column whose values cannot be compared
    (an ``int`` on one input, a ``str`` on another): the merge cannot tell which is lowest.

    Attributes:
        column: the watermark column.
        input_types: the type name of the latest watermark value of each live input.
        emitted_type: the type name of the watermark the merge already emitted for the
            column, or ``None`` if it emitted none yet.
    """

    def __init__(
        self, column: str, input_types: Mapping[str, str], emitted_type: str | None
    ) -> None:
        self.column = column
        self.input_types = dict(input_types)
        self.emitted_type = emitted_type
        emitted = "" if emitted_type is None else f" (already emitted: {emitted_type})"
        super().__init__(
            f"watermarks of column {column!r}: expected values of one orderable type on every "
            f"input, got {self.input_types}{emitted}"
        )


@final
class UnknownInputError(InvalidArgumentError, KeyError):
    """An actor asked for a named input it does not have.

    Attributes:
        name: the name asked for.
        known: the actor's input names.
    """

    def __init__(self, name: object, known: list[str]) -> None:
        super().__init__("input", f"one of the named inputs {known}", name)
        self.name = name
        self.known = list(known)

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


# Removed public names. The error, the entries and the lookup live in the bottom layer so that
# every package can name what replaced its removed names, this one included (a root helper
# imports this module, so the channel layer cannot import one that does); the table of every
# package's removed names is ``barrierflow._removed``.


@final
class RemovedNameError(BarrierflowError, ImportError):
    """A public name that was removed was looked up.

    An ``ImportError``, so that ``from module import Name`` shows this message (an
    ``AttributeError`` raised by a module's ``__getattr__`` would be replaced by Python's
    ``cannot import name``), and code guarding an import the usual way still catches it.

    Attributes:
        module: the module the name was looked up in (``"barrierflow.connectors"``).
        removed: the name (``"ParquetFileSink"``).
        version: the release that removed it (``"0.1.0"``).
        replacement: what to use instead, as the message says it.
    """

    def __init__(self, module: str, removed: str, version: str, replacement: str) -> None:
        self.module = module
        self.removed = removed
        self.version = version
        self.replacement = replacement
        super().__init__(
            f"{module}.{removed} was removed in {version}; use {replacement} (see CHANGELOG.md)",
            name=module,
        )


@dataclass(frozen=True, slots=True)
class Removed:
    """A removed name's release and replacement (one entry of a module's table)."""

    #: The release that removed it.
    version: str
    #: What to use instead, in words a reader can act on: a name and where to import it from,
    #: or what to do when nothing replaces it.
    replacement: str


@dataclass(frozen=True, slots=True)
class Deprecated:
    """A renamed public name, still served for one release under its old name with a
    ``DeprecationWarning`` naming the new one."""

    #: The release that renamed it.
    version: str
    #: Its new name, in the same module.
    new: str


def removed_name_lookup(
    module: str, removed: Mapping[str, Removed], renamed: Mapping[str, Deprecated]
) -> Callable[[str], Any]:
    """The module-level ``__getattr__`` of ``module``, which no longer exports the names of
    ``removed``, and serves those of ``renamed`` under their old names (PEP 562: Python calls
    it only for a name the module does not have).

    Returns:
        A function Python calls only for a name the module does not have: it returns a
        deprecated name's new object with a ``DeprecationWarning``, raises
        :class:`RemovedNameError` for a removed name, and ``AttributeError`` for any other
        (as a module without ``__getattr__`` would).
    """

    def lookup(name: str) -> Any:
        old = renamed.get(name)
        if old is not None:
            warnings.warn(
                f"{module}.{name} is deprecated since {old.version}: use {module}.{old.new} "
                "(the old name goes in the next release)",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(sys.modules[module], old.new)
        entry = removed.get(name)
        if entry is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        raise RemovedNameError(module, name, entry.version, entry.replacement)

    return lookup


_V020 = "0.2.0"
_OWN = " (the name itself is the library's own now)"

#: The names :mod:`barrierflow.channels` exported before 0.2.0 and no longer does (its
#: ``__getattr__`` names what replaced them; ``barrierflow._removed.REMOVED`` includes them).
CHANNELS_REMOVED: Mapping[str, Removed] = {
    "AlignedMerge": Removed(_V020, "barrierflow.channels.merge_aligned, which returns one" + _OWN),
    "COOPERATIVE_BUDGET": Removed(
        _V020, "barrierflow.channels.create_channel, whose channels keep that budget" + _OWN
    ),
    "DEFAULT_VNODE_COUNT": Removed(
        _V020, "barrierflow.channels.VnodeBitmap.full(), whose default size it is" + _OWN
    ),
    **{
        name: Removed(
            _V020,
            "barrierflow.channels.epoch_from_unix_ms and barrierflow.channels.physical_time_ms, "
            "which convert between epochs and times" + _OWN,
        )
        for name in ("EPOCH_BASE_UNIX_MS", "EPOCH_PHYSICAL_SHIFT")
    },
    "Receiver": Removed(_V020, "barrierflow.channels.ReceiveChannel"),
    "Sender": Removed(_V020, "barrierflow.channels.SendChannel"),
    "vnode_owners": Removed(
        _V020, "barrierflow.channels.VnodeBitmap, which says which vnodes it holds" + _OWN
    ),
}
