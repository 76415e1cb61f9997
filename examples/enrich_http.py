"""Enrich events through an HTTP service with ``async_map``, exactly once into a Parquet table.

    python examples/enrich_http.py OUT [--events 1000] [--backend asyncio|trio]
                                       [--crash-after N]

The example starts a small user-profile service on loopback (the standard library's
``http.server``, one thread per connection; every 13th request answers 503, as a flaky service
does), then runs a graph: a :class:`~barrierflow.actors.BatchFeed` source of numbered event
batches → ``async_map`` calling ``GET /users/<id>`` for every event, 32 requests in flight →
an exactly-once :class:`~barrierflow.connectors.ParquetTable` in ``OUT/enriched``. The client is
a few lines of HTTP/1.1 over anyio's TCP streams, so it runs on asyncio and on trio alike.

``--crash-after N`` kills the process with SIGKILL once the service has answered N requests —
with calls in flight and a batch half enriched. Run it again without the flag: it resumes after
the last durable batch (the feed knows it from the state store in ``OUT/state.db``), calls
the service again for the rows that were lost, and ends with the same table as an undisturbed
run: ``VERIFIED events=… rows=… duplicates=0``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pyarrow.dataset as ds

from barrierflow.actors import BatchFeed, add_sink
from barrierflow.connectors import ParquetTable
from barrierflow.operators.async_map import async_map
from barrierflow.runtime import Runtime, RuntimeConfig

EVENTS = pa.schema([("event", pa.int64()), ("user", pa.int64()), ("amount", pa.float64())])
ENRICHED = pa.schema([*EVENTS, pa.field("name", pa.string()), pa.field("tier", pa.string())])
BATCH_ROWS = 100
TIERS = ("free", "pro", "team")


class ServiceError(Exception):
    """The service answered with an error status (async_map retries the call)."""


# The service: a thread on loopback.


class _Profiles(BaseHTTPRequestHandler):
    answered = 0
    crash_after: int | None = None
    lock = threading.Lock()

    def do_GET(self) -> None:
        with _Profiles.lock:
            _Profiles.answered += 1
            count = _Profiles.answered
        if _Profiles.crash_after is not None and count > _Profiles.crash_after:
            os.kill(os.getpid(), signal.SIGKILL)  # a crash with calls in flight
        user = int(self.path.rsplit("/", 1)[1])
        status, body = (503, b"busy") if count % 13 == 0 else (200, _profile(user))
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet


def _profile(user: int) -> bytes:
    return json.dumps({"name": f"user-{user}", "tier": TIERS[user % 3]}).encode()


@contextmanager
def profile_service(crash_after: int | None) -> Iterator[tuple[str, int]]:
    """The service running on a free loopback port: ``(host, port)``."""

    class Server(ThreadingHTTPServer):
        request_queue_size = 128  # as many connects at once as calls in flight
        daemon_threads = True

    _Profiles.answered, _Profiles.crash_after = 0, crash_after
    server = Server(("127.0.0.1", 0), _Profiles)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield "127.0.0.1", server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


# The client: HTTP/1.1 over an anyio TCP stream, one connection per request.


async def get_json(host: str, port: int, path: str) -> dict[str, Any]:
    """``GET path`` and its JSON body; raises :class:`ServiceError` unless the status is 200."""
    async with await anyio.connect_tcp(host, port) as stream:
        request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n"
        await stream.send(request.encode())
        response = b"".join([part async for part in stream])  # to the server's close
    head, _, body = response.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if status != 200:
        raise ServiceError(f"GET {path}: HTTP {status}")
    result: dict[str, Any] = json.loads(body)
    return result


# The pipeline.


def events(batch_id: int) -> pa.Table:
    """Batch ``batch_id`` of the events (the same on every run, as a replayable upstream)."""
    first = batch_id * BATCH_ROWS
    ids = list(range(first, first + BATCH_ROWS))
    return pa.table(
        {"event": ids, "user": [i % 97 for i in ids], "amount": [i / 4 for i in ids]}, EVENTS
    )


async def run(out: Path, total: int, crash_after: int | None) -> str:
    """Deliver ``total`` events (whole batches) through the graph; returns the verdict."""
    with profile_service(crash_after) as (host, port):

        async def enrich(event: dict[str, Any]) -> dict[str, Any]:
            profile = await get_json(host, port, f"/users/{event['user']}")
            return {**event, "name": profile["name"], "tier": profile["tier"]}

        feed = BatchFeed(EVENTS, chunk_rows=BATCH_ROWS)
        rt = Runtime(RuntimeConfig(state_path=out / "state.db", recovery=True))
        rt.add_source("events", feed.source)
        rt.add_actor(
            "enrich",
            async_map(enrich, schema=ENRICHED, concurrency=32, timeout=5.0),
            inputs=["events"],
        )
        add_sink(rt, "enriched", ParquetTable(out / "enriched", ENRICHED), input="enrich")
        async with rt:
            last = await feed.last_batch("events", rt)
            start = 0 if last is None else last + 1
            for batch_id in range(start, -(-total // BATCH_ROWS)):
                await feed.deliver(rt, "events", batch_id, events(batch_id))
            retries = rt.stats().metric(
                "barrierflow_operator_call_retries", actor="enrich", operator="async_map"
            )
    return verify(out, total, start, retries or 0)


def verify(out: Path, total: int, start: int, retries: float) -> str:
    """Every event once in the table, with its user's profile."""
    table = ds.dataset(out / "enriched", schema=ENRICHED, format="parquet").to_table()
    ids = table.column("event").to_pylist()
    users = table.column("user").to_pylist()
    duplicates = len(ids) - len(set(ids))
    right = table.column("name").to_pylist() == [f"user-{u}" for u in users]
    expected = -(-total // BATCH_ROWS) * BATCH_ROWS
    ok = sorted(ids) == list(range(expected)) and right
    return (
        f"{'VERIFIED' if ok else 'MISMATCH'} events={expected} rows={len(ids)} "
        f"duplicates={duplicates} resumed_at_batch={start} call_retries={int(retries)}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the run's directory (state and table)")
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument("--crash-after", type=int, default=None, metavar="N")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    verdict = anyio.run(run, args.out, args.events, args.crash_after, backend=args.backend)
    print(verdict)
    return 0 if verdict.startswith("VERIFIED") else 1


if __name__ == "__main__":
    sys.exit(main())
