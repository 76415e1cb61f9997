"""A changelog applied to a dict, checking the emission rules of a keyed operator on the way:
an insert only of an unknown key, an update pair retracting exactly the key's row and changing
it, each key at most once per chunk (one chunk per epoch)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from barrierflow.channels import Chunk, Op

KEY = ("k",)


class Changelog:
    """Applies emitted chunks to a dict, checking the emission rules on the way."""

    def __init__(self, key: Sequence[str] = KEY) -> None:
        self.key = tuple(key)
        self.state: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.inserts = 0
        self.updates = 0

    def apply(self, chunks: Iterable[Chunk]) -> Changelog:
        for chunk in chunks:
            rows = chunk.batch.to_pylist()
            ops = chunk.ops_numpy().tolist()
            keys = [tuple(r[c] for c in self.key) for r in rows]
            i = 0
            touched: set[tuple[Any, ...]] = set()
            while i < len(rows):
                k, op = keys[i], ops[i]
                assert k not in touched, f"key {k} twice in one epoch's changelog"
                touched.add(k)
                if op == Op.INSERT:
                    assert k not in self.state, f"insert of a known key {k}"
                    self.state[k] = rows[i]
                    self.inserts += 1
                    i += 1
                    continue
                assert op == Op.UPDATE_DELETE, f"op {op} alone"
                assert ops[i + 1] == Op.UPDATE_INSERT
                assert keys[i + 1] == k
                assert self.state[k] == rows[i], "the update pair retracts another row"
                assert rows[i] != rows[i + 1], "an update pair of an unchanged row"
                self.state[k] = rows[i + 1]
                self.updates += 1
                i += 2
        return self
