"""The coordinator worker, driven directly (no runtime): one test per rule of its docstring.

Each test runs ``Coordinator.run`` in a task group against a real :class:`StateStore`, registers
writer handles itself and plays the runtime's part by hand: ``store.commit(epoch)`` makes a
checkpoint durable, ``store.abort_epoch_records_after_committed()`` is what recovery does before
the coordinator restarts. The committer is a fake that records every call in order.
"""

from __future__ import annotations

import inspect
import math
import random
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
import structlog
from _timeouts import scaled
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from barrierflow.actors.sinks.coordinator.commit_queue import RECENT_DELAYS, RetryBackoff
from barrierflow.actors.sinks.coordinator.coordinator import Coordinator
from barrierflow.actors.sinks.coordinator.handles import WriterHandle
from barrierflow.actors.sinks.coordinator.meta_store import SinkState, SinkStateRecord, SinkStates
from barrierflow.actors.sinks.errors import CommittedEpochsEndedError
from barrierflow.actors.sinks.table import (
    AlreadyCommitted,
    CommitOutcome,
    Committed,
    Committer,
    Failed,
    Manifest,
)
from barrierflow.channels.vnode import VnodeBitmap
from barrierflow.errors import (
    ActorGoneError,
    CoordinatorAbortedError,
    DuplicateVnodeError,
    EpochOrderError,
    InvalidArgumentError,
    ProtocolError,
    SchemaChangeMismatchError,
    TableCommitFailedError,
    UnexpectedWriterRequestError,
)
from barrierflow.runtime.service import ServiceContext
from barrierflow.runtime.state.state_store import StateStore

pytestmark = pytest.mark.anyio

SINK = "coord"
HALVES = VnodeBitmap.split(2)
THIRDS = VnodeBitmap.split(3)
FULL = VnodeBitmap.full()
WAIT = scaled(5)  # seconds: a broken rule fails the test instead of hanging it


class CommitFailedError(Exception):
    """What the fake committer raises when told to fail."""


class FakeCommitter:
    """A :class:`Committer` that records every call, in order.

    ``commit`` fails while ``fail_commits`` > 0 (one failure per call), waits for ``gate`` if
    one is set, and is idempotent like a real sink: an epoch at or before the last one committed
    is skipped (``committed`` lists the commits that took effect).
    """

    def __init__(self, *, store: StateStore | None = None) -> None:
        self.store = store
        self.calls: list[tuple[Any, ...]] = []
        self.committed: list[int] = []
        #: The store's committed epoch at each commit call (epoch, durable epoch).
        self.durable_at_commit: list[tuple[int, int]] = []
        self.fail_commits = 0
        self.fail_prepare: BaseException | None = None
        #: A commit then says Failed(cause): the coordinator fails.
        self.fail_for_good: BaseException | None = None
        #: What a commit that took effect returns (``None``: an old-style committer).
        self.went_through: CommitOutcome | None = Committed()
        self.gate: anyio.Event | None = None
        self._changed = anyio.Event()

    def _record(self, *call: Any) -> None:
        self.calls.append(call)
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        """Wait (on events, not by polling) until ``predicate()`` holds."""
        with anyio.fail_after(WAIT):
            while not predicate():
                await self._changed.wait()

    def names(self) -> list[str]:
        return [call[0] for call in self.calls]

    def epochs(self, name: str) -> list[int]:
        return [call[1] for call in self.calls if call[0] == name]

    def index(self, name: str, epoch: int) -> int:
        return next(i for i, c in enumerate(self.calls) if c[0] == name and c[1] == epoch)

    async def recover(self, pending: Mapping[int, Any]) -> None:
        self._record("recover", dict(pending))

    async def prepare(self, epoch: int, manifests: Sequence[Manifest]) -> Mapping[str, Any] | None:
        change = manifests[0].schema_change if manifests else None
        self._record("prepare", epoch, sorted_metas(manifests), change)
        if self.fail_prepare is not None:
            raise self.fail_prepare
        metadata: dict[str, Any] = {"epoch": epoch, "parts": len(manifests)}
        if change is not None:
            metadata["schema_change"] = change
        return metadata

    async def commit(self, epoch: int, metadata: Mapping[str, Any]) -> CommitOutcome | None:
        data = {k: v for k, v in metadata.items() if k != "schema_change"}
        self._record("commit", epoch, data, metadata.get("schema_change"))
        if self.store is not None:
            self.durable_at_commit.append((epoch, self.store.committed_epoch))
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_for_good is not None:
            self._record("commit_failed", epoch)
            return Failed(self.fail_for_good)
        if self.fail_commits > 0:
            self.fail_commits -= 1
            self._record("commit_failed", epoch)
            raise CommitFailedError(f"commit of epoch {epoch} failed")
        replay = bool(self.committed) and epoch <= self.committed[-1]
        if not replay:
            self.committed.append(epoch)
        self._record("committed", epoch)
        return AlreadyCommitted() if replay else self.went_through

    async def abort(self, epoch: int, metadata: Any) -> None:
        self._record("abort", epoch, metadata)


def sorted_metas(manifests: Sequence[Manifest]) -> list[dict[str, Any]]:
    return sorted((m.to_json() for m in manifests), key=repr)


def meta(handle: WriterHandle, epoch: int, change: Mapping[str, Any] | None = None) -> Manifest:
    """Writer ``handle``'s manifest of ``epoch`` (staged under the same epoch number)."""
    return Manifest(str(handle.handle_id), epoch, schema_change=change)


def leaf(exc: BaseException | None) -> BaseException | None:
    """The single exception inside (nested) exception groups, else ``exc`` itself."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


class Run:
    """One ``coordinator.run`` in its own cancel scope; records how it ended."""

    def __init__(self, coordinator: Coordinator, ctx: ServiceContext) -> None:
        self.coordinator = coordinator
        self.ctx = ctx
        self.scope = anyio.CancelScope()
        self.ended = anyio.Event()
        self.error: BaseException | None = None

    async def main(self) -> None:
        with self.scope:
            try:
                await self.coordinator.run(self.ctx)
            except Exception as exc:
                self.error = exc
        self.ended.set()

    async def stop(self) -> None:
        self.scope.cancel()
        with anyio.fail_after(WAIT):
            await self.ended.wait()

    async def failure(self) -> BaseException | None:
        """Wait for the run to fail; the (unwrapped) error."""
        with anyio.fail_after(WAIT):
            await self.ended.wait()
        return leaf(self.error)


def start(tg: anyio.abc.TaskGroup, coordinator: Coordinator, ctx: ServiceContext) -> Run:
    run = Run(coordinator, ctx)
    tg.start_soon(run.main)
    return run


class Outcome:
    """A call in flight in its own task: its result or error once ``done``."""

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    async def wait(self) -> Any:
        with anyio.fail_after(WAIT):
            await self.done.wait()
        if self.error is not None:
            raise self.error
        return self.value

    async def wait_error(self) -> BaseException:
        with anyio.fail_after(WAIT):
            await self.done.wait()
        assert self.error is not None, f"expected an error, got {self.value!r}"
        return self.error


def spawn(tg: anyio.abc.TaskGroup, call: Callable[[], Awaitable[Any]]) -> Outcome:
    outcome = Outcome()

    async def go() -> None:
        try:
            outcome.value = await call()
        except Exception as exc:
            outcome.error = exc
        finally:
            outcome.done.set()

    tg.start_soon(go)
    return outcome


async def post(
    tg: anyio.abc.TaskGroup,
    handle: WriterHandle,
    epoch: int,
    schema_change: Mapping[str, Any] | None = None,
) -> Outcome:
    """Send ``handle``'s commit request of ``epoch`` and return once the coordinator has it (the
    request is posted before its task first blocks), without waiting for the ack."""
    outcome = spawn(tg, lambda: handle.commit(epoch, meta(handle, epoch, schema_change)))
    await anyio.wait_all_tasks_blocked()
    return outcome


async def commit_all(
    handles: Sequence[WriterHandle],
    epoch: int,
    schema_change: Mapping[str, Any] | None = None,
) -> None:
    """Every writer's commit request of ``epoch``, concurrently; returns once all are acked."""
    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            for handle in handles:
                tg.start_soon(handle.commit, epoch, meta(handle, epoch, schema_change))


