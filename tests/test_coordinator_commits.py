"""The coordinator's commit queue, vnode coverage and writer handles (seed 000,
``coordinator_worker.rs``): rules the mutation run found unguarded (``commit_queue.py``,
``coverage.py``, ``handles.py``)."""
