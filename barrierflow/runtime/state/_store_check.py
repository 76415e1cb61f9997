"""Checking an existing store file before it is opened for writing: its SQLite header and
size (cheap, catches a file cut short or not SQLite at all), then, on a read-only connection,
every page (``quick_check``) and the store's own metadata rows.

Blocking, like the rest of opening (:mod:`._store_file` runs it on a worker thread); nothing
here changes the file or its write-ahead log, so a damaged store is left as it was found.
"""

from __future__ import annotations

import os
import pathlib
import re
import sqlite3
from typing import Any

from barrierflow.runtime.state import _sql
from barrierflow.runtime.state.errors import (
    StoreCorruptedError,
    StoreFormatError,
    StoreVersionError,
)

__all__ = ["SQLITE_MAGIC", "inspect_header", "validate"]

SQLITE_MAGIC = b"SQLite format 3\x00"
_HEADER_SIZE = 100
_WAL_HEADER_SIZE = 32


def inspect_header(real: str, size: int) -> None:
    """Check that ``real`` (``size`` bytes) looks like a whole SQLite database.

    Raises:
        StoreCorruptedError: empty, cut inside the header or mid-page, an invalid page size,
            or shorter than the page count its header records.
        StoreFormatError: the file does not start like SQLite.
    """
    if size == 0:
        raise StoreCorruptedError(
            real,
            "an empty file (0 bytes): barrierflow creates stores whole, so this is not a new "
            "store but one whose content is gone",
        )
    with open(real, "rb") as handle:
        head = handle.read(_HEADER_SIZE)
    if not SQLITE_MAGIC.startswith(head[: len(SQLITE_MAGIC)]):
        raise StoreFormatError(real, "a file that is not an SQLite database")
    if size < _HEADER_SIZE:
        raise StoreCorruptedError(
            real, f"a file of {size} bytes, cut short inside the {_HEADER_SIZE}-byte SQLite header"
        )
    raw = int.from_bytes(head[16:18], "big")
    page_size = 65536 if raw == 1 else raw
    if page_size < 512 or page_size & (page_size - 1):
        raise StoreCorruptedError(real, f"an SQLite header with an invalid page size ({raw})")
    if _wal_has_frames(real):
        # SQLite replays the log over the file; whether the result is whole is checked once
        # the database is open.
        return
    if size % page_size:
        raise StoreCorruptedError(
            real, f"{size} bytes, not a whole number of {page_size}-byte pages (cut mid-page)"
        )
    pages = int.from_bytes(head[28:32], "big")
    # The header's page count is valid only when its change counter matches its
    # "version-valid-for" field (SQLite's file format, section 1.3.7).
    if head[24:28] == head[92:96] and size < pages * page_size:
        raise StoreCorruptedError(
            real,
            f"{size} bytes, but its header counts {pages} pages of {page_size} bytes "
            f"({pages * page_size} bytes): the file was cut short",
        )


def _wal_has_frames(real: str) -> bool:
    try:
        return os.stat(real + "-wal").st_size > _WAL_HEADER_SIZE
    except FileNotFoundError:
        return False


_DIGITS = re.compile(r"[0-9]+")


def _meta_int(file: str, meta: dict[Any, Any], key: str, least: int) -> int:
    value = meta.get(key)
    if value is None:
        raise StoreCorruptedError(file, f"no {key!r} row in its metadata table bf_meta")
    if not isinstance(value, str) or not _DIGITS.fullmatch(value) or int(value) < least:
        raise StoreCorruptedError(
            file, f"{key} = {value!r} in bf_meta, expected an integer >= {least}"
        )
    return int(value)


def validate(real: str) -> tuple[int, int]:
    """Check an existing store's pages and metadata; return its schema version and committed
    epoch. Read-only: SQLite neither replays nor removes the write-ahead log of a file it
    rejects."""
    db = sqlite3.connect(pathlib.Path(real).as_uri() + "?mode=ro", uri=True)
    try:
        problems = [row[0] for row in db.execute(_sql.QUICK_CHECK)]
        if problems != ["ok"]:
            shown = "; ".join(str(problem) for problem in problems[:3])
            raise StoreCorruptedError(real, f"pages SQLite's quick_check rejects ({shown})")
        tables = {row[0] for row in db.execute(_sql.LIST_TABLES)}
        if "bf_meta" not in tables:
            if tables & set(_sql.OWN_TABLES):
                found = f"a barrierflow store without its metadata table bf_meta ({sorted(tables)})"
                raise StoreCorruptedError(real, found)
            raise StoreFormatError(
                real,
                f"an SQLite database of someone else (tables {sorted(tables)})"
                if tables
                else "an SQLite database with no tables (not created by barrierflow, which "
                "creates stores whole)",
            )
        meta = dict(db.execute(_sql.READ_META).fetchall())
    finally:
        db.close()
    tag = meta.get("format")
    if tag is None and "bf_state" in tables:
        raise StoreCorruptedError(real, "no 'format' row in its metadata table bf_meta")
    if tag != _sql.FORMAT_TAG:
        raise StoreFormatError(real, f"an SQLite database with format tag {tag!r}")
    version = _meta_int(real, meta, "schema_version", 1)
    if version > _sql.SCHEMA_VERSION:
        raise StoreVersionError(real, version, _sql.SCHEMA_VERSION)
    return version, _meta_int(real, meta, "committed_epoch", 0)
