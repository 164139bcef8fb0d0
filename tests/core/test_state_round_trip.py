"""export_state / from_state: a master rebuilt from its own state behaves identically."""
from __future__ import annotations

import dataclasses

import pyarrow as pa
import pytest

from mooncake_columnar import MasterService, ReplicateConfig, SoftPinAction
from mooncake_columnar.errors import ObjectHasLease, ReplicaNotReady
from mooncake_columnar.testing.builders import make_master


def _populated(clocks):
    m = make_master(clocks, segments=3)
    for i in range(30):
        cfg = ReplicateConfig(replica_num=1 + i % 2, hard_pin=i % 5 == 0, group_id="g" if i % 7 == 0 else "",
                              soft_pin_action=SoftPinAction.ENABLE if i % 3 == 0 else SoftPinAction.PRESERVE,
                              tenant_id="default" if i % 4 else "t2")
        m.put_start(f"k{i}", 100 + i, client_id="client0", config=cfg)
        if i % 6:
            m.put_end(f"k{i}", client_id="client0", tenant_id=cfg.tenant_id)
    for i in range(0, 30, 4):
        if i % 6:
            m.get_replica_list(f"k{i}", "t2")
    return m


def test_state_round_trip_preserves_tables_and_allocators(clocks):
    m = _populated(clocks)
    state = m.export_state().validate()
    r = MasterService.from_state(state, config=m.config, clocks=clocks)
    assert r.to_arrow().equals(m.to_arrow())
    assert r.export_state().replicas.equals(state.replicas)
    assert r.segment_usage() == m.segment_usage()
    # allocations continue where the original left off, without overlaps
    for master in (m, r):
        master.put_start("after", 64, client_id="client0")
    assert [d.address for d in r.object_info("after").replicas] == [d.address for d in m.object_info("after").replicas]


def test_restored_state_keeps_semantics(clocks):
    m = _populated(clocks)
    r = MasterService.from_state(m.export_state(), config=m.config, clocks=clocks)
    with pytest.raises(ObjectHasLease):
        r.remove("k4", tenant_id="t2")
    with pytest.raises(ReplicaNotReady):
        r.get_replica_list("k6")           # still in flight
    r.put_end("k6", client_id="client0")   # and can be completed
    assert r.object_info("k0", "t2").group_id == "g" and r.object_info("k0", "t2").hard_pinned


def test_restore_with_unreadable_segments_hides_replicas(clocks):
    m = _populated(clocks)
    r = MasterService.from_state(m.export_state(), config=m.config, clocks=clocks, segments_readable=False)
    with pytest.raises(ReplicaNotReady):
        r.get_replica_list("k1")
    assert not r.exist_key("k1")


@pytest.mark.parametrize("batch", [1, 7])
def test_a_state_loaded_batch_by_batch_is_the_same_master(clocks, monkeypatch, batch):
    """A restore loads LOAD_BATCH_ROWS objects at a time (bounded temporaries): groups, soft
    pins, puts in flight, two-replica objects and keys of both tenants come back as from one
    batch, the engine passes its self-check, and a (tenant, key) repeated in a later batch is
    still refused."""
    from mooncake_columnar.errors import SnapshotIntegrityError
    from mooncake_columnar.store import arrow_io
    m = _populated(clocks)
    state = m.export_state().validate()
    whole = MasterService.from_state(state, config=m.config, clocks=clocks)
    monkeypatch.setattr(arrow_io, "LOAD_BATCH_ROWS", batch)
    r = MasterService.from_state(state, config=m.config, clocks=clocks)
    r.verify()
    assert r.to_arrow().equals(whole.to_arrow())
    assert r.export_state().replicas.equals(whole.export_state().replicas)
    assert r.segment_usage() == whole.segment_usage()
    r.put_end("k6", client_id="client0")  # a put in flight (object 6: a later batch) completes
    objects = state.objects
    keys, tenants = objects.column("key").to_pylist(), objects.column("tenant").to_pylist()
    last = max(i for i, t in enumerate(tenants) if t == tenants[0])
    keys[last] = keys[0]  # the last batch repeats the first object's (tenant, key)
    at = objects.schema.get_field_index("key")
    doubled = dataclasses.replace(state, objects=objects.set_column(
        at, objects.schema.field(at), pa.array(keys, objects.schema.field(at).type)))
    with pytest.raises(SnapshotIntegrityError, match="duplicate"):
        MasterService.from_state(doubled, config=m.config, clocks=clocks)
