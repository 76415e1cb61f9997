"""Benchmarks of barrierflow, each against a baseline measured in the same process.

Run ``python -m benchmarks [--quick] [--only NAME[,NAME]]``; see ``benchmarks/README.md``.
"""

from benchmarks.run import BENCHMARKS, main, run_benchmarks

__all__ = ["BENCHMARKS", "main", "run_benchmarks"]
