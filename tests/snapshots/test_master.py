"""End to end: a live MasterService -> SnapshotManager -> repository -> restore_master (RFC Phase 3).

Every restore runs in a "new process": a fresh ManualClocks with an unrelated steady epoch and a
system clock ``downtime`` later than the snapshot's.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mooncake_columnar.clock import NS_PER_MS, NS_PER_S, ManualClocks
from mooncake_columnar.config import MasterConfig
from mooncake_columnar.errors import (
    InvalidParams,
    NoAvailableHandle,
    NoUsableSnapshot,
    ObjectNotFound,
    SnapshotPublishError,
)
from mooncake_columnar.master import MasterService
from mooncake_columnar.messages import ReplicateConfig, SoftPinAction
from mooncake_columnar.schema import NEVER_LEASED, NO_DEADLINE
from mooncake_columnar.snapshots.arrow_codec import DIGEST_FILE, PAYLOAD_FILES
from mooncake_columnar.snapshots.manager import (
    SnapshotManager,
    primary_snapshot_manager,
    restore_master,
)
from mooncake_columnar.snapshots.manifest import MANIFEST_FILE, parse_manifest, v2_manifest
from mooncake_columnar.snapshots.repository import LATEST_FILE, SAVE_BACKUP_DIR, SnapshotRepository
from tests.fixtures import MOONCAKE_V1 as FIXTURES

CFG = MasterConfig(default_kv_lease_ttl_ms=10_000, client_live_ttl_s=10)
SEG_SIZE = 1 << 20
BASES = {"seg_a": 1 << 32, "seg_b": 2 << 32}
# UUID-shaped client ids ("<u64>-<u64>"), as upstream renders them: the v1 writer requires it.
CLIENTS = {"seg_a": "1001-1002", "seg_b": "2001-2002"}
WRITER = "3001-3002"


class ReadAdvancingClocks:
    """Wraps ManualClocks: every read returns the current value and then advances both clocks by
    ``step_ns``, so any work between reads (decode, cleanup, engine rebuild) costs time."""

    def __init__(self, inner: ManualClocks, step_ns: int) -> None:
        self.inner, self.step_ns = inner, step_ns
        self.system_reads: list[int] = []
        self.steady_reads: list[int] = []

    def system_ns(self) -> int:
        v = self.inner.system_ns()
        self.system_reads.append(v)
        self.inner.advance(self.step_ns)
        return v

    def steady_ns(self) -> int:
        v = self.inner.steady_ns()
        self.steady_reads.append(v)
        self.inner.advance(self.step_ns)
        return v


def _mount(m: MasterService) -> None:
    for name, base in BASES.items():
        m.mount_segment(name, endpoint=f"{name}:17777", client_id=CLIENTS[name], base=base,
                        size=SEG_SIZE)


def _put(m: MasterService, key: str, size: int = 1000, **cfg) -> None:
    m.put_start(key, size, client_id=WRITER, config=ReplicateConfig(**cfg))
    m.put_end(key, client_id=WRITER)


def build_scenario() -> tuple[MasterService, ManualClocks]:
    """A master holding every kind of object the restore rules distinguish."""
    clocks = ManualClocks(steady_ns=1_000 * NS_PER_S, system_ns=1_796_000_000 * NS_PER_S)
    m = MasterService(CFG, clocks=clocks)
    _mount(m)
    _put(m, "soft_expired", soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=1_000)
    clocks.advance(s=2)
    _put(m, "leased")
    m.get_replica_list("leased")                                  # lease: now + 10 s
    clocks.advance(s=3)
    _put(m, "leased_late", replica_num=2)
    m.get_replica_list("leased_late")                             # lease: now + 10 s
    _put(m, "soft", soft_pin_action=SoftPinAction.ENABLE)         # soft pin: now + 30 min
    _put(m, "hard", hard_pin=True)                                # lease expired at put_end
    _put(m, "expired")                                            # lease expired at put_end
    m.put_start("inflight", 1000, client_id=WRITER)             # never completed
    clocks.advance(s=1)
    return m, clocks


def _repo(tmp_path: Path, **kw) -> SnapshotRepository:
    return SnapshotRepository(tmp_path / "snapshots", **kw)


def _deadlines(m: MasterService) -> dict[str, tuple[int, int]]:
    t = m.to_arrow()
    return dict(zip(t.column("key").to_pylist(),
                    zip(t.column("lease_deadline_ns").to_pylist(),
                        t.column("soft_pin_deadline_ns").to_pylist())))


def _new_process_clocks(m_clocks: ManualClocks, downtime_s: float, skew_s: float = 0.0) -> ManualClocks:
    """A restoring process: unrelated steady epoch; wall clock downtime (+ skew) later."""
    return ManualClocks(steady_ns=7 * NS_PER_S,
                        system_ns=m_clocks.system_ns() + int((downtime_s + skew_s) * NS_PER_S))


def _expected(d0: int, s0: int, c0: int, s1: int, c1: int) -> int:
    """RFC Phase 3: remaining = (S0 + (D0 - C0)) - S1; new = C1 + remaining (sentinels kept)."""
    if d0 == NEVER_LEASED:
        return d0
    return c1 + (s0 + (d0 - c0)) - s1


# ---- lease conversion through the engine -------------------------------------------------------
def test_phase3_active_lease_with_known_downtime_and_restore_time(tmp_path: Path) -> None:
    m, clocks = build_scenario()
    repo = _repo(tmp_path)
    sid = SnapshotManager(m, repo).snapshot_now()
    c0, before = clocks.steady_ns(), _deadlines(m)
    remaining_at_snapshot = {k: d[0] - c0 for k, d in before.items()}
    assert remaining_at_snapshot["leased"] == 6 * NS_PER_S
    assert remaining_at_snapshot["leased_late"] == 9 * NS_PER_S

    downtime = 2 * NS_PER_S
    inner = _new_process_clocks(clocks, downtime / NS_PER_S)
    restore_clocks = ReadAdvancingClocks(inner, step_ns=50 * NS_PER_MS)
    r, stats = restore_master(repo, config=CFG, clocks=restore_clocks)
    assert stats.snapshot_id == sid and stats.format_version == "2.0.0"
    s1, c1 = restore_clocks.system_reads[0], restore_clocks.steady_reads[0]
    assert s1 - clocks.system_ns() == downtime
    now = inner.steady_ns()
    restore_time = now - c1
    assert restore_time > 0  # the wrapper made the restore itself take time
    after = _deadlines(r)
    for key in ("leased", "leased_late"):
        # remaining now == remaining at snapshot - downtime - restore time, never a fresh TTL
        assert after[key][0] - now == remaining_at_snapshot[key] - downtime - restore_time
        assert after[key][0] == _expected(before[key][0], clocks.system_ns(), c0, s1, c1)
    assert r.metrics.get("restore_v2_total") == 1 and r.metrics.get("restore_v1_total") == 0
    assert set(stats.phase_seconds) == {"decode", "cleanup", "build", "verify"}
    assert 0 <= stats.phase_seconds["verify"] <= stats.phase_seconds["build"]
    # leased objects are readable right away on the restored master
    assert [d.segment for d in r.get_replica_list("leased_late")] and r.exist_key("leased")


def test_phase3_restore_decode_time_keeps_reducing_the_lease(tmp_path: Path) -> None:
    m, clocks = build_scenario()
    repo = _repo(tmp_path)
    SnapshotManager(m, repo).snapshot_now()
    leases = []
    for step_ms in (0, 400, 900):
        inner = _new_process_clocks(clocks, 1)
        r, _ = restore_master(repo, config=CFG, clocks=ReadAdvancingClocks(inner, step_ms * NS_PER_MS))
        leases.append(r.object_info("leased_late").lease_deadline_ns - inner.steady_ns())
    assert leases[0] > leases[1] > leases[2]  # slower restores leave less of the lease


def test_phase3_expired_stays_expired_and_drop_expired_false_keeps_them(tmp_path: Path) -> None:
    m, clocks = build_scenario()
    repo = _repo(tmp_path)
    SnapshotManager(m, repo).snapshot_now()
    c0, s0, before = clocks.steady_ns(), clocks.system_ns(), _deadlines(m)
    new = _new_process_clocks(clocks, 3)
    s1, c1 = new.system_ns(), new.steady_ns()

    dropped, stats = restore_master(repo, config=CFG, clocks=new)
    assert set(_deadlines(dropped)) == {"leased", "leased_late", "soft", "hard"}
    assert stats.objects_dropped == 3  # expired, soft_expired, inflight

    kept, stats = restore_master(repo, config=CFG, clocks=new, snapshot_restore_drop_expired=False)
    got = _deadlines(kept)
    assert set(got) == {"leased", "leased_late", "soft", "hard", "expired", "soft_expired"}
    for key in ("expired", "soft_expired", "hard"):
        assert got[key][0] <= kept.clocks.steady_ns()  # expired stays expired: no default TTL
        assert got[key][0] == _expected(before[key][0], s0, c0, s1, c1)
    # an expired kept object is evictable cache: it can be removed without waiting for a lease
    kept.remove("expired")
    with pytest.raises(ObjectNotFound):
        kept.object_info("expired")
    # the alias spelling behaves the same
    alias, _ = restore_master(repo, config=CFG, clocks=new, drop_expired=False)
    assert set(_deadlines(alias)) == set(got)


def test_phase3_hard_pinned_kept_and_non_hard_pinned_expired_dropped(tmp_path: Path) -> None:
    m, clocks = build_scenario()
    repo = _repo(tmp_path)
    SnapshotManager(m, repo).snapshot_now()
    # an hour later every lease and both soft pins are over
    r, _ = restore_master(repo, config=CFG, clocks=_new_process_clocks(clocks, 3600))
    assert set(_deadlines(r)) == {"hard"}  # hard pin survives; soft pin (30 min) expired too
    info = r.object_info("hard")
    assert info.hard_pinned and info.lease_deadline_ns <= r.clocks.steady_ns()
    assert [d.readable for d in info.replicas] == [True]


def test_phase3_soft_pin_active_and_expired(tmp_path: Path) -> None:
    m, clocks = build_scenario()
    repo = _repo(tmp_path)
    SnapshotManager(m, repo).snapshot_now()
    c0, s0, before = clocks.steady_ns(), clocks.system_ns(), _deadlines(m)
    new = _new_process_clocks(clocks, 60)
    s1, c1 = new.system_ns(), new.steady_ns()
    r, _ = restore_master(repo, config=CFG, clocks=new, snapshot_restore_drop_expired=False)
    soft, soft_expired = r.object_info("soft"), r.object_info("soft_expired")
    assert soft.soft_pin_enabled and soft_expired.soft_pin_enabled  # the flag is preserved
    assert soft.soft_pin_deadline_ns == _expected(before["soft"][1], s0, c0, s1, c1)
    assert soft.soft_pin_deadline_ns - c1 == (30 * 60 - 1 - 60) * NS_PER_S  # pinned 1 s before
    assert soft_expired.soft_pin_deadline_ns == _expected(before["soft_expired"][1], s0, c0, s1, c1)
    assert soft_expired.soft_pin_deadline_ns < c1  # enabled but not active until renewed
    assert r.object_info("leased").soft_pin_deadline_ns == NO_DEADLINE
    # the soft pin alone keeps the object through default cleanup
    dropped, _ = restore_master(repo, config=CFG, clocks=new)
    assert dropped.object_info("soft").soft_pin_enabled
    with pytest.raises(ObjectNotFound):
        dropped.object_info("soft_expired")


def test_phase3_inflight_objects_dropped(tmp_path: Path) -> None:
    m, clocks = build_scenario()
    repo = _repo(tmp_path)
    SnapshotManager(m, repo).snapshot_now()
    r, _ = restore_master(repo, config=CFG, clocks=_new_process_clocks(clocks, 1),
                          snapshot_restore_drop_expired=False)
    with pytest.raises(ObjectNotFound):
        r.object_info("inflight")
    # its PROCESSING extent is not held: the restored usage is exactly the complete replicas'
    state = r.export_state()
    assert "inflight" not in state.objects.column("key").to_pylist()
    used = {k: v[0] for k, v in r.segment_usage().items()}
    assert sum(used.values()) == int(np.sum(state.replicas.column("size").to_numpy()))


@pytest.mark.parametrize("skew_s", [+2.5, -2.5, +20.0, -600.0])
def test_phase3_positive_and_negative_system_clock_skew(tmp_path: Path, skew_s: float) -> None:
    m, clocks = build_scenario()
    repo = _repo(tmp_path)
    SnapshotManager(m, repo).snapshot_now()
    c0, s0, before = clocks.steady_ns(), clocks.system_ns(), _deadlines(m)
    new = _new_process_clocks(clocks, downtime_s=1, skew_s=skew_s)
    s1, c1 = new.system_ns(), new.steady_ns()
    r, _ = restore_master(repo, config=CFG, clocks=new, snapshot_restore_drop_expired=False)
    after = _deadlines(r)
    for key, (lease, soft) in after.items():
        assert lease == _expected(before[key][0], s0, c0, s1, c1)
        assert soft == (NO_DEADLINE if before[key][1] == NO_DEADLINE
                        else _expected(before[key][1], s0, c0, s1, c1))
    # ahead (+): leases look shorter; behind (-): longer; the formula decides either way
    assert after["leased_late"][0] - c1 == 9 * NS_PER_S - NS_PER_S - int(skew_s * NS_PER_S)


# ---- engine behaviour after restore ------------------------------------------------------------
def test_phase3_allocations_after_restore_do_not_overlap_restored_replicas(tmp_path: Path) -> None:
    m, clocks = build_scenario()
    for i in range(40):
        _put(m, f"fill_{i}", size=3000 + 17 * i, hard_pin=True)
    for i in range(0, 40, 3):  # holes between restored extents
        m.remove(f"fill_{i}", force=True)
    repo = _repo(tmp_path)
    SnapshotManager(m, repo).snapshot_now()
    r, _ = restore_master(repo, config=CFG, clocks=_new_process_clocks(clocks, 1))
    restored = {k: [(d.segment, d.address, d.size) for d in r.object_info(k).replicas]
                for k in _deadlines(r)}
    for i in range(300):
        try:
            _put(r, f"new_{i}", size=2000 + 31 * i)
        except NoAvailableHandle:  # segments full: allocation refused, never overlapping
            break
    assert i > 10
    state = r.export_state()
    state.validate()  # raises on any overlap between restored and new extents
    for k, reps in restored.items():  # restored replicas did not move
        assert [(d.segment, d.address, d.size) for d in r.object_info(k).replicas] == reps
    usage = r.segment_usage()
    assert all(used <= cap for used, cap in usage.values())


def test_phase3_restored_clients_must_ping_or_are_unmounted(tmp_path: Path) -> None:
    m, clocks = build_scenario()
    repo = _repo(tmp_path)
    SnapshotManager(m, repo).snapshot_now()
    new = _new_process_clocks(clocks, 1)
    r, _ = restore_master(repo, config=CFG, clocks=new)
    assert set(r.segment_usage()) == set(BASES)  # mounted, readable
    assert all(d.readable for d in r.object_info("leased_late").replicas)
    new.advance(s=CFG.client_live_ttl_s - 1)
    assert r.ping(CLIENTS["seg_a"]).name == "NEED_REMOUNT"  # client a is alive and remounts
    r.remount_segments(CLIENTS["seg_a"], [dict(name="seg_a", endpoint="seg_a:17777",
                                               client=CLIENTS["seg_a"], base=BASES["seg_a"],
                                               size=SEG_SIZE)])
    r.tick()
    assert set(r.segment_usage()) == set(BASES)  # nobody is late yet
    new.advance(s=2)
    r.tick()  # client b never pinged: its segment goes, and objects left without replicas
    assert set(r.segment_usage()) == {"seg_a"}
    assert [d.segment for d in r.object_info("leased_late").replicas] == ["seg_a"]
    on_b = [k for k, reps in ((k, m.object_info(k).replicas) for k in ("leased", "soft", "hard"))
            if all(d.segment == "seg_b" for d in reps)]
    for key in on_b:
        with pytest.raises(ObjectNotFound):
            r.object_info(key)


# ---- upstream v1 fixtures --------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["small_6", "many_1000"])
def test_phase3_v1_fixture_restores_into_working_master(case: str) -> None:
    expected = json.loads((FIXTURES / case / "expected.json").read_text())
    repo = SnapshotRepository(FIXTURES / case / "mooncake_master_snapshot")
    obs = expected["restore_observations"]
    s1_ms = obs["default_restore"]["restore_started_wall_clock_ms"]
    clocks = ManualClocks(steady_ns=55 * NS_PER_S, system_ns=s1_ms * NS_PER_MS)
    r, stats = restore_master(repo, config=MasterConfig(default_kv_lease_ttl_ms=5_000), clocks=clocks)
    assert stats.format_version == "1.0.0" and stats.fallbacks == 0
    assert r.metrics.get("restore_v1_total") == 1 and r.metrics.get("restore_v2_total") == 0
    by_key = {o["key"]: o for o in expected["objects"]}
    hard = {k for k, o in by_key.items() if o["hard_pinned"]}
    leased = {k for k, o in by_key.items() if o["lease_timeout_ms"] > s1_ms}
    assert len(leased) == obs["default_restore"]["key_count"]
    assert r.object_count() == len(leased | hard)
    for key in sorted(leased):
        # Phase 2 adapter: remaining = D_sys_ms - S1, carried into the new steady domain
        assert r.object_info(key).lease_deadline_ns == (
            55 * NS_PER_S + (by_key[key]["lease_timeout_ms"] - s1_ms) * NS_PER_MS)
    for key in sorted(leased)[:50]:  # reads refresh (group-coalesced) leases: check them first
        o = by_key[key]
        got = r.get_replica_list(key)
        assert sorted((d.address, d.size) for d in got) == sorted(
            (rep["buffer_address"], rep["size"]) for rep in o["replicas"])
    kept, _ = restore_master(repo, config=MasterConfig(default_kv_lease_ttl_ms=5_000), clocks=clocks,
                             snapshot_restore_drop_expired=False)
    assert kept.object_count() == obs["skip_cleanup_restore"]["key_count"]
    kept.export_state().validate()


def test_phase3_write_v1_rollback_restores(tmp_path: Path) -> None:
    m, clocks = build_scenario()
    repo = _repo(tmp_path)
    sid = SnapshotManager(m, repo, write_v1=True).snapshot_now()
    assert repo.read_manifest(sid) == f"messagepack|1.0.0|{sid}".encode()
    c0, before = clocks.steady_ns(), _deadlines(m)
    new = _new_process_clocks(clocks, 2)
    r, stats = restore_master(repo, config=CFG, clocks=new)
    assert stats.format_version == "1.0.0"
    # v1 rounds deadlines down to the ms on write (never extends a lease)
    remaining = r.object_info("leased_late").lease_deadline_ns - new.steady_ns()
    assert 0 <= (before["leased_late"][0] - c0 - 2 * NS_PER_S) - remaining < NS_PER_MS


# ---- fallback, publication, corruption -------------------------------------------------------------
def test_phase3_candidate_fallback_after_corrupted_latest(tmp_path: Path) -> None:
    m, clocks = build_scenario()
    repo = _repo(tmp_path)
    manager = SnapshotManager(m, repo, retention=5)
    older = manager.snapshot_now()
    clocks.advance(s=1)
    _put(m, "only_in_newer", hard_pin=True)
    newer = manager.snapshot_now()
    assert repo.candidates() == [newer, older]
    path = tmp_path / "snapshots" / repo.cluster_id / newer / "objects.arrow"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    r, stats = restore_master(repo, config=CFG, clocks=_new_process_clocks(clocks, 1))
    assert stats.snapshot_id == older and stats.fallbacks == 1
    assert "SnapshotDigestError" in stats.failures[0][1]
    assert r.metrics.get("snapshot_candidate_fallbacks_total") == 1
    assert r.metrics.get("clock_conversion_failures_total") == 0
    with pytest.raises(ObjectNotFound):
        r.object_info("only_in_newer")  # nothing of the rejected candidate survives


def test_phase3_fallback_after_malformed_mapping_counts_conversion_failure(tmp_path: Path) -> None:
    m, clocks = build_scenario()
    repo = _repo(tmp_path)
    manager = SnapshotManager(m, repo, retention=5)
    older = manager.snapshot_now()
    clocks.advance(s=1)
    newer = manager.snapshot_now()
    # a mapping pair that overflows int64 when applied: a conversion failure, not a crash
    manifest = v2_manifest(newer, 2**63 - 1, -(2**63) + 1).encode()
    (tmp_path / "snapshots" / repo.cluster_id / newer / MANIFEST_FILE).write_text(manifest)
    r, stats = restore_master(repo, config=CFG, clocks=_new_process_clocks(clocks, 1))
    assert stats.snapshot_id == older
    assert r.metrics.get("clock_conversion_failures_total") == 1
    assert r.metrics.get("snapshot_candidate_fallbacks_total") == 1


def test_phase3_manifest_last_and_byte_identical_in_primary_and_backup(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    m, clocks = build_scenario()
    repo = _repo(tmp_path, backup_dir=tmp_path / "backup")
    order: list[str] = []
    real_put = repo._put

    def put(path: str, data: bytes) -> None:
        name = path.rsplit("/", 1)[1]
        order.append(name)
        if name == LATEST_FILE:  # the manifest is already published; the pointer upload fails
            raise OSError("injected: latest.txt upload failed")
        real_put(path, data)

    monkeypatch.setattr(repo, "_put", put)
    manager = SnapshotManager(m, repo)
    with pytest.raises(SnapshotPublishError):
        manager.snapshot_now()
    assert order[-2:] == [MANIFEST_FILE, LATEST_FILE]
    assert set(order[:-2]) == {*PAYLOAD_FILES, DIGEST_FILE}
    sid = repo.list()[0]
    primary = repo.read(sid)
    backup = tmp_path / "backup" / SAVE_BACKUP_DIR / sid
    assert (backup / MANIFEST_FILE).read_bytes() == primary.manifest  # byte-identical
    assert parse_manifest(primary.manifest).system_now_ns == clocks.system_ns()
    for name, data in primary.payloads.items():
        assert (backup / name).read_bytes() == data
    assert m.metrics.get("snapshot_failure") == 1 and m.metrics.get("snapshot_success") == 0


def _publication_steps(m: MasterService, clocks: ManualClocks, root: Path) -> int:
    repo = SnapshotRepository(root)
    count = [0]
    real_put = repo._put

    def put(path: str, data: bytes) -> None:
        count[0] += 1
        real_put(path, data)

    repo._put = put  # type: ignore[method-assign]
    SnapshotManager(m, repo).snapshot_now()
    return count[0]


def test_phase3_crash_at_every_publication_step(tmp_path: Path) -> None:
    """A crash before any file write: the half-written snapshot is never restored; the previous
    complete one is (or nothing, when there is none)."""
    m, clocks = build_scenario()
    steps = _publication_steps(m, clocks, tmp_path / "probe")
    assert steps == 6  # 3 arrow files, digest, manifest, latest.txt
    for crash_at in range(steps + 1):
        root = tmp_path / f"crash{crash_at}"
        repo = SnapshotRepository(root)
        manager = SnapshotManager(m, repo)
        first = manager.snapshot_now()
        clocks.advance(s=1)
        _put(m, f"after_{crash_at}", hard_pin=True)
        calls = [0]
        real_put = repo._put

        def put(path: str, data: bytes, real_put=real_put, calls=calls, crash_at=crash_at) -> None:
            if calls[0] == crash_at:
                raise SystemExit("crash")  # the process dies here: nothing after runs
            calls[0] += 1
            real_put(path, data)

        repo._put = put  # type: ignore[method-assign]
        if crash_at < steps:
            with pytest.raises(SystemExit):
                manager.snapshot_now()
        else:
            manager.snapshot_now()
        fresh = SnapshotRepository(root)
        r, stats = restore_master(fresh, config=CFG, clocks=_new_process_clocks(clocks, 1))
        # latest.txt is the last write: before it, the new snapshot is never the one restored
        complete = crash_at >= steps
        assert (stats.snapshot_id != first) == complete
        assert r.exist_key(f"after_{crash_at}") == complete
        assert r.exist_key("leased_late")


def test_phase3_corrupted_bytes_in_every_payload_fail_the_candidate(tmp_path: Path) -> None:
    m, clocks = build_scenario()
    repo = _repo(tmp_path)
    manager = SnapshotManager(m, repo, retention=10)
    good = manager.snapshot_now()
    clocks.advance(s=1)
    target = manager.snapshot_now()
    new = _new_process_clocks(clocks, 1)
    reference, _ = restore_master(repo, config=CFG, clocks=new, snapshot_restore_drop_expired=False)
    ref = reference.export_state()
    rng = np.random.default_rng(5)
    root = tmp_path / "snapshots" / repo.cluster_id / target
    for name in (*PAYLOAD_FILES, DIGEST_FILE, MANIFEST_FILE):
        original = (root / name).read_bytes()
        for _ in range(12):
            data = bytearray(original)
            pos = int(rng.integers(0, len(data)))
            data[pos] ^= int(rng.integers(1, 256))
            if rng.random() < 0.3:
                data = data[: int(rng.integers(0, len(data)))]  # truncation
            (root / name).write_bytes(bytes(data))
            r, stats = restore_master(repo, config=CFG, clocks=new, snapshot_restore_drop_expired=False)
            if stats.snapshot_id == target:
                # only a change that leaves the content equivalent may pass (JSON whitespace in
                # digest.json), or, in the unchecksummed manifest, a still-valid clock digit:
                # either way the restore is complete, never partial
                got = r.export_state()
                assert got.replicas.equals(ref.replicas)
                assert got.objects.column("key").equals(ref.objects.column("key"))
                if name != MANIFEST_FILE:
                    assert got.objects.equals(ref.objects)
            else:
                assert stats.snapshot_id == good and stats.fallbacks == 1
        (root / name).write_bytes(original)


def test_restore_master_without_snapshots_raises(tmp_path: Path) -> None:
    with pytest.raises(NoUsableSnapshot) as info:
        restore_master(_repo(tmp_path), config=CFG, clocks=ManualClocks())
    assert info.value.stats.candidates_tried == 0


# ---- the manager itself ------------------------------------------------------------------------------
def test_manager_metrics_retention_and_monotonic_ids(tmp_path: Path) -> None:
    m, clocks = build_scenario()
    repo = _repo(tmp_path)
    manager = SnapshotManager(m, repo, retention=2, compression="zstd")
    a = manager.snapshot_now()
    b = manager.snapshot_now()          # same millisecond: the id is bumped, not a collision
    clocks.jump_system(s=-3600)         # wall clock steps back an hour
    c = manager.snapshot_now()
    assert a < b < c
    assert repo.list() == [c, b] and repo.latest() == c
    assert parse_manifest(repo.read_manifest(c)).system_now_ns == clocks.system_ns()  # true S0
    assert m.metrics.get("snapshot_success") == 3 and m.metrics.get("snapshot_failure") == 0
    assert m.metrics.get("snapshot_duration_seconds") > 0
    assert m.metrics.get("snapshot_lock_held_seconds") > 0
    # a second manager on the same repository continues after the newest existing id
    d = SnapshotManager(m, repo).snapshot_now()
    assert d > c


def test_manager_captures_one_clock_pair_under_the_lock(tmp_path: Path) -> None:
    m, clocks = build_scenario()
    seen: list[tuple[str, bool]] = []

    class Probe:
        def system_ns(self) -> int:
            seen.append(("system", m.lock._is_owned()))
            return clocks.system_ns()

        def steady_ns(self) -> int:
            seen.append(("steady", m.lock._is_owned()))
            return clocks.steady_ns()

    m.clocks = Probe()
    repo = _repo(tmp_path)
    sid = SnapshotManager(m, repo).snapshot_now()
    assert seen == [("system", True), ("steady", True)]  # one pair, both read under the lock
    manifest = parse_manifest(repo.read_manifest(sid))
    assert (manifest.system_now_ns, manifest.steady_now_ns) == (clocks.system_ns(), clocks.steady_ns())


def test_manager_background_snapshot_is_frozen_at_call(tmp_path: Path) -> None:
    m, clocks = build_scenario()
    repo = _repo(tmp_path)
    with SnapshotManager(m, repo) as manager:
        future = manager.snapshot_now(background=True)
        m.remove("leased_late", force=True)  # after the freeze: not in this snapshot
        sid = future.result(timeout=30)
    r, stats = restore_master(repo, config=CFG, clocks=_new_process_clocks(clocks, 1))
    assert stats.snapshot_id == sid and r.exist_key("leased_late")


def test_manager_periodic_thread_and_stop_interrupts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    m, _ = build_scenario()
    manager = SnapshotManager(m, _repo(tmp_path), interval_s=0.001)
    fired = threading.Event()
    real = manager.snapshot_now

    def snap(**kw):
        sid = real(**kw)
        fired.set()
        return sid

    monkeypatch.setattr(manager, "snapshot_now", snap)
    manager.start()
    assert fired.wait(timeout=30), "the snapshot thread took no snapshot in 30 s"
    manager.stop()
    assert not manager.running and m.metrics.get("snapshot_success") >= 1
    # a long interval: stop() interrupts the wait instead of waiting it out
    slow = SnapshotManager(m, _repo(tmp_path / "slow"), interval_s=3600)
    slow.start()
    assert slow.running
    slow.stop()
    assert not slow.running


def test_manager_rejects_bad_parameters(tmp_path: Path) -> None:
    m, _ = build_scenario()
    repo = _repo(tmp_path)
    for kw in (dict(retention=0), dict(interval_s=0), dict(compression="gzip"),
               dict(write_v1=True, compression="zstd"), dict(retention=True)):
        with pytest.raises(InvalidParams):
            SnapshotManager(m, repo, **kw)
    with pytest.raises(InvalidParams):
        restore_master(repo, snapshot_restore_drop_expired="yes")  # type: ignore[arg-type]


def test_phase3_batch_oplog_mode_does_not_start_complete_snapshot_writer(tmp_path: Path) -> None:
    m, _ = build_scenario()
    repo = _repo(tmp_path)
    assert primary_snapshot_manager(m, repo, enable_snapshot=True, enable_oplog=True) is None
    assert m.metrics.get("snapshot_writer_skipped_oplog_mode") == 1
    assert primary_snapshot_manager(m, repo, enable_snapshot=False, enable_oplog=False) is None
    assert repo.list() == []
    manager = primary_snapshot_manager(m, repo, enable_snapshot=True, enable_oplog=False,
                                       interval_s=3600)
    try:
        assert manager is not None and manager.running
    finally:
        manager.stop()


# ---- S3 -----------------------------------------------------------------------------------------
def test_phase3_snapshot_to_s3_and_restore(s3_uri: str) -> None:
    m, clocks = build_scenario()
    repo = SnapshotRepository(s3_uri, cluster_id=f"c{uuid.uuid4().hex}")
    manager = SnapshotManager(m, repo, compression="zstd")
    sid = manager.snapshot_now()
    clocks.advance(s=1)
    sid2 = manager.snapshot_now()
    assert repo.candidates() == [sid2, sid]
    c0, s0, before = clocks.steady_ns(), clocks.system_ns(), _deadlines(m)
    new = _new_process_clocks(clocks, 4)
    s1, c1 = new.system_ns(), new.steady_ns()
    r, stats = restore_master(SnapshotRepository(s3_uri, cluster_id=repo.cluster_id), config=CFG,
                              clocks=new)
    assert stats.snapshot_id == sid2
    for key, (lease, _) in _deadlines(r).items():
        assert lease == _expected(before[key][0], s0, c0, s1, c1)
    assert r.get_replica_list("leased_late")


# ---- property: random tables, downtime and skew ------------------------------------------------
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(remaining_ms=st.lists(st.integers(-10**7, 10**7), min_size=1, max_size=12),
       # soft pins up to max_kv_soft_pin_ttl_ms (a day): a longer one rejects the candidate
       soft_ms=st.lists(st.one_of(st.none(), st.integers(-10**7, 86_400_000)), min_size=12, max_size=12),
       hard=st.lists(st.booleans(), min_size=12, max_size=12),
       downtime_ms=st.integers(0, 10**7), skew_ms=st.integers(-10**7, 10**7),
       new_epoch_s=st.integers(0, 10**9))
def test_phase3_property_restored_deadlines_follow_the_formula(
        remaining_ms: list[int], soft_ms: list[int | None], hard: list[bool], downtime_ms: int,
        skew_ms: int, new_epoch_s: int) -> None:
    clocks = ManualClocks(steady_ns=10**6 * NS_PER_S, system_ns=1_796_000_000 * NS_PER_S)
    m = MasterService(CFG, clocks=clocks)
    _mount(m)
    for i, rem in enumerate(remaining_ms):
        _put(m, f"k{i}", hard_pin=hard[i])
    # set deadlines directly on the columns: any remaining, positive or negative
    o = m.objects
    rows = o.live_rows()
    now = clocks.steady_ns()
    o.lease_deadline_ns[rows] = now + np.array(remaining_ms, np.int64) * NS_PER_MS
    soft = np.array([NO_DEADLINE if s is None else now + s * NS_PER_MS for s in soft_ms[:rows.size]],
                    np.int64)
    m.store.soft_pins.add(rows[soft != NO_DEADLINE], soft[soft != NO_DEADLINE])
    before = _deadlines(m)
    root = Path(tempfile.mkdtemp())
    try:
        repo = SnapshotRepository(root)
        SnapshotManager(m, repo).snapshot_now()
        new = ManualClocks(steady_ns=new_epoch_s * NS_PER_S,
                           system_ns=clocks.system_ns() + (downtime_ms + skew_ms) * NS_PER_MS)
        s1, c1 = new.system_ns(), new.steady_ns()
        r, _ = restore_master(repo, config=CFG, clocks=new, snapshot_restore_drop_expired=False)
        after = _deadlines(r)
        assert set(after) == set(before)
        for key, (lease, soft_d) in after.items():
            assert lease == _expected(before[key][0], clocks.system_ns(), now, s1, c1)
            assert soft_d == (NO_DEADLINE if before[key][1] == NO_DEADLINE
                              else _expected(before[key][1], clocks.system_ns(), now, s1, c1))
        dropped, _ = restore_master(repo, config=CFG, clocks=new)
        expect_kept = {k for k, (lease, soft_d) in after.items()
                       if r.object_info(k).hard_pinned or lease > c1 or soft_d > c1}
        assert set(_deadlines(dropped)) == expect_kept
    finally:
        shutil.rmtree(root)


def test_phase3_frozen_columns_ignore_later_mutations_and_arena_compaction(tmp_path: Path) -> None:
    """The lock covers only the column copy; the key arena is referenced, not copied, which is
    safe because it is append-only (compaction and growth build a new array)."""
    from mooncake_columnar.store.arrow_export import frozen_state
    m, clocks = build_scenario()
    for i in range(300):
        _put(m, f"churn_{i:04d}", size=500 + i)
    before = m.export_state()
    manager = SnapshotManager(m, _repo(tmp_path))
    frozen, system_ns, steady_ns, buffers = manager.freeze()
    # after the freeze: leases, removals, arena compaction, new keys reusing rows and bytes
    clocks.advance(s=1)
    m.get_replica_list("leased")
    m.batch_remove([f"churn_{i:04d}" for i in range(0, 300, 2)], force=True)
    m.keys._compact_arena()
    for i in range(200):
        _put(m, f"later_{i:04d}", size=700)
    after = frozen_state(frozen).plain()
    assert after.objects.equals(before.objects) and after.replicas.equals(before.replicas)
    assert (system_ns, steady_ns) == (clocks.system_ns() - NS_PER_S, clocks.steady_ns() - NS_PER_S)
    manager.stop()


def test_phase3_snapshot_reuses_freeze_buffers(tmp_path: Path) -> None:
    m, _ = build_scenario()
    manager = SnapshotManager(m, _repo(tmp_path))
    manager.snapshot_now()
    spare = manager._spare_buffers
    assert spare is not None and spare.arrays
    held = {name: a.ctypes.data for name, a in spare.arrays.items()}
    manager.snapshot_now()
    assert {name: a.ctypes.data for name, a in manager._spare_buffers.arrays.items()} == held
    manager.stop()
    assert manager._spare_buffers is None
