"""The single-key read's columns object (store/read_columns.py) always reads the store's arrays
of the moment: every column and table grows, is compacted or is replaced between reads, and
the reads stay exactly right (descriptors, codes, leases written where the store reads them)."""
from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from mooncake_columnar import ManualClocks, MasterConfig, MasterService, ReplicateConfig
from mooncake_columnar.errors import InternalError, InvalidParams, ObjectNotFound
from mooncake_columnar.kernels.read_columns import FIELDS, column_table
from mooncake_columnar.messages import ReplicaDescriptor
from mooncake_columnar.policies import views
from mooncake_columnar.schema import MAX_KEY_BYTES
from mooncake_columnar.testing.builders import MB

TTL_MS = 1_000

# where the store holds each field of the columns object (kernels/read_columns.FIELDS order)
HOLDERS = {"table": ("keys", "table"), "arena": ("keys", "arena"), "key_refs": ("objects", "key_ref"),
           "row_tenant": ("objects", "tenant"), "flags": ("objects", "flags"),
           "lease": ("objects", "lease_deadline_ns"),
           "rep_status": ("objects", "replica_status"), "rep_kind": ("objects", "replica_kind"),
           "rep_seg": ("objects", "replica_segment"), "seg_readable": ("segments", "readable"),
           "more": ("objects", "replica_more"), "rep_id": ("objects", "replica_id"),
           "rep_offset": ("objects", "replica_offset"), "size_bytes": ("objects", "size_bytes"),
           "unit_bits": ("segments", "unit_bits")}


def row_of(m: MasterService, key: str) -> int:
    return int(m.store.lookup(np.array([0, len(key.encode())]), np.frombuffer(key.encode(), np.uint8), "default")[0])


def expected(m: MasterService, key: str) -> list[ReplicaDescriptor]:
    """The general per-row builder's readable descriptors (no kernel involved)."""
    return views.descriptors(m.store, row_of(m, key), readable_only=False)


def check_reads(m: MasterService, keys: list[str], clocks: ManualClocks) -> None:
    """Every key reads as the general builder says, and its read lease lands in the live column."""
    clocks.advance(ms=1)
    now = clocks.steady_ns()
    for key in keys:
        assert m.get_replica_list(key) == expected(m, key)
        assert m.exist_key(key)
        assert m.objects.lease_deadline_ns[row_of(m, key)] == now + TTL_MS * 1_000_000


