"""RFC Phase 1 remount recovery: one recovery lease per remount, only after everything succeeded."""
from __future__ import annotations

import pytest

from mooncake_columnar import NEVER_LEASED, NO_DEADLINE, PingStatus, ReplicateConfig, SoftPinAction
from mooncake_columnar.errors import InvalidParams, MooncakeError, ObjectHasLease, ReplicaNotReady
from mooncake_columnar.ha.standby import promoted_master
from mooncake_columnar.policies.recovery import RecoveryFault
from mooncake_columnar.testing.builders import MB, make_master

MS = 1_000_000
LEASE_MS, SOFT_MS = 10_000, 1_800_000


def seg_dict(i, **over):
    d = dict(name=f"seg{i}", endpoint=f"10.0.0.{i}:1234", client=f"client{i}", base=(i + 1) << 32, size=64 * MB)
    d.update(over)
    return d


def promoted(clocks, *, segments=2, objects=(("a", 1, {}), ), **cfg):
    """Primary with objects, then a standby-style promotion: deadlines dropped, segments unreadable."""
    src = make_master(clocks, segments=segments, default_kv_lease_ttl_ms=LEASE_MS, **cfg)
    for key, replicas, extra in objects:
        src.put_start(key, 4096, client_id="client0", config=ReplicateConfig(replica_num=replicas, **extra))
        src.put_end(key, client_id="client0")
        src.get_replica_list(key)  # a live lease on the primary: must NOT survive promotion
    m = promoted_master(src, config=src.config, clocks=clocks)
    for i in range(segments):
        m.liveness.touch(f"client{i}", 2**62)  # clients stay alive: readability is what is tested
    return m


def test_phase1_promoted_object_unreadable_until_remount(clocks):
    m = promoted(clocks)
    assert m.object_info("a").lease_deadline_ns == NEVER_LEASED
    assert m.ping("client0") == PingStatus.NEED_REMOUNT
    with pytest.raises(ReplicaNotReady):
        m.get_replica_list("a")
    m.remount_segments("client0", [seg_dict(0)])
    assert m.get_replica_list("a")[0].segment == "seg0"
    assert m.ping("client0") == PingStatus.OK


def test_phase1_remount_grants_one_recovery_lease_to_all_associated_objects(clocks):
    m = promoted(clocks, segments=1, objects=[(f"k{i}", 1, {}) for i in range(20)])
    clocks.advance(ms=123)
    report = m.remount_segments("client0", [seg_dict(0)])
    deadlines = set(m.to_arrow().column("lease_deadline_ns").to_pylist())
    assert report.matched_objects == 20 and deadlines == {clocks.steady_ns() + LEASE_MS * MS}
    assert report.recovery_deadline_ns == clocks.steady_ns() + LEASE_MS * MS
    assert report.visible_ttl_ms == pytest.approx(LEASE_MS)  # ManualClocks: no time passes
    with pytest.raises(ObjectHasLease):
        m.remove("k3")


def test_phase1_object_with_another_readable_replica_is_still_refreshed_and_later_remount_extends(clocks):
    m = promoted(clocks, objects=[("two", 2, {})])
    m.remount_segments("client1", [seg_dict(1)])
    first = m.object_info("two").lease_deadline_ns
    clocks.advance(ms=500)
    report = m.remount_segments("client0", [seg_dict(0)])  # seg1 replica was already readable
    assert report.matched_objects == 1
    assert m.object_info("two").lease_deadline_ns == first + 500 * MS  # a later remount extends it


def test_phase1_soft_pin_enabled_objects_get_the_full_soft_pin_ttl(clocks):
    m = promoted(clocks, objects=[("pinned", 1, {"soft_pin_action": SoftPinAction.ENABLE}), ("plain", 1, {})])
    m.remount_segments("client0", [seg_dict(0)])
    assert m.object_info("pinned").soft_pin_deadline_ns == clocks.steady_ns() + SOFT_MS * MS
    assert m.object_info("pinned").soft_pin_enabled
    assert m.object_info("plain").soft_pin_deadline_ns == NO_DEADLINE


def test_phase1_hard_pinned_objects_remain_hard_pinned(clocks):
    m = promoted(clocks, objects=[("h", 1, {"hard_pin": True})])
    m.remount_segments("client0", [seg_dict(0)])
    assert m.object_info("h").hard_pinned


@pytest.mark.parametrize("step", ["locate", "rebuild_allocators", "replace_buffers", "verify", "assign"])
def test_phase1_failed_remount_publishes_nothing_and_can_be_retried(clocks, step):
    m = promoted(clocks, objects=[("a", 1, {})])
    before = m.segments.info[0], int(m.segments.extents.count[0]), int(m.segments.used[0])

    def fail(name):
        if name == step:
            raise RecoveryFault(name)
    m.remount_fault = fail
    with pytest.raises(RecoveryFault):
        m.remount_segments("client0", [seg_dict(0, base=12345 << 20)])
    assert m.object_info("a").lease_deadline_ns == NEVER_LEASED          # no lease granted
    assert not m.segments.readable[0]                                     # invalid endpoint kept
    assert (m.segments.info[0], int(m.segments.extents.count[0]), int(m.segments.used[0])) == before
    assert m.ping("client0") == PingStatus.NEED_REMOUNT
    assert m.metrics.get("remount_failures") == 1
    m.remount_fault = None
    m.remount_segments("client0", [seg_dict(0, base=12345 << 20)])       # retry succeeds
    offset = int(m.objects.replica_offset[m.objects.live_rows()[0], 0])
    assert m.get_replica_list("a")[0].address == (12345 << 20) + offset  # the client's new base


