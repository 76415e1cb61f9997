r"""The coordinator worker of a sink: exactly-once commits across its parallel writers.

After RisingWave's ``coordinator_worker.rs``. The rules:

* **Init.** The coordinator first reads its records from the meta store (:mod:`.recovery`),
  then waits until the registered writers' bitmaps cover every vnode (:mod:`.coverage`). It
  starts the writers with the *rewind epoch* (the last epoch acknowledged to writers before a
  restart). Without one, it collects every writer's initial epoch and acknowledges the
  **maximum** to all.
* **Per epoch.** Commit requests are collected until their bitmaps cover every vnode exactly
  once; only the oldest pending epoch can complete; requests come only from running writers;
  the writers of an epoch must send the same schema change
  (:class:`~barrierflow.errors.SchemaChangeMismatchError` shows both).
* The writers send :class:`~barrierflow.actors.sinks.table.Manifest`\ s; the
  :class:`~barrierflow.actors.sinks.table.Committer` prepares one commit from an epoch's
  manifests. **Single-phase** committers commit it at once. **Two-phase** committers: the epoch
  is persisted as *pending* (metadata and schema change) in the meta store (:mod:`.meta_store`),
  the writers are acknowledged — a writer passes its checkpoint barrier only after that, so no
  checkpoint can be durable without its pending record — and the commit runs only once the
  runtime's committed epoch has reached the epoch, in epoch order, retried after the seed's
  backoff (10^n ms, capped at 60 s, full jitter) and marked *committed* in the meta store at
  once (:mod:`.commit_queue`). The end of the runtime's committed epochs is
  :class:`~barrierflow.actors.sinks.errors.CommittedEpochsEndedError`.
* **Schema change.** New writers are not started while an uncommitted schema change is pending;
  they start once every pending commit has been flushed.
* **Rescaling.** Writers may join, leave (``stop``) or change bitmaps; the coordinator realigns
  until the new set covers every vnode exactly once, then starts them; a commit request during
  realignment is :class:`~barrierflow.errors.UnexpectedWriterRequestError`.
* **Failure.** A coordinator that fails aborts every writer handle with the cause
  (:class:`~barrierflow.errors.CoordinatorAbortedError`), then fails the graph.

One module per idea: :mod:`.handles` (what writers hold and send), :mod:`.coverage` (rounds
that collect requests until every vnode is covered), :mod:`.commit_queue` (two-phase commits
waiting for durability, retried with backoff), :mod:`.recovery` (the records found at a
restart), :mod:`.meta_store` (those records, persisted), :mod:`.replies` (the answers owed to
writers, failed with the cause when a run fails) and :mod:`.coordinator` (the service).
"""

import typing as _typing

from barrierflow._removed import removed_names as _removed_names

#: Nothing: the coordinator is the library's own; what a user reads of it
#: (``Coordinator``, ``CoordinatorStats``) has one home, :mod:`barrierflow.actors`.
__all__: list[str] = []

if not _typing.TYPE_CHECKING:
    # A removed name says what replaced it (see CHANGELOG.md); a type checker does not see
    # this, so it still reports a removed or misspelt name as missing.
    __getattr__ = _removed_names(__name__)
