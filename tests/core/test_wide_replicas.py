"""Wide objects (more replicas than the replica slot columns are wide) keep their other replicas
in continuation rows: one put with replica_num=64 costs its own bytes, and every path (reads,
eviction, removal, unmount, offload, journal, standby apply, snapshots, promotion, the self-check)
sees all 64 replicas."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mooncake_columnar import ManualClocks, MasterConfig, MasterService, ReplicateConfig
from mooncake_columnar.errors import EngineInvariantError, ObjectAlreadyExists
from mooncake_columnar.ha.stores import FileOpLogStore
from mooncake_columnar.ha.standby import StandbyService
from mooncake_columnar.ha.writer import OpLogWriter
from mooncake_columnar.snapshots.manager import SnapshotManager, restore_master
from mooncake_columnar.snapshots.repository import SnapshotRepository
from mooncake_columnar.testing.builders import MB

WIDE = 64
TTL_MS = 1_000
SEG_SIZE = 16 * MB


def wide_master(clocks: ManualClocks, *, journal: OpLogWriter | None = None, **cfg) -> MasterService:
    """64 segments of one client (so a put can place 64 replicas), max_replica_num=64."""
    m = MasterService(MasterConfig(max_replica_num=WIDE, default_kv_lease_ttl_ms=TTL_MS, **cfg), clocks=clocks,
                      journal=journal)
    for i in range(WIDE):
        m.mount_segment(f"seg{i}", endpoint=f"10.0.{i}.1:1", client_id="c0", base=(i + 1) << 32, size=SEG_SIZE)
    return m


def put(m: MasterService, key: str, replica_num: int = WIDE, size: int = 4096) -> None:
    m.put_start(key, size, client_id="c0", config=ReplicateConfig(replica_num=replica_num))
    m.put_end(key, client_id="c0")


def narrow_objects(m: MasterService, n: int) -> None:
    keys = [f"k{i}" for i in range(n)]
    m.batch_put_start(keys, np.full(n, 1024), client_id="c0")
    m.batch_put_end(keys, client_id="c0")


def used_bytes(m: MasterService) -> int:
    return sum(used for used, _ in m.segment_usage().values())


def segments_of(m: MasterService, key: str) -> list[str]:
    return sorted(r.segment for r in m.object_info(key).replicas)


def all_segments() -> list[str]:
    return sorted(f"seg{i}" for i in range(WIDE))


def test_one_64_replica_put_among_10k_objects_grows_bytes_per_object_by_far_less_than_2x(clocks):
    m = wide_master(clocks)
    narrow_objects(m, 10_000)
    before = m.objects.resident_bytes() / m.object_count()
    put(m, "wide")
    after = m.objects.resident_bytes() / m.object_count()
    # 63 continuation rows (~5 KB) plus the 4-byte chain link per row, allocated with the first
    # chain: about +6% at 10k objects (widening every row to 64 slots was ~20x)
    assert after < 1.1 * before
    assert m.objects.slots == 1   # the hot slot columns stayed one replica wide
    assert segments_of(m, "wide") == all_segments()
    m.verify()


def test_a_failed_wide_put_start_allocates_and_widens_nothing(clocks):
    m = wide_master(clocks)
    put(m, "a", replica_num=1)
    used = used_bytes(m)
    with pytest.raises(ObjectAlreadyExists):
        m.put_start("a", 4096, client_id="c0", config=ReplicateConfig(replica_num=WIDE))
    assert (used_bytes(m), m.object_count(), m.objects.cont_count, m.objects.slots) == (used, 1, 0, 1)
    m.verify()


def test_every_replica_of_a_wide_object_is_readable_by_single_and_batch_get(clocks):
    m = wide_master(clocks)
    narrow_objects(m, 10)
    put(m, "wide")
    single = m.get_replica_list("wide")
    assert sorted(r.segment for r in single) == all_segments()
    assert len({r.replica_id for r in single}) == WIDE
    table = m.batch_get_replica_list(["k0", "wide", "k1"]).replicas
    key_index = table.column("key_index").to_numpy()
    assert np.bincount(key_index).tolist() == [1, WIDE, 1]
    assert sorted(table.filter(key_index == 1).column("segment").to_pylist()) == all_segments()
    assert m.batch_exist_key(["wide"]).tolist() == [True]
    m.verify()


def test_wide_put_in_flight_is_not_readable_until_its_put_end_completes_every_replica(clocks):
    m = wide_master(clocks)
    descriptors = m.put_start("wide", 4096, client_id="c0", config=ReplicateConfig(replica_num=WIDE))
    assert len(descriptors) == WIDE and not m.exist_key("wide")
    m.put_end("wide", client_id="c0")
    assert all(r.status.name == "COMPLETE" for r in m.object_info("wide").replicas)
    m.verify()


@pytest.mark.parametrize("how", ["remove", "force_remove_all", "evict", "revoke", "discard_expired_put"])
def test_dropping_a_wide_object_frees_all_64_extents_and_its_continuation_rows(clocks, how):
    m = wide_master(clocks, put_start_discard_timeout_s=1, put_start_release_timeout_s=2)
    narrow_objects(m, 10)
    base_used = used_bytes(m)
    if how in ("revoke", "discard_expired_put"):
        m.put_start("wide", 4096, client_id="c0", config=ReplicateConfig(replica_num=WIDE))
    else:
        put(m, "wide")
    assert m.objects.cont_count > 0 and used_bytes(m) > base_used
    if how == "remove":
        clocks.advance(ms=TTL_MS)
        m.remove("wide")
    elif how == "force_remove_all":
        assert m.remove_all(force=True) == 11
        base_used = 0
    elif how == "evict":
        m.get_replica_list("k0")  # k0 keeps a fresh lease: only expired objects go
        clocks.advance(ms=TTL_MS // 2)
        m.get_replica_list("k0")
        clocks.advance(ms=TTL_MS // 2)
        report = m.evict(target=1.0)
        assert report.evicted_objects == 10 and m.object_count() == 1 and m.exist_key("k0")
        m.remove("k0", force=True)
        base_used = 0
    elif how == "revoke":
        m.put_revoke("wide", client_id="c0")
    else:
        clocks.advance(s=3)
        m.tick()
    assert not m.exist_key("wide")
    assert used_bytes(m) == base_used and m.objects.cont_count == 0
    m.verify()
    put(m, "again")  # the freed rows and extents are reusable
    assert segments_of(m, "again") == all_segments()
    m.verify()


def test_unmount_drops_only_that_segments_replica_of_a_wide_object(clocks):
    m = wide_master(clocks)
    put(m, "wide")
    m.unmount_segment("seg63")
    m.unmount_segment("seg0")
    assert segments_of(m, "wide") == sorted(s for s in all_segments() if s not in ("seg0", "seg63"))
    assert len(m.get_replica_list("wide")) == WIDE - 2
    m.verify()


def test_offload_adds_a_disk_replica_in_a_continuation_row_instead_of_widening_every_row(clocks):
    m = MasterService(MasterConfig(default_kv_lease_ttl_ms=TTL_MS, enable_offload=True, offload_on_evict=True),
                      clocks=clocks)
    m.mount_segment("seg0", endpoint="10.0.0.1:1", client_id="c0", base=1 << 32, size=SEG_SIZE)
    narrow_objects(m, 4)
    clocks.advance(ms=TTL_MS)
    assert m.evict(target=0.25).offloads_queued == 1
    m.complete_offload("k0", client_id="c0")
    assert m.objects.slots == 1 and m.objects.cont_count == 1
    assert sorted(r.kind.name for r in m.object_info("k0").replicas) == ["LOCAL_DISK", "MEMORY"]
    m.verify()
    m.evict(target=0.25)  # the memory replica goes, the disk copy (in the continuation row) serves reads
    (rep,) = m.get_replica_list("k0")
    assert rep.kind.name == "LOCAL_DISK"
    m.verify()


def test_wide_object_survives_a_v2_snapshot_round_trip_without_widening_the_restored_table(tmp_path: Path):
    clocks = ManualClocks()
    m = wide_master(clocks)
    narrow_objects(m, 100)
    put(m, "wide")
    m.batch_get_replica_list([f"k{i}" for i in range(100)] + ["wide"])  # leases live at restore time
    repo = SnapshotRepository(tmp_path)
    SnapshotManager(m, repo).snapshot_now()
    restored, stats = restore_master(repo, clocks=ManualClocks(system_ns=clocks.system_ns() + 10**6))
    assert stats.objects_restored == 101
    restored.verify()
    assert restored.objects.slots == 1 and restored.objects.cont_count == m.objects.cont_count
    assert segments_of(restored, "wide") == all_segments()
    assert [r.replica_id for r in restored.object_info("wide").replicas] == \
        [r.replica_id for r in m.object_info("wide").replicas]
    again = MasterService.from_state(restored.export_state(), config=restored.config, clocks=clocks)
    again.verify()
    assert segments_of(again, "wide") == all_segments()


def test_standby_applies_wide_put_end_and_eviction_then_promotes_with_every_replica(tmp_path: Path):
    clocks = ManualClocks()
    writer = OpLogWriter(FileOpLogStore(tmp_path), window=1 << 20, clocks=clocks)
    p = wide_master(clocks, journal=writer)
    narrow_objects(p, 10)
    put(p, "wide")
    put(p, "wide-evicted")
    clocks.advance(ms=TTL_MS)
    p.get_replica_list("wide")  # keeps its lease: eviction takes the others
    assert p.evict(target=1.0).evicted_objects == 11
    writer.flush()
    p.verify()
    assert not p.exist_key("wide-evicted") and p.objects.cont_count > 0
    sb = StandbyService(FileOpLogStore(tmp_path), clocks=clocks, sleep=lambda s: clocks.advance(s=s))
    sb.poll()
    sb.master.verify()
    assert sb.master.object_count() == 1 and segments_of(sb.master, "wide") == all_segments()
    promoted = sb.promote(timeout_s=1.0)
    promoted.verify()
    assert not promoted.exist_key("wide")  # unreadable until its client remounts
    promoted.ping("c0")
    report = promoted.remount_segments("c0", [dict(name=f"seg{i}", endpoint=f"10.0.{i}.1:1", client="c0",
                                                   base=(i + 1) << 32, size=SEG_SIZE) for i in range(WIDE)])
    assert report.matched_objects == 1
    assert sorted(r.segment for r in promoted.get_replica_list("wide")) == all_segments()
    promoted.verify()
    promoted.remove("wide", force=True)
    assert promoted.objects.cont_count == 0
    promoted.verify()


def _chain(m: MasterService) -> tuple[int, np.ndarray]:
    """The only object's row and its continuation rows in chain order."""
    (head,) = m.objects.live_rows()
    return int(head), m.objects.chains(np.array([head])).rows[1:]


