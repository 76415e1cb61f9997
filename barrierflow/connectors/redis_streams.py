"""A split log over Redis (or Valkey) streams: one stream key per split.

**Splits.** A split is a stream key, named by the key itself (decoded as UTF-8). The log is
given either an explicit list of keys (``splits=``) or a glob (``pattern=``, listed with
``SCAN MATCH <pattern> TYPE stream``). Either way a split is a key that *exists and holds a
stream* now: Redis creates a stream on its first ``XADD`` (or ``XGROUP CREATE ... MKSTREAM``),
and a missing key is indistinguishable from a key never meant to be one, so asking for it
raises :class:`~barrierflow.actors.sources.errors.UnknownSplitError`. :meth:`list_splits`
names the keys that hold a stream now; the keys the log was declared with, existing or not, are
its :attr:`~RedisStreamLog.declared_splits`, so a
:class:`~barrierflow.actors.SplitSource` reading every split of it refuses a key that
does not exist (a typo reads nothing for ever) unless told to wait for it
(``wait_for_splits=True``); a log declared by a pattern has no declared splits: a source
discovers the streams that appear later.

**Offsets.** An entry id ``<ms>-<seq>`` is the offset ``Offset(ms, seq)``, compared as
numbers (``9-0`` before ``10-0``).

**Payload.** Each entry's fields are the payload's columns (field name = column name; other
fields are ignored). Values arrive as bytes and are cast per batch, one Arrow cast per column:
binary columns keep the bytes, string columns are checked as UTF-8, every other type is
parsed from the text (``"42"``, ``"2.5"``, ``"true"``, ISO timestamps). A missing field is
null in a nullable column; in a non-nullable one, and for a value that does not parse, the
read raises :class:`~barrierflow.connectors.errors.SplitLogRecordError` naming the stream,
entry id and field.

**Latest offset.** The id of the last *existing* entry (``XREVRANGE key + - COUNT 1``), not
``XINFO STREAM``'s ``last-generated-id``: when the last entry is deleted, that id is never
delivered again, and a backfill waiting to read it would never finish.

**Reading.** One command serves the history and the live tail: ``XREAD COUNT n BLOCK ms
STREAMS <keys> <ids>`` with each split's last read id. ``XREAD`` is exclusive of the ids it is
given (on every Redis ≥ 5), returns at once while any split has entries after its id, and
waits at most ``block_ms`` otherwise, so a cancelled read is released promptly. The call runs
on a worker thread (abandoned on cancellation: it returns within ``block_ms`` and its result
is dropped). Each split's offsets are checked to increase strictly
(:class:`~barrierflow.actors.sources.errors.OffsetOrderError` otherwise).

**Trimmed history.** Before reading (and again after every reconnection) each split with a
start offset is checked with ``XINFO STREAM``. A stream only loses its head to trimming
(``XTRIM``, ``XADD MAXLEN/MINID``), and Redis does not record which ids a trim removed
(``max-deleted-entry-id`` records ``XDEL`` only), so the check is: the stream has lost entries
(``entries-added`` > ``length``; not checked before Redis 7) and no longer retains the start
entry nor anything before it — its first entry is after the start, or it is empty while its
``last-generated-id`` is after the start. Then records after the start may have been trimmed
unread: with ``on_trimmed="error"`` (the default) the read raises
:class:`~barrierflow.actors.sources.errors.OffsetTrimmedError`; with ``"skip"`` it goes on
from the first retained entry. It errs towards reporting: a stream trimmed exactly through
the start (a consumer's ``XTRIM MINID``) is reported too. A deleted *last* entry is not a
gap (the first entry is still at or before the start), and entries deleted one by one
(``XDEL``) from the middle of the retained history cannot be told from ids never used.

**A server that goes away.** Every call is retried on a connection error after the library's
one retry schedule, the seed's (:class:`RetryBackoff`: 10 ms, 100 ms, 1 s, then at most 2 s,
each times a jitter draw in [0, 1), for 30 s after the first failure by default — the bound is
time, not a count, so a server back within 30 s is always found again; the policy and its
loop are in :mod:`barrierflow.connectors._redis_retry`). Each failed attempt
logs one warning (logger ``barrierflow.split_log``: attempt, wait, cause). Past the bound the
call raises :class:`~barrierflow.connectors.errors.SplitLogUnavailableError`. A read resumes
from its last delivered id per split, so nothing is lost or read twice across a reconnection.
A client built from a URL has redis-py's own retries turned off (they would add unbounded
hidden delays); a client from a factory should do the same.

**Lag** (:meth:`RedisStreamLog.records_after`). Redis cannot count the entries after an id
without reading them, so the log keeps what Redis keeps for a consumer group: an entry's *rank*,
how many entries were ever added up to it, and a reader at rank ``r`` lags
``entries-added - r`` behind (``XINFO STREAM``, one call per split). A read learns the rank of
its start where Redis states it — from before the first retained entry (``entries-added -
length``) or from the last one (``entries-added``) — and carries it forward: each batch it
yields adds the rows it holds per split, so the rank of every batch's last offset is known (the
positions a source stops at; the log remembers the latest 4096 per split). A position past the
last entry lags 0 and one before the first lags the whole stream. Anything else is ``None``, as
Redis reports no lag for a group then: a read that started in the middle of a stream until it
catches up with the last entry (so too a read after a reconnection: the server may be another
one), a stream with entries deleted one by one (``XDEL``) after the position, a Redis before 7
(no ``entries-added``).

**Lifecycle.** The log owns its client: close it with :meth:`RedisStreamLog.aclose` (or use
the log as an async context manager). Server calls run on worker threads behind a per-log
:class:`anyio.CapacityLimiter` (or the one given), one thread per call in flight.
"""

