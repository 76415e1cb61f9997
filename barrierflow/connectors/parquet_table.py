"""A coordinated Parquet table: the parallel writers and the committer of one directory.

:class:`ParquetTable` is to Parquet files what :class:`~barrierflow.connectors.IcebergSink` is
to an Iceberg table — what :func:`~barrierflow.actors.add_sink` needs to declare N writers and
their coordinator: ``writer(id)`` gives each parallel writer its
:class:`~barrierflow.connectors.ParquetFileSink` (staging under ``.staging/<epoch>/w<id>/``)
and ``committer()`` the :class:`~barrierflow.connectors.ParquetCommitter` that renames every
writer's files of an epoch into place at once.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, final

import pyarrow as pa

from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.connectors._parquet_files import check_table_path
from barrierflow.connectors.parquet_committer import ParquetCommitter
from barrierflow.connectors.parquet_sink import ParquetFileSink

__all__ = ["ParquetTable"]

_OPTIONS = ("rows_per_file", "row_group_rows", "compression", "use_dictionary")


@final
class ParquetTable:
    """The directory ``path`` written by parallel writers and committed by one coordinator.

    Args:
        path: the table directory.
        schema: the schema of every batch and file.
        options: passed to every writer's :class:`ParquetFileSink` (``rows_per_file``,
            ``row_group_rows``, ``compression``, ``use_dictionary``).

    Raises:
        InvalidArgumentError: ``path`` is not a path, ``schema`` not a pyarrow.Schema, an
            option is not one of those or has a bad value (checked here, not when the writers
            are made at start), or is ``writer`` (writer ids are given by :meth:`writer`).
        SinkPathError: ``path`` cannot be a table directory (see :class:`ParquetFileSink`).
    """

    def __init__(self, path: str | os.PathLike[str], schema: pa.Schema, **options: Any) -> None:
        check_table_path(path, "ParquetTable")
        if "writer" in options:
            raise InvalidArgumentError(
                "options", "ParquetFileSink options other than writer", options["writer"]
            )
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise InvalidArgumentError("options", f"ParquetFileSink options {_OPTIONS}", unknown)
        # Every writer is made from these at start: a bad one is refused now, by the sink.
        ParquetFileSink(path, schema, writer="0", **options)
        self.path = Path(path)
        self.schema = schema
        self._options = options

    def writer(self, writer_id: str) -> ParquetFileSink:
        """The connector of parallel writer ``writer_id``."""
        return ParquetFileSink(self.path, self.schema, writer=writer_id, **self._options)

    def committer(self) -> ParquetCommitter:
        """The coordinator's committer of this directory."""
        return ParquetCommitter(self.path)

    def __repr__(self) -> str:
        return f"ParquetTable({str(self.path)!r})"