def test_phase1_multi_segment_remount_publishes_all_or_none_and_counts_each_object_once(clocks):
    m = promoted(clocks, objects=[("two", 2, {})])
    m.segments.info[1] = m.segments.info[1].__class__(**{**m.segments.info[1].__dict__, "client": "client0"})
    calls = []

    def fail_on_verify(name):
        calls.append(name)
        if name == "verify":
            raise RecoveryFault(name)
    m.remount_fault = fail_on_verify
    with pytest.raises(RecoveryFault):
        m.remount_segments("client0", [seg_dict(0), seg_dict(1, client="client0")])
    assert not m.segments.readable[0] and not m.segments.readable[1]
    m.remount_fault = None
    report = m.remount_segments("client0", [seg_dict(0), seg_dict(1, client="client0")])
    assert report.segments == ("seg0", "seg1") and report.matched_objects == 1  # counted once


def test_phase1_overlapping_extents_fail_the_remount(clocks):
    m = promoted(clocks, segments=1, objects=[("a", 1, {}), ("b", 1, {})])
    rows = m.objects.live_rows()
    m.objects.replica_offset[rows[1], 0] = m.objects.replica_offset[rows[0], 0]  # corrupt: overlap
    with pytest.raises(ValueError, match="overlap"):
        m.remount_segments("client0", [seg_dict(0)])
    assert not m.segments.readable[0] and m.object_info("a").lease_deadline_ns == NEVER_LEASED


def test_phase1_unset_recovery_ttl_falls_back_and_explicit_value_is_honoured(clocks):
    m = promoted(clocks)
    assert m.remount_segments("client0", [seg_dict(0)]).effective_recovery_ttl_ms == LEASE_MS
    m2 = promoted(clocks, recovery_kv_lease_ttl_ms=30_000)
    report = m2.remount_segments("client0", [seg_dict(0)])
    assert report.effective_recovery_ttl_ms == 30_000
    assert m2.object_info("a").lease_deadline_ns == clocks.steady_ns() + 30_000 * MS


def test_phase1_recovery_leases_are_steady_clock_deadlines(clocks):
    m = promoted(clocks)
    clocks.jump_system(s=-7200)
    m.remount_segments("client0", [seg_dict(0)])
    assert m.object_info("a").lease_deadline_ns == clocks.steady_ns() + LEASE_MS * MS


@pytest.mark.parametrize("bad,match", [
    (dict(name="nope", endpoint="10.9.9.9:1"), None),  # unknown name and endpoint: a plain new mount
    (dict(name="nope"), "endpoint of standby segment"),  # a standby segment's endpoint under another name
    (dict(endpoint="10.9.9.9:1"), "standby registry"),
    (dict(size=32 * MB), "standby registry"),
])
def test_remount_validated_against_standby_registry(clocks, bad, match):
    m = promoted(clocks)
    if match is None:
        assert m.remount_segments("client0", [seg_dict(0, **bad)]).newly_mounted == 1
        return
    with pytest.raises(InvalidParams, match=match):
        m.remount_segments("client0", [seg_dict(0, **bad)])
    assert not m.segments.readable[0]


def test_remount_rejects_segment_of_another_client(clocks):
    m = make_master(clocks, segments=2)
    with pytest.raises(InvalidParams):
        m.remount_segments("client1", [seg_dict(0)])
    with pytest.raises(InvalidParams):
        m.remount_segments("client0", [seg_dict(0, base=999 << 32)])  # mismatched existing identity


def test_promoted_master_does_not_allocate_on_unremounted_segments(clocks):
    m = promoted(clocks)
    m.mount_segment("fresh", endpoint="10.1.1.1:1", client_id="client9", base=1 << 40, size=64 * MB)
    m.put_start("new", 4096, client_id="client9")
    assert [r.segment for r in m.object_info("new").replicas] == ["fresh"]
    m.unmount_segment("fresh")
    with pytest.raises(MooncakeError):   # only unremounted segments left: no space to allocate
        m.put_start("other", 4096, client_id="client9")
    m.remount_segments("client0", [seg_dict(0)])
    m.put_start("other", 4096, client_id="client9")
    assert [r.segment for r in m.object_info("other").replicas] == ["seg0"]


def test_phase1_remount_benchmark_reports_refresh_and_visible_window():
    from mooncake_columnar.tools.bench import bench_remount
    r = bench_remount(20_000, segments=1, cold_cache=False)
    assert r["matched_objects"] == 20_000 and r["recovery_ttl_ms"] == LEASE_MS
    assert 0 < r["visible_ttl_ms"] <= LEASE_MS and r["refresh_seconds"] > 0 and r["baseline_copy_seconds"] > 0


def test_remount_rebuilds_allocator_when_replicas_are_not_in_offset_order(clocks):
    m = promoted(clocks, segments=1, objects=[("a", 1, {}), ("b", 1, {}), ("c", 1, {})])
    o = m.objects
    r0, r1 = m.objects.live_rows()[:2]
    o.replica_offset[r0, 0], o.replica_offset[r1, 0] = o.replica_offset[r1, 0], o.replica_offset[r0, 0]
    m.remount_segments("client0", [seg_dict(0)])
    assert m.segment_usage()["seg0"] == (3 * 4096, 64 * MB)
    m.put_start("d", 4096, client_id="client0")  # lands after the three, no overlap
    offsets = sorted(int(x) for x in o.replica_offset[o.live_rows(), 0])
    assert offsets == [0, 4096, 8192, 12288]
