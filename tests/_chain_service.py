"""A real HTTP service on loopback, and the chain of the executor-fault tests that calls it.

The chain (``test_executor_chain_faults.py``, ``_cluster_chain_child.py``)::

    events (id, user, amount)
      → filter user > 2
      → async_map "enrich": GET /users/<user> of this service → name, tier
      → map_batches "cents": amount in integer cents, the amount dropped
      → a table (Iceberg, Delta or Parquet) of :data:`OUT`

runs in Spark tasks (``run_on="executors"``) or on the driver. Its functions are made by
factories (:func:`enrich_fn`, :func:`cents_fn`) and import what they use inside their bodies:
Spark ships such closures by value, while a function of this module (which executors cannot
import) would be shipped by reference and fail there.

The service (:class:`ChainService`, a thread of the test process) answers
``GET /users/<user>?id=..&partition=..&attempt=..&pid=..`` with the user's profile, and
records every call: which row, from which Spark task attempt and which process. Tests steer it
with two rules over a :class:`Call`: ``fail`` (answer 503) and ``hold`` (keep the caller
waiting until :meth:`ChainService.release`, so that a task is known to be mid-chain while the
test kills something). :func:`expected` is the chain's output computed with pyarrow alone, the
reference a table read back is compared with.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

import pyarrow as pa
import pyarrow.compute as pc

#: The enriched rows (async_map's output) and the table's rows (map_batches' output).
ENRICHED = pa.schema(
    [("id", pa.int64()), ("user", pa.int64()), ("amount", pa.float64()),
     ("name", pa.string()), ("tier", pa.string())]
)  # fmt: skip
OUT = pa.schema(
    [("id", pa.int64()), ("user", pa.int64()), ("name", pa.string()), ("tier", pa.string()),
     ("cents", pa.int64())]
)  # fmt: skip
USERS = 97
TIERS = ("free", "pro", "team")
#: The filter: users 0..2 are dropped (a few rows of every partition).
KEEP = pc.field("user") > 2
#: The actors of the chain, as errors and metrics name them.
ENRICH, CENTS = "enrich", "cents"


@dataclass(frozen=True, slots=True)
class Call:
    """One request the service answered: the row, the Spark task attempt that made it
    (``-1``: not in a Spark task), the calling process, and the status it got."""

    user: int
    id: int
    partition: int
    attempt: int
    pid: int
    status: int = 200


Rule = Callable[[Call], bool]


class ChainService:
    """The profile service, on a free loopback port (see the module); a context manager
    that releases every held call and stops the server on exit.

    Args:
        fail: answer 503 to the calls it holds for (``None``: none).
        hold: keep the calls it holds for waiting until :meth:`release` (or the service
            closes; ``None``: none).
    """

    def __init__(self, *, fail: Rule | None = None, hold: Rule | None = None) -> None:
        self.fail = fail
        self.hold = hold
        self._calls: list[Call] = []
        self._held: list[Call] = []
        self._changed = threading.Condition()
        self._released = threading.Event()
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                service._answer(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet

        class Server(ThreadingHTTPServer):
            request_queue_size = 256  # as many connects at once as calls in flight
            daemon_threads = True

        self._server = Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="chain-service", daemon=True
        )
        self._thread.start()

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def port(self) -> int:
        port: int = self._server.server_address[1]
        return port

    def calls(self) -> list[Call]:
        """The calls answered so far (held ones once answered), in order."""
        with self._changed:
            return list(self._calls)

    def held(self) -> list[Call]:
        """The calls that were held (answered or still waiting)."""
        with self._changed:
            return list(self._held)

    def wait_held(self, partitions: int, timeout: float) -> bool:
        """Wait until held calls came from ``partitions`` distinct Spark partitions; whether
        they did within ``timeout`` seconds."""
        with self._changed:
            return self._changed.wait_for(
                lambda: len({c.partition for c in self._held}) >= partitions, timeout
            )

    def release(self) -> None:
        """Answer every held call, and hold no more."""
        self.hold = None
        self._released.set()

    def close(self) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _answer(self, request: BaseHTTPRequestHandler) -> None:
        url = urlsplit(request.path)
        query = {name: int(values[0]) for name, values in parse_qs(url.query).items()}
        call = Call(
            int(url.path.rsplit("/", 1)[1]), query.get("id", -1), query.get("partition", -1),
            query.get("attempt", -1), query.get("pid", -1),
        )  # fmt: skip
        hold = self.hold
        if hold is not None and hold(call):
            with self._changed:
                self._held.append(call)
                self._changed.notify_all()
            self._released.wait()  # the test's cue (close releases too)
        fail = self.fail
        failed = fail is not None and fail(call)
        body = b"busy" if failed else json.dumps(profile(call.user)).encode()
        with self._changed:
            self._calls.append(dataclasses.replace(call, status=503 if failed else 200))
            self._changed.notify_all()
        try:
            request.send_response(503 if failed else 200)
            request.send_header("Content-Length", str(len(body)))
            request.end_headers()
            request.wfile.write(body)
        except OSError:
            pass  # the caller is gone (a killed task or driver)


def profile(user: int) -> dict[str, str]:
    """The profile the service answers for ``user``."""
    return {"name": f"user-{user}", "tier": TIERS[user % len(TIERS)]}


def enrich_fn(host: str, port: int) -> Callable[[dict[str, Any]], Any]:
    """The async_map function: the row with its user's profile, from the service at
    ``host:port`` (HTTP/1.1 over an anyio TCP stream, one connection per call, as in
    ``examples/enrich_http.py``); a status other than 200 raises ``RuntimeError`` (async_map
    retries it). Each call names its Spark task attempt (``TaskContext``) and process."""

    async def enrich(row: dict[str, Any]) -> dict[str, Any]:
        import json
        import os

        import anyio
        from pyspark import TaskContext

        context = TaskContext.get()
        partition, attempt = (
            (-1, -1) if context is None else (context.partitionId(), context.attemptNumber())
        )
        path = (
            f"/users/{row['user']}?id={row['id']}&partition={partition}&attempt={attempt}"
            f"&pid={os.getpid()}"
        )
        async with await anyio.connect_tcp(host, port) as stream:
            request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n"
            await stream.send(request.encode())
            response = b"".join([part async for part in stream])  # to the server's close
        head, _, body = response.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if status != 200:
            raise RuntimeError(f"GET /users/{row['user']}: HTTP {status}")
        found: dict[str, Any] = json.loads(body)
        return {**row, "name": found["name"], "tier": found["tier"]}

    return enrich


def cents_fn() -> Callable[[pa.RecordBatch], pa.RecordBatch]:
    """The map_batches function: the enriched rows with the amount in integer cents."""
    out = OUT  # a value the closure carries (a Schema pickles by value)

    def cents(batch: pa.RecordBatch) -> pa.RecordBatch:
        import pyarrow as pa
        import pyarrow.compute as pc

        amount = pc.cast(pc.round(pc.multiply(batch["amount"], 100.0)), pa.int64())
        columns = [batch["id"], batch["user"], batch["name"], batch["tier"], amount]
        return pa.RecordBatch.from_arrays(columns, schema=out)

    return cents


def declare_chain(
    rt: Any,
    source: str,
    service: tuple[str, int],
    *,
    retries: int = 3,
    timeout: float = 30.0,
    concurrency: int = 32,
) -> str:
    """Declare the chain reading ``source`` on ``rt``; the name of its last step (the sink's
    input)."""
    from barrierflow.operators import async_map
    from barrierflow.operators.stream import Stream

    host, port = service
    # async_map by its factory: the stream's method has no retry_delay (retries at once here).
    enrich = async_map(
        enrich_fn(host, port), schema=ENRICHED, concurrency=concurrency, retries=retries,
        timeout=timeout, retry_delay=0.0,
    )  # fmt: skip
    stream = (
        Stream(rt, source)
        .filter(KEEP, name="keep")
        .apply(ENRICH, enrich)
        .map_batches(cents_fn(), schema=OUT, name=CENTS)
    )
    return stream.name


# The input and the reference.


def events(start: int, count: int) -> pa.Table:
    """Events ``start .. start+count-1`` as the tests' Spark frames hold them."""
    ids = pa.array(range(start, start + count), pa.int64())
    return pa.table(
        {
            "id": ids,
            "user": pc.remainder(ids, USERS),
            "amount": pc.divide(pc.cast(ids, pa.float64()), 4.0),
        }
    )


