"""`mooncake-columnar bench snapshot`: complete-snapshot write and restore next to a same-run baseline.

Write = freeze under the lock (from 1M objects a fork, below a column memcpy; one clock pair) +
Arrow tables + IPC streamed with its checksum + publish to a temporary local directory (page
cache). ``snapshot_rewrite_seconds`` is the next snapshot (reusing the freeze buffers of an
in-process freeze); ``snapshot_periodic_seconds`` the fourth, the steady state: retention deleted
the first and the writer overwrites its recycled files in place. Restore = ``restore_master``: strict manifest,
digest, decode, validation, clock conversion, cleanup and the engine rebuild, timed after the
manager stopped (a restore runs in a process without a snapshot writer), with its phases
(``snapshot_restore_{decode,cleanup,engine,verify}_seconds``: ``RestoreStats.phase_seconds``). Baseline: a NumPy copy of
the master's object columns; floors: the snapshot's bytes written to fresh files, and fresh memory
as large as the restored engine touched once. A prefix of the same table (``v1_sample_objects``)
is also encoded and decoded as upstream v1 (msgpack + zstd) for a per-object side-by-side ratio.

Cold and warm memory. On a VM whose balloon driver hands freed guest memory back to the host
(free page reporting, as on this project's machines), every page the guest has not used within
the last few seconds costs a host fault on first touch: about 2 ms per MB, ten times the copy
itself. Write (page cache for the files) and restore (the engine's columns and index) allocate
more than a GB at 10M objects, so they are measured twice: as is (``*_seconds``: cold) and right
after the same amount of memory was touched and freed (``*_warm_memory_seconds``), which is how
they run on a host whose free memory stays resident (bare metal, or a VM without reporting).
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..clock import NS_PER_S, ManualClocks
from ..schema import OBJECT_COLUMNS
from ..snapshots.manager import SnapshotManager, restore_master
from ..snapshots.mooncake_v1 import decode_v1, encode_v1
from ..snapshots.repository import SnapshotRepository
from ..store.snapshot_state import SnapshotState, with_usage
from .synthetic import build_master, peak_rss_bytes, synthetic_keys

# Seconds for freed memory to be handed back to the host (free page reporting waits ~2 s), so
# that the fresh-memory floor is measured cold whatever ran just before it.
_BALLOON_SETTLE_S = 5.0
_SETTLE_FROM_BYTES = 64 << 20  # smaller runs: too little memory for it to matter


def _uuid_clients(state: SnapshotState) -> SnapshotState:
    """Synthetic client names -> upstream "<u64>-<u64>" ids (the v1 writer requires them)."""
    names = pc.unique(pa.chunked_array([state.objects.column("client").combine_chunks(),
                                        state.segments.column("client").combine_chunks()]))
    uuids = pa.array([f"{i + 1}-{i + 1}" for i in range(len(names))], pa.string())  # few clients

    def relabel(table: pa.Table) -> pa.Table:
        idx = table.schema.get_field_index("client")
        codes = pc.index_in(table.column("client"), value_set=names)
        return table.set_column(idx, table.schema.field("client"), uuids.take(codes))

    return SnapshotState(relabel(state.objects), state.replicas, relabel(state.segments),
                         state.replica_next_id)


def _prefix(state: SnapshotState, k: int) -> SnapshotState:
    """The first ``k`` objects and their replicas (segment usage recomputed)."""
    keep = pc.less(state.replicas.column("object_index"), k)
    return with_usage(SnapshotState(state.objects.slice(0, k), state.replicas.filter(keep),
                                    state.segments, state.replica_next_id))


def settle(nbytes: int) -> None:
    """Wait until memory freed just before is handed back to the host (cold again), when
    ``nbytes`` is large enough for that to matter."""
    if nbytes >= _SETTLE_FROM_BYTES:
        time.sleep(_BALLOON_SETTLE_S)


def touch_and_free(nbytes: int) -> float:
    """Touch ``nbytes`` of fresh memory once and free it; returns the seconds the touch took.
    Right afterwards, the next allocations of that size find guest pages the host has backed."""
    t0 = time.perf_counter()
    np.ones(max(1, int(nbytes)), np.uint8)
    return time.perf_counter() - t0


def warm_up() -> None:
    """Every serving-path kernel loaded first (snapshot and restore paths included), as
    ``MasterService.start`` does: JIT compilation and first-use imports are not charged to the
    measured run (a long-running master has them done long before its next snapshot)."""
    from ..warmup import warm_up_kernels
    warm_up_kernels()


def bench_snapshot(objects: int, *, segments: int = 4, replicas: int = 1, show_progress: bool = False,
                   v1_sample_objects: int = 200_000) -> dict:
    """Snapshot write/restore seconds and bytes, with ratios to a same-run column copy."""
    warm_up()
    clocks = ManualClocks()
    m = build_master(objects, segments=segments, replicas=replicas, show_progress=show_progress,
                     clocks=clocks)
    # every object gets an active read lease, so default cleanup keeps them all on restore
    m.batch_get_replica_list(synthetic_keys(0, objects))
    clocks.advance(ms=1)

    o = m.objects
    hw = o.high_water
    t0 = time.perf_counter()
    [np.array(getattr(o, c)[:hw]) for c in OBJECT_COLUMNS]
    copy_s = time.perf_counter() - t0

    with tempfile.TemporaryDirectory(prefix="mooncake-bench-snapshot-") as tmp:
        repo = SnapshotRepository(tmp)
        manager = SnapshotManager(m, repo)
        settle(m.objects.high_water * 100)  # the build's freed temporaries: cold again
        t0 = time.perf_counter()
        sid = manager.snapshot_now()
        write_s = time.perf_counter() - t0
        lock_s = m.metrics.get("snapshot_lock_held_seconds")
        snap_dir = Path(tmp) / repo.cluster_id / sid
        snapshot_bytes = sum(p.stat().st_size for p in snap_dir.iterdir())
        clocks.advance(ms=1)
        settle(snapshot_bytes)  # a periodic snapshot: minutes after the last one
        t0 = time.perf_counter()
        manager.snapshot_now()
        rewrite_s = time.perf_counter() - t0
        rewrite_lock_s = m.metrics.get("snapshot_lock_held_seconds")
        clocks.advance(ms=1)
        touch_and_free(snapshot_bytes)
        t0 = time.perf_counter()
        manager.snapshot_now()  # retention deletes the first one: its files wait to be recycled
        warm_write_s = time.perf_counter() - t0
        clocks.advance(ms=1)
        settle(snapshot_bytes)
        t0 = time.perf_counter()
        sid = manager.snapshot_now()  # the periodic steady state: over the recycled files
        periodic_s = time.perf_counter() - t0
        periodic_lock_s = m.metrics.get("snapshot_lock_held_seconds")
        writer_rss = m.metrics.get("snapshot_writer_peak_rss_bytes")
        writer_private = m.metrics.get("snapshot_writer_private_bytes")
        snap_dir = Path(tmp) / repo.cluster_id / sid
        manager.stop()

        # a new process: unrelated steady epoch, wall clock 1 s later
        restore_clocks = ManualClocks(steady_ns=3 * NS_PER_S, system_ns=clocks.system_ns() + NS_PER_S)
        settle(snapshot_bytes)  # as a restarted process: memory freed above is cold
        t0 = time.perf_counter()
        restored, stats = restore_master(repo, config=m.config, clocks=restore_clocks)
        restore_s = time.perf_counter() - t0
        restore_phases = stats.phase_seconds
        engine_bytes = sum(restored.metadata_bytes().values())
        del restored
        # the engine plus the restore's temporaries (deadline copies, index build scratch)
        touch_and_free(2 * engine_bytes)
        t0 = time.perf_counter()
        restored, stats = restore_master(repo, config=m.config, clocks=restore_clocks)
        warm_restore_s = time.perf_counter() - t0

        # Floors on this machine, measured after the restore so that neither warms its memory:
        # the snapshot's bytes written to fresh files (page cache first touch), and as many fresh
        # bytes touched as the restored engine holds (first touch of anonymous memory).
        raw = Path(tmp) / "raw"
        raw.mkdir()
        t0 = time.perf_counter()
        for path in snap_dir.iterdir():
            with pa.memory_map(str(path)) as src, open(raw / path.name, "wb") as out:
                out.write(src.read_buffer())
        file_write_s = time.perf_counter() - t0
        settle(engine_bytes)  # let memory freed above go back to the host first
        fresh_memory_s = touch_and_free(engine_bytes)
        warm_memory_s = touch_and_free(engine_bytes)  # the same pages, still backed

    result = {
        "area": "snapshot",
        "objects": objects,
        "segments": segments,
        "replicas": replicas,
        "snapshot_write_seconds": write_s,
        "snapshot_lock_held_seconds": lock_s,
        "snapshot_rewrite_seconds": rewrite_s,
        "snapshot_rewrite_lock_held_seconds": rewrite_lock_s,
        "snapshot_write_warm_memory_seconds": warm_write_s,
        "snapshot_periodic_seconds": periodic_s,
        "snapshot_periodic_lock_held_seconds": periodic_lock_s,
        "snapshot_writer_peak_rss_bytes": writer_rss,
        "snapshot_writer_private_bytes": writer_private,
        "snapshot_restore_seconds": restore_s,
        "snapshot_restore_warm_memory_seconds": warm_restore_s,
        # the cold restore's phases (engine: the rebuild without its self-check)
        "snapshot_restore_decode_seconds": restore_phases["decode"],
        "snapshot_restore_cleanup_seconds": restore_phases["cleanup"],
        "snapshot_restore_engine_seconds": restore_phases["build"] - restore_phases["verify"],
        "snapshot_restore_verify_seconds": restore_phases["verify"],
        "snapshot_bytes": snapshot_bytes,
        "bytes_per_object": snapshot_bytes / max(1, objects),
        "restored_objects": restored.object_count(),
        "baseline_copy_seconds": copy_s,
        "write_ratio_to_baseline": write_s / copy_s,
        "restore_ratio_to_baseline": restore_s / copy_s,
        "baseline_file_write_seconds": file_write_s,
        "write_ratio_to_file_write": write_s / file_write_s,
        "restored_engine_bytes": engine_bytes,
        "baseline_fresh_memory_seconds": fresh_memory_s,
        "baseline_warm_memory_seconds": warm_memory_s,
        "restore_ratio_to_fresh_memory": restore_s / fresh_memory_s,
        "warm_restore_ratio_to_baseline": warm_restore_s / copy_s,
        "warm_write_ratio_to_baseline": warm_write_s / copy_s,
        "periodic_write_ratio_to_baseline": periodic_s / copy_s,
    }
    del restored
    # upstream v1 codec (msgpack + zstd, per-object Python) on a prefix of the same table: it
    # is ~10x slower than v2, so it is sampled and compared per object
    k = min(objects, v1_sample_objects)
    if k:
        state = _uuid_clients(_prefix(m.export_state(), k))
        t0 = time.perf_counter()
        payloads = encode_v1(state, system_now_ns=clocks.system_ns(), steady_now_ns=clocks.steady_ns())
        v1_encode_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        decode_v1(payloads, restore_system_ns=clocks.system_ns(), restore_steady_ns=0)
        v1_decode_s = time.perf_counter() - t0
        per_v2_write, per_v2_restore = write_s / objects, restore_s / objects
        result.update({
            "v1_sample_objects": k,
            "v1_encode_seconds": v1_encode_s,
            "v1_decode_seconds": v1_decode_s,
            "v1_bytes_per_object": sum(map(len, payloads.values())) / k,
            "v1_encode_per_object_ratio_to_v2_write": v1_encode_s / k / per_v2_write,
            "v1_decode_per_object_ratio_to_v2_restore": v1_decode_s / k / per_v2_restore,
        })
    result["peak_rss_bytes"] = peak_rss_bytes()
    return result