def test_reads_stay_right_while_every_column_and_table_grows_between_them(clocks):
    m = MasterService(MasterConfig(max_replica_num=8, default_kv_lease_ttl_ms=TTL_MS), clocks=clocks,
                      initial_capacity=16)
    m.mount_segment("seg0", endpoint="10.0.0.1:1", client_id="c0", base=1 << 32, size=64 * MB)
    keys: list[str] = []
    s = m.store
    grown = set()
    for step in range(12):
        before = {name: getattr(getattr(s, holder), attr) for name, (holder, attr) in HOLDERS.items()}
        # more objects (column growth, key table rehash, arena growth), longer keys each step
        fresh = [f"step{step}-" + "k" * (4 * step) + f"-{i}" for i in range(8 << step)]
        m.batch_put_start(fresh, np.full(len(fresh), 1024), client_id="c0")
        m.batch_put_end(fresh, client_id="c0")
        keys += fresh
        # wider objects: replica slot columns widen, then continuation rows (the chain column)
        width = min(8, 1 + step)
        m.mount_segment(f"seg{step + 1}", endpoint=f"10.0.{step + 1}.1:1", client_id="c0",
                        base=(step + 2) << 32, size=64 * MB)  # past 16 segments: the segment table grows
        for extra in range(2):
            m.mount_segment(f"seg{step + 1}-{extra}", endpoint=f"10.1.{step}.{extra}:1", client_id="c0",
                            base=(100 + 2 * step + extra) << 32, size=16 * MB)
        wide = f"wide{step}"
        m.put_start(wide, 4096, client_id="c0", config=ReplicateConfig(replica_num=width))
        m.put_end(wide, client_id="c0")
        keys.append(wide)
        # removals leave arena garbage that a later growth compacts (a new key_ref column)
        gone, keys = keys[: len(keys) // 2], keys[len(keys) // 2:]
        m.batch_remove(gone, force=True)
        check_reads(m, keys[:: max(1, len(keys) // 64)], clocks)
        for key in gone[:: max(1, len(gone) // 16)]:
            with pytest.raises(ObjectNotFound):
                m.get_replica_list(key)
            assert not m.exist_key(key)
        grown |= {name for name, (holder, attr) in HOLDERS.items() if getattr(getattr(s, holder), attr)
                  is not before[name]}
        m.verify()
    # the test did replace every array the reads use, at least once
    assert grown == set(FIELDS)


@pytest.mark.parametrize("field", FIELDS)
def test_a_read_after_any_one_array_is_replaced_reads_the_new_one(field, clocks):
    m = MasterService(MasterConfig(default_kv_lease_ttl_ms=TTL_MS), clocks=clocks)
    m.mount_segment("seg0", endpoint="10.0.0.1:1", client_id="c0", base=1 << 32, size=16 * MB)
    m.put_start("k", 4096, client_id="c0")
    m.put_end("k", client_id="c0")
    before = m.get_replica_list("k")
    holder, attr = HOLDERS[field]
    owner = getattr(m.store, holder)
    setattr(owner, attr, getattr(owner, attr).copy())
    reader = m._single_reader
    assert not reader.current()
    check_reads(m, ["k"], clocks)  # the lease lands in the new lease column too
    assert m.get_replica_list("k") == before
    assert reader.current()


def test_the_background_round_frees_the_arrays_a_growth_replaced(clocks):
    m = MasterService(MasterConfig(default_kv_lease_ttl_ms=TTL_MS), clocks=clocks, initial_capacity=16)
    m.mount_segment("seg0", endpoint="10.0.0.1:1", client_id="c0", base=1 << 32, size=16 * MB)
    m.put_start("k", 4096, client_id="c0")
    m.put_end("k", client_id="c0")
    m.get_replica_list("k")
    old = weakref.ref(m.objects.flags)
    keys = [f"key{i}" for i in range(100)]
    m.batch_put_start(keys, np.full(100, 1024), client_id="c0")  # the columns double
    m.batch_put_end(keys, client_id="c0")
    m.tick()
    gc.collect()
    assert old() is None
    check_reads(m, ["k", *keys], clocks)


def test_bad_keys_and_tenants_get_the_same_typed_errors(master):
    for bad in (None, 1, b"k", "", "\ud800", "k" * (MAX_KEY_BYTES + 1)):
        for call in (master.get_replica_list, master.exist_key):
            with pytest.raises(InvalidParams):
                call(bad)
    for call in (master.get_replica_list, master.exist_key):
        with pytest.raises(InvalidParams):
            call("k", 7)
    with pytest.raises(ObjectNotFound):
        master.get_replica_list("absent")
    assert not master.exist_key("absent", "no-such-tenant")
    # the key's limit is in UTF-8 bytes: MAX_KEY_BYTES ASCII characters are a key, as many
    # characters of two bytes each are not
    assert not master.exist_key("k" * MAX_KEY_BYTES)
    with pytest.raises(InvalidParams):
        master.exist_key("\u00e9" * (MAX_KEY_BYTES // 2 + 1))


def test_a_tenant_named_after_the_first_read_is_found(clocks):
    """Single reads look the tenant code up in the tenant dictionary's live mapping
    (StringDictionary.lookup), not in a copy taken before."""
    m = MasterService(MasterConfig(), clocks=clocks)
    m.mount_segment("seg0", endpoint="10.0.0.1:1", client_id="c0", base=1 << 32, size=16 * MB)
    assert not m.exist_key("k", "t2")
    m.put_start("k", 4096, client_id="c0", config=ReplicateConfig(tenant_id="t2"))
    m.put_end("k", client_id="c0", tenant_id="t2")
    assert m.exist_key("k", "t2") and not m.exist_key("k")
    assert [r.segment for r in m.get_replica_list("k", "t2")] == ["seg0"]


def test_a_replacement_in_another_masters_store_keeps_this_readers_columns(clocks):
    """Array replacements are counted process-wide (store/array_epoch.py): another master's
    growth makes this reader look, find its own arrays unchanged and keep its column table;
    a replacement in its own store is read at once."""
    a, b = (MasterService(MasterConfig(default_kv_lease_ttl_ms=TTL_MS), clocks=clocks) for _ in range(2))
    for m in (a, b):
        m.mount_segment("seg0", endpoint="10.0.0.1:1", client_id="c0", base=1 << 32, size=16 * MB)
        m.put_start("k", 4096, client_id="c0")
        m.put_end("k", client_id="c0")
    a.get_replica_list("k")
    table = a._single_reader._table
    b.objects.flags = b.objects.flags.copy()
    check_reads(a, ["k"], clocks)
    assert a._single_reader._table is table
    a.objects.lease_deadline_ns = a.objects.lease_deadline_ns.copy()
    check_reads(a, ["k"], clocks)  # the lease lands in the new column
    assert a._single_reader._table is not table


def test_the_column_table_takes_only_the_layout_the_single_read_views(master):
    """read_one views raw column addresses: a column of another dtype, or a strided view (its
    copy would take the lease writes away from the store), is refused, not misread."""
    sources = list(master._single_reader.sources())
    assert column_table(*sources).shape == (3 * len(FIELDS),)
    lease = FIELDS.index("lease")
    for bad in (sources[lease].astype(np.int32), np.zeros(2 * sources[lease].size, np.int64)[::2]):
        with pytest.raises(InternalError, match="column lease"):
            column_table(*sources[:lease], bad, *sources[lease + 1:])
    with pytest.raises(InternalError):
        column_table(*sources[:-1])
