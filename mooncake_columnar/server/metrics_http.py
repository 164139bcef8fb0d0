"""Prometheus endpoint of ``serve``: ``/metrics`` (RPC and wire counters, gauges read from the store at
scrape time, and the engine's own collector) and ``/health``, served on the server's event loop."""
from __future__ import annotations

import logging
from typing import Any, Callable, Iterator, Mapping

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from .. import metrics
from .http_metadata import HttpServerHandle, serve_app

log = logging.getLogger(__name__)

# Master RPCs take microseconds on the columnar engine; the top buckets catch lock waits and batch calls.
LATENCY_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5,
                   1.0)

Stats = Callable[[], Mapping[str, float]]

# stats() key -> (gauge name, help)
STAT_GAUGES: dict[str, tuple[str, str]] = {
    "objects": ("mooncake_objects", "Objects in the store"),
    "bytes": ("mooncake_used_bytes", "Bytes used by replicas over all mounted segments"),
    "capacity_bytes": ("mooncake_capacity_bytes", "Capacity of all mounted segments"),
    "segments": ("mooncake_segments", "Mounted segments"),
    "clients": ("mooncake_clients", "Clients with mounted segments"),
}

# Family names this module exports; the engine's collector exports mooncake_<name> for its own names.
SERVER_METRIC_NAMES = frozenset({
    "mooncake_rpc_requests", "mooncake_rpc_errors", "mooncake_rpc_latency_seconds", "mooncake_wire_errors",
    "mooncake_rpc_connections", *(name for name, _ in STAT_GAUGES.values()),
})


class StatsCollector:
    """Gauges read from ``stats()`` at scrape time; a failing callback drops them from that scrape only."""

    def __init__(self, stats: Stats) -> None:
        self._stats = stats

    def describe(self) -> list[GaugeMetricFamily]:
        # Lets the registry reject a clashing name at registration without calling stats().
        return [GaugeMetricFamily(name, doc) for name, doc in STAT_GAUGES.values()]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            values = dict(self._stats())
        except Exception:
            log.exception("metrics stats callback failed; store gauges skipped in this scrape")
            return
        for key, (name, doc) in STAT_GAUGES.items():
            if key not in values:
                continue
            try:
                value = float(values[key])
            except (TypeError, ValueError):
                log.warning("metrics stats callback gave a non-number for %r: %r", key, values[key])
                continue
            yield GaugeMetricFamily(name, doc, value=value)


class ServerMetrics:
    """The RPC server's own series in ``registry`` (it is the RPC server's observer), plus the
    scrape-time ``stats`` gauges and the engine's collector when given. ``rpc`` and ``kind`` labels
    must come from a fixed set (method names, error kinds), never from client input, to bound the
    series count."""

    def __init__(self, registry: CollectorRegistry, stats: Stats | None = None, *,
                 engine_metrics: metrics.Metrics | None = None) -> None:
        self.registry = registry
        self._requests = Counter("mooncake_rpc_requests", "RPC requests handled", ["rpc"], registry=registry)
        self._errors = Counter("mooncake_rpc_errors", "RPC requests that failed", ["rpc"], registry=registry)
        self._latency = Histogram("mooncake_rpc_latency_seconds", "RPC handling time", ["rpc"],
                                  buckets=LATENCY_BUCKETS, registry=registry)
        self._wire_errors = Counter("mooncake_wire_errors", "Malformed RPC frames (bad magic, truncated, oversize...)",
                                    ["kind"], registry=registry)
        self._connections = Gauge("mooncake_rpc_connections", "Open RPC connections", registry=registry)
        self._series: dict[str, tuple[Any, Any, Any]] = {}
        self.stats_collector: StatsCollector | None = None
        if stats is not None:
            self.stats_collector = StatsCollector(stats)
            registry.register(self.stats_collector)
        self.engine_collector: metrics.MetricsCollector | None = None
        if engine_metrics is not None:
            self.engine_collector = register_engine_metrics(engine_metrics, registry)

    def observe(self, rpc_name: str, seconds: float, ok: bool) -> None:
        series = self._series.get(rpc_name)
        if series is None:  # the labelled children, looked up once per RPC name (a lookup is a lock and a dict)
            # the error series is created on first use so a clean RPC shows 0 errors, not no series
            series = self._series[rpc_name] = (self._requests.labels(rpc_name), self._errors.labels(rpc_name),
                                               self._latency.labels(rpc_name))
        requests, errors, latency = series
        requests.inc()
        if not ok:
            errors.inc()
        latency.observe(seconds)

    def wire_error(self, kind: str) -> None:
        self._wire_errors.labels(kind).inc()

    def connections(self, delta: int) -> None:
        """``+1`` when a connection opens, ``-1`` when it closes."""
        self._connections.inc(delta)


def register_engine_metrics(engine_metrics: metrics.Metrics, registry: CollectorRegistry) -> metrics.MetricsCollector:
    """Export the engine's counters and gauges (evictions, remounts, snapshots...) from ``registry``."""
    return metrics.register(engine_metrics, registry)


def make_metrics_app(registry: CollectorRegistry) -> web.Application:
    async def scrape(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="OK")

    app = web.Application()
    app.router.add_get("/metrics", scrape)
    app.router.add_get("/health", health)
    return app


async def start_metrics_server(host: str, port: int, registry: CollectorRegistry) -> HttpServerHandle:
    handle = HttpServerHandle(await serve_app(make_metrics_app(registry), host, port))
    log.info("metrics endpoint listening on %s/metrics", handle.url)
    return handle
