"""Engine integrity: one erase primitive that refuses stale row handles, in-flight slots that
never outlive their row, and background work whose failures are seen and survived."""
from __future__ import annotations

import time

import numpy as np
import pytest

from mooncake_columnar import MasterConfig, ReplicateConfig
from mooncake_columnar.errors import (EngineInvariantError, ErrorCode, InvalidConfig, InvalidParams,
                                      ObjectAlreadyExists, ObjectNotFound)
from mooncake_columnar.testing.builders import make_master


def _free_stack(m):
    return m.objects.free_rows[: m.objects.free_count]


def test_expired_put_discard_never_erases_a_row_freed_while_its_put_was_in_flight(clocks):
    """The issue's sequence: a row freed with its put in flight used to keep a stale slot; once
    the slot was reused and expired, tick() erased the freed row a second time."""
    m = make_master(clocks)
    m.put_start("a", 10, client_id="client0")
    m.put_start("c", 10, client_id="client0")
    m.put_end("c", client_id="client0")
    m.put_revoke("a", client_id="client0")
    m.remove("c", force=True)
    m.put_start("b", 10, client_id="client0")
    m.put_start("acked", 10, client_id="client0")   # takes a recycled row
    m.put_end("acked", client_id="client0")
    clocks.advance(ms=(m.config.put_start_release_timeout_s + 1) * 1000)
    m.ping("client0")  # the segment's owner is alive: its segment stays mounted
    m.tick()
    # "b" was abandoned and is discarded; the acknowledged object is untouched
    with pytest.raises(ObjectNotFound):
        m.get_replica_list("b")
    assert [r.segment for r in m.get_replica_list("acked")] == ["seg0"]
    assert m.object_count() == 1 and m.objects.live_count == 1 and m.keys.count == 1
    stack = _free_stack(m)
    assert np.unique(stack).size == stack.size
    assert (m.inflight.slots_of(stack) == -1).all()
    m.verify()


def test_freed_rows_hold_no_in_flight_slot(clocks):
    m = make_master(clocks)
    for k in "abcd":
        m.put_start(k, 10, client_id="client0")
    m.put_revoke("a", client_id="client0")
    m.remove_all(force=True)
    m.batch_remove(["b", "c"], force=True)  # PROCESSING: refused, stays in flight
    assert (m.inflight.slots_of(_free_stack(m)) == -1).all()
    assert m.inflight.in_use.sum() == 3
    m.verify()


def test_erase_refuses_a_row_that_is_not_live_and_changes_nothing(clocks):
    m = make_master(clocks)
    m.put_start("x", 10, client_id="client0")
    m.put_end("x", client_id="client0")
    row = int(m.objects.live_rows()[0])
    m.remove("x")
    before = (m.objects.free_count, m.objects.live_count, m.segment_usage())
    with pytest.raises(EngineInvariantError) as e:
        m.store.erase_rows(np.array([row]))
    assert e.value.check == "erase_not_live"
    assert (m.objects.free_count, m.objects.live_count, m.segment_usage()) == before


def test_erase_refuses_a_row_named_twice_and_changes_nothing(clocks):
    m = make_master(clocks)
    m.put_start("x", 10, client_id="client0")
    m.put_end("x", client_id="client0")
    row = int(m.objects.live_rows()[0])
    with pytest.raises(EngineInvariantError):
        m.store.erase_rows(np.array([row, row]))
    assert m.object_count() == 1 and m.get_replica_list("x")
    assert m.objects.flags[row] < 128  # the guard's scratch bit is cleared again
    m.verify()


def _failing_once(m):
    original = m.expire_clients
    calls = []

    def expire_clients():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected failure in one tick")
        return original()
    m.expire_clients = expire_clients


def test_a_failing_tick_is_logged_counted_and_reported_and_the_next_tick_still_evicts(clocks, caplog):
    m = make_master(clocks, seg_size=1 << 16, default_kv_lease_ttl_ms=100)
    for i in range(60):  # above the high watermark once complete
        m.put_start(f"k{i}", 1000, client_id="client0")
        m.put_end(f"k{i}", client_id="client0")
    clocks.advance(ms=200)
    _failing_once(m)
    ok = m._background.run_once()
    assert not ok
    h = m.health()
    assert not h.healthy and h.background.failures == 1 and "injected failure" in h.background.last_error
    assert m.metrics.get("background_tick_failures") == 1
    assert "background round failed" in caplog.text
    assert m._background.run_once()
    assert m.health().healthy and m.object_count() < 60


def test_the_background_thread_survives_a_failing_tick(clocks):
    m = make_master(clocks, seg_size=1 << 16, default_kv_lease_ttl_ms=100)
    for i in range(60):
        m.put_start(f"k{i}", 1000, client_id="client0")
        m.put_end(f"k{i}", client_id="client0")
    clocks.advance(ms=200)
    _failing_once(m)
    m.start(interval_s=0.001)
    try:
        deadline = time.monotonic() + 30  # bounds the wait for progress, not a TTL
        while m.object_count() == 60 or m.health().background.rounds < 3:
            assert time.monotonic() < deadline, m.health()
            time.sleep(0.001)
        h = m.health()
        assert h.background.running and h.background.failures == 1 and h.healthy
    finally:
        m.stop()
    assert not m.health().background.running and not m.health().background.died


def test_replica_num_above_the_configured_maximum_is_refused_before_anything_is_allocated(clocks):
    m = make_master(clocks, segments=2)
    before = (m.objects.slots, m.metadata_bytes(), m.segment_usage())
    for bad in (0, 5, 64, 65, -1):
        with pytest.raises(InvalidParams, match="replica_num"):
            m.put_start("k", 10, client_id="client0", config=ReplicateConfig(replica_num=bad))
    assert (m.objects.slots, m.metadata_bytes(), m.segment_usage()) == before
    with pytest.raises(InvalidConfig, match="max_replica_num"):
        MasterConfig(max_replica_num=65)


def test_a_failed_wide_put_widens_no_column(clocks):
    m = make_master(clocks, segments=4)
    m.put_start("k", 10, client_id="client0")
    m.put_end("k", client_id="client0")
    with pytest.raises(ObjectAlreadyExists):
        m.put_start("k", 10, client_id="client0", config=ReplicateConfig(replica_num=4))
    assert m.objects.slots == 1
    assert (m.batch_put_start(["k"], [10], client_id="client0",
                              config=ReplicateConfig(replica_num=4)).codes == ErrorCode.OBJECT_ALREADY_EXISTS).all()
    assert m.objects.slots == 1


def test_a_wide_put_widens_only_to_the_segments_that_can_hold_a_replica(clocks):
    m = make_master(clocks, segments=2, max_replica_num=16)
    m.put_start("k", 10, client_id="client0", config=ReplicateConfig(replica_num=16))
    assert m.objects.slots == 2 and len(m.object_info("k").replicas) == 2


def test_one_object_at_the_default_maximum_less_than_doubles_per_object_memory(clocks):
    m = make_master(clocks, segments=4, seg_size=1 << 26)
    n = 10_000
    keys = [f"k{i}" for i in range(n)]
    m.batch_put_start(keys, np.full(n, 64), client_id="client0")
    m.batch_put_end(keys, client_id="client0")
    mem = m.metadata_bytes()
    narrow = mem["columns"] + mem["index"] + mem["inflight"]
    m.put_start("wide", 64, client_id="client0", config=ReplicateConfig(replica_num=4))
    mem = m.metadata_bytes()
    assert (mem["columns"] + mem["index"] + mem["inflight"]) < 2 * narrow
    assert len(m.object_info("wide").replicas) == 4
    m.verify()
