"""The ``barrierflow`` command: errors in one line with the agreed exit status, help that
describes every option, the version, and ``bench`` as ``python -m benchmarks`` itself."""

from __future__ import annotations

import argparse

import pytest

import barrierflow
from barrierflow import cli
from barrierflow.errors import ConfigError, SparkUnavailableError


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
    assert len(options) == 16
    for action in options:
        assert action.help, action.option_strings
        assert "default" in action.help, action.option_strings
    with pytest.raises(SystemExit) as info:
        cli.main(["demo", "--help"])
    assert info.value.code == 0
    shown = capsys.readouterr().out
    assert "(default: demo-data;" in shown
    assert "(default: asyncio)" in shown


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
