"""Getting a SparkSession: local mode by default, a cluster by configuration.

:func:`spark_session` builds (or reuses) the process's session. Local mode (``local[2]``) is
the embedded default; pass ``master="spark://host:7077"`` (or ``yarn``, ``k8s://...``) and the
usual Spark configuration to run the *same* code against a cluster — nothing in user code
changes: the bridge only ever talks to the driver-side DataFrame API (``foreachBatch`` and
``toArrow``), so the executors never need barrierflow. What changes is where the DataFrame is
computed, and that paths (checkpoint locations, input directories) must be reachable by the
executors (a shared filesystem or object store instead of local files).

Local mode binds to ``127.0.0.1`` (``SPARK_LOCAL_IP``) unless it is set already: otherwise
Spark may resolve the host name to an address it cannot bind to. The Spark UI is off and
shuffles use few partitions, which suits micro-batches of a streaming driver. Spark logs
errors only, and not a failed streaming query's (the driver gets that failure from
``awaitTermination``; see :mod:`barrierflow.spark_bridge.failures`).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import Mapping
from typing import Any

from barrierflow._extras import require
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.spark_bridge.errors import SparkUnavailableError

__all__ = ["DEFAULT_MASTER", "require_spark", "spark_session"]

#: The embedded default: Spark in this process's JVM with two worker threads.
DEFAULT_MASTER = "local[2]"


def require_spark() -> None:
    """Check that pyspark is importable and that a Java runtime is present.

    Raises:
        SparkUnavailableError: what is missing and how to install it.
    """
    if importlib.util.find_spec("pyspark") is None:
        raise SparkUnavailableError(
            "the pyspark package is not installed",
            "pip install 'barrierflow[spark]' (or pyspark>=4.0,<5)",
            component="pyspark",
        )
    java_home = os.environ.get("JAVA_HOME")
    java = (
        os.path.join(java_home, "bin", "java")
        if java_home and os.path.exists(os.path.join(java_home, "bin", "java"))
        else shutil.which("java")
    )
    if java is None:
        raise SparkUnavailableError(
            "no Java runtime found (neither $JAVA_HOME/bin/java nor java on PATH)",
            "install Java 17 (e.g. apt install openjdk-17-jre-headless) or set JAVA_HOME",
            component="java",
        )


def spark_session(
    app_name: str = "barrierflow",
    *,
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
) -> Any:
    """The process's SparkSession, created on first use.

    Args:
        app_name: the application name.
        master: the Spark master (default :data:`DEFAULT_MASTER`).
        conf: further Spark configuration (``{"spark.executor.memory": "4g"}``).

    Raises:
        SparkUnavailableError: pyspark or Java is missing.
        InvalidArgumentError: ``app_name``, ``master`` or ``conf`` is malformed.
    """
    if not isinstance(app_name, str) or not app_name:
        raise InvalidArgumentError("app_name", "a non-empty str", app_name)
    require_spark()
    master = master or DEFAULT_MASTER
    if not isinstance(master, str):
        raise InvalidArgumentError("master", "a Spark master URL such as 'local[2]'", master)
    if conf is not None and (
        not isinstance(conf, Mapping)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in conf.items())
    ):
        raise InvalidArgumentError("conf", "a mapping of str to str", conf)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # Python workers (``mapInArrow`` in the Spark reader) run this interpreter, which has
        # pyarrow, rather than whatever ``python3`` is first on PATH.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark_sql = require("spark", "pyspark.sql")
    builder = (
        spark_sql.SparkSession.builder.appName(app_name)
        .master(master)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    _quiet_query_failures(session)
    return session


#: The loggers whose ERROR lines are a failure's JVM stack trace, raised to the driver anyway:
#: Spark's streaming query execution (``MicroBatchExecution``, ...), a task's executor
#: (``Exception in task ...``, the Python worker's traceback wrapped in 25 and more JVM frames;
#: in local mode the executor logs in the driver's JVM) and the scheduler's task set
#: (``Task 0 in stage 0.0 failed 1 times; aborting job``).
_QUIET_LOGGERS = (
    "org.apache.spark.sql.execution.streaming",
    "org.apache.spark.executor.Executor",
    "org.apache.spark.scheduler.TaskSetManager",
)


def _quiet_query_failures(session: Any) -> None:
    """Turn off Spark's own ERROR logs of a failed streaming query or task (see
    ``_QUIET_LOGGERS``): a JVM stack trace of 30 to 70 and more lines on stderr, printed
    before the driver sees anything. The same failure is raised to the driver — by
    ``awaitTermination`` (reduced to its cause by
    :meth:`~barrierflow.spark_bridge.SparkBridge.await_termination`), or by the job that ran the
    task (an :class:`~barrierflow.spark_bridge.executors.ExecutorImportError`, the Python
    worker's error) — so the logs only buried the one line that matters. A task Spark retries
    and that then succeeds logs nothing either. Best effort: a JVM without log4j 2 keeps its
    logging."""
    try:
        jvm = session.sparkContext._jvm
        log4j = jvm.org.apache.logging.log4j
        for logger in _QUIET_LOGGERS:
            log4j.core.config.Configurator.setLevel(logger, log4j.Level.OFF)
    except Exception:  # logging set-up must never stop a session
        pass
