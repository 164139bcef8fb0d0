"""`mooncake-columnar bench <area>` figures: each next to a same-run baseline and a ratio.

These machines are shared and noisy, so absolute seconds are reported together with a baseline
measured in the same run (a NumPy copy of the same columns, or a Python dict doing the same
lookups) and the ratio between them.
"""
from __future__ import annotations

import functools
import itertools
import threading
import time
from typing import Callable

import numpy as np

from ..clock import ManualClocks
from ..master import MasterService
from ..messages import DEFAULT_TENANT
from ..schema import OBJECT_COLUMNS, REPLICA_COLUMNS
from ..store.keys import as_string_array, string_buffers
from .bench_oplog import bench_oplog
from .bench_endtoend import bench_endtoend
from .bench_failover import bench_failover_area
from .bench_server import bench_server
from .bench_snapshot import bench_snapshot
from .bench_startup import bench_startup
from .memory_floor import eviction_read_seconds, gather_keys_per_s
from .synthetic import KEY_BYTES, build_master, peak_rss_bytes, promoted_master, synthetic_keys

SINGLE_GET_ROUNDS = 5  # rounds of the single-get keys in bench core (each beside its floor)


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ---- client threads ----------------------------------------------------------------------------
# The mixed single-key workload of a KV-cache client: 50% get_replica_list, 30% exist_key,
# 10% put_start + put_end of a fresh key (one operation), 10% remove of one of the thread's own
# earlier puts. Keys read are stored ones, drawn at random per thread.
MIX_GET, MIX_EXIST, MIX_PUT = 0.5, 0.8, 0.9  # cumulative shares; the rest removes
_RUNS = itertools.count()  # fresh put keys per run: "mixed-<run>-<thread>-<n>"


class DictStore:
    """Baseline: the same operations on a Python dict guarded by one threading.Lock."""

    def __init__(self, keys: list[str]) -> None:
        self.lock = threading.Lock()
        self.d = {k: (4096, True) for k in keys}

    def get(self, k: str) -> object:
        with self.lock:
            return self.d[k]

    def exist(self, k: str) -> bool:
        with self.lock:
            return k in self.d

    def put(self, k: str) -> None:
        with self.lock:
            self.d[k] = (4096, False)
        with self.lock:
            self.d[k] = (4096, True)

    def remove(self, k: str) -> None:
        with self.lock:
            del self.d[k]


class MasterStore:
    def __init__(self, m: MasterService) -> None:
        self.m = m

    def get(self, k: str) -> object:
        return self.m.get_replica_list(k)

    def exist(self, k: str) -> bool:
        return self.m.exist_key(k)

    def put(self, k: str) -> None:
        self.m.put_start(k, 4096, client_id="client-0")
        self.m.put_end(k, client_id="client-0")

    def remove(self, k: str) -> None:
        self.m.remove(k)


def mixed_ops_per_s(store, keys: list[str], threads: int, seconds: float, seed: int = 0) -> float:
    """Mixed single-key operations per second, all threads together, completed within a window
    of ``seconds`` from a common start. Each thread stops at its first look at the clock after
    the window (every 16 operations) and counts the operations done by its last look inside it:
    a thread asleep in the lock's queue when the window ends comes back only a few turns later,
    and timing until every thread has stopped would charge that wait to the 4-thread figure."""
    tag = f"mixed-{next(_RUNS)}"
    start = threading.Barrier(threads + 1)
    counts = [0] * threads
    errors: list[BaseException] = []
    t_start = [0.0]

    def client(t: int) -> None:
        rng = np.random.default_rng(seed * 1000 + t)
        n = 1 << 16
        draws, picks = rng.random(n), rng.integers(0, len(keys), n).tolist()
        mine: list[str] = []
        get, exist, put, remove = store.get, store.exist, store.put, store.remove
        done, first, inside = 0, 0, 0
        start.wait()
        stop_at = t_start[0] + seconds
        try:
            while True:
                if not done & 15:
                    if time.perf_counter() >= stop_at:
                        break
                    inside = done
                i = done & (n - 1)
                r = draws[i]
                if r < MIX_GET:
                    get(keys[picks[i]])
                elif r < MIX_EXIST:
                    exist(keys[picks[i]])
                elif r < MIX_PUT:
                    k = f"{tag}-{t}-{done}"
                    put(k)
                    mine.append(k)
                elif first < len(mine):
                    remove(mine[first])
                    first += 1
                done += 1
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            errors.append(e)
        counts[t] = inside

    pool = [threading.Thread(target=client, args=(t,), daemon=True) for t in range(threads)]
    for th in pool:
        th.start()
    t_start[0] = time.perf_counter()  # every thread reads it after the barrier
    start.wait()
    for th in pool:
        th.join()
    if errors:
        raise errors[0]
    return sum(counts) / seconds


