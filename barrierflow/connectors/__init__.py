"""The real systems behind the sink protocol: Parquet files (one writer, or parallel writers
under a coordinator), Iceberg tables (one snapshot per epoch) and the console."""

from barrierflow.connectors.iceberg_sink import IcebergCommitter as IcebergCommitter
from barrierflow.connectors.iceberg_sink import IcebergSink as IcebergSink
from barrierflow.connectors.iceberg_sink import open_local_catalog as open_local_catalog
from barrierflow.connectors.parquet_committer import ParquetCommitter as ParquetCommitter
from barrierflow.connectors.parquet_sink import ParquetFileSink as ParquetFileSink
from barrierflow.connectors.parquet_table import ParquetTable as ParquetTable
from barrierflow.connectors.print_sink import PrintSink as PrintSink

__all__ = [
    "IcebergCommitter",
    "IcebergSink",
    "ParquetCommitter",
    "ParquetFileSink",
    "ParquetTable",
    "PrintSink",
    "open_local_catalog",
]
