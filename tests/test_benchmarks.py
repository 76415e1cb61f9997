"""The benchmark harness prints the agreed record format (speed itself is not tested here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _timeouts import scaled

ROOT = Path(__file__).resolve().parents[1]
KEYS = ["name", "value", "unit", "baseline", "ratio", "goal", "goal_on", "meets_goal"]


@pytest.mark.parametrize(
    "name",
    [
        "channel_hop_trio",
        "sink_parquet_rows_per_s",
        "add_job_latency_ms",
        "backfill_handover_ms",  # starts a Valkey server of its own
        "changelog_replay_rows_per_s",  # a versioned table in a temporary directory
    ],
)
@pytest.mark.subprocess
def test_benchmark_prints_one_json_record_per_benchmark(name: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--only", name],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=scaled(120),
    )
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.strip().splitlines()
    record = json.loads(line)
    assert [k for k in record if k != "details"] == KEYS
    assert record["name"] == name
    assert (
        record["ratio"] == record["value"] / record["baseline"]
        or abs(record["ratio"] - record["value"] / record["baseline"]) < 1e-3 * record["ratio"]
    )
    assert isinstance(record["meets_goal"], bool)


@pytest.mark.subprocess
def test_unknown_benchmark_is_refused() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--only", "nope"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert done.returncode == 2
    assert "nope" in done.stderr
