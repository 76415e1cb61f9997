"""The Prometheus endpoint of a running runtime: ``RuntimeConfig(metrics_port=...)``.

:class:`MetricsServer` serves the runtime's :class:`~barrierflow.runtime.metrics.MetricsRegistry`
in Prometheus's text exposition format at ``/metrics`` with ``prometheus_client``'s own HTTP
server (a daemon thread). A scrape asks the runtime's event loop for a snapshot
(``anyio.from_thread.run`` of :meth:`~barrierflow.runtime.metrics.MetricsRegistry.snapshot`
with the loop's token: the parts that ask a server are refreshed, then everything is
collected), so the registry is only ever read on the loop, and the thread never touches a
half-updated structure. The server is started when the
runtime starts and shut down (its port freed) when it stops. Needs the ``metrics`` extra.

Beside the pipeline's metrics the endpoint serves what describes the process that runs it,
which an operator looks at first and no part of the pipeline knows: prometheus_client's
process collector (``process_cpu_seconds_total``, ``process_resident_memory_bytes``,
``process_open_fds``, ...; where the platform has ``/proc``) and platform collector
(``python_info``), and ``barrierflow_build_info`` (1, labelled with the versions of
barrierflow, Python and pyarrow and the event loop's backend: what a bug report needs). They
are registered with the endpoint's own collector registry, not prometheus_client's global one:
two runtimes in one process keep separate endpoints.
"""

from __future__ import annotations

import platform
from typing import Any, final

import anyio.from_thread
import anyio.lowlevel
import pyarrow
import sniffio

from barrierflow._extras import require
from barrierflow._version import __version__
from barrierflow.runtime.errors import MetricsPortError
from barrierflow.runtime.metrics import MetricFamily, MetricsRegistry, gauge

__all__ = ["MetricsServer", "build_info", "to_prometheus"]


def build_info(backend: str) -> MetricFamily:
    """``barrierflow_build_info``: 1, labelled with the versions of barrierflow, Python and
    pyarrow and the event loop's ``backend`` (``asyncio``, ``trio``) — Prometheus's idiom for
    facts that are text (a query joins on the labels)."""
    labels = {
        "version": __version__,
        "python": platform.python_version(),
        "pyarrow": pyarrow.__version__,
        "backend": backend,
    }
    return gauge(
        "barrierflow_build_info",
        "1, labelled with the versions of barrierflow, Python and pyarrow and the backend",
        [(labels, 1.0)],
    )


def to_prometheus(families: list[MetricFamily]) -> list[Any]:
    """``families`` as ``prometheus_client`` metric families (a counter's samples get their
    ``_total``)."""
    core = require("metrics", "prometheus_client.metrics_core")
    converted = []
    for family in families:
        metric = core.Metric(family.name, family.help, family.kind)
        for sample in family.samples:
            suffix = "_total" if family.kind == "counter" and not sample.suffix else sample.suffix
            metric.add_sample(family.name + suffix, dict(sample.labels), sample.value)
        converted.append(metric)
    return converted


class _Collector:
    """The runtime's registry as a ``prometheus_client`` collector, read on the loop."""

    def __init__(self, registry: MetricsRegistry, token: Any, info: MetricFamily) -> None:
        self._registry = registry
        self._token = token
        self._info = info

    def collect(self) -> list[Any]:
        try:
            families = anyio.from_thread.run(self._registry.snapshot, token=self._token)
        except Exception:  # the loop is gone (the runtime stopping): an empty scrape
            return []
        return to_prometheus([*families, self._info])


@final
class MetricsServer:
    """Serves ``registry`` at ``http://host:port/metrics`` (see the module docstring).

    Raises:
        MissingExtraError: prometheus-client is not installed.
    """

    def __init__(self, registry: MetricsRegistry, host: str, port: int) -> None:
        self._registry = registry
        self._host = host
        self._port = port
        self._server: Any = None
        self._thread: Any = None

    @property
    def url(self) -> str | None:
        """Where it serves, its port resolved (``None`` when not serving)."""
        if self._server is None:
            return None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/metrics"

    def start(self) -> None:
        """Start serving; call on the runtime's event loop (its token is taken here).

        Raises:
            MetricsPortError: the address cannot be bound (the port in use or not allowed, the
                host not an address of this machine); ``__cause__`` is the ``OSError``.
        """
        exposition = require("metrics", "prometheus_client.exposition")
        registry_module = require("metrics", "prometheus_client.registry")
        collectors = require("metrics", "prometheus_client")
        registry = registry_module.CollectorRegistry(auto_describe=False)
        info = build_info(sniffio.current_async_library())
        registry.register(_Collector(self._registry, anyio.lowlevel.current_token(), info))
        collectors.ProcessCollector(registry=registry)
        collectors.PlatformCollector(registry=registry)
        try:
            self._server, self._thread = exposition.start_http_server(
                self._port, addr=self._host, registry=registry
            )
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise MetricsPortError(self._host, self._port, reason) from exc

    def stop(self) -> None:
        """Stop serving and free the port (idempotent; blocks until the thread ended)."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
            thread.join()
