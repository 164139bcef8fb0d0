"""Core object operations on a master holding ``objects`` complete objects.

Batches are ``min(objects, 1e6)`` keys, as in ``mooncake-columnar bench core``. Ratios divide by
a same-run NumPy copy of the lease column, the cheapest whole-table pass over that many rows.
"""
from __future__ import annotations

import time

import numpy as np
import pyarrow as pa

from mooncake_columnar.master import MasterService
from mooncake_columnar.tools.bench import (DictStore, MasterStore, index_lookup_seconds, mixed_keys,
                                           mixed_ops_per_s, reader_wait_figures)
from mooncake_columnar.tools.memory_floor import gather_keys_per_s
from mooncake_columnar.tools.synthetic import build_master, synthetic_keys

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

    def track_batch_get_ratio_to_index_lookup(self, objects: int) -> float:
        """The whole batch read over its floor: the key index's lookup of the same keys."""
        get_s = best_seconds(lambda: self.m.batch_get_replica_list(self.keys))
        return get_s / min(index_lookup_seconds(self.m, self.keys) for _ in range(3))

    track_batch_get_ratio_to_index_lookup.unit = "ratio"

    def track_batch_get_ratio_to_gather_floor(self, objects: int) -> float:
        """Keys/s of the batch read over this machine's random-read floor for the same keys
        (tools/memory_floor.py): 1.0 is as fast as memory allows."""
        get_s = best_seconds(lambda: self.m.batch_get_replica_list(self.keys))
        return len(self.keys) / get_s / gather_keys_per_s(self.m, self.keys)

    track_batch_get_ratio_to_gather_floor.unit = "ratio"


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

    def _median_us(self, call) -> float:
        # One asv sample per call would be timer noise; a median over many keys is the figure.
        lat = np.empty(len(self.keys), np.float64)
        for i, key in enumerate(self.keys):
            t0 = time.perf_counter_ns()
            call(key)
            lat[i] = time.perf_counter_ns() - t0
        return float(np.median(lat)) / 1e3

    def track_get_replica_list_median_us(self, objects: int) -> float:
        return self._median_us(self.m.get_replica_list)

    track_get_replica_list_median_us.unit = "us"

    def track_exist_key_median_us(self, objects: int) -> float:
        return self._median_us(self.m.exist_key)

    track_exist_key_median_us.unit = "us"

    def track_get_replica_list_ratio_to_dict_get(self, objects: int) -> float:
        """The median get over a dict.get's of the same keys, timed alike in the same run (a
        figure that a busy host moves less than the microseconds)."""
        table = dict.fromkeys(self.keys)
        return self._median_us(self.m.get_replica_list) / self._median_us(table.get)

    track_get_replica_list_ratio_to_dict_get.unit = "ratio"


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


class Threads(_Core):
    """Client threads (as ``bench core``): the mixed single-key workload (50% get, 30% exist,
    10% put_start + put_end, 10% remove) on 1 and 4 threads with the background thread
    running, beside a dict guarded by one threading.Lock; and the wait of single gets issued
    while another thread runs a batch_put_start and a batch_get_replica_list of a batch."""

    SECONDS = 0.5
    ROUNDS = 2

    def setup(self, objects: int) -> None:
        self.m = cached_master(objects)
        self.keys = mixed_keys(objects)
        self.m.start()
        mixed_ops_per_s(MasterStore(self.m), self.keys, 4, 0.1)  # JIT warm-up

    def teardown(self, objects: int) -> None:
        self.m.stop()

    def _ops(self, store, threads: int) -> float:
        """Best of ROUNDS runs (the least disturbed one on a shared machine)."""
        return max(mixed_ops_per_s(store, self.keys, threads, self.SECONDS, seed=r) for r in range(self.ROUNDS))

    def track_mixed_ops_per_s_1_thread(self, objects: int) -> float:
        return self._ops(MasterStore(self.m), 1)

    track_mixed_ops_per_s_1_thread.unit = "ops/s"

    def track_mixed_ops_per_s_4_threads(self, objects: int) -> float:
        return self._ops(MasterStore(self.m), 4)

    track_mixed_ops_per_s_4_threads.unit = "ops/s"

    def track_threads_4_over_1_ratio(self, objects: int) -> float:
        """Calls/s of 4 threads over those of 1 (>= 1: threads never make the engine slower)."""
        store = MasterStore(self.m)
        return self._ops(store, 4) / self._ops(store, 1)

    track_threads_4_over_1_ratio.unit = "ratio"

    def track_mixed_4_threads_ratio_to_baseline(self, objects: int) -> float:
        """4 threads: engine calls/s over those of the locked dict doing the same workload."""
        return self._ops(MasterStore(self.m), 4) / self._ops(DictStore(self.keys), 4)

    track_mixed_4_threads_ratio_to_baseline.unit = "ratio"


class ReaderWait(_Core):
    """Single gets issued (one per ms) while another thread runs batch calls of
    ``min(objects, 1e6)`` keys: each waits for about one chunk, not for the whole call."""

    def setup(self, objects: int) -> None:
        self.m = cached_master(objects)

    def _figures(self, objects: int) -> dict:
        return reader_wait_figures(self.m, objects, batch_size(objects))

    def track_reader_wait_behind_batch_max_ms(self, objects: int) -> float:
        return self._figures(objects)["reader_wait_behind_batch_max_ms"]

    track_reader_wait_behind_batch_max_ms.unit = "ms"

    def track_reader_wait_behind_batch_median_ms(self, objects: int) -> float:
        return self._figures(objects)["reader_wait_behind_batch_median_ms"]

    track_reader_wait_behind_batch_median_ms.unit = "ms"

    def track_reader_wait_max_ratio_to_baseline(self, objects: int) -> float:
        """Longest wait over the duration of the longer batch call (the wait before chunks)."""
        return self._figures(objects)["reader_wait_behind_batch_max_ratio_to_baseline"]

    track_reader_wait_max_ratio_to_baseline.unit = "ratio"


class Memory(_Core):
    """Metadata footprint (budget: <= 64 B/object, columns <= ~54 and index ~10; key bytes are separate)."""

    def setup(self, objects: int) -> None:
        self.mem = cached_master(objects).metadata_bytes()

    def track_bytes_per_object(self, objects: int) -> float:
        return (self.mem["columns"] + self.mem["index"] + self.mem["inflight"] + self.mem["side_tables"]) / objects

    track_bytes_per_object.unit = "bytes"

    def track_column_bytes_per_object(self, objects: int) -> float:
        return self.mem["columns"] / objects

    track_column_bytes_per_object.unit = "bytes"

    def track_index_bytes_per_object(self, objects: int) -> float:
        return self.mem["index"] / objects

    track_index_bytes_per_object.unit = "bytes"

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
