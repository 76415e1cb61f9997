"""The source backfill actor (after RisingWave's ``source_backfill_executor.rs``): a job added to
a running pipeline sees a live source's **history** and then its live records, each once.

The actor reads two sides at once: its input ``upstream`` (the live split source's output,
shared with every job that reads the source) and its own **backfill reader** of the same split
log, from the first record of each split. Upstream is always preferred when both are ready
(a busy source only slows the backfill; its barriers are never starved). Per split the state
machine of :mod:`.source_backfill_state` decides which side a record comes from; this module
drives it:

* **Start.** The first barrier (the job's ``Add``) passes first. The actor's splits come from
  ``Add``'s split assignment for it, else from the ``splits=`` argument, else from the log —
  in a parallel group, the log's splits whose records its input routes to it.
  States are restored from the actor's ``backfill`` table (a split without one starts
  ``BACKFILLING(None)``); for each split still backfilling, the log's latest offset becomes the
  target — ``None`` (an empty split) finishes it at once.
* **Splits created later.** A live source that discovers splits (rule 10 of
  :mod:`~barrierflow.actors.sources.split_source`) starts reading a split created after this
  actor listed the log's splits at a later barrier, from its first record. An actor that took
  its splits from the listing adopts such a split when its first rows arrive from the upstream:
  ``FINISHED`` at once (it has no history before the job's first barrier; see
  :mod:`.source_backfill_state`), its state put with those rows — in the forwarding stage too,
  so that a restart does not backfill it again. A split that existed at the listing is
  backfilled as any other, whenever the live source starts reading it. An actor given its
  splits (``Add``, ``splits=``) refuses rows of another split
  (:class:`~barrierflow.channels.errors.ProtocolError`).
* **Barriers.** At each barrier: the states are put in the table (sealed with the barrier, so
  recovery resumes from them); ``Pause``/``Resume`` pause the backfill reader (upstream keeps
  flowing), ``Throttle`` rebuilds it with the new rate; progress (rows read, per-split phase) is
  reported with the barrier; a split change (``SourceChangeSplit`` trims the dropped splits'
  states, ``Update`` keeps them) applies *after* the barrier is passed, and rebuilds the reader.
* **Watermarks** from upstream are dropped while backfilling.
* **Self-pause.** A backfill batch arriving more than ``wait_barrier_intervals`` barrier
  intervals after the last barrier (on the actor's ``clock``) is still handled, then pauses the
  reader until the next barrier, so the backfill does not run away from the live stream.
* **A target never delivered.** A split whose backfill did not move between two barriers is
  checked against the log's latest offset: if the backfill has read everything there is, its
  history is done (the record it waited for was deleted) and it waits for the upstream.
* **Reader errors** rebuild the reader from the latest states, after a doubling backoff, at
  most ``max_reader_retries`` times in a row (then the actor fails with the last error).
* **Ready.** As soon as every split is ``CACHING_UP`` or ``FINISHED`` the actor reports itself
  finished (``wait_ready()`` returns: a quiet split must not block it for ever) and drops its
  reader. It leaves the backfill stage only when every split of **every actor of its parallel
  group** is ``FINISHED`` — it first waits for a checkpoint holding everyone's state, then reads
  its peers' committed states (an empty set of states is never "all finished"): a split that
  migrates from a peer may still need backfilling.
* **Forwarding stage.** Afterwards it forwards the upstream as is (watermarks too) and still
  applies split changes: a new split is ``FINISHED`` (the live source has all of it), a split
  migrated from a peer must be ``FINISHED`` too
  (:class:`~barrierflow.actors.backfill.errors.UnfinishedSplitMigratedError` otherwise: this
  stage reads no history).

**Parallelism.** Several actors backfill one source when the job declares them with
``parallelism=N, key=["_split"]``: the live source's records are hash-dispatched by split, so
each split's records reach one actor, and that actor owns the split (the same hash decides,
at every restart). A group dispatched round robin or by other columns is refused when the job
is added (:class:`~barrierflow.errors.GraphError`, argument ``key``). A split change must keep
a split with the actor its records reach (rescaling the group is not supported yet).

The upstream must carry the split log's columns (``_split``, ``_offset_major``,
``_offset_minor``) — a :class:`~barrierflow.actors.sources.split_source.SplitSource` does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, final

import anyio
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.actors.backfill._backfill_stage import (
    TABLE,
    UPSTREAM,
    BackfillStage,
    Reading,
    apply_change,
    ask_lag,
    committed_states,
    put_states,
)
from barrierflow.actors.backfill.errors import UnfinishedSplitMigratedError
from barrierflow.actors.backfill.source_backfill_state import (
    BackfillPhase,
    SplitBackfill,
    SplitBackfills,
)
from barrierflow.actors.sources.split_log import SPLIT_COLUMN, SplitLog
from barrierflow.actors.sources.split_metrics import SplitMetrics
from barrierflow.channels.barrier import Barrier
from barrierflow.channels.chunk import Chunk
from barrierflow.channels.errors import InvalidArgumentError, ProtocolError
from barrierflow.channels.messages import Message
from barrierflow.channels.mutation import check_rate
from barrierflow.channels.vnode import compute_vnodes
from barrierflow.runtime.actor import ActorContext, StreamActor
from barrierflow.runtime.errors import GraphError
from barrierflow.runtime.metrics import MetricFamily
from barrierflow.runtime.placement import Placement
from barrierflow.runtime.startup import StartupContext
from barrierflow.runtime.state.state_store import StateTable

__all__ = ["SourceBackfill"]


@final
class SourceBackfill(StreamActor):
    """Backfills a split log's history into a job, then forwards the live source (see the
    module).

    Args:
        log: the split log the live source reads.
        splits: the splits this actor owns when no ``Add`` assignment names them (default: the
            log's, listed at the first barrier, and each split created later whose rows the
            upstream delivers).
        batch_rows: rows per batch of the backfill reader.
        rate_limit: rows per second of the backfill reader (``None``: unlimited; 0: paused).
        wait_barrier_intervals: barrier intervals without a barrier after which the reader
            pauses itself (the seed's ``WAIT_BARRIER_MULTIPLE_TIMES``, 5).
        max_reader_retries: reader failures in a row before the actor fails.
        retry_delay: the first backoff delay after a reader failure (doubling).
        clock: the monotonic clock (seconds) the self-pause measures the time since the last
            barrier with (default: the event loop's, :func:`anyio.current_time`); a test passes
            a :class:`~barrierflow.testing.FakeClock` to move time without sleeping.

    Raises:
        InvalidArgumentError: a bad argument.
    """

    #: Rows by key: parallel instances are hash-dispatched by the key add_actor names.
    placement = Placement.KEYED

    aligned_inputs = False
    backfills = True

    def __init__(
        self,
        log: SplitLog,
        *,
        splits: Sequence[str] | None = None,
        batch_rows: int = 4096,
        rate_limit: float | None = None,
        wait_barrier_intervals: int = 5,
        max_reader_retries: int = 5,
        retry_delay: float = 0.05,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if not isinstance(log, SplitLog):
            raise InvalidArgumentError("log", "a SplitLog", type(log).__name__)
        if splits is not None and (
            not isinstance(splits, list | tuple)
            or not all(isinstance(s, str) and s for s in splits)
        ):
            raise InvalidArgumentError("splits", "None or a sequence of split names", splits)
        for name, value in (
            ("batch_rows", batch_rows),
            ("wait_barrier_intervals", wait_barrier_intervals),
            ("max_reader_retries", max_reader_retries),
        ):
            if type(value) is not int or value < 1:
                raise InvalidArgumentError(name, "a positive int", value)
        check_rate("rate_limit", rate_limit)
        if isinstance(retry_delay, bool) or not isinstance(retry_delay, int | float):
            raise InvalidArgumentError("retry_delay", "seconds (a number > 0)", retry_delay)
        if not 0 < retry_delay < 3600:
            raise InvalidArgumentError("retry_delay", "seconds in (0, 3600)", retry_delay)
        if clock is not None and not callable(clock):
            raise InvalidArgumentError("clock", "None or a callable returning seconds", clock)
        self._splits = None if splits is None else list(splits)
        self._reading = Reading(
            log=log,
            batch_rows=batch_rows,
            rate=rate_limit,
            wait_intervals=wait_barrier_intervals,
            max_retries=max_reader_retries,
            retry_delay=float(retry_delay),
            clock=anyio.current_time if clock is None else clock,
        )
        self._split_metrics = SplitMetrics(log, "backfill")
        #: The run's actor name and split states, once it started (its metrics' sources).
        self._name = ""
        self._states: SplitBackfills | None = None

    # Metrics.

    def metric_families(self) -> list[MetricFamily]:
        """History records read and lag per split (see
        :mod:`~barrierflow.actors.sources.split_metrics`): a split past its history (caching
        up, finished) lags 0."""
        if self._states is None:
            return []
        for split, state in self._states.states.items():
            self._split_metrics.set_read(split, state.consumed_rows)
        return self._split_metrics.families(self._name)

    async def refresh_metrics(self) -> None:
        """Ask the log how far behind each split still backfilling is."""
        if self._states is not None:
            await ask_lag(self._split_metrics, self._states)

    # The run.

    async def run(self, ctx: ActorContext) -> None:
        """Pass the first barrier, backfill until every split of every peer finished, then
        forward the upstream (see the module)."""
        upstream = (
            ctx.inputs[UPSTREAM] if UPSTREAM in ctx.inputs else next(iter(ctx.inputs.values()))
        )
        first = await upstream.receive()
        if not isinstance(first, Barrier):
            raise ProtocolError(
                f"source backfill {ctx.name}: expected a barrier first, got {first!r}"
            )
        table = ctx.table(TABLE)
        committed = {k: SplitBackfill.from_json(v) for k, v in (await table.items()).items()}
        owned = first.initial_splits(ctx.actor_id)
        listed = owned is None and self._splits is None
        if owned is not None:
            names = [s.split_id for s in owned]
        elif self._splits is not None:
            names = list(self._splits)
        else:
            names = _routed_here(ctx, await self._reading.log.list_splits())
        states = SplitBackfills(
            {s: committed.get(s, SplitBackfill()) for s in names}, adopt_new_splits=listed
        )
        self._name, self._states = ctx.name, states
        for split in states.unfinished():
            states.set_target(split, await self._reading.log.latest_offset(split))
        put_states(table, states)
        await ctx.emit(first)
        if ctx.finished:
            return
        stage = BackfillStage(
            self._reading,
            ctx,
            table,
            states,
            paused=first.is_pause_on_startup(),
            metrics=self._split_metrics,
        )
        left = await stage.run(upstream)
        if left:
            await self._forward(ctx, table, stage.states, upstream)

    def check_startup(self, ctx: StartupContext) -> None:
        """Refuse a parallel group whose input is not keyed by the split column: a split's
        live records must reach the actor that backfills it.

        Raises:
            GraphError: a parallel group whose input is dispatched round robin, or
                hash-dispatched by other columns.
        """
        if len(ctx.peers) <= 1 and ctx.input_key is None:
            return
        if ctx.input_key != (SPLIT_COLUMN,):
            raise GraphError(
                "key",
                f"[{SPLIT_COLUMN!r}] for the parallel source backfill {ctx.name} (each split's "
                "records must reach one actor)",
                "a round-robin input" if ctx.input_key is None else list(ctx.input_key),
            )

    async def _forward(
        self, ctx: ActorContext, table: StateTable, states: SplitBackfills, upstream: Any
    ) -> None:
        """The forwarding stage: the upstream as it is, split changes still applied."""
        put_states(table, states)  # FINISHED everywhere, durable with the next barrier
        while not ctx.finished:
            try:
                message: Message = await upstream.receive()
            except anyio.EndOfStream:
                return
            if not isinstance(message, Barrier):
                if isinstance(message, Chunk) and states.adopt_new_splits:
                    self._adopt(table, states, message)
                await ctx.emit(message)
                continue
            await ctx.emit(message)
            new = message.new_splits(ctx.actor_id)
            if new is not None and not ctx.finished:
                committed = await committed_states(ctx)
                for split in (s.split_id for s in new):
                    state = committed.get(split)
                    # The seed: a split migrated here in the forwarding stage must be finished
                    # — this stage reads no history, so adopting an unfinished one would skip
                    # the rest of its history (a split new to the job has no state and is
                    # FINISHED: the live source has all of it).
                    if (
                        split not in states.states
                        and state is not None
                        and state.phase is not BackfillPhase.FINISHED
                    ):
                        raise UnfinishedSplitMigratedError(ctx.name, split, state.phase.value)
                changed, dropped = states.reassign((s.split_id for s in new), committed)
                if changed:
                    apply_change(table, states, dropped, message)

    @staticmethod
    def _adopt(table: StateTable, states: SplitBackfills, chunk: Chunk) -> None:
        """A split created after the listing, met in the forwarding stage: its ``FINISHED``
        state is put with the rows forwarded (a restart without it would backfill the split
        from its first record, and emit again what was forwarded)."""
        splits = pc.unique(chunk.batch.column(SPLIT_COLUMN)).to_pylist()
        for split in states.adopt(splits):
            table.put(split, states.states[split].to_json())


def _routed_here(ctx: ActorContext, splits: list[str]) -> list[str]:
    """The splits whose records the input's hash dispatch sends to this actor (all of them for
    an actor that is not one of a parallel group)."""
    bitmap = ctx.vnode_bitmap
    if bitmap is None or not splits:
        return splits
    names = pa.table({SPLIT_COLUMN: splits})
    vnodes = compute_vnodes(names, [SPLIT_COLUMN], bitmap.vnode_count)
    return [splits[i] for i in np.flatnonzero(bitmap.mask[vnodes])]