from __future__ import annotations

import fnmatch
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, TypeVar, final

import anyio
import anyio.lowlevel
import anyio.to_thread
import pyarrow as pa

from barrierflow._extras import require
from barrierflow.actors.sources.errors import (
    OffsetTrimmedError,
    UnknownSplitError,
)
from barrierflow.actors.sources.split_log import Offset, split_ends, split_log_schema
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.connectors._redis_decode import decode_entries
from barrierflow.connectors._redis_retry import RetryBackoff, RetryHook, call_with_retry

if TYPE_CHECKING:
    import redis

__all__ = ["RedisStreamLog", "RetryBackoff"]

T = TypeVar("T")

_MAX_BATCH_ROWS = 1 << 24
_FIRST_ID = "0-0"  # XADD refuses 0-0, so "after 0-0" is every entry
#: How many offsets' ranks the log remembers per split (see the module: lag).
_RANKS_KEPT = 4096


@final
@dataclass(frozen=True, slots=True)
class _StreamInfo:
    """What ``XINFO STREAM`` says of one stream that the lag needs."""

    length: int
    added: int | None  # entries-added (Redis >= 7)
    first: Offset | None  # the first and last existing entries
    last: Offset | None
    generated: Offset | None  # last-generated-id
    deleted: Offset | None  # max-deleted-entry-id (XDEL), None when 0-0 or unknown

    @classmethod
    def of(cls, info: Mapping[str, Any]) -> _StreamInfo:
        def entry_id(value: Any) -> Offset | None:
            return None if value is None else Offset.parse(bytes(value).decode())

        first, last = info.get("first-entry"), info.get("last-entry")
        deleted = entry_id(info.get("max-deleted-entry-id"))
        added = info.get("entries-added")
        return cls(
            length=int(info["length"]),
            added=None if added is None else int(added),
            first=entry_id(first[0]) if first else None,
            last=entry_id(last[0]) if last else None,
            generated=entry_id(info.get("last-generated-id")),
            deleted=None if deleted == Offset(0, 0) else deleted,
        )

    def rank_before_first(self) -> int | None:
        """The rank of anything before the first existing entry: every entry added and no
        longer here was before it, unless entries were deleted one by one after it."""
        if self.added is None or (
            self.deleted is not None and self.first is not None and self.deleted > self.first
        ):
            return None
        return self.added - self.length


@final
class _Ranks:
    """The ranks of the latest offsets a read reached in one split (see the module: lag)."""

    def __init__(self) -> None:
        self._ranks: OrderedDict[Offset, int] = OrderedDict()

    def get(self, offset: Offset) -> int | None:
        return self._ranks.get(offset)

    def put(self, offset: Offset, rank: int) -> None:
        self._ranks[offset] = rank
        self._ranks.move_to_end(offset)
        if len(self._ranks) > _RANKS_KEPT:
            self._ranks.popitem(last=False)


