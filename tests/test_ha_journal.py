"""Primary side of the oplog: PUT_END visible before durable, removals hidden until durable."""
from __future__ import annotations

import pytest

from mooncake_columnar import MasterConfig, MasterService, ReplicateConfig
from mooncake_columnar.errors import MooncakeError, ObjectNotFound
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
    m, writer = journaled(clocks, store, window=2)
    put(m, "a")
    put(m, "b")           # window: mount + a + b > 2, PUT_END of b dropped with a metric
    clocks.advance(ms=TTL_MS)
    m.eviction_armed = True
    report = m.evict(target=1.0)
    assert report.evicted_objects == 0 and m.eviction_armed
    assert m.exist_key("a") and m.exist_key("b")
    assert m.metrics.get("eviction_oplog_backpressure") == 1


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
    drop = ["lease_deadline_ns", "soft_pin_deadline_ns", "put_start_time_ms"]
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
