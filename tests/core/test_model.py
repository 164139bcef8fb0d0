"""Hypothesis stateful test: MasterService and the plain-Python reference model in lockstep."""
from __future__ import annotations

import random

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from mooncake_columnar import ManualClocks, MasterConfig, MasterService, ReplicateConfig, SoftPinAction
from mooncake_columnar.errors import MooncakeError
from mooncake_columnar.testing.reference import ReferenceMaster

KEYS = st.sampled_from(["a", "b", "c", "key-1", "key-2", "x/y"])
TENANTS = st.sampled_from(["default", "t2"])
SEGS = st.sampled_from(["s0", "s1", "s2"])
CLIENTS = st.sampled_from(["c0", "c1"])
SEG_SIZES = {"s0": 256, "s1": 192, "s2": 128}
LEASE_MS, SOFT_MS, MAX_SOFT_MS = 1_000, 3_000, 10_000


def code_of(fn, *args, **kwargs):
    try:
        return 0, fn(*args, **kwargs)
    except MooncakeError as e:
        return int(e.code), None


class EngineVsModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.clocks = ManualClocks()
        cfg = MasterConfig(default_kv_lease_ttl_ms=LEASE_MS, default_kv_soft_pin_ttl_ms=SOFT_MS,
                           max_kv_soft_pin_ttl_ms=MAX_SOFT_MS, put_start_discard_timeout_s=2,
                           put_start_release_timeout_s=5, client_live_ttl_s=30)
        self.m = MasterService(cfg, clocks=self.clocks, initial_capacity=16)
        self.m.objects.hot_slots_max = 1  # every 2-replica put keeps its second replica in a continuation row
        self.ref = ReferenceMaster(lease_ttl_ms=LEASE_MS, default_soft_pin_ttl_ms=SOFT_MS,
                                   max_soft_pin_ttl_ms=MAX_SOFT_MS, discard_timeout_s=2,
                                   release_timeout_s=5, client_live_ttl_s=30)

    @property
    def now(self):
        return self.clocks.steady_ns()

    @property
    def now_ms(self):
        return self.clocks.system_ns() // 1_000_000

    @initialize()
    def mount_two_segments(self):
        self.mount("s0", "c0")
        self.mount("s1", "c1")

    @rule(keys=st.lists(KEYS, min_size=1, max_size=6), size=st.integers(1, 40), tenant=TENANTS,
          group=st.sampled_from(["", "g1"]))
    def put_and_complete(self, keys, size, tenant, group):
        for key in keys:
            self._put_start(key, tenant, size, "c0", 1, False, None, group, ())
            self._put_end(key, tenant, "c0")

    @rule(name=SEGS, client=CLIENTS)
    def mount(self, name, client):
        base = 1 << 20 if client == "c0" else 1 << 30
        code, _ = code_of(self.m.mount_segment, name, endpoint=f"ep-{name}", client_id=client, base=base,
                          size=SEG_SIZES[name])
        assert code == self.ref.mount(name, f"ep-{name}", client, base, SEG_SIZES[name], self.now)

    @rule(name=SEGS)
    def unmount(self, name):
        self.m.unmount_segment(name)
        self.ref.unmount(name)

    @rule(key=KEYS, tenant=TENANTS, size=st.integers(1, 100), client=CLIENTS,
          replica_num=st.integers(1, 2), hard=st.booleans(),
          soft=st.sampled_from([None, 0, 500, "default"]), group=st.sampled_from(["", "g1"]),
          preferred=st.sampled_from([(), ("s2",), ("s1", "s0")]))
    def put_start(self, key, tenant, size, client, replica_num, hard, soft, group, preferred):
        self._put_start(key, tenant, size, client, replica_num, hard, soft, group, preferred)

    def _put_start(self, key, tenant, size, client, replica_num, hard, soft, group, preferred):
        if soft is None:
            action, ttl, model_ttl = SoftPinAction.PRESERVE, None, 0
        else:
            action = SoftPinAction.ENABLE
            ttl = None if soft == "default" else soft
            model_ttl = SOFT_MS if soft == "default" else soft
        cfg = ReplicateConfig(replica_num=replica_num, hard_pin=hard, soft_pin_action=action,
                              soft_pin_ttl_ms=ttl, group_id=group, tenant_id=tenant,
                              preferred_segments=preferred)
        code, _ = code_of(self.m.put_start, key, size, client_id=client, config=cfg)
        expect = self.ref.put_start(tenant, key, size, client, self.now_ms, replica_num=replica_num,
                                    hard=hard, soft_ttl_ms=model_ttl, group=group, preferred=preferred)
        assert code == expect

    @rule(keys=st.lists(KEYS, min_size=1, max_size=4), size=st.integers(1, 60), client=CLIENTS)
    def batch_put_start(self, keys, size, client):
        codes = self.m.batch_put_start(keys, [size] * len(keys), client_id=client).codes
        self.ref._release(self.now_ms)
        expect = [self.ref.put_start("default", k, size, client, self.now_ms, release=False) for k in keys]
        assert list(codes) == expect

    @rule(key=KEYS, tenant=TENANTS, client=CLIENTS)
    def put_end(self, key, tenant, client):
        self._put_end(key, tenant, client)

    def _put_end(self, key, tenant, client):
        code, _ = code_of(self.m.put_end, key, client_id=client, tenant_id=tenant)
        assert code == self.ref.put_end(tenant, key, client, self.now)

    @rule(keys=st.lists(KEYS, min_size=1, max_size=4), client=CLIENTS)
    def batch_put_end(self, keys, client):
        codes = self.m.batch_put_end(keys, client_id=client).codes
        assert list(codes) == [self.ref.put_end("default", k, client, self.now) for k in keys]

    @rule(key=KEYS, tenant=TENANTS, client=CLIENTS)
    def put_revoke(self, key, tenant, client):
        code, _ = code_of(self.m.put_revoke, key, client_id=client, tenant_id=tenant)
        assert code == self.ref.put_revoke(tenant, key, client)

    @rule(key=KEYS, tenant=TENANTS)
    def get(self, key, tenant):
        code, reps = code_of(self.m.get_replica_list, key, tenant)
        ecode, ereps = self.ref.get(tenant, key, self.now)
        assert code == ecode
        if code == 0:
            assert sorted((r.segment, r.replica_id) for r in reps) == ereps

    @rule(keys=st.lists(KEYS, min_size=1, max_size=4), tenant=TENANTS)
    def batch_get(self, keys, tenant):
        res = self.m.batch_get_replica_list(keys, tenant)
        expect = [self.ref.get(tenant, k, self.now) for k in keys]
        assert list(res.codes) == [c for c, _ in expect]
        t = res.replicas.to_pydict()
        for i, (c, ereps) in enumerate(expect):
            got = sorted((s, r) for ki, s, r in zip(t["key_index"], t["segment"], t["replica_id"]) if ki == i)
            assert got == ereps

    @rule(key=KEYS, tenant=TENANTS)
    def exist(self, key, tenant):
        assert self.m.exist_key(key, tenant) == self.ref.exist(tenant, key, self.now)

    @rule(keys=st.lists(KEYS, min_size=1, max_size=4))
    def batch_exist(self, keys):
        got = list(self.m.batch_exist_key(keys))
        assert got == [self.ref.exist("default", k, self.now) for k in keys]

    @rule(key=KEYS, tenant=TENANTS, force=st.booleans())
    def remove(self, key, tenant, force):
        code, _ = code_of(self.m.remove, key, tenant_id=tenant, force=force)
        assert code == self.ref.remove(tenant, key, self.now, force)

    @rule(keys=st.lists(KEYS, min_size=1, max_size=4), force=st.booleans())
    def batch_remove(self, keys, force):
        codes = self.m.batch_remove(keys, force=force)
        assert list(codes) == [self.ref.remove("default", k, self.now, force) for k in keys]

    @rule(force=st.booleans(), tenant=st.sampled_from([None, "default", "t2"]))
    def remove_all(self, force, tenant):
        assert self.m.remove_all(force=force, tenant_id=tenant) == self.ref.remove_all(self.now, force, tenant)

    @rule(pattern=st.sampled_from(["^key", "a|b", "y$", "-[12]"]), tenant=TENANTS, force=st.booleans())
    def remove_by_regex(self, pattern, tenant, force):
        got = self.m.remove_by_regex(pattern, tenant_id=tenant, force=force)
        assert got == self.ref.remove_by_regex(tenant, pattern, self.now, force)

    @rule(ms=st.integers(0, 2_500))
    def advance(self, ms):
        self.clocks.advance(ms=ms)

    @rule(ms=st.integers(0, 2_500))
    def advance_steady_only(self, ms):
        self.clocks.advance(ms=ms, system_too=False)

    @rule(hours=st.sampled_from([-1, 1]))
    def jump_system_clock(self, hours):
        self.clocks.jump_system(s=3600 * hours)

    @rule(client=CLIENTS)
    def ping(self, client):
        assert int(self.m.ping(client)) == self.ref.ping(client, self.now)

    def _rows(self):
        t = self.m.to_arrow()
        rows = self.m.objects.live_rows().tolist()
        return {(tn, k): r for tn, k, r in zip(t["tenant"].to_pylist(), t["key"].to_pylist(), rows)}

    @rule()
    def tick(self):
        rows = self._rows()
        report = self.m.tick()
        expected = self.ref.tick(self.now, self.now_ms, rows)
        assert (report.evicted_objects if report else None) == expected

    @rule(ratio=st.sampled_from([0.1, 0.5, 1.0]), lower_share=st.sampled_from([0.0, 0.5, 1.0]))
    def evict(self, ratio, lower_share):
        rows = self._rows()
        report = self.m.evict(target=ratio, lower=ratio * lower_share)
        assert report.evicted_objects == self.ref.evict(ratio, ratio * lower_share, self.now, self.now_ms, rows)

    @invariant()
    def same_state(self):
        t = self.m.to_arrow().to_pydict()
        got = {(tn, k): (lease, hard, soft_en, soft_dl, proc)
               for tn, k, lease, hard, soft_en, soft_dl, proc in zip(
                   t["tenant"], t["key"], t["lease_deadline_ns"], t["hard_pinned"], t["soft_pin_enabled"],
                   t["soft_pin_deadline_ns"], t["processing"])}
        want = {k: (o.lease, o.hard, o.soft_enabled, o.soft_deadline, o.processing)
                for k, o in self.ref.objects.items()}
        assert got == want
        assert self.m.segment_usage() == self.ref.usage()


    @invariant()
    def engine_passes_its_self_check(self):
        self.m.verify()


