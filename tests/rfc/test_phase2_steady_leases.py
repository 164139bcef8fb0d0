"""RFC Phase 2 tests: runtime leases use the steady clock, with max-update grants."""
from __future__ import annotations

import numpy as np
import pytest

from mooncake_columnar import NEVER_LEASED, ReplicateConfig, SoftPinAction
from mooncake_columnar.errors import ObjectHasLease
from mooncake_columnar.kernels import leases, rowbits
from mooncake_columnar.schema import FLAG_SOFT_PIN_ENABLED, NO_DEADLINE
from mooncake_columnar.store.rare_fields import SoftPinTable
from mooncake_columnar.testing.builders import make_master

MS = 1_000_000


def put(m, key, **cfg):
    m.put_start(key, 64, client_id="client0", config=ReplicateConfig(**cfg))
    m.put_end(key, client_id="client0")


def test_phase2_grant_lease_uses_steady_time(clocks):
    m = make_master(clocks, default_kv_lease_ttl_ms=10_000)
    put(m, "k")
    clocks.jump_system(s=-5_000)  # a wall-clock jump must not show up in the deadline
    m.get_replica_list("k")
    assert m.object_info("k").lease_deadline_ns == clocks.steady_ns() + 10_000 * MS


@pytest.mark.kernels
def test_phase2_grant_lease_until_never_shortens():
    lease = np.array([NEVER_LEASED, 500, 1_000], np.int64)
    for row, deadline in [(0, 700), (1, 400), (2, 1_000), (1, 800)]:
        leases.grant_until(lease, row, deadline)
    assert lease.tolist() == [700, 800, 1_000]
    masked = np.array([100, 900, 50, 100], np.int64)
    soft = SoftPinTable()
    soft.add(np.arange(3), np.array([100, 900, 50], np.int64))  # row 3 has no soft pin
    flags = np.array([FLAG_SOFT_PIN_ENABLED, FLAG_SOFT_PIN_ENABLED, FLAG_SOFT_PIN_ENABLED, 0], np.uint8)
    leases.grant_recovery_masked(masked, soft.parts(), flags, rowbits.from_bool([True, True, False, True]), 600, 700)
    assert masked.tolist() == [600, 900, 50, 600]
    # only soft-pin-enabled objects get a soft pin
    assert soft.get(np.arange(4)).tolist() == [700, 900, 50, NO_DEADLINE]


def test_phase2_read_after_longer_grant_keeps_later_deadline(clocks):
    m = make_master(clocks, default_kv_lease_ttl_ms=1_000)
    put(m, "k")
    m.get_replica_list("k")
    first = m.object_info("k").lease_deadline_ns
    m.put_end("k", client_id="client0")  # put_end grants max(lease, now): no shortening
    assert m.object_info("k").lease_deadline_ns == first


def test_phase2_soft_pin_enabled_and_expired_are_distinct(clocks):
    m = make_master(clocks, default_kv_soft_pin_ttl_ms=100)
    put(m, "k", soft_pin_action=SoftPinAction.ENABLE)
    active = m.object_info("k")
    clocks.advance(ms=150)
    expired = m.object_info("k")
    assert active.soft_pin_enabled and expired.soft_pin_enabled
    assert active.soft_pin_deadline_ns == expired.soft_pin_deadline_ns < clocks.steady_ns()


@pytest.mark.parametrize("jump_s", [3600, -3600])
def test_phase2_lease_decisions_unaffected_by_system_clock_jumps(clocks, jump_s):
    m = make_master(clocks, default_kv_lease_ttl_ms=1_000)
    put(m, "k")
    m.get_replica_list("k")
    clocks.jump_system(s=jump_s)
    with pytest.raises(ObjectHasLease):  # +1 h of wall clock does not expire a 1 s lease
        m.remove("k")
    clocks.advance(ms=999, system_too=False)
    with pytest.raises(ObjectHasLease):
        m.remove("k")
    clocks.advance(ms=1, system_too=False)
    m.remove("k")  # -1 h of wall clock does not extend it either


def test_phase2_group_refresh_samples_one_now(clocks):
    m = make_master(clocks, default_kv_lease_ttl_ms=1_000)
    keys = [f"g{i}" for i in range(50)]
    res = m.batch_put_start(keys, [8] * len(keys), client_id="client0", config=ReplicateConfig(group_id="G"))
    assert (res.codes == 0).all()
    m.batch_put_end(keys, client_id="client0")
    clocks.advance(ms=7)
    m.get_replica_list("g17")
    deadlines = m.to_arrow().column("lease_deadline_ns").to_pylist()
    assert deadlines == [clocks.steady_ns() + 1_000 * MS] * len(keys)
