"""The Spark demo's chain (``barrierflow demo spark --chain``): the events pass three actors on
their way from the feed to the table — ``filter → async_map → map_batches`` — which, with
``--run-on executors``, run inside Spark's tasks (:mod:`barrierflow.spark_bridge.chain`).

The ``async_map`` calls a real HTTP service, :class:`EchoService`, a thread of the demo's
driver on loopback (the executors of a local master, or of a standalone cluster on the same
machine, reach it there): each call POSTs a batch of events as JSON and gets them back. The
chain keeps every event as it is (the filter keeps every key, which is never negative; the
service echoes; the map puts the columns in the table's order) so that the demo's verification
and the chaos harness's audit stay what they are — every key of the input exactly once, with
its value — while every row crosses three actors and a network call in the tasks. That is the
point of the act ``spark-chain`` of :mod:`barrierflow.app.chaos.acts`: a kill lands while
Spark's tasks run the chain, with calls in flight.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self, final

import anyio
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.app._demo_input import SCHEMA
from barrierflow.operators import async_map
from barrierflow.operators.stream import Stream

__all__ = ["EchoService", "declare_chain"]

#: Events per call of the service.
CALL_ROWS = 512
#: Calls in flight per task (or per actor, on the driver).
CONCURRENCY = 8


@final
class EchoService:
    """An HTTP service on a free loopback port answering ``POST /echo`` with its JSON body,
    as a thread of this process; a context manager that stops it."""

    def __init__(self) -> None:
        class Echo(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                json.loads(body)  # a malformed request fails here, not downstream
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 128

        self._server = Server(("127.0.0.1", 0), Echo)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="demo-echo", daemon=True
        )
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)``."""
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def close(self) -> None:
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


class ServiceError(Exception):
    """The echo service answered with a status other than 200 (async_map retries the call)."""


@final
@dataclass(frozen=True, slots=True)
class EchoCall:
    """The async_map function: a batch of events through the service at ``host:port`` and
    back (HTTP/1.1 over an anyio TCP stream, one connection per call, on the task runtime's
    backend). A class of this module, so that Spark ships it by reference: the executors
    import barrierflow."""

    host: str
    port: int

    async def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        body = json.dumps(batch.to_pydict()).encode()
        head = (
            f"POST /echo HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: "
            f"application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        async with await anyio.connect_tcp(self.host, self.port) as stream:
            await stream.send(head.encode() + body)
            response = b"".join([part async for part in stream])  # to the server's close
        status_line, _, rest = response.partition(b"\r\n")
        status = int(status_line.split(b" ", 2)[1])
        if status != 200:
            raise ServiceError(f"POST /echo: HTTP {status}")
        echoed = json.loads(rest.partition(b"\r\n\r\n")[2])
        return pa.RecordBatch.from_pydict(echoed, schema=SCHEMA)


def in_table_order(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The events with the table's columns, in its order (the map_batches step)."""
    return batch.select(SCHEMA.names)


def declare_chain(rt: Any, source: str, service: tuple[str, int]) -> str:
    """Declare the chain reading ``source`` on ``rt``: ``filter`` (every key, none is
    negative) → ``async_map`` through the service at ``service`` → ``map_batches``; returns
    the name of its last step, the sink's input."""
    enrich = async_map(
        EchoCall(*service), schema=SCHEMA, batch_size=CALL_ROWS, concurrency=CONCURRENCY
    )
    chain = (
        Stream(rt, source)
        .filter(pc.field("key") >= 0, name="chain.filter")
        .apply("chain.echo", enrich)
        .map_batches(in_table_order, schema=SCHEMA, name="chain.map")
    )
    return chain.name