def mixed_keys(objects: int, count: int = 200_000, seed: int = 11) -> list[str]:
    """Stored keys the mixed workload reads (random, repeats allowed)."""
    rng = np.random.default_rng(seed)
    return synthetic_keys(0, objects).take(rng.integers(0, objects, min(objects, count))).to_pylist()


def threads_figures(m: MasterService, objects: int, rounds: int = 5, seconds: float = 1.0) -> dict:
    """Mixed single-key workload on 1 and 4 threads (median of alternating rounds), against the
    engine (its background thread running, as in a server) and against a locked dict. The
    ratios are medians of each round's 4-thread over 1-thread figure: back-to-back rounds share
    the machine's drift (one thread alone varies by 20-30% between rounds on a shared host)."""
    keys = mixed_keys(objects)
    dstore = DictStore(keys)
    mstore = MasterStore(m)
    out: dict[str, list[float]] = {"m1": [], "m4": [], "d1": [], "d4": []}
    m.start()
    try:
        mixed_ops_per_s(mstore, keys, 1, 0.2)  # JIT and first-touch warm-up
        mixed_ops_per_s(mstore, keys, 4, 0.2)
        for r in range(rounds):
            out["m1"].append(mixed_ops_per_s(mstore, keys, 1, seconds, seed=r))
            out["m4"].append(mixed_ops_per_s(mstore, keys, 4, seconds, seed=r))
            out["d1"].append(mixed_ops_per_s(dstore, keys, 1, seconds / 2, seed=r))
            out["d4"].append(mixed_ops_per_s(dstore, keys, 4, seconds / 2, seed=r))
    finally:
        m.stop()
    med = {k: float(np.median(v)) for k, v in out.items()}
    paired = {k: float(np.median(np.array(out[k + "4"]) / np.array(out[k + "1"]))) for k in ("m", "d")}
    return {
        "mixed_ops_per_s_1_thread": med["m1"],
        "mixed_ops_per_s_4_threads": med["m4"],
        "threads_4_over_1_ratio": paired["m"],
        "mixed_ops_per_s_1_thread_rounds": out["m1"],
        "mixed_ops_per_s_4_threads_rounds": out["m4"],
        "baseline_dict_lock_mixed_ops_per_s_1_thread": med["d1"],
        "baseline_dict_lock_mixed_ops_per_s_4_threads": med["d4"],
        "baseline_dict_lock_threads_4_over_1_ratio": paired["d"],
        "mixed_ops_per_s_1_thread_ratio_to_baseline": med["m1"] / med["d1"],
        "mixed_ops_per_s_4_threads_ratio_to_baseline": med["m4"] / med["d4"],
    }