EngineVsModel.TestCase.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
test_engine_matches_reference_model = EngineVsModel.TestCase


# ---- long seeded runs: the same rules, drawn by a seeded RNG, 1500 operations per run ------------
_KEYS, _TENANTS, _SEGS, _CLIENTS = ["a", "b", "c", "key-1", "key-2", "x/y"], ["default", "t2"], ["s0", "s1", "s2"], \
    ["c0", "c1"]


def _draws(r: random.Random) -> dict:
    """One argument sampler per rule, weighted towards puts left in flight, revokes, force
    removes and clock moves, so rows are freed with puts in flight and slots expire and recycle."""
    keys = lambda n: [r.choice(_KEYS) for _ in range(r.randint(1, n))]  # noqa: E731
    return {
        "put_start": (6, lambda: dict(key=r.choice(_KEYS), tenant=r.choice(_TENANTS), size=r.randint(1, 100),
                                      client=r.choice(_CLIENTS), replica_num=r.randint(1, 2), hard=r.random() < 0.2,
                                      soft=r.choice([None, 0, 500, "default"]), group=r.choice(["", "g1"]),
                                      preferred=r.choice([(), ("s2",), ("s1", "s0")]))),
        "batch_put_start": (2, lambda: dict(keys=keys(4), size=r.randint(1, 60), client=r.choice(_CLIENTS))),
        "put_and_complete": (3, lambda: dict(keys=keys(6), size=r.randint(1, 40), tenant=r.choice(_TENANTS),
                                             group=r.choice(["", "g1"]))),
        "put_end": (4, lambda: dict(key=r.choice(_KEYS), tenant=r.choice(_TENANTS), client=r.choice(_CLIENTS))),
        "batch_put_end": (1, lambda: dict(keys=keys(4), client=r.choice(_CLIENTS))),
        "put_revoke": (3, lambda: dict(key=r.choice(_KEYS), tenant=r.choice(_TENANTS), client=r.choice(_CLIENTS))),
        "get": (3, lambda: dict(key=r.choice(_KEYS), tenant=r.choice(_TENANTS))),
        "batch_get": (1, lambda: dict(keys=keys(4), tenant=r.choice(_TENANTS))),
        "exist": (1, lambda: dict(key=r.choice(_KEYS), tenant=r.choice(_TENANTS))),
        "remove": (3, lambda: dict(key=r.choice(_KEYS), tenant=r.choice(_TENANTS), force=r.random() < 0.6)),
        "batch_remove": (1, lambda: dict(keys=keys(4), force=r.random() < 0.6)),
        "remove_all": (1, lambda: dict(force=r.random() < 0.5, tenant=r.choice([None, "default", "t2"]))),
        "remove_by_regex": (1, lambda: dict(pattern=r.choice(["^key", "a|b", "y$", "-[12]"]),
                                            tenant=r.choice(_TENANTS), force=r.random() < 0.5)),
        "mount": (1, lambda: dict(name=r.choice(_SEGS), client=r.choice(_CLIENTS))),
        "unmount": (1, lambda: dict(name=r.choice(_SEGS))),
        "advance": (4, lambda: dict(ms=r.randint(0, 2_500))),
        "advance_steady_only": (1, lambda: dict(ms=r.randint(0, 2_500))),
        "jump_system_clock": (1, lambda: dict(hours=r.choice([-1, 1]))),
        "ping": (2, lambda: dict(client=r.choice(_CLIENTS))),
        "tick": (3, lambda: {}),
        "evict": (1, lambda: dict(ratio=r.choice([0.1, 0.5, 1.0]), lower_share=r.choice([0.0, 0.5, 1.0]))),
    }


@pytest.mark.parametrize("seed", range(10))
def test_engine_matches_reference_model_over_1500_seeded_operations(seed):
    r = random.Random(seed)
    machine = EngineVsModel()
    machine.mount_two_segments()
    draws = _draws(r)
    names = list(draws)
    weights = [draws[n][0] for n in names]
    for step in range(1, 1501):
        name = r.choices(names, weights)[0]
        getattr(machine, name)(**draws[name][1]())
        machine.same_state()
        if step % 100 == 0:
            machine.m.verify()
    machine.m.verify()
