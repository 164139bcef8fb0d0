"""Upstream master_service_test cases re-expressed with ManualClocks (no sleeps)."""
from __future__ import annotations

import pytest

from mooncake_columnar import ErrorCode, PingStatus, ReplicateConfig, SoftPinAction
from mooncake_columnar.errors import (IllegalClient, InvalidParams, InvalidWrite, NoAvailableHandle,
                                      ObjectAlreadyExists, ObjectHasLease, ObjectNotFound, ReplicaNotReady,
                                      SegmentAlreadyExists)
from mooncake_columnar.testing.builders import MB, make_master


def put(m, key, size=1024, client="client0", **cfg):
    m.put_start(key, size, client_id=client, config=ReplicateConfig(**cfg))
    m.put_end(key, client_id=client, tenant_id=cfg.get("tenant_id", "default"))


def test_put_get_flow_returns_readable_descriptor(master):
    reps = master.put_start("k", 4096, client_id="client0")
    assert len(reps) == 1 and reps[0].status.name == "PROCESSING" and not reps[0].readable
    with pytest.raises(ReplicaNotReady):
        master.get_replica_list("k")
    master.put_end("k", client_id="client0")
    (r,) = master.get_replica_list("k")
    assert r.readable and r.segment == "seg0" and r.size == 4096 and r.address >= 1 << 32


def test_remove_leased_object(master, clocks):
    put(master, "k")
    master.remove("k")  # put_end leaves the lease at `now`: already expired
    put(master, "k")
    assert master.exist_key("k")
    with pytest.raises(ObjectHasLease):
        master.remove("k")
    clocks.advance(ms=30)
    master.get_replica_list("k")  # a repeated read extends the lease
    clocks.advance(ms=30)
    with pytest.raises(ObjectHasLease):
        master.remove("k")
    clocks.advance(ms=21)
    master.remove("k")
    with pytest.raises(ObjectNotFound):
        master.get_replica_list("k")


def test_remove_all_leased_object(master, clocks):
    for i in range(10):
        put(master, f"k{i}")
    for i in range(5):
        assert master.exist_key(f"k{i}")
    assert master.remove_all() == 5
    clocks.advance(ms=50)
    assert master.remove_all() == 5
    assert master.object_count() == 0


def test_force_remove_leased_object(master):
    for key in ("a", "b", "c"):
        put(master, key)
        master.get_replica_list(key)
    master.remove("a", force=True)
    assert master.remove_by_regex("^b$", force=True) == 1
    assert master.remove_all(force=True) == 1
    assert master.object_count() == 0


def test_remove_soft_pin_object(master):
    put(master, "k", soft_pin_action=SoftPinAction.ENABLE)
    assert master.object_info("k").soft_pin_enabled
    master.remove("k")
    put(master, "k2", soft_pin_action=SoftPinAction.ENABLE)
    assert master.remove_all() == 1


def test_soft_pin_expires_and_get_does_not_reactivate(clocks):
    m = make_master(clocks, default_kv_lease_ttl_ms=50, default_kv_soft_pin_ttl_ms=1_000)
    put(m, "k", soft_pin_action=SoftPinAction.ENABLE)
    info = m.object_info("k")
    assert info.soft_pin_enabled and info.soft_pin_deadline_ns == clocks.steady_ns() + 1_000 * 1_000_000
    clocks.advance(ms=1_001)
    m.get_replica_list("k")
    assert m.exist_key("k")
    after = m.object_info("k")
    assert after.soft_pin_deadline_ns == info.soft_pin_deadline_ns  # reads never re-pin
    assert after.soft_pin_deadline_ns < clocks.steady_ns()          # interval expired...
    assert after.soft_pin_enabled                                    # ...enabled bit stays


@pytest.mark.parametrize("cfg", [
    dict(soft_pin_action=SoftPinAction.PRESERVE, soft_pin_ttl_ms=10),
    dict(soft_pin_action=SoftPinAction.DISABLE, soft_pin_ttl_ms=10),
    dict(soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=86_400_001),
    dict(soft_pin_action=7),
])
def test_soft_pin_request_validation(master, cfg):
    before = master.to_arrow()
    with pytest.raises(InvalidParams):
        master.put_start("k", 10, client_id="client0", config=ReplicateConfig(**cfg))
    assert master.to_arrow().equals(before)


def test_soft_pin_enable_with_zero_ttl_leaves_object_unpinned(master):
    put(master, "k", soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=0)
    assert not master.object_info("k").soft_pin_enabled