async def start_fresh(handles: Sequence[WriterHandle], initial: int = 1) -> None:
    """Wait until started (a fresh start) and align the initial epoch."""
    with anyio.fail_after(WAIT):
        for handle in handles:
            assert await handle.wait_started() is None
        async with anyio.create_task_group() as tg:
            for handle in handles:
                tg.start_soon(handle.align_initial_epoch, initial)


async def register_started(coordinator: Coordinator, bitmaps: Sequence[VnodeBitmap]) -> list[Any]:
    handles = [await coordinator.register(b) for b in bitmaps]
    await start_fresh(handles)
    return handles


def make(committer: Committer, **kwargs: Any) -> Coordinator:
    options: dict[str, Any] = {"base_delay": 0.001, "max_delay": 0.004, "rng": random.Random(0)}
    options.update(kwargs)
    return Coordinator(SINK, committer, **options)


def states(records: list[SinkStateRecord]) -> list[tuple[int, str]]:
    return [(r.epoch, r.state.value) for r in records]


# Init.


async def test_init_waits_until_the_bitmaps_cover_every_vnode(tmp_path: Path) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        committer = FakeCommitter()
        coordinator = make(committer)
        async with anyio.create_task_group() as tg:
            start(tg, coordinator, ServiceContext(SINK, store))
            first = await coordinator.register(HALVES[0])
            started = spawn(tg, first.wait_started)
            with anyio.move_on_after(scaled(0.02)):
                await started.done.wait()
            assert not started.done.is_set(), "started with half the vnodes uncovered"
            assert coordinator.stats().running == 0
            second = await coordinator.register(HALVES[1])
            assert await started.wait() is None
            with anyio.fail_after(WAIT):
                assert await second.wait_started() is None
            assert committer.names() == ["recover"]
            tg.cancel_scope.cancel()


async def test_init_with_a_vnode_claimed_twice_fails_with_duplicate_vnode_error(
    tmp_path: Path,
) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        coordinator = make(FakeCommitter())
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            first = await coordinator.register(VnodeBitmap.from_vnodes(range(131)))
            second = await coordinator.register(VnodeBitmap.from_vnodes(range(128, 256)))
            error = await run.failure()
        assert isinstance(error, DuplicateVnodeError)
        assert error.vnodes == [128, 129, 130]
        assert error.stage == "registration"
        # Surfaces to every registered writer as the coordinator's abort, with the cause.
        for handle in (first, second):
            with pytest.raises(CoordinatorAbortedError) as aborted:
                await handle.wait_started()
            assert leaf(aborted.value.cause) is error


async def test_fresh_start_aligns_the_maximum_initial_epoch_for_every_writer(
    tmp_path: Path,
) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        coordinator = make(FakeCommitter())
        async with anyio.create_task_group() as tg:
            start(tg, coordinator, ServiceContext(SINK, store))
            handles = [await coordinator.register(b) for b in THIRDS]
            for handle in handles:
                with anyio.fail_after(WAIT):
                    assert await handle.wait_started() is None
            outcomes = [
                spawn(tg, partial(h.align_initial_epoch, e))
                for h, e in zip(handles, (7, 42, 3), strict=True)
            ]
            assert [await o.wait() for o in outcomes] == [42, 42, 42]
            # The writers then commit epochs from there on.
            await commit_all(handles, 42)
            assert coordinator.stats().last_acked_epoch == 42
            tg.cancel_scope.cancel()


@pytest.mark.parametrize("request_kind", ["Commit", "AlignInitial", "StopHandle"])
async def test_a_request_other_than_a_registration_during_init_is_an_unexpected_request(
    tmp_path: Path, request_kind: str
) -> None:
    # The seed's wait_init_handles: "expect new handle during init, but got ...".
    async with await StateStore.open(tmp_path / "state.db") as store:
        coordinator = make(FakeCommitter())
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            first = await coordinator.register(HALVES[0])  # half the vnodes: still in init
            calls: dict[str, Callable[[], Awaitable[Any]]] = {
                "Commit": lambda: first.commit(5, meta(first, 5)),
                "AlignInitial": lambda: first.align_initial_epoch(5),
                "StopHandle": first.stop,
            }
            sent = spawn(tg, calls[request_kind])
            error = await run.failure()
        assert isinstance(error, UnexpectedWriterRequestError)
        epoch = None if request_kind == "StopHandle" else 5
        assert (error.sink, error.stage, error.expected, error.request, error.writer) == (
            SINK,
            "init",
            "writers to register",
            request_kind,
            first.handle_id,
        )
        assert error.epoch == epoch
        assert f"expected writers to register, got {request_kind}" in str(error)
        # The writer that sent it is not left waiting: a commit request fails with the error
        # itself, any other request with the coordinator's abort.
        if request_kind == "Commit":
            assert await sent.wait_error() is error
        elif request_kind == "AlignInitial":
            assert isinstance(await sent.wait_error(), CoordinatorAbortedError)


@pytest.mark.parametrize("request_kind", ["Commit", "NewHandle"])
async def test_a_request_other_than_an_initial_epoch_during_alignment_is_an_unexpected_request(
    tmp_path: Path, request_kind: str
) -> None:
    # The seed's handle_init_requests_impl: "expect AlignInitialEpoch but got ...".
    async with await StateStore.open(tmp_path / "state.db") as store:
        coordinator = make(FakeCommitter())
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            first, second = [await coordinator.register(b) for b in HALVES]
            with anyio.fail_after(WAIT):
                assert await first.wait_started() is None
            aligning = spawn(tg, lambda: first.align_initial_epoch(3))
            await anyio.wait_all_tasks_blocked()
            assert not aligning.done.is_set()
            if request_kind == "Commit":
                sent = spawn(tg, lambda: second.commit(3, meta(second, 3)))
            else:
                sent = spawn(tg, lambda: coordinator.register(HALVES[0]))
            error = await run.failure()
        assert isinstance(error, UnexpectedWriterRequestError)
        assert (error.stage, error.expected, error.request) == (
            "initial epoch alignment",
            "AlignInitial from every writer",
            request_kind,
        )
        if request_kind == "Commit":
            assert (error.writer, error.epoch) == (second.handle_id, 3)
            assert await sent.wait_error() is error
        else:
            registered = await sent.wait()  # the registration itself went through
            assert error.writer == registered.handle_id
        assert isinstance(await aligning.wait_error(), CoordinatorAbortedError)


@pytest.mark.parametrize(
    ("records", "durable", "rewind"),
    [
        pytest.param([(1, "committed")], 1, 1, id="last-committed"),
        pytest.param([(1, "committed"), (2, "pending"), (3, "pending")], 3, 3, id="last-pending"),
        pytest.param([(2, "pending")], 2, 2, id="pending-only"),
        # Epoch 4 is after the durable checkpoint: aborted at open, so not the rewind epoch.
        pytest.param([(1, "committed"), (3, "pending"), (4, "pending")], 3, 3, id="aborted-skip"),
    ],
)
async def test_restart_starts_writers_with_the_rewind_epoch(
    tmp_path: Path, records: list[tuple[int, str]], durable: int, rewind: int
) -> None:
    path = tmp_path / "state.db"
    async with await StateStore.open(path) as store:
        await write_records(store, records)
        await store.commit(durable)
    committer = FakeCommitter()
    async with await StateStore.open(path) as store:
        coordinator = make(committer)
        async with anyio.create_task_group() as tg:
            start(tg, coordinator, ServiceContext(SINK, store))
            handles = [await coordinator.register(b) for b in HALVES]
            with anyio.fail_after(WAIT):
                assert [await h.wait_started() for h in handles] == [rewind, rewind]
            # No alignment round: the writers commit right after the rewind epoch.
            await commit_all(handles, rewind + 1)
            assert coordinator.stats().last_acked_epoch == rewind + 1
            tg.cancel_scope.cancel()


async def write_records(store: StateStore, records: list[tuple[int, str]]) -> None:
    """Records as a coordinator leaves them: pending ones, some marked committed."""
    sink_states = SinkStates(store, SINK)
    for epoch, state in records:
        await sink_states.persist_pending(epoch, {"epoch": epoch}, None)
        if state == "committed":
            await sink_states.commit_and_prune(epoch)


# Per epoch.


