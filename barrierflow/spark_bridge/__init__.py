"""The Spark bridge: Spark micro-batches and DataFrames into a runtime as Arrow chunks, exactly
once, and Spark as a reader for backfills. pyspark is imported only when a Spark object is
used (install the ``spark`` extra)."""

import typing as _typing

from barrierflow._removed import removed_names as _removed_names
from barrierflow.spark_bridge.bridge import BridgeStats as BridgeStats
from barrierflow.spark_bridge.bridge import SparkBridge as SparkBridge
from barrierflow.spark_bridge.bridge import arrow_schema_of as arrow_schema_of
from barrierflow.spark_bridge.reader import SparkReader as SparkReader
from barrierflow.spark_bridge.reader import read_spark as read_spark
from barrierflow.spark_bridge.session import spark_session as spark_session

__all__ = [
    "BridgeStats",
    "SparkBridge",
    "SparkReader",
    "arrow_schema_of",
    "read_spark",
    "spark_session",
]

if not _typing.TYPE_CHECKING:
    # A removed name says what replaced it (see CHANGELOG.md); a type checker does not see
    # this, so it still reports a removed or misspelt name as missing.
    __getattr__ = _removed_names(__name__)
