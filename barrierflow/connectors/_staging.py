"""Where the file sinks stage an epoch's files before its commit, shared by the Parquet sink
and the committers of the coordinated tables (Parquet, Iceberg, Delta).

Layout under a table (or Iceberg data) directory::

    .staging/<epoch, 20 digits>/[w<writer>/]part-*.parquet   an epoch's files, not committed
    .staging/<epoch>/_PRECOMMITTED.json                      its pre-commit record
    epoch=<epoch, 20 digits>/                                 a committed epoch (Parquet sink)
    <epoch, 20 digits>/w<writer>/part-*.parquet              moved by a commit (Iceberg, Delta)
    _manifest.json                                           the Parquet sink's manifest

Readers never look at staged files: ``pyarrow.dataset`` skips names starting with ``.``/``_``.
The zero padding makes names sort by epoch. Durable writes (fsync) are in
:mod:`barrierflow._fs`.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from barrierflow.actors.sinks.table import Manifest, StagedFile, manifests_positions
from barrierflow.connectors._iceberg_schema import check_schema_change
from barrierflow.connectors.errors import (
    SchemaEvolutionError,
    StagedEpochMismatchError,
    StagedPathError,
)
from barrierflow.connectors.state_commit import gather_state

__all__ = [
    "MANIFEST",
    "gather_staged",
    "PRECOMMITTED",
    "STAGING",
    "clean_staging",
    "delete_unreferenced_moves",
    "epoch_dir_name",
    "kept_epochs",
    "moved_files",
    "staged_dir",
    "staged_files",
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


def moved_files(root: Path, keep: set[str]) -> list[Path]:
    """The data files a committer moved out of staging into ``root`` —
    ``root/<S, 20 digits>/w<writer>/*.parquet``, the layout :func:`unstaged_path` makes —
    under staging epochs not in ``keep`` (the pending commits'). Nothing else in ``root`` is
    barrierflow's to judge. Blocking."""
    found: list[Path] = []
    if not root.is_dir():
        return found
    for epoch_dir in root.iterdir():
        name = epoch_dir.name
        if len(name) != 20 or not name.isdigit() or name in keep or not epoch_dir.is_dir():
            continue
        for writer_dir in epoch_dir.iterdir():
            if writer_dir.name.startswith("w") and writer_dir.is_dir():
                found.extend(
                    path
                    for path in writer_dir.iterdir()
                    if path.suffix == ".parquet" and path.is_file()
                )
    return found


def delete_unreferenced_moves(
    root: Path,
    keep: set[str],
    current: Callable[[], set[Path]],
    ever: Callable[[], set[Path]],
) -> list[Path]:
    """Delete the files a commit moved into ``root`` but that no commit of the table
    references: what a crash between a commit's file moves and the table's commit leaves when
    the meta store that named them as pending is lost too (a new or empty store, adopted
    positions). Nothing else would delete them — deltalake's ``vacuum`` only deletes files
    its log once named, pyiceberg has no orphan-file removal — and a plain directory reader
    counts their rows. Their epoch is not committed, so its rows are replayed from the positions
    the table holds. Blocking.

    Only :func:`moved_files` are candidates (barrierflow's own layout, staging epochs no
    pending commit keeps), and a candidate is deleted only when neither the table's current
    version (``current()``, read when there is any candidate) nor any version the table still
    keeps (``ever()``, read only when some candidate is not current) references it.

    Returns:
        The deleted files.
    """
    candidates = {path.resolve() for path in moved_files(root, keep)}
    if candidates:
        candidates -= current()
    if candidates:
        candidates -= ever()
    if candidates:
        structlog.get_logger("barrierflow.sinks").warning(
            "deleting files a commit moved into the table but no commit references",
            table=str(root),
            files=len(candidates),
        )
    for path in sorted(candidates):
        path.unlink(missing_ok=True)
        for directory in (path.parent, path.parent.parent):
            try:
                directory.rmdir()  # only once empty: the epoch's directory goes with its files
            except OSError:
                break
    return sorted(candidates)


def staged_files(metadata: Mapping[str, Any]) -> dict[str, StagedFile]:
    """The staged files a commit's metadata describes (staged path → file, as
    :func:`gather_staged` records them); empty for metadata recorded before it did."""
    return {path: StagedFile.from_json(f) for path, f in (metadata.get("files") or {}).items()}


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
    state = gather_state(manifests)
    if not paths and change is None and not state:
        return None
    metadata: dict[str, Any] = {
        "staging_epoch": staged.pop(),
        "paths": paths,
        "rows": sum(m.rows for m in manifests),
        # What the writers knew of each file (rows, bytes, column statistics), so that the
        # commit reads no footer; a pending commit recorded without it reads them instead.
        "files": {f.path: f.to_json() for m in manifests for f in m.files},
        **manifests_positions(manifests),
    }
    if change is not None:
        metadata["schema_change"] = dict(change)
    if state:
        # A keyed operator's state deltas, committed with the files (see .state_commit).
        metadata["state"] = state
    return metadata
