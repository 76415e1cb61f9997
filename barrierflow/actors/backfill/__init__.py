"""Backfills: the source backfill and the snapshot backfill (each with its pure state machine
in its own module) and the materialize actor. Empty until they land."""

__all__: list[str] = []
