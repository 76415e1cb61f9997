"""The coordinator worker's rules (seed 000, ``coordinator_worker.rs``) that the mutation run
found unguarded: its run, recovery from the meta store, the meta store's records and the
replies to writers (``coordinator.py``, ``recovery.py``, ``meta_store.py``, ``replies.py``)."""
