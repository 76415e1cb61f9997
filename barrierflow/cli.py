"""The ``barrierflow`` command: the demo pipeline and the benchmark harness.

``barrierflow demo`` runs the demo pipeline (:mod:`barrierflow.demo`) and ends with one
machine-readable line, ``VERIFIED rows_in=N rows_out=N duplicates=0 epochs=K`` (or ``FAILED``
with the same fields and exit status 1). ``barrierflow bench`` runs ``python -m benchmarks``
from a checkout of the repository.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

import anyio

from barrierflow.demo import DemoResult, run_demo


def _demo(args: argparse.Namespace) -> int:
    results: list[DemoResult] = []
    for backend in args.backend:
        result = anyio.run(run_demo, args.rows, args.chunk_rows, backend=backend)
        results.append(result)
        rate = result.rows_out / result.seconds if result.seconds else 0.0
        print(
            f"[{backend:7}] {result.rows_out:,} rows in {result.epochs} epochs through "
            f"source → hash dispatch → 4 workers → aligned merge in {result.seconds:.2f} s "
            f"({rate / 1e6:.1f} M rows/s; senders blocked {result.blocked_seconds:.2f} s "
            f"in total — backpressure)"
        )
    verified = all(r.verified for r in results)
    worst = next((r for r in results if not r.verified), results[-1])
    print(worst.summary_line())
    return 0 if verified else 1


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
    demo.add_argument("--rows", type=int, default=2_000_000, help="rows to generate")
    demo.add_argument("--chunk-rows", type=int, default=4_096, help="rows per chunk")
    demo.add_argument(
        "--backend",
        action="append",
        choices=["asyncio", "trio"],
        help="async backend (repeatable; default: both)",
    )
    bench = commands.add_parser("bench", help="run the benchmark harness")
    bench.add_argument("--quick", action="store_true", help="about a second per benchmark")
    args = parser.parse_args(argv)
    if args.command == "demo":
        args.backend = args.backend or ["asyncio", "trio"]
        return _demo(args)
    return _bench(args)


if __name__ == "__main__":
    sys.exit(main())
