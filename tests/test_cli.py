"""The ``barrierflow`` command: errors in one line with the agreed exit status, help that
describes every option, the version, and ``bench`` as ``python -m benchmarks`` itself."""

from __future__ import annotations

import argparse

import pytest

import barrierflow
from barrierflow.app import cli
from barrierflow.errors import BatchOrderError, ConfigError, SparkUnavailableError


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    (line,) = capsys.readouterr().err.strip().splitlines()
    return line


@pytest.mark.parametrize(
    ("args", "argument"),
    [
        (["--rows", "0"], "rows"),
        (["--rows", "3", "--batches", "5"], "rows"),
        (["--crash-after", "-1"], "crash_after"),
        (["--resume"], "resume"),  # nothing started in the work directory
    ],
)
def test_a_bad_argument_is_one_line_on_stderr_and_exit_2(
    tmp_path: object, capsys: pytest.CaptureFixture[str], args: list[str], argument: str
) -> None:
    assert cli.main(["demo", "--workdir", f"{tmp_path}/d", "--no-progress", *args]) == 2
    line = one_line(capsys)
    assert line.startswith(f"barrierflow: error: {argument}: expected ")


def test_another_barrierflow_error_is_one_line_on_stderr_and_exit_1(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_spark(config: object) -> None:
        raise SparkUnavailableError("no Java runtime found", "install Java 17")

    monkeypatch.setattr(cli, "run_demo", no_spark)
    assert cli.main(["demo", "--workdir", f"{tmp_path}/d", "--no-progress"]) == 1
    assert one_line(capsys).startswith("barrierflow: error: SparkUnavailableError: ")


def demo_parser() -> argparse.ArgumentParser:
    (commands,) = (
        a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    )
    parser: argparse.ArgumentParser = commands.choices["demo"]
    return parser


def test_demo_help_describes_every_option_and_its_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    options = [a for a in demo_parser()._actions if a.option_strings and a.dest != "help"]
    assert len(options) == 22
    for action in options:
        assert action.help, action.option_strings
        assert "default" in action.help, action.option_strings
    with pytest.raises(SystemExit) as info:
        cli.main(["demo", "--help"])
    assert info.value.code == 0
    shown = capsys.readouterr().out
    assert "(default: demo-data;" in shown
    assert "(default: asyncio)" in shown
    assert "--table {iceberg,delta,postgres}" in shown
    assert "--run-on {driver,executors}" in shown


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"barrierflow {barrierflow.__version__}"


def test_bench_takes_the_same_options_as_python_m_benchmarks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from benchmarks import run

    with pytest.raises(SystemExit):
        run.main(["--help"])
    harness_help = capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    bench_help = capsys.readouterr().out
    # The same text but for the program's name (and where the usage line wraps).
    expected = harness_help.replace("python -m benchmarks", "barrierflow bench")
    assert bench_help.split() == expected.split()
    assert cli.main(["bench", "--list"]) == 0
    assert capsys.readouterr().out.split() == list(run.BENCHMARKS)


def test_a_malformed_spark_conf_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        cli._spark_conf(["novalue"])
    assert (info.value.argument, info.value.got) == ("--conf", "novalue")


# -- Spark's walls reduced to one line (issue 24, item 5) -------------------------------------


class FakeStreamingQueryError(Exception):
    """Stands in for pyspark's StreamingQueryException (which needs a JVM to build): the CLI
    tells Spark's errors by their module, and reads only their text."""


FakeStreamingQueryError.__module__ = "pyspark.errors.exceptions.captured"


def spark_wall(error_line: str) -> FakeStreamingQueryError:
    """Spark's text for a query stopped by an error raised in a ``foreachBatch`` callback (as
    pyspark 4 renders it, with ``error_line`` as the callback's error), and the JVM trace."""
    frames = "\n".join(
        f"\tat org.apache.spark.sql.execution.streaming.Frame{i}.run(Frame.scala:{i})"
        for i in range(60)
    )
    return FakeStreamingQueryError(
        "[STREAM_FAILED] Query [id = 4f0c1c2e-0000-4000-8000-000000000001, runId = "
        "4f0c1c2e-0000-4000-8000-000000000002] terminated with exception: "
        "[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function "
        "in foreach batch sink. Reason: An exception was raised by the Python Proxy. Return "
        "Message: Traceback (most recent call last):\n"
        '  File "/venv/lib/python3.11/site-packages/py4j/clientserver.py", line 644, in '
        "_call_proxy\n"
        "    return_value = getattr(self.pool[obj_id], method)(*params)\n"
        "                   ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        '  File "/venv/lib/python3.11/site-packages/pyspark/sql/utils.py", line 163, in call\n'
        "    self.func(DataFrame(jdf, wrapped_session_jdf), batch_id)\n"
        f"{error_line}\n"
        " SQLSTATE: 39000 SQLSTATE: XXKST\n"
        "=== Streaming Query ===\n"
        "Identifier: [id = 4f0c1c2e-0000-4000-8000-000000000001]\n"
        "Current State: ACTIVE\n\nJVM stacktrace:\n" + frames
    )


WALLS = {
    "timestamp time zone": (
        "barrierflow.channels.errors.SchemaMismatchError: micro-batch 0 of 'q': expected "
        "schema (ts: timestamp[us]), got schema (ts: timestamp[us, tz=UTC]); to fix: declare "
        "the feed with BatchFeed(arrow_schema_of(df))",
        "SchemaMismatchError: micro-batch 0 of 'q': expected schema (ts: timestamp[us]), got "
        "schema (ts: timestamp[us, tz=UTC]); to fix: declare the feed with "
        "BatchFeed(arrow_schema_of(df))",
    ),
    "deleted Spark checkpoint": (
        "barrierflow.actors.sources.errors.BatchOrderError: batch id of stream 'q': expected 2 "
        "(the last durable batch is 1) — this id goes backwards, got 0",
        "BatchOrderError: batch id of stream 'q': expected 2 (the last durable batch is 1) — "
        "this id goes backwards, got 0",
    ),
    "failing callback": (
        "ValueError: user code failed after batch 0",
        "ValueError: user code failed after batch 0",
    ),
}


@pytest.mark.parametrize("case", WALLS)
def test_a_spark_wall_is_one_line_naming_its_cause(
    tmp_path: object,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    case: str,
) -> None:
    error_line, cause = WALLS[case]
    wall = spark_wall(error_line)
    assert len(str(wall).splitlines()) > 70

    def fail(config: object) -> None:
        raise wall

    monkeypatch.setattr(cli, "run_demo", fail)
    assert cli.main(["demo", "--workdir", f"{tmp_path}/d", "--no-progress"]) == 1
    assert one_line(capsys) == (
        "barrierflow: error: SparkQueryFailedError: Spark streaming query "
        f"4f0c1c2e-0000-4000-8000-000000000001 stopped: {cause}"
    )


def test_verbose_prints_the_full_trace_after_the_one_line_cause(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fail(config: object) -> None:
        raise spark_wall("ValueError: user code failed after batch 0")

    monkeypatch.setattr(cli, "run_demo", fail)
    assert cli.main(["demo", "--workdir", f"{tmp_path}/d", "--no-progress", "-v"]) == 1
    first, *trace = capsys.readouterr().err.strip().splitlines()
    assert first.startswith("barrierflow: error: SparkQueryFailedError: ")
    assert first.endswith("stopped: ValueError: user code failed after batch 0")
    assert any("Traceback (most recent call last):" in line for line in trace)
    assert len(trace) > 70  # the wall itself, after the cause


def test_an_unexpected_error_is_one_line_with_a_hint_for_its_trace(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fail(config: object) -> None:
        raise KeyError("columns")

    monkeypatch.setattr(cli, "run_demo", fail)
    assert cli.main(["demo", "--workdir", f"{tmp_path}/d", "--no-progress"]) == 1
    assert one_line(capsys) == (
        "barrierflow: error: KeyError: 'columns' (unexpected: run with -v for its trace)"
    )


def test_a_failed_demo_run_prints_its_cause_first_and_its_trace_with_verbose(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from barrierflow.app.demo import DemoResult

    try:
        raise BatchOrderError("events-query", 1, 0, 2)
    except BatchOrderError as exc:
        failure = exc
    result = DemoResult(
        rows_in=10, rows_out=5, duplicates=0, missing=5, epochs=1, batches_this_run=1,
        seconds=1.0, error="the streaming query failed: " + one_line_of(failure),
        failure=failure,
    )  # fmt: skip
    monkeypatch.setattr(cli, "run_demo", lambda config: result)
    args = ["demo", "--workdir", f"{tmp_path}/d", "--no-progress"]
    assert cli.main(args) == 1
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines() == [
        "barrierflow demo: FAILED: the streaming query failed: " + one_line_of(failure)
    ]
    assert cli.main([*args, "-v"]) == 1
    first, *trace = capsys.readouterr().err.strip().splitlines()
    assert first.startswith("barrierflow demo: FAILED: the streaming query failed: ")
    assert trace[0] == "Traceback (most recent call last):"
    assert trace[-1].startswith("barrierflow.actors.sources.errors.BatchOrderError: ")


def one_line_of(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


@pytest.mark.parametrize("lost", ["state store", "Spark checkpoint"])
def test_a_refused_resume_prints_the_refusal_and_the_ways_on_not_a_failed_verification(
    tmp_path: object,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    lost: str,
) -> None:
    from pathlib import Path

    from barrierflow.app.demo import DemoConfig, DemoResult, refusal_remedies
    from barrierflow.errors import SinkStateMismatchError, SparkCheckpointBehindError

    workdir = Path(f"{tmp_path}/d")
    failure: Exception = (
        SinkStateMismatchError("demo.events", str(workdir / "state.db"), 5, {"events/q": 4})
        if lost == "state store"
        else SparkCheckpointBehindError("events-query", 4, 0, 5)
    )
    config = DemoConfig(workdir=workdir, resume=True, progress=False)
    # What a refused resume reads back: the table's rows so far, fewer than the rows asked.
    result = DemoResult(
        rows_in=400_000, rows_out=125_000, duplicates=0, missing=275_000, epochs=5,
        batches_this_run=0, seconds=1.0, error=one_line_of(failure), failure=failure,
        remedies=refusal_remedies(config, failure),
    )  # fmt: skip
    monkeypatch.setattr(cli, "run_demo", lambda config: result)
    assert cli.main(["demo", "--workdir", str(workdir), "--no-progress", "--resume"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""  # no verification: no row counts, no FAILED line
    refusal, *remedies = captured.err.strip().splitlines()
    assert refusal == "barrierflow demo: refused: " + one_line_of(failure)
    assert 1 <= len(remedies) <= 3
    adopt = f"barrierflow demo --resume --workdir {workdir} --adopt-sink-positions"
    assert any(line.endswith(f"positions the table recorded: {adopt}") for line in remedies)
    assert "FAILED" not in captured.err
