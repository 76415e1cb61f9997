"""Faults of a keyed aggregate run in Spark's tasks (``run_on="executors"``): ``filter → key_by
→ aggregate (sum/count/max) → changelog_rows → a table`` (``_cluster_keyed_child.py``), its
state in vnode stores on the table's directory, against a reference computed over the whole
input. After every fault the run is held to one rule, :func:`assert_exactly_once`:

* the table's changelog is the reference's, row for row (no epoch's rows twice, none lost);
* no key has two current rows ("+I"/"+U") in one commit, and each key's last one, in commit
  order, is the reference's aggregate;
* the state store, read as of its last committed epoch, is the reference's aggregate, and that
  epoch is the table's: state and output stand at the same epoch;
* nothing is left staged, of the rows or of the state.

The faults: an executor JVM SIGKILLed mid-batch, and speculative copies of a task, on the
standalone cluster; the driver's process group SIGKILLed mid-batch, or between an epoch's state
commit and its table commit, and resumed (a local master); a rescale from 2 to 4 partitions
between runs on the cluster. The child's "gate" (see its module) is what lets a test hold a
task mid-batch. The helpers of the chain's fault tests (``test_executor_chain_faults.py``) drive
the children. Parquet and Delta tables: their commits name the epoch each row came in.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from _chain_service import KEEP, Call, ChainService, events, staged_leftovers, table_root
from _cluster_keyed_child import KEYED, TOTALS, make_keyed_table
from _timeouts import scaled
from test_executor_chain_faults import (
    CHILD_BATCHES,
    CHILD_ROWS,
    ROOT,
    FirstAttemptOfPartition1,
    child_spans,
    finished,
    kill_group,
    kill_one_executor,
    start_driver,
    stop,
    wait_held,
    write_input,
)

from barrierflow.connectors.vnode_state import VnodeStateStore
from barrierflow.spark_bridge.task_state import STATE_DIRECTORY
from barrierflow.testing.spark_cluster import StandaloneCluster

pytestmark = pytest.mark.anyio

Backend = Literal["asyncio", "trio"]
CHILD = Path(__file__).with_name("_cluster_keyed_child.py")
#: A row of the table without its op: the key and the aggregate.
Aggregate = tuple[int, int, int, int]
#: The aggregate's columns, as the table and the state store hold them.
COLUMNS = ["user", "total", "n", "top"]


def run_driver(
    master: str,
    mode: str,
    work: Path,
    service: ChainService,
    kind: str,
    backend: Backend,
    **env: str,
) -> subprocess.Popen[str]:
    """The keyed child as a process group of its own; ``env`` as ``BARRIERFLOW_KEYED_<NAME>``."""
    extra = {f"BARRIERFLOW_KEYED_{name.upper()}": value for name, value in env.items()}
    return start_driver(master, mode, work, service, kind, backend, child=CHILD, env_extra=extra)


# The reference over the whole input.


def reference(spans: Iterable[tuple[int, int]]) -> tuple[list[tuple[Any, ...]], set[Aggregate]]:
    """The changelog the pipeline writes for the micro-batches of events ``spans`` (one per
    micro-batch, in order) — each batch's keys as "+I" (new) or "-U" then "+U" — sorted, and
    the aggregate after the last batch."""
    current: dict[int, Aggregate] = {}
    changelog: list[tuple[Any, ...]] = []
    for start, count in spans:
        kept = events(start, count).filter(KEEP)
        batch = kept.group_by("user").aggregate([("id", "sum"), ("id", "count"), ("id", "max")])
        columns = (batch[c].to_pylist() for c in ("user", "id_sum", "id_count", "id_max"))
        for user, total, n, top in zip(*columns, strict=True):
            before = current.get(user)
            if before is not None:
                total, n, top = before[1] + total, before[2] + n, max(before[3], top)
            after = (user, total, n, top)
            if before is None:
                changelog.append((*after, "+I"))
            else:
                changelog += [(*before, "-U"), (*after, "+U")]
            current[user] = after
    return sorted(changelog), set(current.values())


# The table and the state read back.


def read_commits(kind: str, root: Path) -> pa.Table:
    """The table's rows with the commit that added them (``commit``: increasing from commit to
    commit). Parquet: each epoch's directory; Delta: each commit's added files, numbered by
    the epoch its commit info names, and checked against deltalake's own reader."""
    if kind == "parquet":
        parts = []
        for path in sorted((root / "table").glob("epoch=*/*/*.parquet")):
            rows = pq.read_table(path, schema=KEYED)
            commit = int(path.parent.parent.name.removeprefix("epoch="))
            parts.append(rows.append_column("commit", pa.array([commit] * len(rows), pa.int64())))
        return pa.concat_tables(parts) if parts else empty_commits()
    from deltalake import DeltaTable

    location = root / "delta"
    if not (location / "_delta_log").exists():
        return empty_commits()
    table = DeltaTable(str(location))
    parts = []
    for info in table.history():
        version = int(info["version"])
        log = (location / "_delta_log" / f"{version:020d}.json").read_text()
        for line in log.splitlines():
            action = json.loads(line)
            if "add" in action:
                rows = pq.read_table(location / action["add"]["path"], schema=KEYED)
                commit = int(info["barrierflow.epoch"])
                parts.append(
                    rows.append_column("commit", pa.array([commit] * len(rows), pa.int64()))
                )
    found = pa.concat_tables(parts) if parts else empty_commits()
    assert sorted_rows(found) == sorted_rows(table.to_pyarrow_table())
    return found