def events_frame(spark: Any, start: int, count: int, partitions: int) -> Any:
    """The same events as a Spark DataFrame of ``partitions`` partitions (contiguous ids)."""
    return spark.range(start, start + count, numPartitions=partitions).selectExpr(
        "id", "id % 97 as user", "cast(id as double) / 4 as amount"
    )


def expected(ids: Iterable[tuple[int, int]]) -> list[dict[str, Any]]:
    """The chain's output for the events of each ``(start, count)``, sorted by id."""
    tables = [events(start, count) for start, count in ids]
    kept = pa.concat_tables(tables).filter(KEEP)
    users = kept["user"].to_pylist()
    names = [profile(u)["name"] for u in users]
    tiers = [profile(u)["tier"] for u in users]
    cents = pc.cast(pc.round(pc.multiply(kept["amount"], 100.0)), pa.int64())
    table = pa.table([kept["id"], kept["user"], names, tiers, cents], schema=OUT)
    rows: list[dict[str, Any]] = table.sort_by("id").to_pylist()
    return rows


# The tables, made and read back with their own readers.

TABLE_KINDS = ("iceberg", "delta", "parquet")


def make_table(kind: str, root: Path, row_group_rows: int | None = None) -> Any:
    """The ``kind`` table of :data:`OUT` under ``root`` (created, or opened if there)."""
    from barrierflow.connectors import (
        DeltaLakeTable,
        IcebergTable,
        ParquetTable,
        open_local_catalog,
    )

    if kind == "iceberg":
        return IcebergTable(open_local_catalog(root / "catalog"), "ns.events", OUT)
    if kind == "delta":
        return DeltaLakeTable(root / "delta", OUT, app_id="events")
    if kind == "parquet":
        if row_group_rows is None:
            return ParquetTable(root / "table", OUT)
        return ParquetTable(root / "table", OUT, row_group_rows=row_group_rows)
    raise ValueError(f"unknown table kind {kind!r}")


