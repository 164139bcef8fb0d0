"""Core object operations on a master holding ``objects`` complete objects.

Batches are ``min(objects, 1e6)`` keys, as in ``mooncake-columnar bench core``. Ratios divide by
a same-run NumPy copy of the lease column, the cheapest whole-table pass over that many rows.
"""
from __future__ import annotations

import time

import numpy as np
import pyarrow as pa

from mooncake_columnar.bench import build_master
from mooncake_columnar.master import MasterService
from mooncake_columnar.synthetic import synthetic_keys

from ._common import OBJECT_COUNTS, SEED, SEGMENTS, TIMEOUT_S, best_seconds, cached_master

BATCH_CAP = 1_000_000
CLIENT = "client-0"
OBJECT_BYTES = 4096


def batch_size(objects: int) -> int:
    return min(objects, BATCH_CAP)


def existing_keys(objects: int, count: int) -> pa.Array:
    """``count`` stored keys in seeded random order (repeats allowed, as real traffic has)."""
    rng = np.random.default_rng(SEED)
    return synthetic_keys(0, objects).take(pa.array(rng.integers(0, objects, count)))


def fresh_keys(objects: int) -> pa.Array:
    """A batch of keys the seeded build never stored (ids start after the last stored one)."""
    return synthetic_keys(objects, batch_size(objects))


def put(m: MasterService, keys: pa.Array) -> None:
    m.batch_put_start(keys, np.full(len(keys), OBJECT_BYTES, np.int64), client_id=CLIENT)
    m.batch_put_end(keys, client_id=CLIENT)


def lease_copy(m: MasterService) -> None:
    """Baseline: a NumPy copy of the lease column up to the high-water mark."""
    np.array(m.objects.lease_deadline_ns[: m.objects.high_water])


class _Core:
    params = OBJECT_COUNTS
    param_names = ["objects"]
    timeout = TIMEOUT_S


class BatchPut(_Core):
    """batch_put_start + batch_put_end of a fresh batch (removed again before every sample)."""

    def setup(self, objects: int) -> None:
        self.m = cached_master(objects)
        self.keys = fresh_keys(objects)
        # The first round grows the tables and compiles the kernels: keep both out of the samples.
        put(self.m, self.keys)
        self.m.batch_remove(self.keys, force=True)

    def time_batch_put(self, objects: int) -> None:
        put(self.m, self.keys)

    def track_batch_put_ratio_to_baseline(self, objects: int) -> float:
        best = float("inf")
        for _ in range(3):
            self.m.batch_remove(self.keys, force=True)  # untimed: each put starts from absent keys
            t0 = time.perf_counter()
            put(self.m, self.keys)
            best = min(best, time.perf_counter() - t0)
        return best / best_seconds(lambda: lease_copy(self.m))

    track_batch_put_ratio_to_baseline.unit = "ratio"


class BatchGet(_Core):
    def setup(self, objects: int) -> None:
        self.m = cached_master(objects)
        self.keys = existing_keys(objects, batch_size(objects))
        self.m.batch_get_replica_list(self.keys[:16])  # JIT warm-up

    def time_batch_get_replica_list(self, objects: int) -> None:
        self.m.batch_get_replica_list(self.keys)

    def track_batch_get_ratio_to_baseline(self, objects: int) -> float:
        get_s = best_seconds(lambda: self.m.batch_get_replica_list(self.keys))
        return get_s / best_seconds(lambda: lease_copy(self.m))

    track_batch_get_ratio_to_baseline.unit = "ratio"


class BatchExist(_Core):
    def setup(self, objects: int) -> None:
        self.m = cached_master(objects)
        self.keys = existing_keys(objects, batch_size(objects))
        self.m.batch_exist_key(self.keys[:16])  # JIT warm-up

    def time_batch_exist_key(self, objects: int) -> None:
        self.m.batch_exist_key(self.keys)

    def track_batch_exist_ratio_to_baseline(self, objects: int) -> float:
        exist_s = best_seconds(lambda: self.m.batch_exist_key(self.keys))
        return exist_s / best_seconds(lambda: lease_copy(self.m))

    track_batch_exist_ratio_to_baseline.unit = "ratio"


class SingleGet(_Core):
    """get_replica_list of one key (budget: <= 10 us median, ARCHITECTURE.md section 7)."""

    SAMPLES = 20_000

    def setup(self, objects: int) -> None:
        self.m = cached_master(objects)
        self.keys: list[str] = existing_keys(objects, self.SAMPLES).to_pylist()
        self.m.get_replica_list(self.keys[0])  # JIT warm-up

    def time_get_replica_list(self, objects: int) -> None:
        self.m.get_replica_list(self.keys[0])

    def track_get_replica_list_median_us(self, objects: int) -> float:
        # One asv sample per call would be timer noise; a median over many keys is the figure.
        lat = np.empty(len(self.keys), np.float64)
        for i, key in enumerate(self.keys):
            t0 = time.perf_counter_ns()
            self.m.get_replica_list(key)
            lat[i] = time.perf_counter_ns() - t0
        return float(np.median(lat)) / 1e3

    track_get_replica_list_median_us.unit = "us"


class BatchRemove(_Core):
    """batch_remove(force=True) of a batch that setup puts back before every sample."""

    def setup(self, objects: int) -> None:
        self.m = cached_master(objects)
        self.keys = fresh_keys(objects)
        put(self.m, self.keys)
        self.m.batch_remove(self.keys[:16], force=True)  # JIT warm-up
        put(self.m, self.keys[:16])

    def time_batch_remove(self, objects: int) -> None:
        self.m.batch_remove(self.keys, force=True)


class Memory(_Core):
    """Metadata footprint (budget: <= 96 B/object now, 64 B goal; key bytes are separate)."""

    def setup(self, objects: int) -> None:
        self.mem = cached_master(objects).metadata_bytes()

    def track_bytes_per_object(self, objects: int) -> float:
        return (self.mem["columns"] + self.mem["index"] + self.mem["inflight"]) / objects

    track_bytes_per_object.unit = "bytes"

    def track_key_bytes_per_object(self, objects: int) -> float:
        return self.mem["key_bytes"] / objects

    track_key_bytes_per_object.unit = "bytes"


class Build(_Core):
    """Building the seeded master from nothing (fill in vectorized batches of 1e6 keys)."""

    repeat = (1, 3, 60.0)  # 1e7: ~17 s per sample
    warmup_time = 0.0

    def setup(self, objects: int) -> None:
        build_master(1024, segments=SEGMENTS)  # JIT warm-up, so samples time the build alone

    def time_build_master(self, objects: int) -> None:
        build_master(objects, segments=SEGMENTS)

    def peakmem_build_master(self, objects: int) -> None:
        build_master(objects, segments=SEGMENTS)