async def test_only_the_oldest_pending_epoch_completes(tmp_path: Path) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        committer = FakeCommitter()
        coordinator = make(committer)
        first_call = "prepare"
        async with anyio.create_task_group() as tg:
            start(tg, coordinator, ServiceContext(SINK, store))
            a, b = await register_started(coordinator, HALVES)
            a1 = await post(tg, a, 1)
            b2 = await post(tg, b, 2)
            a2 = await post(tg, a, 2)  # epoch 2 covers every vnode now, epoch 1 does not
            b3 = await post(tg, b, 3)
            a3 = await post(tg, a, 3)  # and so does epoch 3
            assert not any(o.done.is_set() for o in (a1, a2, b2, a3, b3))
            assert first_call not in committer.names()
            assert coordinator.stats().acked_epochs == 0
            b1 = await post(tg, b, 1)
            for outcome in (a1, b1, a2, b2, a3, b3):
                await outcome.wait()
            assert committer.epochs(first_call) == [1, 2, 3]
            stats = coordinator.stats()
            assert (stats.acked_epochs, stats.last_acked_epoch) == (3, 3)
            tg.cancel_scope.cancel()


async def test_commit_from_a_writer_that_is_not_running_is_a_protocol_error(
    tmp_path: Path,
) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        coordinator = make(FakeCommitter())
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            a, b = await register_started(coordinator, HALVES)
            # Registered after init: known to the coordinator, but not started (no rescale yet).
            late = await coordinator.register(THIRDS[0])
            pending = await post(tg, a, 1)
            error = await (await post(tg, late, 1)).wait_error()
            assert isinstance(error, UnexpectedWriterRequestError)
            assert (error.stage, error.request, error.writer, error.epoch) == (
                "running",
                "Commit",
                late.handle_id,
                1,
            )
            assert str([a.handle_id, b.handle_id]) in error.expected  # who may commit
            assert leaf(await run.failure()) is error
            # The coordinator failed: the other writers' requests are aborted with the cause.
            aborted = await pending.wait_error()
            assert isinstance(aborted, CoordinatorAbortedError)
            assert aborted.cause is error


async def test_commit_from_a_stopped_writer_is_an_actor_gone_error(tmp_path: Path) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        coordinator = make(FakeCommitter())
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            a, b = await register_started(coordinator, HALVES)
            await b.stop()
            with pytest.raises(ActorGoneError) as gone:
                await b.commit(1, meta(b, 1))
            assert gone.value.actor == SINK
            with pytest.raises(ActorGoneError) as gone:
                await b.update_vnode_bitmap(FULL)
            assert gone.value.actor == SINK
            await b.stop()  # idempotent
            # The remaining writer takes over every vnode and goes on.
            await a.update_vnode_bitmap(FULL)
            with anyio.fail_after(WAIT):
                assert await a.wait_started() is None  # nothing was acked yet: align again
                assert await a.align_initial_epoch(5) == 5
            await commit_all([a], 5)
            assert not run.ended.is_set()
            tg.cancel_scope.cancel()


@pytest.mark.parametrize("epoch", [1, 2])
async def test_commit_epoch_not_after_the_last_acked_one_is_an_epoch_order_error(
    tmp_path: Path, epoch: int
) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        coordinator = make(FakeCommitter())
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            a, b = await register_started(coordinator, HALVES)
            await commit_all([a, b], 1)
            await commit_all([a, b], 2)
            error = await (await post(tg, a, epoch)).wait_error()
            assert isinstance(error, EpochOrderError)
            assert (error.previous, error.current) == (2, epoch)
            assert str(error) == (
                f"commit epoch of writer {a.handle_id}: expected an epoch greater than 2, "
                f"got {epoch}"
            )
            assert leaf(await run.failure()) is error


async def test_schema_change_mismatch_between_writers_shows_both(tmp_path: Path) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        committer = FakeCommitter()
        coordinator = make(committer)
        ours, theirs = {"add_column": "x"}, {"add_column": "y"}
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            a, b = await register_started(coordinator, HALVES)
            first = await post(tg, a, 1, ours)
            second = await post(tg, b, 1, theirs)
            error = await run.failure()
            assert isinstance(error, SchemaChangeMismatchError)
            assert (error.epoch, error.first, error.other) == (1, ours, theirs)
            for outcome in (first, second):
                aborted = await outcome.wait_error()
                assert isinstance(aborted, CoordinatorAbortedError)
                assert leaf(aborted.cause) is error
            assert "prepare" not in committer.names()


async def test_schema_change_on_one_writer_only_is_a_mismatch(tmp_path: Path) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        coordinator = make(FakeCommitter())
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            a, b = await register_started(coordinator, HALVES)
            await post(tg, a, 1)
            await post(tg, b, 1, {"drop_column": "x"})
            error = await run.failure()
            assert isinstance(error, SchemaChangeMismatchError)
            assert {repr(error.first), repr(error.other)} == {"None", repr({"drop_column": "x"})}


# Bad input.


async def test_register_rejects_bad_bitmaps_with_what_was_expected(tmp_path: Path) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        coordinator = make(FakeCommitter())
        async with anyio.create_task_group() as tg:
            start(tg, coordinator, ServiceContext(SINK, store))
            with pytest.raises(InvalidArgumentError) as info:
                await coordinator.register(VnodeBitmap.full(128))
            assert (info.value.argument, info.value.expected, info.value.got) == (
                "bitmap",
                "a bitmap of 256 vnodes",
                "128 vnodes",
            )
            with pytest.raises(InvalidArgumentError) as info:
                await coordinator.register(VnodeBitmap.empty())
            assert info.value.expected == "a bitmap with at least one vnode"
            with pytest.raises(InvalidArgumentError) as info:
                await coordinator.register([0, 1, 2])  # type: ignore[arg-type]
            assert (info.value.expected, info.value.got) == ("a VnodeBitmap", "list")
            # Nothing was registered by the failed calls: a writer covering everything starts.
            handle = await coordinator.register(FULL)
            with anyio.fail_after(WAIT):
                assert await handle.wait_started() is None
            for bad in (VnodeBitmap.full(64), VnodeBitmap.empty(), "all"):
                with pytest.raises(InvalidArgumentError) as info:
                    await handle.update_vnode_bitmap(bad)  # type: ignore[arg-type]
                assert info.value.argument == "bitmap"
            tg.cancel_scope.cancel()


async def test_commit_rejects_bad_epochs_manifests_and_schema_changes(tmp_path: Path) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        coordinator = make(FakeCommitter())
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            (handle,) = await register_started(coordinator, [FULL])
            bad_epochs: list[Any] = [-1, 1.0, "1", True, None]
            for epoch in bad_epochs:
                with pytest.raises(InvalidArgumentError) as info:
                    await handle.commit(epoch, meta(handle, 1))
                assert (info.value.argument, info.value.got) == ("epoch", epoch)
                with pytest.raises(InvalidArgumentError) as info:
                    await handle.align_initial_epoch(epoch)
                assert (info.value.argument, info.value.got) == ("epoch", epoch)
            bad_manifests: list[Any] = [{}, None, {"writer": "0", "epoch": 1}, "k"]
            for manifest in bad_manifests:
                with pytest.raises(InvalidArgumentError) as info:
                    await handle.commit(1, manifest)
                assert (info.value.argument, info.value.got) == (
                    "manifest",
                    type(manifest).__name__,
                )
            with pytest.raises(InvalidArgumentError) as info:
                Manifest("0", 1, schema_change=["add x"])  # type: ignore[arg-type]
            assert (info.value.argument, info.value.got) == ("schema_change", ["add x"])
            # None of the rejected calls reached the coordinator: it still runs, epoch 1 is fresh.
            await commit_all([handle], 1)
            assert not run.ended.is_set()
            tg.cancel_scope.cancel()


