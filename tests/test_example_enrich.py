"""examples/enrich_http.py: events enriched through a real HTTP service on loopback with
async_map, exactly once into a Parquet table — undisturbed, and SIGKILLed with calls in flight
then resumed."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pyarrow.dataset as ds
import pytest
from _timeouts import scaled

pytestmark = pytest.mark.anyio

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "enrich_http.py"


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("enrich_http", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_the_example_enriches_every_event_once_through_the_service(tmp_path: Path) -> None:
    example = _example()
    verdict = await example.run(tmp_path, 300, None)
    assert verdict.startswith("VERIFIED events=300 rows=300 duplicates=0 resumed_at_batch=0")
    # Every 13th request answered 503: those calls were retried.
    retries = int(verdict.rsplit("call_retries=", 1)[1])
    assert retries >= 300 // 13
    table = ds.dataset(tmp_path / "enriched", format="parquet").to_table()
    rows = {r["event"]: r for r in table.to_pylist()}
    assert rows[40] == {
        "event": 40,
        "user": 40,
        "amount": 10.0,
        "name": "user-40",
        "tier": "pro",
    }


def _run(out: Path, backend: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLE), str(out), "--events", "500", "--backend", backend, *extra],
        capture_output=True,
        text=True,
        timeout=scaled(120),
    )


@pytest.mark.subprocess
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_example_resumes_after_a_sigkill_with_calls_in_flight_exactly_once(
    tmp_path: Path, backend: str
) -> None:
    killed = _run(tmp_path, backend, "--crash-after", "250")
    assert killed.returncode == -9, killed.stderr
    table = tmp_path / "enriched"
    before = ds.dataset(table, format="parquet").count_rows() if table.exists() else 0
    assert before < 500  # killed mid-run
    resumed = _run(tmp_path, backend)
    assert resumed.returncode == 0, resumed.stderr
    verdict = resumed.stdout.strip().splitlines()[-1]
    assert verdict.startswith("VERIFIED events=500 rows=500 duplicates=0"), verdict
    resumed_at = int(verdict.split("resumed_at_batch=")[1].split()[0])
    assert resumed_at >= 1  # batches made durable before the kill were not delivered again
