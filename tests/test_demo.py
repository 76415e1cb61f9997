"""The demo: Spark Structured Streaming → bridge → 4 writers → Iceberg, verified; a driver
SIGKILLed mid-batch, between the checkpoint and Spark's commit, or mid-commit, then resumed,
still holds every row exactly once; a driver killed while generating its input, or stopped
with Ctrl-C, resumes to the run it was asked for. Run as subprocesses (the demo kills its own
process)."""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from _timeouts import scaled

from barrierflow.app._demo_input import RunManifest, complete_input, file_name
from barrierflow.app._demo_progress import LiveProgress, RunCounts
from barrierflow.app.chaos.acts import ACTS
from barrierflow.app.chaos.audit_delta import audit_delta
from barrierflow.app.chaos.audit_iceberg import audit_iceberg
from barrierflow.app.cli import main
from barrierflow.app.demo import DemoConfig, run_demo
from barrierflow.errors import ConfigError, NotRunningError
from barrierflow.testing.clock import FakeClock

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}


def command(workdir: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "barrierflow",
        "demo",
        "--workdir",
        str(workdir),
        "--no-progress",
        *list(args),
    ]


def demo(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command(workdir, *args),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=scaled(300),
        env=ENV,
    )


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_the_demo_ends_with_a_verified_line(tmp_path: Path) -> None:
    trace = tmp_path / "trace"  # traced as the crash harness runs it
    done = subprocess.run(
        command(tmp_path / "d", "--rows", "30000", "--batches", "3"), cwd=ROOT,
        capture_output=True, text=True, timeout=scaled(300),
        env={**ENV, "BARRIERFLOW_CHAOS_TRACE": str(trace)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert lines[-1] == "VERIFIED rows_in=30000 rows_out=30000 duplicates=0 epochs=3"
    seen = {line.split()[1] for line in trace.read_text().splitlines()}
    assert {t.event for t in ACTS["spark"].targets} <= seen  # every kill point it offers


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("point", "backend"),
    [("mid-batch", "asyncio"), ("after-checkpoint", "trio"), ("mid-commit", "asyncio")],
)
def test_a_driver_killed_then_resumed_still_holds_every_row_once(
    tmp_path: Path, point: str, backend: str
) -> None:
    workdir = tmp_path / "d"
    common = ["--rows", "20000", "--batches", "4", "--backend", backend]
    crashed = demo(workdir, *common, "--crash-after", "1", "--crash-point", point)
    assert crashed.returncode == -9, crashed.stdout[-2000:] + crashed.stderr[-3000:]
    *_, crash, hint = crashed.stdout.strip().splitlines()
    assert crash.startswith("CRASH")
    # The line before the self-kill says how to continue.
    resume = "barrierflow demo --resume"
    assert hint == f"resume with: {resume} --workdir {workdir}" + (
        " --backend trio" if backend == "trio" else ""
    )
    assert "VERIFIED" not in crashed.stdout
    resumed = demo(workdir, "--resume", "--backend", backend)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    *_, totals, last = resumed.stdout.strip().splitlines()
    # One epoch per Spark micro-batch; on restart Spark may plan the remaining files into
    # fewer micro-batches than files, so count the batches Spark committed.
    batches = len(
        [p for p in (workdir / "spark-checkpoint" / "commits").iterdir() if p.name.isdigit()]
    )
    assert batches in (3, 4)
    assert last == f"VERIFIED rows_in=20000 rows_out=20000 duplicates=0 epochs={batches}"
    # The resumed run's totals count the earlier run's rows too, against the rows asked.
    assert totals.startswith("20,000 of 20,000 rows asked are in the Iceberg table")


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_delta_run_killed_mid_commit_then_resumed_holds_every_row_once(tmp_path: Path) -> None:
    from deltalake import DeltaTable

    from barrierflow.app.chaos.audit_delta import audit_delta

    workdir = tmp_path / "d"
    common = ["--rows", "20000", "--batches", "4", "--table", "delta"]
    crashed = demo(workdir, *common, "--crash-after", "1", "--crash-point", "mid-commit")
    assert crashed.returncode == -9, crashed.stdout[-2000:] + crashed.stderr[-3000:]
    assert crashed.stdout.strip().splitlines()[-2].startswith("CRASH mid-commit")
    resumed = demo(workdir, "--resume")  # the manifest says which table
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    *_, totals, last = resumed.stdout.strip().splitlines()
    table = DeltaTable(str(workdir / "delta" / "events"))
    commits = [c for c in table.history() if c.get("barrierflow.app-id") == "events"]
    assert len(commits) in (3, 4)  # one per micro-batch; a restart may plan fewer
    assert last == f"VERIFIED rows_in=20000 rows_out=20000 duplicates=0 epochs={len(commits)}"
    assert totals.startswith("20,000 of 20,000 rows asked are in the Delta table")
    assert table.transaction_version("events") == int(commits[0]["barrierflow.epoch"])
    keys = table.to_pyarrow_table(columns=["key"])["key"]
    assert sorted(keys.to_pylist()) == list(range(20000))
    assert not (workdir / "warehouse").exists()  # no Iceberg table on the side
    audit = audit_delta(workdir, complete=True)
    assert audit.clean, audit.summary()


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("table", ["iceberg", "delta"])
def test_a_run_written_on_executors_killed_mid_stage_resumes_to_every_row_once(
    tmp_path: Path, table: str
) -> None:
    workdir = tmp_path / "d"
    common = ["--rows", "20000", "--batches", "4", "--table", table, "--write-on", "executors"]
    crashed = demo(workdir, *common, "--crash-after", "1", "--crash-point", "mid-batch")
    assert crashed.returncode == -9, crashed.stdout[-2000:] + crashed.stderr[-3000:]
    # Printed by the task that kills the driver: Spark passes a Python worker's output on
    # through the JVM's stderr.
    lines = (crashed.stdout + crashed.stderr).splitlines()
    crash = lines.index("CRASH mid-batch, executors staging: SIGKILL of the driver")
    resume = f"barrierflow demo --resume --workdir {workdir} --run-on executors"
    assert lines[crash + 1] == f"resume with: {resume}"
    # Resumed through the driver: both ways commit through one coordinator, one table.
    resumed = demo(workdir, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    last = resumed.stdout.strip().splitlines()[-1]
    assert last.startswith("VERIFIED rows_in=20000 rows_out=20000 duplicates=0 "), last
    audit = (audit_delta if table == "delta" else audit_iceberg)(workdir, complete=True)
    assert audit.clean, audit.summary()


@pytest.mark.spark
@pytest.mark.timeout(600)
def test_a_run_on_executors_that_loses_a_task_s_python_worker_verifies_without_a_resume(
    tmp_path: Path,
) -> None:
    trace = tmp_path / "trace"
    args = ["--rows", "20000", "--batches", "3", "--write-on", "executors"]
    done = subprocess.run(
        command(tmp_path / "d", *args, "--crash-after", "1", "--crash-point", "executor-lost"),
        cwd=ROOT, capture_output=True, text=True, timeout=scaled(300),
        env={**ENV, "BARRIERFLOW_CHAOS_TRACE": str(trace)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == (
        "VERIFIED rows_in=20000 rows_out=20000 duplicates=0 epochs=3"
    )
    seen = {line.split()[1] for line in trace.read_text().splitlines()}
    assert {"worker-killed", "task-again"} <= seen  # the task did die, and ran again
    assert "Exception in task" not in done.stderr  # Spark's JVM trace of it is not printed
    assert {t.event for t in ACTS["spark-executors"].targets} <= seen  # its kill points


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.timeout(900)
def test_a_lost_state_store_is_refused_or_adopted_never_duplicated(tmp_path: Path) -> None:
    # The reproduction: a crashed run, then its store damaged or gone and Spark's checkpoint
    # deleted (Spark replays every batch from 0), then --resume.
    workdir = tmp_path / "d"
    crashed = demo(workdir, "--rows", "20000", "--batches", "4", "--crash-after", "2")
    assert crashed.returncode == -9, crashed.stderr[-3000:]
    shutil.rmtree(workdir / "spark-checkpoint")
    store = workdir / "state.db"
    store.write_bytes(store.read_bytes()[:1000])  # truncated: a corrupted store, refused
    truncated = demo(workdir, "--resume")
    assert truncated.returncode == 1, truncated.stderr[-3000:]
    assert "StoreCorruptedError" in truncated.stderr.strip().splitlines()[-1]
    for path in workdir.glob("state.db*"):
        path.unlink()  # gone: the table holds commits the empty store knows nothing of
    refused = demo(workdir, "--resume")
    assert refused.returncode == 1, refused.stderr[-3000:]
    assert_refused(refused, "SinkStateMismatchError", workdir)
    adopted = demo(workdir, "--resume", "--adopt-sink-positions")
    assert adopted.returncode == 0, adopted.stderr[-3000:]
    last = adopted.stdout.strip().splitlines()[-1]
    assert last.startswith("VERIFIED rows_in=20000 rows_out=20000 duplicates=0")


def assert_refused(done: subprocess.CompletedProcess[str], error: str, workdir: Path) -> None:
    """A refused resume prints the refusal and the ways on — the command that adopts the
    table's positions — and no verification (no FAILED line, no row counts)."""
    lines = done.stderr.strip().splitlines()
    refusal = next(i for i, line in enumerate(lines) if line.startswith("barrierflow demo: "))
    assert lines[refusal].startswith(f"barrierflow demo: refused: {error}: "), lines[refusal]
    adopt = f"barrierflow demo --resume --workdir {workdir} --adopt-sink-positions"
    assert any(line.strip().endswith(adopt) for line in lines[refusal + 1 :]), lines
    assert "FAILED" not in done.stdout + done.stderr
    assert "rows asked" not in done.stdout


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.timeout(900)
@pytest.mark.parametrize("first", ["refused", "adopted at once"])
def test_a_lost_spark_checkpoint_is_refused_with_its_cause_then_adopted(
    tmp_path: Path, first: str
) -> None:
    # The state store kept, Spark's checkpoint deleted: Spark's batch ids restart at 0, below
    # the store's.
    workdir = tmp_path / "d"
    crashed = demo(workdir, "--rows", "20000", "--batches", "4", "--crash-after", "2")
    assert crashed.returncode == -9, crashed.stderr[-3000:]
    shutil.rmtree(workdir / "spark-checkpoint")
    if first == "refused":  # which re-creates Spark's checkpoint, behind the store
        refused = demo(workdir, "--resume")
        assert refused.returncode == 1, refused.stderr[-3000:]
        assert_refused(refused, "SparkCheckpointBehindError", workdir)
        assert "Spark's checkpoint was lost or reset" in refused.stderr
    adopted = demo(workdir, "--resume", "--adopt-sink-positions")
    assert adopted.returncode == 0, adopted.stdout[-2000:] + adopted.stderr[-3000:]
    lines = adopted.stdout.strip().splitlines()
    aside = "Spark's checkpoint is gone or behind: the state store was set aside"
    assert any(line.startswith(aside) for line in lines)
    assert lines[-1].startswith("VERIFIED rows_in=20000 rows_out=20000 duplicates=0")
    assert list((workdir / "state-set-aside").glob("*/state.db"))  # moved, not deleted
    audit = audit_iceberg(workdir, complete=True)
    assert audit.clean, audit.summary()


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_ctrl_c_prints_one_line_saying_how_to_resume_and_exits_130(tmp_path: Path) -> None:
    workdir = tmp_path / "d"
    child = subprocess.Popen(
        command(workdir, "--rows", "20000", "--batches", "20"),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        assert child.stdout is not None
        for line in child.stdout:  # one line per micro-batch that went in
            if line.startswith("micro-batch "):
                break
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=scaled(120))
    finally:
        child.kill()
        child.wait()
    assert child.returncode == 130, err[-3000:]
    lines = err.strip().splitlines()
    resume = f"barrierflow demo --resume --workdir {workdir}"
    assert lines[-1] == f"barrierflow demo: interrupted; resume with: {resume}"
    # Spark's JVM start-up banner (about 5 lines) and that line; no Py4J or asyncio noise.
    assert len(lines) <= 8, err[-3000:]
    assert "Traceback" not in err
    assert "VERIFIED" not in out


def test_demo_config_refuses_bad_values(tmp_path: Path) -> None:
    for kwargs, name in (
        ({"rows": 0}, "rows"),
        ({"batches": 0}, "batches"),
        ({"rows": 3, "batches": 5}, "rows"),
        ({"crash_after": -1}, "crash_after"),
        ({"crash_point": "nowhere"}, "crash_point"),
        ({"backend": "curio"}, "backend"),
        ({"table": "parquet"}, "table"),
        ({"write_on": "gpu"}, "write_on"),
        ({"crash_point": "executor-lost"}, "crash_point"),  # only when writing on executors
    ):
        with pytest.raises(ConfigError) as info:
            DemoConfig(workdir=tmp_path, **kwargs)  # type: ignore[arg-type]
        assert info.value.argument == name


def test_resume_without_a_previous_run_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        run_demo(DemoConfig(workdir=tmp_path / "none", resume=True, progress=False))
    assert info.value.argument == "resume"


def test_resume_with_other_sizes_than_the_started_run_is_refused(tmp_path: Path) -> None:
    RunManifest(rows=3000, batches=3).write(tmp_path)
    for kwargs, name in (({"rows": 4000}, "rows"), ({"batches": 2}, "batches")):
        with pytest.raises(ConfigError) as info:
            run_demo(DemoConfig(workdir=tmp_path, resume=True, progress=False, **kwargs))
        assert (info.value.argument, info.value.got) == (name, kwargs[name])
    assert main(["demo", "--workdir", str(tmp_path), "--resume", "--rows", "4000"]) == 2


def test_a_resume_keeps_the_started_run_s_table_and_refuses_another(tmp_path: Path) -> None:
    iceberg_run, delta_run = tmp_path / "iceberg", tmp_path / "delta"
    RunManifest(rows=3000, batches=3).write(iceberg_run)
    RunManifest(rows=3000, batches=3, table="delta").write(delta_run)
    for workdir, started, other in (
        (iceberg_run, "iceberg", "delta"),
        (delta_run, "delta", "iceberg"),
    ):
        assert RunManifest.read(workdir).table == started
        with pytest.raises(ConfigError) as info:
            run_demo(DemoConfig(workdir=workdir, resume=True, progress=False, table=other))  # type: ignore[arg-type]
        assert (info.value.argument, info.value.got) == ("table", other)
        assert main(["demo", "--workdir", str(workdir), "--resume", "--table", other]) == 2
    # A manifest written before the choice existed names no table: an Iceberg run.
    (iceberg_run / "demo-run.json").write_text('{"rows": 3000, "batches": 3, "format": 1}')
    assert RunManifest.read(iceberg_run).table == "iceberg"


def test_a_new_run_records_the_table_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from barrierflow.app import demo as demo_module

    class StopBeforeSparkError(Exception):
        pass

    def no_spark(*args: object, **kwargs: object) -> None:
        raise StopBeforeSparkError  # the manifest and the input are written before Spark starts

    monkeypatch.setattr(demo_module, "spark_session", no_spark)
    for table in ("delta", None):
        with pytest.raises(StopBeforeSparkError):
            run_demo(DemoConfig(workdir=tmp_path, rows=300, batches=3, progress=False, table=table))
        assert RunManifest.read(tmp_path).table == (table or "iceberg")


def test_the_input_is_the_same_whichever_files_a_killed_run_left(tmp_path: Path) -> None:
    manifest = RunManifest(rows=3000, batches=3)
    complete_input(tmp_path / "whole", manifest)
    partial = tmp_path / "partial"
    complete_input(partial, manifest)
    (partial / file_name(1)).unlink()
    (partial / file_name(2)).unlink()
    (partial / f".{file_name(2)}.tmp").write_bytes(b"half a parquet file")
    assert complete_input(partial, manifest) == 2
    assert sorted(p.name for p in partial.iterdir()) == [file_name(i) for i in range(3)]
    for index in range(3):
        name = file_name(index)
        assert pq.read_table(partial / name).equals(pq.read_table(tmp_path / "whole" / name))


@pytest.mark.spark
def test_a_run_killed_while_generating_resumes_to_the_rows_asked(
    spark: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # What a driver killed after writing 1 of 3 input files leaves: the manifest, one file
    # and a half-written temporary one.
    workdir = tmp_path / "d"
    manifest = RunManifest(rows=3000, batches=3)
    manifest.write(workdir)
    complete_input(workdir / "input", RunManifest(rows=3000, batches=3))
    for index in (1, 2):
        (workdir / "input" / file_name(index)).unlink()
    (workdir / "input" / f".{file_name(1)}.tmp").write_bytes(b"PAR1 half")
    assert main(["demo", "--workdir", str(workdir), "--resume", "--no-progress"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == "VERIFIED rows_in=3000 rows_out=3000 duplicates=0 epochs=3"


def test_the_bridge_keeps_the_error_its_callback_raised_last(tmp_path: Path) -> None:
    from barrierflow.actors import BatchFeed
    from barrierflow.app.demo import SCHEMA
    from barrierflow.runtime import BlockingRuntime, Runtime, RuntimeConfig
    from barrierflow.spark_bridge import SparkBridge

    feed = BatchFeed(SCHEMA)
    handle = BlockingRuntime(Runtime(RuntimeConfig(state_path=tmp_path / "state.db")))
    bridge = SparkBridge(handle, feed)
    assert bridge.last_error is None
    with pytest.raises(NotRunningError) as info:
        bridge.callback(object(), 0)  # the runtime is not running: refused before the frame
    assert bridge.last_error is info.value


def test_progress_counts_overall_rows_against_the_rows_asked() -> None:
    counts = RunCounts(
        rows_asked=1_000,
        rows_before=400,
        rows_this_run=300,
        batches_this_run=3,
        replays_skipped=1,
        epochs_this_run=3,
        blocked_seconds=0.0,
        seconds=10.0,
    )
    assert counts.rows_overall == 700
    assert counts.rate == 30.0
    assert counts.seconds_left == 10.0  # 300 rows left at 30 rows/s


def counts_at(epochs: int, rows: int = 1_000, seconds: float = 10.0) -> RunCounts:
    return RunCounts(
        rows_asked=1_000,
        rows_before=0,
        rows_this_run=rows,
        batches_this_run=epochs,
        replays_skipped=0,
        epochs_this_run=epochs,
        blocked_seconds=0.0,
        seconds=seconds,
    )


class Terminal(io.StringIO):
    """A stream that says it is a terminal (rich then draws its live table on it)."""

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("terminal", [True, False], ids=["live table", "plain lines"])
def test_the_final_progress_is_drawn_after_the_last_commit(terminal: bool) -> None:
    # The last micro-batch returns once its checkpoint is durable; its commit lands after.
    committed = [19]
    stream = Terminal() if terminal else io.StringIO()
    progress = LiveProgress(
        True,
        lambda: counts_at(committed[0]),
        settle=lambda: committed.__setitem__(0, 20),
        stream=stream,
    )
    with progress:
        progress.refresh()
    shown = stream.getvalue()
    if terminal:
        last_table = shown[shown.rindex("epochs committed") :].splitlines()[0]
        assert re.findall(r"\d+", last_table) == ["20"]
    else:
        assert shown.splitlines()[-1].startswith("done: rows 1,000 of 1,000")
        assert "20 epochs committed" in shown.splitlines()[-1]


def test_without_a_terminal_plain_progress_lines_are_written_every_few_seconds() -> None:
    clock = FakeClock(0.0)
    stream = io.StringIO()
    now = [counts_at(0, rows=0, seconds=0.0)]
    progress = LiveProgress(True, lambda: now[0], stream=stream, every=5.0, clock=clock)
    with progress:  # a first line at once: the run has started
        for second in range(1, 12):
            clock.advance(1.0)
            now[0] = counts_at(second, rows=second * 50, seconds=float(second))
            progress.refresh()
    lines = stream.getvalue().splitlines()
    assert [line.split(":")[0] for line in lines] == ["progress"] * 3 + ["done"]
    assert lines[0].startswith("progress: rows 0 of 1,000 (0%, overall)")
    assert lines[1].startswith("progress: rows 250 of 1,000 (25%, overall)")  # at 5 s
    assert lines[2].startswith("progress: rows 500 of 1,000 (50%, overall)")  # at 10 s
    assert "11 epochs committed" in lines[3]
    assert "\x1b" not in stream.getvalue()  # no terminal codes in a log file


def test_disabled_progress_writes_nothing() -> None:
    stream = io.StringIO()
    with LiveProgress(False, lambda: counts_at(1), stream=stream) as progress:
        progress.refresh()
    assert stream.getvalue() == ""


def test_a_malformed_spark_conf_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--conf", "novalue"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("barrierflow: error: --conf")
    assert "key=value" in line


@pytest.mark.spark
def test_a_failed_run_names_the_real_error_and_ends_with_a_failed_line(
    spark: object,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from barrierflow.app import _demo_faults

    def fail_after_first(self: object) -> None:
        raise RuntimeError("injected: the driver's callback failed")

    monkeypatch.setattr(_demo_faults.Faults, "end_batch", fail_after_first)
    args = ["demo", "--workdir", str(tmp_path / "d"), "--rows", "3000", "--batches", "3"]
    assert main([*args, "--no-progress"]) == 1
    captured = capsys.readouterr()
    # Not Py4J's "An exception was raised by the Python Proxy": the callback's own error.
    assert (
        "barrierflow demo: FAILED: the streaming query failed: "
        "RuntimeError: injected: the driver's callback failed"
    ) in captured.err.splitlines()
    last = captured.out.strip().splitlines()[-1]
    # The first batch was delivered and committed before the callback failed.
    assert last == "FAILED rows_in=3000 rows_out=1000 duplicates=0 epochs=1"