async def test_align_initial_epoch_after_init_is_an_unexpected_request(tmp_path: Path) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        coordinator = make(FakeCommitter())
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            (handle,) = await register_started(coordinator, [FULL])
            late = spawn(tg, lambda: handle.align_initial_epoch(9))
            error = await run.failure()
            assert isinstance(error, UnexpectedWriterRequestError)
            assert isinstance(error, ProtocolError)
            assert (error.sink, error.stage, error.request, error.writer, error.epoch) == (
                SINK,
                "running",
                "AlignInitial",
                handle.handle_id,
                9,
            )
            aborted = await late.wait_error()
            assert isinstance(aborted, CoordinatorAbortedError)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"sink": ""}, "a non-empty str"),
        ({"sink": 3}, "a non-empty str"),
        ({"committer": object()}, "a Committer"),
        ({"base_delay": 0}, "a finite number of seconds > 0"),
        ({"base_delay": 0.0005}, "at least 0.001 seconds (1 ms)"),
        ({"max_delay": -1.0}, "a finite number of seconds > 0"),
        ({"warn_interval": math.inf}, "a finite number of seconds > 0"),
        ({"base_delay": math.nan}, "a finite number of seconds > 0"),
        ({"base_delay": True}, "a finite number of seconds > 0"),
        ({"max_delay": "1"}, "a finite number of seconds > 0"),
        ({"vnode_count": 0}, "an int in 1..32768"),
        ({"vnode_count": 256.0}, "an int in 1..32768"),
        ({"rng": 42}, "None or a random.Random"),
        ({"commit_retry_timeout": 0}, "a finite number of seconds > 0"),
        ({"commit_retry_timeout": math.inf}, "a finite number of seconds > 0"),
    ],
)
async def test_constructor_rejects_bad_arguments(kwargs: dict[str, Any], expected: str) -> None:
    arguments: dict[str, Any] = {"sink": SINK, "committer": FakeCommitter()}
    arguments.update(kwargs)
    sink, committer = arguments.pop("sink"), arguments.pop("committer")
    with pytest.raises(InvalidArgumentError) as info:
        Coordinator(sink, committer, **arguments)
    ((argument, got),) = kwargs.items()
    assert (info.value.argument, info.value.expected) == (argument, expected)
    assert info.value.got is got


# Two-phase commits.


async def test_two_phase_persists_pending_before_the_ack_and_commits_once_durable(
    tmp_path: Path,
) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        committer = FakeCommitter(store=store)
        coordinator = make(committer)
        sink_states = SinkStates(store, SINK)
        seen_at_ack: list[list[tuple[int, str]]] = []
        async with anyio.create_task_group() as tg:
            start(tg, coordinator, ServiceContext(SINK, store))
            a, b = await register_started(coordinator, HALVES)

            async def commit_epoch(epoch: int) -> None:
                async def commit(handle: WriterHandle) -> None:
                    await handle.commit(epoch, meta(handle, epoch))
                    seen_at_ack.append(states(await sink_states.list()))

                with anyio.fail_after(WAIT):
                    async with anyio.create_task_group() as writers:
                        writers.start_soon(commit, a)
                        writers.start_soon(commit, b)

            await commit_epoch(1)
            assert committer.calls[1] == (
                "prepare",
                1,
                sorted_metas([meta(a, 1), meta(b, 1)]),
                None,
            )
            # Persisted as pending before either writer was acknowledged.
            assert seen_at_ack == [[(1, "pending")]] * 2
            records = await sink_states.list()
            assert records[0].metadata == {"epoch": 1, "parts": 2}
            assert "commit" not in committer.names()
            assert not coordinator.is_committed(1)

            await store.commit(1)
            await committer.wait_for(lambda: committer.committed == [1])
            assert committer.calls[-2] == ("commit", 1, {"epoch": 1, "parts": 2}, None)
            with anyio.fail_after(WAIT):
                await coordinator.wait_committed(1)
            # Marked committed at once, before any later epoch (see the committed-mark test).
            assert states(await sink_states.list()) == [(1, "committed")]

            await commit_epoch(2)
            assert states(await sink_states.list()) == [(1, "committed"), (2, "pending")]
            await commit_epoch(3)
            # Epoch 2 is not committed yet.
            assert states(await sink_states.list()) == [
                (1, "committed"),
                (2, "pending"),
                (3, "pending"),
            ]
            assert committer.epochs("commit") == [1]
            await store.commit(3)
            await committer.wait_for(lambda: committer.committed == [1, 2, 3])
            with anyio.fail_after(WAIT):
                await coordinator.wait_committed(3)
            assert committer.epochs("commit") == [1, 2, 3]
            assert all(epoch <= durable for epoch, durable in committer.durable_at_commit)
            stats = coordinator.stats()
            assert (stats.acked_epochs, stats.committed_epochs, stats.last_committed_epoch) == (
                3,
                3,
                3,
            )
            tg.cancel_scope.cancel()
        # Each commit was marked at once; the last mark pruned the older committed records.
        assert states(await sink_states.list()) == [(3, "committed")]


# Retries.


class FixedDraw(random.Random):
    """A jitter source whose every draw is ``draw``: the delays it yields are exact."""

    def __init__(self, draw: float) -> None:
        super().__init__(0)
        self.draw = draw

    def random(self) -> float:
        return self.draw


#: The largest draw below 1 (``random()`` is in [0, 1)): the delays it yields are un-jittered,
#: times 1 - 2**-53.
ALMOST_ONE = math.nextafter(1.0, 0.0)


async def test_commit_retry_backoff_is_base_to_the_n_ms_capped_at_max_with_full_jitter() -> None:
    # The seed: tokio-retry's ExponentialBackoff::from_millis(10).max_delay(60 s), mapped
    # through jitter — 10^n ms (not a doubling), capped, times a uniform draw in [0, 1).
    unjittered = [0.01, 0.1, 1.0, 10.0, 60.0, 60.0, 60.0]
    top = RetryBackoff(0.01, 60.0, FixedDraw(ALMOST_ONE))
    assert [top.failed() for _ in unjittered] == [d * ALMOST_ONE for d in unjittered]
    half = RetryBackoff(0.01, 60.0, FixedDraw(0.5))
    assert [half.failed() for _ in range(6)] == [0.005, 0.05, 0.5, 5.0, 30.0, 30.0]
    # A success starts the schedule over, from 10 ms.
    half.succeeded()
    assert [half.failed() for _ in range(3)] == [0.005, 0.05, 0.5]
    assert half.failures == 9
    assert list(half.recent) == [0.005, 0.05, 0.5, 5.0, 30.0, 30.0, 0.005, 0.05, 0.5]
    # Failing for ever stays at the cap (no overflow).
    for _ in range(2000):
        last = top.failed()
    assert last == 60.0 * ALMOST_ONE


async def test_commit_retries_start_again_from_10_ms_after_a_success(tmp_path: Path) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        committer = FakeCommitter()
        draw = 0.01  # keeps the real waits short: 0.1 ms, then 1 ms
        # The seed's defaults (10 ms base, 60 s cap).
        coordinator = Coordinator(SINK, committer, rng=FixedDraw(draw))
        async with anyio.create_task_group() as tg:
            start(tg, coordinator, ServiceContext(SINK, store))
            handles = await register_started(coordinator, HALVES)
            for epoch in (1, 2):
                committer.fail_commits = 2
                await commit_all(handles, epoch)
                await store.commit(epoch)
                with anyio.fail_after(WAIT):
                    await coordinator.wait_committed(epoch)
            stats = coordinator.stats()
            # Epoch 2's retries start from 10 ms again, not from epoch 1's 1 s.
            assert stats.retry_delays == (0.01 * draw, 0.1 * draw) * 2
            assert stats.commit_failures == 4
            assert committer.epochs("commit") == [1, 1, 1, 2, 2, 2]
            assert committer.committed == [1, 2]
            tg.cancel_scope.cancel()


async def test_coordinator_defaults_are_the_seeds_10_ms_backoff_60_s_cap_5_s_warnings() -> None:
    defaults = {
        name: parameter.default
        for name, parameter in inspect.signature(Coordinator).parameters.items()
        if name in ("base_delay", "max_delay", "warn_interval", "commit_retry_timeout")
    }
    assert defaults == {
        "base_delay": 0.01,
        "max_delay": 60.0,
        "warn_interval": 5.0,
        "commit_retry_timeout": 300.0,  # ours: the seed retries for ever
    }


async def test_retry_delays_keep_a_bounded_recent_window_and_count_every_failure(
    tmp_path: Path,
) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        committer = FakeCommitter()
        committer.fail_commits = RECENT_DELAYS + 10
        coordinator = make(committer, base_delay=0.001, max_delay=0.001, rng=random.Random(1))
        async with anyio.create_task_group() as tg:
            start(tg, coordinator, ServiceContext(SINK, store))
            handles = await register_started(coordinator, HALVES)
            await commit_all(handles, 1)
            await store.commit(1)
            with anyio.fail_after(WAIT):
                await coordinator.wait_committed(1)
            stats = coordinator.stats()
            assert stats.commit_failures == RECENT_DELAYS + 10
            # Only the latest delays are kept, so a sink failing for days does not grow a list.
            drawn = random.Random(1)
            every = [0.001 * drawn.random() for _ in range(RECENT_DELAYS + 10)]
            assert list(stats.retry_delays) == every[-RECENT_DELAYS:]
            tg.cancel_scope.cancel()


