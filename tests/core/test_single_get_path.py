"""The single-key get path (master.get_replica_list: one kernel call that also returns the one
readable replica's slot values, else views.readable_descriptors) gives exactly the descriptors
of the general per-row builder, with readable_only=True, and grants the same lease."""
from __future__ import annotations

import numpy as np

from mooncake_columnar import ManualClocks, MasterConfig, MasterService, ReplicateConfig
from mooncake_columnar.errors import ObjectNotFound, ReplicaNotReady
from mooncake_columnar.messages import ReplicaDescriptor
from mooncake_columnar.policies import views
from mooncake_columnar.testing.builders import MB

TTL_MS = 1_000


def reference(m: MasterService, key: str) -> list[ReplicaDescriptor]:
    """The general builder (views._row_descriptors) over the object's row chain."""
    row = int(m.store.lookup(np.array([0, len(key)]), np.frombuffer(key.encode(), np.uint8), "default")[0])
    out: list[ReplicaDescriptor] = []
    more = m.objects.replica_more
    while row >= 0:
        views._row_descriptors(m.store, row, True, out)
        row = int(more[row]) if row < more.size else -1
    return out


def check(m: MasterService, key: str) -> list[ReplicaDescriptor]:
    got = m.get_replica_list(key)
    assert got == reference(m, key)
    assert [type(r.kind) for r in got] == [type(r.kind) for r in reference(m, key)]
    assert all(type(v) is type(w) for r, s in zip(got, reference(m, key)) for v, w in zip(r, s))
    return got


def test_single_get_matches_the_general_builder_for_1_2_and_wide_objects_and_after_unmounts(clocks):
    m = MasterService(MasterConfig(max_replica_num=12, default_kv_lease_ttl_ms=TTL_MS), clocks=clocks)
    for i in range(12):
        m.mount_segment(f"seg{i}", endpoint=f"10.0.{i}.1:1", client_id="c0", base=(i + 1) << 32, size=16 * MB)
    for n in (1, 2, 3, 4, 5, 12):
        m.put_start(f"k{n}", 4096 * n, client_id="c0", config=ReplicateConfig(replica_num=n))
        m.put_end(f"k{n}", client_id="c0")
    assert [len(check(m, f"k{n}")) for n in (1, 2, 3, 4, 5, 12)] == [1, 2, 3, 4, 5, 12]
    before = m.objects.lease_deadline_ns.copy()
    clocks.advance(ms=10)
    check(m, "k1")
    row = int(m.store.lookup(np.array([0, 2]), np.frombuffer(b"k1", np.uint8), "default")[0])
    assert m.objects.lease_deadline_ns[row] > before[row]
    for i in range(11):  # down to one readable replica, in a later slot or a continuation row
        m.unmount_segment(f"seg{i}")
        for n in (1, 2, 3, 4, 5, 12):
            try:
                check(m, f"k{n}")
            except (ObjectNotFound, ReplicaNotReady):  # no readable replica left
                assert reference(m, f"k{n}") == []
    m.verify()


def _offloaded_master(clocks: ManualClocks) -> MasterService:
    """Four objects on one segment; eviction offloaded k0's replica to its owner's disk, so k0
    holds a MEMORY replica and a LOCAL_DISK one (in a continuation row)."""
    m = MasterService(MasterConfig(default_kv_lease_ttl_ms=TTL_MS, enable_offload=True, offload_on_evict=True),
                      clocks=clocks)
    m.mount_segment("seg0", endpoint="10.0.0.1:1", client_id="c0", base=1 << 32, size=16 * MB)
    keys = [f"k{i}" for i in range(4)]
    m.batch_put_start(keys, np.full(4, 1024), client_id="c0")
    m.batch_put_end(keys, client_id="c0")
    clocks.advance(ms=TTL_MS)
    assert m.evict(target=0.25).offloads_queued == 1
    m.complete_offload("k0", client_id="c0")
    return m


def test_single_get_of_two_readable_replicas_a_memory_one_and_a_local_disk_one(clocks: ManualClocks):
    m = _offloaded_master(clocks)
    assert sorted(r.kind.name for r in check(m, "k0")) == ["LOCAL_DISK", "MEMORY"]


def test_single_get_of_a_local_disk_replica_in_a_continuation_row(clocks: ManualClocks):
    m = _offloaded_master(clocks)
    assert sorted(r.kind.name for r in m.object_info("k0").replicas) == ["LOCAL_DISK", "MEMORY"]
    m.evict(target=0.25)  # the memory replica goes, the disk copy (in the continuation row) serves reads
    assert [r.kind.name for r in check(m, "k0")] == ["LOCAL_DISK"]
    m.verify()


def test_single_get_keeps_a_replica_id_past_2_63_exact_and_every_field_a_plain_python_value(clocks):
    m = MasterService(MasterConfig(default_kv_lease_ttl_ms=TTL_MS), clocks=clocks)
    m.mount_segment("seg0", endpoint="10.0.0.1:1", client_id="c0", base=1 << 32, size=16 * MB)
    m.put_start("a", 10, client_id="c0")
    m.put_end("a", client_id="c0")
    m.objects.replica_id[:] = (1 << 64) - 5  # the column is uint64: no int64 wrap on the way out
    (rep,) = check(m, "a")
    assert rep.replica_id == (1 << 64) - 5