def empty_commits() -> pa.Table:
    return KEYED.append(pa.field("commit", pa.int64())).empty_table()


def sorted_rows(rows: pa.Table) -> list[tuple[Any, ...]]:
    """The rows of the table's columns as tuples, sorted (a multiset to compare)."""
    return sorted(zip(*(rows[c].to_pylist() for c in KEYED.names), strict=True))


def state_store(kind: str, root: Path) -> VnodeStateStore:
    """The aggregate's view store (under the table's directory: the bridge's default)."""
    store = VnodeStateStore.existing(table_root(kind, root) / STATE_DIRECTORY / TOTALS / "view")
    assert store is not None, "no state was ever committed"
    return store


def table_epoch(kind: str, root: Path) -> int:
    """The table's last committed epoch, as its committer reads it."""
    epoch: int = make_keyed_table(kind, root).committer().committed_epoch()
    return epoch


def assert_exactly_once(kind: str, root: Path, spans: list[tuple[int, int]]) -> None:
    """The table and the state after the micro-batches ``spans`` (see the module)."""
    changelog, final = reference(spans)
    rows = read_commits(kind, root)
    assert sorted_rows(rows) == changelog
    current = rows.filter(pc.is_in(rows["op"], pa.array(["+I", "+U"])))
    pairs = list(zip(current["user"].to_pylist(), current["commit"].to_pylist(), strict=True))
    assert len(pairs) == len(set(pairs)), "a key has two current rows in one commit"
    latest = current.sort_by([("commit", "ascending")]).to_pylist()
    last = {r["user"]: tuple(r[c] for c in COLUMNS) for r in latest}
    assert set(last.values()) == final
    store = state_store(kind, root)
    state = store.read(range(store.vnode_count), store.last_committed())
    assert set(zip(*(state[c].to_pylist() for c in COLUMNS), strict=True)) == final
    assert store.last_committed() == table_epoch(kind, root)
    assert store.staged_numbers() == []
    assert staged_leftovers(kind, root) == []


def test_the_reference_changelog_counts_each_event_once_per_batch() -> None:
    changelog, final = reference([(0, 200), (200, 200)])
    users = {user for user, *_ in final}
    assert users == set(range(3, 97))
    # Batch 0 inserts every kept user; batch 1 updates each one (-U, +U).
    ops = [row[-1] for row in changelog]
    assert (ops.count("+I"), ops.count("-U"), ops.count("+U")) == (94, 94, 94)
    kept = events(0, 400).filter(KEEP)
    assert sum(total for _, total, _, _ in final) == pc.sum(kept["id"]).as_py()
    assert sum(n for _, _, n, _ in final) == len(kept)
