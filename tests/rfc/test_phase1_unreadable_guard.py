"""RFC Phase 1 tests 3-4: an unreadable memory replica is never an eviction choice, on any path."""
from __future__ import annotations

import numpy as np
import pytest

from mooncake_columnar import MasterService, ReplicateConfig
from mooncake_columnar.errors import ReplicaNotReady
from mooncake_columnar.kernels import eviction as ek
from mooncake_columnar.testing.builders import make_master

TTL_MS = 1_000
FOREVER_MS = 10 * 365 * 24 * 3600 * 1000


def promoted(clocks, **cfg):
    """A master whose segments came back with invalid endpoints (as after standby promotion)."""
    src = make_master(clocks, default_kv_lease_ttl_ms=TTL_MS, **cfg)
    for i in range(6):
        src.put_start(f"k{i}", 64, client_id="client0",
                      config=ReplicateConfig(group_id="G" if i < 2 else "", tenant_id="t" if i % 2 else "default"))
        src.put_end(f"k{i}", client_id="client0", tenant_id="t" if i % 2 else "default")
    m = MasterService.from_state(src.export_state(), config=src.config, clocks=clocks, segments_readable=False)
    m.liveness.touch("client0", 2**62)  # the client stays alive: only readability is under test
    clocks.advance(ms=FOREVER_MS)       # every lease is long expired
    return m


def test_phase1_unremounted_replica_is_unreadable(clocks):
    m = promoted(clocks)
    with pytest.raises(ReplicaNotReady):
        m.get_replica_list("k2")


def test_phase1_expired_lease_does_not_make_unreadable_replica_evictable(clocks):
    m = promoted(clocks)
    report = m.evict(target=1.0)
    assert report.base == 0 and report.evicted_objects == 0 and m.object_count() == 6
    m.eviction_armed = True
    assert m.tick().evicted_objects == 0 and m.object_count() == 6


def test_phase1_census_counts_skipped_unreadable_replicas(clocks):
    m = promoted(clocks)
    o = m.objects
    codes, counts, skipped = ek.census(clocks.steady_ns(), o.high_water, o.tenant, -1, o.flags,
                                       o.lease_deadline_ns, m.store.soft_pins.parts(), o.replica_status,
                                       o.replica_kind, o.replica_segment, o.replica_refcnt,
                                       m.segments.readable, o.replica_more)
    assert (codes != ek.NOT_IN_BASE).sum() == 0 and counts.sum() == o.high_water and skipped == 6
    m.evict(target=1.0)
    assert m.metrics.get("eviction_skipped_unreadable_replicas") == 6


def test_phase1_remaining_descriptor_prediction_skips_unreadable(clocks):
    plan = promoted(clocks).eviction_plan(1.0)
    assert plan.rows.size == 0 and plan.removed.sum() == 0


def test_phase1_group_eviction_skips_unreadable_members(clocks):
    m = promoted(clocks)
    o = m.objects
    group_rows = np.sort(m.store.group_of.held()[0])
    taken = np.zeros(o.high_water, np.uint8)
    n, _ = ek.plan(group_rows, 10, 2**62, clocks.steady_ns(), True, taken, o.flags, o.lease_deadline_ns,
                   m.store.soft_pins.parts(), m.store.group_of.links(), o.size_bytes, o.replica_status, o.replica_kind,
                   o.replica_segment, o.replica_refcnt, m.segments.readable, o.replica_more)
    assert n == 0


def test_phase1_tenant_quota_eviction_skips_unreadable(clocks):
    m = promoted(clocks, enable_multi_tenants=True, tenant_quota_bytes={"default": 3 * 64, "t": 3 * 64})
    codes = m.batch_put_start(["new"], [64], client_id="client0", config=ReplicateConfig(tenant_id="t")).codes
    assert codes[0] != 0 and m.object_count() == 6  # nothing of tenant t could be evicted


def test_phase1_offload_source_selection_skips_unreadable(clocks):
    m = promoted(clocks, enable_offload=True, offload_on_evict=True)
    report = m.evict(target=1.0)
    assert report.offloads_queued == 0 and len(m.offloads) == 0