async def test_epochs_keep_being_acked_while_a_failed_commit_is_retried(
    tmp_path: Path,
) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        committer = FakeCommitter(store=store)
        committer.fail_commits = 10**6
        coordinator = make(committer, base_delay=0.001, max_delay=0.002)
        async with anyio.create_task_group() as tg:
            start(tg, coordinator, ServiceContext(SINK, store))
            handles = await register_started(coordinator, HALVES)
            await commit_all(handles, 1)
            await store.commit(1)
            await committer.wait_for(lambda: committer.names().count("commit_failed") >= 3)
            # Epoch 1's commit keeps failing; epochs 2 and 3 are still acknowledged.
            await commit_all(handles, 2)
            await store.commit(2)
            await commit_all(handles, 3)
            assert coordinator.stats().last_acked_epoch == 3
            assert committer.committed == []
            committer.fail_commits = 0
            await store.commit(3)
            with anyio.fail_after(WAIT):
                await coordinator.wait_committed(3)
            assert committer.committed == [1, 2, 3]
            # Every commit of epoch 1 came before any of a later epoch; each later epoch once.
            epochs = committer.epochs("commit")
            assert epochs[-2:] == [2, 3]
            assert set(epochs[:-2]) == {1}
            assert coordinator.stats().commit_failures == len(epochs) - 3
            tg.cancel_scope.cancel()


class EndingEpochs:
    """A committed-epoch stream that yields the store's committed epoch, then ends once
    ``end`` is set (a runtime whose stream ended while its services still run)."""

    def __init__(self, store: StateStore, end: anyio.Event) -> None:
        self._first: int | None = store.committed_epoch
        self._end = end

    def __aiter__(self) -> EndingEpochs:
        return self

    async def __anext__(self) -> int:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        await self._end.wait()
        raise StopAsyncIteration


async def test_the_end_of_the_committed_epochs_stream_is_an_error_not_a_silent_stop(
    tmp_path: Path,
) -> None:
    # The seed: "Hummock committed epoch sender closed unexpectedly" fails the coordinator;
    # otherwise no pre-committed epoch would ever commit again, without a word.
    async with await StateStore.open(tmp_path / "state.db") as store:
        ctx = ServiceContext(SINK, store)
        end = anyio.Event()
        ctx.committed_epochs = lambda: EndingEpochs(store, end)  # type: ignore[method-assign,assignment]
        coordinator = make(FakeCommitter())
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ctx)
            handles = await register_started(coordinator, HALVES)
            await commit_all(handles, 1)
            await commit_all(handles, 2)
            end.set()
            error = await run.failure()
        assert isinstance(error, CommittedEpochsEndedError)
        assert (error.sink, error.last_epoch, error.waiting) == (SINK, 0, (1, 2))
        assert "expected the runtime's committed epochs to continue" in str(error)
        assert "got the end of the stream after epoch 0" in str(error)
        # Every writer learns it (their next request fails with the cause).
        for handle in handles:
            with pytest.raises(CoordinatorAbortedError) as aborted:
                await handle.commit(3, meta(handle, 3))
            assert leaf(aborted.value.cause) is error


