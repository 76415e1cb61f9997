"""The durable state store: key→value tables and versioned tables (rows by epoch, for
materialized views) that commit with checkpoints, the epoch records
that commit on their own (a coordinated sink's meta store builds on them), and the two SQLite
adapters (a worker thread with inline small commits on any backend — the default — and
aiosqlite on asyncio)."""

import typing as _typing

from barrierflow._removed import removed_names as _removed_names

#: Nothing: the state store's public names (``StateStore``, ``StateTable``) have one
#: home, :mod:`barrierflow.runtime`; the rest is the library's own.
__all__: list[str] = []

if not _typing.TYPE_CHECKING:
    # A removed name says what replaced it (see CHANGELOG.md); a type checker does not see
    # this, so it still reports a removed or misspelt name as missing.
    __getattr__ = _removed_names(__name__)
