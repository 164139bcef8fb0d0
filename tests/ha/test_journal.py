"""Primary side of the oplog: PUT_END visible before durable, removals hidden until durable."""
from __future__ import annotations

import pytest

from mooncake_columnar import MasterConfig, MasterService, ReplicateConfig
from mooncake_columnar.errors import ErrorCode, MooncakeError, ObjectNotFound, UnavailableInCurrentStatus
from mooncake_columnar.ha.apply import apply_batch
from mooncake_columnar.ha.oplog import OpType
from mooncake_columnar.ha.stores import FileOpLogStore
from mooncake_columnar.ha.writer import OpLogWriter

TTL_MS = 1_000


@pytest.fixture
def store(tmp_path):
    return FileOpLogStore(tmp_path / "oplog")


def journaled(clocks, store, window=1024, **cfg):
    writer = OpLogWriter(store, window=window, clocks=clocks)
    m = MasterService(MasterConfig(default_kv_lease_ttl_ms=TTL_MS, **cfg), clocks=clocks, journal=writer)
    m.mount_segment("seg0", endpoint="10.0.0.0:1234", client_id="client0", base=1 << 32, size=64 << 20)
    return m, writer


def entries(store):
    return [e for b in store.read_batches(0) for e in b.entries]


def put(m, key, **cfg):
    m.put_start(key, 4096, client_id="client0", config=ReplicateConfig(**cfg))
    m.put_end(key, client_id="client0", tenant_id=cfg.get("tenant_id", "default"))


def test_put_end_is_visible_before_durable_and_journaled_without_deadlines(clocks, store):
    m, writer = journaled(clocks, store)
    put(m, "k", hard_pin=True)
    assert m.get_replica_list("k")           # visible before the batch is durable
    assert store.durable_prefix() == 0
    writer.flush()
    ops = [(e.op, e.key) for e in entries(store)]
    assert ops == [(OpType.SEGMENT_MOUNT, "10.0.0.0:1234"), (OpType.PUT_END, "k")]
    payload = entries(store)[1].payload
    assert payload.hard_pinned and payload.replicas[0].segment == "seg0"
    assert not any(name for name in vars(payload) if "deadline" in name or "lease" in name or "ttl" in name)


def test_remove_hides_first_and_frees_after_durable(clocks, store):
    m, writer = journaled(clocks, store)
    put(m, "k")
    writer.flush()
    m.remove("k")
    with pytest.raises(ObjectNotFound):       # hidden at once: every replica REMOVED
        m.get_replica_list("k")
    assert m.segment_usage()["seg0"][0] == 4096  # space not freed before durable
    with pytest.raises(MooncakeError):        # the key stays taken until then
        m.put_start("k", 10, client_id="client0")
    writer.flush()
    assert m.segment_usage()["seg0"][0] == 0 and m.object_count() == 0
    assert entries(store)[-1].op == OpType.REMOVE


def test_eviction_records_tenant_and_key_and_frees_after_durable(clocks, store):
    m, writer = journaled(clocks, store)
    put(m, "cold", tenant_id="tenant-a")
    writer.flush()
    clocks.advance(ms=TTL_MS)
    assert m.evict(target=1.0).evicted_objects == 1
    assert m.segment_usage()["seg0"][0] == 4096
    writer.flush()
    last = entries(store)[-1]
    assert (last.op, last.tenant, last.key) == (OpType.REMOVE, "tenant-a", "cold")
    assert m.segment_usage()["seg0"][0] == 0


def test_full_window_leaves_eviction_candidate_readable_and_armed(clocks, store):
    m, writer = journaled(clocks, store, window=3, oplog_admission_timeout_ms=0)
    put(m, "a")
    put(m, "b")           # window: mount + a + b = 3, full until a flush
    clocks.advance(ms=TTL_MS)
    m.eviction_armed = True
    report = m.evict(target=1.0)
    assert report.evicted_objects == 0 and m.eviction_armed
    assert m.exist_key("a") and m.exist_key("b")
    assert m.metrics.get("eviction_oplog_backpressure") == 1


def test_put_end_with_a_full_window_fails_before_the_object_becomes_visible(clocks, store):
    m, writer = journaled(clocks, store, window=2, oplog_admission_timeout_ms=0)
    put(m, "a")                                   # mount + a fill the window
    m.put_start("b", 4096, client_id="client0")
    with pytest.raises(UnavailableInCurrentStatus):
        m.put_end("b", client_id="client0")
    assert not m.exist_key("b") and m.object_info("b").processing  # still PROCESSING, not visible
    assert m.metrics.get("put_end_oplog_backpressure") == 1
    writer.flush()
    m.put_end("b", client_id="client0")            # the client's retry
    writer.flush()
    assert [(e.op, e.key) for e in entries(store)][-2:] == [(OpType.PUT_END, "a"), (OpType.PUT_END, "b")]


