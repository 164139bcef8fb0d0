"""Shared parameters, per-process caches and timing helpers for the asv benchmarks.

asv runs every benchmark (and every parameter of it) in its own process, and this asv_runner
re-runs ``setup`` before every timed sample. Expensive state (a master of 1e7 objects takes
~17 s to build) is therefore memoized per process here, so that ``setup`` stays cheap after its
first call and only restores what the previous sample changed.
"""
from __future__ import annotations

import os
import time
from typing import Callable

from mooncake_columnar.tools.synthetic import build_master
from mooncake_columnar.master import MasterService

OBJECTS_ENV = "MOONCAKE_ASV_OBJECTS"
DEFAULT_OBJECTS = "100000,1000000,10000000"
ENTRIES_ENV = "MOONCAKE_ASV_OPLOG_ENTRIES"
DEFAULT_ENTRIES = "1024,16384,131072"

SEED = 7
SEGMENTS = 4
# 1e7 objects: ~17 s to build per process, plus the benchmark's own samples.
TIMEOUT_S = 1800.0


def _counts(env: str, default: str) -> list[int]:
    """Positive ints from a comma-separated environment variable (the test shrinks the grid)."""
    raw = os.environ.get(env, default)
    counts = [int(float(part)) for part in raw.split(",") if part.strip()]
    if not counts or min(counts) < 1:
        raise ValueError(f"{env}={raw!r}: expected comma-separated positive counts")
    return counts


OBJECT_COUNTS = _counts(OBJECTS_ENV, DEFAULT_OBJECTS)
ENTRY_COUNTS = _counts(ENTRIES_ENV, DEFAULT_ENTRIES)

_MASTERS: dict[int, MasterService] = {}


def cached_master(objects: int) -> MasterService:
    """The seeded master of ``objects`` complete objects, built once per benchmark process."""
    if objects not in _MASTERS:
        _MASTERS[objects] = build_master(objects, segments=SEGMENTS)
    return _MASTERS[objects]


def best_seconds(fn: Callable[[], object], repeat: int = 3) -> float:
    """Fastest of ``repeat`` runs: ratios of two minima are the least noisy on shared machines."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


class FreshMasterBenchmark:
    """asv attributes of a benchmark whose every timed call needs a freshly built master."""

    params = OBJECT_COUNTS
    param_names = ["objects"]
    timeout = TIMEOUT_S
    number = 1  # each timed call needs the fresh master setup built
    repeat = (1, 5, 60.0)
    warmup_time = 0.0

