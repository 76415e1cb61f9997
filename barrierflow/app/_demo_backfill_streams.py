"""The Redis side of the demo's second act (:mod:`barrierflow.app.demo_backfill`): the run's
manifest, the server it starts (and the one a crashed run left behind), and the producer that
appends records to the streams.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import redis

from barrierflow._fs import write_atomically
from barrierflow.app._demo_runs import check_sizes, read_manifest
from barrierflow.app._trace import trace

__all__ = ["MANIFEST", "Manifest", "Producer", "server", "stop_left_behind", "top_up"]

#: The run's record of what it was asked for, in its work directory.
MANIFEST = "demo-backfill.json"
#: Records the producer appends per stream in one round.
ROUND = 1_000


@dataclass(frozen=True, slots=True)
class Manifest:
    """What a run was asked for, and the server it started (written when it starts)."""

    streams: int
    history: int
    live: int
    #: The server given by the user, or ``None`` for the one started in the work directory.
    redis_url: str | None
    #: The process id of the server the run started (to stop it when a resume begins).
    server_pid: int | None = None

    def write(self, workdir: Path) -> None:
        write_atomically(workdir / MANIFEST, json.dumps(asdict(self)).encode())

    @classmethod
    def read(cls, workdir: Path) -> Manifest:
        return read_manifest(cls, workdir, MANIFEST, "backfill")

    def check(self, config: Any) -> None:
        """Refuse a resume that asks for other sizes than the started run's."""
        check_sizes(self, config, ("streams", "history", "live"))


def stop_left_behind(workdir: Path, manifest: Manifest) -> None:
    """Kill the server a crashed run started and left running (its data is on disk)."""
    if manifest.server_pid is not None:
        from barrierflow.testing.redis_server import kill_left_behind

        kill_left_behind(manifest.server_pid, workdir / "valkey")


@contextmanager
def server(workdir: Path, manifest: Manifest) -> Iterator[str]:
    """The run's server: the user's, or one started in ``workdir`` (persistent: a resume
    restarts it on its append-only file). The manifest is written once it runs."""
    if manifest.redis_url is not None:
        manifest.write(workdir)
        yield manifest.redis_url
        return
    from barrierflow.testing.redis_server import RedisServer

    server = RedisServer(workdir / "valkey", persistent=True)
    server.directory.mkdir(parents=True, exist_ok=True)
    server.start()
    try:
        Manifest(**{**asdict(manifest), "server_pid": server.pid}).write(workdir)
        yield server.url
    finally:
        server.stop()


def top_up(client: redis.Redis, keys: list[str], goal: int, most: int) -> int:
    """Append records to every stream holding fewer than ``goal``, at most ``most`` each (one
    pipeline); returns how many were appended. A stream's ``i``-th record has the key
    ``i * streams + stream`` and the value ``i``, so a resumed producer continues each stream
    where it stopped and never writes a record twice."""
    pipe = client.pipeline(transaction=False)
    appended = 0
    for stream, key in enumerate(keys):
        length = int(client.xlen(key))
        for i in range(length, min(goal, length + most)):
            pipe.xadd(key, {"key": i * len(keys) + stream, "value": i})
            appended += 1
            if len(pipe) >= 10_000:
                pipe.execute()
    pipe.execute()
    return appended


class Producer:
    """Appends rounds of records to every stream until each holds the run's total."""

    def __init__(self, url: str, keys: list[str], goal: int) -> None:
        self._client = redis.Redis.from_url(url, protocol=2)
        self._keys = keys
        self._goal = goal
        self.rounds = 0
        self.done = anyio.Event()
        self._round = anyio.Event()

    async def run(self) -> None:
        try:
            while await anyio.to_thread.run_sync(
                functools.partial(top_up, self._client, self._keys, self._goal, ROUND)
            ):
                self.rounds += 1
                trace("producer-round", self.rounds)
                self._round.set()
                self._round = anyio.Event()
                await anyio.sleep(0.01)
        finally:
            self._client.close()
        self.done.set()
        self._round.set()

    async def wait_rounds(self, rounds: int) -> None:
        """Until ``rounds`` rounds have been appended (or the producer is done)."""
        while self.rounds < rounds and not self.done.is_set():
            await self._round.wait()
