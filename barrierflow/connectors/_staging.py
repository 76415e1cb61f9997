"""Where the file sinks stage an epoch's files before its commit, shared by the Parquet sink
and the committers of the coordinated tables (Parquet, Iceberg, Delta).

Layout under a table (or Iceberg data) directory::

    .staging/<epoch, 20 digits>/[w<writer>/]part-*.parquet   an epoch's files, not committed
    .staging/<epoch>/_PRECOMMITTED.json                      its pre-commit record
    epoch=<epoch, 20 digits>/                                 a committed epoch (Parquet sink)
    _manifest.json                                           the Parquet sink's manifest

Readers never look at staged files: ``pyarrow.dataset`` skips names starting with ``.``/``_``.
The zero padding makes names sort by epoch. Durable writes (fsync) are in
:mod:`barrierflow._fs`.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from barrierflow.actors.sinks.table import Manifest, manifests_positions
from barrierflow.connectors._iceberg_schema import check_schema_change
from barrierflow.connectors.errors import (
    SchemaEvolutionError,
    StagedEpochMismatchError,
    StagedPathError,
)

__all__ = [
    "MANIFEST",
    "gather_staged",
    "PRECOMMITTED",
    "STAGING",
    "clean_staging",
    "epoch_dir_name",
    "kept_epochs",
    "staged_dir",
    "staged_name",
    "unstaged_path",
]

#: The Parquet sink's manifest (its last committed epoch and row totals).
MANIFEST = "_manifest.json"
#: The staging area's directory name.
STAGING = ".staging"
#: The pre-commit record an epoch's staging directory carries.
PRECOMMITTED = "_PRECOMMITTED.json"


def staged_name(epoch: int) -> str:
    """The staging directory name of ``epoch``."""
    return f"{int(epoch):020d}"


def staged_dir(root: Path, epoch: int) -> Path:
    """Where ``epoch`` is staged under ``root``."""
    return root / STAGING / staged_name(epoch)


def epoch_dir_name(epoch: int) -> str:
    """The committed directory of ``epoch`` (zero-padded, so names sort by epoch)."""
    return f"epoch={epoch:020d}"


def kept_epochs(pending: Iterable[Mapping[str, Any] | None]) -> set[str]:
    """The staging directory names that the pending commits' metadata reference (by their
    ``staging_epoch``)."""
    return {
        staged_name(metadata["staging_epoch"])
        for metadata in pending
        if metadata is not None and "staging_epoch" in metadata
    }


def clean_staging(root: Path, keep: set[str]) -> None:
    """Create ``root``'s staging area and delete every staged epoch not in ``keep`` (garbage of
    epochs that never reached the meta store). Blocking."""
    staging = root / STAGING
    staging.mkdir(parents=True, exist_ok=True)
    for entry in staging.iterdir():
        if entry.name not in keep:
            shutil.rmtree(entry, ignore_errors=True)


def unstaged_path(root: Path, relative: str) -> Path:
    """Where the staged file ``relative`` (``.staging/<S>/w<id>/part.parquet``) goes once
    committed: ``root/<S>/w<id>/part.parquet``.

    Raises:
        StagedPathError: ``relative`` is not under the staging area.
    """
    parts = Path(relative).parts
    if not parts or parts[0] != STAGING:
        raise StagedPathError(relative)
    return root.joinpath(*parts[1:])


def gather_staged(
    table: str, epoch: int, manifests: Sequence[Manifest], *, evolves: bool
) -> dict[str, Any] | None:
    """One epoch's commit metadata from every writer's manifest — what every coordinated
    table's :meth:`~barrierflow.actors.sinks.table.Committer.prepare` persists: the staging
    epoch they all staged under, their files, their rows, the source positions their rows
    reach, and the schema change they carry. ``None`` when no writer staged a file and there
    is no schema change (nothing to commit).

    A schema change is checked here, once for every table: a table that ``evolves`` takes
    only ``add_columns`` changes (:func:`~._iceberg_schema.check_schema_change`), one that
    does not (Parquet files) refuses any.

    Raises:
        StagedEpochMismatchError: the writers staged files under different epochs
            (``table`` names it).
        SchemaEvolutionError: a schema change for a table that does not evolve.
        InvalidArgumentError: a schema change that is not an ``add_columns`` change.
    """
    change = manifests[0].schema_change if manifests else None
    if change is not None:
        if not evolves:
            raise SchemaEvolutionError(table, epoch, change)
        check_schema_change(change)
    # The staging epoch of the files: writers that staged nothing do not count (a micro-batch
    # staged on Spark executors comes under its own staging number while the writer actors,
    # which saw no row of it, send empty manifests of the runtime's epoch).
    staged = {m.epoch for m in manifests if m.files} or {m.epoch for m in manifests}
    if len(staged) != 1:
        raise StagedEpochMismatchError(table, epoch, staged)
    paths = [f.path for m in manifests for f in m.files]
    if not paths and change is None:
        return None
    metadata: dict[str, Any] = {
        "staging_epoch": staged.pop(),
        "paths": paths,
        "rows": sum(m.rows for m in manifests),
        **manifests_positions(manifests),
    }
    if change is not None:
        metadata["schema_change"] = dict(change)
    return metadata