def test_batch_put_end_larger_than_the_window_journals_every_completed_put(clocks, store, tmp_path):
    writer = OpLogWriter(store, window=8, clocks=clocks)
    writer.start()  # frees window space while the batch waits for it
    try:
        # the writer thread must drain the window within the admission timeout: 10 s, not the
        # default 50 ms that a loaded host missed (codes -1010 from the 16th key on)
        m = MasterService(MasterConfig(oplog_admission_timeout_ms=10_000), clocks=clocks, journal=writer)
        m.mount_segment("seg0", endpoint="10.0.0.0:1234", client_id="client0", base=1 << 32, size=64 << 20)
        keys = [f"k{i}" for i in range(50)] + ["k3", "missing"]
        m.batch_put_start(keys[:50], [64] * 50, client_id="client0")
        codes = m.batch_put_end(keys, client_id="client0").codes
        assert (codes[:51] == 0).all() and codes[51] == ErrorCode.OBJECT_NOT_FOUND
    finally:
        writer.stop()
    put_ends = [e.key for e in entries(store) if e.op == OpType.PUT_END]
    assert sorted(put_ends) == sorted(keys[:50])


def test_a_removal_larger_than_the_window_goes_in_window_sized_reservations(clocks, store):
    writer = OpLogWriter(store, window=8, clocks=clocks)
    writer.start()
    try:
        # each reservation waits for the writer thread to drain the window; the default admission
        # timeout (50 ms) ran out on a loaded host ("8 of 10 objects removed"), which this test
        # is not about (a full window's refusal is the next test's)
        m = MasterService(MasterConfig(oplog_admission_timeout_ms=10_000), clocks=clocks, journal=writer)
        m.mount_segment("seg0", endpoint="10.0.0.0:1234", client_id="client0", base=1 << 32, size=64 << 20)
        keys = [f"k{i}" for i in range(40)]
        m.batch_put_start(keys, [64] * 40, client_id="client0")
        m.batch_put_end(keys, client_id="client0")
        assert (m.batch_remove(keys[:30], force=True) == 0).all()
        assert m.remove_all(force=True) == 10
    finally:
        writer.stop()
    assert m.object_count() == 0 and m.segment_usage()["seg0"][0] == 0
    assert sorted(e.key for e in entries(store) if e.op == OpType.REMOVE) == sorted(keys)


def test_a_removal_refused_by_a_full_window_changes_nothing_and_says_so(clocks, store):
    m, writer = journaled(clocks, store, window=2, oplog_admission_timeout_ms=0)
    put(m, "a")
    codes = m.batch_remove(["a", "a"], force=True)
    assert list(codes) == [ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS, ErrorCode.OBJECT_NOT_FOUND]
    assert m.exist_key("a")
    with pytest.raises(UnavailableInCurrentStatus):
        m.mount_segment("seg1", endpoint="10.0.0.1:1", client_id="client1", base=1 << 40, size=1 << 20)
    assert "seg1" not in m.segment_usage()


def test_standby_applying_the_log_matches_the_primary_without_deadlines(clocks, store):
    m, writer = journaled(clocks, store)
    for i in range(30):
        put(m, f"k{i}", group_id="g" if i % 5 == 0 else "", tenant_id="t" if i % 3 else "default")
    m.remove("k1", tenant_id="t", force=True)
    clocks.advance(ms=TTL_MS)
    m.evict(target=0.2)
    writer.flush()
    standby = MasterService(m.config, clocks=clocks)
    for batch in store.read_batches(0):
        apply_batch(standby, batch)
    drop = ["lease_deadline_ns", "soft_pin_deadline_ns"]  # put starts travel in PUT_END
    want = m.to_arrow().drop_columns(drop).sort_by([("tenant", "ascending"), ("key", "ascending")])
    got = standby.to_arrow().drop_columns(drop).sort_by([("tenant", "ascending"), ("key", "ascending")])
    assert got.equals(want)


def test_promoted_standby_becomes_a_journaling_primary_that_a_new_standby_follows(clocks, store):
    from mooncake_columnar.ha.standby import StandbyService
    m, writer = journaled(clocks, store)
    for i in range(5):
        put(m, f"k{i}")
    writer.flush()
    standby = StandbyService(store, config=m.config, clocks=clocks)
    standby.bootstrap()
    new = standby.promote(timeout_s=1.0, journal_window=1024)
    new.remount_segments("client0", [dict(name="seg0", endpoint="10.0.0.0:1234", client="client0",
                                          base=1 << 32, size=64 << 20)])
    put(new, "after-failover")
    new.remove("k0", force=True)
    new.journal.writer.flush()
    follower = StandbyService(store, config=m.config, clocks=clocks)
    follower.bootstrap()
    follower.poll()
    keys = set(follower.master.to_arrow().column("key").to_pylist())
    assert keys == {"k1", "k2", "k3", "k4", "after-failover"}


def test_the_tenant_ledger_drops_journaled_removals(clocks, store):
    m, writer = journaled(clocks, store, enable_multi_tenants=True, tenant_quota_bytes={"default": 1 << 30})
    put(m, "a")
    put(m, "b")
    writer.flush()
    m.remove("a")
    m.verify()  # hidden: already off the ledger
    writer.flush()
    assert int(m.ledger.committed[0]) == 4096  # only "b" is left
    m.verify()
