"""What the runtime hands each actor: identity, inputs, outputs, state, and the barrier's ear.

An :class:`ActorContext` is made per actor per incarnation of the graph. Through it an actor

* reads its input: :meth:`~ActorContext.messages` (one input, or several aligned by the
  runtime's merge), or — for an actor that declares ``aligned_inputs = False``, such as a
  backfill — each named input on its own (:attr:`~ActorContext.inputs`,
  :meth:`~ActorContext.select` for a biased select that polls the upstream first);
* writes downstream with :meth:`~ActorContext.emit` — rows to its main output, or to a side
  output it declares with ``emit(chunk, output="late")``; a barrier also seals its state tables,
  applies the barrier's changes to its outputs (a joining job's new output, a dropped job's
  closed one) and is reported collected, with the progress the actor reported;
* keeps state in :meth:`~ActorContext.table`, reads other actors' committed tables with
  :meth:`~ActorContext.read_table`, and waits for a checkpoint with
  :meth:`~ActorContext.wait_committed`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import structlog

from barrierflow.channels.barrier import Barrier, BarrierKind
from barrierflow.channels.chunk import Chunk
from barrierflow.channels.dispatch import Dispatcher
from barrierflow.channels.endpoints import Receiver
from barrierflow.channels.errors import InvalidArgumentError
from barrierflow.channels.messages import (
    MESSAGE_EXPECTED,
    MESSAGE_TYPES,
    Committable,
    Message,
    Watermark,
)
from barrierflow.channels.output_names import check_output_name
from barrierflow.channels.outputs import Outputs
from barrierflow.channels.select import BiasedSelect
from barrierflow.channels.vnode import DEFAULT_VNODE_COUNT, VnodeBitmap
from barrierflow.runtime.barrier_manager import BarrierManager
from barrierflow.runtime.errors import BarrierNotPassedError, GraphError
from barrierflow.runtime.inputs import Messages, NamedInputs
from barrierflow.runtime.positions import check_positions
from barrierflow.runtime.progress import Progress
from barrierflow.runtime.state.state_store import CommittedEpochs, StateStore, StateTable
from barrierflow.runtime.state.table import ReadOnlyTable
from barrierflow.runtime.state.versioned_table import VersionedTable

__all__ = ["DEFAULT_JOB", "ActorContext", "ActorStats", "NamedInputs", "ReadOnlyTable"]

#: The job of every actor declared without one.
DEFAULT_JOB = "main"


@dataclass(frozen=True, slots=True)
class ActorStats:
    """A snapshot of one actor's counters."""

    #: The actor's name and id.
    name: str
    actor_id: int
    #: Messages read from its input.
    messages_in: int
    #: Rows of chunks read from its input.
    rows_in: int
    #: Rows of chunks emitted.
    rows_out: int
    #: Barriers passed downstream.
    barriers: int
    #: The ``curr`` epoch of the last barrier it passed (0 before the first).
    current_epoch: int
    #: Whether it has finished (stopped by a barrier, or its input ended).
    finished: bool


