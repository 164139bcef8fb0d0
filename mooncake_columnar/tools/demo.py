"""`make demo`: a failover on embedded defaults, narrated step by step.

A primary journals every change to a file oplog (FileOpLogStore in a temp directory), a hot
standby follows it, the primary dies with an un-durable tail, the standby promotes, and the
clients remount one by one. Time is a ManualClocks pair so the story is reproducible; the
remount durations printed are measured.
"""
from __future__ import annotations

import tempfile
import time

from ..clock import ManualClocks
from ..config import MasterConfig
from ..errors import ReplicaNotReady
from ..ha.standby import StandbyService
from ..ha.stores import FileOpLogStore
from ..ha.writer import OpLogWriter
from ..master import MasterService
from ..messages import ReplicateConfig
from ..schema import PingStatus, SoftPinAction
from ..store.keys import string_buffers
from .synthetic import fill, mount_segments, segment_request, synthetic_keys

SEGMENTS = 4


def _say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def _present(m: MasterService, keys) -> int:
    """Objects present (readable or not) among ``keys``; a lookup only, no read lease granted."""
    offsets, data = string_buffers(keys)
    return int((m.store.lookup(offsets, data, "default") >= 0).sum())


def run_demo(objects: int = 200_000) -> int:
    clocks = ManualClocks()
    config = MasterConfig()
    with tempfile.TemporaryDirectory(prefix="mooncake-demo-") as tmp:
        store = FileOpLogStore(f"{tmp}/oplog")
        writer = OpLogWriter(store, window=objects + 4096, max_batch_entries=4096, clocks=clocks)
        primary = MasterService(config, clocks=clocks, journal=writer, initial_capacity=objects)
        standby = StandbyService(store, config=config, clocks=clocks)
        standby.bootstrap()

        # ---- 1. the primary serves and journals -------------------------------------------
        mount_segments(primary, SEGMENTS, objects * 4096)
        t0 = time.perf_counter()
        fill(primary, objects - 2, chunk=min(objects, 100_000))
        primary.put_start("pinned/hard", 4096, client_id="client-0", config=ReplicateConfig(hard_pin=True))
        primary.put_end("pinned/hard", client_id="client-0")
        primary.put_start("pinned/soft", 4096, client_id="client-0",
                          config=ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE))
        primary.put_end("pinned/soft", client_id="client-0")
        primary.batch_get_replica_list(synthetic_keys(0, 1000))  # leases: runtime-only, never journaled
        writer.flush()
        _say(f"primary: {primary.object_count():,} objects on {SEGMENTS} segments, "
             f"{store.durable_prefix():,} oplog entries durable ({time.perf_counter() - t0:.2f} s)")
        standby.poll()
        _say(f"standby follows: applied {standby.applied_sequence_id:,} entries, "
             f"{standby.master.object_count():,} objects, no deadlines on the wire")

        durable_gone = synthetic_keys(1000, 100)
        primary.batch_remove(durable_gone, force=True)
        writer.flush()                                # these removals are durable
        lost = synthetic_keys(1100, 50)
        primary.batch_remove(lost, force=True)        # journaled, never flushed: dies with the primary
        _say("primary removed 100 objects (durable) and 50 more whose entries never became durable")
        del primary, writer                           # the primary process dies here

        # ---- 2. promotion ---------------------------------------------------------------------
        clocks.advance(s=3)
        m = standby.promote(timeout_s=1.0)
        _say(f"standby promoted at sequence {store.durable_prefix():,}: serving at once with "
             f"{m.object_count():,} objects, every segment unreadable until its client remounts")
        resurrected = _present(m, durable_gone)
        _say(f"durably removed objects present after promotion: {resurrected} of 100; the 50 un-durable "
             f"removals are still there ({_present(m, lost)} of 50): only durable history counts")
        try:
            m.get_replica_list(synthetic_keys(500, 1)[0].as_py())
        except ReplicaNotReady:
            _say(f"get on an unremounted segment -> REPLICA_IS_NOT_READY; ping says {m.ping('client-0').name}")

        clocks.advance(s=3600)  # any lease would long be expired: nothing unreadable may go
        report = m.evict(target=1.0)
        _say(f"an hour later, eviction at 100%: {report.evicted_objects} evicted, "
             f"{report.skipped_unreadable:,} unreadable replicas protected (RFC guard, no TTL)")

        # ---- 3. clients remount one by one ----------------------------------------------------
        readable = 0
        for i in range(SEGMENTS):
            client = f"client-{i}"
            assert m.ping(client) == PingStatus.NEED_REMOUNT
            r = m.remount_segments(client, [segment_request(m, i)])
            readable += r.matched_objects  # counted, not read: reads would grant leases
            _say(f"{client} remounted {r.segments[0]}: {r.matched_objects:,} objects got ONE recovery "
                 f"lease of {r.effective_recovery_ttl_ms / 1000:.0f} s (locate {r.locate_seconds * 1e3:.1f} ms, "
                 f"assign {r.assignment_seconds * 1e3:.1f} ms, total {r.total_seconds * 1e3:.1f} ms, "
                 f"visible {r.visible_ttl_ms / 1000:.3f} s); readable now: {readable:,}")
            clocks.advance(s=4)
            evicted = m.evict(target=1.0)
            _say(f"  4 s later, eviction at 100%: {evicted.evicted_objects:,} evicted (expired recovery "
                 f"leases only), {evicted.skipped_unreadable:,} replicas protected on unremounted segments")
        _say(f"hard pin kept: {m.object_info('pinned/hard').hard_pinned}; soft pin enabled kept: "
             f"{m.object_info('pinned/soft').soft_pin_enabled} (fresh "
             f"{config.default_kv_soft_pin_ttl_ms // 60000} min interval from its remount)")
        _say(f"{m.object_count():,} objects remain; no object was lost while its segment was unreadable")
    return 0
