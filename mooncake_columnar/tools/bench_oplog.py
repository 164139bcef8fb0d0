"""`mooncake-columnar bench oplog`: journaled writes to a FileOpLogStore and standby apply."""
from __future__ import annotations

import time

import numpy as np

from ..clock import ManualClocks
from ..config import MasterConfig
from ..master import MasterService
from .synthetic import mount_segments, peak_rss_bytes, synthetic_keys


def bench_oplog(objects: int, *, segments: int = 4, replicas: int = 1, show_progress: bool = False) -> dict:
    """A journaled primary writes N PUT_ENDs to a FileOpLogStore (group commit); the batches are
    read back and decoded, applied to a standby container, and followed end to end by a
    StandbyService (read + decode + apply in one poll). Baseline: a msgpack round trip of the
    same entries as plain per-entry dicts (what a row-oriented log costs before any validation)."""
    import tempfile

    import msgpack

    from ..ha.apply import apply_batch
    from ..ha.standby import StandbyService
    from ..ha.stores import FileOpLogStore
    from ..ha.writer import OpLogWriter
    with tempfile.TemporaryDirectory() as tmp:
        clocks = ManualClocks()
        store = FileOpLogStore(f"{tmp}/oplog")
        writer = OpLogWriter(store, window=objects + 1024, max_batch_entries=4096, clocks=clocks)
        primary = MasterService(MasterConfig(), clocks=clocks, journal=writer, initial_capacity=objects)
        mount_segments(primary, segments, max(1 << 20, objects * 4096 * replicas // segments * 2))
        keys = synthetic_keys(0, objects)
        sizes = np.full(objects, 4096, np.int64)
        primary.batch_put_start(keys, sizes, client_id="client-0")
        t0 = time.perf_counter()
        primary.batch_put_end(keys, client_id="client-0")   # builds the PUT_END columns
        writer.flush()                                       # group commit to fsynced files
        write_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        batches = store.read_batches(0)
        decode_s = time.perf_counter() - t0
        n = sum(b.count for b in batches)
        standby = MasterService(MasterConfig(), clocks=clocks, initial_capacity=objects)
        t0 = time.perf_counter()
        for b in batches:
            apply_batch(standby, b)
        apply_s = time.perf_counter() - t0
        follower = StandbyService(store, clocks=clocks, read_limit=len(batches))
        follower.master.objects.reserve(objects)  # as initial_capacity above: growth is not the figure
        t0 = time.perf_counter()
        follower.poll()
        standby_s = time.perf_counter() - t0
        plain = [{"op": 1, "tenant": "default", "key": k, "size": 4096} for k in keys.to_pylist()]
        t0 = time.perf_counter()
        msgpack.unpackb(msgpack.packb(plain))
        baseline_s = time.perf_counter() - t0
        wire_bytes = sum(p.stat().st_size for p in store.root.glob("batches/*.msgpack"))
        return {
            "area": "oplog",
            "objects": objects,
            "entries": n,
            "batches": len(batches),
            "wire_bytes_per_entry": wire_bytes / n,
            "write_seconds": write_s,
            "writer_entries_per_s": n / write_s,
            "read_decode_seconds": decode_s,
            "read_decode_entries_per_s": n / decode_s,
            "apply_seconds": apply_s,
            "apply_entries_per_s": n / apply_s,
            "standby_poll_seconds": standby_s,
            "standby_entries_per_s": n / standby_s,
            "baseline_msgpack_seconds": baseline_s,
            "baseline_msgpack_entries_per_s": len(plain) / baseline_s,
            "write_ratio_to_baseline": write_s / baseline_s,
            "standby_objects": standby.object_count(),
            "follower_objects": follower.master.object_count(),
            "peak_rss_bytes": peak_rss_bytes(),
        }
