"""Masters, journaled primaries, standbys and snapshot series that many tests build the same way."""
from __future__ import annotations

from typing import Any

import numpy as np

from mooncake_columnar.clock import NS_PER_S, ManualClocks
from mooncake_columnar.config import MasterConfig
from mooncake_columnar.ha.standby import StandbyService
from mooncake_columnar.ha.stores import OpLogStore
from mooncake_columnar.ha.writer import OpLogWriter
from mooncake_columnar.master import MasterService
from mooncake_columnar.messages import ReplicateConfig
from mooncake_columnar.schema import ReplicaStatus
from mooncake_columnar.snapshots.manager import MasterRestoreStats, SnapshotManager, restore_master
from mooncake_columnar.snapshots.repository import SnapshotRepository
from mooncake_columnar.store.rare_fields import SoftPinTable

MB = 1 << 20


def soft_pins_of(deadlines: np.ndarray) -> SoftPinTable:
    """A soft-pin table where row i holds ``deadlines[i]`` (kernel tests: the dense column as it was)."""
    t = SoftPinTable()
    t.add(np.arange(len(deadlines)), np.asarray(deadlines, np.int64))
    return t


# ---- one master -----------------------------------------------------------------------------------
def make_master(clocks: ManualClocks, segments: int = 1, seg_size: int = 64 * MB, **cfg: Any) -> MasterService:
    """A master with ``segments`` mounted segments ``seg0``... of ``seg_size`` bytes each."""
    m = MasterService(MasterConfig(**cfg), clocks=clocks)
    for i in range(segments):
        m.mount_segment(f"seg{i}", endpoint=f"10.0.0.{i}:1234", client_id=f"client{i}",
                        base=(i + 1) << 32, size=seg_size)
    return m


def put_objects(m: MasterService, keys: list[str], **cfg: Any) -> None:
    """Put and complete 1000-byte objects written by client ``c0``."""
    for k in keys:
        m.put_start(k, 1000, client_id="c0", config=ReplicateConfig(**cfg))
        m.put_end(k, client_id="c0")


# ---- a journaled primary and its standby ----------------------------------------------------------
def primary(store: OpLogStore, clocks: ManualClocks, **writer_kw: Any) -> tuple[MasterService, OpLogWriter]:
    """A master journaling to ``store``, with one 64 MiB segment ``seg0`` of client ``c0``."""
    writer = OpLogWriter(store, window=1 << 20, clocks=clocks, **writer_kw)
    m = MasterService(MasterConfig(), clocks=clocks, journal=writer)
    m.mount_segment("seg0", endpoint="10.0.0.1:1", client_id="c0", base=1 << 20, size=1 << 26)
    return m, writer


def standby(store: OpLogStore, clocks: ManualClocks, **kw: Any) -> StandbyService:
    """A standby following ``store`` whose waits advance ``clocks`` instead of sleeping."""
    return StandbyService(store, clocks=clocks, sleep=lambda s: clocks.advance(s=s), **kw)


def drain(sb: StandbyService, max_polls: int = 100_000) -> None:
    """Poll until a poll applies nothing; fail if the standby still applies after ``max_polls``."""
    for _ in range(max_polls):
        if not sb.poll():
            return
    raise AssertionError(f"the standby still applied entries after {max_polls} polls: the log never drains")


def canonical(m: MasterService) -> dict[tuple[str, str], tuple]:
    """Object state minus deadlines, put times, in-flight puts and readability (what the oplog carries)."""
    s = m.export_state()
    objs = s.objects.to_pylist()
    reps: dict[int, list[tuple]] = {}
    for r in s.replicas.to_pylist():
        if r["status"] == int(ReplicaStatus.COMPLETE):
            reps.setdefault(r["object_index"], []).append(
                (r["replica_id"], r["kind"], r["segment"], r["offset"], r["size"]))
    return {(o["tenant"], o["key"]): (o["client"], o["size_bytes"], o["data_type"], o["group"], o["hard_pinned"],
                                      o["soft_pin_enabled"], tuple(sorted(reps.get(i, []))))
            for i, o in enumerate(objs) if not o["processing"]}


# ---- a series of snapshots ------------------------------------------------------------------------
SERIES_CONFIG = MasterConfig(default_kv_lease_ttl_ms=10_000, client_live_ttl_s=10)
SERIES_WRITER = "3001-3002"  # UUID-shaped ("<u64>-<u64>"): the v1 writer requires it


def series_master() -> tuple[MasterService, ManualClocks]:
    """A master of :data:`SERIES_CONFIG` with one 1 MiB segment ``seg_a``, clocks in 2026."""
    clocks = ManualClocks(steady_ns=1_000 * NS_PER_S, system_ns=1_796_000_000 * NS_PER_S)
    m = MasterService(SERIES_CONFIG, clocks=clocks)
    m.mount_segment("seg_a", endpoint="seg_a:1", client_id="1001-1002", base=1 << 32, size=1 << 20)
    return m, clocks


def leased_put(m: MasterService, key: str) -> None:
    """Put a 100-byte object and read it once: it holds a lease of the config's TTL from now."""
    m.put_start(key, 100, client_id=SERIES_WRITER)
    m.put_end(key, client_id=SERIES_WRITER)
    m.get_replica_list(key)


def snapshot_series(repo: SnapshotRepository, n: int, **kw: Any) -> tuple[MasterService, ManualClocks, list[str]]:
    """``n`` snapshots 10 s apart; snapshot i holds keys k0..ki (all leased, all hard to miss)."""
    m, clocks = series_master()
    manager = SnapshotManager(m, repo, retention=10, prefault=False, **kw)
    ids: list[str] = []
    for i in range(n):
        leased_put(m, f"k{i}")
        sid = manager.snapshot_now()
        assert isinstance(sid, str)  # written in the foreground
        ids.append(sid)
        clocks.advance(s=10)
    return m, clocks, ids


def restore_later(repo: SnapshotRepository, clocks: ManualClocks,
                  **kw: Any) -> tuple[MasterService, MasterRestoreStats]:
    """Restore in a new process one second after ``clocks``' wall time, expired leases kept."""
    new = ManualClocks(steady_ns=7 * NS_PER_S, system_ns=clocks.system_ns() + NS_PER_S)
    return restore_master(repo, config=SERIES_CONFIG, clocks=new, snapshot_restore_drop_expired=False,
                          prefault=False, **kw)
