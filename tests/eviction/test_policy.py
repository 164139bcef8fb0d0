"""Eviction: upstream's deterministic scenarios, triggers, quota, offload, expired puts."""
from __future__ import annotations

import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from mooncake_columnar import MasterService, ReplicateConfig, SoftPinAction
from mooncake_columnar.errors import ErrorCode, NoAvailableHandle, ObjectNotFound, TenantQuotaExceeded
from mooncake_columnar.metrics import register
from mooncake_columnar.testing.builders import make_master

TTL_MS = 1_000


def aged(m, clocks, keys, **cfg):
    """Put keys, then read them one ms apart: leases expire in key order once time moves on."""
    for k in keys:
        m.put_start(k, 64, client_id="client0", config=ReplicateConfig(**cfg))
        m.put_end(k, client_id="client0", tenant_id=cfg.get("tenant_id", "default"))
    for k in keys:
        clocks.advance(ms=1)
        m.get_replica_list(k, cfg.get("tenant_id", "default"))


def survivors(m):
    return set(m.to_arrow().column("key").to_pylist())


def keys(prefix, n):
    return [f"{prefix}{i:04d}" for i in range(n)]


@pytest.fixture
def m(clocks):
    return make_master(clocks, default_kv_lease_ttl_ms=TTL_MS)


@pytest.mark.parametrize("n,target,lower,evicted", [(400, 0.05, 0.05, 20), (250, 0.10, 0.10, 25),
                                                     (200, 0.80, 0.80, 160)])
def test_evicts_exactly_the_oldest(m, clocks, n, target, lower, evicted):
    ks = keys("k", n)
    aged(m, clocks, ks)
    clocks.advance(ms=TTL_MS)
    report = m.evict(target=target, lower=lower)
    assert report.base == n and report.evicted_objects == evicted
    assert survivors(m) == set(ks[evicted:])


def test_soft_pinned_objects_are_fallback_candidates(m, clocks):
    plain, pinned = keys("p", 10), keys("s", 10)
    aged(m, clocks, plain)
    aged(m, clocks, pinned, soft_pin_action=SoftPinAction.ENABLE)
    clocks.advance(ms=TTL_MS)
    report = m.evict(target=0.80)
    assert report.evicted_objects == 16
    assert survivors(m) == set(pinned[6:])  # the 4 newest soft-pinned objects remain


def test_soft_pinned_objects_not_evicted_when_not_allowed(clocks):
    m = make_master(clocks, default_kv_lease_ttl_ms=TTL_MS, seg_size=17 * 64,
                    allow_evict_soft_pinned_objects=False)
    pinned = keys("s", 17)
    aged(m, clocks, pinned, soft_pin_action=SoftPinAction.ENABLE)
    clocks.advance(ms=TTL_MS)
    with pytest.raises(NoAvailableHandle):
        m.put_start("more", 64, client_id="client0")
    assert m.tick().evicted_objects == 0
    assert all(m.exist_key(k) for k in pinned)


def test_whole_group_is_evicted_together(m, clocks):
    group = keys("g", 3)
    aged(m, clocks, group, group_id="G")
    plain = keys("k", 7)
    aged(m, clocks, plain)
    clocks.advance(ms=TTL_MS)
    report = m.evict(target=0.10)
    assert report.evicted_objects == 3 and survivors(m) == set(plain)


def test_active_group_member_blocks_whole_group(m, clocks):
    group = keys("g", 3)
    aged(m, clocks, group, group_id="G")
    plain = keys("k", 7)
    aged(m, clocks, plain)
    clocks.advance(ms=TTL_MS)
    m.objects.lease_deadline_ns[m.objects.live_rows()[2]] = clocks.steady_ns() + 10**9  # g0002 leased
    report = m.evict(target=0.10)
    assert report.evicted_objects == 1 and survivors(m) == set(group) | set(plain[1:])


def test_group_pinned_members_stay_while_safe_peers_go(m, clocks):
    aged(m, clocks, ["g-hard"], group_id="G", hard_pin=True)
    aged(m, clocks, ["g-soft"], group_id="G", soft_pin_action=SoftPinAction.ENABLE)
    aged(m, clocks, ["g-a", "g-b"], group_id="G")
    clocks.advance(ms=TTL_MS)
    m.evict(target=0.5)
    assert survivors(m) == {"g-hard", "g-soft"}


def test_hard_pin_survives_everything_but_remove_still_works(m, clocks):
    aged(m, clocks, ["hard"], hard_pin=True)
    aged(m, clocks, keys("k", 5))
    clocks.advance(ms=TTL_MS)
    assert m.evict(target=1.0).evicted_objects == 5
    assert survivors(m) == {"hard"}
    m.remove("hard")


