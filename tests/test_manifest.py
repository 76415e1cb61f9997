"""The commit protocol's manifest: what a writer staged, as JSON that crosses processes, and
how a committer gathers an epoch's manifests into what it persists (``gather_staged``)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from barrierflow.actors import Manifest, StagedFile
from barrierflow.actors.sinks.table import ColumnStats
from barrierflow.channels import VnodeBitmap
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.connectors._staging import gather_staged
from barrierflow.errors import SchemaEvolutionError, StagedEpochMismatchError

counts = st.integers(0, 1 << 40)
keys = st.text("abc/", min_size=1, max_size=6)
positions = st.dictionaries(keys, counts, max_size=3)
bounds = st.one_of(
    st.integers(-(1 << 60), 1 << 60),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.booleans(),
)
column_stats = st.one_of(
    st.builds(ColumnStats, counts),
    st.tuples(counts, bounds).map(lambda t: ColumnStats(t[0], t[1], t[1])),
)
files = st.builds(
    StagedFile,
    st.text("abcxyz./", min_size=1, max_size=12),
    counts,
    counts,
    st.dictionaries(st.text("abc", min_size=1, max_size=3), column_stats, max_size=3),
)
runs = st.lists(st.integers(0, 200), max_size=8, unique=True).map(
    lambda edges: tuple(zip(sorted(edges)[::2], sorted(edges)[1::2], strict=False))
)
manifests = st.builds(
    Manifest,
    st.text("0123w", min_size=1, max_size=4),
    counts,
    st.lists(files, max_size=4).map(tuple),
    runs,
    positions,
    positions,
    st.one_of(st.none(), st.just({"add_columns": [{"name": "x", "type": "int64"}]})),
)


@given(manifests)
def test_a_manifest_survives_json_unchanged(manifest: Manifest) -> None:
    # Through text, as it would cross from a Spark task or another process.
    again = Manifest.from_json(json.loads(json.dumps(manifest.to_json())))
    assert again == manifest
    assert again.rows == sum(f.rows for f in manifest.files)


@pytest.mark.parametrize(
    ("value", "argument"),
    [
        (None, "manifest"),
        ([], "manifest"),
        ({"epoch": 1}, "manifest"),  # no writer
        ({"writer": "0", "epoch": 1, "extra": 1}, "manifest"),  # an unknown key
        ({"writer": "0", "epoch": 1, "files": [{"path": "p"}]}, "file"),
        (
            {
                "writer": "0",
                "epoch": 1,
                "files": [{"path": "p", "rows": 1, "size": 1, "columns": {"c": {"min": 1}}}],
            },
            "stats",
        ),
        (
            {
                "writer": "0",
                "epoch": 1,
                "files": [
                    {"path": "p", "rows": 1, "size": 1, "columns": {"c": {"nulls": 0, "min": 1}}}
                ],
            },
            "max",
        ),
        (
            {
                "writer": "0",
                "epoch": 1,
                "files": [
                    {
                        "path": "p",
                        "rows": 1,
                        "size": 1,
                        "columns": {"c": {"nulls": 0, "min": [1], "max": [2]}},
                    }
                ],
            },
            "min",
        ),
        ({"writer": "0", "epoch": 1, "files": [{"path": "p", "rows": -1, "size": 0}]}, "rows"),
        ({"writer": "0", "epoch": -1}, "epoch"),
        ({"writer": "", "epoch": 1}, "writer"),
        ({"writer": "0", "epoch": 1, "vnodes": [[4, 4]]}, "vnodes"),
        ({"writer": "0", "epoch": 1, "positions": {"k": "1"}}, "positions"),
        ({"writer": "0", "epoch": 1, "schema_change": ["add"]}, "schema_change"),
    ],
)
def test_a_bad_manifest_is_refused_naming_what_is_wrong(value: Any, argument: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Manifest.from_json(value)
    assert info.value.argument == argument


def test_a_manifest_from_before_file_statistics_still_reads() -> None:
    older = {"writer": "0", "epoch": 1, "files": [{"path": "p", "rows": 3, "size": 9}]}
    (file,) = Manifest.from_json(older).files
    assert (file.path, file.rows, file.size, dict(file.columns)) == ("p", 3, 9, {})
    assert file.to_json() == older["files"][0]  # and writes back the same


@pytest.mark.parametrize(
    ("arguments", "argument"),
    [
        ((-1,), "nulls"),
        ((0, 1), "max"),  # one bound without the other
        ((0, float("inf"), 1.0), "min"),
        ((0, 1, b"x"), "max"),
    ],
)
def test_column_stats_refuse_what_has_no_json_form(arguments: Any, argument: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        ColumnStats(*arguments)
    assert info.value.argument == argument


@given(st.lists(st.booleans(), min_size=1, max_size=64))
def test_vnode_runs_cover_exactly_the_bitmap(mask: list[bool]) -> None:
    bitmap = VnodeBitmap(np.array(mask))
    covered = [v for first, end in bitmap.runs() for v in range(first, end)]
    assert covered == bitmap.vnodes()
    # Runs are maximal: two runs never touch.
    assert all(a[1] < b[0] for a, b in zip(bitmap.runs(), bitmap.runs()[1:], strict=False))


def staged(writer: str, epoch: int, *rows: int, **extra: Any) -> Manifest:
    parts = tuple(
        StagedFile(f".staging/{epoch:020d}/w{writer}/part-{i}.parquet", n, 10 * n)
        for i, n in enumerate(rows)
    )
    return Manifest(writer, epoch, parts, **extra)


def test_gather_staged_joins_every_writers_files_rows_and_positions() -> None:
    metadata = gather_staged(
        "t",
        7,
        evolves=False,
        manifests=[
            staged("0", 3, 2, 5, positions={"s/a": 4}, positions_from={"s/a": 1}),
            staged("1", 3, 1, positions={"s/a": 4, "s/b": 2}, positions_from={"s/a": 1}),
        ],
    )
    assert metadata == {
        "staging_epoch": 3,
        "paths": [
            f".staging/{3:020d}/w0/part-0.parquet",
            f".staging/{3:020d}/w0/part-1.parquet",
            f".staging/{3:020d}/w1/part-0.parquet",
        ],
        "rows": 8,
        "files": {
            f".staging/{3:020d}/w{w}/part-{i}.parquet": {
                "path": f".staging/{3:020d}/w{w}/part-{i}.parquet",
                "rows": n,
                "size": 10 * n,
            }
            for w, i, n in (("0", 0, 2), ("0", 1, 5), ("1", 0, 1))
        },
        "positions": {"s/a": 4, "s/b": 2},
        "positions_from": {"s/a": 1},
    }


def test_gather_staged_has_nothing_to_commit_without_files_unless_the_schema_changes() -> None:
    assert gather_staged("t", 7, [staged("0", 3), staged("1", 3)], evolves=True) is None
    change = {"add_columns": [{"name": "x", "type": "int64"}]}
    metadata = gather_staged("t", 7, [staged("0", 3, schema_change=change)], evolves=True)
    assert metadata is not None
    assert (metadata["paths"], metadata["schema_change"]) == ([], change)


def test_gather_staged_refuses_writers_that_staged_different_epochs() -> None:
    with pytest.raises(StagedEpochMismatchError):
        gather_staged("t", 7, [staged("0", 3, 1), staged("1", 4, 1)], evolves=True)


def test_gather_staged_checks_the_schema_change_for_every_table_once() -> None:
    drop = {"drop": "id"}
    with pytest.raises(SchemaEvolutionError):  # a table that cannot evolve refuses any change
        gather_staged("t", 7, [staged("0", 3, 1, schema_change={"add_columns": []})], evolves=False)
    with pytest.raises(InvalidArgumentError):  # one that evolves takes add_columns only
        gather_staged("t", 7, [staged("0", 3, 1, schema_change=drop)], evolves=True)
