"""What an audit finds, and the row comparison every audit shares.

An audit reads a sink's tables the way an outside reader would — pyiceberg, deltalake or
pyarrow on the files, never the pipeline's own code — and compares them with the input the run
generated:

* **lost** — input rows the table does not hold (only judged once a run has finished: a killed
  run has not delivered everything yet);
* **duplicated** — rows the table holds more often than the input has them;
* **foreign** — rows the table holds that the input never had.

Each is counted as rows, and any other broken rule (an epoch committed twice, a data file
referenced twice, files a reader sees that no commit made) is a :class:`Finding`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

__all__ = ["Audit", "Finding", "compare_rows", "lost_by", "spark_input", "spark_table"]


@final
@dataclass(frozen=True, slots=True)
class Finding:
    """A broken rule: its name and what was seen."""

    rule: str
    detail: str
    #: What the finding is about, when it is one of several alike (a table's stream).
    subject: str = ""

    def __str__(self) -> str:
        return f"{self.rule}: {self.detail}"


@final
@dataclass(slots=True)
class Audit:
    """What one audit of a run's tables found.

    Attributes:
        complete: the run had finished (so rows missing are *lost*, not merely not yet there).
        rows_in: rows the input holds (0 when the run had not generated its input yet).
        rows_out: rows the table holds.
        lost / duplicated / foreign: see the module.
        findings: every other broken rule.
        facts: figures worth reporting (snapshots, files, epochs).
    """

    complete: bool
    rows_in: int = 0
    rows_out: int = 0
    lost: int = 0
    duplicated: int = 0
    foreign: int = 0
    findings: list[Finding] = field(default_factory=list)
    facts: dict[str, int] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        """Nothing lost, duplicated or foreign, and no other finding."""
        return not (self.lost or self.duplicated or self.foreign or self.findings)

    def add(self, rule: str, detail: str, subject: str = "") -> None:
        self.findings.append(Finding(rule, detail, subject))

    def count_rows(self, expected: pa.Table, got: pa.Table, columns: Sequence[str]) -> None:
        """Compare ``got`` with ``expected`` as multisets of ``columns`` (see the module)."""
        self.rows_in, self.rows_out = expected.num_rows, got.num_rows
        lost, self.duplicated, self.foreign = compare_rows(expected, got, columns)
        if self.complete:
            self.lost = lost
        for rule, rows in (("lost", self.lost), ("duplicated", self.duplicated)):
            if rows:
                self.add(rule, f"{rows} rows")
        if self.foreign:
            self.add("foreign", f"{self.foreign} rows the input does not have")

    def count_against_input(self, expected: pa.Table | None, got: pa.Table) -> None:
        """Compare the Spark act's table ``got`` with its input ``expected`` (see
        :func:`spark_input`) as multisets of ``(key, value)``; with no whole input yet, rows in
        the table are a finding of their own."""
        if expected is not None:
            self.count_rows(expected, got, ["key", "value"])
            return
        if self.complete:
            self.add("no_input", "the run's input files are incomplete")
        self.rows_out = got.num_rows
        if got.num_rows:
            self.add("rows_without_input", f"{got.num_rows} rows before the input was whole")

    def summary(self) -> str:
        """One line: the counts and the findings."""
        head = (
            f"rows in {self.rows_in}, out {self.rows_out}; lost {self.lost}, "
            f"duplicated {self.duplicated}, foreign {self.foreign}"
        )
        others = [f for f in self.findings if f.rule not in ("lost", "duplicated", "foreign")]
        return head + "".join(f"; {f}" for f in others)


def spark_input(workdir: Path) -> pa.Table | None:
    """The Spark act's generated input (``<workdir>/input/part-*.parquet``, each whole: they
    are renamed into place), or ``None`` when the run had not written all of it yet."""
    try:
        asked = json.loads((workdir / "demo-run.json").read_text())
    except FileNotFoundError:
        return None
    files = sorted((workdir / "input").glob("part-*.parquet"))
    if len(files) < int(asked["batches"]):
        return None
    return ds.dataset([str(f) for f in files], format="parquet").to_table()


def spark_table(workdir: Path) -> str | None:
    """The table the Spark act's run in ``workdir`` recorded in its manifest (``None``: no
    run started; a manifest that names none is an Iceberg run's)."""
    try:
        asked = json.loads((workdir / "demo-run.json").read_text())
    except FileNotFoundError:
        return None
    return str(asked.get("table", "iceberg"))


def compare_rows(expected: pa.Table, got: pa.Table, columns: Sequence[str]) -> tuple[int, int, int]:
    """``(lost, duplicated, foreign)`` rows of ``got`` against ``expected``, compared as
    multisets of ``columns`` (one group-by over both; no loop per row)."""
    _, inp, out = _tally(expected, got, columns)
    lost = pc.sum(pc.max_element_wise(pc.subtract(inp, out), 0)).as_py() or 0
    has_input = pc.greater(inp, 0)
    extra = pc.max_element_wise(pc.subtract(out, inp), 0)
    duplicated = pc.sum(pc.if_else(has_input, extra, 0)).as_py() or 0
    foreign = pc.sum(pc.if_else(has_input, 0, out)).as_py() or 0
    return int(lost), int(duplicated), int(foreign)


def lost_by(
    expected: pa.Table, got: pa.Table, columns: Sequence[str], by: str
) -> dict[object, tuple[int, int]]:
    """Per value of the column ``by`` (one of ``columns``) that ``expected`` holds:
    ``(lost, expected)`` rows — the rows of ``expected`` with that value that ``got`` does
    not hold, compared as in :func:`compare_rows`, and how many ``expected`` has. A value
    with every row present is reported with ``lost == 0``."""
    counts, inp, out = _tally(expected, got, columns)
    per_group = pa.table(
        {
            by: counts[by],
            "lost": pc.max_element_wise(pc.subtract(inp, out), 0),
            "rows": inp,
        }
    ).filter(pc.greater(inp, 0))
    summed = per_group.group_by(by).aggregate([("lost", "sum"), ("rows", "sum")])
    return {
        value: (int(lost), int(rows))
        for value, lost, rows in zip(
            summed[by].to_pylist(),
            summed["lost_sum"].to_pylist(),
            summed["rows_sum"].to_pylist(),
            strict=True,
        )
    }


def _tally(
    expected: pa.Table, got: pa.Table, columns: Sequence[str]
) -> tuple[pa.Table, pa.ChunkedArray, pa.ChunkedArray]:
    """Each distinct row of ``columns`` over both tables, with how often ``expected`` (``in``)
    and ``got`` (``out``) hold it."""
    names = list(columns)
    tagged = pa.concat_tables(
        [
            expected.select(names).append_column(
                "_got", pa.array(np.zeros(len(expected), np.int64))
            ),
            got.select(names).append_column("_got", pa.array(np.ones(len(got), np.int64))),
        ],
        promote_options="permissive",
    )
    counts = tagged.group_by(names).aggregate([("_got", "sum"), ("_got", "count")])
    out = counts["_got_sum"]
    return counts, pc.subtract(counts["_got_count"], out), out
