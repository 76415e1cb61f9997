"""The Spark bridge: Spark micro-batches and DataFrames into a runtime as Arrow chunks, exactly
once, and Spark as a reader for backfills. pyspark is imported only when a Spark object is
used (install the ``spark`` extra)."""

from barrierflow.spark_bridge.bridge import BridgeStats as BridgeStats
from barrierflow.spark_bridge.bridge import SparkBridge as SparkBridge
from barrierflow.spark_bridge.bridge import arrow_schema_of as arrow_schema_of
from barrierflow.spark_bridge.failures import unwrap_spark_error as unwrap_spark_error
from barrierflow.spark_bridge.reader import SparkReader as SparkReader
from barrierflow.spark_bridge.reader import read_spark as read_spark
from barrierflow.spark_bridge.session import DEFAULT_MASTER as DEFAULT_MASTER
from barrierflow.spark_bridge.session import require_spark as require_spark
from barrierflow.spark_bridge.session import spark_session as spark_session

__all__ = [
    "DEFAULT_MASTER",
    "BridgeStats",
    "SparkBridge",
    "SparkReader",
    "arrow_schema_of",
    "read_spark",
    "require_spark",
    "spark_session",
    "unwrap_spark_error",
]