class ActorContext:
    """What the runtime hands an actor (see the module docstring).

    Built whole: everything the runtime knows of the actor is given here, nothing is set on
    it afterwards.

    Args:
        actor_id, name: the actor's identity.
        input: its one (or aligned-merged) input.
        output: its outputs (a bare Dispatcher in hand-built graphs), or ``None``.
        store, manager: the state store and the barrier manager of its graph.
        job: the job it belongs to.
        peers: the actors of its parallel group, itself included, in index order (default:
            itself alone).
        named_inputs: its inputs by name, for an actor with ``aligned_inputs = False``.
        vnode_bitmap: the vnodes it owns, if its input is hash-dispatched.
        adopted_positions: source positions adopted from a sink's storage at start.
        side_outputs: the side outputs the actor may emit to (its factory's declaration).

    Raises:
        InvalidArgumentError: an argument of the wrong type (``actor_id`` not an int >= 0,
            ``name`` or ``job`` not a non-empty str, ``input`` without ``receive()``,
            ``output`` not a Dispatcher, Outputs or ``None``, ``store`` not a StateStore,
            ``manager`` not a BarrierManager, ``peers`` not a tuple of names holding ``name``,
            ``named_inputs`` not NamedInputs or ``None``, ``vnode_bitmap`` not a VnodeBitmap
            or ``None``, ``adopted_positions`` not a mapping or ``None``, ``side_outputs``
            not a tuple of side outputs' names).
    """

    def __init__(
        self,
        actor_id: int,
        name: str,
        input: Receiver[Message],
        output: Dispatcher | Outputs | None,
        store: StateStore,
        manager: BarrierManager,
        *,
        job: str = DEFAULT_JOB,
        peers: tuple[str, ...] | None = None,
        named_inputs: NamedInputs | None = None,
        vnode_bitmap: VnodeBitmap | None = None,
        adopted_positions: Mapping[str, int] | None = None,
        side_outputs: tuple[str, ...] = (),
    ) -> None:
        group = (name,) if peers is None else peers
        for argument, value, ok in (
            ("actor_id", actor_id, type(actor_id) is int and actor_id >= 0),
            ("name", name, isinstance(name, str) and bool(name)),
            ("input", input, isinstance(input, Receiver)),
            ("output", output, output is None or isinstance(output, Dispatcher | Outputs)),
            ("store", store, isinstance(store, StateStore)),
            ("manager", manager, isinstance(manager, BarrierManager)),
            ("job", job, isinstance(job, str) and bool(job)),
            ("peers", peers, isinstance(group, tuple) and name in group),
            (
                "named_inputs",
                named_inputs,
                named_inputs is None or isinstance(named_inputs, NamedInputs),
            ),
            (
                "vnode_bitmap",
                vnode_bitmap,
                vnode_bitmap is None or isinstance(vnode_bitmap, VnodeBitmap),
            ),
            (
                "adopted_positions",
                adopted_positions,
                adopted_positions is None or isinstance(adopted_positions, Mapping),
            ),
            ("side_outputs", side_outputs, isinstance(side_outputs, tuple)),
        ):
            if not ok:
                raise InvalidArgumentError(argument, f"a valid {argument}", value)
        for side in side_outputs:
            if side is None:  # a name: None stands for the main output
                raise InvalidArgumentError("side_outputs", "side outputs' names", side_outputs)
            check_output_name("side_outputs", side)
        self.actor_id = actor_id
        self.name = name
        #: The job this actor belongs to.
        self.job = job
        #: The actors of this actor's parallel group (``parallelism=N``), itself included, in
        #: index order; ``(name,)`` for an actor declared alone. A source backfill reads their
        #: committed states before it leaves its backfill stage.
        self.peers: tuple[str, ...] = group
        #: The vnodes this actor owns, if its input is hash-dispatched (else ``None``).
        self.vnode_bitmap: VnodeBitmap | None = vnode_bitmap
        #: Source positions adopted from a sink's storage when the run started on an empty
        #: store with ``RuntimeConfig.adopt_sink_positions`` (empty otherwise; see
        #: :mod:`barrierflow.runtime.positions`).
        self.adopted_positions: dict[str, int] = dict(adopted_positions or {})
        #: The side outputs this actor may emit to (``emit(chunk, output=...)``).
        self.side_outputs: tuple[str, ...] = side_outputs
        self._named = named_inputs
        if isinstance(output, Dispatcher):
            # A bare dispatcher (tests, hand-built graphs): its outputs' actor ids are
            # unknown until ``downstream_ids`` is set.
            self._bare: Dispatcher | None = output
            self._output: Outputs | None = None
        else:
            self._bare = None
            self._output = output
        self._store = store
        self._manager = manager
        self._tables: list[StateTable] = []
        self._versioned: list[VersionedTable] = []
        self._progress: Progress | None = None
        self.log: Any = structlog.get_logger("barrierflow.actor").bind(
            actor=name, actor_id=actor_id, epoch=0
        )
        self.epoch = 0
        self.finished = False
        # One reader of the input for the actor's whole life: it holds the input counters.
        self._messages = Messages(input, self)
        self._rows_out = 0
        self._barriers = 0

    # Outputs.

    @property
    def downstream_ids(self) -> list[int]:
        """The actor ids behind the outputs, in dispatch order."""
        return [] if self._output is None else self._output.downstream

    @downstream_ids.setter
    def downstream_ids(self, ids: list[int]) -> None:
        if self._bare is not None:
            self._output = Outputs([(self._bare, ids)])
            self._bare = None

    def _outputs(self) -> Outputs | None:
        if self._bare is not None:  # never told its ids: a plain fan-out with no rescale
            self._output = Outputs([(self._bare, list(range(len(self._bare.outputs))))])
            self._bare = None
        return self._output

    # Inputs.

    @property
    def inputs(self) -> NamedInputs:
        """The actor's inputs by name, read independently (no barrier alignment): for an
        actor whose class sets ``aligned_inputs = False``.

        Raises:
            GraphError: the actor reads its inputs aligned (through :meth:`messages`).
        """
        if self._named is None:
            raise GraphError(
                "inputs",
                "an actor with aligned_inputs = False (this one reads ctx.messages())",
                self.name,
            )
        return self._named

    def select(self, *names: str) -> BiasedSelect[Message]:
        """A biased select over the named inputs, highest priority first (all, in declaration
        order, if none are named): see :class:`~barrierflow.channels.select.BiasedSelect`.

        Raises:
            GraphError: the actor reads its inputs aligned.
            UnknownInputError: a name that is not one of the actor's inputs.
        """
        inputs = self.inputs
        chosen = names or tuple(inputs)
        return BiasedSelect({name: inputs[name] for name in chosen})

    def messages(self, *, committables: bool = False) -> Messages:
        """The actor's input, until it ends or the actor has finished.

        Committables (work staged outside the graph for a sink) are passed on downstream as
        they come, unless ``committables`` is true: a sink's writer takes the ones for its
        sink (see :class:`~barrierflow.channels.messages.Committable`).

        Raises:
            GraphError: the actor reads several named inputs independently (use
                :attr:`inputs`).
        """
        if self._named is not None and len(self._named) > 1:
            raise GraphError(
                "inputs", "one input, or aligned inputs, to read ctx.messages()", list(self._named)
            )
        self._messages.forward = None if committables else self.emit
        return self._messages

    # State.

    def table(self, name: str) -> StateTable:
        """This actor's state table ``name`` (sealed at each barrier this actor emits).

        Raises:
            InvalidArgumentError: ``name`` is not a non-empty str.
        """
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError("name", "a non-empty table name", name)
        table = self._store.table(self.name, name)
        self._tables.append(table)
        return table

    async def versioned_table(
        self,
        name: str,
        *,
        schema: Any,
        primary_key: Sequence[str],
        distribution_key: Sequence[str] | None = None,
        compact_after: int = 32,
    ) -> VersionedTable:
        """This actor's versioned table ``name`` (sealed at each barrier this actor emits;
        see :mod:`barrierflow.runtime.state.versioned_table`), with as many vnodes as the
        actor's hash-dispatched input (default 256).

        Raises:
            InvalidArgumentError: as :meth:`StateStore.versioned_table`.
        """
        bitmap = self.vnode_bitmap
        table = await self._store.versioned_table(
            self.name,
            name,
            schema=schema,
            primary_key=primary_key,
            distribution_key=distribution_key,
            vnode_count=DEFAULT_VNODE_COUNT if bitmap is None else bitmap.vnode_count,
            compact_after=compact_after,
        )
        self._versioned.append(table)
        return table

    def read_view(self, view: str, name: str) -> list[VersionedTable]:
        """The versioned tables ``name`` of actor ``view`` or of every actor of its parallel
        group (``view.0``, ``view.1``, …): a parallel materialized view (maybe none)."""
        return self._store.versioned_group(view, name)

    def read_table(self, owner: str, name: str) -> ReadOnlyTable:
        """Actor ``owner``'s table ``name`` as of the last checkpoint, read only (a source
        backfill reads every actor's split states).

        Raises:
            InvalidArgumentError: ``owner`` or ``name`` is not a non-empty str.
        """
        for argument, value in (("owner", owner), ("name", name)):
            if not isinstance(value, str) or not value:
                raise InvalidArgumentError(argument, "a non-empty str", value)
        return ReadOnlyTable(self._store, owner, name)

    @property
    def committed_epoch(self) -> int:
        """The runtime's last durable checkpoint epoch (0 before the first)."""
        return self._store.committed_epoch

    def committed_epochs(self) -> CommittedEpochs:
        """The committed epoch now, then each newer one as checkpoints become durable (ends
        when the store closes); what an actor with a two-phase commit waits on."""
        return self._store.committed_epochs()

    async def wait_committed(self, epoch: int) -> int:
        """Wait until a checkpoint at or after ``epoch`` is durable; returns the committed
        epoch. Waiting for the ``curr`` of this actor's first barrier returns once the first
        checkpoint holding every actor's state since this actor joined is committed.

        Raises:
            InvalidArgumentError: ``epoch`` is not an int >= 0.
            NotRunningError-like end: the store closed first (``anyio.EndOfStream``).
        """
        if type(epoch) is not int or epoch < 0:
            raise InvalidArgumentError("epoch", "an int >= 0", epoch)
        async for committed in self._store.committed_epochs():
            if committed >= epoch:
                return committed
        raise anyio.EndOfStream

    @property
    def barrier_interval(self) -> float:
        """Seconds between injected barriers (a source pauses itself after some intervals
        without one)."""
        return self._manager.barrier_interval

    # Positions and progress.

    def report_positions(self, barrier: Barrier, positions: Mapping[str, int]) -> None:
        """Report this source's positions as of ``barrier`` (every row emitted before it);
        call it before emitting the barrier. Sinks record them with the epoch's rows (see
        :mod:`barrierflow.runtime.positions`).

        Raises:
            InvalidArgumentError: ``barrier`` is not a Barrier, or ``positions`` does not map
                non-empty str keys to non-negative int batch ids.
        """
        if not isinstance(barrier, Barrier):
            raise InvalidArgumentError("barrier", "a Barrier", type(barrier).__name__)
        self._manager.report_positions(barrier, check_positions("positions", positions))

    def positions_at(self, barrier: Barrier) -> dict[str, int]:
        """The positions every source reported with ``barrier``: where the rows before it
        come from (what a sink writer records with an epoch's commit). Ask before passing the
        barrier on: the runtime forgets them once every actor collected it.

        Raises:
            InvalidArgumentError: ``barrier`` is not a Barrier.
        """
        if not isinstance(barrier, Barrier):
            raise InvalidArgumentError("barrier", "a Barrier", type(barrier).__name__)
        return self._manager.positions_at(barrier)

    async def wait_completed(self, barrier: Barrier) -> None:
        """Wait until every actor of the graph collected ``barrier`` (for a checkpoint: until
        it is durable). Waiting on its first barrier, an actor learns that the whole graph has
        started — every service an actor needed before passing its first barrier (a sink's
        coordinator, once recovered) is ready.

        Raises:
            InvalidArgumentError: ``barrier`` is not a Barrier.
            BarrierflowError: the graph failed before the barrier completed.
        """
        if not isinstance(barrier, Barrier):
            raise InvalidArgumentError("barrier", "a Barrier", type(barrier).__name__)
        await self._manager.wait_completed(barrier)

    def report_progress(self, progress: Progress) -> None:
        """Report backfill progress; it is collected with the next barrier this actor emits
        (and counts for the job once that barrier completed).

        Raises:
            InvalidArgumentError: ``progress`` is not a Progress.
        """
        if not isinstance(progress, Progress):
            raise InvalidArgumentError("progress", "a Progress", type(progress).__name__)
        self._progress = progress

    # Emitting.

    async def emit(self, message: Message, *, output: str | None = None) -> None:
        """Send ``message`` downstream; for a barrier, also seal state, apply the barrier's
        changes to the outputs, and report collection.

        A chunk goes to the main output, or with ``output`` to one of the actor's declared
        side outputs — to the downstream actors reading that output only (``"<actor>:<output>"``
        in their inputs); with none, its rows are dropped. Either way its rows count in
        ``rows_out``: they are what the actor emitted. Barriers and watermarks go to every
        output, main and side (every reader sees every epoch); a committable follows the main
        output.

        Raises:
            InvalidArgumentError: ``message`` is not a Message (Chunk, Barrier, Watermark or
                Committable), or ``output`` is not ``None`` or a side output the actor
                declares, or is given for a message that is not a chunk — even when the actor
                has no output.
            BarrierNotPassedError: rows or a committable emitted before this actor passed its
                first barrier.
        """
        if output is not None and isinstance(message, MESSAGE_TYPES):
            if not isinstance(message, Chunk):
                raise InvalidArgumentError(
                    "output",
                    "None for a message that is not a chunk (barriers and watermarks go to "
                    "every output, committables follow the main one)",
                    output,
                )
            if not isinstance(output, str) or output not in self.side_outputs:
                raise InvalidArgumentError(
                    "output",
                    f"None or a side output actor {self.name!r} declares {list(self.side_outputs)}",
                    output,
                )
        if isinstance(message, Barrier):
            await self._pass_barrier(message)
            return
        if isinstance(message, Chunk):
            if not self._barriers:
                # Downstream would fail on rows before any barrier, and be blamed for it.
                raise BarrierNotPassedError(
                    self.name, "emitted rows" if output is None else f"emitted rows to {output!r}"
                )
            self._rows_out += message.cardinality
        elif isinstance(message, Committable):
            if not self._barriers:
                # It would belong to no epoch downstream.
                raise BarrierNotPassedError(self.name, "emitted a committable")
        elif not isinstance(message, Watermark):
            raise InvalidArgumentError("message", MESSAGE_EXPECTED, type(message).__name__)
        outputs = self._output if self._bare is None else self._outputs()
        if outputs is not None:
            await outputs.dispatch(message, output)

    async def _pass_barrier(self, barrier: Barrier) -> None:
        if barrier.kind is not BarrierKind.INITIAL:
            for table in self._tables:
                table.seal(barrier.epoch.prev)
            for versioned in self._versioned:
                versioned.seal(barrier.epoch.prev)
        output = self._outputs()
        if output is not None:
            await output.dispatch(barrier)
            await output.apply(barrier, self.actor_id)
        self.epoch = barrier.epoch.curr
        self.log = self.log.bind(epoch=self.epoch)
        self._barriers += 1
        stopping = barrier.is_stop(self.actor_id)
        if stopping:
            self.finished = True
            if output is not None:
                output.close()
        progress, self._progress = self._progress, None
        self._manager.collect(self.actor_id, barrier, progress)
        if stopping:
            self._manager.retire(self.actor_id, barrier)

    def close_outputs(self) -> None:
        """Close every output (the runtime does it when the actor's task ends)."""
        output = self._outputs()
        if output is not None:
            output.close()

    def stats(self) -> ActorStats:
        """A snapshot of this actor's counters."""
        return ActorStats(
            name=self.name,
            actor_id=self.actor_id,
            messages_in=self._messages.messages_in,
            rows_in=self._messages.rows_in,
            rows_out=self._rows_out,
            barriers=self._barriers,
            current_epoch=self.epoch,
            finished=self.finished,
        )
