"""Aggregate counters kept as plain numbers, exported at scrape time by a prometheus collector.

Nothing is registered at import: ``register(metrics, registry)`` attaches a collector to the
registry the embedding application passes in.
"""
from __future__ import annotations

import threading
from collections import defaultdict
from typing import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import CollectorRegistry

Labels = tuple[tuple[str, str], ...]


class Metrics:
    """Counters (monotonic) and gauges (last value), optionally labelled; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[tuple[str, Labels], float] = defaultdict(float)
        self._gauges: dict[tuple[str, Labels], float] = {}

    def inc(self, name: str, value: float = 1, **labels: str) -> None:
        with self._lock:
            self._counters[(name, tuple(sorted(labels.items())))] += value

    def set(self, name: str, value: float, **labels: str) -> None:
        with self._lock:
            self._gauges[(name, tuple(sorted(labels.items())))] = value

    def get(self, name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            if key in self._gauges:
                return self._gauges[key]
            return self._counters.get(key, 0.0)

    def snapshot(self) -> dict[str, float]:
        """Flat {name{labels}: value} view for tests, notebooks and logs."""
        def fmt(name: str, labels: Labels) -> str:
            return name + ("{" + ",".join(f"{k}={v}" for k, v in labels) + "}" if labels else "")
        with self._lock:
            out = {fmt(n, lb): v for (n, lb), v in self._counters.items()}
            out.update({fmt(n, lb): v for (n, lb), v in self._gauges.items()})
        return out

    def families(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        with self._lock:
            counters = dict(self._counters)
            gauges = dict(self._gauges)
        for items, family_cls in ((counters, CounterMetricFamily), (gauges, GaugeMetricFamily)):
            by_name: dict[str, list[tuple[Labels, float]]] = defaultdict(list)
            for (name, labels), value in items.items():
                by_name[name].append((labels, value))
            for name, samples in sorted(by_name.items()):
                label_names = [k for k, _ in samples[0][0]]
                fam = family_cls(f"mooncake_{name}", name.replace("_", " "), labels=label_names)
                for labels, value in samples:
                    fam.add_metric([v for _, v in labels], value)
                yield fam


class MetricsCollector:
    """prometheus_client custom collector reading a Metrics object at scrape time."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self):
        yield from self.metrics.families()


def register(metrics: Metrics, registry: CollectorRegistry) -> MetricsCollector:
    collector = MetricsCollector(metrics)
    registry.register(collector)
    return collector
