"""Soft-pin deadlines live in a side table (store/rare_fields.py): only the objects that are, or
await being, soft-pinned hold one; deadlines stay exact through put_end, removal and restore."""
from __future__ import annotations

from mooncake_columnar import MasterService, ReplicateConfig, SoftPinAction
from mooncake_columnar.schema import NO_DEADLINE
from mooncake_columnar.testing.builders import make_master

PIN = ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=5_000)


def _held(m: MasterService) -> int:
    return int(m.store.soft_pins.in_use.sum())


def test_only_soft_pinned_objects_hold_a_deadline_and_removal_frees_it(clocks):
    m = make_master(clocks)
    for k in ("a", "b"):
        m.put_start(k, 64, client_id="client0")
        m.put_end(k, client_id="client0")
    assert _held(m) == 0 and "soft_pin_deadline_ns" not in m.column_bytes()
    m.put_start("pinned", 64, client_id="client0", config=PIN)
    assert _held(m) == 1 and m.object_info("pinned").soft_pin_deadline_ns == NO_DEADLINE  # awaits put_end
    m.put_end("pinned", client_id="client0")
    info = m.object_info("pinned")
    assert info.soft_pin_enabled and info.soft_pin_deadline_ns == clocks.steady_ns() + 5_000 * 1_000_000
    assert m.object_info("a").soft_pin_deadline_ns == NO_DEADLINE
    m.verify()
    m.remove("pinned", force=True)
    assert _held(m) == 0
    m.verify()


def test_soft_pin_deadlines_survive_export_and_restore(clocks):
    m = make_master(clocks)
    keys = [f"k{i}" for i in range(40)]
    for i, k in enumerate(keys):
        m.put_start(k, 64, client_id="client0", config=PIN if i % 3 == 0 else ReplicateConfig())
        m.put_end(k, client_id="client0")
        clocks.advance(ms=1)
    r = MasterService.from_state(m.export_state(), config=m.config, clocks=clocks)
    r.verify()
    assert _held(r) == _held(m) == 14
    assert [r.object_info(k).soft_pin_deadline_ns for k in keys] == [m.object_info(k).soft_pin_deadline_ns
                                                                     for k in keys]


def test_soft_pinned_objects_resist_eviction_until_their_deadline(clocks):
    m = make_master(clocks, default_kv_lease_ttl_ms=10)
    for i in range(20):
        m.put_start(f"k{i}", 1 << 20, client_id="client0", config=PIN if i < 5 else ReplicateConfig())
        m.put_end(f"k{i}", client_id="client0")
    clocks.advance(ms=100)  # leases expired, soft pins not
    m.evict(target=0.5)
    left = {k for k in (f"k{i}" for i in range(20)) if m.exist_key(k)}
    assert {f"k{i}" for i in range(5)} <= left
    assert _held(m) == 5
    m.verify()


def test_a_batch_of_soft_pinned_puts_grows_the_table_and_keeps_every_deadline(clocks):
    m = make_master(clocks)
    keys = [f"k{i}" for i in range(300)]  # more than the table's first capacity
    m.batch_put_start(keys, [64] * len(keys), client_id="client0", config=PIN)
    m.batch_put_end(keys, client_id="client0")
    assert _held(m) == 300
    assert {m.object_info(k).soft_pin_deadline_ns for k in keys} == {clocks.steady_ns() + 5_000 * 1_000_000}
    m.verify()