def test_soft_pin_deadline_saturates():
    from mooncake_columnar import ManualClocks
    clocks = ManualClocks(steady_ns=2**63 - 1 - 10**9)
    m = make_master(clocks, max_kv_soft_pin_ttl_ms=10**12)
    put(m, "k", soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=10**12)
    assert m.object_info("k").soft_pin_deadline_ns == 2**63 - 1


def test_repeated_put_end_does_not_refresh_soft_pin(master, clocks):
    put(master, "k", soft_pin_action=SoftPinAction.ENABLE)
    d = master.object_info("k").soft_pin_deadline_ns
    clocks.advance(ms=100)
    master.put_end("k", client_id="client0")
    assert master.object_info("k").soft_pin_deadline_ns == d


def test_hard_pin_default_is_false(master):
    put(master, "k")
    assert not master.object_info("k").hard_pinned
    put(master, "h", hard_pin=True)
    assert master.object_info("h").hard_pinned
    master.remove("h")  # hard pin never blocks Remove


def test_cleanup_stale_handles(clocks):
    m = make_master(clocks, segments=1)
    put(m, "k")
    m.unmount_segment("seg0")
    with pytest.raises(ObjectNotFound):
        m.get_replica_list("k")
    m.mount_segment("seg0", endpoint="10.0.0.0:1234", client_id="client0", base=1 << 32, size=64 * MB)
    put(m, "k2")
    m.unmount_segment("seg0")
    m.unmount_segment("seg0")  # idempotent
    with pytest.raises(ObjectNotFound):
        m.remove("k2")
    assert m.object_count() == 0


def test_readable_after_partial_unmount_with_replication(clocks):
    m = make_master(clocks, segments=2)
    put(m, "k", replica_num=2)
    assert {r.segment for r in m.get_replica_list("k")} == {"seg0", "seg1"}
    m.unmount_segment("seg0")
    assert [r.segment for r in m.get_replica_list("k")] == ["seg1"]


@pytest.mark.parametrize("key,size,cfg", [
    ("", 10, {}), ("k", 0, {}), ("k", -5, {}), ("k", 10, {"replica_num": 0}),
])
def test_put_start_invalid_params(master, key, size, cfg):
    with pytest.raises(InvalidParams):
        master.put_start(key, size, client_id="client0", config=ReplicateConfig(**cfg))
    assert master.object_count() == 0


def test_put_start_expiring_discard_and_release(clocks):
    m = make_master(clocks, seg_size=1024, put_start_discard_timeout_s=30, put_start_release_timeout_s=600)
    m.put_start("k", 1024, client_id="client0")
    clocks.advance(s=10)
    with pytest.raises(ObjectAlreadyExists):
        m.put_start("k", 1024, client_id="client0")
    clocks.advance(s=21)
    with pytest.raises(NoAvailableHandle):  # the abandoned replica still holds the space
        m.put_start("k", 1024, client_id="client0")
    assert m.object_count() == 0            # ...but the abandoned put itself was discarded
    with pytest.raises(NoAvailableHandle):
        m.put_start("other", 1024, client_id="client0")
    clocks.advance(s=570)
    m.put_start("k", 1024, client_id="client0")  # released after put_start + 600 s
    m.put_end("k", client_id="client0")


def test_put_start_discard_uses_system_clock(clocks):
    """put_start_time stays system clock (RFC non-goal 7): a wall-clock jump ages it."""
    m = make_master(clocks)
    m.put_start("k", 10, client_id="client0")
    clocks.jump_system(s=31)
    m.put_start("k", 10, client_id="client0")


def test_put_end_and_revoke_errors(master):
    with pytest.raises(ObjectNotFound):
        master.put_end("nope", client_id="client0")
    master.put_start("k", 10, client_id="client0")
    with pytest.raises(IllegalClient):
        master.put_end("k", client_id="intruder")
    with pytest.raises(IllegalClient):
        master.put_revoke("k", client_id="intruder")
    master.put_revoke("k", client_id="client0")
    assert master.object_count() == 0
    put(master, "k")
    master.put_end("k", client_id="client0")  # idempotent retry
    with pytest.raises(InvalidWrite):
        master.put_revoke("k", client_id="client0")
    assert master.segment_usage()["seg0"][0] == 1024


