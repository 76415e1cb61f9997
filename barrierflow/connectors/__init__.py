"""The real systems behind the table and split log protocols: Parquet files (one directory
per epoch), Iceberg tables (one snapshot per epoch), Delta Lake tables (one commit per epoch),
the console, and Redis streams as a split log. Every table stages through
:class:`ParquetStagingWriter` (the console prints instead); the file tables' committers share
:class:`FileCommitter`, the base a new file format's committer subclasses."""

import typing as _typing

from barrierflow._removed import removed_names as _removed_names
from barrierflow.connectors._file_table import EpochCommit as EpochCommit
from barrierflow.connectors._file_table import FileCommitter as FileCommitter
from barrierflow.connectors.delta_table import DeltaLakeTable as DeltaLakeTable
from barrierflow.connectors.iceberg_table import IcebergTable as IcebergTable
from barrierflow.connectors.iceberg_table import open_local_catalog as open_local_catalog
from barrierflow.connectors.parquet_table import ParquetTable as ParquetTable
from barrierflow.connectors.parquet_writer import ParquetStagingWriter as ParquetStagingWriter
from barrierflow.connectors.postgres_table import PostgresTable as PostgresTable
from barrierflow.connectors.print_sink import PrintSink as PrintSink
from barrierflow.connectors.redis_streams import RedisStreamLog as RedisStreamLog
from barrierflow.connectors.redis_streams import RetryBackoff as RetryBackoff

__all__ = [
    "DeltaLakeTable",
    "EpochCommit",
    "FileCommitter",
    "IcebergTable",
    "ParquetStagingWriter",
    "ParquetTable",
    "PostgresTable",
    "PrintSink",
    "RedisStreamLog",
    "RetryBackoff",
    "open_local_catalog",
]

if not _typing.TYPE_CHECKING:
    # A removed name says what replaced it (see CHANGELOG.md); a type checker does not see
    # this, so it still reports a removed or misspelt name as missing.
    __getattr__ = _removed_names(__name__)
