"""The engine's self-check (MasterService.verify / integrity.verify_engine): healthy engines pass,
each corruption is named by its check; restore rejects a candidate that fails it; the CLI."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pytest

from mooncake_columnar import ManualClocks, MasterConfig, MasterService, ReplicateConfig, SoftPinAction
from mooncake_columnar import integrity
from mooncake_columnar.tools.cli import main
from mooncake_columnar.errors import EngineInvariantError
from mooncake_columnar.kernels import hashing as hk
from mooncake_columnar.schema import ReplicaStatus
from mooncake_columnar.snapshots.manager import SnapshotManager, restore_master
from mooncake_columnar.snapshots.repository import SnapshotRepository

from mooncake_columnar.testing.states import publish_unvalidated

MB = 1 << 20
W = "writer"
QUOTAS = {"default": 1 << 30, "t2": 1 << 30}


def _mount(m: MasterService, name: str, size: int, i: int) -> None:
    m.mount_segment(name, endpoint=f"10.0.0.{i}:1", client_id=f"client{i}", base=(i + 1) << 40, size=size)


def _put(m: MasterService, key: str, size: int = 1000, *, end: bool = True, **cfg) -> None:
    m.put_start(key, size, client_id=W, config=ReplicateConfig(**cfg))
    if end:
        m.put_end(key, client_id=W, tenant_id=cfg.get("tenant_id", "default"))


def _row(m: MasterService, key: str, tenant: str = "default") -> int:
    data = np.frombuffer(key.encode(), np.uint8)
    tenants = np.array([m.tenants.find(tenant)], np.int32)
    return int(m.keys.lookup_batch(np.array([0, data.size]), data, tenants)[0])


def _busy(clocks: ManualClocks, *, tenants: bool = False) -> MasterService:
    """An engine after a mix of every kind of operation (no tick: see the expired-put discard)."""
    cfg = dict(default_kv_lease_ttl_ms=50)
    if tenants:
        cfg.update(enable_multi_tenants=True, tenant_quota_bytes=QUOTAS)
    m = MasterService(MasterConfig(**cfg), clocks=clocks)
    for i in range(3):
        _mount(m, f"seg{i}", 8 * MB, i)
    rng = np.random.default_rng(7)
    keys = [f"batch-{i}" for i in range(300)]
    res = m.batch_put_start(keys, rng.integers(1, 20_000, len(keys)), client_id=W,
                            config=ReplicateConfig(replica_num=2))
    assert (res.codes == 0).all()
    m.batch_put_end(keys[:250], client_id=W)              # 50 stay in flight
    for i in range(9):
        _put(m, f"g-{i}", 1000 + i, group_id="ga" if i % 2 else "gb")
    for i in range(6):  # soft pins: committed, awaiting their commit, and removed
        _put(m, f"soft-{i}", 900, end=i % 3 != 0, soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=10_000)
    m.remove("soft-1", force=True)
    if tenants:
        for i in range(4):
            _put(m, f"t2-{i}", 3000, tenant_id="t2", group_id="ga")  # same group name, other tenant
    m.batch_remove(keys[:60], force=True)
    m.remove("g-3", force=True)                           # a member in the middle of its list
    m.put_revoke("batch-260", client_id=W)
    clocks.advance(ms=100)                                # every lease expired
    assert m.evict(target=0.5).evicted_objects > 0
    # an abandoned put: a new put_start of its key after the discard timeout discards it, and
    # its extent stays held (pending release) until put_start + release timeout
    _put(m, "abandoned", 5000, end=False, preferred_segments=("seg0",))
    clocks.advance(s=31)
    _put(m, "abandoned", 6000, preferred_segments=("seg0",))
    assert len(m.store.discarded)
    m.unmount_segment("seg1")
    more = [f"more-{i}" for i in range(80)]                # recycled rows, new offsets
    m.batch_put_start(more, np.full(len(more), 700), client_id=W)
    m.batch_put_end(more[:70], client_id=W)
    return m


# ---- healthy engines -------------------------------------------------------------------------------
def test_verify_empty_engine_passes() -> None:
    MasterService(MasterConfig(), clocks=ManualClocks()).verify()


@pytest.mark.parametrize("tenants", [False, True])
def test_verify_healthy_engine_after_mixed_operations_passes(tenants: bool) -> None:
    m = _busy(ManualClocks(), tenants=tenants)
    m.verify()
    assert not integrity.check_slots(m).all()  # recycled rows: the gather-and-sort path ran


def test_verify_bulk_loaded_engine_streams_the_extents() -> None:
    from mooncake_columnar.tools.synthetic import build_master
    m = build_master(20_000, segments=3)
    assert integrity.check_slots(m).all()  # replicas ascend by row: no gathered copy
    m.verify()


def test_verify_standby_style_segments_pass_before_and_after_remount() -> None:
    """An unreadably restored (promoted) engine keeps an allocator nobody maintains until the
    remount rebuilds it: frees skip it, so only its shape and the held extents are checked."""
    clocks = ManualClocks()
    src = _busy(clocks)
    m = MasterService.from_state(src.export_state(), config=src.config, clocks=clocks, segments_readable=False)
    m.verify()
    m.remove("g-0", force=True)      # not given back to seg0's stale allocator
    m.verify()
    for i in (0, 2):
        seg = m.segments.get(f"seg{i}")
        m.remount_segments(seg.client, [seg])
    m.verify()
    _put(m, "after-remount", 4096)
    m.verify()


# ---- one corruption per check ---------------------------------------------------------------------
def _small(clocks: ManualClocks) -> MasterService:
    """seg0 (64 MB): k0..k9 complete, p0 and p1 in flight, group g = [g0, g1, g2]; multi-tenant."""
    m = MasterService(MasterConfig(default_kv_lease_ttl_ms=50, enable_multi_tenants=True,
                                   tenant_quota_bytes=QUOTAS), clocks=clocks)
    _mount(m, "seg0", 64 * MB, 0)
    for i in range(10):
        _put(m, f"k{i}")
    _put(m, "p0", end=False)
    _put(m, "p1", end=False)
    for i in range(3):
        _put(m, f"g{i}", group_id="g")
    _put(m, "s0", soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=10_000)
    _put(m, "gone")
    m.remove("gone", force=True)     # a free row below high_water
    return m


def _free_row(m: MasterService) -> int:
    return int(m.objects.free_rows[m.objects.free_count - 1])


def _overlap_sorted(m: MasterService) -> None:
    o = m.objects
    o.replica_offset[_row(m, "k5"), 0] = o.replica_offset[_row(m, "k1"), 0]


def _overlap_streamed(m: MasterService) -> None:
    o = m.objects  # k2 still starts after k1 (rows ascend): found by the streaming walk
    o.replica_offset[_row(m, "k2"), 0] = o.replica_offset[_row(m, "k1"), 0] + 500


def _discarded_overlap(m: MasterService) -> None:
    r = _row(m, "k3")
    m.store.discarded.add(np.array([0], np.int64), np.array([int(m.objects.replica_offset[r, 0]) + 10], np.int64),
                          np.array([100], np.int64), np.array([0], np.int64))


def _free_overlap(m: MasterService) -> None:
    s = m.segments  # the free tail extent grows back over the last held extent
    st, ln = (a.copy() for a in s.extents.of(0))
    st[-1] -= 10
    ln[-1] += 10
    s.install_allocator(0, st, ln, int(s.used[0]) - 10)


def _free_gap(m: MasterService) -> None:
    m.segments.extents.count[0] -= 1  # the free tail extent forgotten: space neither held nor free


def _free_not_coalesced(m: MasterService) -> None:
    s = m.segments
    st, ln = s.extents.of(0)
    half = int(ln[-1]) // 2
    s.install_allocator(0, np.r_[st[:-1], st[-1], st[-1] + half], np.r_[ln[:-1], half, ln[-1] - half],
                        int(s.used[0]))


def _one_unit_on(m: MasterService) -> None:
    _mount(m, "big", 8 << 30, 1)  # past 3.75 GiB: allocation units of more than one byte
    assert m.segments.unit_bits[m.segments.code("big")] > 0
    _put(m, "on-big", 5000, preferred_segments=("big",))
    # the offset column counts units (never misaligned): one more moves the extent into free space
    m.objects.replica_offset[_row(m, "on-big"), 0] += 1


def _index_delete(m: MasterService) -> None:
    o, r = m.objects, _row(m, "k4")
    # a hash past 2**63 comes back as a Python int that would re-dispatch as int64: keep it uint64
    h = np.uint64(hk.row_hash(m.keys.arena, o.key_ref, o.tenant, r))
    assert hk.delete_row(m.keys.table, r, h)


def _index_slot_of(m: MasterService, key: str) -> int:
    return int(np.flatnonzero((m.keys.table >= 0) & ((m.keys.table & 0xFFFFFFFF) == _row(m, key)))[0])


def _index_slot_to_free_row(m: MasterService) -> None:
    t = m.keys.table
    i = _index_slot_of(m, "k4")
    t[i] = (t[i] >> 32 << 32) | _free_row(m)


def _index_wrong_tag(m: MasterService) -> None:
    t = m.keys.table
    i = _index_slot_of(m, "k4")
    t[i] ^= 1 << 40


def _inflight_at_complete_row(m: MasterService) -> None:
    m.inflight.take(np.array([_row(m, "k6")]))


def _inflight_index_entry_lost(m: MasterService) -> None:
    t = m.inflight
    t.index[t.index == t.slots_of(np.array([_row(m, "p0")]))[0]] = -1


def _inflight_orphan(m: MasterService) -> None:
    r = _row(m, "p1")  # the row forgets its put; its slot stays in use under a row past the high-water mark
    t = m.inflight
    t.release(t.slots_of(np.array([r])))
    t.take(np.array([m.objects.high_water + 5]))
    m.objects.flags[r] &= ~np.uint8(16)  # FLAG_PROCESSING
    m.objects.replica_status[r, 0] = int(ReplicaStatus.COMPLETE)


def _live_row_on_free_stack(m: MasterService) -> None:
    o = m.objects
    o.free_rows[o.free_count] = _row(m, "k7")
    o.free_count += 1


CORRUPTIONS: dict[str, tuple[Callable[[MasterService], None], str]] = {
    "registry": (lambda m: m.segments.by_name.pop("seg0"), "segment_registry"),
    "live_count": (lambda m: setattr(m.objects, "live_count", m.objects.live_count + 1), "live_count"),
    "live_row_on_free_stack": (_live_row_on_free_stack, "free_rows"),
    "free_row_twice": (lambda m: (m.objects.free_rows.__setitem__(m.objects.free_count, _free_row(m)),
                                  setattr(m.objects, "free_count", m.objects.free_count + 1)), "free_rows"),
    "replica_on_free_row": (lambda m: m.objects.replica_status.__setitem__((_free_row(m), 0), 3), "replica_row"),
    "replica_id_past_next": (lambda m: m.objects.replica_id.__setitem__((_row(m, "k8"), 0), m.next_replica_id),
                             "replica_id"),
    "replica_id_zero": (lambda m: m.objects.replica_id.__setitem__((_row(m, "k8"), 0), 0), "replica_id"),
    "replica_on_unmounted_segment": (lambda m: m.objects.replica_segment.__setitem__((_row(m, "k8"), 0), 5),
                                     "replica_segment"),
    "replica_past_capacity": (lambda m: m.objects.replica_offset.__setitem__((_row(m, "k8"), 0), 64 * MB - 999),
                              "replica_extent"),
    "replica_offset_one_unit_on": (_one_unit_on, "free_overlap"),
    "discarded_on_unmounted_segment": (lambda m: (_discarded_overlap(m), m.store.discarded.seg.__setitem__(0, 9)),
                                       "replica_segment"),
    "free_list_not_coalesced": (_free_not_coalesced, "free_list"),
    "free_list_empty_extent": (lambda m: m.segments.extents.of(0)[1].__setitem__(0, 0), "free_list"),
    "overlap_sorted": (_overlap_sorted, "extent_overlap"),
    "overlap_streamed": (_overlap_streamed, "extent_overlap"),
    "discarded_overlaps_replica": (_discarded_overlap, "extent_overlap"),
    "free_overlaps_replica": (_free_overlap, "free_overlap"),
    "space_neither_held_nor_free": (_free_gap, "free_list_gap"),
    "used_bumped": (lambda m: m.segments.used.__setitem__(0, m.segments.used[0] + 1), "segment_used"),
    "index_count": (lambda m: setattr(m.keys, "count", m.keys.count + 1), "index_count"),
    "index_slot_at_free_row": (_index_slot_to_free_row, "index_slot"),
    "index_key_deleted": (_index_delete, "index_lookup"),
    "index_wrong_tag": (_index_wrong_tag, "index_lookup"),
    "key_ref_outside_arena": (lambda m: m.objects.key_ref.__setitem__(_row(m, "k9"), 1 << 50), "key_ref"),
    "inflight_slot_at_complete_row": (_inflight_at_complete_row, "inflight_row"),
    "inflight_slot_freed_under_row": (lambda m: m.inflight.release(m.inflight.slots_of(np.array([_row(m, "p0")]))),
                                      "inflight_row"),
    "inflight_slot_on_free_row": (lambda m: m.inflight.take(np.array([_free_row(m)])), "inflight_row"),
    "inflight_index_entry_lost": (_inflight_index_entry_lost, "inflight_index"),
    "inflight_slot_orphaned": (_inflight_orphan, "inflight_claim"),
    "soft_pin_slot_lost": (lambda m: m.store.soft_pins.release(m.store.soft_pins.slots_of(np.array([_row(m, "s0")]))),
                           "soft_pin_row"),
    "soft_pin_on_free_row": (lambda m: m.store.soft_pins.add(np.array([_free_row(m)]), 1), "soft_pin_row"),
    "soft_pin_index_entry_lost": (lambda m: m.store.soft_pins.index.__setitem__(
        m.store.soft_pins.index == m.store.soft_pins.slots_of(np.array([_row(m, "s0")]))[0], -1), "soft_pin_index"),
    "soft_pin_slot_orphaned": (lambda m: m.store.soft_pins.add(np.array([m.objects.high_water + 3]), 1),
                               "soft_pin_claim"),
    "inflight_free_stack": (lambda m: m.inflight.in_use.__setitem__(int(m.inflight.free_slots[0]), True),
                            "inflight_slots"),
    "group_link_broken": (lambda m: _set_next(m, _row(m, "g0"), _row(m, "g0")), "group_link"),
    "group_link_to_ungrouped": (lambda m: _set_next(m, _row(m, "g0"), _row(m, "k0")), "group_member"),
    "group_code_lost": (lambda m: m.store.group_of.release(m.store.group_of.slots_of(np.array([_row(m, "g1")]))),
                        "group_member"),
    "group_code_on_ungrouped_row": (lambda m: m.store.group_of.add(np.array([_row(m, "k0")]), 0), "group_member"),
    "group_head_not_member": (lambda m: m.group_head.__setitem__(0, _row(m, "k0")), "group_head"),
    "group_split_in_two": (lambda m: _split_group(m), "group_link"),
    "ledger_skewed": (lambda m: m.ledger.committed.__setitem__(0, m.ledger.committed[0] + 1), "tenant_ledger"),
    "replica_id_twice": (lambda m: m.objects.replica_id.__setitem__((_row(m, "k2"), 0),
                                                                     m.objects.replica_id[_row(m, "k1"), 0]),
                         "replica_id_unique"),
}


def _next_member(m: MasterService, row: int) -> int:
    t = m.store.group_of
    return int(t.next[t.slots_of(np.array([row]))[0]])


def _set_next(m: MasterService, row: int, member: int) -> None:
    """Corrupt ``row``'s link in its group's member list (the group table's ``next``)."""
    t = m.store.group_of
    t.next[t.slots_of(np.array([row]))[0]] = member


def _split_group(m: MasterService) -> None:
    """Cut g0 out of its circular list into a circle of its own: every member still has one
    predecessor and one successor in its group, but the group is two lists."""
    g0 = _row(m, "g0")
    pred = next(r for r in (_row(m, f"g{i}") for i in range(3)) if _next_member(m, r) == g0)
    _set_next(m, pred, _next_member(m, g0))
    _set_next(m, g0, g0)


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_verify_names_each_corruption(name: str) -> None:
    m = _small(ManualClocks())
    m.verify()
    corrupt, check = CORRUPTIONS[name]
    corrupt(m)
    with pytest.raises(EngineInvariantError) as info:
        m.verify()
    assert info.value.check == check, str(info.value)


_LOOKUP_CHECKS = ("index_slot", "index_lookup")


@pytest.mark.parametrize("name", sorted(n for n, (_, check) in CORRUPTIONS.items() if check not in _LOOKUP_CHECKS))
def test_verify_without_key_lookups_still_names_every_other_corruption(name: str) -> None:
    """``key_lookups=False`` (a restore, right after the bulk index build) leaves out only the
    pass whose invariants that build proves; every other check still runs."""
    m = _small(ManualClocks())
    corrupt, check = CORRUPTIONS[name]
    corrupt(m)
    with pytest.raises(EngineInvariantError) as info:
        m.verify(key_lookups=False)
    assert info.value.check == check, str(info.value)


def test_bulk_built_index_passes_the_lookup_pass_a_restore_leaves_out(tmp_path: Path) -> None:
    """What restore_master relies on when it skips the key lookups of its self-check: the engine
    it restores (index bulk-built in several windows, probe runs crossing their ends, several
    tenants) passes the full verify."""
    from mooncake_columnar.tools.synthetic import build_master
    src = build_master(20_000, segments=3)
    for master in (src, _busy(ManualClocks(), tenants=True)):
        repo = SnapshotRepository(str(tmp_path / str(id(master))))
        SnapshotManager(master, repo, freeze="copy").snapshot_now()
        restored, stats = restore_master(repo, config=master.config, clocks=master.clocks, drop_expired=False)
        assert restored.object_count() == stats.objects_restored > 100
        restored.verify()  # the lookup pass included


def test_verify_checks_group_heads_when_no_row_is_grouped() -> None:
    """With every member of a group removed no member list is built: a head left pointing at a
    row is still named."""
    m = _small(ManualClocks())
    for i in range(3):
        m.remove(f"g{i}", force=True)
    m.verify()
    m.group_head[0] = _row(m, "k0")
    with pytest.raises(EngineInvariantError) as info:
        m.verify()
    assert info.value.check == "group_head", str(info.value)


def test_verify_message_names_the_offending_key() -> None:
    m = _small(ManualClocks())
    _overlap_sorted(m)
    with pytest.raises(EngineInvariantError, match=r"seg0.*'k[15]'"):
        m.verify()


# ---- restore: a candidate that fails the self-check falls back -------------------------------------
def _snapshot_master(clocks: ManualClocks) -> MasterService:
    m = MasterService(MasterConfig(default_kv_lease_ttl_ms=60_000), clocks=clocks)
    _mount(m, "seg0", 64 * MB, 0)
    for i in range(20):
        _put(m, f"k{i}", hard_pin=True)
    return m


def _forge_duplicate_replica_ids(repo: SnapshotRepository, m: MasterService, clocks: ManualClocks) -> str:
    """A newer, well-formed snapshot (published past the writer's validation) with one replica id
    twice: the state validation refuses it before an engine is built."""
    state = m.export_state()
    ids = state.replicas.column("replica_id").to_numpy().copy()
    ids[1] = ids[0]
    col = state.replicas.schema.get_field_index("replica_id")
    replicas = state.replicas.set_column(col, state.replicas.schema.field(col), pa.array(ids, pa.uint64()))
    forged = dataclasses.replace(state, replicas=replicas)
    return publish_unvalidated(repo, forged, clocks.system_ns() + 5_000_000_000, clocks.steady_ns())


def test_verify_restore_rejects_a_candidate_with_duplicate_replica_ids(tmp_path: Path) -> None:
    clocks = ManualClocks()
    m = _snapshot_master(clocks)
    repo = SnapshotRepository(tmp_path)
    good = SnapshotManager(m, repo).snapshot_now()
    bad = _forge_duplicate_replica_ids(repo, m, clocks)
    assert repo.candidates()[0] == bad
    restored, stats = restore_master(repo, clocks=ManualClocks(system_ns=clocks.system_ns() + 10**10))
    assert stats.snapshot_id == good and stats.fallbacks == 1
    assert stats.failures[0][0] == bad and "SnapshotFieldError" in stats.failures[0][1]
    assert "replicas.replica_id row 1" in stats.failures[0][1] and "used twice" in stats.failures[0][1]
    assert restored.object_count() == 20
    restored.verify()


# ---- CLI ---------------------------------------------------------------------------------------------
def _cli(capsys, *argv: str) -> tuple[int, str]:
    code = main(["verify", *argv])
    return code, capsys.readouterr().out


def test_verify_cli_restores_and_checks_the_latest_snapshot(tmp_path: Path, capsys) -> None:
    clocks = ManualClocks()
    m = _snapshot_master(clocks)
    good = SnapshotManager(m, SnapshotRepository(tmp_path)).snapshot_now()
    code, out = _cli(capsys, str(tmp_path))
    assert code == 0 and good in out and "20 objects: ok" in out
    code, out = _cli(capsys, str(tmp_path), "--json")
    result = json.loads(out)
    assert code == 0 and result["ok"] and result["objects"] == 20 and result["snapshot_id"] == good

    bad = _forge_duplicate_replica_ids(SnapshotRepository(tmp_path), m, clocks)
    code, out = _cli(capsys, str(tmp_path))  # the latest is judged: no fallback
    assert code == 1 and bad in out and "FAILED restore" in out and "used twice" in out
    code, out = _cli(capsys, str(tmp_path), "--json")
    result = json.loads(out)
    assert code == 1 and not result["ok"] and result["check"] == "restore"
    code, out = _cli(capsys, str(tmp_path), "--snapshot", good)
    assert code == 0 and "ok" in out


def test_verify_cli_cluster_id_and_usage_errors(tmp_path: Path, capsys) -> None:
    clocks = ManualClocks()
    SnapshotManager(_snapshot_master(clocks), SnapshotRepository(tmp_path, cluster_id="c7")).snapshot_now()
    code, out = _cli(capsys, str(tmp_path), "--cluster-id", "c7")
    assert code == 0 and "ok" in out
    assert main(["verify", str(tmp_path)]) == 2  # no snapshot under the default cluster id
    code, out = _cli(capsys, str(tmp_path), "--cluster-id", "c7", "--snapshot", "20990101_000000_000")
    assert code == 1 and "FAILED restore" in out
