"""The commit protocol of a coordinated sink: **writers stage, a coordinator commits.**

::

    writer 0 ─ stage ─► Manifest ─┐
    writer 1 ─ stage ─► Manifest ─┼─► Coordinator ─ prepare ─► meta store (pending)
    (any process: a Spark task)   ┘        │          once the checkpoint is durable
                                           └──────── commit ─► Table (one atomic commit,
                                                               with the source positions)

A sink is a **table** (:class:`Table`): ``table.writer(writer_id)`` gives each parallel writer
its :class:`StagingWriter`, which stages rows and never makes anything visible, and
``table.committer()`` gives the one :class:`Committer` the sink's coordinator drives. A
single writer is a table written by one writer (the coordinator runs for it too); an
at-least-once sink (print) is a table whose writer shows rows as they come and whose
committer has nothing to do.

* A writer describes what it staged for an epoch in a :class:`Manifest`: small,
  JSON-serializable and self-describing (writer id, the epoch it staged, the vnodes it covers,
  its files with row counts, sizes and per-column statistics, the source positions its rows
  reach, an optional schema change). The statistics are the writer's (it knows them as it
  writes), so a committer reads no file to learn them. Anything that can produce one is a
  writer — an actor of this process, or a task on another machine — because the manifest
  crosses to the coordinator as JSON (:meth:`Manifest.to_json` / :meth:`Manifest.from_json`).
* The coordinator (:mod:`barrierflow.actors.sinks.coordinator`) waits for every vnode's
  manifest of an epoch, asks the committer to :meth:`~Committer.prepare` one commit from them,
  records the result in the meta store as *pending* before acknowledging the writers, and
  calls :meth:`~Committer.commit` once the runtime's checkpoint holding the epoch is durable.
* The committer's :meth:`~Committer.commit` is idempotent through the table's **own committed
  marker** (a manifest file's epoch, an Iceberg snapshot property, a Delta application
  transaction) and records the source positions in the same atomic commit, so the table is the
  source of truth for which input it holds.

One epoch's fate lives in two places: the meta store's record (pending, committed, aborted)
and the table's committed marker. Everything else (the coordinator's queue, the writers'
staged files) is derived from them or garbage that recovery deletes.

What a table must implement: :class:`Table` (``schema``, ``writer(id)``, ``committer()``),
its :class:`StagingWriter` and its :class:`Committer`. What it may implement besides, each a
small protocol the runtime checks with ``isinstance`` (never by probing for attributes):

* :class:`HoldsCommits` (the committer): what the table holds — its committed epoch and the
  source positions recorded with it — read on an empty state store and by
  ``RuntimeConfig(adopt_sink_positions=True)``. Without it, a lost store cannot be adopted.
* :class:`CommitTimings` (the committer): how long its latest commits took (benchmarks and
  diagnostics).
* :class:`PathChecked` (the writer): a local path checked before the graph starts.
* :class:`TakesChanges` (the writer): a table keyed for upserts applies a changelog (chunks
  with delete and update ops); without it, the sink writer refuses such chunks.
* :class:`~barrierflow.connectors.executor_staging.StagesOnExecutors` (the writer): tells
  Spark tasks how to stage as it does, so the table can be written on executors (declared
  with the type it returns, in :mod:`barrierflow.connectors`).

The file tables of :mod:`barrierflow.connectors` share one base for all of it
(``connectors/_file_table.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, final, runtime_checkable

import numpy as np
import pyarrow as pa

from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.runtime.positions import check_positions, merge_positions

__all__ = [
    "AlreadyCommitted",
    "Bound",
    "ColumnStats",
    "CommitMetadata",
    "CommitOutcome",
    "CommitTimings",
    "Committed",
    "Committer",
    "Failed",
    "HoldsCommits",
    "Manifest",
    "PathChecked",
    "RetryLater",
    "SchemaChange",
    "SinkCommits",
    "StagedFile",
    "StagingWriter",
    "Table",
    "TakesChanges",
    "last_change_per_key",
    "manifests_positions",
]

#: What a committer's ``prepare`` returns: JSON-serializable facts needed to commit an epoch
#: (file paths, row counts, positions). The meta store keeps it until the commit, so keep it
#: small.
CommitMetadata = Mapping[str, Any]

#: A schema change a manifest may carry (JSON-serializable, compared for equality), such as
#: ``{"add_columns": [{"name": "note", "type": "string"}]}``.
SchemaChange = Mapping[str, Any]


def _count(argument: str, value: Any) -> int:
    if type(value) is not int or value < 0:
        raise InvalidArgumentError(argument, "a non-negative int", value)
    return value


#: A bound a file's statistics carry: a JSON scalar (columns of other types keep only their
#: null count).
Bound = int | float | str | bool


def _bound(argument: str, value: Any) -> Bound | None:
    if value is None or type(value) in (int, str, bool):
        return value  # type: ignore[no-any-return]
    if type(value) is float and math.isfinite(value):
        return value
    raise InvalidArgumentError(
        argument, "None or a JSON scalar (int, finite float, str, bool)", value
    )


@final
@dataclass(frozen=True, slots=True)
class ColumnStats:
    """One column's statistics in one staged file, as its writer knew them (from the Parquet
    footer it wrote): what Iceberg's manifests and Delta's ``add`` actions keep so that
    readers skip files, carried to the committer so that it reads no footer.

    Attributes:
        nulls: the column's null values in the file.
        min, max: its least and greatest non-null value (``None``: unknown, every value is
            null, or the column's type has no JSON form, such as a timestamp).

    Raises:
        InvalidArgumentError: a negative count, a bound that is not a JSON scalar, or only
            one of the two bounds.
    """

    nulls: int
    min: Bound | None = None
    max: Bound | None = None

    def __post_init__(self) -> None:
        _count("nulls", self.nulls)
        _bound("min", self.min)
        _bound("max", self.max)
        if (self.min is None) != (self.max is None):
            missing = "min" if self.min is None else "max"
            raise InvalidArgumentError(missing, "both bounds or neither", (self.min, self.max))

    def to_json(self) -> dict[str, Any]:
        """The statistics as plain JSON values."""
        value: dict[str, Any] = {"nulls": self.nulls}
        if self.min is not None:
            value["min"], value["max"] = self.min, self.max
        return value

    @classmethod
    def from_json(cls, value: Any) -> ColumnStats:
        """Read statistics made by :meth:`to_json`.

        Raises:
            InvalidArgumentError: ``value`` is not such statistics.
        """
        if not isinstance(value, Mapping) or "nulls" not in value:
            raise InvalidArgumentError("stats", "a JSON object {nulls, min?, max?}", value)
        return cls(value["nulls"], value.get("min"), value.get("max"))


@final
@dataclass(frozen=True, slots=True)
class StagedFile:
    """One file a writer staged.

    Attributes:
        path: where it is, relative to the table's root (a staging path, not visible yet).
        rows: the rows it holds.
        size: its size in bytes.
        columns: per-column statistics (column name → :class:`ColumnStats`), as the writer
            knew them; empty when unknown (a writer that keeps none, an older manifest).
    """

    path: str
    rows: int
    size: int
    columns: Mapping[str, ColumnStats] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path:
            raise InvalidArgumentError("path", "a non-empty path relative to the table", self.path)
        _count("rows", self.rows)
        _count("size", self.size)
        if not isinstance(self.columns, Mapping) or not all(
            isinstance(k, str) and isinstance(v, ColumnStats) for k, v in self.columns.items()
        ):
            raise InvalidArgumentError(
                "columns", "a mapping of column names to ColumnStats", self.columns
            )

    def to_json(self) -> dict[str, Any]:
        """The file as plain JSON values (``columns`` only when known)."""
        value: dict[str, Any] = {"path": self.path, "rows": self.rows, "size": self.size}
        if self.columns:
            value["columns"] = {name: c.to_json() for name, c in self.columns.items()}
        return value

    @classmethod
    def from_json(cls, value: Any) -> StagedFile:
        """Read a file made by :meth:`to_json` (one without ``columns`` too: an older
        manifest).

        Raises:
            InvalidArgumentError: ``value`` is not such a file.
        """
        try:
            columns = {
                name: ColumnStats.from_json(stats)
                for name, stats in (value.get("columns") or {}).items()
            }
            return cls(value["path"], value["rows"], value["size"], columns)
        except (KeyError, TypeError, AttributeError) as exc:
            raise InvalidArgumentError(
                "file", "a JSON object {path, rows, size, columns?}", value
            ) from exc


@final
@dataclass(frozen=True, slots=True)
class Manifest:
    """What one writer staged for one epoch: everything a committer needs, nothing visible.

    Attributes:
        writer: the writer's id (unique within the sink).
        epoch: the epoch the writer staged its rows under (its sink epoch, the ``curr`` epoch
            of the barrier that opened it).
        files: the staged files, in the order written.
        vnodes: the vnodes the writer's rows cover, as ``(first, end)`` runs (``end``
            excluded); empty when unknown (a writer outside the runtime's vnode ownership).
        positions: the source positions its rows reach (position key → last batch id).
        positions_from: the positions its epoch started after.
        schema_change: a schema change the epoch carries, or ``None``.
        state: the state deltas a keyed operator's Spark task staged beside the files, as
            JSON objects (:mod:`barrierflow.connectors.state_commit` makes and commits them;
            opaque here): the table's committer makes them visible with the files.

    Raises:
        InvalidArgumentError: a field of the wrong type or a negative count.
    """

    writer: str
    epoch: int
    files: tuple[StagedFile, ...] = ()
    vnodes: tuple[tuple[int, int], ...] = ()
    positions: Mapping[str, int] = field(default_factory=dict)
    positions_from: Mapping[str, int] = field(default_factory=dict)
    schema_change: SchemaChange | None = None
    state: tuple[Mapping[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.writer, str) or not self.writer:
            raise InvalidArgumentError("writer", "a non-empty writer id", self.writer)
        _count("epoch", self.epoch)
        if not isinstance(self.files, tuple) or not all(
            isinstance(f, StagedFile) for f in self.files
        ):
            raise InvalidArgumentError("files", "a tuple of StagedFile", self.files)
        if not isinstance(self.vnodes, tuple) or not all(
            isinstance(run, tuple)
            and len(run) == 2
            and all(type(v) is int and v >= 0 for v in run)
            and run[0] < run[1]
            for run in self.vnodes
        ):
            raise InvalidArgumentError(
                "vnodes", "a tuple of (first, end) runs with 0 <= first < end", self.vnodes
            )
        object.__setattr__(self, "positions", check_positions("positions", self.positions))
        object.__setattr__(
            self, "positions_from", check_positions("positions_from", self.positions_from)
        )
        if self.schema_change is not None and not isinstance(self.schema_change, Mapping):
            raise InvalidArgumentError("schema_change", "None or a mapping", self.schema_change)
        if not isinstance(self.state, tuple) or not all(isinstance(s, Mapping) for s in self.state):
            raise InvalidArgumentError("state", "a tuple of JSON objects", self.state)

    @property
    def rows(self) -> int:
        """The rows of every staged file."""
        return sum(f.rows for f in self.files)

    def to_json(self) -> dict[str, Any]:
        """The manifest as plain JSON values (what crosses a process boundary)."""
        return {
            "writer": self.writer,
            "epoch": self.epoch,
            "files": [f.to_json() for f in self.files],
            "vnodes": [list(run) for run in self.vnodes],
            "positions": dict(self.positions),
            "positions_from": dict(self.positions_from),
            "schema_change": None if self.schema_change is None else dict(self.schema_change),
            "state": [dict(s) for s in self.state],
        }

    @classmethod
    def from_json(cls, value: Any) -> Manifest:
        """Read a manifest made by :meth:`to_json` (in this process or another).

        Raises:
            InvalidArgumentError: ``value`` is not such a manifest, naming what is wrong.
        """
        if not isinstance(value, Mapping):
            raise InvalidArgumentError("manifest", "a JSON object made by Manifest.to_json", value)
        unknown = sorted(set(value) - set(cls.__dataclass_fields__))
        if unknown or "writer" not in value or "epoch" not in value:
            raise InvalidArgumentError(
                "manifest",
                f"the keys {sorted(cls.__dataclass_fields__)} (writer and epoch required)",
                sorted(value),
            )
        try:
            files = tuple(StagedFile.from_json(f) for f in value.get("files", ()))
            vnodes = tuple((run[0], run[1]) for run in value.get("vnodes", ()))
        except (KeyError, TypeError, IndexError) as exc:
            raise InvalidArgumentError(
                "manifest", "files of {path, rows, size} and vnodes of [first, end]", value
            ) from exc
        return cls(
            value["writer"],
            value["epoch"],
            files,
            vnodes,
            value.get("positions") or {},
            value.get("positions_from") or {},
            value.get("schema_change"),
            tuple(value.get("state") or ()),
        )


@final
@dataclass(frozen=True, slots=True)
class Committed:
    """:meth:`Committer.commit` made the epoch visible, now."""


@final
@dataclass(frozen=True, slots=True)
class AlreadyCommitted:
    """:meth:`Committer.commit` found the table's committed marker for the epoch: an earlier
    call (before a crash, or whose reply was lost) committed it. Nothing was written."""


@final
@dataclass(frozen=True, slots=True)
class RetryLater:
    """:meth:`Committer.commit` failed for a reason that may pass (a concurrent writer won a
    race, a timeout, a connection reset): the coordinator retries it after its backoff, within
    its retry bound.

    Attributes:
        cause: what failed.
    """

    cause: BaseException


@final
@dataclass(frozen=True, slots=True)
class Failed:
    """:meth:`Committer.commit` failed for good (the table is gone, its schema conflicts, a
    permission is missing): the coordinator fails the pipeline with
    :class:`~barrierflow.errors.TableCommitFailedError` and acknowledges nothing more.

    Attributes:
        cause: what failed.
    """

    cause: BaseException


#: What :meth:`Committer.commit` says happened. Each table classifies its own errors; an
#: exception a committer lets escape is treated as :class:`RetryLater` (retried within the
#: bound, then failed), and logged as unclassified. A commit that returns ``None`` (a
#: committer written before outcomes existed, whose commit is idempotent and raises on
#: failure) is taken as :class:`Committed`.
CommitOutcome = Committed | AlreadyCommitted | RetryLater | Failed


def manifests_positions(manifests: Sequence[Manifest]) -> dict[str, Any]:
    """The positions one epoch's rows reach, as every writer's manifest reports them, merged
    for the committer (``{"positions", "positions_from"}``; empty without positions): every
    writer saw the same barriers, so they agree; the key-wise maximum is taken regardless."""
    reported = [m for m in manifests if m.positions]
    if not reported:
        return {}
    return {
        "positions": merge_positions(*(m.positions for m in reported)),
        "positions_from": merge_positions(*(m.positions_from for m in reported)),
    }


@runtime_checkable
class Committer(Protocol):
    """The table side of a coordinator: one commit per epoch from its writers' manifests.

    Called by one coordinator, one call at a time. Lifecycle per coordinator run:
    :meth:`abort` for each epoch recovery found aborted, :meth:`recover` once, then per epoch
    :meth:`prepare` and — once the epoch's checkpoint is durable — :meth:`commit`, in epoch
    order. ``commit`` may be called again for an epoch after a failure or a crash.

    What the coordinator does with each outcome of :meth:`commit`:

    * :class:`Committed`, :class:`AlreadyCommitted`: the epoch went through (a replay is
      counted, ``barrierflow_sink_commit_replays``); the next epoch's commit may start.
    * :class:`RetryLater` — or an exception the committer let escape (logged as
      unclassified): the commit is retried after the seed's backoff, while the writers go on
      being acknowledged, for at most the coordinator's ``commit_retry_timeout`` seconds from
      the epoch's first failure; then it fails as below.
    * :class:`Failed`: at once, the coordinator fails with
      :class:`~barrierflow.errors.TableCommitFailedError` naming the sink, the epoch and the
      cause, which fails the pipeline; no writer is acknowledged after it.
    * ``None`` (a committer written before outcomes existed): taken as :class:`Committed`.

    Every commit waits for the epoch's checkpoint to be durable (two-phase): a table that
    must publish earlier has no place in this protocol, which is what makes a replay after a
    crash exact.
    """

    async def recover(self, pending: Mapping[int, CommitMetadata]) -> None:
        """Prepare (load the table, ...) once per coordinator run. ``pending`` maps the epochs
        that will still be committed to their metadata: anything staged that none of them
        references belongs to epochs that never reached the meta store, and may be deleted
        (their rows will be replayed)."""
        ...

    async def prepare(self, epoch: int, manifests: Sequence[Manifest]) -> CommitMetadata | None:
        """Phase 1: the JSON-serializable metadata that commits ``epoch`` (persisted in the
        meta store), from every writer's manifest; ``None``: nothing to commit. The manifests
        agree on their schema change (the coordinator checks it)."""
        ...

    async def commit(self, epoch: int, metadata: CommitMetadata) -> CommitOutcome:
        """Phase 2: publish ``epoch`` in one atomic commit, with its source positions, and say
        what happened: :class:`Committed`; :class:`AlreadyCommitted` when the table's
        committed marker shows the epoch (nothing is written); :class:`RetryLater` for a
        failure that may pass; :class:`Failed` for one that will not."""
        ...

    async def abort(self, epoch: int, metadata: CommitMetadata | None) -> None:
        """Discard what ``epoch`` staged (its rows will be replayed). Errors are logged."""
        ...


@runtime_checkable
class StagingWriter(Protocol):
    """One writer of a table: stages rows per epoch and describes them in a :class:`Manifest`.
    It never makes a row visible — that is the committer's, once per epoch, for every writer.

    Owned by one sink task (:mod:`barrierflow.actors.sinks.sink_task`), which calls it one
    call at a time — a writer needs no locks. Its life: :meth:`open` once, then per epoch
    :meth:`begin`, any number of :meth:`write` (and :meth:`flush` at any time, from the
    periodic flush), then :meth:`stage` — or :meth:`discard` instead if something failed
    (``stage`` is never called on a poisoned epoch, one where a write failed); :meth:`close`
    once, last, also after a failure. A method that raises fails only that call; a call may
    be cancelled (a flush that overran its timeout) and must leave the writer usable.
    """

    @property
    def schema(self) -> pa.Schema:
        """The schema every written batch must have (names, types and nullability)."""
        ...

    async def open(self) -> None:
        """Acquire resources (directories, locks, connections). Called once, first."""
        ...

    async def begin(self, epoch: int) -> None:
        """Start staging ``epoch`` (greater than every epoch begun before)."""
        ...

    async def write(self, batch: pa.RecordBatch) -> None:
        """Stage ``batch`` (already checked against :attr:`schema`) into the open epoch."""
        ...

    async def flush(self) -> None:
        """Push buffered rows towards storage. Nothing becomes visible."""
        ...

    async def stage(self, epoch: int) -> Manifest:
        """Make everything written in open epoch ``epoch`` durable (not visible) and describe
        it. The writer fills its id, the epoch and the files; the sink writer adds its
        vnodes and the source positions before the manifest goes to the coordinator."""
        ...

    async def discard(self, epoch: int) -> None:
        """Delete what ``epoch`` staged (it will never be committed; its rows are replayed)."""
        ...

    async def close(self) -> None:
        """Release resources. Called once, last; staged epochs stay for the committer."""
        ...


@runtime_checkable
class PathChecked(Protocol):
    """A staging writer writing files under a local path, which it checks before the graph
    starts (optional): a path that cannot be used is refused naming the sink, before any row
    flows, rather than failing ``open`` from inside the running graph."""

    def check_path(self, sink: str) -> None:
        """Make sure the path can be written (blocking, cheap: it may create the directory).

        Raises:
            SinkPathError: it cannot, naming ``sink``.
        """
        ...


@runtime_checkable
class TakesChanges(Protocol):
    """A staging writer of a table keyed for upserts that applies a changelog (optional):
    the sink writer hands it every chunk with delete or update rows (insert-only chunks still
    go to :meth:`StagingWriter.write`); a writer without it has such chunks refused.

    Semantics, per key, over the whole epoch in arrival order (``write`` rows count as
    inserts): the epoch's **last** op of each key decides. An ``INSERT`` or ``UPDATE_INSERT``
    upserts its row; a ``DELETE`` removes the key (absent or not); an ``UPDATE_DELETE`` is
    superseded by the ``UPDATE_INSERT`` that follows it, and removes the key only when it is
    the last op (an update whose new row went elsewhere). So a delete then an insert of one
    key in an epoch ends with the row present, an insert then a delete with it absent.
    :func:`last_change_per_key` is that reduction for one batch.
    """

    async def write_changes(self, batch: pa.RecordBatch, ops: pa.Array) -> None:
        """Stage the changelog ``batch`` (already checked against the writer's schema) into
        the open epoch; ``ops`` holds one ``int8``
        :class:`~barrierflow.channels.chunk.Op` code per row. Same life as
        :meth:`StagingWriter.write` (a failure poisons the epoch)."""
        ...


def last_change_per_key(
    batch: pa.RecordBatch, ops: pa.Array, key: Sequence[str]
) -> tuple[pa.RecordBatch, pa.Array]:
    """The last row and op of each ``key`` in ``batch``, in their order in the batch: what
    a :class:`TakesChanges` writer must apply of it (vectorized: a group-by on the key over
    the row numbers, no Python loop per row).

    Raises:
        InvalidArgumentError: ``ops`` is not one code per row, or ``key`` names no column of
            the batch.
    """
    if len(ops) != batch.num_rows:
        raise InvalidArgumentError("ops", f"{batch.num_rows} op codes", len(ops))
    if not key or any(k not in batch.schema.names for k in key):
        raise InvalidArgumentError("key", f"columns of {batch.schema.names}", key)
    row = "row"
    while row in key:
        row = f"_{row}"
    numbered = pa.table(
        [*(batch.column(k) for k in key), pa.array(np.arange(batch.num_rows, dtype=np.int64))],
        names=[*key, row],
    )
    last = numbered.group_by(list(key), use_threads=False).aggregate([(row, "max")])
    keep = pa.array(np.sort(last.column(f"{row}_max").to_numpy()))
    return batch.take(keep), ops.take(keep)


@final
@dataclass(frozen=True, slots=True)
class SinkCommits:
    """What a table's storage says it committed (:class:`HoldsCommits`).

    Attributes:
        sink: the sink (its name, table or path), for messages.
        epoch: the last committed epoch (> 0).
        positions: the source positions recorded with it (empty if the sink recorded none).
    """

    sink: str
    epoch: int
    positions: dict[str, int] = field(default_factory=dict)


@runtime_checkable
class HoldsCommits(Protocol):
    """A committer that can tell what its table holds (optional): read on an empty state
    store (to refuse a table the store does not know, or to adopt its positions with
    ``RuntimeConfig(adopt_sink_positions=True)``), through the sink's writer."""

    async def sink_commits(self) -> SinkCommits | None:
        """The table's last committed epoch and the source positions recorded with it
        (``None``: nothing committed by barrierflow yet). Blocking work goes to a thread."""
        ...


@runtime_checkable
class CommitTimings(Protocol):
    """A committer that times its commits (optional): the table's own commit, not the file
    moves before it."""

    @property
    def commit_seconds(self) -> Sequence[float]:
        """Seconds the latest commits took, oldest first (a bounded window)."""
        ...

    @property
    def commits(self) -> int:
        """Commits this committer made (all of them, not only the window's)."""
        ...


@runtime_checkable
class Table(Protocol):
    """A sink written by parallel writers and committed by one coordinator (what
    :func:`~barrierflow.actors.sinks.add_sink` declares, for one writer or many)."""

    @property
    def schema(self) -> pa.Schema:
        """The schema of every row written."""
        ...

    def writer(self, writer_id: str) -> StagingWriter:
        """The staging writer of parallel writer ``writer_id`` (a new one at every call: the
        runtime makes one per incarnation of the writer)."""
        ...

    def committer(self) -> Committer:
        """The coordinator's committer (one per table and process)."""
        ...
