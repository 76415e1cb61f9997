"""A Parquet table: a directory of Parquet files, one directory per epoch, exactly once.

:class:`ParquetTable` is to Parquet files what :class:`~barrierflow.connectors.IcebergTable` is
to an Iceberg table — what :func:`~barrierflow.actors.add_sink` needs to declare its writers
(one or many) and their coordinator: ``writer(id)`` gives each writer its
:class:`~barrierflow.connectors.ParquetStagingWriter` (staging under
``.staging/<epoch>/w<id>/``) and ``committer()`` the
:class:`~barrierflow.connectors.parquet_committer.ParquetCommitter` that renames every
writer's files of an epoch into place at once (the layout is in :mod:`.parquet_committer`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, final

import pyarrow as pa

from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.connectors._parquet_files import check_table_path
from barrierflow.connectors.parquet_committer import ParquetCommitter
from barrierflow.connectors.parquet_writer import WRITER_OPTIONS, ParquetStagingWriter

__all__ = ["ParquetTable"]


@final
class ParquetTable:
    """The directory ``path`` written by its writers and committed by one coordinator.

    Args:
        path: the table directory.
        schema: the schema of every batch and file.
        options: passed to every writer's :class:`ParquetStagingWriter` (``rows_per_file``,
            ``row_group_rows``, ``compression``, ``use_dictionary``).

    Raises:
        InvalidArgumentError: ``path`` is not a path, ``schema`` not a pyarrow.Schema, an
            option is not one of those or has a bad value (checked here, not when the writers
            are made at start).
        SinkPathError: ``path`` cannot be a table directory (see
            :class:`ParquetStagingWriter`).
    """

    def __init__(self, path: str | os.PathLike[str], schema: pa.Schema, **options: Any) -> None:
        check_table_path(path, "ParquetTable")
        unknown = sorted(set(options) - set(WRITER_OPTIONS))
        if unknown:
            raise InvalidArgumentError("options", f"writer options {WRITER_OPTIONS}", unknown)
        # Every writer is made from these at start: a bad one is refused now, by the writer.
        ParquetStagingWriter(path, schema, "0", **options)
        self.path = Path(path)
        self.schema = schema
        self._options = options

    def writer(self, writer_id: str) -> ParquetStagingWriter:
        """The staging writer of writer ``writer_id``."""
        return ParquetStagingWriter(self.path, self.schema, writer_id, **self._options)

    def committer(self) -> ParquetCommitter:
        """The coordinator's committer of this directory."""
        return ParquetCommitter(self.path)

    def __repr__(self) -> str:
        return f"ParquetTable({str(self.path)!r})"