class LogEvents:
    """A structlog processor that keeps every entry and wakes waiters."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []
        self._changed = anyio.Event()

    def __call__(self, logger: Any, method: str, event_dict: Any) -> Any:
        event_dict["log_level"] = method
        self.entries.append(dict(event_dict))
        changed, self._changed = self._changed, anyio.Event()
        changed.set()
        raise structlog.DropEvent

    def named(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.entries if e["event"] == event]

    async def wait_for(self, event: str, count: int) -> None:
        with anyio.fail_after(WAIT):
            while len(self.named(event)) < count:
                await self._changed.wait()


async def test_a_long_commit_logs_a_warning_every_interval(tmp_path: Path) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        logs = LogEvents()
        old = structlog.get_config()
        structlog.configure(processors=[logs], cache_logger_on_first_use=False)
        try:
            committer = FakeCommitter()
            interval = 0.005
            coordinator = make(committer, warn_interval=interval)
            async with anyio.create_task_group() as tg:
                start(tg, coordinator, ServiceContext(SINK, store))
                handles = await register_started(coordinator, HALVES)
                await commit_all(handles, 1)
                committer.gate = anyio.Event()
                await store.commit(1)
                await logs.wait_for("commit still running", 3)
                committer.gate.set()
                await committer.wait_for(lambda: committer.committed == [1])
                warnings = logs.named("commit still running")
                assert {w["log_level"] for w in warnings} == {"warning"}
                assert {(w["epoch"], w["sink"]) for w in warnings} == {(1, SINK)}
                elapsed = [w["elapsed_s"] for w in warnings]
                assert elapsed == sorted(elapsed)
                assert all(e >= (i + 1) * interval * 0.99 for i, e in enumerate(elapsed))
                # No warning once the commit is over.
                count = len(warnings)
                await commit_all(handles, 2)
                await store.commit(2)
                await committer.wait_for(lambda: committer.committed == [1, 2])
                assert len(logs.named("commit still running")) == count
                tg.cancel_scope.cancel()
        finally:
            structlog.configure(**old)


# Recovery.


async def test_recovery_aborts_aborted_epochs_and_commits_pending_ones_in_order(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    async with await StateStore.open(path) as store:
        # Epoch 1 committed; 2 and 3 pre-committed and durable; 4 and 5 pre-committed after
        # the last durable checkpoint (3), 5 with a schema change.
        sink_states = SinkStates(store, SINK)
        for epoch in (1, 2, 3):
            await sink_states.persist_pending(epoch, {"m": epoch}, None)
        await sink_states.commit_and_prune(1)
        await store.commit(3)
        await sink_states.persist_pending(4, {"m": 4}, None)
        await sink_states.persist_pending(5, {"m": 5}, {"add": "c"})
    committer = FakeCommitter()
    async with await StateStore.open(path) as store:
        sink_states = SinkStates(store, SINK)
        # Opening the store marked the epochs after the durable checkpoint aborted.
        assert states(await sink_states.list()) == [
            (1, "committed"),
            (2, "pending"),
            (3, "pending"),
            (4, "aborted"),
            (5, "aborted"),
        ]
        committer.store = store
        coordinator = make(committer)
        async with anyio.create_task_group() as tg:
            start(tg, coordinator, ServiceContext(SINK, store))
            handles = [await coordinator.register(b) for b in HALVES]
            with anyio.fail_after(WAIT):
                assert [await h.wait_started() for h in handles] == [3, 3]
            with anyio.fail_after(WAIT):
                await coordinator.wait_committed(3)
            assert committer.calls[:3] == [
                ("abort", 4, {"m": 4}),
                ("abort", 5, {"m": 5}),
                ("recover", {2: {"m": 2}, 3: {"m": 3}}),
            ]
            assert committer.epochs("commit") == [2, 3]
            assert coordinator.stats().aborted_epochs == (4, 5)
            assert coordinator.is_committed(3)
            # The aborted records are gone; epochs 2 and 3 were marked committed at once (each
            # mark prunes the committed records before it).
            assert states(await sink_states.list()) == [(3, "committed")]
            await commit_all(handles, 4)
            assert states(await sink_states.list()) == [(3, "committed"), (4, "pending")]
            tg.cancel_scope.cancel()
        assert not any(c[0] == "commit" and c[1] in (4, 5) for c in committer.calls)


async def test_a_commit_is_marked_committed_at_once_and_not_run_again_after_a_restart(
    tmp_path: Path,
) -> None:
    # The seed marks an epoch committed in the meta store right after its commit
    # (ack_committed: commit_and_prune_epoch), so a restart does not commit it again.
    path = tmp_path / "state.db"
    async with await StateStore.open(path) as store:
        committer = FakeCommitter()
        coordinator = make(committer)
        sink_states = SinkStates(store, SINK)
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            handles = await register_started(coordinator, HALVES)
            await commit_all(handles, 1)
            assert states(await sink_states.list()) == [(1, "pending")]
            await store.commit(1)
            with anyio.fail_after(WAIT):
                await coordinator.wait_committed(1)
            # Right after the commit, with no later epoch and the run still going.
            assert states(await sink_states.list()) == [(1, "committed")]
            assert not run.ended.is_set()
            assert committer.epochs("commit") == [1]
            tg.cancel_scope.cancel()
    restarted = FakeCommitter()
    async with await StateStore.open(path) as store:
        coordinator = make(restarted)
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            handles = [await coordinator.register(b) for b in HALVES]
            with anyio.fail_after(WAIT):
                assert [await h.wait_started() for h in handles] == [1, 1]
            await anyio.wait_all_tasks_blocked()
            # Nothing to commit again: init with no pending epoch, and no commit call.
            assert restarted.calls == [("recover", {})]
            assert not run.ended.is_set()
            tg.cancel_scope.cancel()


async def test_recovery_after_epochs_committed_back_to_back(tmp_path: Path) -> None:
    """Two epochs made durable at once are committed back to back, each marked in turn (the
    second commit waits for the first mark). A restart must not commit either again."""
    path = tmp_path / "state.db"
    committer = FakeCommitter()
    async with await StateStore.open(path) as store:
        coordinator = make(committer)
        async with anyio.create_task_group() as tg:
            start(tg, coordinator, ServiceContext(SINK, store))
            handles = await register_started(coordinator, HALVES)
            await commit_all(handles, 1)
            await commit_all(handles, 2)
            await store.commit(2)
            with anyio.fail_after(WAIT):
                await coordinator.wait_committed(2)
            await commit_all(handles, 3)
            tg.cancel_scope.cancel()
        # Epoch 2's mark pruned epoch 1's committed record.
        assert states(await SinkStates(store, SINK).list()) == [(2, "committed"), (3, "pending")]
        await store.commit(3)
    restarted = FakeCommitter()
    async with await StateStore.open(path) as store:
        coordinator = make(restarted)
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            handles = [await coordinator.register(b) for b in HALVES]
            with anyio.fail_after(WAIT):
                assert [await h.wait_started() for h in handles] == [3, 3]
            with anyio.fail_after(WAIT):
                await coordinator.wait_committed(3)
            assert restarted.calls[0] == ("recover", {3: {"epoch": 3, "parts": 2}})
            assert restarted.epochs("commit") == [3]
            assert not run.ended.is_set()
            tg.cancel_scope.cancel()
        assert states(await SinkStates(store, SINK).list()) == [(3, "committed")]


async def test_recovery_treats_pending_records_before_a_committed_mark_as_committed(
    tmp_path: Path,
) -> None:
    """A pending record before the committed one (what an older run that let marks ride on
    the next pending record left at a crash): commits run in order, so it is not committed
    again."""
    path = tmp_path / "state.db"
    async with await StateStore.open(path) as store:
        await write_records(store, [(1, "pending"), (2, "committed"), (3, "pending")])
        await store.commit(3)
    committer = FakeCommitter()
    async with await StateStore.open(path) as store:
        coordinator = make(committer)
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            handles = [await coordinator.register(b) for b in HALVES]
            with anyio.fail_after(WAIT):
                assert [await h.wait_started() for h in handles] == [3, 3]
                await coordinator.wait_committed(3)
            assert committer.calls[0] == ("recover", {3: {"epoch": 3}})
            assert committer.epochs("commit") == [3]
            # Epoch 3's mark, written at once, pruned epoch 2's.
            assert states(await SinkStates(store, SINK).list()) == [(3, "committed")]
            assert not run.ended.is_set()
            tg.cancel_scope.cancel()
        assert states(await SinkStates(store, SINK).list()) == [(3, "committed")]


async def test_recovery_with_nothing_recorded_starts_fresh(tmp_path: Path) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        committer = FakeCommitter()
        coordinator = make(committer)
        async with anyio.create_task_group() as tg:
            start(tg, coordinator, ServiceContext(SINK, store))
            await register_started(coordinator, [FULL])
            assert committer.calls == [("recover", {})]
            assert coordinator.stats().aborted_epochs == ()
            tg.cancel_scope.cancel()


# Schema changes gate new writers.


async def rescale_to_thirds(
    tg: anyio.abc.TaskGroup, coordinator: Coordinator, a: WriterHandle, b: WriterHandle
) -> tuple[WriterHandle, list[Outcome]]:
    """A third writer joins; the first two shrink. Returns it and the three start waits."""
    c = await coordinator.register(THIRDS[2])
    await a.update_vnode_bitmap(THIRDS[0])
    await b.update_vnode_bitmap(THIRDS[1])
    outcomes = [spawn(tg, h.wait_started) for h in (a, b, c)]
    await anyio.wait_all_tasks_blocked()
    return c, outcomes


async def test_new_writers_start_only_once_a_pending_schema_change_is_committed(
    tmp_path: Path,
) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        committer = FakeCommitter()
        coordinator = make(committer)
        change = {"add_column": "c"}
        async with anyio.create_task_group() as tg:
            start(tg, coordinator, ServiceContext(SINK, store))
            a, b = await register_started(coordinator, HALVES)
            await commit_all([a, b], 1, change)
            c, outcomes = await rescale_to_thirds(tg, coordinator, a, b)
            with anyio.move_on_after(scaled(0.02)):
                await outcomes[0].done.wait()
            assert not any(o.done.is_set() for o in outcomes)
            assert coordinator.stats().running == 0
            await store.commit(1)
            assert [await o.wait() for o in outcomes] == [1, 1, 1]
            # Started only after the schema change was committed.
            assert committer.calls[-2:] == [
                ("commit", 1, {"epoch": 1, "parts": 2}, change),
                ("committed", 1),
            ]
            await commit_all([a, b, c], 2)
            tg.cancel_scope.cancel()


async def test_new_writers_wait_for_every_pending_commit_after_a_schema_change(
    tmp_path: Path,
) -> None:
    """The schema change is not the last pending epoch: still, nobody starts before it and
    every pending commit after it are flushed."""
    async with await StateStore.open(tmp_path / "state.db") as store:
        committer = FakeCommitter()
        coordinator = make(committer)
        change = {"add_column": "c"}
        async with anyio.create_task_group() as tg:
            start(tg, coordinator, ServiceContext(SINK, store))
            a, b = await register_started(coordinator, HALVES)
            await commit_all([a, b], 1, change)
            await commit_all([a, b], 2)
            _, outcomes = await rescale_to_thirds(tg, coordinator, a, b)
            assert not any(o.done.is_set() for o in outcomes), (
                "started with a schema change pending"
            )
            await store.commit(1)
            await committer.wait_for(lambda: committer.committed == [1])
            await anyio.wait_all_tasks_blocked()
            assert not any(o.done.is_set() for o in outcomes), "started with epoch 2 pending"
            await store.commit(2)
            assert [await o.wait() for o in outcomes] == [2, 2, 2]
            assert committer.committed == [1, 2]
            tg.cancel_scope.cancel()


async def test_writers_start_after_a_recovered_schema_change_is_committed(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    change = {"add_column": "c"}
    async with await StateStore.open(path) as store:
        # A prepared epoch's metadata carries its change (the committer's prepare put it there).
        await SinkStates(store, SINK).persist_pending(
            2, {"epoch": 2, "schema_change": change}, change
        )
        await store.commit(2)
    committer = FakeCommitter()
    async with await StateStore.open(path) as store:
        committer.gate = anyio.Event()
        coordinator = make(committer)
        async with anyio.create_task_group() as tg:
            start(tg, coordinator, ServiceContext(SINK, store))
            handles = [await coordinator.register(b) for b in HALVES]
            outcomes = [spawn(tg, h.wait_started) for h in handles]
            await committer.wait_for(lambda: "commit" in committer.names())
            await anyio.wait_all_tasks_blocked()
            assert not any(o.done.is_set() for o in outcomes), "started before the commit"
            committer.gate.set()
            assert [await o.wait() for o in outcomes] == [2, 2]
            assert committer.calls[1] == ("commit", 2, {"epoch": 2}, change)
            assert committer.committed == [2]
            tg.cancel_scope.cancel()


# Rescaling.


async def test_rescaling_join_leave_and_bitmap_changes_realign_the_writers(
    tmp_path: Path,
) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        committer = FakeCommitter()
        coordinator = make(committer)
        async with anyio.create_task_group() as tg:
            start(tg, coordinator, ServiceContext(SINK, store))
            a, b = await register_started(coordinator, HALVES)
            await commit_all([a, b], 1)
            # Join: a third writer, the others shrink. Not realigned until every writer moved.
            c = await coordinator.register(THIRDS[2])
            await a.update_vnode_bitmap(THIRDS[0])
            started_a = spawn(tg, a.wait_started)
            await anyio.wait_all_tasks_blocked()
            assert not started_a.done.is_set()
            assert coordinator.stats().running == 0
            await b.update_vnode_bitmap(THIRDS[1])
            with anyio.fail_after(WAIT):
                assert [await started_a.wait(), await b.wait_started(), await c.wait_started()] == [
                    1,
                    1,
                    1,
                ]
            assert (coordinator.stats().writers, coordinator.stats().running) == (3, 3)
            await commit_all([a, b, c], 2)
            # Leave: the third stops, the others take its vnodes.
            await c.stop()
            await a.update_vnode_bitmap(HALVES[0])
            await b.update_vnode_bitmap(HALVES[1])
            with anyio.fail_after(WAIT):
                assert [await a.wait_started(), await b.wait_started()] == [2, 2]
            assert (coordinator.stats().writers, coordinator.stats().running) == (2, 2)
            await commit_all([a, b], 3)
            # Bitmap change only: swap the halves.
            await a.update_vnode_bitmap(HALVES[1])
            await b.update_vnode_bitmap(HALVES[0])
            with anyio.fail_after(WAIT):
                assert [await a.wait_started(), await b.wait_started()] == [3, 3]
            await commit_all([a, b], 4)
            assert committer.epochs("prepare") == [1, 2, 3, 4]
            assert [len(c[2]) for c in committer.calls if c[0] == "prepare"] == [2, 3, 2, 2]
            tg.cancel_scope.cancel()


async def test_rescaling_with_overlapping_new_bitmaps_is_a_duplicate_vnode_error(
    tmp_path: Path,
) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        coordinator = make(FakeCommitter())
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            a, b = await register_started(coordinator, HALVES)
            await a.update_vnode_bitmap(FULL)
            await b.update_vnode_bitmap(VnodeBitmap.from_vnodes([7]))
            error = await run.failure()
            assert isinstance(error, DuplicateVnodeError)
            assert (error.vnodes, error.stage) == ([7], "realignment")


async def test_commit_request_during_realignment_is_an_unexpected_request(tmp_path: Path) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        coordinator = make(FakeCommitter())
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            a, b = await register_started(coordinator, HALVES)
            await commit_all([a, b], 1)
            await a.update_vnode_bitmap(FULL)  # realigning: b has neither moved nor left
            error = await (await post(tg, b, 2)).wait_error()
            assert isinstance(error, UnexpectedWriterRequestError)
            assert (error.stage, error.request, error.writer, error.epoch) == (
                "realignment",
                "Commit",
                b.handle_id,
                2,
            )
            assert leaf(await run.failure()) is error
            with pytest.raises(CoordinatorAbortedError):
                await a.wait_started()


# Failure.


async def test_a_failing_pre_commit_aborts_every_writer_with_the_cause(tmp_path: Path) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        committer = FakeCommitter()
        boom = RuntimeError("pre-commit exploded")
        committer.fail_prepare = boom
        coordinator = make(committer)
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            a, b = await register_started(coordinator, HALVES)
            outcomes = [await post(tg, h, 1) for h in (a, b)]
            assert leaf(await run.failure()) is boom
            for outcome in outcomes:
                error = await outcome.wait_error()
                assert isinstance(error, CoordinatorAbortedError)
                assert error.cause is boom
                assert str(error) == (
                    f"sink {SINK!r}: the coordinator failed: RuntimeError: pre-commit exploded"
                )
            # Every later call on any handle fails the same way, at once.
            for handle in (a, b):
                with pytest.raises(CoordinatorAbortedError) as info:
                    await handle.commit(2, meta(handle, 2))
                assert info.value.cause is boom
                with pytest.raises(CoordinatorAbortedError):
                    await handle.wait_started()
                await handle.stop()  # a no-op on an aborted handle


async def test_a_commit_failed_for_good_fails_the_run_at_once_and_acks_no_writer_after_it(
    tmp_path: Path,
) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        committer = FakeCommitter()
        gone = PermissionError("the table's directory is read-only")
        committer.fail_for_good = gone
        coordinator = make(committer, commit_retry_timeout=3600.0)
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            a, b = await register_started(coordinator, HALVES)
            await commit_all([a, b], 1)
            await store.commit(1)
            failure = await run.failure()
        assert isinstance(failure, TableCommitFailedError)
        assert (failure.sink, failure.epoch, failure.cause, failure.permanent) == (
            SINK, 1, gone, True,
        )  # fmt: skip
        assert committer.epochs("commit") == [1]  # not retried
        assert coordinator.stats().commit_failures == 0
        # No writer is acknowledged after it: their next commit fails with the cause.
        for handle in (a, b):
            with pytest.raises(CoordinatorAbortedError) as info:
                await handle.commit(2, meta(handle, 2))
            assert info.value.cause is failure
        # The epoch stays pending: a restart commits it once the table is fixed.
        assert states(await SinkStates(store, SINK).list()) == [(1, "pending")]


async def test_a_commit_failing_transiently_past_the_retry_bound_fails_the_run_within_it(
    tmp_path: Path,
) -> None:
    bound = 0.05
    async with await StateStore.open(tmp_path / "state.db") as store:
        committer = FakeCommitter()
        committer.fail_commits = 10**6
        coordinator = make(committer, commit_retry_timeout=bound)
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            handles = await register_started(coordinator, HALVES)
            await commit_all(handles, 1)
            await store.commit(1)
            await committer.wait_for(lambda: "commit_failed" in committer.names())
            first_failure = anyio.current_time()
            failure = await run.failure()
            failed_at = anyio.current_time()
        assert isinstance(failure, TableCommitFailedError)
        assert (failure.epoch, failure.retry_timeout, failure.permanent) == (1, bound, False)
        assert isinstance(failure.cause, CommitFailedError)
        # Retried (the backoff's delays are at most 4 ms) until the bound, then given up.
        attempts = committer.epochs("commit")
        assert len(attempts) > 2
        assert set(attempts) == {1}
        assert failed_at - first_failure >= bound * 0.9
        assert committer.committed == []


async def test_a_commit_recovering_within_the_retry_bound_commits(tmp_path: Path) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        committer = FakeCommitter()
        committer.fail_commits = 3
        coordinator = make(committer, commit_retry_timeout=scaled(60))
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            handles = await register_started(coordinator, HALVES)
            await commit_all(handles, 1)
            await store.commit(1)
            with anyio.fail_after(WAIT):
                await coordinator.wait_committed(1)
            assert committer.committed == [1]
            assert coordinator.stats().commit_failures == 3
            assert run.error is None
            tg.cancel_scope.cancel()


async def test_replayed_commits_are_counted_in_stats_and_metrics(tmp_path: Path) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        committer = FakeCommitter()
        committer.committed = [2]  # the table holds epoch 2 already (an earlier run)
        coordinator = make(committer)
        async with anyio.create_task_group() as tg:
            start(tg, coordinator, ServiceContext(SINK, store))
            handles = await register_started(coordinator, HALVES)
            for epoch in (1, 2, 3):
                await commit_all(handles, epoch)
            await store.commit(3)
            with anyio.fail_after(WAIT):
                await coordinator.wait_committed(3)
            stats = coordinator.stats()
            families = {f.name: f for f in coordinator.metric_families()}
            tg.cancel_scope.cancel()
    assert (stats.committed_epochs, stats.commit_replays) == (3, 2)
    # A replay went through too: the last commit's time is set.
    assert stats.last_commit_time is not None
    assert families["barrierflow_sink_commit_replays"].value(sink=SINK) == 2


async def test_a_failure_also_aborts_requests_still_queued_for_the_coordinator(
    tmp_path: Path,
) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        committer = FakeCommitter()
        boom = RuntimeError("the table is gone")
        coordinator = make(committer)
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            a, b = await register_started(coordinator, HALVES)
            await commit_all([a, b], 1)
            committer.gate = anyio.Event()
            await store.commit(1)
            await committer.wait_for(lambda: "commit" in committer.names())
            # While the coordinator is busy committing, a request and a registration queue up.
            queued = await post(tg, a, 2)
            joining = spawn(tg, lambda: coordinator.register(FULL))
            await anyio.wait_all_tasks_blocked()
            committer.fail_for_good = boom
            committer.gate.set()
            failure = await run.failure()
            assert isinstance(failure, TableCommitFailedError)
            assert failure.cause is boom
            error = await queued.wait_error()
            assert isinstance(error, CoordinatorAbortedError)
            assert error.cause is failure
            late = await joining.wait()
            with anyio.fail_after(WAIT), pytest.raises(CoordinatorAbortedError):
                await late.wait_started()


async def test_a_cancelled_run_aborts_every_writer_handle(tmp_path: Path) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        coordinator = make(FakeCommitter())
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            a, b = await register_started(coordinator, HALVES)
            pending = await post(tg, a, 1)
            await run.stop()
            assert run.error is None
            error = await pending.wait_error()
            assert isinstance(error, CoordinatorAbortedError)
            assert isinstance(error.cause, ActorGoneError)
            assert "cancelled" in str(error.cause)
            with pytest.raises(CoordinatorAbortedError):
                await b.commit(1, meta(b, 1))


async def test_a_new_run_serves_new_handles_after_a_cancelled_one(tmp_path: Path) -> None:
    async with await StateStore.open(tmp_path / "state.db") as store:
        committer = FakeCommitter()
        coordinator = make(committer)
        async with anyio.create_task_group() as tg:
            run = start(tg, coordinator, ServiceContext(SINK, store))
            handles = await register_started(coordinator, HALVES)
            await commit_all(handles, 1)
            await store.commit(1)
            with anyio.fail_after(WAIT):
                await coordinator.wait_committed(1)
            await run.stop()
            start(tg, coordinator, ServiceContext(SINK, store))
            handles = [await coordinator.register(b) for b in HALVES]
            with anyio.fail_after(WAIT):
                assert [await h.wait_started() for h in handles] == [1, 1]
            await commit_all(handles, 2)
            assert committer.names().count("recover") == 2
            assert coordinator.stats().acked_epochs == 1  # counters are per run
            tg.cancel_scope.cancel()


# A model-based test: random scenarios against a model of exactly-once commits.


def random_partition(rng: random.Random, writers: int) -> list[VnodeBitmap]:
    """``writers`` non-empty bitmaps covering the 256 vnodes exactly once, at random."""
    owners = list(range(writers)) + [rng.randrange(writers) for _ in range(256 - writers)]
    rng.shuffle(owners)
    return [
        VnodeBitmap.from_vnodes([v for v, o in enumerate(owners) if o == w]) for w in range(writers)
    ]


STEP = st.one_of(
    st.tuples(st.just("commit"), st.integers(0, 3), st.booleans()),
    st.tuples(st.just("durable")),
    st.tuples(st.just("rescale"), st.integers(1, 4)),
    st.tuples(st.just("restart"), st.integers(1, 4)),
)


class Scenario:
    """Plays steps against one coordinator and checks them against a model."""

    def __init__(self, path: Path, seed: int) -> None:
        self.path = path
        self.rng = random.Random(seed)
        self.last_epoch = 0  # the last epoch used (epochs only grow, across restarts too)
        self.acked: list[int] = []  # epochs acked, not aborted
        self.aborted: list[int] = []  # epochs acked, then aborted by a restart
        self.changes: dict[int, Any] = {}
        self.handles: list[WriterHandle] = []

    async def run(self, writers: int, steps: list[tuple[Any, ...]]) -> None:
        store = await StateStore.open(self.path)
        try:
            self.store = store
            self.committer = FakeCommitter(store=store)
            self.coordinator = make(self.committer, rng=random.Random(0))
            async with anyio.create_task_group() as tg:
                self.tg = tg
                self.current = start(tg, self.coordinator, ServiceContext(SINK, store))
                await self.join(writers)
                for step in steps:
                    await getattr(self, step[0])(*step[1:])
                    assert not self.current.ended.is_set(), self.current.error
                await self.finish()
                tg.cancel_scope.cancel()
        finally:
            await store.aclose()

    async def join(self, writers: int) -> None:
        self.handles = [
            await self.coordinator.register(b) for b in random_partition(self.rng, writers)
        ]
        with anyio.fail_after(WAIT):
            rewinds = {await h.wait_started() for h in self.handles}
        assert len(rewinds) == 1
        rewind = rewinds.pop()
        assert rewind == max(self.acked, default=None)
        if rewind is None:
            self.last_epoch += 1
            initial = self.last_epoch
            with anyio.fail_after(WAIT):
                async with anyio.create_task_group() as tg:
                    for handle in self.handles:
                        tg.start_soon(handle.align_initial_epoch, initial)

    async def commit(self, failures: int, change: bool) -> None:
        self.committer.fail_commits = failures
        self.last_epoch += 1
        schema_change = {"v": self.last_epoch} if change else None
        # The writers' requests arrive in a random order.
        await commit_all(
            self.rng.sample(self.handles, len(self.handles)), self.last_epoch, schema_change
        )
        self.acked.append(self.last_epoch)
        self.changes[self.last_epoch] = schema_change

    async def durable(self) -> None:
        if self.acked and self.acked[-1] > self.store.committed_epoch:
            await self.store.commit(self.acked[-1])

    async def rescale(self, writers: int) -> None:
        old = self.handles
        bitmaps = random_partition(self.rng, writers)
        new = [await self.coordinator.register(b) for b in bitmaps[len(old) :]]
        kept = old[: len(bitmaps)]
        for handle, bitmap in zip(kept, bitmaps, strict=False):
            await handle.update_vnode_bitmap(bitmap)
        for handle in old[len(bitmaps) :]:
            await handle.stop()
        self.handles = [*kept, *new]
        waits = [spawn(self.tg, h.wait_started) for h in self.handles]
        if any(self.changes[e] is not None for e in self.acked if e not in self.committed()):
            # New writers wait for the schema change's commit: make everything durable.
            await self.durable()
        rewinds = {await w.wait() for w in waits}
        assert rewinds == {max(self.acked, default=None)}
        if rewinds == {None}:
            self.last_epoch += 1
            initial = self.last_epoch
            with anyio.fail_after(WAIT):
                async with anyio.create_task_group() as tg:
                    for handle in self.handles:
                        tg.start_soon(handle.align_initial_epoch, initial)

    def committed(self) -> list[int]:
        return self.committer.committed

    async def restart(self, writers: int) -> None:
        await self.current.stop()
        # What recovery does before it restarts the graph.
        await self.store.abort_epoch_records_after_committed()
        durable = self.store.committed_epoch
        self.aborted += [e for e in self.acked if e > durable]
        self.acked = [e for e in self.acked if e <= durable]
        self.committer.fail_commits = 0
        self.current = start(self.tg, self.coordinator, ServiceContext(SINK, self.store))
        await self.join(writers)

    async def finish(self) -> None:
        self.committer.fail_commits = 0
        await self.durable()
        if self.acked:
            with anyio.fail_after(WAIT):
                await self.coordinator.wait_committed(self.acked[-1])
        committer = self.committer
        # Every acked and durable epoch committed exactly once (in effect), in order.
        assert committer.committed == self.acked
        # Never an epoch before its checkpoint was durable, never an aborted one.
        assert all(e <= durable for e, durable in committer.durable_at_commit)
        assert not set(committer.epochs("commit")) & set(self.aborted)
        # Only acked epochs are committed; within a run, in epoch order (a retry repeats the
        # epoch). A run may re-commit an epoch committed before a restart (its mark was not
        # written yet): the committer skips it, being idempotent.
        assert set(committer.epochs("commit")) <= set(self.acked)
        last_in_run = 0
        for call in committer.calls:
            if call[0] == "recover":
                last_in_run = 0
            elif call[0] == "commit":
                assert call[1] >= last_in_run, committer.calls
                last_in_run = call[1]
        assert committer.epochs("abort") == self.aborted
        # The aborted epochs' records are gone once a run recovered them.
        records = await SinkStates(self.store, SINK).list()
        assert all(r.state is not SinkState.ABORTED for r in records)


# A sync test (hypothesis drives it): anyio.run on the backend the module's anyio mark gives.
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    writers=st.integers(1, 4),
    steps=st.lists(STEP, max_size=12),
    seed=st.integers(0, 2**32 - 1),
)
def test_random_scenarios_commit_every_durable_epoch_exactly_once(
    anyio_backend: str, writers: int, steps: list[tuple[Any, ...]], seed: int
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        scenario = Scenario(Path(directory) / "state.db", seed)
        anyio.run(scenario.run, writers, steps, backend=anyio_backend)
