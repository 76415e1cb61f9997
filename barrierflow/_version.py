"""The package's version, in a module of its own: the layers read it (the metrics endpoint's
``barrierflow_build_info``) without importing the package root, which is the error hub."""

__version__ = "0.1.0"
