"""`mooncake-columnar bench oplog`: journaled writes to a FileOpLogStore and standby apply."""
from __future__ import annotations

import time

import numpy as np

from .clock import ManualClocks
from .config import MasterConfig
from .master import MasterService
from .synthetic import mount_segments, synthetic_keys


def bench_oplog(objects: int, *, segments: int = 4, replicas: int = 1, show_progress: bool = False) -> dict:
    """A journaled primary writes N PUT_ENDs to a FileOpLogStore (group commit); a standby applies
    them. Baseline: msgpack round trip of the same entries as plain dicts."""
    import tempfile

    import msgpack

    from .bench import peak_rss_bytes
    from .ha.apply import apply_entries
    from .ha.stores import FileOpLogStore
    from .ha.writer import OpLogWriter
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
        primary.batch_put_end(keys, client_id="client-0")   # builds the PUT_END entries
        writer.flush()                                       # group commit to fsynced files
        write_s = time.perf_counter() - t0
        batches = store.read_batches(0)
        entries = [e for b in batches for e in b.entries]
        standby = MasterService(MasterConfig(), clocks=clocks, initial_capacity=objects)
        t0 = time.perf_counter()
        apply_entries(standby, entries)
        apply_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        read_again = [e for b in store.read_batches(0) for e in b.entries]
        decode_s = time.perf_counter() - t0
        plain = [{"op": int(e.op), "tenant": e.tenant, "key": e.key, "size": e.payload.size}
                 for e in read_again if e.payload is not None and hasattr(e.payload, "size")]
        t0 = time.perf_counter()
        msgpack.unpackb(msgpack.packb(plain))
        baseline_s = time.perf_counter() - t0
        n = len(entries)
        return {
            "area": "oplog",
            "objects": objects,
            "entries": n,
            "write_seconds": write_s,
            "writer_entries_per_s": n / write_s,
            "read_decode_seconds": decode_s,
            "read_decode_entries_per_s": n / decode_s,
            "apply_seconds": apply_s,
            "apply_entries_per_s": n / apply_s,
            "baseline_msgpack_seconds": baseline_s,
            "baseline_msgpack_entries_per_s": len(plain) / baseline_s,
            "write_ratio_to_baseline": write_s / baseline_s,
            "standby_objects": standby.object_count(),
            "peak_rss_bytes": peak_rss_bytes(),
        }