def test_grouped_lease_refresh_near_expiry_protects_current_members(clocks):
    m = make_master(clocks, default_kv_lease_ttl_ms=100)
    for k in ("g-a", "g-b", "g-c"):
        put(m, k, group_id="grp")
    m.get_replica_list("g-a")  # new members: the whole group is refreshed
    for k in ("g-b", "g-c"):
        with pytest.raises(ObjectHasLease):
            m.remove(k)
    lease = m.object_info("g-b").lease_deadline_ns
    clocks.advance(ms=30)  # more than ttl/2 left: a read does not extend the group
    m.get_replica_list("g-a")
    assert m.object_info("g-b").lease_deadline_ns == lease
    clocks.advance(ms=30)  # now less than ttl/2 left: one read refreshes every member, one `now`
    m.get_replica_list("g-a")
    deadlines = {m.object_info(k).lease_deadline_ns for k in ("g-a", "g-b", "g-c")}
    assert deadlines == {clocks.steady_ns() + 100 * 1_000_000}
    m.remove("g-c", force=True)
    clocks.advance(ms=100)
    m.remove("g-b")


def test_tenant_isolation_of_the_same_user_key(master):
    put(master, "k", size=100, tenant_id="default")
    put(master, "k", size=200, tenant_id="tenant-a")
    assert master.get_replica_list("k")[0].size == 100
    assert master.get_replica_list("k", "tenant-a")[0].size == 200
    master.remove("k", tenant_id="tenant-a", force=True)
    assert master.exist_key("k") and not master.exist_key("k", "tenant-a")
    assert master.remove_all(tenant_id="tenant-b") == 0


def test_segment_mount_semantics(master):
    master.mount_segment("seg0", endpoint="10.0.0.0:1234", client_id="client0", base=1 << 32, size=64 * MB)
    with pytest.raises(SegmentAlreadyExists):
        master.mount_segment("seg0", endpoint="other", client_id="client0", base=1 << 32, size=64 * MB)
    with pytest.raises(InvalidParams):
        master.mount_segment("segX", endpoint="e", client_id="c", base=0, size=10)


def test_ping_need_remount_until_remount_and_client_expiry(clocks):
    m = make_master(clocks, client_live_ttl_s=10)
    put(m, "k")
    assert m.ping("client0") == PingStatus.NEED_REMOUNT
    seg = dict(name="seg0", endpoint="10.0.0.0:1234", client="client0", base=1 << 32, size=64 * MB)
    assert m.remount_segments("client0", [seg]).newly_mounted == 0   # identical: idempotent
    assert m.ping("client0") == PingStatus.OK
    with pytest.raises(InvalidParams):
        m.remount_segments("client0", [dict(seg, size=1)])
    clocks.advance(s=9)
    m.tick()
    assert m.exist_key("k")
    clocks.advance(s=2)
    assert m.expire_clients() == ["client0"]
    assert m.segment_usage() == {}
    assert not m.exist_key("k")
    assert m.ping("client0") == PingStatus.NEED_REMOUNT


def test_batch_codes_cover_every_outcome(master, clocks):
    put(master, "done")
    master.put_start("busy", 10, client_id="client0")
    res = master.batch_put_start(["new", "done", "busy", "", "new"], [5, 5, 5, 5, 5], client_id="client0")
    assert list(res.codes) == [0, ErrorCode.OBJECT_ALREADY_EXISTS, ErrorCode.OBJECT_ALREADY_EXISTS,
                               ErrorCode.INVALID_PARAMS, ErrorCode.OBJECT_ALREADY_EXISTS]
    assert res.replicas.column("key_index").to_pylist() == [0]
    ends = master.batch_put_end(["new", "missing"], client_id="client0").codes
    assert list(ends) == [0, ErrorCode.OBJECT_NOT_FOUND]
    gets = master.batch_get_replica_list(["new", "busy", "missing"])
    assert list(gets.codes) == [0, ErrorCode.REPLICA_IS_NOT_READY, ErrorCode.OBJECT_NOT_FOUND]
    assert list(master.batch_exist_key(["new", "busy", "missing"])) == [True, False, False]
    rem = master.batch_remove(["new", "busy", "missing", "done"])
    assert list(rem) == [ErrorCode.OBJECT_HAS_LEASE, ErrorCode.REPLICA_IS_NOT_READY,
                         ErrorCode.OBJECT_NOT_FOUND, 0]


def test_rows_and_key_bytes_are_recycled(master, clocks):
    keys = [f"key-{i:05d}" for i in range(2000)]
    for _ in range(5):
        res = master.batch_put_start(keys, [16] * len(keys), client_id="client0")
        assert (res.codes == 0).all()
        master.batch_put_end(keys, client_id="client0")
        assert master.remove_all() == len(keys)
    assert master.objects.high_water == len(keys)
    assert master.segment_usage()["seg0"][0] == 0