def reader_wait_figures(m: MasterService, objects: int, batch: int, period_s: float = 0.001) -> dict:
    """Latency of single gets a reader thread issues (one every ``period_s``) while another
    thread runs a ``batch``-key batch_put_start and then a batch_get_replica_list."""
    rng = np.random.default_rng(13)
    fresh = synthetic_keys(objects + batch, batch)
    sizes = np.full(batch, 4096, np.int64)
    picks = synthetic_keys(0, objects).take(rng.integers(0, objects, batch))
    probe = synthetic_keys(0, objects).take(rng.integers(0, objects, 4096)).to_pylist()
    running = threading.Event()
    done = threading.Event()
    batch_s: list[float] = []

    def batcher() -> None:
        running.set()
        t0 = time.perf_counter()
        m.batch_put_start(fresh, sizes, client_id="client-0")
        t1 = time.perf_counter()
        m.batch_get_replica_list(picks)
        batch_s.extend((t1 - t0, time.perf_counter() - t1))
        done.set()

    # room for the batch on a segment of its own (the build leaves 25% headroom), so every key
    # of it is placed and no allocation failure arms an eviction; gone again afterwards
    m.mount_segment("segment-batch", endpoint="10.1.0.0:17777", client_id="client-batch", base=1 << 50,
                    size=int(batch * 4096 * 1.25) + (1 << 20))
    # one untimed round first: table growth (a stop-the-world rehash, amortized over the
    # build) is not what this measures, nor compiling the batch-sized kernel variants
    m.batch_put_start(fresh, sizes, client_id="client-0")
    m.batch_get_replica_list(picks)
    m.batch_put_end(fresh, client_id="client-0")
    m.batch_remove(fresh, force=True)
    m.get_replica_list(probe[0])
    th = threading.Thread(target=batcher, daemon=True)
    waits: list[float] = []
    th.start()
    running.wait()
    i = 0
    while not done.is_set():
        t0 = time.perf_counter()
        m.get_replica_list(probe[i % len(probe)])
        waits.append(time.perf_counter() - t0)
        i += 1
        time.sleep(period_s)
    th.join()
    m.batch_put_end(fresh, client_id="client-0")
    m.batch_remove(fresh, force=True)
    m.unmount_segment("segment-batch")
    w = np.array(waits) * 1e3
    longest = max(batch_s) * 1e3
    return {
        "reader_wait_behind_batch_max_ms": float(w.max()),
        "reader_wait_behind_batch_median_ms": float(np.median(w)),
        "reader_wait_behind_batch_p99_ms": float(np.percentile(w, 99)),
        "reader_wait_behind_batch_gets": int(w.size),
        # what a reader waited before batches ran in chunks: the whole call
        "baseline_unchunked_batch_put_start_ms": batch_s[0] * 1e3,
        "baseline_unchunked_batch_get_ms": batch_s[1] * 1e3,
        "reader_wait_behind_batch_max_ratio_to_baseline": float(w.max()) / longest,
    }


def index_lookup_seconds(m: MasterService, keys) -> float:
    """The key index's batch lookup of ``keys`` alone, in chunks of the size a batch read's
    chunks reach (no lock, classification, lease or descriptors)."""
    offsets, data = string_buffers(as_string_array(keys))
    tenant = np.array([m.tenants.find(DEFAULT_TENANT)], np.int32)
    step = 1 << 16
    t0 = time.perf_counter()
    for lo in range(0, offsets.size - 1, step):
        m.keys.lookup_batch(offsets[lo:lo + step + 1], data, tenant)
    return time.perf_counter() - t0


def latencies_ns(call: Callable[[str], object], keys: list[str]) -> np.ndarray:
    """Nanoseconds of ``call(key)`` for each key, one after another."""
    lat = np.empty(len(keys), np.int64)
    for i, k in enumerate(keys):
        t0 = time.perf_counter_ns()
        call(k)
        lat[i] = time.perf_counter_ns() - t0
    return lat


@functools.cache
def _do_nothing_kernel() -> Callable[..., int]:
    """A kernel that returns at once (compiled once per process, on first use)."""
    from numba import njit

    @njit
    def nothing(columns, key, tenant, now, ttl_ns):
        return 0

    return nothing


def single_call_floor_ns(m: MasterService, keys: list[str]) -> np.ndarray:
    """Per key: what any single-key call into a kernel pays before it does anything, the floor
    under the single get: the master lock taken and left around the compiled call that takes
    the single read's arguments (the column table's address, the key's bytes, tenant, clock, TTL) and
    returns at once."""
    from ..kernels.dispatch import compiled

    m.get_replica_list(keys[0])  # the reader's column table is current
    columns = m._single_reader._address
    call = compiled(_do_nothing_kernel(), columns, b"", 0, 0, 0)
    lock, now, ttl = m.lock, m.clocks.steady_ns(), m.lease_ttl_ns
    lat = np.empty(len(keys), np.int64)
    for i, k in enumerate(keys):
        t0 = time.perf_counter_ns()
        lock.take_reading()
        try:
            call(columns, k.encode(), 0, now, ttl)
        finally:
            lock.leave()
        lat[i] = time.perf_counter_ns() - t0
    return lat