@pytest.mark.parametrize("corrupt, check", [
    (lambda o, head, conts: o.replica_more.__setitem__(conts[-1], head), "replica_chain"),      # a cycle
    (lambda o, head, conts: o.continuation_owner.value.__setitem__(                            # orphaned
        o.continuation_owner.slots_of(conts[:1])[0], conts[0]), "replica_chain"),
    (lambda o, head, conts: o.size_bytes.__setitem__(conts[1], 1), "replica_chain"),            # wrong size
    (lambda o, head, conts: setattr(o, "cont_count", o.cont_count - 1), "replica_chain"),
    (lambda o, head, conts: o.replica_more.__setitem__(head, -1), "replica_chain"),             # cut loose
    (lambda o, head, conts: o._push_free(conts[:1]), "free_rows"),                              # also free
])
def test_self_check_names_a_broken_replica_chain(clocks, corrupt, check):
    m = wide_master(clocks)
    put(m, "wide")
    m.verify()
    head, conts = _chain(m)
    corrupt(m.objects, head, conts)
    with pytest.raises(EngineInvariantError) as e:
        m.verify()
    assert e.value.check == check


def test_journaled_eviction_larger_than_the_window_frees_every_replica_of_each_wide_object(tmp_path: Path):
    clocks = ManualClocks()
    writer = OpLogWriter(FileOpLogStore(tmp_path), window=8, clocks=clocks)
    writer.start()  # frees window space while the cycle waits for it
    try:
        m = wide_master(clocks, journal=writer, oplog_admission_timeout_ms=60_000)  # a loaded host flushes late
        narrow_objects(m, 5)
        for i in range(6):  # 6 wide objects of 64..59 replicas: PUT_END(remaining)/REMOVE spans windows
            put(m, f"wide{i}", replica_num=WIDE - i)
        clocks.advance(ms=TTL_MS)
        assert m.evict(target=1.0).evicted_objects == 11
        writer.flush()
        m.tick()  # finalizes removals the lock was busy for
    finally:
        writer.stop()
    assert m.object_count() == 0 and m.objects.cont_count == 0 and used_bytes(m) == 0
    m.verify()