def table_root(kind: str, root: Path) -> Path:
    """The directory the ``kind`` table under ``root`` keeps its files (and staging) in."""
    if kind == "iceberg":
        return _iceberg_location(root)
    return root / ("delta" if kind == "delta" else "table")


def _iceberg_location(root: Path) -> Path:
    from barrierflow.connectors import open_local_catalog

    table = open_local_catalog(root / "catalog").load_table("ns.events")
    return Path(table.location().removeprefix("file://")) / "data"  # IcebergTable.data_path


def read_rows(kind: str, root: Path) -> list[dict[str, Any]]:
    """The rows the ``kind`` table under ``root`` holds, read with the format's own reader
    (pyiceberg, deltalake, pyarrow over the committed epochs' files), sorted by id."""
    if kind == "iceberg":
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        from barrierflow.connectors import open_local_catalog

        if not (root / "catalog").exists():
            return []
        try:
            table = open_local_catalog(root / "catalog").load_table("ns.events")
        except (NoSuchTableError, NoSuchNamespaceError):
            return []
        rows = table.scan().to_arrow()
    elif kind == "delta":
        from deltalake import DeltaTable

        if not (root / "delta" / "_delta_log").exists():
            return []
        rows = DeltaTable(str(root / "delta")).to_pyarrow_table()
    else:
        import pyarrow.dataset as ds

        files = sorted(str(p) for p in (root / "table").glob("epoch=*/*/*.parquet"))
        if not files:
            return []
        rows = ds.dataset(files, schema=OUT, format="parquet").to_table()
    found: list[dict[str, Any]] = rows.select(OUT.names).sort_by("id").to_pylist()
    return found


def staged_leftovers(kind: str, root: Path) -> list[str]:
    """What is left in the table's staging area (attempt directories, adopted batches)."""
    try:
        staging = table_root(kind, root) / ".staging"
    except Exception:  # no table yet: nothing staged either
        return []
    return sorted(p.name for p in staging.iterdir()) if staging.exists() else []