def bench_core(objects: int, *, segments: int = 4, replicas: int = 1, batch: int = 1_000_000,
               single_gets: int = 20_000, show_progress: bool = False) -> dict:
    """Put/get throughput, single-key get latency, client threads and metadata bytes per object."""
    m = build_master(objects, segments=segments, replicas=replicas, show_progress=show_progress)
    batch = min(batch, objects)
    rng = np.random.default_rng(7)
    mem = m.metadata_bytes()  # before the timed puts below add (and free) rows
    by_column = m.column_bytes()
    # client threads first: the batch puts below can arm an eviction (at 1M objects the build's
    # headroom holds a quarter of a 1M batch) that the background thread would then run
    threads = threads_figures(m, objects)
    reader = reader_wait_figures(m, objects, batch)

    # batch put_start + put_end of `batch` fresh keys, steady state: one untimed round first so
    # that table/column growth (amortized over the build) is not charged to this one batch
    fresh = synthetic_keys(objects, batch)
    sizes = np.full(batch, 4096, np.int64)

    def put_round() -> None:
        m.batch_put_start(fresh, sizes, client_id="client-0")
        m.batch_put_end(fresh, client_id="client-0")

    put_round()
    m.batch_remove(fresh, force=True)
    put_s = _timed(put_round)
    m.batch_remove(fresh, force=True)

    # batch get of `batch` existing keys in random order
    picks = synthetic_keys(0, objects).take(rng.integers(0, objects, batch))
    get_s = _timed(lambda: m.batch_get_replica_list(picks))
    exist_s = _timed(lambda: m.batch_exist_key(picks))
    lookup_s = index_lookup_seconds(m, picks)
    gather_rate = gather_keys_per_s(m, picks)

    # baseline: a Python dict answering the same lookups (sampled; scaled to the batch)
    sample = picks.slice(0, min(batch, 200_000)).to_pylist()
    table = {k: i for i, k in enumerate(sample)}
    dict_s = _timed(lambda: [table[k] for k in sample]) * batch / len(sample)

    # single-key get latency
    keys = synthetic_keys(0, objects).take(rng.integers(0, objects, single_gets)).to_pylist()
    m.get_replica_list(keys[0])
    # rounds of every key, each beside the floor measured right after it: this host's speed moves
    # by about 2x from one stretch of seconds to the next, so the best round is reported too
    rounds = [(latencies_ns(m.get_replica_list, keys), single_call_floor_ns(m, keys))
              for _ in range(SINGLE_GET_ROUNDS)]
    lat, floor = (np.concatenate(parts) for parts in zip(*rounds))
    best_lat, best_floor = min(rounds, key=lambda r: float(np.median(r[0])))
    dlat = latencies_ns(table.get, keys)

    # baseline for whole-table work: a NumPy copy of the same columns
    o = m.objects
    hw = o.high_water
    copy_s = _timed(lambda: [np.array(getattr(o, c)[:hw]) for c in
                             (*OBJECT_COLUMNS, *REPLICA_COLUMNS)])
    return {
        "area": "core",
        "objects": objects,
        "segments": segments,
        "replicas": replicas,
        "key_bytes": KEY_BYTES,
        "batch_keys": batch,
        "batch_put_seconds": put_s,
        "batch_put_keys_per_s": batch / put_s,
        "batch_get_seconds": get_s,
        "batch_get_keys_per_s": batch / get_s,
        "baseline_dict_lookup_keys_per_s": batch / dict_s,
        "batch_get_ratio_to_dict_baseline": dict_s / get_s,
        "batch_exist_keys_per_s": batch / exist_s,
        # the floor under both: the key index alone (hash, probe, verify) on the same keys
        "baseline_index_lookup_keys_per_s": batch / lookup_s,
        "batch_get_ratio_to_index_lookup": lookup_s / get_s,
        # the machine's floor under both: the values a get reads, gathered at known rows (memory_floor.py)
        "baseline_gather_keys_per_s": gather_rate,
        "batch_get_ratio_to_gather_floor": batch / get_s / gather_rate,
        "single_get_median_us": float(np.median(lat)) / 1e3,
        "single_get_p99_us": float(np.percentile(lat, 99)) / 1e3,
        "baseline_dict_get_median_us": float(np.median(dlat)) / 1e3,
        "baseline_single_call_floor_median_us": float(np.median(floor)) / 1e3,
        "single_get_best_round_median_us": float(np.median(best_lat)) / 1e3,
        "baseline_single_call_floor_best_round_median_us": float(np.median(best_floor)) / 1e3,
        "baseline_copy_seconds": copy_s,
        "batch_get_ratio_to_baseline_copy": get_s / copy_s,
        "bytes_per_object": (mem["columns"] + mem["index"] + mem["inflight"] + mem["side_tables"]) / objects,
        "column_bytes_per_object": mem["columns"] / objects,
        "column_bytes_per_object_by_name": {k: v / objects for k, v in by_column.items() if v},
        "index_bytes_per_object": mem["index"] / objects,
        "key_arena_bytes_per_object": mem["key_bytes"] / objects,
        **threads,
        **reader,
        "peak_rss_bytes": peak_rss_bytes(),
    }