def test_high_watermark_triggers_tick(clocks):
    m = make_master(clocks, default_kv_lease_ttl_ms=TTL_MS, seg_size=100 * 64)
    aged(m, clocks, keys("k", 95))
    assert m.tick().evicted_objects == 0   # 95% used > 90%, but every lease is live
    clocks.advance(ms=TTL_MS)
    report = m.tick()                       # target = 0.05 + (0.95 - 0.90) = 0.10 of 95
    assert (report.target, report.evicted_objects) == (pytest.approx(0.10), 10)
    assert m.tick() is None                 # 85% used: below the watermark, not armed


def test_allocation_failure_arms_eviction_only_when_eviction_can_help(clocks):
    m = make_master(clocks, default_kv_lease_ttl_ms=TTL_MS, seg_size=4 * 64)
    aged(m, clocks, keys("k", 4))
    clocks.advance(ms=TTL_MS)
    with pytest.raises(NoAvailableHandle):
        m.put_start("x", 64, client_id="client0", config=ReplicateConfig(replica_num=2))
    assert not m.eviction_armed       # fewer memory segments than replicas (PR #3141)
    with pytest.raises(NoAvailableHandle):
        m.put_start("x", 64, client_id="client0")
    assert m.eviction_armed
    report = m.tick()
    assert report.evicted_objects >= 1 and not m.eviction_armed
    m.put_start("x", 64, client_id="client0")
    empty = MasterService(m.config, clocks=clocks)
    with pytest.raises(NoAvailableHandle):
        empty.put_start("x", 64, client_id="client0")
    assert not empty.eviction_armed   # no memory segments at all


def test_tenant_quota_admission_evicts_only_that_tenant(clocks):
    m = make_master(clocks, default_kv_lease_ttl_ms=TTL_MS, enable_multi_tenants=True,
                    tenant_quota_bytes={"a": 4 * 64, "b": 10 * 64})
    aged(m, clocks, keys("a", 4), tenant_id="a")
    aged(m, clocks, keys("b", 4), tenant_id="b")
    with pytest.raises(TenantQuotaExceeded):   # leases still live: nothing of a's can go
        m.put_start("a-new", 64, client_id="client0", config=ReplicateConfig(tenant_id="a"))
    clocks.advance(ms=TTL_MS)
    m.put_start("a-new", 64, client_id="client0", config=ReplicateConfig(tenant_id="a"))
    assert not m.exist_key("a0000", "a")       # a's oldest went
    assert all(m.exist_key(k, "b") for k in keys("b", 4))
    codes = m.batch_put_start(["z"], [1], client_id="client0", config=ReplicateConfig(tenant_id="nobody")).codes
    assert list(codes) == [ErrorCode.TENANT_NOT_REGISTERED]


def test_offload_on_evict_keeps_data_then_evicts_memory(clocks):
    m = make_master(clocks, default_kv_lease_ttl_ms=TTL_MS, enable_offload=True, offload_on_evict=True)
    aged(m, clocks, keys("k", 4))
    clocks.advance(ms=TTL_MS)
    report = m.evict(target=0.5)
    assert report.offloads_queued == 2 and report.evicted_objects == 0 and m.object_count() == 4
    tasks = m.offload_tasks()
    assert tasks.column("key").to_pylist() == ["k0000", "k0001"]
    again = m.evict(target=0.5)  # pinned sources are not candidates again: only k0002/k0003 count
    assert again.base == 2 and again.offloads_queued == 1
    assert m.offload_tasks().column("key").to_pylist() == ["k0000", "k0001", "k0002"]
    m.complete_offload("k0000", client_id="client0")
    m.evict(target=0.5)
    (rep,) = m.get_replica_list("k0000")
    assert rep.kind.name == "LOCAL_DISK"         # memory replica evicted, disk copy serves reads


def test_offload_force_evict_when_queue_is_full(clocks):
    m = make_master(clocks, default_kv_lease_ttl_ms=TTL_MS, enable_offload=True, offload_on_evict=True,
                    offload_force_evict=True, offloading_queue_limit=2)
    aged(m, clocks, keys("k", 6))
    clocks.advance(ms=TTL_MS)
    report = m.evict(target=0.5)
    assert report.offloads_queued == 1 and report.evicted_objects == 2


def test_expired_puts_are_discarded_and_space_released(clocks):
    m = make_master(clocks, seg_size=1024, put_start_discard_timeout_s=30, put_start_release_timeout_s=600,
                    client_live_ttl_s=100_000)
    m.put_start("stuck", 1024, client_id="client0")
    clocks.advance(s=599)
    m.tick()
    assert m.object_count() == 1
    clocks.advance(s=2)
    m.tick()
    assert m.object_count() == 0 and m.segment_usage()["seg0"][0] == 0
    with pytest.raises(ObjectNotFound):
        m.put_end("stuck", client_id="client0")


def test_background_thread_runs_ticks(clocks):
    m = make_master(clocks, default_kv_lease_ttl_ms=TTL_MS, seg_size=10 * 64)
    aged(m, clocks, keys("k", 10))
    clocks.advance(ms=TTL_MS)
    done = []
    original = m.tick

    def tick():
        done.append(original())
    m.tick = tick
    m.start(interval_s=0.001)
    try:
        deadline = time.monotonic() + 30  # a bound on real progress, not a wait for a TTL
        while not any(r is not None and r.evicted_objects for r in list(done)):
            assert time.monotonic() < deadline and m.health().healthy, m.health()
    finally:
        m.stop()
    assert m.object_count() < 10


