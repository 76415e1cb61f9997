"""Select, run and print the benchmarks: ``python -m benchmarks [--quick] [--only NAME[,NAME]]``
(also ``barrierflow bench``, which forwards its arguments to :func:`main`)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.async_map import BENCHMARKS as ASYNC_MAP_BENCHMARKS
from benchmarks.channels import BENCHMARKS as CHANNEL_BENCHMARKS
from benchmarks.coordinator import BENCHMARKS as COORDINATOR_BENCHMARKS
from benchmarks.harness import Settings
from benchmarks.jobs import BENCHMARKS as JOB_BENCHMARKS
from benchmarks.keyed_aggregate import BENCHMARKS as KEYED_AGGREGATE_BENCHMARKS
from benchmarks.metrics import BENCHMARKS as METRICS_BENCHMARKS
from benchmarks.operators import BENCHMARKS as OPERATOR_BENCHMARKS
from benchmarks.runtime import BENCHMARKS as RUNTIME_BENCHMARKS
from benchmarks.sinks import BENCHMARKS as SINK_BENCHMARKS
from benchmarks.sources import BENCHMARKS as SOURCE_BENCHMARKS
from benchmarks.spark_bridge import BENCHMARKS as SPARK_BRIDGE_BENCHMARKS
from benchmarks.spark_chain import BENCHMARKS as SPARK_CHAIN_BENCHMARKS
from benchmarks.spark_keyed import BENCHMARKS as SPARK_KEYED_BENCHMARKS
from benchmarks.views import BENCHMARKS as VIEW_BENCHMARKS
from benchmarks.windows import BENCHMARKS as WINDOW_BENCHMARKS

BENCHMARKS = {
    **CHANNEL_BENCHMARKS,
    **RUNTIME_BENCHMARKS,
    **JOB_BENCHMARKS,
    **SINK_BENCHMARKS,
    **COORDINATOR_BENCHMARKS,
    **SOURCE_BENCHMARKS,
    **VIEW_BENCHMARKS,
    **SPARK_BRIDGE_BENCHMARKS,
    **SPARK_CHAIN_BENCHMARKS,
    **SPARK_KEYED_BENCHMARKS,
    **METRICS_BENCHMARKS,
    **OPERATOR_BENCHMARKS,
    **KEYED_AGGREGATE_BENCHMARKS,
    **WINDOW_BENCHMARKS,
    **ASYNC_MAP_BENCHMARKS,
}

__all__ = ["BENCHMARKS", "main", "run_benchmarks"]


def _select(only: set[str] | None) -> list[str]:
    if only is None:
        return list(BENCHMARKS)
    unknown = sorted(only - BENCHMARKS.keys())
    if unknown:
        raise ValueError(f"unknown benchmark(s) {unknown}; known: {sorted(BENCHMARKS)}")
    return [name for name in BENCHMARKS if name in only]


def run_benchmarks(
    quick: bool,
    only: set[str] | None,
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run the selected benchmarks (all when ``only`` is ``None``), in a fixed order.

    Each record is passed to ``on_record`` as soon as it is measured, then all are returned.

    Raises:
        ValueError: ``only`` names an unknown benchmark.
    """
    settings = Settings(quick=quick)
    records = []
    for name in _select(only):
        record = BENCHMARKS[name](settings)
        records.append(record)
        if on_record is not None:
            on_record(record)
    return records


def _print_record(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def main(argv: Sequence[str] | None = None, *, prog: str = "python -m benchmarks") -> int:
    """The command line of ``python -m benchmarks`` and of ``barrierflow bench`` (one parser
    for both: the CLI forwards its arguments here with its own ``prog``); returns the exit
    status (1 with ``--strict`` if a goal is missed, 2 for bad arguments)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Benchmark barrierflow against in-process baselines; one JSON line each.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="about a second per benchmark instead of several"
    )
    parser.add_argument(
        "--only", metavar="NAME[,NAME]", help=f"run only these, of: {', '.join(BENCHMARKS)}"
    )
    parser.add_argument("--list", action="store_true", help="print the benchmark names and exit")
    parser.add_argument(
        "--strict", action="store_true", help="exit with status 1 when a goal is not met"
    )
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(BENCHMARKS))
        return 0
    only = None
    if args.only is not None:
        only = {name.strip() for name in args.only.split(",") if name.strip()}
        if not only:
            parser.error("--only needs at least one name")
        unknown = sorted(only - BENCHMARKS.keys())
        if unknown:
            parser.error(f"unknown benchmark(s): {', '.join(unknown)}")
    records = run_benchmarks(args.quick, only, on_record=_print_record)
    if args.strict and not all(r["meets_goal"] for r in records):
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