def bench_evict(objects: int, *, segments: int = 4, replicas: int = 1, ratio: float = 0.05,
                show_progress: bool = False) -> dict:
    """One BatchEvict cycle of ``ratio`` over N expired objects with seeded random lease deadlines,
    and its three parts (census, plan, apply), each also as a ratio to the lease-column copy;
    then the next cycle on the same master (a master evicting periodically: the cycle's buffers
    are kept, the memory it frees is the system's again), and the read floor of a cycle (see
    :mod:`.memory_floor`) measured on the same master."""
    # JIT warm-up, big enough for every path a large cycle takes (bulk index deletes are parallel)
    build_master(100_000, segments=segments, replicas=replicas).evict(target=max(ratio, 0.05))
    clocks = ManualClocks()
    m = build_master(objects, segments=segments, replicas=replicas, show_progress=show_progress, clocks=clocks)
    o = m.objects
    now = clocks.steady_ns()
    rng = np.random.default_rng(11)
    o.lease_deadline_ns[: o.high_water] = now - rng.integers(1, 10**12, o.high_water)  # all expired
    lease = o.lease_deadline_ns[: o.high_water]
    copy_s = min(_timed(lambda: np.array(lease)) for _ in range(3))
    t0 = time.perf_counter()
    report = m.evict(target=ratio)
    evict_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    following = m.evict(target=ratio)
    next_s = time.perf_counter() - t0
    floor_s = eviction_read_seconds(m)
    census_floor_s = eviction_read_seconds(m, index=False)
    index_floor_s = eviction_read_seconds(m, rows=False)
    return {
        "area": "evict",
        "objects": objects,
        "segments": segments,
        "replicas": replicas,
        "eviction_ratio": ratio,
        "evicted_objects": report.evicted_objects,
        "evicted_bytes": report.evicted_bytes,
        "evict_seconds": evict_s,
        "census_seconds": report.census_s,
        "plan_seconds": report.plan_s,
        "apply_seconds": report.apply_s,
        "baseline_copy_seconds": copy_s,
        "ratio_to_baseline": evict_s / copy_s,
        "census_ratio_to_baseline": report.census_s / copy_s,
        "plan_ratio_to_baseline": report.plan_s / copy_s,
        "apply_ratio_to_baseline": report.apply_s / copy_s,
        "next_cycle_evicted_objects": following.evicted_objects,
        "next_cycle_evict_seconds": next_s,
        "next_cycle_census_seconds": following.census_s,
        "next_cycle_plan_seconds": following.plan_s,
        "next_cycle_apply_seconds": following.apply_s,
        "floor_read_seconds": floor_s,
        "ratio_to_floor": evict_s / floor_s,
        "next_cycle_ratio_to_floor": next_s / floor_s,
        # the floor's two parts, each read alone: the census reads the rows, the key delete the index
        "floor_census_read_seconds": census_floor_s,
        "census_ratio_to_census_floor": report.census_s / census_floor_s,
        "floor_index_read_seconds": index_floor_s,
        "peak_rss_bytes": peak_rss_bytes(),
    }