def test_eviction_metrics_are_exported_on_an_injected_registry(m, clocks):
    aged(m, clocks, keys("k", 10))
    clocks.advance(ms=TTL_MS)
    m.evict(target=0.5)
    registry = CollectorRegistry()
    register(m.metrics, registry)
    text = generate_latest(registry).decode()
    assert "mooncake_evicted_objects_total 5.0" in text
    assert "mooncake_eviction_attempts_total 1.0" in text
    assert "mooncake_evicted_bytes_total 320.0" in text


def test_eviction_plan_reports_remaining_descriptors(clocks):
    m = make_master(clocks, segments=2, default_kv_lease_ttl_ms=TTL_MS)
    aged(m, clocks, ["two"], replica_num=2)
    clocks.advance(ms=TTL_MS)
    plan = m.eviction_plan(1.0)
    assert plan.removed.sum() == 2 and not plan.remaining.any() and plan.erased.size == 1
    assert m.object_count() == 1  # planning changes nothing


def test_a_cycle_over_thousands_of_candidates_evicts_the_earliest_deadlines_ties_by_row():
    """Large enough that the census lists the first pass's candidates itself (sampled bound):
    the evicted set is still exactly the earliest ceil(base * target) by (deadline, row)."""
    import numpy as np

    from mooncake_columnar.clock import ManualClocks
    from mooncake_columnar.tools.synthetic import build_master

    clocks = ManualClocks()
    m = build_master(8_000, segments=2, clocks=clocks)
    o = m.objects
    hw = o.high_water
    rng = np.random.default_rng(7)
    now = clocks.steady_ns()
    lease = now - rng.integers(1, 1_000, hw)  # expired, with many ties
    live = rng.random(hw) < 0.1
    lease[live] = now + 10**12                # a live lease: in the base, not a candidate
    o.lease_deadline_ns[:hw] = lease
    keys_before = m.to_arrow().column("key").to_pylist()
    report = m.evict(target=0.05)
    want = -(-hw * 5 // 100)
    candidates = np.flatnonzero(~live)
    gone = candidates[np.lexsort((candidates, lease[candidates]))][:want]
    assert report.base == hw and report.evicted_objects == want
    assert 0 < report.census_s + report.plan_s + report.apply_s <= report.duration_s
    assert survivors(m) == set(keys_before) - {keys_before[r] for r in gone}


@pytest.mark.parametrize("case", ["grouped", "short listing"])
def test_a_cycle_that_needs_every_code_after_a_listing_census_plans_as_with_codes(monkeypatch, case):
    """A listing census writes no codes. When a pass needs them (a group among the earliest
    candidates, or a listing shorter than the pass), the census writes them under the same
    ``now``: the cycle evicts exactly what it evicts when the census writes codes from the start."""
    import numpy as np

    from mooncake_columnar.clock import ManualClocks
    from mooncake_columnar.kernels import eviction as ek
    from mooncake_columnar.tools.synthetic import build_master

    listing_bound, census = ek.listing_bound, ek.census

    def cycle(listing: bool) -> tuple[set, int, int]:
        clocks = ManualClocks()
        m = build_master(8_000, segments=2, clocks=clocks)
        members = [f"member-{i}" for i in range(40)]
        m.batch_put_start(members, np.full(40, 4096, np.int64), client_id="client-0",
                          config=ReplicateConfig(group_id="g"))
        m.batch_put_end(members, client_id="client-0")
        o = m.objects
        hw = o.high_water
        now = clocks.steady_ns()
        lease = now - np.random.default_rng(3).integers(1_000, 10**9, hw)
        lease[-40:] = now - 10**10  # the group's members first (the earliest deadlines)...
        lease[-1] = now + 10**12    # ...but one holds a live lease: it keeps the whole group
        o.lease_deadline_ns[:hw] = lease
        bounds, codings = [], []

        def bound(*args, **kwargs):
            b = listing_bound(*args, **kwargs)
            if b is not None and case == "short listing":
                b = ek.ListingBound(int(np.sort(lease)[100]), b.share)  # about 100 rows listed
            bounds.append(b)
            return b if listing else None

        monkeypatch.setattr(ek, "listing_bound", bound)
        monkeypatch.setattr(ek, "census", lambda *a, **k: codings.append(1) or census(*a, **k))
        report = m.evict(target=0.05)
        assert bounds and bounds[0] is not None  # the census lists (or would list) candidates
        return survivors(m), report.evicted_objects, len(codings)

    listed, listed_evicted, listed_codings = cycle(listing=True)
    coded, coded_evicted, coded_codings = cycle(listing=False)
    assert listed == coded and listed_evicted == coded_evicted == 402
    assert listed_codings == coded_codings == 1  # the codes written once, later or at once
