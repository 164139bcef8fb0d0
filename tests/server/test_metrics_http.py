"""The Prometheus endpoint, started for real on loopback and scraped with aiohttp's client."""
from __future__ import annotations

import asyncio
import logging
import re
from typing import Mapping

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from mooncake_columnar import ManualClocks, MasterService
from mooncake_columnar.server.metrics_http import (
    SERVER_METRIC_NAMES,
    ServerMetrics,
    StatsCollector,
    register_engine_metrics,
    start_metrics_server,
)
from mooncake_columnar.testing.builders import make_master


def scrape(registry: CollectorRegistry, path: str = "/metrics") -> tuple[int, str, str]:
    """(status, content type, body) of one GET against a metrics server started on a free port."""
    async def main() -> tuple[int, str, str]:
        server = await start_metrics_server("127.0.0.1", 0, registry)
        try:
            async with aiohttp.ClientSession() as client, client.get(server.url + path) as r:
                return r.status, r.headers["Content-Type"], await r.text()
        finally:
            await server.close()
    return asyncio.run(main())


def sample(text: str, series: str) -> float:
    """The value of one exposition line ``series value``."""
    m = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
    assert m, f"{series} not in scrape:\n{text}"
    return float(m.group(1))


def test_rpc_counters_and_latency_histogram_with_labels() -> None:
    registry = CollectorRegistry()
    sm = ServerMetrics(registry)
    sm.observe("Put", 2e-5, ok=True)
    sm.observe("Put", 3e-3, ok=False)
    sm.observe("GetReplicaList", 4e-6, ok=True)
    sm.wire_error("bad_magic")
    sm.wire_error("bad_magic")
    sm.wire_error("truncated")
    sm.connections(+1)
    sm.connections(+1)
    sm.connections(-1)
    status, ctype, text = scrape(registry)
    assert status == 200 and ctype.startswith("text/plain")
    assert sample(text, 'mooncake_rpc_requests_total{rpc="Put"}') == 2
    assert sample(text, 'mooncake_rpc_errors_total{rpc="Put"}') == 1
    assert sample(text, 'mooncake_rpc_errors_total{rpc="GetReplicaList"}') == 0
    assert sample(text, 'mooncake_rpc_latency_seconds_count{rpc="Put"}') == 2
    assert sample(text, 'mooncake_rpc_latency_seconds_bucket{le="1e-05",rpc="GetReplicaList"}') == 1
    assert sample(text, 'mooncake_rpc_latency_seconds_bucket{le="2.5e-05",rpc="Put"}') == 1
    assert sample(text, 'mooncake_rpc_latency_seconds_bucket{le="1.0",rpc="Put"}') == 2
    assert sample(text, 'mooncake_wire_errors_total{kind="bad_magic"}') == 2
    assert sample(text, 'mooncake_wire_errors_total{kind="truncated"}') == 1
    assert sample(text, "mooncake_rpc_connections") == 1


def test_scrape_time_gauges_read_the_callback_on_every_scrape() -> None:
    state = {"objects": 3.0, "bytes": 4096.0, "capacity_bytes": 8192.0, "segments": 2.0, "clients": 1.0}
    registry = CollectorRegistry()
    ServerMetrics(registry, stats=lambda: state)
    text = scrape(registry)[2]
    assert [sample(text, n) for n in ("mooncake_objects", "mooncake_used_bytes", "mooncake_capacity_bytes",
                                      "mooncake_segments", "mooncake_clients")] == [3, 4096, 8192, 2, 1]
    state["objects"] = 7.0
    assert sample(scrape(registry)[2], "mooncake_objects") == 7


def test_a_failing_callback_drops_only_its_gauges(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> Mapping[str, float]:
        raise RuntimeError("engine lock poisoned")

    registry = CollectorRegistry()
    sm = ServerMetrics(registry, stats=broken)
    sm.observe("Ping", 1e-5, ok=True)
    with caplog.at_level(logging.ERROR, logger="mooncake_columnar.server.metrics_http"):
        status, _, text = scrape(registry)
    assert status == 200
    assert sample(text, 'mooncake_rpc_requests_total{rpc="Ping"}') == 1
    assert "mooncake_objects" not in text
    assert "engine lock poisoned" in caplog.text


def test_non_numeric_and_missing_stats_are_skipped() -> None:
    collector = StatsCollector(lambda: {"objects": "many", "segments": 4, "unknown": 1})  # type: ignore[dict-item]
    assert {f.name: f.samples[0].value for f in collector.collect()} == {"mooncake_segments": 4.0}


def test_engine_collector_series_appear_without_clashing() -> None:
    master = make_master(ManualClocks())
    master.segment_info()  # the engine sets segment_used_bytes{segment=...} itself
    master.metrics.inc("remount_matched_objects", 20)
    master.metrics.set("remount_visible_ttl_ms", 9876.5)
    registry = CollectorRegistry()
    ServerMetrics(registry, stats=lambda: {"objects": float(master.object_count())}, engine_metrics=master.metrics)
    text = scrape(registry)[2]
    assert sample(text, 'mooncake_segment_used_bytes{segment="seg0"}') == 0
    assert sample(text, "mooncake_remount_matched_objects_total") == 20
    assert sample(text, "mooncake_remount_visible_ttl_ms") == 9876.5
    assert sample(text, "mooncake_objects") == 0
    families = re.findall(r"^# TYPE (\S+) ", text, re.M)
    assert len(families) == len(set(families))
    engine_families = {f.name for f in master.metrics.families()}
    assert not engine_families & SERVER_METRIC_NAMES


def test_a_clashing_stats_gauge_is_refused_at_registration() -> None:
    registry = CollectorRegistry()
    ServerMetrics(registry, stats=dict)
    with pytest.raises(ValueError, match="mooncake_objects"):
        registry.register(StatsCollector(dict))


def test_health() -> None:
    status, _, text = scrape(CollectorRegistry(), "/health")
    assert (status, text) == (200, "OK")


def test_register_engine_metrics_alone_exports_the_engine_series() -> None:
    master = MasterService()
    master.metrics.inc("eviction_success")
    registry = CollectorRegistry()
    register_engine_metrics(master.metrics, registry)
    assert sample(scrape(registry)[2], "mooncake_eviction_success_total") == 1