def remount_visible_ttl_ms(objects: int, segments: int = 1, replicas: int = 1) -> float:
    """The visible recovery window of a first remount, kernels warmed as standby bootstrap and
    promotion warm them (run in a fresh process with an empty Numba cache for the cold figure)."""
    from .synthetic import segment_request
    from ..warmup import warm_up_kernels
    warm_up_kernels()
    m = promoted_master(objects, segments=segments, replicas=replicas)
    return m.remount_segments("client-0", [segment_request(m, 0)]).visible_ttl_ms


def cold_cache_visible_ttl_ms(objects: int, segments: int = 1, replicas: int = 1) -> float:
    """``remount_visible_ttl_ms`` in a new process whose Numba cache starts empty (a fresh host)."""
    import json
    import os
    import subprocess
    import sys
    import tempfile
    code = ("import json, sys; from mooncake_columnar.tools.bench import remount_visible_ttl_ms as f; "
            "print(json.dumps(f(*map(int, sys.argv[1:]))))")
    with tempfile.TemporaryDirectory(prefix="mooncake-cold-numba-") as cache:
        out = subprocess.run([sys.executable, "-c", code, str(objects), str(segments), str(replicas)],
                             env={**os.environ, "NUMBA_CACHE_DIR": cache}, capture_output=True, text=True,
                             check=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1]))


def bench_remount(objects: int, *, segments: int = 1, replicas: int = 1, show_progress: bool = False,
                  cold_cache: bool = True) -> dict:
    """Remount recovery of one segment holding N objects: locate + assign vs a lease-column copy.
    ``cold_cache``: also the visible window of the first remount on an empty Numba cache (a
    fresh process that compiles every kernel first, about a minute)."""
    from .synthetic import segment_request
    warm = promoted_master(1000, segments=segments, replicas=replicas)
    warm.remount_segments("client-0", [segment_request(warm, 0)])  # JIT warm-up
    m = promoted_master(objects, segments=segments, replicas=replicas, show_progress=show_progress)
    lease = m.objects.lease_deadline_ns[: m.objects.high_water]
    copy_s = min(_timed(lambda: np.array(lease)) for _ in range(3))
    report = m.remount_segments("client-0", [segment_request(m, 0)])
    match_assign = report.locate_seconds + report.assignment_seconds
    return {
        "area": "remount",
        "objects": objects,
        "segments": segments,
        "replicas": replicas,
        "matched_objects": report.matched_objects,
        "locate_seconds": report.locate_seconds,
        "allocator_rebuild_seconds": report.rebuild_seconds,
        "assignment_seconds": report.assignment_seconds,
        "refresh_seconds": match_assign,
        "remount_total_seconds": report.total_seconds,
        "recovery_ttl_ms": report.effective_recovery_ttl_ms,
        "visible_ttl_ms": report.visible_ttl_ms,
        **({"visible_ttl_ms_cold_cache": cold_cache_visible_ttl_ms(objects, segments, replicas)}
           if cold_cache else {}),
        "baseline_copy_seconds": copy_s,
        "ratio_to_baseline": match_assign / copy_s,
        "peak_rss_bytes": peak_rss_bytes(),
    }


AREAS: dict[str, Callable[..., dict]] = {"core": bench_core, "evict": bench_evict, "remount": bench_remount,
                                          "oplog": bench_oplog, "snapshot": bench_snapshot,
                                          "startup": bench_startup, "endtoend": bench_endtoend,
                                          "server": bench_server, "failover": bench_failover_area}