@final
class RedisStreamLog:
    """A :class:`~barrierflow.actors.sources.split_log.SplitLog` over Redis streams (see the
    module docstring for the decisions: split naming, latest offset, trimming, retries).

    Args:
        connection: a ``redis://`` URL, or a factory returning a ``redis.Redis`` client
            (``decode_responses`` off). The log owns the client either way.
        splits: the stream keys of the log (exactly one of ``splits`` and ``pattern``).
        pattern: a glob selecting the stream keys of the log (``SCAN MATCH``).
        payload: the payload schema: one column per entry field.
        block_ms: how long one ``XREAD`` waits for new entries; also how long a cancelled
            read's worker thread lingers.
        on_trimmed: ``"error"`` to raise
            :class:`~barrierflow.actors.sources.errors.OffsetTrimmedError` when a start
            offset's history was trimmed, ``"skip"`` to read on from the first retained entry.
        backoff: how long (30 s after the first failure by default) and how often a call is
            retried while the server is unreachable; each failed attempt logs a warning.
        on_retry: called before each retry's wait with the retry number, the wait and the
            connection error (tests, metrics; the warning is logged either way).
        limiter: the worker threads' limiter (default: a limiter of 4 threads for this log).

    Raises:
        InvalidArgumentError: a bad argument.
        MissingExtraError: redis-py is not installed (``pip install 'barrierflow[redis]'``).
    """

    def __init__(
        self,
        connection: str | Callable[[], redis.Redis],
        *,
        payload: pa.Schema,
        splits: Sequence[str] | None = None,
        pattern: str | None = None,
        block_ms: int = 200,
        on_trimmed: Literal["error", "skip"] = "error",
        backoff: RetryBackoff | None = None,
        on_retry: RetryHook | None = None,
        limiter: anyio.CapacityLimiter | None = None,
    ) -> None:
        self._schema = split_log_schema(payload, "payload")
        self._fields = [(field.name.encode(), field) for field in payload]
        if (splits is None) == (pattern is None):
            raise InvalidArgumentError(
                "splits/pattern", "exactly one of splits= and pattern=", (splits, pattern)
            )
        if splits is not None:
            if isinstance(splits, str | bytes) or not isinstance(splits, Sequence):
                raise InvalidArgumentError("splits", "a sequence of stream keys", splits)
            keys = list(splits)
            if not keys or not all(isinstance(k, str) and k for k in keys):
                raise InvalidArgumentError("splits", "non-empty stream key strings", splits)
            if len(set(keys)) != len(keys):
                raise InvalidArgumentError("splits", "distinct stream keys", splits)
            self._splits: list[str] | None = keys
        else:
            self._splits = None
        if pattern is not None and (not isinstance(pattern, str) or not pattern):
            raise InvalidArgumentError("pattern", "a non-empty glob", pattern)
        self._pattern = pattern
        if type(block_ms) is not int or not 1 <= block_ms <= 60_000:
            raise InvalidArgumentError("block_ms", "an int in 1..60000", block_ms)
        self._block_ms = block_ms
        if on_trimmed not in ("error", "skip"):
            raise InvalidArgumentError("on_trimmed", "'error' or 'skip'", on_trimmed)
        self._on_trimmed = on_trimmed
        if backoff is not None and not isinstance(backoff, RetryBackoff):
            raise InvalidArgumentError("backoff", "a RetryBackoff", backoff)
        self._backoff = backoff or RetryBackoff()
        if on_retry is not None and not callable(on_retry):
            raise InvalidArgumentError("on_retry", "a callable or None", on_retry)
        self._on_retry = on_retry
        if limiter is not None and not isinstance(limiter, anyio.CapacityLimiter):
            raise InvalidArgumentError("limiter", "an anyio.CapacityLimiter", limiter)
        self._limiter = limiter
        self._client = self._make_client(connection, block_ms)
        kwargs = self._client.connection_pool.connection_kwargs
        self._name = f"redis://{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"
        self._name += f"/{kwargs.get('db', 0)}"
        self._closed = False
        self._ranks: dict[str, _Ranks] = {}

    def __repr__(self) -> str:
        """The server and the streams, as a log line names the log: ``RedisStreamLog(
        'redis://host:6379/0', pattern='orders-*')`` (no password)."""
        streams = f"splits={self._splits!r}" if self._splits is not None else ""
        streams = streams or f"pattern={self._pattern!r}"
        return f"RedisStreamLog({self._name!r}, {streams})"

    @staticmethod
    def _make_client(connection: str | Callable[[], redis.Redis], block_ms: int) -> redis.Redis:
        # redis-py is the [redis] extra: imported when a log is built, never at module import.
        client_class: type[redis.Redis] = require("redis", "redis").Redis
        if isinstance(connection, str):
            retry = require("redis", "redis.retry").Retry
            no_backoff = require("redis", "redis.backoff").NoBackoff
            try:
                made = client_class.from_url(
                    connection,
                    protocol=2,
                    retry=retry(no_backoff(), 0),
                    socket_connect_timeout=5.0,
                    socket_timeout=block_ms / 1000 + 5.0,
                )
            except ValueError as exc:
                raise InvalidArgumentError("connection", "a redis:// URL", connection) from exc
            return made
        if not callable(connection):
            raise InvalidArgumentError("connection", "a URL or a client factory", connection)
        client = connection()
        if not isinstance(client, client_class):
            raise InvalidArgumentError("connection", "a factory of redis.Redis", client)
        if client.connection_pool.connection_kwargs.get("decode_responses"):
            client.close()
            raise InvalidArgumentError("connection", "a client with decode_responses off", client)
        return client

    @property
    def schema(self) -> pa.Schema:
        """The batches' schema: the payload, then the split and offset columns."""
        return self._schema

    @property
    def declared_splits(self) -> tuple[str, ...] | None:
        """The stream keys given as ``splits=``, whether they exist or not (``None``: the log
        was declared with ``pattern=``)."""
        return None if self._splits is None else tuple(self._splits)

    async def aclose(self) -> None:
        """Close the client (idempotent). A read still running fails with a connection
        error."""
        if not self._closed:
            self._closed = True
            self._client.close()
        await anyio.lowlevel.checkpoint()

    async def __aenter__(self) -> RedisStreamLog:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- the protocol ---------------------------------------------------------------------

    async def list_splits(self) -> list[str]:
        """The stream keys of the log that exist now (configured order; sorted for a pattern).

        Raises:
            SplitLogUnavailableError: the server stayed unreachable past the retry bound.
        """
        await anyio.lowlevel.checkpoint_if_cancelled()
        splits, _ = await self._call(self._existing_splits)
        return splits

    async def latest_offset(self, split: str) -> Offset | None:
        """The id of ``split``'s last existing entry, ``None`` if the stream is empty.

        Raises:
            InvalidArgumentError: ``split`` is not a str.
            UnknownSplitError: ``split`` is not a stream key of the log.
            SplitLogUnavailableError: the server stayed unreachable past the retry bound.
        """
        if not isinstance(split, str):
            raise InvalidArgumentError("split", "a stream key (str)", split)
        await anyio.lowlevel.checkpoint_if_cancelled()
        latest, _ = await self._call(partial(self._latest, split))
        return latest

    async def records_after(self, split: str, offset: Offset | None) -> int | None:
        """How many of ``split``'s entries are after ``offset`` (``None``: all it holds), or
        ``None`` when Redis cannot tell (see the module: lag). One ``XINFO STREAM``.

        Raises:
            InvalidArgumentError: ``split`` is not a str, or ``offset`` not an Offset or None.
            UnknownSplitError: ``split`` is not a stream key of the log.
            SplitLogUnavailableError: the server stayed unreachable past the retry bound.
        """
        if not isinstance(split, str):
            raise InvalidArgumentError("split", "a stream key (str)", split)
        if offset is not None and not isinstance(offset, Offset):
            raise InvalidArgumentError("offset", "an Offset or None", offset)
        await anyio.lowlevel.checkpoint_if_cancelled()
        info, _ = await self._call(partial(self._info, split))
        if info.last is None or offset is None or (info.first is not None and offset < info.first):
            return info.length
        if offset >= info.last:
            if offset == info.generated and info.added is not None:
                self._ranks_of(split).put(offset, info.added)  # a read that caught up
            return 0
        rank = self._ranks_of(split).get(offset)
        if (
            rank is None
            or info.added is None
            or (info.deleted is not None and info.deleted > offset)
        ):
            return None
        return info.added - rank

    def read(
        self, start: Mapping[str, Offset | None], *, batch_rows: int = 4096
    ) -> AsyncGenerator[pa.RecordBatch, None]:
        """Read ``start``'s splits from after each offset (``None``: from the first entry),
        then follow them for ever; each batch holds at most ``batch_rows`` rows and may mix
        splits.

        Cancellation: the ``XREAD`` in flight is abandoned (its result is dropped). Close the
        generator when done (``contextlib.aclosing``), as with any async generator.

        Raises:
            InvalidArgumentError: ``start`` is not a non-empty mapping of str to
                ``Offset | None``, or ``batch_rows`` is not a positive int (raised at once).
            UnknownSplitError: a split that is not a stream key of the log.
            OffsetTrimmedError: a start offset's history was trimmed (``on_trimmed="error"``).
            OffsetOrderError: a split's ids did not increase.
            SplitLogRecordError: an entry does not fit the payload schema.
            SplitLogUnavailableError: the server stayed unreachable past the retry bound.
        """
        if not isinstance(start, Mapping) or not start:
            raise InvalidArgumentError("start", "a non-empty mapping of split to offset", start)
        for split, offset in start.items():
            if not isinstance(split, str):
                raise InvalidArgumentError("start", "split names (str)", split)
            if offset is not None and not isinstance(offset, Offset):
                raise InvalidArgumentError(f"start[{split!r}]", "an Offset or None", offset)
        if type(batch_rows) is not int or not 1 <= batch_rows <= _MAX_BATCH_ROWS:
            raise InvalidArgumentError("batch_rows", f"an int in 1..{_MAX_BATCH_ROWS}", batch_rows)
        return self._read(dict(start), batch_rows)

    async def _read(
        self, last: dict[str, Offset | None], batch_rows: int
    ) -> AsyncGenerator[pa.RecordBatch, None]:
        infos, _ = await self._call(partial(self._check_start, dict(last)))
        #: The rank of each split's last offset read, where known (see the module: lag).
        ranks = {
            split: (offset, self._start_rank(split, offset, infos[split]))
            for split, offset in last.items()
        }
        while True:
            fetched, recovered = await self._call(
                partial(self._fetch, dict(last), batch_rows), abandon=True
            )
            if recovered:
                # The server came back: it may be another one, or have lost or trimmed data.
                await self._call(partial(self._check_start, dict(last)))
                # Ranks counted on the old one mean nothing here: relearned on catching up.
                for split in last:
                    self._ranks.pop(split, None)
                    ranks[split] = (last[split], None)
            if not fetched:
                continue
            for split, _, offset in fetched:
                last[split] = offset
            batches = [batch for _, batch, _ in fetched]
            if len(batches) > 1 or batches[0].num_rows > batch_rows:
                table = pa.Table.from_batches(batches, schema=self._schema).combine_chunks()
                batches = table.to_batches(max_chunksize=batch_rows)
            for batch in batches:
                self._count(batch, ranks)
                yield batch

    def _ranks_of(self, split: str) -> _Ranks:
        ranks = self._ranks.get(split)
        if ranks is None:
            ranks = self._ranks[split] = _Ranks()
        return ranks

    def _start_rank(self, split: str, start: Offset | None, info: _StreamInfo | None) -> int | None:
        """The rank of a read's start, where Redis states it or an earlier read learned it."""
        if info is None:
            return None
        if start is None or info.first is None or start < info.first:
            # Whatever was removed before the first entry is lost to the read: not lag.
            return info.rank_before_first()
        if start == info.generated and info.added is not None:
            return info.added
        return self._ranks_of(split).get(start)

    def _count(
        self, batch: pa.RecordBatch, ranks: dict[str, tuple[Offset | None, int | None]]
    ) -> None:
        """Carry each split's rank over ``batch`` and remember the rank of its last offset (a
        rank unknown so far is looked up again: :meth:`records_after` learns it once the read
        caught up)."""
        for split, (offset, rows) in split_ends(batch).items():
            book = self._ranks_of(split)
            previous, rank = ranks[split]
            if rank is None and previous is not None:
                rank = book.get(previous)
            if rank is not None:
                rank += rows
                book.put(offset, rank)
            ranks[split] = (offset, rank)

    # -- calls to the server --------------------------------------------------------------

    async def _call(
        self, fn: Callable[[redis.Redis], T], *, abandon: bool = False
    ) -> tuple[T, bool]:
        """``fn(client)`` on a worker thread, retried per the backoff on connection errors.
        Returns the result and whether a retry was needed."""
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(4)
        call = partial(
            anyio.to_thread.run_sync, fn, self._client, limiter=self._limiter,
            abandon_on_cancel=abandon,
        )  # fmt: skip
        return await call_with_retry(
            call, self._backoff, name=self._name, closed=lambda: self._closed,
            on_retry=self._on_retry,
        )  # fmt: skip

    def _known(self, split: str) -> bool:
        if self._splits is not None:
            return split in self._splits
        assert self._pattern is not None
        # Redis globs negate a class with [^...]; fnmatch with [!...].
        return fnmatch.fnmatchcase(split, self._pattern.replace("[^", "[!"))

    def _existing_splits(self, client: redis.Redis) -> list[str]:
        c: Any = client
        if self._splits is None:
            keys = c.scan_iter(match=self._pattern, count=1000, _type="stream")
            return sorted({bytes(key).decode() for key in keys})
        with c.pipeline(transaction=False) as pipe:
            for key in self._splits:
                pipe.type(key)
            types = pipe.execute()
        return [key for key, kind in zip(self._splits, types, strict=True) if kind == b"stream"]

    def _require(self, client: redis.Redis, split: str) -> None:
        c: Any = client
        if not self._known(split) or c.type(split) != b"stream":
            raise UnknownSplitError(split, self._existing_splits(client))

    def _latest(self, split: str, client: redis.Redis) -> Offset | None:
        self._require(client, split)
        c: Any = client
        entries = c.xrevrange(split, "+", "-", count=1)
        return Offset.parse(bytes(entries[0][0]).decode()) if entries else None

    def _info(self, split: str, client: redis.Redis) -> _StreamInfo:
        self._require(client, split)
        info = self._try_info(split, client)
        if info is None:  # deleted since ``_require`` looked: no stream of the log any more
            raise UnknownSplitError(split, self._existing_splits(client))
        return info

    def _try_info(self, split: str, client: redis.Redis) -> _StreamInfo | None:
        """``XINFO STREAM`` of ``split`` (``None``: the key holds no stream)."""
        c: Any = client
        try:
            return _StreamInfo.of(c.xinfo_stream(split))
        except require("redis", "redis.exceptions").ResponseError:
            return None

    def _check_start(
        self, start: dict[str, Offset | None], client: redis.Redis
    ) -> dict[str, _StreamInfo | None]:
        """Check each start against the trimmed history (see the module); returns what
        ``XINFO STREAM`` said of each split (``None``: nothing, for a start from the first
        entry, which needs no check)."""
        infos: dict[str, _StreamInfo | None] = {}
        for split, offset in start.items():
            if offset is None:
                # Read from the first entry whatever is there; XINFO only for the lag's rank.
                self._require(client, split)
                infos[split] = self._try_info(split, client)
                continue
            info = infos[split] = self._info(split, client)
            if self._on_trimmed == "skip":
                continue
            if info.added is not None and info.added == info.length:
                continue  # nothing was ever removed (Redis >= 7 / Valkey)
            if info.first is None:
                trimmed = info.generated is not None and info.generated > offset
            else:
                trimmed = info.first > offset
            if trimmed:
                raise OffsetTrimmedError(split, offset, info.first)
        return infos

    def _fetch(
        self, last: dict[str, Offset | None], count: int, client: redis.Redis
    ) -> list[tuple[str, pa.RecordBatch, Offset]]:
        c: Any = client
        streams = {split: _FIRST_ID if o is None else str(o) for split, o in last.items()}
        reply = c.xread(streams, count=count, block=self._block_ms)
        pairs = reply.items() if isinstance(reply, dict) else (reply or [])
        fetched = []
        for key, entries in pairs:
            if entries:
                split = bytes(key).decode()
                batch, offset = decode_entries(
                    split, entries, last[split], self._fields, self._schema
                )
                fetched.append((split, batch, offset))
        return fetched
