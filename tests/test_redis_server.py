"""The test kit's Redis-compatible server: usable from a directory that does not exist yet."""

from __future__ import annotations

from pathlib import Path

import pytest
from _timeouts import scaled

from barrierflow.testing.redis_server import START_SECONDS, STOP_SECONDS, RedisServer

pytestmark = pytest.mark.redis


def test_a_server_starts_in_a_directory_that_does_not_exist_yet(tmp_path: Path) -> None:
    directory = tmp_path / "not" / "yet"
    server = RedisServer(
        directory, start_timeout=scaled(START_SECONDS), stop_timeout=scaled(STOP_SECONDS)
    )
    server.start()
    try:
        assert server.running
        assert directory.is_dir()
        assert server.log_path.parent == directory
    finally:
        server.stop()
    assert not server.running
