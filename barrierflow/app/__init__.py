"""The product built on the library: the demo's three acts, the ``barrierflow`` command line
and the crash harness (``barrierflow chaos``), with their helpers (the chaos trace, quiet
Ctrl-C).

Nothing in the library (``channels``, ``runtime``, ``actors``, ``connectors``,
``spark_bridge``, ``testing``) imports this package: dependencies point one way, library ←
app. Run it as ``python -m barrierflow`` or the ``barrierflow`` command
(:func:`barrierflow.app.cli.main`).
"""

__all__: list[str] = []
