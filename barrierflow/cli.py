"""The ``barrierflow`` command: the demo pipeline and the benchmark harness.

``barrierflow demo`` runs the demo pipeline (:mod:`barrierflow.demo`: Spark Structured
Streaming → the Spark bridge → 4 parallel writers → an Iceberg table, exactly once) and ends
with one machine-readable line, ``VERIFIED rows_in=N rows_out=N duplicates=0 epochs=K`` (or
``FAILED`` with the same fields and exit status 1). ``--crash-after N`` kills the driver
mid-run; ``--resume`` continues and verifies again. ``barrierflow bench`` runs
``python -m benchmarks`` from a checkout of the repository.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

from barrierflow.demo import CRASH_POINTS, DemoConfig, run_demo


def _demo(args: argparse.Namespace) -> int:
    conf = {}
    for item in args.conf or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            print(f"barrierflow demo: --conf expects key=value, got {item!r}", file=sys.stderr)
            return 2
        conf[key] = value
    config = DemoConfig(
        workdir=Path(args.workdir),
        rows=args.rows,
        batches=args.batches,
        backend=args.backend,
        spark_master=args.spark_master,
        spark_conf=conf,
        crash_after=args.crash_after,
        crash_point=args.crash_point,
        resume=args.resume,
        progress=not args.no_progress,
    )
    result = run_demo(config)
    print(
        f"{result.rows_out:,} rows in the Iceberg table, {result.epochs} epochs committed; "
        f"{result.batches_this_run} micro-batches this run in {result.seconds:.1f} s; "
        f"duplicates {result.duplicates}, missing {result.missing}"
    )
    if result.error is not None:
        print(f"barrierflow demo: {result.error}", file=sys.stderr)
    print(result.summary_line())
    return 0 if result.verified else 1


def _bench(args: argparse.Namespace) -> int:
    try:
        bench = importlib.import_module("benchmarks.run")
    except ImportError:
        print(
            "barrierflow bench: the benchmark harness lives in the repository's benchmarks/ "
            "folder; run this from the root of a checkout",
            file=sys.stderr,
        )
        return 2
    forwarded = ["--quick"] if args.quick else []
    return int(bench.main(forwarded))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``barrierflow`` command; returns the exit status."""
    parser = argparse.ArgumentParser(prog="barrierflow", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run the demo pipeline and verify its output")
    demo.add_argument("--rows", type=int, default=1_000_000, help="events to generate")
    demo.add_argument("--batches", type=int, default=20, help="micro-batches (input files)")
    demo.add_argument("--workdir", default="demo-data", help="input, state, table, checkpoints")
    demo.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    demo.add_argument("--spark-master", help="Spark master URL (default: local[2])")
    demo.add_argument("--conf", action="append", help="Spark configuration key=value")
    demo.add_argument(
        "--crash-after", type=int, help="SIGKILL the driver during micro-batch N of this run"
    )
    demo.add_argument("--crash-point", choices=CRASH_POINTS, default="mid-batch")
    demo.add_argument("--resume", action="store_true", help="continue from a crashed run")
    demo.add_argument("--no-progress", action="store_true", help="no live progress display")
    bench = commands.add_parser("bench", help="run the benchmark harness")
    bench.add_argument("--quick", action="store_true", help="about a second per benchmark")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return _demo(args)
    return _bench(args)


if __name__ == "__main__":
    sys.exit(main())
